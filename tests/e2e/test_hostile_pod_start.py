"""Hostile pods at StartContainer, on real containerd 1.7.24 and 2.1.9 (both versions).

The start work runs as root, in a worker forked from the plugin (the plugin's
cgroup: no device restriction), on files of the container's image and of its
pod's volumes. The attacks, with their pass conditions:

1. An image with a character device, or a FIFO, where the start work writes
   (``/etc/ld.so.conf.d/00-nri-gpu.conf``, ``/etc/ld.so.cache``): the start
   succeeds in well under a second (nothing waits on a FIFO), the device node's
   inode is never opened (an inotify ``IN_OPEN`` watch set on it through
   ``/proc/<pid>/root`` just before the work: every successful open of that
   inode is an event), and both paths end up regular files of ours.
2. A sidecar racing on a shared volume (the emptyDir of a pod, here a host
   directory mounted into both containers at ``/data``): it swaps
   ``/data/ld.so.cache`` between a regular file, a FIFO and a ``c 1 3`` device
   node in a loop, while GPU containers whose image links ``/etc/ld.so.cache``
   into ``/data`` start one after the other. Nothing of ours opens anything
   named ``ld.so.cache`` in the volume (inotify on the host directory; the
   sidecar itself never opens that name, it renames onto it), every start
   succeeds in time, and each container gets a regular cache of its own.
3. A read-only-root GPU pod whose start worker is SIGKILLed at its 1st, 2nd,
   ... step, and which runs anyway (the plugin here swallows the failure, as
   containerd does when the plugin misses its deadline: it starts the
   container): its ``/`` is read-only every time.

The plugin is nri-gpu's own handlers in a thread of this process (``PluginThread``),
so a test can watch just before the work and stop a worker at a chosen step.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.start import find_init_pid, runner
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.errors import PluginError
from nri_gpu.plugin.handlers import GpuPlugin
from testbed import hostile, images
from testbed.cri import CriClient
from testbed.gpunode import SimNode
from testbed.images import BUSYBOX
from testbed.openwatch import OpenWatch
from testbed.plugins import PluginThread
from tests.integration.startcall import killing_at

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]
GPU = {"nvidia.com/gpus": "0"}
_SWAP = (
    "cd /data; while :; do "
    "echo x > t && mv -f t ld.so.cache; "
    "rm -f f; mkfifo f && mv -f f ld.so.cache; "
    "rm -f d; mknod d c 1 3 && mv -f d ld.so.cache; "
    "done"
)


class WatchingGpuPlugin(GpuPlugin):
    """nri-gpu's handlers. At StartContainer of a container named ``trap...``, an
    ``IN_OPEN`` watch is set on each special file its image planted, through
    ``/proc/<pid>/root``, before the work; ``opens`` gets the count per path after.
    A refusal (``PluginError``, "step: cause") is kept in ``failures`` and, with
    ``swallow``, not raised: the container then starts, as when containerd drops a
    plugin that missed its deadline."""

    def __init__(self, config: EngineConfig, *, swallow: bool = False) -> None:
        super().__init__(config)
        self.swallow = swallow
        self.opens: dict[str, int] = {}
        self.failures: list[str] = []
        self.cgroups_paths: list[str] = []  # what the runtime sent: the start work checks the pid is in it

    async def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        watches: dict[str, OpenWatch] = {}
        self.cgroups_paths.append(container.linux.cgroups_path)
        if container.name.startswith("trap"):
            pid = container.pid or find_init_pid(container.linux.cgroups_path)
            for path in hostile.SPECIAL_PATHS:
                watches[path] = OpenWatch(Path(f"/proc/{pid}/root/{path}"))
        try:
            await super().start_container(pod, container)
        except PluginError as exc:
            self.failures.append(str(exc))
            if not self.swallow:
                raise
        finally:
            for path, watch in watches.items():
                self.opens[f"{container.name}:/{path}"] = len(watch.opened())
                watch.close()


@pytest.fixture(scope="module")
def pod_images(containerd: Testbed) -> dict[str, str]:
    """The pod cases' hostile images, built (cached) and imported: case -> image name."""
    names = {}
    for case in hostile.POD_CASES:
        images.import_image(containerd.containerd, hostile.hostile_image(case))
        names[case] = hostile.image_name(case)
    return names


def _config(node: SimNode, ld_cache: str = "merge") -> EngineConfig:
    return EngineConfig(
        driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root), ld_cache=ld_cache
    )


@pytest.fixture
def serve(testbed: Testbed, node: SimNode) -> Iterator[Callable[..., WatchingGpuPlugin]]:
    """``serve(swallow=False)``: a ``WatchingGpuPlugin`` registered with the test's containerd."""
    running: list[PluginThread] = []

    def start(*, swallow: bool = False) -> WatchingGpuPlugin:
        plugin = WatchingGpuPlugin(_config(node), swallow=swallow)
        running.append(PluginThread(plugin, testbed.containerd.nri_socket, name="nri-gpu", index="10").start())
        return plugin

    yield start
    for thread in running:
        thread.stop()


def _sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, (script, out, err)
    return out


def _timed_start(cri: CriClient, cid: str) -> float:
    began = time.monotonic()
    cri.start_container(cid)
    return time.monotonic() - began


# --------------------------------------------------------------------------- 1. special files in the image


@pytest.mark.parametrize("case", ["devnodes", "fifos"])
def test_a_device_node_or_fifo_where_our_files_go(
    cri: CriClient, serve: Callable[..., WatchingGpuPlugin], pod_images: dict[str, str], case: str
) -> None:
    plugin = serve()
    pod = cri.run_pod(f"special-{case}", annotations=GPU)
    cid = cri.create_container(pod, None, "trap", pod_images[case], SLEEP)
    took = _timed_start(cri, cid)
    assert took < 1.5, f"StartContainer took {took:.2f} s"
    assert plugin.failures == []
    assert all(plugin.cgroups_paths), plugin.cgroups_paths  # so the pid's cgroup was checked too
    if case == "devnodes":
        opened = {path: n for path, n in plugin.opens.items() if n}
        assert not opened, f"device nodes of the image were opened: {opened}"
    kinds = _sh(cri, cid, "stat -c %F " + " ".join(f"/{p}" for p in hostile.SPECIAL_PATHS))
    assert kinds.splitlines() == ["regular file", "regular file"]
    assert "libcuda.so.1 (libc6,x86-64)" in _sh(cri, cid, "ldconfig -p")


# --------------------------------------------------------------------------- 2. a sidecar racing on a volume


def test_a_sidecar_swapping_a_file_device_and_fifo_on_a_shared_volume(
    cri: CriClient, serve: Callable[..., WatchingGpuPlugin], pod_images: dict[str, str], tmp_path: Path
) -> None:
    serve()
    volume = tmp_path / "emptydir"
    volume.mkdir(mode=0o777)
    mount = cri.pb.Mount(container_path=hostile.VOLUME, host_path=str(volume))
    pod = cri.run_pod("racing", annotations=GPU)
    sidecar = cri.run_container(pod, "sidecar", ["sh", "-c", _SWAP], image=BUSYBOX, mounts=[mount])
    watch = OpenWatch(volume)
    starts, kinds = [], set()
    stop = threading.Event()

    def observe() -> None:  # what the sidecar has in place, as the starts go on
        while not stop.is_set():
            try:
                kinds.add(os.lstat(volume / "ld.so.cache").st_mode >> 12)
            except FileNotFoundError:
                pass

    observer = threading.Thread(target=observe)
    observer.start()
    try:
        for i in range(8):
            cid = cri.create_container(pod, None, f"gpu-{i}", pod_images["cachevolume"], SLEEP, mounts=[mount])
            starts.append(_timed_start(cri, cid))
            assert _sh(cri, cid, "stat -c %F /etc/ld.so.cache") == "regular file\n"
            assert "libcuda.so.1 (libc6,x86-64)" in _sh(cri, cid, "ldconfig -p")
    finally:
        stop.set()
        observer.join()
        opened = [name for name in watch.opened() if name == "ld.so.cache"]
        watch.close()
        cri.stop_container(sidecar)
    assert len(kinds) == 3, f"the sidecar did not swap all three kinds in: {kinds}"  # regular, FIFO, device
    assert not opened, f"something opened the volume's ld.so.cache {len(opened)} times"
    assert max(starts) < 1.5, starts
    print(f"\nstarts while the sidecar swaps: {[round(s * 1000) for s in starts]} ms")


# --------------------------------------------------------------------------- 3. a read-only root, killed at each step


def test_a_read_only_root_pod_killed_at_each_step_still_runs_read_only(
    cri: CriClient, serve: Callable[..., WatchingGpuPlugin], monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = serve(swallow=True)
    pod = cri.run_pod("readonly", annotations=GPU)
    killed: list[str] = []
    for n in range(1, 20):
        monkeypatch.setattr(runner, "_emit", killing_at(n))
        cid = cri.create_container(pod, None, f"ro-{n}", images.GLIBC, SLEEP, readonly_rootfs=True)
        cri.start_container(cid)  # a failed start work is swallowed: the container runs anyway
        code, out, err = cri.exec_sync(cid, ["sh", "-c", "touch /x"])
        assert code != 0 and "Read-only file system" in out + err, (killed, code, out, err)
        options = _sh(cri, cid, "awk '$5 == \"/\" {print $6}' /proc/self/mountinfo").split(",")
        assert "ro" in options, (killed, options)
        if len(plugin.failures) < n:  # this one was not killed: every step was reached
            break
        step, _, why = plugin.failures[-1].partition(": ")
        assert "killed by SIGKILL" in why, plugin.failures[-1]
        killed.append(step)
        cri.stop_container(cid)
    else:
        pytest.fail(f"never finished: killed at {killed}")
    assert len(killed) >= 5, killed
    print(f"\nkilled at each of {killed}, then ran read-only")
