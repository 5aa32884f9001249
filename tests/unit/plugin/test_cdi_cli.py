"""``nri-gpu cdi generate`` and ``nri-gpu hook start-container`` as a user runs them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.hook import STATE_LIMIT
from plugin.__main__ import main
from tests.testbed.gpunode import SimNode, build_node

# These tests are about the spec's content: its hook path names no real file.
UNCHECKED = ["--allow-untrusted-hook"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=2)


def test_generate_writes_the_spec_file(node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nvidia.json"
    argv = [
        "cdi",
        "generate",
        *node.flags(),
        "--hook-path",
        "/opt/nri-gpu/bin/nri-gpu",
        "--output",
        str(out),
        *UNCHECKED,
    ]
    assert main(argv) == 0
    spec = json.loads(out.read_text())
    assert [d["name"] for d in spec["devices"]][-1] == "all"
    hook = spec["containerEdits"]["hooks"][0]
    assert hook["path"] == "/opt/nri-gpu/bin/nri-gpu"
    assert hook["args"][-2:] == ["--capabilities", "compute,utility"]
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.json"]  # no temporary file left


def test_generate_caps_and_refusals(node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu", "--capabilities", "all", *UNCHECKED]) == 0
    )
    env = json.loads(capsys.readouterr().out)["containerEdits"]["env"]
    assert "NVIDIA_DRIVER_CAPABILITIES=compat32,compute,display,graphics,ngx,utility,video" in env
    assert (
        main(["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu", "--capabilities", "warp", *UNCHECKED]) == 1
    )
    assert '--capabilities "warp": unknown capability' in capsys.readouterr().err
    empty = tmp_path / "empty"
    assert main(["cdi", "generate", "--proc-root", str(empty), "--hook-path", "/x/nri-gpu", *UNCHECKED]) == 1
    assert "a CDI spec needs at least one device" in capsys.readouterr().err


def users_copy_of_nri_gpu(tmp_path: Path) -> Path:
    """``nri-gpu`` in a folder of uid 1000's, as in a user's own checkout."""
    home = tmp_path / "home" / "alice"
    (home / "bin").mkdir(parents=True)
    hook = home / "bin" / "nri-gpu"
    hook.write_bytes(Path(sys.executable).with_name("nri-gpu").read_bytes())
    hook.chmod(0o755)
    os.chown(home, 1000, 1000)
    return hook


def test_generate_refuses_a_hook_a_user_can_change(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # sudo ~alice/bin/nri-gpu cdi generate: every GPU container start would run,
    # as root, whatever alice puts there later.
    hook = users_copy_of_nri_gpu(tmp_path)
    out = tmp_path / "nvidia.json"
    assert main(["cdi", "generate", *node.flags(), "--hook-path", str(hook), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"nri-gpu: refused: the spec's hook {hook} would run as root at every GPU container start" in err
    assert f"{hook.parent.parent} is owned by uid 1000, not root" in err
    assert "/usr/local/lib/nri-gpu/venv" in err  # where to install it instead
    assert not out.exists()


def test_generate_with_an_untrusted_hook_only_when_asked_and_loudly(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = users_copy_of_nri_gpu(tmp_path)
    out = tmp_path / "nvidia.json"
    argv = ["cdi", "generate", *node.flags(), "--hook-path", str(hook), "--output", str(out)]
    assert main([*argv, "--allow-untrusted-hook"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: --allow-untrusted-hook" in err and f"{hook.parent.parent} is owned by uid 1000" in err
    assert json.loads(out.read_text())["containerEdits"]["hooks"][0]["path"] == str(hook)


def test_hook_names_bad_input(
    node: SimNode, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = ["hook", "start-container", *node.flags(), "--capabilities", "compute"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"{not json")))
    assert main(flags) == 1
    assert "nri-gpu hook: the OCI state on stdin is not JSON" in capsys.readouterr().err
    state = json.dumps({"id": "c1", "bundle": str(tmp_path)}).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(state)))
    assert main(flags) == 1
    assert f"{tmp_path}/config.json: No such file or directory" in capsys.readouterr().err


def test_hook_reads_no_more_of_its_state_than_the_limit(
    node: SimNode, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The OCI state carries the pod's annotations: the hook reads one byte past its
    # limit and no further, whatever the runtime writes.
    state = io.BytesIO(b" " * (STATE_LIMIT + (8 << 20)))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(state))
    assert main(["hook", "start-container", *node.flags(), "--capabilities", "compute"]) == 1
    assert f"nri-gpu hook: the OCI state on stdin is over {STATE_LIMIT} bytes" in capsys.readouterr().err
    assert state.tell() == STATE_LIMIT + 1


def test_hook_ends_itself_at_its_time_limit(node: SimNode) -> None:
    # A stdin that never closes (or a stuck file system) must not hold the
    # container's start until the runtime's own timeout, or forever without one.
    argv = [sys.executable, "-m", "plugin", "hook", "start-container", *node.flags(), "--capabilities", "compute"]
    started = time.monotonic()
    with subprocess.Popen([*argv, "--time-limit", "0.5"], stdin=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            proc.wait(timeout=10)  # stdin stays open: communicate() would close it
        finally:
            proc.kill()
        assert proc.stderr is not None
        err = proc.stderr.read()
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, err
    assert b"nri-gpu hook: did not finish within its time limit of 0.5 s" in err
    assert elapsed < 5, elapsed


def test_hook_time_limit_must_be_sensible(node: SimNode, capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("0", "-1", "soon", "1e9"):
        with pytest.raises(SystemExit) as exc:
            main(["hook", "start-container", "--capabilities", "compute", "--time-limit", value])
        assert exc.value.code == 2
        assert "is not a number of seconds" in capsys.readouterr().err


def test_generate_into_a_missing_folder_is_refused_by_name(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi" / "nvidia.json"
    argv = ["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu", "--output", str(out), *UNCHECKED]
    assert main(argv) == 1
    assert f"nri-gpu: {out.parent}: no such folder" in capsys.readouterr().err
    assert not out.parent.exists()


def test_the_hook_never_runs_the_nvml_probe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The hook finds MIG devices by their cap nodes (placements: procfs alone), so a
    MIG container's start must not pay for an NVML child inside the hook's limit."""
    from engine import discover as discover_module
    from engine.errors import EngineError

    mig = build_node(tmp_path / "node", gpus=2, mig={0: [(2, [0])]})
    seen = []
    real = discover_module.discover

    def spy(config, **kw):  # type: ignore[no-untyped-def]
        seen.append(real(config, **kw).mig)
        raise EngineError("stop here")

    monkeypatch.setattr(discover_module, "discover", spy)
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "linux": {"devices": []}}))
    state = json.dumps({"id": "c1", "bundle": str(bundle)}).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(state)))
    assert main(["hook", "start-container", *mig.flags(), "--capabilities", "compute"]) == 1
    assert "stop here" in capsys.readouterr().err
    (layout,) = seen
    assert layout.gpu_instances and layout.nvml is None and layout.nvml_error == "not probed by the hook"
