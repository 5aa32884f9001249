"""The CDI hook's process imports only what the start work needs (``engine.hookmain``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import hookmain
from engine.cdi import hook_command
from engine.config import EngineConfig
from engine.model import ALL_CAPABILITIES, Capability
from tests.testbed.gpunode import SimNode, build_node

# The NRI path's imports: ~40 ms a GPU container's start would wait for. Of plugin/,
# only the console script's dispatcher (and its package) may be imported. Nor the
# CUDA and NVML probes the hook does not run (subprocess and selectors with them),
# nor argparse's help formatter (shutil, bz2, lzma): the spec's form is parsed without it.
HEAVY = (
    "asyncio",
    "google",
    "grpc",
    "tomlkit",
    "ssl",
    "engine.start.runner",
    "engine.cudaversion",
    "engine.nvml",
    "subprocess",
    "shutil",
)
ALLOWED = ("plugin", "plugin.entry")

# The console script's own code (pip's wrapper calls plugin.entry.main), then
# what the process holds at its end, written to the descriptor FD.
_RUN = """
import json, os, sys
sys.argv = ["nri-gpu", *sys.argv[1:]]
from plugin.entry import main
try:
    code = main()
except SystemExit as exc:
    code = exc.code
with os.fdopen(FD, "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=2)


def _hook(node: SimNode, bundle: Path) -> tuple[dict[str, object], str]:
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "status": "creating", "bundle": str(bundle)})
    r, w = os.pipe()
    argv = [
        sys.executable,
        "-c",
        _RUN.replace("FD", str(w)),
        "hook",
        "start-container",
        *node.flags(),
        "--capabilities",
        "compute",
    ]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(w,), env=env, cwd=Path(__file__).parents[3]
    ) as proc:
        os.close(w)
        _, err = proc.communicate(state.encode(), timeout=30)
    with os.fdopen(r) as f:
        return json.loads(f.read()), err.decode()


def test_the_hook_imports_nothing_of_the_nri_path(node: SimNode, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "linux": {"devices": []}}))
    result, err = _hook(node, bundle)
    modules = result["modules"]
    assert isinstance(modules, list)
    # It got as far as the start work, whatever the work made of this bare root.
    assert "engine.start.actions" in modules and "engine.discover" in modules, err
    assert "nri-gpu hook:" in err or result["code"] == 0, err
    heavy = [
        m
        for m in modules
        if m not in ALLOWED and (m.split(".")[0] == "plugin" or any(m == h or m.startswith(h + ".") for h in HEAVY))
    ]
    assert heavy == [], heavy


def _argparse(words: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    hookmain.add_arguments(parser)
    return parser.parse_args(words)


SPEC = [
    "start-container",
    "--driver-root",
    "/d",
    "--dev-root",
    "/",
    "--proc-root",
    "/proc",
    "--ld-cache",
    "merge",
    "--ldconfig",
    "/sbin/ldconfig",
    "--capabilities",
    "compute,utility",
]


@pytest.mark.parametrize(
    "words",
    [
        pytest.param(SPEC, id="as-the-spec-writes-it"),
        pytest.param(["start-container", "--capabilities", "compute"], id="defaults"),
        pytest.param([*SPEC, "--time-limit", "2.5"], id="time-limit"),
        pytest.param(["start-container", "--capabilities", ""], id="empty-value"),
    ],
)
def test_the_spec_form_parses_as_argparse_does(words: list[str]) -> None:
    assert hookmain.spec_form(words) == _argparse(words)


@pytest.mark.parametrize("caps", [frozenset(), ALL_CAPABILITIES], ids=["no-capabilities", "all-capabilities"])
@pytest.mark.parametrize("ld_cache", ["merge", "rebuild"])
def test_what_the_spec_writes_takes_the_spec_form(caps: frozenset[Capability], ld_cache: str) -> None:
    """Not a hand-copied example: the words ``hook_command`` writes into the CDI spec.
    A flag or spelling added there and not to ``spec_form`` fails here, instead of
    quietly costing every GPU container argparse's ~3 ms."""
    config = EngineConfig().with_roots(driver_root="/run/nvidia/driver", ld_cache=ld_cache)
    words = list(hook_command("/usr/bin/nri-gpu", config, caps).args[2:])
    assert hookmain.spec_form(words) == _argparse(words)


@pytest.mark.parametrize(
    "words",
    [
        pytest.param([], id="nothing"),
        pytest.param(["--capabilities", "compute", "start-container"], id="action-last"),
        pytest.param(["start-container", "--capabilities=compute"], id="equals"),
        pytest.param(["start-container", "--cap", "compute"], id="abbreviated"),
        pytest.param(["start-container", "--capabilities", "a", "--capabilities", "b"], id="twice"),
        pytest.param(["start-container", "--capabilities", "compute", "--time-limit", "-1"], id="dash-value"),
        pytest.param(["start-container", "--capabilities", "compute", "--time-limit", "soon"], id="bad-limit"),
        pytest.param(["start-container", "--capabilities", "compute", "--ld-cache", "x"], id="bad-choice"),
        pytest.param(["start-container", "--ldconfig", "/sbin/ldconfig"], id="no-capabilities"),
        pytest.param(["start-container", "--capabilities", "compute", "--help"], id="help"),
        pytest.param(["start-container", "--capabilities", "compute", "extra", "x"], id="extra"),
    ],
)
def test_any_other_form_is_left_to_argparse(words: list[str]) -> None:
    """Its answer (a message, exit status 2, help) stays argparse's."""
    assert hookmain.spec_form(words) is None


def test_a_bad_root_is_named_by_the_hooks_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """The hook has flags, not a config file: ``--driver-root``, not ``engine.driver_root``."""
    args = hookmain.spec_form(["start-container", "--capabilities", "compute", "--driver-root", "run/nvidia"])
    assert args is not None
    assert hookmain.run(args, sys.stdin) == 2
    assert capsys.readouterr().err == "nri-gpu hook: --driver-root: 'run/nvidia' must be an absolute path\n"
