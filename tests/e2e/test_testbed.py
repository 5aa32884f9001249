"""Smoke tests of the test bed itself, on every containerd version: if these fail, the
NRI end-to-end tests cannot say anything about the plugin."""

from __future__ import annotations

import stat
import time
from collections.abc import Callable

import pytest

from testbed import demo, hostops
from testbed.cri import CriClient, CriError
from testbed.images import BUSYBOX

from .conftest import Testbed, _cannot_run, _preflight

LONG_RUNNING = ["sh", "-c", "echo hello; sleep 3600"]


def _shims(bed: Testbed, pod: str | None = None) -> list[int]:
    """The daemon's shims, or only those serving one pod (so a shim another test left
    winding down on the same daemon cannot fail, or pass, a test about its own pod)."""
    address = str(bed.containerd.address)
    return [
        pid
        for pid, argv in hostops.processes().items()
        if "containerd-shim" in argv[0] and address in argv and (pod is None or _flag(argv, "-id") == pod)
    ]


def _flag(argv: list[str], name: str) -> str | None:
    at = argv.index(name) if name in argv else -1
    return argv[at + 1] if 0 <= at < len(argv) - 1 else None


def _wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_daemon_serves_cri_and_nri(testbed: Testbed, cri: CriClient) -> None:
    ctrd = testbed.containerd
    assert stat.S_ISSOCK(ctrd.nri_socket.stat().st_mode)
    assert cri.version().runtime_version.startswith(testbed.version)
    log = ctrd.log_text()
    assert 'Registered namespace \\"k8s.io\\" with NRI' in log  # logfmt escapes the quotes
    assert cri.image_status(BUSYBOX).image.id


def test_pod_runs_container_and_cleans_up(testbed: Testbed, cri: CriClient) -> None:
    pod = cri.run_pod("smoke", annotations={"example.com/probe": "yes"})
    cid = cri.run_container(pod, "main", LONG_RUNNING)

    code, out, err = cri.exec_sync(cid, ["cat", "/proc/self/status"])
    assert code == 0, err
    assert "Name:\tcat" in out
    assert "hello" in cri.wait_for_log(cid, "hello")

    status, _ = cri.pod_status(pod)
    assert status.annotations["example.com/probe"] == "yes"
    info = cri.container_status(cid, verbose=True)
    assert info.state == "CONTAINER_RUNNING"
    assert info.spec["process"]["args"] == LONG_RUNNING
    assert info.spec["linux"]["cgroupsPath"].startswith(testbed.containerd.cgroup_parent + "/")
    assert _shims(testbed, pod)

    cri.remove_all()
    assert cri.list_pods() == [] and cri.list_containers() == []
    assert hostops.mounts_under(testbed.workdir) == []
    # A shim exits on its own after its last task is deleted; on a loaded two-core CI
    # machine that took longer than 5 s once, so the wait is generous.
    assert _wait_until(lambda: not _shims(testbed, pod), timeout=30.0), "shim still running after its pod was removed"


def test_restart_keeps_containers_and_runs_new_pods(testbed: Testbed, cri: CriClient) -> None:
    ctrd = testbed.containerd
    pod = cri.run_pod("before")
    cid = cri.run_container(pod, "main", LONG_RUNNING)
    old_pid = ctrd.pid

    ctrd.restart()

    assert ctrd.pid != old_pid
    assert ctrd.nri_socket.exists()
    assert cri.container_status(cid).state == "CONTAINER_RUNNING"
    assert cri.exec_sync(cid, ["true"])[0] == 0
    new_pod = cri.run_pod("after")
    new_cid = cri.run_container(new_pod, "main", LONG_RUNNING)
    assert "hello" in cri.wait_for_log(new_cid, "hello")


def test_clean_stop_then_start(testbed: Testbed, cri: CriClient) -> None:
    ctrd = testbed.containerd
    pod = cri.run_pod("doomed")
    cri.run_container(pod, "main", LONG_RUNNING)

    ctrd.stop()

    assert not ctrd.is_running and ctrd.pid is None
    assert not _shims(testbed)
    assert hostops.mounts_under(testbed.workdir) == []
    ctrd.start()
    assert cri.list_pods() == []
    cid = cri.run_container(cri.run_pod("reborn"), "main", LONG_RUNNING)
    assert cri.exec_sync(cid, ["echo", "ok"]) == (0, "ok\n", "")


def test_kill_leaves_containers_for_the_next_start(testbed: Testbed, cri: CriClient) -> None:
    ctrd = testbed.containerd
    cid = cri.run_container(cri.run_pod("survivor"), "main", LONG_RUNNING)

    ctrd.kill()

    assert not ctrd.is_running
    assert _shims(testbed), "SIGKILL of the daemon must not take the shims down"
    ctrd.start()
    assert cri.container_status(cid).state == "CONTAINER_RUNNING"


def test_cri_errors_carry_the_runtime_message(testbed: Testbed, cri: CriClient) -> None:
    pod = cri.run_pod("errors")
    with pytest.raises(CriError) as failure:
        cri.create_container(pod, None, "ghost", "localhost/nri-gpu/no-such-image:1", ["true"])
    assert failure.value.method == "CreateContainer"
    assert "no-such-image" in str(failure.value)  # the runtime's own words reach the test


def test_readonly_and_privileged_containers(testbed: Testbed, cri: CriClient) -> None:
    pod = cri.run_pod("modes", privileged=True)
    ro = cri.run_container(pod, "ro", LONG_RUNNING, readonly_rootfs=True)
    code, _, err = cri.exec_sync(ro, ["touch", "/x"])
    assert code != 0 and "Read-only file system" in err
    priv = cri.run_container(pod, "priv", LONG_RUNNING, privileged=True, env={"FOO": "bar"})
    assert cri.exec_sync(priv, ["sh", "-c", "echo $FOO; mknod /tmp/n c 1 3 && echo made"])[1] == "bar\nmade\n"


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_demo_through_a_cdi_runtime(runtime: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``hack/demo --runtime podman|docker`` (what the README offers) tells its story:
    the GPUs' nodes and libcuda in the requesting container, nothing in the other, the
    unknown device refused by name."""
    reason = _preflight()
    if reason:
        _cannot_run(reason)
    assert demo.main(["--runtime", runtime, "--gpus", "0"]) == 0
    out = capsys.readouterr().out
    asked, rest = out.split("(no --device): it asked for nothing and got nothing", 1)
    assert "nvidiactl" in asked and "libcuda.so.1 " in asked, asked
    assert "(no NVIDIA devices)" in rest and "libcuda.so.1 " not in rest, rest
    assert "is refused (exit" in rest and "nvidia.com/gpu=7" in rest, rest
