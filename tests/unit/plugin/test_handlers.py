"""GpuPlugin through the stub and the fake runtime, on a simulated node; the
namespace work itself is replaced by a recorder (it is tested against runc)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.errors import StartError
from engine.start.work import StartWork
from plugin.events import Event
from plugin.stub import Stub
from plugin.ttrpc import StatusError
from tests.fake_runtime import FakeRuntime, connected, container, pod
from tests.testbed.gpunode import SimNode, build_node
from tests.unit.plugin.support import gpu_plugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=4)


def test_start_gets_the_pid_and_the_planned_work(node: SimNode) -> None:
    calls: list[tuple[int, StartWork, str]] = []

    async def starter(pid: int, work: StartWork, *, ldconfig: str, on_report: Any) -> None:
        calls.append((pid, work, ldconfig))

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
    from plugin._proto import nri_pb2 as api

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

    with caplog.at_level("WARNING", logger="plugin.handlers"):
        asyncio.run(
            connected(
                gpu_plugin(node, lambda *a, **k: None, view_check=view_check),
                body,
                pods=[p, web],
                containers=[missed, equipped, plain, waiting, half, whole, gone, nothing],
            )
        )
    warned = [r.getMessage() for r in caplog.records if r.name == "plugin.handlers"]
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
