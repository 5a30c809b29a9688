"""The package's build backend: setuptools, run in a temporary copy of this directory.

setuptools builds in the source tree and leaves ``build/`` and ``egress_proxies.egg-info/``
there (newer releases already when asked what the build requires). Run from a copy,
``pip install ./clients/python`` and ``pip wheel`` leave the checkout as they found it.
Everything else is setuptools' own ``build_meta``; an editable install (``pip install -e``)
builds in place, as it must.
"""

import os
import shutil
import tempfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 (editable installs build in place)
    build_editable,
    get_requires_for_build_editable,
    prepare_metadata_for_build_editable,
)

# Importing this module wrote its own bytecode next to it; that is not left behind either.
shutil.rmtree(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__"), ignore_errors=True)

_LEFTOVERS = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv")


def _in_copy(hook, *args):
    """Runs a setuptools hook in a copy of the source directory (the hooks' working directory)."""
    source = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="egress-proxies-build-") as tmp:
        copy = os.path.join(tmp, "src")
        shutil.copytree(source, copy, ignore=_LEFTOVERS)
        os.chdir(copy)
        try:
            return hook(*args)
        finally:
            os.chdir(source)


def _abs(path):
    return None if path is None else os.path.abspath(path)


def get_requires_for_build_wheel(config_settings=None):
    return _in_copy(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _in_copy(_setuptools.get_requires_for_build_sdist, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _in_copy(_setuptools.build_wheel, _abs(wheel_directory), config_settings, _abs(metadata_directory))


def build_sdist(sdist_directory, config_settings=None):
    return _in_copy(_setuptools.build_sdist, _abs(sdist_directory), config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _in_copy(_setuptools.prepare_metadata_for_build_wheel, _abs(metadata_directory), config_settings)
