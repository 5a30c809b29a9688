"""The package's build backend: setuptools, run in a temporary copy of this directory.

setuptools builds in the source tree and leaves ``build/`` and ``egress_proxies.egg-info/``
there (newer releases already when asked what the build requires). Run from a copy,
``pip install ./clients/python`` and ``pip wheel`` leave the checkout as they found it.
Everything else is setuptools' own ``build_meta``; an editable install (``pip install -e``)
builds in place, as it must.

``project.license`` is an SPDX expression (PEP 639), which setuptools reads from 77 on; older
releases (Debian 12's python3-setuptools is 66, the offline install's) read only the table
form, so the copy they build from gets that form.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Any, Callable, Optional, TypeVar

import setuptools
from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 (editable installs build in place)
    build_editable,
    get_requires_for_build_editable,
    prepare_metadata_for_build_editable,
)

# Importing this module wrote its own bytecode next to it; that is not left behind either.
shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"), ignore_errors=True)

_LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv")


_SPDX_FROM = (77,)
_LICENSE = re.compile(r'^license = "([^"]+)"$', re.MULTILINE)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _for_this_setuptools(pyproject: str) -> str:
    """pyproject.toml as this setuptools reads it: an SPDX license string becomes a table before 77."""
    if _version(setuptools.__version__) >= _SPDX_FROM:
        return pyproject
    return _LICENSE.sub(r'license = { text = "\1" }', pyproject)


_T = TypeVar("_T")
# (Evaluated at run time, by any Python the package supports.)
Settings = Optional[dict[str, Any]]


def _in_copy(hook: Callable[..., _T], *args: object) -> _T:
    """Runs a setuptools hook in a copy of the source directory (the hooks' working directory)."""
    source = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="egress-proxies-build-") as tmp:
        copy = os.path.join(tmp, "src")
        shutil.copytree(source, copy, ignore=_LEFTOVERS)
        pyproject = os.path.join(copy, "pyproject.toml")
        with open(pyproject, encoding="utf-8") as f:
            text = f.read()
        with open(pyproject, "w", encoding="utf-8") as f:
            f.write(_for_this_setuptools(text))
        os.chdir(copy)
        try:
            return hook(*args)
        finally:
            os.chdir(source)


def _abs(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(path)


def get_requires_for_build_wheel(config_settings: Settings = None) -> list[str]:
    return list(_in_copy(_setuptools.get_requires_for_build_wheel, config_settings))


def get_requires_for_build_sdist(config_settings: Settings = None) -> list[str]:
    return list(_in_copy(_setuptools.get_requires_for_build_sdist, config_settings))


def build_wheel(wheel_directory: str, config_settings: Settings = None, metadata_directory: str | None = None) -> str:
    return str(_in_copy(_setuptools.build_wheel, _abs(wheel_directory), config_settings, _abs(metadata_directory)))


def build_sdist(sdist_directory: str, config_settings: Settings = None) -> str:
    return str(_in_copy(_setuptools.build_sdist, _abs(sdist_directory), config_settings))


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Settings = None) -> str:
    return str(_in_copy(_setuptools.prepare_metadata_for_build_wheel, _abs(metadata_directory), config_settings))
