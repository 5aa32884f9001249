"""The CDI hook's process imports only what the start work needs (``engine.hookmain``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed.gpunode import SimNode, build_node

# The NRI path's imports: ~40 ms a GPU container's start would wait for. Of plugin/,
# only the console script's dispatcher (and its package) may be imported. Nor the
# CUDA and NVML probes the hook does not run (subprocess and selectors with them).
HEAVY = ("asyncio", "google", "grpc", "tomlkit", "ssl", "engine.start.runner", "engine.cudaversion", "engine.nvml",
         "subprocess")
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
