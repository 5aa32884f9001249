"""The plugin stub against the in-process fake runtime: handshake, dispatch, errors, reconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.plugin import budget
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.budget import REPLY_MARGIN, Timeouts
from nri_gpu.plugin.config import PluginConfig
from nri_gpu.plugin.errors import PluginError, RegistrationError
from nri_gpu.plugin.events import Event
from nri_gpu.plugin.stub import PLUGIN_SERVICE, Stub
from nri_gpu.plugin.ttrpc import Code, StatusError
from tests.fake_runtime import FakeRuntime, connected, container, listening, pod


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


class Recorder:
    """A plugin that records every call; create_container answers with an env var."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.synced: list[tuple[int, int]] = []
        self.shutdowns = 0

    async def create_container(self, p: api.PodSandbox, c: api.Container) -> api.ContainerAdjustment:
        self.calls.append(("create_container", (p.name, c.name)))
        if c.name == "boom":
            raise ValueError("kaboom")
        if c.name == "forge":
            raise ValueError("x\nnri-gpu: forged line " + "y" * 100_000)
        if c.name == "refused":
            raise PluginError("GPU 7 does not exist on this node")
        return api.ContainerAdjustment(env=[api.KeyValue(key="SEEN", value=p.annotations.get("x", ""))])

    async def start_container(self, p: api.PodSandbox, c: api.Container) -> None:
        self.calls.append(("start_container", (p.name, c.name)))

    async def remove_pod_sandbox(self, p: api.PodSandbox) -> None:
        self.calls.append(("remove_pod_sandbox", (p.name,)))

    async def synchronize(self, pods: list[api.PodSandbox], containers: list[api.Container]) -> None:
        self.synced.append((len(pods), len(containers)))

    async def shutdown(self) -> None:
        self.shutdowns += 1


def test_mask_is_derived_from_the_handler_methods() -> None:
    stub = Stub(Recorder(), PluginConfig())
    assert stub.wanted_events == Event.CREATE_CONTAINER.bit | Event.START_CONTAINER.bit | Event.REMOVE_POD_SANDBOX.bit


def test_registers_with_name_and_index_and_subscribes() -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        assert stub.registered
        assert stub.runtime is not None and stub.runtime.version == "1.7.24~ds1"

    rt = run(connected(Recorder(), body))
    assert [(r.plugin_name, r.plugin_idx) for r in rt.registrations] == [("nri-gpu", "10")]
    assert rt.events == 0x008 | 0x020 | 0x004
    assert rt.errors == []


class PodUpdater:
    async def update_pod_sandbox(self, p: api.PodSandbox, overhead: Any, resources: Any) -> None:
        pass

    async def create_container(self, p: api.PodSandbox, c: api.Container) -> None:
        pass


@pytest.mark.parametrize(
    ("runtime", "version", "nri", "expected"),
    [
        ("containerd", "1.7.24~ds1", "", 0x008),
        ("containerd", "v2.1.9", "", 0x008),
        ("containerd", "2.3.0", "v0.12.0", 0x808),
        ("cri-o", "1.33.2", "", 0x808),
    ],
    ids=["containerd-1.7", "containerd-2.1", "nri-0.12", "crio-1.33"],
)
def test_events_the_runtime_does_not_know_are_not_subscribed(
    runtime: str, version: str, nri: str, expected: int
) -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        pass

    rt = run(connected(PodUpdater(), body, runtime_name=runtime, runtime_version=version, nri_version=nri))
    assert rt.errors == []  # a mask beyond the valid set would have been refused
    assert rt.events == expected


def test_create_container_adjustment_reaches_the_runtime() -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        reply = await rt.create_container(pod(annotations={"x": "42"}), container())
        assert [(kv.key, kv.value) for kv in reply.adjust.env] == [("SEEN", "42")]

    run(connected(Recorder(), body))


def test_handler_exception_becomes_a_status_naming_container_and_cause_and_connection_survives() -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError) as err:
            await rt.create_container(pod("p1", "team-a"), container("boom"))
        assert err.value.code == Code.UNKNOWN
        msg = err.value.message
        assert 'container "boom"' in msg and 'pod "team-a/p1"' in msg
        assert "ValueError: kaboom" in msg and msg.startswith("nri-gpu: CreateContainer")
        # The next request on the same connection still works.
        reply = await rt.create_container(pod(), container("ok"))
        assert reply.adjust.env[0].key == "SEEN"

    run(connected(Recorder(), body))


def test_an_internal_error_cannot_forge_lines_or_flood_the_cri_error() -> None:
    """Any exception's text (and the pod and container names) may carry container
    input: the status is one printable line of bounded size, like a refusal's."""

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError) as err:
            await rt.create_container(pod("p\x1b[2J", "team-a"), container("forge"))
        msg = err.value.message
        assert "\n" not in msg and "\x1b" not in msg
        assert "ValueError: x\\nnri-gpu: forged line" in msg
        assert len(msg) <= 4096

    run(connected(Recorder(), body))


def test_plugin_error_message_goes_through_unchanged() -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        with pytest.raises(StatusError) as err:
            await rt.create_container(pod(), container("refused"))
        assert err.value.message.endswith(": GPU 7 does not exist on this node")
        assert "PluginError" not in err.value.message

    run(connected(Recorder(), body))


def test_state_change_and_v012_dedicated_rpcs_reach_the_same_handler() -> None:
    plugin = Recorder()

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        await rt.state_change(Event.START_CONTAINER, pod("a"), container("c1"))
        await rt.call(
            "StartContainer",
            api.StartContainerRequest(pod=pod("b"), container=container("c2")),
            api.StartContainerResponse,
        )
        await rt.state_change(Event.REMOVE_POD_SANDBOX, pod("a"))
        await rt.call("RemovePodSandbox", api.RemovePodSandboxRequest(pod=pod("b")), api.RemovePodSandboxResponse)
        # Events the plugin has no handler for are answered empty, not refused.
        await rt.state_change(Event.POST_START_CONTAINER, pod("a"), container("c1"))
        await rt.call(
            "PostStartContainer",
            api.PostStartContainerRequest(pod=pod(), container=container()),
            api.PostStartContainerResponse,
        )
        # An event number from the future is ignored.
        await rt.state_change(99, pod("a"))

    run(connected(plugin, body))
    assert plugin.calls == [
        ("start_container", ("a", "c1")),
        ("start_container", ("b", "c2")),
        ("remove_pod_sandbox", ("a",)),
        ("remove_pod_sandbox", ("b",)),
    ]


def test_unknown_method_and_service_are_unimplemented() -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        assert rt.conn is not None
        with pytest.raises(StatusError) as err:
            await rt.conn.call("nri.pkg.api.v1alpha1.Plugin", "FutureMethod", b"")
        assert (err.value.code, err.value.message) == (Code.UNIMPLEMENTED, "method FutureMethod")
        with pytest.raises(StatusError) as err:
            await rt.conn.call("some.Other", "Configure", b"")
        assert (err.value.code, err.value.message) == (Code.UNIMPLEMENTED, "service some.Other")
        with pytest.raises(StatusError) as err:
            await rt.conn.call("nri.pkg.api.v1alpha1.Plugin", "CreateContainer", b"\xff\xff\xff")
        assert err.value.code == Code.INVALID_ARGUMENT

    run(connected(Recorder(), body))


def test_split_synchronize_is_accumulated_and_answered_more() -> None:
    plugin = Recorder()
    pods = [pod(f"p{i}") for i in range(3)]
    ctrs = [container(f"c{i}", pod_id=f"p{i}-id") for i in range(4)]

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        pass

    rt = run(connected(plugin, body, pods=pods, containers=ctrs, sync_chunk=2))
    assert [r.more for r in rt.sync_replies] == [True, True, True, False]
    assert plugin.synced == [(3, 4)]
    assert rt.errors == []


def test_update_containers_reaches_the_runtime() -> None:
    async def body(rt: FakeRuntime, stub: Stub) -> None:
        failed = await stub.update_containers([api.ContainerUpdate(container_id="abc")])
        assert failed == []

    rt = run(connected(Recorder(), body))
    assert [u.container_id for r in rt.updates for u in r.update] == ["abc"]


def test_stop_returns_from_run_and_calls_shutdown_once() -> None:
    plugin = Recorder()

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        pass

    run(connected(plugin, body))
    assert plugin.shutdowns == 1


def test_preconnected_plugin_returns_when_the_runtime_closes() -> None:
    async def main() -> None:
        runtime = FakeRuntime()
        stub = Stub(Recorder(), PluginConfig(), preconnected=await runtime.socketpair())
        task = asyncio.ensure_future(stub.run())
        await runtime.wait_ready()
        await runtime.drop()
        await asyncio.wait_for(task, 5)  # returns by itself: it cannot redial

    run(main())


def test_refused_registration_is_fatal_and_names_the_cause() -> None:
    async def main() -> None:
        runtime = FakeRuntime(refuse_registration="invalid plugin index: '1'")
        stub = Stub(Recorder(), PluginConfig(), preconnected=await runtime.socketpair())
        with pytest.raises(RegistrationError, match="invalid plugin index"):
            await asyncio.wait_for(stub.run(), 5)
        await runtime.shutdown()

    run(main())


def test_reconnects_and_registers_again_after_a_runtime_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "nri.sock")
    plugin = Recorder()

    async def main() -> None:
        stub = Stub(plugin, PluginConfig(socket=path, reconnect_min=0.01, reconnect_max=0.05))
        backing_off = asyncio.Event()
        sleep = stub._sleep

        async def counted(seconds: float) -> None:
            backing_off.set()
            await sleep(seconds)

        stub._sleep = counted  # type: ignore[method-assign]
        task = asyncio.ensure_future(stub.run())  # the runtime is not up yet: it waits
        await asyncio.wait_for(backing_off.wait(), 5)  # it found no socket and backs off
        async with listening(path) as rt:
            await rt.wait_ready()
            for restart in range(3):
                await rt.restart(path)
                await rt.wait_ready()
                reply = await rt.create_container(pod(annotations={"x": str(restart)}), container())
                assert reply.adjust.env[0].value == str(restart)
        assert len(rt.registrations) == 4
        assert stub.registrations == 4
        stub.stop()
        await asyncio.wait_for(task, 5)

    run(main())


def test_a_non_async_handler_is_refused_at_construction() -> None:
    class Bad:
        def create_container(self, p: Any, c: Any) -> None:
            pass

    with pytest.raises(TypeError, match=r"Bad\.create_container must be an async method"):
        Stub(Bad(), PluginConfig())


def test_validate_handler_rejection_is_a_reject_reply() -> None:
    class Validator:
        async def validate_container_adjustment(self, req: api.ValidateContainerAdjustmentRequest) -> None:
            raise PluginError("no hooks allowed")

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        reply = await rt.call(
            "ValidateContainerAdjustment",
            api.ValidateContainerAdjustmentRequest(pod=pod(), container=container()),
            api.ValidateContainerAdjustmentResponse,
        )
        assert reply.reject and reply.reason.endswith("no hooks allowed")

    run(connected(Validator(), body, runtime_version="2.2.1"))


# -- budgets (docs/budgets.md) ------------------------------------------------------------


class BudgetProbe:
    """Records what each CreateContainer may still take (``plugin.budget.left``)."""

    def __init__(self) -> None:
        self.left: list[float] = []

    async def create_container(self, p: api.PodSandbox, c: api.Container) -> None:
        self.left.append(budget.left())


def test_handlers_get_the_requests_deadline_else_the_configured_request_timeout() -> None:
    probe = BudgetProbe()
    request = api.CreateContainerRequest(pod=pod(), container=container()).SerializeToString()

    async def body(rt: FakeRuntime, stub: Stub) -> None:
        assert stub.timeouts == Timeouts(registration=5.0, request=2.0)  # what the fake runtime sends
        configure = api.ConfigureRequest(
            runtime_name="containerd", runtime_version="1.7.24~ds1", registration_timeout=9000, request_timeout=4500
        )
        await rt.call("Configure", configure, api.ConfigureResponse)
        assert stub.timeouts == Timeouts(registration=9.0, request=4.5)
        assert rt.conn is not None
        await rt.conn.call(PLUGIN_SERVICE, "CreateContainer", request, timeout=1.0)  # sent as the deadline
        await rt.conn.call(PLUGIN_SERVICE, "CreateContainer", request, timeout=10, send_timeout=False)  # none sent

    run(connected(probe, body))
    with_deadline, without = probe.left
    assert 1.0 - REPLY_MARGIN - 0.2 < with_deadline <= 1.0 - REPLY_MARGIN
    assert 4.5 - REPLY_MARGIN - 0.2 < without <= 4.5 - REPLY_MARGIN


def test_a_runtime_without_timeouts_in_configure_gets_nris_defaults() -> None:
    assert Timeouts.from_configure(0, 0) == Timeouts(registration=5.0, request=2.0)
    assert Timeouts.from_configure(-1, 1) == Timeouts(registration=5.0, request=0.1)  # clamped: a unit mistake
