"""GpuPlugin through the stub and the fake runtime, on a simulated node; the
namespace work itself is replaced by a recorder (it is tested against runc)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.engine.errors import StartError
from nri_gpu.engine.model import Inventory
from nri_gpu.engine.start.work import StartWork
from nri_gpu.plugin.events import Event
from nri_gpu.plugin.handlers import GpuPlugin
from nri_gpu.plugin.stub import Stub
from nri_gpu.plugin.ttrpc import StatusError
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from tests.fake_runtime import FakeRuntime, connected, container, pod
from tests.unit.plugin.support import gpu_plugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=4, driver_files=FIXTURE_DRIVER)


def test_start_gets_the_pid_and_the_planned_work(node: SimNode) -> None:
    calls: list[tuple[int, StartWork, str]] = []
    timeouts: list[float] = []

    async def starter(pid: int, work: StartWork, *, ldconfig: str, timeout: float, on_report: Any) -> None:
        calls.append((pid, work, ldconfig))
        timeouts.append(timeout)

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "1"}), container("main")
        reply = await rt.create_container(p, c)
        assert [d.path for d in reply.adjust.linux.devices if d.path[11:].isdigit()] == [
            f"/dev/nvidia{node.gpus[1].minor}"
        ]
        c.pid = 4242
        await rt.state_change(Event.START_CONTAINER, p, c)
        # A container that asked for nothing never reaches the starter.
        plain = container("plain")
        plain.pid = 1
        await rt.state_change(Event.START_CONTAINER, pod("web"), plain)

    asyncio.run(connected(gpu_plugin(node, starter), body))
    assert len(calls) == 1
    pid, work, ldconfig = calls[0]
    assert pid == 4242 and ldconfig == "/sbin/ldconfig"
    assert work.visible_bus_ids == (node.gpus[1].bus_id,)
    assert work.proc_source == str(node.proc_root) + "/driver/nvidia"
    assert work.container == 'container "main" in pod "ml/train"'
    assert any(s.path.endswith("/libcuda.so.1") for s in work.symlinks)
    # The runtime's 2 s deadline, less the reply's margin and what the handler took.
    assert 1.0 < timeouts[0] <= 2.0 - 0.3


def test_a_failed_start_names_container_and_step_once(node: SimNode) -> None:
    async def starter(pid: int, work: StartWork, **kw: Any) -> None:
        raise StartError(work.container, "procfs isolation", "bus id 0000:99:00.0 is not on this node")

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container("main")
        await rt.create_container(p, c)
        c.pid = 7
        with pytest.raises(StatusError) as err:
            await rt.state_change(Event.START_CONTAINER, p, c)
        msg = err.value.message
        assert msg.endswith("procfs isolation: bus id 0000:99:00.0 is not on this node")
        assert msg.count('container "main"') == 1

    asyncio.run(connected(gpu_plugin(node, starter), body))


def test_pid_zero_without_a_cgroup_is_a_clear_refusal(node: SimNode, tmp_path: Path) -> None:
    async def starter(pid: int, work: StartWork, **kw: Any) -> None:
        raise AssertionError("must not be called without a pid")

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod(annotations={"nvidia.com/gpus": "0"}), container("main")
        await rt.create_container(p, c)
        c.linux.cgroups_path = "/nri-gpu-test-does-not-exist/abc"
        with pytest.raises(StatusError) as err:
            await rt.state_change(Event.START_CONTAINER, p, c)
        assert "StartContainer" in err.value.message and "cgroup" in err.value.message.lower()

    asyncio.run(connected(gpu_plugin(node, starter), body))


def test_create_refusal_reaches_the_runtime(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError) as err:
            await rt.create_container(pod(annotations={"nvidia.com/gpus": "9"}), container("main"))
        assert "GPU 9 does not exist; this node has 4 GPUs" in err.value.message

    asyncio.run(connected(gpu_plugin(node, lambda *a, **k: None), body))


def _recording_starter(calls: list[StartWork]) -> Any:
    async def starter(pid: int, work: StartWork, **kw: Any) -> None:
        calls.append(work)

    return starter


def test_start_without_our_create_fails_closed(node: SimNode) -> None:
    """CreateContainer happened while no plugin was connected: no devices, so no start."""
    calls: list[StartWork] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container("main")
        c.pid = 99
        with pytest.raises(StatusError) as err:
            await rt.state_change(Event.START_CONTAINER, p, c)
        assert "was created while nri-gpu was not connected" in err.value.message
        assert 'container "main"' in err.value.message
        # A container that asks for nothing is still nobody's business.
        plain = container("plain")
        plain.pid = 98
        await rt.state_change(Event.START_CONTAINER, pod("web"), plain)

    asyncio.run(connected(gpu_plugin(node, _recording_starter(calls)), body))
    assert calls == []


def test_start_after_a_plugin_restart_uses_the_recorded_gpus(node: SimNode) -> None:
    """An earlier run of the plugin created it: same GPUs again, or a refusal if they moved."""
    calls: list[StartWork] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p = pod("train", "ml", annotations={"nvidia.com/gpus": "2"})
        c = container("main")
        c.pid = 77
        c.annotations["nri-gpu.io/gpus"] = node.gpus[2].uuid
        await rt.state_change(Event.START_CONTAINER, p, c)
        moved = container("other")
        moved.pid = 78
        moved.annotations["nri-gpu.io/gpus"] = node.gpus[1].uuid
        with pytest.raises(StatusError) as err:
            await rt.state_change(Event.START_CONTAINER, p, moved)
        assert f"created with GPUs {node.gpus[1].uuid}, but its request now selects {node.gpus[2].uuid}" in (
            err.value.message
        )

    asyncio.run(connected(gpu_plugin(node, _recording_starter(calls)), body))
    assert [w.visible_bus_ids for w in calls] == [(node.gpus[2].bus_id,)]


def test_synchronize_names_running_gpu_containers_that_missed_us_or_our_start(
    node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    from nri_gpu.plugin._proto import nri_pb2 as api

    p = pod("train", "ml", annotations={"nvidia.com/gpus": "0"})
    missed, equipped, plain, waiting = container("missed"), container("equipped"), container("plain"), container("new")
    half, whole, gone, nothing = container("half"), container("whole"), container("gone"), container("nothing")
    for c in (missed, equipped, plain, half, whole, gone, nothing):
        c.state = api.CONTAINER_RUNNING
        c.pod_sandbox_id = p.id
    waiting.pod_sandbox_id = p.id  # created, not started: its StartContainer will be refused
    for c in (equipped, half, whole, gone):
        c.annotations["nri-gpu.io/gpus"] = node.gpus[0].uuid
    nothing.annotations["nri-gpu.io/gpus"] = "none"  # NVIDIA_VISIBLE_DEVICES=none: no view to expect
    # equipped: pid 0 (the runtime did not say): nothing to check.
    half.pid, whole.pid, gone.pid, nothing.pid = 101, 102, 103, 104
    shows_view = {101: False, 102: True, 103: None, 104: False}
    web = pod("web", "default")
    plain.pod_sandbox_id = web.id
    checked: list[int] = []

    def view_check(pid: int) -> bool | None:
        checked.append(pid)
        return shows_view[pid]

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        pass

    with caplog.at_level("WARNING", logger="nri_gpu.plugin.handlers"):
        asyncio.run(
            connected(
                gpu_plugin(node, lambda *a, **k: None, view_check=view_check),
                body,
                pods=[p, web],
                containers=[missed, equipped, plain, waiting, half, whole, gone, nothing],
            )
        )
    warned = [r.getMessage() for r in caplog.records if r.name == "nri_gpu.plugin.handlers"]
    assert warned == [
        'container "missed" in pod "ml/train" runs without its GPUs: it asked for GPUs but was created and '
        "started while nri-gpu was not connected; delete it and create it again",
        'container "half" in pod "ml/train" runs half equipped: it has its GPUs\' devices and driver files but '
        "not its start work (no /proc/driver view, library links or ld.so cache): nri-gpu stopped, or the runtime "
        "dropped it, while it was starting; delete it and create it again",
    ]
    assert sorted(checked) == [101, 102, 103]


def test_a_plan_is_forgotten_when_its_container_is_removed_unstarted(node: SimNode) -> None:
    calls: list[StartWork] = []
    plugin = gpu_plugin(node, _recording_starter(calls))

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container("main")
        await rt.create_container(p, c)
        assert list(plugin._pending) == [c.id]
        await rt.state_change(Event.REMOVE_CONTAINER, p, c)

    asyncio.run(connected(plugin, body))
    assert plugin._pending == {} and calls == []  # nothing kept for a container that will never start


# -- budgets: nothing slow on the event loop (docs/budgets.md) ------------------------------


def _node_with_a_gpu_to_come(tmp_path: Path) -> tuple[SimNode, Path, Path]:
    """A 4-GPU node whose GPU 3 is hidden from procfs at first; (node, where its
    folder is, where it is kept meanwhile)."""
    node = build_node(tmp_path / "node", gpus=4, driver_files=FIXTURE_DRIVER)
    folder = node.proc_root / "driver/nvidia/gpus" / node.gpus[3].bus_id
    kept = tmp_path / "kept"
    shutil.move(folder, kept)
    return node, folder, kept


def _gated_cache(node: SimNode) -> tuple[InventoryCache, threading.Event, threading.Event]:
    """Checked at every request (interval 0); (the cache, ``go``, ``began``): each
    discovery after the first sets ``began``, then hangs until ``go`` is set (as a
    CUDA probe that takes its time)."""
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    go, began = threading.Event(), threading.Event()
    takes: list[int] = []

    def take(c: EngineConfig) -> Inventory:
        if takes:
            began.set()
            go.wait(30)
        takes.append(1)
        return discover(c, cuda_version=lambda p: ("12.4", None))

    return InventoryCache(config, interval=0, take=take), go, began


async def _answer(call: Awaitable[Any]) -> Any:
    """The reply, or the StatusError the runtime got instead (its 2 s deadline included)."""
    try:
        return await call
    except StatusError as exc:
        return exc


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.005)


def test_a_slow_discovery_never_holds_up_create_container(tmp_path: Path) -> None:
    """A driver change makes the inventory be taken again, here by a discovery that
    hangs until the test lets it finish (a CUDA probe timing out): meanwhile
    CreateContainer answers from the old inventory, and a request for the GPU only
    the new one has waits a bounded time, then is refused with the reason, within
    the runtime's 2 s deadline (the fake runtime's). Once the new inventory is in,
    the GPU is given. (Before: the first request after the change ran the whole
    discovery on the event loop and missed the deadline: the runtime drops the plugin.)"""
    node, folder, kept = _node_with_a_gpu_to_come(tmp_path)
    cache, go, began = _gated_cache(node)
    plugin = gpu_plugin_on(node, cache)
    p = pod("train", "ml", annotations={"nvidia.com/gpus": "0"})
    three = pod("three", "ml", annotations={"nvidia.com/gpus": "3"})

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        reply = await _answer(rt.create_container(p, container("a")))
        assert not isinstance(reply, StatusError), reply
        shutil.move(kept, folder)  # GPU 3 appears: the next check starts a discovery that hangs
        for name in ("b", "c", "d"):
            reply = await _answer(rt.create_container(p, container(name)))
            assert not isinstance(reply, StatusError), reply
        assert await asyncio.to_thread(began.wait, 5), "no discovery was started"
        assert not go.is_set()  # so b, c and d were answered while it hung
        refused = await _answer(rt.create_container(three, container("early")))
        assert isinstance(refused, StatusError), refused
        assert "GPU 3 does not exist; this node has 3 GPUs" in refused.message
        assert "being taken again" in refused.message and "try again" in refused.message
        reply = await _answer(rt.create_container(p, container("e")))
        assert not isinstance(reply, StatusError), reply
        go.set()
        await _until(lambda: len(cache.current.gpus) == 4)
        given = await _answer(rt.create_container(three, container("late")))
        assert not isinstance(given, StatusError), given
        assert [d.path for d in given.adjust.linux.devices if d.path[11:].isdigit()] == [
            f"/dev/nvidia{node.gpus[3].minor}"
        ]

    try:
        asyncio.run(connected(plugin, body))
    finally:
        go.set()


def test_a_request_for_a_gpu_a_quick_refresh_brings_waits_for_it(tmp_path: Path) -> None:
    node, folder, kept = _node_with_a_gpu_to_come(tmp_path)
    cache, go, began = _gated_cache(node)
    plugin = gpu_plugin_on(node, cache)
    three = pod("three", "ml", annotations={"nvidia.com/gpus": "3"})

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        shutil.move(kept, folder)
        asked = asyncio.ensure_future(_answer(rt.create_container(three, container("main"))))
        assert await asyncio.to_thread(began.wait, 5), "no discovery was started"
        go.set()  # only now can the new inventory, the only one with GPU 3, be complete
        given = await asyncio.wait_for(asked, 5)
        assert not isinstance(given, StatusError), given
        # A GPU that no refresh brings is refused at once after that one: no new wait.
        refused = await _answer(rt.create_container(pod("x", annotations={"nvidia.com/gpus": "7"}), container()))
        assert isinstance(refused, StatusError) and "GPU 7 does not exist; this node has 4 GPUs" in refused.message
        assert "being taken again" not in refused.message

    try:
        asyncio.run(connected(plugin, body))
    finally:
        go.set()


def gpu_plugin_on(node: SimNode, cache: InventoryCache) -> GpuPlugin:
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    return GpuPlugin(config, cache, starter=_recording_starter([]))


def test_synchronize_answers_in_time_when_a_containers_view_check_hangs(
    node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    """A view check walks the container's root, which the container controls (a
    FUSE mount whose server never answers hangs the lookup). Synchronize must still
    be answered within the runtime's 2 s, or the plugin never registers; the
    containers checked by then are named, the rest said to be unchecked."""
    from nri_gpu.plugin._proto import nri_pb2 as api

    p = pod("train", "ml", annotations={"nvidia.com/gpus": "0"})
    running = [container(f"c{i}") for i in range(4)]
    for i, c in enumerate(running):
        c.state, c.pod_sandbox_id, c.pid = api.CONTAINER_RUNNING, p.id, 100 + i
        c.annotations["nri-gpu.io/gpus"] = node.gpus[0].uuid
    release = threading.Event()

    def view_check(pid: int) -> bool | None:
        if pid == 102:
            release.wait(30)  # hangs in the kernel, as far as the plugin can tell
        return pid != 101

    synced: list[bool] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        synced.append(True)

    # The fake runtime gives Synchronize its 2 s, as a real one does, and drops the
    # plugin (an error, and ``body`` never runs) when the answer comes later.
    try:
        with caplog.at_level("DEBUG", logger="nri_gpu.plugin.handlers"):
            rt = asyncio.run(
                connected(
                    gpu_plugin(node, lambda *a, **k: None, view_check=view_check), body, pods=[p], containers=running
                )
            )
    finally:
        release.set()
    assert rt.errors == [] and synced, "the runtime dropped the plugin"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any('container "c1" in pod "ml/train" runs half equipped' in m for m in warned), warned
    assert any("2 of 4 running GPU containers not checked for their start work: out of time" in m for m in warned)


def test_a_plan_from_before_the_plugin_registered_again_is_not_trusted(node: SimNode) -> None:
    """The runtime dropped the plugin after its CreateContainer was planned (the reply
    came late, the connection broke): containerd then creates the container without
    our adjustment. After the plugin registers again, its StartContainer must fail
    closed, as for any container created while nri-gpu was away, not start it with
    the plan kept from the old connection: no devices, no driver files. (Before: the
    kept plan was used, the start work done, and the container ran without its GPUs.)"""
    calls: list[StartWork] = []
    plugin = gpu_plugin(node, _recording_starter(calls))
    p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container("main")

    async def create(rt: FakeRuntime, stub: Stub) -> None:
        await rt.create_container(p, c)  # its adjustment never reaches the container

    asyncio.run(connected(plugin, create))
    c.pid = 99

    async def start(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError) as err:
            await rt.state_change(Event.START_CONTAINER, p, c)
        assert "was created while nri-gpu was not connected" in err.value.message

    asyncio.run(connected(plugin, start, pods=[p], containers=[c]))
    assert calls == [] and plugin._pending == {}


# -- the daemons' IPC endpoints, checked again at every CreateContainer ---------------------
#
# Discovery runs again only when the driver changes; a daemon's socket or the MPS folder
# comes and goes with its daemon. Once root's entry is gone any local account may put a
# link to / (or a folder of its own) in its place, and runc follows links in bind sources.

MPS, PERSISTENCED = "/tmp/nvidia-mps", "/run/nvidia-persistenced/socket"


@pytest.fixture
def ipc_node(tmp_path: Path) -> Iterator[SimNode]:
    """A one-GPU node with a sticky /tmp, root's MPS folder and a listening persistenced socket."""
    node = build_node(tmp_path / "node", gpus=1, driver_files=FIXTURE_DRIVER)
    root = node.driver_root
    (root / "tmp").mkdir(mode=0o755)
    os.chmod(root / "tmp", 0o1777)
    (root / "tmp/nvidia-mps").mkdir(mode=0o755)
    (root / "run/nvidia-persistenced").mkdir(mode=0o755, parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as daemon:
        daemon.bind(str(root / PERSISTENCED.lstrip("/")))
        daemon.listen(1)
        yield node


def _mps_plugin(node: SimNode, calls: list[StartWork]) -> GpuPlugin:
    config = dataclasses.replace(
        EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root)),
        mps=True,
    )
    inventory = InventoryCache(config, take=lambda c: discover(c, cuda_version=lambda p: ("12.4", None)))
    return GpuPlugin(config, inventory, starter=_recording_starter(calls))


def _create_and_start(plugin: GpuPlugin, change: Callable[[], None]) -> list[str]:
    """``change`` the node after discovery, then create and start a GPU container:
    the destinations of the IPC mounts CreateContainer gave it."""
    change()
    mounted: list[str] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container("main")
        reply = await rt.create_container(p, c)
        mounted.extend(m.destination for m in reply.adjust.mounts if m.destination in (MPS, PERSISTENCED))
        c.pid = 4242
        await rt.state_change(Event.START_CONTAINER, p, c)

    asyncio.run(connected(plugin, body))
    return mounted


def _link_to_root(root: Path) -> None:
    os.rmdir(root / "tmp/nvidia-mps")  # the MPS daemon quit, or a tmp cleaner took it
    os.symlink("/", root / "tmp/nvidia-mps")  # ln -s / /tmp/nvidia-mps by any local account


def _folder_of_uid_1000(root: Path) -> None:
    os.rmdir(root / "tmp/nvidia-mps")
    (root / "tmp/nvidia-mps").mkdir()
    os.chown(root / "tmp/nvidia-mps", 1000, 1000)


@pytest.mark.parametrize("replace", [_link_to_root, _folder_of_uid_1000], ids=["link-to-root", "folder-of-uid-1000"])
def test_an_ipc_endpoint_replaced_after_discovery_is_left_out_at_create_container(
    ipc_node: SimNode, replace: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    """(Before: the container got /tmp/nvidia-mps as discovery had seen it, and runc
    bound whatever was there at its start: the host's / through the link.)"""
    calls: list[StartWork] = []
    plugin = _mps_plugin(ipc_node, calls)
    assert MPS in {f.path for f in plugin._inventory.current().files}
    mounted = _create_and_start(plugin, lambda: replace(ipc_node.driver_root))
    assert mounted == [PERSISTENCED]
    assert [w.ipc for w in calls] == [(PERSISTENCED,)]
    assert any(f"IPC endpoint {MPS} skipped" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_an_ipc_endpoint_change_is_logged_once_not_at_every_container(
    ipc_node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    """The endpoints are walked at every GPU container's CreateContainer; a change is
    said once, and containers created after it add no line of their own."""
    plugin = _mps_plugin(ipc_node, [])
    _link_to_root(ipc_node.driver_root)

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        for name in ("a", "b", "c"):
            await rt.create_container(pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container(name))

    with caplog.at_level("INFO", logger="nri_gpu.plugin.handlers"):
        asyncio.run(connected(plugin, body))
    said = [r.getMessage() for r in caplog.records]
    assert sum(f"IPC endpoint {MPS} skipped" in m for m in said) == 1, said
    assert [m for m in said if m.startswith("host IPC mounts")] == [
        f"host IPC mounts for GPU containers from now on: {PERSISTENCED}"
    ]


def test_a_socket_removed_after_discovery_is_left_out_and_the_container_starts(ipc_node: SimNode) -> None:
    """A stopped persistenced takes its socket along. (Before: the plan still named it,
    and runc failed every GPU container on the missing bind source.)"""
    calls: list[StartWork] = []
    plugin = _mps_plugin(ipc_node, calls)
    mounted = _create_and_start(plugin, lambda: os.unlink(ipc_node.driver_root / PERSISTENCED.lstrip("/")))
    assert mounted == [MPS]
    assert [w.ipc for w in calls] == [(MPS,)]


def test_a_daemon_started_after_discovery_is_handed_out_and_checked_at_start(ipc_node: SimNode) -> None:
    """(Before: a daemon started after the plugin was never handed out.)"""
    socket_path = ipc_node.driver_root / PERSISTENCED.lstrip("/")
    os.unlink(socket_path)
    calls: list[StartWork] = []
    plugin = _mps_plugin(ipc_node, calls)
    assert PERSISTENCED not in {f.path for f in plugin._inventory.current().files}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as daemon:
        mounted = _create_and_start(plugin, lambda: daemon.bind(str(socket_path)))
    assert sorted(mounted) == [PERSISTENCED, MPS]
    assert [(w.ipc, w.ipc_root) for w in calls] == [((PERSISTENCED, MPS), str(ipc_node.driver_root))]


def test_a_container_planned_again_at_start_is_checked_for_the_endpoints_it_was_given(ipc_node: SimNode) -> None:
    """The plugin restarted between the container's creation and its start: the plan made
    again lists the endpoints as they are now, but the start must check the ones the
    container got. Here persistenced's socket was mounted and has gone since (the worker
    then refuses the start: nothing left to compare the mount with), and the MPS folder,
    there now, was never given. (Before: only the plan's endpoints were checked.)"""
    from nri_gpu.plugin._proto import nri_pb2 as api

    calls: list[StartWork] = []
    plugin = _mps_plugin(ipc_node, calls)
    os.unlink(ipc_node.driver_root / PERSISTENCED.lstrip("/"))

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("train", "ml", annotations={"nvidia.com/gpus": "0"}), container("main")
        c.pid = 77
        c.annotations["nri-gpu.io/gpus"] = ipc_node.gpus[0].uuid
        socket_source = str(ipc_node.driver_root) + PERSISTENCED
        c.mounts.append(api.Mount(destination=PERSISTENCED, source=socket_source, type="bind"))
        c.mounts.append(api.Mount(destination=MPS, source="/elsewhere/mps", type="bind"))  # not ours
        await rt.state_change(Event.START_CONTAINER, p, c)

    asyncio.run(connected(plugin, body))
    assert [w.ipc for w in calls] == [(PERSISTENCED,)]
