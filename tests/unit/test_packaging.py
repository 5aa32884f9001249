"""pyproject.toml installs the folders engine/ and plugin/ as nri_gpu.engine and
nri_gpu.plugin, listing every package by hand (package-dir maps the folders, so
setuptools' discovery cannot find them): a folder left out of the list would be
missing from every wheel and image while the checkout's tests still pass."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_installed() -> None:
    setuptools = PYPROJECT["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    folders = {"nri_gpu.engine": "engine", "nri_gpu.plugin": "plugin"}
    assert setuptools["package-dir"] == folders
    found = {
        ".".join((name, *init.parent.relative_to(ROOT / folder).parts))
        for name, folder in folders.items()
        for init in (ROOT / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert listed == found


def test_the_console_script_and_mypy_name_the_installed_packages() -> None:
    assert PYPROJECT["project"]["scripts"]["nri-gpu"] == "nri_gpu.plugin.cli.entry:main"
    assert PYPROJECT["tool"]["mypy"]["packages"] == ["nri_gpu.engine", "nri_gpu.plugin"]
