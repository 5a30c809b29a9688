"""The package's build backend (PEP 517, PEP 660): the standard library alone, so building needs
nothing installed and nothing downloaded.

``build-system.requires`` is empty: pip's isolated build environment fetches nothing, and
``pip install --no-index ./clients/python`` works offline as it is; ``python -m build`` makes
the same sdist and wheel. The package is pure Python with no compiled parts, which is all this
backend builds: the ``[project]`` table of pyproject.toml (PEP 621) becomes core metadata 2.4,
the version comes from ``egress_proxies/__init__.py`` (the one place it is written), and the
files are the package directory's ``*.py`` and ``py.typed``. It reads the source directory and
writes only the archive it is asked for: nothing is left in the checkout.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import shutil
import tarfile
import time
import tomllib
import zipfile
from typing import Any

# Importing this module wrote its own bytecode next to it; that is not left behind.
shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"), ignore_errors=True)

PACKAGE = "egress_proxies"
Settings = dict[str, Any] | None
_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)
# Reproducible archives: every entry gets this time (SOURCE_DATE_EPOCH if set, else 2026-01-01).
_EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "1767225600"))


def _project() -> dict[str, Any]:
    with open("pyproject.toml", "rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def _version() -> str:
    with open(os.path.join(PACKAGE, "__init__.py"), encoding="utf-8") as f:
        found = _VERSION.search(f.read())
    if not found:
        raise RuntimeError(f'{PACKAGE}/__init__.py has no line __version__ = "..."')
    return found.group(1)


def _dist_name(project: dict[str, Any]) -> str:
    """The distribution name as file names spell it (PEP 427, PEP 625)."""
    return re.sub(r"[-_.]+", "_", str(project["name"])).lower()


def metadata() -> str:
    """Core metadata 2.4 (the wheel's METADATA, the sdist's PKG-INFO) from the [project] table."""
    project = _project()
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {_version()}",
        f"Summary: {project['description']}",
        f"License-Expression: {project['license']}",
    ]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    for label, url in project.get("urls", {}).items():
        lines.append(f"Project-URL: {label}, {url}")
    lines.append("Description-Content-Type: text/markdown")
    with open(project["readme"], encoding="utf-8") as f:
        readme = f.read()
    return "\n".join(lines) + "\n\n" + readme


def _package_files() -> list[str]:
    """The package's files, relative to the source directory, sorted."""
    names = sorted(n for n in os.listdir(PACKAGE) if n.endswith(".py") or n == "py.typed")
    return [f"{PACKAGE}/{n}" for n in names]


def _zip_entry(zf: zipfile.ZipFile, name: str, data: bytes) -> str:
    info = zipfile.ZipInfo(name, time.gmtime(_EPOCH)[:6])
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _wheel(directory: str, files: dict[str, bytes]) -> str:
    project = _project()
    dist = f"{_dist_name(project)}-{_version()}"
    name = f"{dist}-py3-none-any.whl"
    info = f"{dist}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": metadata().encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: egress_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(os.path.join(directory, name), "w") as zf:
        record = [_zip_entry(zf, path, data) for path, data in files.items()]
        record.append(f"{info}/RECORD,,")
        _zip_entry(zf, f"{info}/RECORD", ("\n".join(record) + "\n").encode())
    return name


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def build_wheel(wheel_directory: str, config_settings: Settings = None, metadata_directory: str | None = None) -> str:
    return _wheel(wheel_directory, {path: _read(path) for path in _package_files()})


def build_editable(
    wheel_directory: str, config_settings: Settings = None, metadata_directory: str | None = None
) -> str:
    """A wheel whose .pth file puts this source directory on sys.path (PEP 660)."""
    return _wheel(wheel_directory, {f"{PACKAGE}_editable.pth": (os.path.abspath(".") + "\n").encode()})


def build_sdist(sdist_directory: str, config_settings: Settings = None) -> str:
    """The source: pyproject.toml, README.md, the package and this backend, with PKG-INFO."""
    project = _project()
    base = f"{_dist_name(project)}-{_version()}"
    backend = sorted(f"_backend/{n}" for n in os.listdir("_backend") if n.endswith(".py"))
    members = {path: _read(path) for path in ["pyproject.toml", project["readme"], *_package_files(), *backend]}
    members["PKG-INFO"] = metadata().encode()
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for path, data in sorted(members.items()):
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size = len(data)
            info.mtime = _EPOCH
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return name
