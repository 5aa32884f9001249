"""The systemd units ``nri-gpu install --runtime docker|podman`` writes (plugin/cli/systemd_unit.py).

The service runs ``nri-gpu cdi generate`` (this Python console script) with the
compiled hook's path, the roots and the capabilities install was given. systemd
does not run on the test machines, so the units are checked by ``systemd-analyze
verify`` (skipped, saying so, where it is absent), and the command the service
runs is taken from the written unit and run as it stands.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.cdi import INSTALL_LINK, INSTALL_VENV, NO_HOOK
from nri_gpu.plugin.cli.compiled_hook import HOOK_EXECUTABLE
from nri_gpu.plugin.cli.docker_setup import DEFAULT_SPEC
from nri_gpu.plugin.cli.runtime_setup import SetupError
from nri_gpu.plugin.cli.systemd_unit import PATH_UNIT, SERVICE, UNITS, exec_start, planned_units, unit_texts
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from testbed.plugins import NRI_GPU
from tests.unit.plugin import support

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "systemd"


def _exec_start(unit: Path) -> list[str]:
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.fixture
def trusted_nri_gpu() -> str:
    """This checkout's nri-gpu, where root alone can change it (a unit runs no other)."""
    return support.trusted_nri_gpu()


@pytest.fixture
def trusted_hook(trusted_nri_gpu: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This venv's compiled hook, where root alone can change it (a unit's spec names no
    other); install runs as this venv's nri-gpu, which its unit then runs."""
    monkeypatch.setattr(sys, "argv", [trusted_nri_gpu])
    return support.trusted_hook()


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return build_node(tmp_path / "node", gpus=2, driver_files=FIXTURE_DRIVER)


def _install(tmp_path: Path, node: SimNode, hook: str, *more: str) -> list[str]:
    return [
        "install", "--runtime", "podman", "--cdi-spec", str(tmp_path / "cdi" / "nri-gpu.json"),
        "--unit-dir", str(tmp_path / "units"), "--hook-path", hook, *node.flags(), *more,
    ]  # fmt: skip


def test_the_shipped_units_are_what_install_writes_for_the_readme_install() -> None:
    # The README's nri-gpu is a link into root's venv, where pip put the hook beside
    # it (nri_gpu.plugin.cli.compiled_hook.installed_hook follows the link there).
    hook = f"{INSTALL_VENV}/bin/{HOOK_EXECUTABLE}"
    texts = unit_texts(exec_start(INSTALL_LINK, Path(DEFAULT_SPEC), ["--hook-path", hook]))
    assert {p.name: p.read_text() for p in DEPLOY.iterdir()} == texts


def test_the_service_has_no_remain_after_exit_and_the_path_unit_watches_the_driver() -> None:
    texts = unit_texts(exec_start("/usr/local/bin/nri-gpu", Path("/etc/cdi/x.json"), []), "/run/nvidia/driver")
    # An active (exited) oneshot is not started again: later driver changes would do nothing.
    assert "RemainAfterExit" not in texts[SERVICE] and "Type=oneshot" in texts[SERVICE]
    assert "PathChanged=/run/nvidia/driver/etc/ld.so.cache" in texts[PATH_UNIT]
    assert "PathChanged=/lib/modules/%v/modules.dep" in texts[PATH_UNIT]
    assert f"Unit={SERVICE}" in texts[PATH_UNIT]


@pytest.mark.parametrize(
    ("spec", "bad"),
    [("/etc/cdi/a b.json", "a b.json"), ("/etc/cdi/100%.json", "100%.json"), ("/etc/cdi/$X.json", "$X.json")],
)
def test_a_value_systemd_would_read_otherwise_is_refused_by_name(spec: str, bad: str) -> None:
    with pytest.raises(SetupError, match="systemd unit names only") as caught:
        exec_start("/usr/local/bin/nri-gpu", Path(spec), [])
    assert bad in str(caught.value)


def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    # verify wants the command to exist and be executable: this checkout's nri-gpu.
    texts = unit_texts(exec_start(NRI_GPU, tmp_path / "cdi" / "x.json", ["--driver-root", str(tmp_path)]))
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / name) for name in UNITS]
    done = subprocess.run([analyze, "verify", *paths], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "nri-gpu-cdi" not in done.stdout + done.stderr, done
    # The control: verify does speak up about a unit it cannot use.
    (tmp_path / SERVICE).write_text(texts[SERVICE].replace("Type=oneshot", "Type=once"))
    bad = subprocess.run([analyze, "verify", *paths], capture_output=True, text=True, timeout=60)
    assert "nri-gpu-cdi.service" in bad.stdout + bad.stderr, bad


def test_the_unit_command_writes_the_spec_install_wrote(
    tmp_path: Path, node: SimNode, trusted_hook: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_install(tmp_path, node, trusted_hook, "--capabilities", "utility")) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "Enable the units: systemctl daemon-reload && systemctl enable --now" in out
    spec = tmp_path / "cdi" / "nri-gpu.json"
    written = spec.read_bytes()
    argv = _exec_start(tmp_path / "units" / SERVICE)
    assert argv[:7] == [NRI_GPU, "cdi", "generate", "--output", str(spec), "--hook-path", trusted_hook]
    assert "--capabilities" in argv and "--driver-root" in argv
    assert json.loads(written)["containerEdits"]["hooks"][0]["path"] == trusted_hook
    spec.unlink()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert done.returncode == 0, done.stderr
    assert spec.read_bytes() == written
    assert [d["name"] for d in json.loads(written)["devices"]][-1] == "all"


def test_install_twice_is_no_change_and_uninstall_removes_only_ours(
    tmp_path: Path, node: SimNode, trusted_hook: str, capsys: pytest.CaptureFixture[str]
) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "other.service").write_text("[Service]\nExecStart=/bin/true\n")
    dry = main([*_install(tmp_path, node, trusted_hook), "--dry-run"])
    out = capsys.readouterr().out
    assert dry == 0 and f"+++ {units / SERVICE}" in out and "ExecStart=" in out
    assert sorted(os.listdir(units)) == ["other.service"]
    assert main(_install(tmp_path, node, trusted_hook)) == 0
    first = {name: (units / name).read_bytes() for name in UNITS}
    capsys.readouterr()
    assert main(_install(tmp_path, node, trusted_hook)) == 0
    out = capsys.readouterr().out
    assert "Enable the units" not in out and {n: (units / n).read_bytes() for n in UNITS} == first
    assert main(["uninstall", "--runtime", "podman", "--cdi-spec", str(tmp_path / "cdi" / "nri-gpu.json"),
                 "--unit-dir", str(units)]) == 0  # fmt: skip
    assert sorted(os.listdir(units)) == ["other.service"]


def test_a_unit_file_not_ours_is_refused_and_nothing_is_written(
    tmp_path: Path, node: SimNode, trusted_hook: str, capsys: pytest.CaptureFixture[str]
) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / PATH_UNIT).write_text("[Path]\nPathChanged=/etc/passwd\n")
    assert main(_install(tmp_path, node, trusted_hook)) == 1
    assert "not written by nri-gpu" in capsys.readouterr().err
    assert not (tmp_path / "cdi" / "nri-gpu.json").exists() and not (units / SERVICE).exists()


def test_uninstall_is_refused_while_the_units_are_enabled(
    tmp_path: Path, node: SimNode, trusted_hook: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_install(tmp_path, node, trusted_hook)) == 0
    wants = tmp_path / "units" / "multi-user.target.wants"
    wants.mkdir()
    (wants / PATH_UNIT).symlink_to(tmp_path / "units" / PATH_UNIT)  # what systemctl enable makes
    spec = tmp_path / "cdi" / "nri-gpu.json"
    argv = ["uninstall", "--runtime", "podman", "--cdi-spec", str(spec), "--unit-dir", str(tmp_path / "units")]
    assert main(argv) == 1
    assert "systemctl disable --now nri-gpu-cdi.path nri-gpu-cdi.service" in capsys.readouterr().err
    assert spec.exists() and (tmp_path / "units" / SERVICE).exists()


def test_a_hook_or_folder_others_can_change_is_refused_for_the_unit(
    tmp_path: Path, trusted_nri_gpu: str, trusted_hook: str
) -> None:
    """No --allow-untrusted-hook for a unit: it runs unattended at every boot."""
    units = tmp_path / "units"
    assert planned_units(trusted_nri_gpu, trusted_hook, tmp_path / "cdi.json", [], None, units)  # the control
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(SetupError, match="users other than root") as caught:
        planned_units(trusted_nri_gpu, trusted_hook, open_dir / "nri-gpu.json", [], None, units)
    assert str(open_dir) in str(caught.value)
    with pytest.raises(SetupError, match="users other than root") as caught:
        planned_units(
            trusted_nri_gpu, trusted_hook, tmp_path / "cdi.json", ["--driver-root", str(open_dir)], None, units
        )
    assert str(open_dir) in str(caught.value)
    # What the unit runs: nri-gpu, and the hook its spec names.
    nri_gpu = open_dir / "nri-gpu"
    shutil.copy(trusted_nri_gpu, nri_gpu)
    with pytest.raises(SetupError, match="is writable by its group and others") as caught:
        planned_units(str(nri_gpu), trusted_hook, tmp_path / "cdi.json", [], None, units)
    assert f"{open_dir} is writable by its group and others" in str(caught.value)
    open_hook = open_dir / "nri-gpu-hook"
    shutil.copy(trusted_hook, open_hook)
    with pytest.raises(SetupError, match="users other than root") as caught:
        planned_units(trusted_nri_gpu, str(open_hook), tmp_path / "cdi.json", [], None, units)
    assert f"{open_dir} is writable by its group and others (mode 0777)" in str(caught.value)


def test_a_hook_that_is_not_the_compiled_one_is_refused_for_the_unit(tmp_path: Path, trusted_nri_gpu: str) -> None:
    # nri-gpu itself where the hook belongs (the Python hook's old place): root's, not the hook.
    with pytest.raises(SetupError) as caught:
        planned_units(trusted_nri_gpu, trusted_nri_gpu, tmp_path / "cdi.json", [], None, tmp_path / "u")
    assert f"{trusted_nri_gpu} is not nri-gpu's compiled hook (not an ELF file)" in str(caught.value)
    assert not (tmp_path / "u").exists()


def test_install_without_a_hook_beside_nri_gpu_writes_nothing(
    tmp_path: Path, node: SimNode, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spec and its unit must name the hook: a copy of nri-gpu with no nri-gpu-hook
    beside it asks for --hook-path, and writes neither."""
    lone = tmp_path / "bin" / "nri-gpu"
    lone.parent.mkdir()
    shutil.copy(NRI_GPU, lone)
    monkeypatch.setattr(sys, "argv", [str(lone)])
    argv = [w for w in _install(tmp_path, node, "HOOK") if w not in ("--hook-path", "HOOK")]
    assert main(argv) == 1
    assert capsys.readouterr().err == NO_HOOK + "\n"
    assert not (tmp_path / "units").exists() and not (tmp_path / "cdi" / "nri-gpu.json").exists()


def test_install_that_cannot_tell_which_nri_gpu_runs_writes_no_unit(
    tmp_path: Path,
    node: SimNode,
    trusted_hook: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # python -m nri_gpu.plugin.cli from an interpreter with no nri-gpu in its scripts
    # folder: the unit would have nothing to run. One on PATH (another install's,
    # perhaps) is never taken instead.
    monkeypatch.setattr(sys, "argv", [sys.executable])
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(empty))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    assert shutil.which("nri-gpu")  # the venv's, on PATH
    assert main(_install(tmp_path, node, trusted_hook)) == 1
    assert "cannot tell where nri-gpu is installed for the units; pass --no-unit" in capsys.readouterr().err
    assert not (tmp_path / "units").exists() and not (tmp_path / "cdi" / "nri-gpu.json").exists()


def test_no_unit_writes_none(tmp_path: Path, node: SimNode, trusted_hook: str) -> None:
    assert main([*_install(tmp_path, node, trusted_hook), "--no-unit"]) == 0
    assert not (tmp_path / "units").exists() and (tmp_path / "cdi" / "nri-gpu.json").exists()


def test_restart_enables_the_units_and_disables_them_before_uninstall(
    tmp_path: Path, node: SimNode, trusted_hook: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--restart`` runs systemctl (a stand-in here: systemd does not run on the test
    machines) to enable the units after install, and to disable them before uninstall."""
    units, log = tmp_path / "units", tmp_path / "systemctl.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    wants = units / "multi-user.target.wants"
    fake.write_text(  # records its argv; enable/disable make and remove the .wants links as systemctl does
        f'#!/bin/sh\necho "$*" >> {log}\n'
        f'case "$1" in enable) mkdir -p {wants}; for u in {PATH_UNIT} {SERVICE}; do ln -sf {units}/$u {wants}/$u;'
        f" done;; disable) rm -f {wants}/*;; esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert main([*_install(tmp_path, node, trusted_hook), "--restart"]) == 0
    assert log.read_text().splitlines() == ["daemon-reload", f"enable --now {PATH_UNIT} {SERVICE}"]
    spec = tmp_path / "cdi" / "nri-gpu.json"
    argv = ["uninstall", "--runtime", "podman", "--cdi-spec", str(spec), "--unit-dir", str(units)]
    assert main([*argv, "--restart"]) == 0
    assert log.read_text().splitlines()[-1] == f"disable --now {PATH_UNIT} {SERVICE}"
    assert not spec.exists() and sorted(os.listdir(units)) == ["multi-user.target.wants"]
