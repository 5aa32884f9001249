"""The DaemonSet's init step (``nri-gpu node-setup``) sets up a containerd 1.7 node itself.

The node's runtime is a second containerd 1.7.24 whose config.toml is as 1.7 ships it
(no NRI table: NRI off; ``Containerd(nri=False)``). The DaemonSet's pod runs, as
tests/e2e/test_daemonset.py runs it, as a CRI pod from the plugin's own image on the
test bed's containerd (1.7 and 2.1): first the init container of deploy/daemonset.yaml
with its command, security context and mounts (the host's / read-only at /host, the
node runtime's config folder writable at the same path under /host), then the plugin's
container, connected to the node runtime's NRI socket. Only paths change: the node
runtime's config, NRI socket and API socket are in its workdir, and ``--timeout`` is
shorter.

* ``signal``: the init step finds containerd as the peer of its API socket and sends
  it SIGHUP; containerd exits, and the test, playing the service manager, starts it
  again; the step waits for NRI, the plugin registers and serves a GPU pod there, a
  second run changes nothing, and ``--undo`` restores the original bytes.
* ``none``: the step waits; the test restarts containerd once the config changed.
* ``systemd`` cannot run here (no systemd on these machines):
  tests/unit/plugin/test_node_setup.py runs the host's ``systemctl`` as a busybox
  script, chrooted into a host root, and checks the refusal of one others can change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugins import wait_until

from .conftest import Testbed
from .test_daemonset import SLEEP, Manifest, Sandbox, run_plugin_pod, run_sandbox, sh, start_container

NODE_VERSION = "1.7.24"  # NRI off by default: what the init step is for


@pytest.fixture
def node_runtime(testbed_factory: Callable[..., Testbed]) -> Testbed:
    bed = testbed_factory(NODE_VERSION, nri=False)
    assert not bed.containerd.nri_enabled() and not bed.containerd.nri_socket.exists()
    return bed


def _init(manifest: Manifest) -> dict[str, Any]:
    (init,) = manifest.pod["initContainers"]
    assert isinstance(init, dict)
    return init


def _value(args: list[str], flag: str) -> str:
    (value,) = [a.partition("=")[2] for a in args if a.partition("=")[0] == flag]
    return value


def run_init(sandbox: Sandbox, node: Testbed, mode: str, *, attempt: int = 0, undo: bool = False) -> str:
    """Start the DaemonSet's init container against ``node``'s containerd; its id."""
    init = _init(sandbox.manifest)
    paths = {
        "--config": str(node.containerd.config_path),
        "--socket": str(node.containerd.nri_socket),
        "--runtime-socket": str(node.containerd.address),
        "--restart-mode": mode,
        "--timeout": "30",
    }
    args = []
    for arg in init["args"]:
        flag, _, value = arg.partition("=")
        args.append(f"{flag}={paths.pop(flag, value)}")
    assert not paths, f"the DaemonSet's init container no longer has {sorted(paths)}"
    folder = str(node.containerd.config_path.parent)
    moved = {"runtime-config": (folder, _value(args, "--host-root") + folder)}
    return start_container(sandbox, init, args + (["--undo"] if undo else []), attempt=attempt, moved=moved)


def wait_exit(bed: Testbed, cid: str, timeout: float = 60) -> tuple[int, str]:
    """The init container's exit code and log, once it has exited."""
    wait_until(
        lambda: bed.cri.container_status(cid).state == "CONTAINER_EXITED", timeout, "the init container to finish"
    )
    return int(bed.cri.container_status(cid).status.exit_code), bed.cri.logs(cid)


def supervise(node: Testbed) -> threading.Thread:
    """Play containerd's service manager (Restart=always): start it again once it exits."""

    def loop() -> None:
        deadline = time.monotonic() + 60
        while node.containerd.is_running and time.monotonic() < deadline:
            time.sleep(0.05)
        if not node.containerd.is_running:
            node.containerd.start()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_signal_mode_turns_nri_on_and_the_plugin_registers_and_a_second_run_changes_nothing(
    testbed: Testbed, node_runtime: Testbed, node: SimNode
) -> None:
    config = node_runtime.containerd.config_path
    original = config.read_bytes()
    before = node_runtime.containerd.pid
    sandbox = run_sandbox(testbed, Manifest.load())

    manager = supervise(node_runtime)
    started = time.monotonic()
    code, log = wait_exit(testbed, run_init(sandbox, node_runtime, "signal"))
    took = time.monotonic() - started
    manager.join(60)
    print(f"init step, first run, {took:.1f}s from the container's creation to its exit:\n{log}")
    assert code == 0, log
    after = node_runtime.containerd.pid
    assert after is not None and after != before
    assert f"restart mode signal: SIGHUP to containerd (pid {before})" in log, log
    assert f"NRI is served (pid {after})" in log, log
    assert node_runtime.containerd.nri_enabled() and node_runtime.containerd.nri_socket.is_socket()
    assert Path(f"{config}.nri-gpu-orig").read_bytes() == original

    # The plugin's container, after its init container as the kubelet runs them, registers
    # with the node's containerd and serves a GPU pod there.
    plugin = run_plugin_pod(testbed, node, nri_socket=node_runtime.containerd.nri_socket, sandbox=sandbox)
    wait_until(lambda: "registered with" in plugin.logs(), 20, "the plugin to register")
    pod = node_runtime.cri.run_pod("gpu-0", annotations={"nvidia.com/gpus": "0"})
    cid = node_runtime.cri.run_container(pod, "main", SLEEP, image=GLIBC)
    assert f"nvidia{node.gpus[0].minor}" in sh(node_runtime.cri, cid, "ls /dev").split()
    node_runtime.cri.remove_all()
    testbed.cri.stop_container(plugin.container_id, timeout=10)

    # The pod again (a node reboot, a DaemonSet update): nothing to change, no restart.
    written = config.read_bytes()
    started = time.monotonic()
    code, log = wait_exit(testbed, run_init(sandbox, node_runtime, "signal", attempt=1))
    print(f"init step, second run: {time.monotonic() - started:.1f}s")
    assert code == 0, log
    assert "already set up" in log and f"NRI is served (pid {after}); no restart" in log and "SIGHUP" not in log, log
    assert config.read_bytes() == written and node_runtime.containerd.pid == after

    # The documented undo on removal: the original bytes back, containerd restarted without NRI.
    manager = supervise(node_runtime)
    code, log = wait_exit(testbed, run_init(sandbox, node_runtime, "signal", attempt=2, undo=True))
    manager.join(60)
    assert code == 0, log
    assert f"SIGHUP to containerd (pid {after})" in log and "restored byte for byte" in log, log
    assert config.read_bytes() == original and not Path(f"{config}.nri-gpu.json").exists()
    assert node_runtime.containerd.is_running and node_runtime.containerd.pid != after
    assert not node_runtime.containerd.nri_enabled()


def test_mode_none_waits_until_the_runtime_is_restarted(testbed: Testbed, node_runtime: Testbed) -> None:
    config = node_runtime.containerd.config_path
    original = config.read_text()
    sandbox = run_sandbox(testbed, Manifest.load())
    cid = run_init(sandbox, node_runtime, "none")
    wait_until(lambda: config.read_text() != original, 30, "the init step to edit the config")
    time.sleep(1)  # still waiting: nothing restarted containerd, so nothing serves NRI
    assert testbed.cri.container_status(cid).state == "CONTAINER_RUNNING", testbed.cri.logs(cid)
    node_runtime.containerd.restart()  # the person the step asked
    code, log = wait_exit(testbed, cid)
    assert code == 0, log
    assert "restart mode none: restart the runtime yourself (systemctl restart containerd)" in log, log
    assert f"NRI is served (pid {node_runtime.containerd.pid})" in log, log
