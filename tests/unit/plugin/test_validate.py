"""GpuPlugin as an NRI validator (ValidateContainerAdjustment, event 14): through
the stub and the fake runtime, which runs a creation as the adaptation does
(CreateContainer, then the validators with the merged adjustment). The runtimes
that offer validation (containerd >= 2.2, CRI-O >= 1.34) are not packaged here;
the fake runtime stands in for their protocol."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nri_gpu.plugin import handlers
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.adjustment import GPUS_ANNOTATION
from nri_gpu.plugin.events import Event
from nri_gpu.plugin.stub import Stub
from testbed.gpunode import FIXTURE_DRIVER, SimNode, build_node
from tests.fake_runtime import FakeRuntime, connected, container, pod
from tests.unit.plugin.support import gpu_plugin


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=2, driver_files=FIXTURE_DRIVER)


async def _starter(*args: Any, **kw: Any) -> None:
    pass


def _gpu_pod() -> api.PodSandbox:
    return pod("train", "ml", annotations={"nvidia.com/gpus": "1"})


@pytest.mark.parametrize(
    ("runtime", "version", "nri"),
    [
        pytest.param("containerd", "1.7.24~ds1", "", id="containerd-1.7"),
        pytest.param("containerd", "v2.1.4", "", id="containerd-2.1"),
        pytest.param("cri-o", "1.33.2", "", id="cri-o-1.33"),
        pytest.param("somert", "9.9.9", "", id="unknown-runtime"),
    ],
)
def test_an_older_runtime_is_not_asked_for_validation_and_configure_succeeds(
    node: SimNode, runtime: str, version: str, nri: str
) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        assert stub.wanted_events & Event.VALIDATE_CONTAINER_ADJUSTMENT.bit
        assert rt.events is not None and not rt.validates
        reply, verdict = await rt.create_and_validate(_gpu_pod(), container("main"))
        assert reply is not None and reply.adjust.annotations[GPUS_ANNOTATION] == node.gpus[1].uuid
        assert verdict is None

    rt = asyncio.run(connected(gpu_plugin(node, _starter), body, runtime_name=runtime, runtime_version=version))
    assert rt.errors == []  # the runtime accepted our event mask


@pytest.mark.parametrize(
    ("runtime", "version", "nri"),
    [
        pytest.param("containerd", "2.2.0", "", id="containerd-2.2"),
        pytest.param("containerd", "2.3.0", "v0.12.0", id="containerd-2.3-nri-version"),
        pytest.param("cri-o", "1.34.0", "", id="cri-o-1.34"),
        pytest.param("somert", "", "0.10.0", id="unknown-runtime-nri-0.10"),
    ],
)
def test_a_runtime_with_validation_gets_event_14(node: SimNode, runtime: str, version: str, nri: str) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        assert rt.validates

    rt = asyncio.run(
        connected(gpu_plugin(node, _starter), body, runtime_name=runtime, runtime_version=version, nri_version=nri)
    )
    assert rt.errors == []


def _on_2_2(node: SimNode, body: Any) -> None:
    asyncio.run(connected(gpu_plugin(node, _starter), body, runtime_version="2.2.0"))


def test_a_gpu_container_with_our_adjustment_is_allowed(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        reply, verdict = await rt.create_and_validate(_gpu_pod(), container("main"))
        assert reply is not None and reply.adjust.linux.devices
        assert verdict is not None and not verdict.reject, verdict.reason

    _on_2_2(node, body)


def test_a_gpu_container_whose_create_reply_was_lost_is_refused(node: SimNode) -> None:
    """Our CreateContainer timed out: the runtime still counts us present
    (required_plugins passes) and would create the container without GPUs."""

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        _, verdict = await rt.create_and_validate(_gpu_pod(), container("main"), reply_lost=True)
        assert verdict is not None and verdict.reject
        assert "nri-gpu: ValidateContainerAdjustment of container" in verdict.reason
        assert f"{GPUS_ANNOTATION} is missing, nri-gpu answered '{node.gpus[1].uuid}'" in verdict.reason
        assert "did not reach the runtime in time" in verdict.reason

    _on_2_2(node, body)


def test_a_gpu_container_we_were_not_asked_about_is_refused(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        verdict = await rt.validate(_gpu_pod(), container("main"), api.ContainerAdjustment())
        assert verdict.reject and "nri-gpu was not asked for its CreateContainer" in verdict.reason

    _on_2_2(node, body)


def test_the_annotation_on_the_pristine_container_does_not_count(node: SimNode) -> None:
    """Only plugins' edits are in the adjustment: a container that came with our
    annotation (crictl can set one) is not taken for one we equipped."""

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        c = container("main")
        c.annotations[GPUS_ANNOTATION] = "1"
        _, verdict = await rt.create_and_validate(_gpu_pod(), c, reply_lost=True)
        assert verdict is not None and verdict.reject

    _on_2_2(node, body)


def test_another_value_of_our_annotation_is_refused(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = _gpu_pod(), container("main")
        await rt.create_container(p, c)
        forged = api.ContainerAdjustment(annotations={GPUS_ANNOTATION: "0,1"})
        verdict = await rt.validate(p, c, forged)
        assert verdict.reject and f"is '0,1', nri-gpu answered '{node.gpus[1].uuid}'" in verdict.reason
        assert "another plugin changed it" in verdict.reason

    _on_2_2(node, body)


def test_a_container_asking_for_nothing_is_allowed(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        _, verdict = await rt.create_and_validate(pod("web"), container("nginx", env=["PATH=/bin"]))
        assert verdict is not None and not verdict.reject
        # Not answered at all (the runtime never asked us): allowed all the same.
        verdict = await rt.validate(pod("web"), container("other"))
        assert not verdict.reject

    _on_2_2(node, body)


def test_an_answer_of_nothing_to_add_is_allowed(node: SimNode) -> None:
    """A container that may ask (the env is there) but asks for no GPU: we added
    nothing, and that is the answer the runtime applies."""

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        c = container("main", env=["NVIDIA_VISIBLE_DEVICES=void"])
        reply, verdict = await rt.create_and_validate(pod("web"), c)
        assert reply is not None and not reply.HasField("adjust")
        assert verdict is not None and not verdict.reject, verdict.reason

    _on_2_2(node, body)


def test_each_answer_serves_one_validation(node: SimNode) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = _gpu_pod(), container("main")
        reply, verdict = await rt.create_and_validate(p, c)
        assert verdict is not None and not verdict.reject and reply is not None
        again = await rt.validate(p, c, reply.adjust)
        assert again.reject

    _on_2_2(node, body)


def test_removing_a_container_forgets_its_answer(node: SimNode) -> None:
    plugin = gpu_plugin(node, _starter)

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        p, c = _gpu_pod(), container("main")
        await rt.create_container(p, c)
        assert c.id in plugin._answered
        await rt.state_change(Event.REMOVE_CONTAINER, p, c)
        assert c.id not in plugin._answered

    asyncio.run(connected(plugin, body, runtime_version="2.2.0"))


def test_answers_waiting_for_validation_are_bounded(node: SimNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "_ANSWERED_MAX", 3)
    plugin = gpu_plugin(node, _starter)

    async def main() -> None:
        for n in range(5):
            await plugin.create_container(_gpu_pod(), container(f"c{n}"))

    asyncio.run(main())
    assert [key.split("-")[0] for key in plugin._answered] == ["c2", "c3", "c4"]


def test_validating_a_container_asking_for_nothing_is_cheap(node: SimNode) -> None:
    """Every container of the node is validated under the runtime's deadline; one
    that asks for nothing costs the pre-filter only (no I/O, no inventory)."""
    plugin = gpu_plugin(node, _starter)
    env = [f"VAR{n}=value" for n in range(200)]
    req = api.ValidateContainerAdjustmentRequest(pod=pod("web"), container=container("nginx", env=env))

    class NoInventory:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the inventory was asked for {name}")

    plugin._inventory = NoInventory()  # type: ignore[assignment]

    async def main() -> None:
        for _ in range(3):
            await plugin.validate_container_adjustment(req)

    asyncio.run(main())  # what it costs: a benchmark's
    assert plugin._answered == {}


def test_an_older_runtime_without_validation_is_logged_as_info(node: SimNode, caplog: pytest.LogCaptureFixture) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        pass

    with caplog.at_level("INFO", logger="nri_gpu.plugin.stub"):
        asyncio.run(connected(gpu_plugin(node, _starter), body, runtime_version="1.7.24~ds1"))
    [line] = [r for r in caplog.records if "does not offer events" in r.getMessage()]
    assert line.levelname == "INFO"
    assert "VALIDATE_CONTAINER_ADJUSTMENT" in line.getMessage() and "containerd < 2.2" in line.getMessage()
