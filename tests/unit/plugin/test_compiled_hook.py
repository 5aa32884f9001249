"""Where the compiled hook is found (nri_gpu.plugin.cli.compiled_hook), on files made here, and the
one this test run's venv holds: what hack/setup built from hook/, statically linked."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from nri_gpu.plugin.cli.compiled_hook import HOOK_EXECUTABLE, installed_hook, installed_nri_gpu
from testbed.rust_toolchain import has_interpreter


def venv_bin(root: Path, *names: str, mode: int = 0o755) -> Path:
    """``root/venv/bin`` holding ``names``, each an executable (mode ``mode``) file."""
    folder = root / "venv" / "bin"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(mode)
    return folder


def test_the_hook_beside_the_console_script_is_found(tmp_path: Path) -> None:
    folder = venv_bin(tmp_path, "nri-gpu", HOOK_EXECUTABLE)
    assert installed_hook(str(folder / "nri-gpu")) == os.path.realpath(folder / HOOK_EXECUTABLE)


def test_a_link_to_the_console_script_is_followed_to_the_venv(tmp_path: Path) -> None:
    """The README's /usr/local/bin/nri-gpu is a link into the venv; the hook is only there."""
    folder = venv_bin(tmp_path, "nri-gpu", HOOK_EXECUTABLE)
    (tmp_path / "local-bin").mkdir()
    (tmp_path / "local-bin" / "nri-gpu").symlink_to(folder / "nri-gpu")
    assert installed_hook(str(tmp_path / "local-bin" / "nri-gpu")) == os.path.realpath(folder / HOOK_EXECUTABLE)


def test_a_relative_argv0_gives_an_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = venv_bin(tmp_path, "nri-gpu", HOOK_EXECUTABLE)
    monkeypatch.chdir(tmp_path)
    assert installed_hook("venv/bin/nri-gpu") == os.path.realpath(folder / HOOK_EXECUTABLE)


@pytest.mark.parametrize(("names", "mode"), [(("nri-gpu",), 0o755), (("nri-gpu", HOOK_EXECUTABLE), 0o644)])
def test_no_hook_or_one_that_cannot_run_is_none(tmp_path: Path, names: tuple[str, ...], mode: int) -> None:
    folder = venv_bin(tmp_path, *names)
    (folder / names[-1]).chmod(mode)
    assert installed_hook(str(folder / "nri-gpu")) is None


def test_without_the_console_script_the_scripts_folder_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m nri_gpu.plugin.cli``: argv[0] is plugin/cli/__main__.py."""
    folder = venv_bin(tmp_path, HOOK_EXECUTABLE)
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(folder) if name == "scripts" else "")
    assert installed_hook("/opt/nri-gpu/plugin/cli/__main__.py") == str(folder / HOOK_EXECUTABLE)
    assert installed_hook("") == str(folder / HOOK_EXECUTABLE)


def test_the_console_script_for_a_unit_is_the_one_running_else_the_scripts_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit runs the nri-gpu that installed it, as named (the README's link stays the
    link); under ``python -m`` the one beside the hook, never another on PATH."""
    folder = venv_bin(tmp_path, "nri-gpu", HOOK_EXECUTABLE)
    (tmp_path / "local-bin").mkdir()
    (tmp_path / "local-bin" / "nri-gpu").symlink_to(folder / "nri-gpu")
    assert installed_nri_gpu(str(tmp_path / "local-bin" / "nri-gpu")) == str(tmp_path / "local-bin" / "nri-gpu")
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(folder) if name == "scripts" else "")
    monkeypatch.setenv("PATH", str(tmp_path / "local-bin"))
    assert installed_nri_gpu("/opt/nri-gpu/plugin/cli/__main__.py") == str(folder / "nri-gpu")
    (folder / "nri-gpu").unlink()
    assert installed_nri_gpu("/opt/nri-gpu/plugin/cli/__main__.py") is None


def test_this_venv_holds_the_static_hook_hack_setup_built() -> None:
    """pip (setuptools-rust) and hack/setup put it beside nri-gpu, statically linked: no
    program interpreter, so no loader or shared library of the host takes part."""
    path = installed_hook("")
    assert path is not None, f"no {HOOK_EXECUTABLE} in {sysconfig.get_path('scripts')}: run hack/setup"
    assert not has_interpreter(Path(path)), f"{path} is dynamically linked"
