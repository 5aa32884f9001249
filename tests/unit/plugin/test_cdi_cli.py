"""``nri-gpu cdi generate``, the work it gives the compiled hook (``nri-gpu-hook
start-container --work``) and the old spec's ``nri-gpu hook``, as a user and a runtime run them.

The hook is the one this test run's venv holds (hack/setup builds it from hook/).
Every hook run here stops before the start work; its command line, its state and
what it does in a container are tests/integration/test_hook.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nri_gpu.engine.cdi import hook_work
from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import discover
from nri_gpu.engine.model import DEFAULT_CAPABILITIES
from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.cdi import NO_HOOK
from nri_gpu.plugin.cli.entry import OLD_SPEC_MESSAGE
from testbed.gpunode import SimNode, build_node
from testbed.plugins import NRI_GPU, NRI_GPU_HOOK
from tests.unit.plugin import support

# These tests are about the spec's content: its hook path names no real file.
UNCHECKED = ["--allow-untrusted-hook"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=2)


@pytest.fixture(scope="module")
def work(node: SimNode) -> str:
    """The ``--work`` argument a spec of ``node`` gives its hook."""
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    return json.dumps(hook_work(discover(config), config, DEFAULT_CAPABILITIES))


@pytest.fixture
def trusted_hook() -> str:
    """This venv's compiled hook, where root alone can change it (the only kind a spec names)."""
    return support.trusted_hook()


def hook(work: str) -> subprocess.CompletedProcess[str]:
    """``nri-gpu-hook start-container --work work`` as runc runs it (PATH alone in its
    environment), with an empty stdin."""
    return subprocess.run(
        [NRI_GPU_HOOK, "start-container", "--work", work],
        input="", capture_output=True, text=True, timeout=30, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )  # fmt: skip


# -- cdi generate ---------------------------------------------------------------------


def test_generate_writes_the_spec_file(node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nvidia.json"
    argv = [
        "cdi",
        "generate",
        *node.flags(),
        "--hook-path",
        "/opt/nri-gpu/bin/nri-gpu-hook",
        "--output",
        str(out),
        *UNCHECKED,
    ]
    assert main(argv) == 0
    spec = json.loads(out.read_text())
    assert [d["name"] for d in spec["devices"]][-1] == "all"
    (entry,) = spec["containerEdits"]["hooks"]
    assert entry["path"] == "/opt/nri-gpu/bin/nri-gpu-hook"
    assert entry["args"][:5] == ["/opt/nri-gpu/bin/nri-gpu-hook", "start-container", "--time-limit", "10", "--work"]
    work = json.loads(entry["args"][5])
    assert work["gpus"] == [[g.minor, g.bus_id] for g in node.gpus] and work["graphics"] is False
    assert len(entry["args"]) == 6
    assert out.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.json"]  # no temporary file left


def test_generate_caps_and_refusals(node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu-hook", *UNCHECKED]
    assert main([*argv, "--capabilities", "all"]) == 0
    edits = json.loads(capsys.readouterr().out)["containerEdits"]
    assert "NVIDIA_DRIVER_CAPABILITIES=compat32,compute,display,graphics,ngx,utility,video" in edits["env"]
    assert json.loads(edits["hooks"][0]["args"][-1])["graphics"] is True
    assert main([*argv, "--capabilities", "warp"]) == 1
    assert '--capabilities "warp": unknown capability' in capsys.readouterr().err
    empty = tmp_path / "empty"
    assert main(["cdi", "generate", "--proc-root", str(empty), "--hook-path", "/x/nri-gpu-hook", *UNCHECKED]) == 1
    assert "a CDI spec needs at least one device" in capsys.readouterr().err


def test_generate_with_rebuild_gives_the_hook_the_mode_and_its_ldconfig(
    node: SimNode, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu-hook", *UNCHECKED, "--ld-cache", "rebuild"]
    assert main(argv) == 0
    work = json.loads(json.loads(capsys.readouterr().out)["containerEdits"]["hooks"][0]["args"][-1])
    assert (work["ld_cache"], work["ldconfig"]) == ("rebuild", "/sbin/ldconfig")


def users_copy_of_the_hook(tmp_path: Path) -> Path:
    """``nri-gpu-hook`` in a folder of uid 1000's, as in a user's own checkout."""
    home = tmp_path / "home" / "alice"
    (home / "bin").mkdir(parents=True)
    hook = home / "bin" / "nri-gpu-hook"
    shutil.copyfile(NRI_GPU_HOOK, hook)
    hook.chmod(0o755)
    os.chown(home, 1000, 1000)
    return hook


def test_generate_refuses_a_hook_a_user_can_change(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # sudo ~alice/bin/nri-gpu cdi generate: every GPU container start would run,
    # as root, whatever alice puts there later.
    hook = users_copy_of_the_hook(tmp_path)
    out = tmp_path / "nvidia.json"
    assert main(["cdi", "generate", *node.flags(), "--hook-path", str(hook), "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"nri-gpu: refused: the spec's hook {hook} would run as root at every GPU container start" in err
    assert f"{hook.parent.parent} is owned by uid 1000, not root" in err
    assert "/usr/local/lib/nri-gpu/venv" in err  # where to install it instead
    assert not out.exists()


def test_generate_refuses_a_hook_that_is_not_the_compiled_one(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The nri-gpu console script where the hook belongs: root's, but a Python script.
    out = tmp_path / "nvidia.json"
    assert main(["cdi", "generate", *node.flags(), "--hook-path", NRI_GPU, "--output", str(out)]) == 1
    assert (
        f"{NRI_GPU} is not nri-gpu's compiled hook (not an ELF file): pass the nri-gpu-hook installed beside nri-gpu"
        in capsys.readouterr().err
    )
    assert not out.exists()


def test_generate_with_an_untrusted_hook_only_when_asked_and_loudly(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hook = users_copy_of_the_hook(tmp_path)
    out = tmp_path / "nvidia.json"
    argv = ["cdi", "generate", *node.flags(), "--hook-path", str(hook), "--output", str(out)]
    assert main([*argv, "--allow-untrusted-hook"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: --allow-untrusted-hook" in err and f"{hook.parent.parent} is owned by uid 1000" in err
    assert json.loads(out.read_text())["containerEdits"]["hooks"][0]["path"] == str(hook)


@pytest.mark.parametrize("how", ["venv", "link"])
def test_generate_names_the_hook_installed_beside_nri_gpu(
    node: SimNode, tmp_path: Path, trusted_hook: str, how: str
) -> None:
    """No --hook-path: the nri-gpu-hook in the folder the running nri-gpu really is in
    (through a link such as the README's /usr/local/bin/nri-gpu)."""
    nri_gpu = NRI_GPU
    if how == "link":
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "nri-gpu").symlink_to(NRI_GPU)
        nri_gpu = str(tmp_path / "bin" / "nri-gpu")
    out = tmp_path / "nvidia.json"
    done = subprocess.run(
        [nri_gpu, "cdi", "generate", *node.flags(), "--output", str(out)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads(out.read_text())["containerEdits"]["hooks"]
    assert entry["path"] == entry["args"][0] == os.path.realpath(trusted_hook)


def test_generate_without_a_hook_beside_nri_gpu_asks_for_one(node: SimNode, tmp_path: Path) -> None:
    # A copy of the console script in a folder of its own: no nri-gpu-hook beside it.
    (tmp_path / "bin").mkdir()
    lone = tmp_path / "bin" / "nri-gpu"
    shutil.copy(NRI_GPU, lone)
    out = tmp_path / "nvidia.json"
    done = subprocess.run(
        [str(lone), "cdi", "generate", *node.flags(), "--output", str(out)],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/",
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (2, NO_HOOK + "\n")
    assert not out.exists()


def test_generate_into_a_missing_folder_is_refused_by_name(
    node: SimNode, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cdi" / "nvidia.json"
    argv = ["cdi", "generate", *node.flags(), "--hook-path", "/x/nri-gpu-hook", "--output", str(out), *UNCHECKED]
    assert main(argv) == 1
    assert f"nri-gpu: {out.parent}: no such folder" in capsys.readouterr().err
    assert not out.parent.exists()


# -- a spec written before the compiled hook ---------------------------------------------


def test_the_old_specs_hook_fails_the_start_and_says_what_to_do() -> None:
    """A spec of an older nri-gpu names ``nri-gpu hook start-container ...``: the
    container's start fails (status 1: runc fails a createContainer hook that does)
    with the one thing to do, rather than start without its start work."""
    done = subprocess.run(
        [NRI_GPU, "hook", "start-container", "--capabilities", "compute"],
        input=json.dumps({"id": "c1", "bundle": "/nonexistent"}),
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/",
    )  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (1, "", OLD_SPEC_MESSAGE)
    assert "nri-gpu cdi generate" in OLD_SPEC_MESSAGE and "nri-gpu-hook" in OLD_SPEC_MESSAGE


# -- the compiled hook's work argument ----------------------------------------------------
#
# Its command line, stdin and bundle as a runtime gives them: tests/integration/test_hook.py.


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ipc_root": "run/nvidia"}, "ipc_root: 'run/nvidia' is not a clean absolute path"),
        ({"proc_source": "/proc/../etc"}, "proc_source: '/proc/../etc' is not a clean absolute path"),
        ({"ld_cache": "fast"}, 'ld_cache is not "merge" or "rebuild"'),
        ({"gpus": [[0, "../0000:07:00.0"]]}, "bad bus id '../0000:07:00.0'"),
    ],
    ids=["relative-root", "unclean-proc", "bad-mode", "bad-bus-id"],
)
def test_a_bad_work_description_is_named_before_anything_is_read(
    work: str, change: dict[str, object], message: str
) -> None:
    """The spec is the hook's one input besides the state: a value it cannot use is a
    usage error naming it, as a bad flag of the Python hook was."""
    done = hook(json.dumps({**json.loads(work), **change}))
    assert (done.returncode, done.stderr) == (2, f"nri-gpu hook: --work: {message}\n")
