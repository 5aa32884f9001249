"""An in-process NRI runtime for fast handler tests.

It is the far end of the trunk, built from the same ttrpc layer with the roles
mirrored (it serves the Runtime service on conn 2 and calls the Plugin service on
conn 1), and it behaves like containerd's adaptation where tests depend on it:
Configure is sent as soon as RegisterPlugin arrives (before its reply), an event
mask beyond the runtime's valid set is refused, a split Synchronize is checked
for ``more=true`` answers, and a restart is a closed trunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.message import Message

from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.config import PluginConfig
from nri_gpu.plugin.events import Event, valid_events
from nri_gpu.plugin.metrics import PluginMetrics
from nri_gpu.plugin.stub import Stub
from nri_gpu.plugin.ttrpc import Code, InboundRequest, MuxConnection, StatusError

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
M = TypeVar("M", bound=Message)


@dataclass
class FakeRuntime:
    runtime_name: str = "containerd"
    runtime_version: str = "1.7.24~ds1"
    nri_version: str = ""
    config: str = ""
    pods: Sequence[api.PodSandbox] = ()
    containers: Sequence[api.Container] = ()
    # Send Synchronize in chunks of this many pods+containers (NRI v0.7+ split sync).
    sync_chunk: int | None = None
    # Answer RegisterPlugin with this error instead of accepting it.
    refuse_registration: str | None = None
    registrations: list[api.RegisterPluginRequest] = field(default_factory=list)
    events: int | None = None
    sync_replies: list[api.SynchronizeResponse] = field(default_factory=list)
    updates: list[api.UpdateContainersRequest] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    conn: MuxConnection | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.AbstractServer | None = None
    _handshake: asyncio.Future[None] | None = None

    # -- connecting ------------------------------------------------------------

    async def socketpair(self) -> socket.socket:
        """Serve one end of a socketpair; return the other end for the plugin."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        await self._adopt(await MuxConnection.from_socket(ours, **self._conn_args()))
        return theirs

    async def listen(self, path: str) -> None:
        """Listen on a unix socket as a runtime does; one plugin connection at a time."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._adopt(MuxConnection(reader, writer, **self._conn_args()))

        self._server = await asyncio.start_unix_server(accept, path)

    async def restart(self, path: str) -> None:
        """What a runtime restart looks like to a plugin: trunk closed, socket gone, socket back."""
        await self.shutdown()
        await self.listen(path)

    async def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        await self.drop()

    async def drop(self) -> None:
        self._ready.clear()
        if self.conn is not None:
            await self.conn.close()
            self.conn = None

    async def wait_ready(self, timeout: float = 5.0) -> None:
        """Until a plugin has registered, been configured and synchronized."""
        await asyncio.wait_for(self._ready.wait(), timeout)

    def _conn_args(self) -> dict[str, Any]:
        return {"serve_conn": 2, "call_conn": 1, "handler": self._serve, "name": "fake-runtime"}

    async def _adopt(self, conn: MuxConnection) -> None:
        if self.conn is not None:
            await self.conn.close()
        self.conn = conn
        self._ready.clear()
        conn.start()

    # -- the Runtime service ---------------------------------------------------

    async def _serve(self, request: InboundRequest) -> bytes:
        if request.service != RUNTIME:
            raise StatusError(Code.UNIMPLEMENTED, f"service {request.service}")
        if request.method == "RegisterPlugin":
            reg = api.RegisterPluginRequest.FromString(request.payload)
            self.registrations.append(reg)
            if self.refuse_registration:
                raise StatusError(Code.UNKNOWN, self.refuse_registration)
            # Like the adaptation: registration is signalled before the reply goes
            # out, so Configure may overtake it.
            self._handshake = asyncio.ensure_future(self._configure_and_sync())
            return b""
        if request.method == "UpdateContainers":
            self.updates.append(api.UpdateContainersRequest.FromString(request.payload))
            return api.UpdateContainersResponse().SerializeToString()
        raise StatusError(Code.UNIMPLEMENTED, f"method {request.method}")

    async def _configure_and_sync(self) -> None:
        try:
            reply = await self.call(
                "Configure",
                api.ConfigureRequest(
                    config=self.config,
                    runtime_name=self.runtime_name,
                    runtime_version=self.runtime_version,
                    registration_timeout=5000,
                    request_timeout=2000,
                    NRI_version=self.nri_version,
                ),
                api.ConfigureResponse,
            )
            valid = valid_events(self.runtime_name, self.runtime_version, self.nri_version)
            if reply.events & ~valid:
                raise RuntimeError(f"invalid plugin events: 0x{reply.events:x}")
            self.events = reply.events
            await self._synchronize()
            self._ready.set()
        except Exception as exc:  # the real runtime logs and closes the plugin
            self.errors.append(str(exc))
            await self.drop()

    async def _synchronize(self) -> None:
        items: list[tuple[str, Message]] = [("pods", p) for p in self.pods] + [
            ("containers", c) for c in self.containers
        ]
        size = self.sync_chunk or max(len(items), 1)
        chunks = [items[i : i + size] for i in range(0, len(items), size)] or [[]]
        for n, chunk in enumerate(chunks):
            more = n < len(chunks) - 1
            req = api.SynchronizeRequest(more=more)
            for kind, item in chunk:
                getattr(req, kind).append(item)
            reply = await self.call("Synchronize", req, api.SynchronizeResponse)
            self.sync_replies.append(reply)
            if more and (not reply.more or len(reply.update)):
                raise RuntimeError("plugin does not handle split sync requests")

    # -- calling the plugin ------------------------------------------------------

    async def call(self, method: str, request: Message, reply_type: type[M], timeout: float = 2.0) -> M:
        assert self.conn is not None, "no plugin connected"
        raw = await self.conn.call(PLUGIN, method, request.SerializeToString(), timeout=timeout)
        return reply_type.FromString(raw)

    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> api.CreateContainerResponse:
        req = api.CreateContainerRequest(pod=pod, container=container)
        return await self.call("CreateContainer", req, api.CreateContainerResponse)

    @property
    def validates(self) -> bool:
        """Whether the plugin subscribed to ValidateContainerAdjustment (event 14)."""
        return self.events is not None and bool(self.events & Event.VALIDATE_CONTAINER_ADJUSTMENT.bit)

    async def validate(
        self,
        pod: api.PodSandbox,
        container: api.Container,
        adjust: api.ContainerAdjustment | None = None,
    ) -> api.ValidateContainerAdjustmentResponse:
        """ValidateContainerAdjustment as the adaptation sends it: the pristine
        container, the merged adjustment, who owns each annotation it sets
        (``<idx>-<name>`` of the registered plugin) and the plugins that ran."""
        reg = self.registrations[-1] if self.registrations else api.RegisterPluginRequest()
        owner = f"{reg.plugin_idx}-{reg.plugin_name}"
        req = api.ValidateContainerAdjustmentRequest(pod=pod, container=container)
        if adjust is not None:
            req.adjust.CopyFrom(adjust)
            annotations = req.owners.owners[container.id].compound[api.Field.Value("Annotations")]
            for key in adjust.annotations:
                annotations.owners[key] = owner
        req.plugins.add(name=reg.plugin_name, index=reg.plugin_idx)
        return await self.call("ValidateContainerAdjustment", req, api.ValidateContainerAdjustmentResponse)

    async def create_and_validate(
        self, pod: api.PodSandbox, container: api.Container, *, reply_lost: bool = False
    ) -> tuple[api.CreateContainerResponse | None, api.ValidateContainerAdjustmentResponse | None]:
        """A container creation as the adaptation runs it: CreateContainer, then,
        when the plugin subscribed to validation, ValidateContainerAdjustment with
        what the runtime is about to apply. ``reply_lost``: the CreateContainer
        reply came after the runtime's deadline, which applies nothing of it (and
        still counts the plugin as present)."""
        reply: api.CreateContainerResponse | None = await self.create_container(pod, container)
        if reply_lost:
            reply = None
        if not self.validates:
            return reply, None
        adjust = reply.adjust if reply is not None and reply.HasField("adjust") else None
        return reply, await self.validate(pod, container, adjust)

    async def state_change(self, event: int, pod: api.PodSandbox, container: api.Container | None = None) -> None:
        req = api.StateChangeEvent(event=event, pod=pod)  # type: ignore[arg-type]
        if container is not None:
            req.container.CopyFrom(container)
        await self.call("StateChange", req, api.Empty)


async def connected(
    plugin: object,
    body: Callable[[FakeRuntime, Stub], Awaitable[None]],
    *,
    metrics: PluginMetrics | None = None,
    **runtime_kw: Any,
) -> FakeRuntime:
    """Serve ``plugin`` with our stub against a fake runtime over a socketpair, run
    ``body`` once the handshake is done, then stop both."""
    runtime = FakeRuntime(**runtime_kw)
    stub = Stub(plugin, PluginConfig(), preconnected=await runtime.socketpair(), metrics=metrics)
    task = asyncio.ensure_future(stub.run())
    try:
        await runtime.wait_ready()
        await body(runtime, stub)
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)
        await runtime.shutdown()
    return runtime


@contextlib.asynccontextmanager
async def listening(path: str, **kw: Any) -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(**kw)
    await runtime.listen(path)
    try:
        yield runtime
    finally:
        await runtime.shutdown()


def pod(name: str = "pod", namespace: str = "default", annotations: Mapping[str, str] | None = None) -> api.PodSandbox:
    return api.PodSandbox(
        id=f"{name}-id", name=name, namespace=namespace, uid=f"{name}-uid", annotations=dict(annotations or {})
    )


def container(name: str = "ctr", pod_id: str = "pod-id", env: Sequence[str] = ()) -> api.Container:
    return api.Container(id=f"{name}-0123456789abcdef", pod_sandbox_id=pod_id, name=name, env=list(env))
