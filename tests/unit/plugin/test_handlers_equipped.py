"""Containers that arrive with GPUs already (CDI, device specs), through the stub and
the fake runtime: the CDI names field of containerd >= 2.3 (not packaged here) is
tested here; the annotation and device forms on real containerd in
tests/e2e/test_equipped_containers.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nri_gpu.engine.config import EngineConfig, Policy
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.engine.start.work import StartWork
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.events import Event
from nri_gpu.plugin.handlers import GpuPlugin
from nri_gpu.plugin.stub import Stub
from nri_gpu.plugin.ttrpc import StatusError
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from tests.fake_runtime import FakeRuntime, connected, container, pod

LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=4, driver_files=FIXTURE_DRIVER)


def plugin(node: SimNode, calls: list[StartWork], mode: str = "stand-aside") -> GpuPlugin:
    config = EngineConfig(
        driver_root=str(node.driver_root),
        dev_root=str(node.dev_root),
        proc_root=str(node.proc_root),
        policy=Policy(equipped_containers=mode),
    )
    inventory = InventoryCache(config, take=lambda c: discover(c, cuda_version=lambda p: ("12.4", None)))

    async def starter(pid: int, work: StartWork, **kw: Any) -> None:
        calls.append(work)

    return GpuPlugin(config, inventory, starter=starter)


def equipped_by_cdi(node: SimNode, index: int, env: list[str] = (), *, names: bool = True) -> api.Container:
    """What containerd >= 2.3 hands NRI after applying ``nvidia.com/gpu=<index>``:
    the CDI name, the device node, the driver files, NVIDIA_VISIBLE_DEVICES=void."""
    c = container("main", env=["NVIDIA_VISIBLE_DEVICES=void", *env])
    c.linux.devices.add(path=f"/dev/nvidia{node.gpus[index].minor}", type="c", major=195, minor=node.gpus[index].minor)
    c.mounts.add(destination=LIBCUDA, source=str(node.driver_root) + LIBCUDA, type="bind")
    if names:
        c.CDI_devices.add(name=f"nvidia.com/gpu={index}")
    return c


def test_a_cdi_equipped_container_is_left_alone_by_default(node: SimNode) -> None:
    calls: list[StartWork] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        c = equipped_by_cdi(node, 1)
        p = pod("dra", "ml", annotations={"nvidia.com/gpus": "1"})  # the same GPU: no conflict
        reply = await rt.create_container(p, c)
        assert not reply.adjust.linux.devices and not reply.adjust.mounts and not reply.adjust.annotations
        c.pid = 10
        await rt.state_change(Event.START_CONTAINER, p, c)

    asyncio.run(connected(plugin(node, calls), body))
    assert calls == []


@pytest.mark.parametrize("names", [True, False], ids=["cdi-names", "mounted-driver-files"])
def test_a_request_for_other_gpus_than_cdi_gave_is_refused_naming_both(node: SimNode, names: bool) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        for asked in ({"nvidia.com/gpus": "0"}, {"nvidia.com/gpus": "1,2"}):
            with pytest.raises(StatusError) as err:
                await rt.create_container(pod("p", "ml", annotations=asked), equipped_by_cdi(node, 1, names=names))
            message = err.value.message
            assert "it already has GPU 1" in message and "nvidia.com/gpus" in message, message
            assert "never adds a second, different set" in message
        # The env asks too (an nvidia/cuda image's "all" where env requests are accepted).
        c = equipped_by_cdi(node, 1, names=names)
        del c.env[:]
        c.env.append("NVIDIA_VISIBLE_DEVICES=all")
        with pytest.raises(StatusError, match="asks for GPU 0, GPU 1, GPU 2, GPU 3"):
            await rt.create_container(pod("p", "ml"), c)

    asyncio.run(connected(plugin(node, []), body))


def test_complete_adds_only_the_view_and_the_cache_entries(node: SimNode) -> None:
    calls: list[StartWork] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = pod("dra", "ml"), equipped_by_cdi(node, 2)  # no request of ours at all
        reply = await rt.create_container(p, c)
        assert not reply.adjust.linux.devices and not reply.adjust.mounts and not reply.adjust.env
        assert reply.adjust.annotations["nri-gpu.io/gpus"] == node.gpus[2].uuid
        c.pid = 11
        c.annotations.update(reply.adjust.annotations)
        await rt.state_change(Event.START_CONTAINER, p, c)

    asyncio.run(connected(plugin(node, calls, "complete"), body))
    (work,) = calls
    assert work.visible_bus_ids == (node.gpus[2].bus_id,)
    assert [s.path.rsplit("/", 1)[1] for s in work.symlinks] == ["libcuda.so", "libcuda.so.1"]
    assert {e.name for e in work.ld_cache_entries} == {"libcuda.so.1", "libcuda.so"}


def test_device_specs_alone_are_served_as_usual_but_never_widened(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        def with_specs() -> api.Container:
            c = container("main")
            g = node.gpus[3]
            c.linux.devices.add(path=f"/dev/nvidia{g.minor}", type="c", major=195, minor=g.minor)
            return c

        reply = await rt.create_container(pod("p", "ml", annotations={"nvidia.com/gpus": "3"}), with_specs())
        assert reply.adjust.mounts  # the driver files are ours to give
        assert not [d for d in reply.adjust.linux.devices if d.path == f"/dev/nvidia{node.gpus[3].minor}"]
        with pytest.raises(StatusError, match=r"it already has GPU 3 \(device nodes already in its spec\)"):
            await rt.create_container(pod("q", "ml", annotations={"nvidia.com/gpus": "0"}), with_specs())

    asyncio.run(connected(plugin(node, []), body))


def test_beside_nvidias_nri_plugin_an_env_request_is_ignored_and_an_annotation_refused(node: SimNode) -> None:
    theirs = {"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=0"}

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        reply = await rt.create_container(
            pod("p", "ml", annotations=theirs), container("main", env=["NVIDIA_VISIBLE_DEVICES=all"])
        )
        assert not reply.adjust.linux.devices and not reply.adjust.mounts
        with pytest.raises(StatusError, match=r"NVIDIA.s NRI plugin .* two producers"):
            await rt.create_container(pod("q", "ml", annotations={**theirs, "nvidia.com/gpus": "0"}), container("main"))

    asyncio.run(connected(plugin(node, []), body))


def test_a_privileged_container_is_served_as_usual(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        c = container("main")
        c.linux.devices.add(path="/dev/mem", type="c", major=1, minor=1)
        for g in node.gpus:
            c.linux.devices.add(path=f"/dev/nvidia{g.minor}", type="c", major=195, minor=g.minor)
        reply = await rt.create_container(pod("p", "ml", annotations={"nvidia.com/gpus": "0"}), c)
        assert reply.adjust.mounts and reply.adjust.annotations["nri-gpu.io/gpus"] == node.gpus[0].uuid

    asyncio.run(connected(plugin(node, []), body))


def test_a_container_of_ours_planned_again_at_start_is_not_taken_for_another_producers(node: SimNode) -> None:
    """After a restart of the plugin, StartContainer plans a container again: it then
    carries our own CreateContainer's devices, driver mounts and annotation, which must
    not read as a CDI producer's (found by tests/e2e/test_faults.py: such a container
    started without its procfs view and ld.so cache)."""
    calls: list[StartWork] = []

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p = pod("train", "ml", annotations={"nvidia.com/gpus": "1"})
        c = container("main")
        g = node.gpus[1]
        c.linux.devices.add(path=f"/dev/nvidia{g.minor}", type="c", major=195, minor=g.minor)
        c.mounts.add(destination=LIBCUDA, source=str(node.driver_root) + LIBCUDA, type="bind")
        c.annotations["nri-gpu.io/gpus"] = g.uuid
        c.pid = 12
        await rt.state_change(Event.START_CONTAINER, p, c)  # no CreateContainer in this process

    asyncio.run(connected(plugin(node, calls), body))
    (work,) = calls
    assert work.visible_bus_ids == (node.gpus[1].bus_id,)
