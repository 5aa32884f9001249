"""The NRI plugin stub: everything between a plugin author's class and the runtime.

Theory of operation
-------------------
A plugin author writes a plain class with ``async`` methods named after the
events it cares about (see ``HANDLER_NAMES``). The stub looks those methods up
once, derives the subscription mask from them, and then owns the protocol:

1. dial the runtime's NRI socket (or adopt the pre-connected one the runtime
   passed when it launched us), run ttrpc over it (``plugin.ttrpc``);
2. call ``Runtime.RegisterPlugin``; the runtime answers with ``Configure``
   (possibly before the RegisterPlugin reply arrives) where we send the mask,
   ANDed with the events this runtime knows, then ``Synchronize`` with the
   existing pods and containers (possibly split into ``more=true`` chunks, which
   we accumulate and hand to the plugin in one call);
3. dispatch every later request to the handler, in both forms runtimes use:
   the dedicated RPCs (CreateContainer, ..., and the per-event RPCs of NRI
   v0.12) and the older ``StateChange(event=N)`` envelope;
4. when the trunk closes (runtime restart) dial again with a short backoff and
   register again; a runtime-launched plugin cannot, so it returns.

A handler exception becomes an error status whose message names the plugin,
the event, the container and the cause; the connection survives it. Only a
refused registration (bad name or index) is fatal. The stub counts every
request and every failed one by kind; logging a refusal is the plugin's (its
decision line, ``plugin.decisions``), a bug's traceback the stub's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError, Message

from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.budget import Timeouts, deadline_scope
from nri_gpu.plugin.config import PluginConfig
from nri_gpu.plugin.errors import PluginError, RegistrationError, bounded
from nri_gpu.plugin.events import Event, events_of, mask_of, valid_events
from nri_gpu.plugin.metrics import ERROR_INTERNAL, ERROR_REFUSED, ERROR_START_FAILED, PluginMetrics
from nri_gpu.plugin.ttrpc import Code, ConnectionClosed, InboundRequest, MuxConnection, StatusError

logger = logging.getLogger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"

# Logical connections of the NRI trunk: the runtime calls us on 1, we call it on 2.
PLUGIN_CONN = 1
RUNTIME_CONN = 2

# Handler method name for each event. Signatures (all async, all optional):
#   run_pod_sandbox / stop_pod_sandbox / remove_pod_sandbox / post_update_pod_sandbox(pod)
#   update_pod_sandbox(pod, overhead_resources, resources)
#   create_container(pod, container) -> ContainerAdjustment | (adjustment, [updates]) | None
#   update_container(pod, container, resources) -> [ContainerUpdate] | None
#   stop_container(pod, container) -> [ContainerUpdate] | None
#   post_create_container / start_container / post_start_container /
#   post_update_container / remove_container(pod, container)
#   validate_container_adjustment(request) -> None, or raise PluginError to reject
# plus configure(config, runtime_name, runtime_version), synchronize(pods,
# containers) -> [ContainerUpdate] | None, and shutdown().
HANDLER_NAMES: dict[Event, str] = {event: event.name.lower() for event in Event}
_LIFECYCLE_NAMES = ("configure", "synchronize", "shutdown")

_NO_VALIDATION = (
    " (NRI before v0.10: containerd < 2.2, CRI-O < 1.34): a container whose CreateContainer reply is lost is "
    "created without this plugin's adjustment"
)

# Registration must not outlive the runtime's own registration timeout (5 s).
REGISTER_TIMEOUT = 5.0
# How long UpdateContainers may take before we give up on it.
UPDATE_TIMEOUT = 5.0

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class RuntimeInfo:
    name: str
    version: str
    nri_version: str
    config: str


def describe(event: str, pod: api.PodSandbox | None, container: api.Container | None) -> str:
    """``CreateContainer of container "c" (id 1234abcd5678) in pod "ns/p"`` - for error messages."""
    parts = [event]
    if container is not None and (container.name or container.id):
        parts.append(f'of container "{container.name}" (id {container.id[:12]})')
    if pod is not None and (pod.name or pod.namespace):
        parts.append(f'in pod "{pod.namespace}/{pod.name}"')
    return " ".join(parts)


class Stub:
    """Runs one plugin object against one runtime, reconnecting as needed."""

    def __init__(
        self,
        plugin: object,
        config: PluginConfig,
        *,
        preconnected: socket.socket | None = None,
        metrics: PluginMetrics | None = None,
    ) -> None:
        self._plugin = plugin
        self._config = config
        self._preconnected = preconnected
        self._handlers = _find_handlers(plugin)
        self._wanted = mask_of(e for e in Event if HANDLER_NAMES[e] in self._handlers)
        self._conn: MuxConnection | None = None
        self._closing: asyncio.Future[None] | None = None
        self._stopping = asyncio.Event()
        self._registered = asyncio.Event()
        self._configured = asyncio.Event()
        self._sync_pods: list[api.PodSandbox] = []
        self._sync_containers: list[api.Container] = []
        self.runtime: RuntimeInfo | None = None
        # The runtime's, from Configure: what a request without its own deadline gets.
        self.timeouts = Timeouts()
        self.registrations = 0
        self._routes: dict[str, Callable[[bytes], Awaitable[Message]]] = self._build_routes()
        self._metrics = metrics
        if metrics is not None:
            metrics.registered.set_function(lambda: 1.0 if self.registered else 0.0)

    # -- public surface -----------------------------------------------------

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def wanted_events(self) -> int:
        """The mask derived from the plugin's handler methods, before the runtime's cap."""
        return self._wanted

    @property
    def registered(self) -> bool:
        return self._registered.is_set()

    async def wait_registered(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._registered.wait(), timeout)

    def stop(self) -> None:
        """Ask ``run`` to return: close the trunk, stop reconnecting."""
        self._stopping.set()
        if self._conn is not None:
            # Keep a reference: the loop holds tasks only weakly.
            self._closing = asyncio.ensure_future(self._conn.close())

    async def run(self) -> None:
        """Connect, register and serve until ``stop()``; reconnect when the runtime goes away.

        Raises RegistrationError when the runtime refuses our name or index, and
        OSError when a pre-connected socket is unusable.
        """
        delay = self._config.reconnect_min
        announced_wait = False
        try:
            while not self._stopping.is_set():
                try:
                    conn = await self._open()
                except OSError as exc:
                    if self._preconnected is not None:
                        raise
                    if not announced_wait:
                        logger.info("waiting for the runtime's NRI socket %s: %s", self._config.socket, exc)
                        announced_wait = True
                    await self._sleep(delay)
                    delay = min(delay * 2, self._config.reconnect_max)
                    continue
                announced_wait = False
                try:
                    if await self._serve(conn):
                        delay = self._config.reconnect_min
                finally:
                    self._registered.clear()
                    self._conn = None
                    await conn.close()
                if self._preconnected is not None or self._stopping.is_set():
                    break
                logger.warning("connection to the runtime closed; reconnecting")
                await self._sleep(delay)
                delay = min(delay * 2, self._config.reconnect_max)
        finally:
            await self._call_shutdown()

    async def update_containers(self, updates: Iterable[api.ContainerUpdate]) -> list[api.ContainerUpdate]:
        """Ask the runtime to update containers; returns the updates that failed.

        Never await this from inside an event handler: the runtime holds its
        locks while it waits for our reply, so it would deadlock until its timeout.
        """
        conn = self._conn
        if conn is None or not self.registered:
            raise ConnectionClosed("not registered with a runtime")
        request = api.UpdateContainersRequest(update=list(updates))
        raw = await conn.call(
            RUNTIME_SERVICE, "UpdateContainers", request.SerializeToString(), timeout=UPDATE_TIMEOUT, send_timeout=False
        )
        return list(_parse(api.UpdateContainersResponse, raw).failed)

    # -- connection ---------------------------------------------------------

    async def _open(self) -> MuxConnection:
        name = f"{self._config.name}@{self._config.socket}"
        if self._preconnected is not None:
            return await MuxConnection.from_socket(
                self._preconnected, serve_conn=PLUGIN_CONN, call_conn=RUNTIME_CONN, handler=self._dispatch, name=name
            )
        return await MuxConnection.connect(
            self._config.socket, serve_conn=PLUGIN_CONN, call_conn=RUNTIME_CONN, handler=self._dispatch, name=name
        )

    async def _serve(self, conn: MuxConnection) -> bool:
        """Register over ``conn`` and serve until it closes; True if registration completed."""
        self._conn = conn
        self._configured.clear()
        self._sync_pods, self._sync_containers = [], []
        conn.start()
        request = api.RegisterPluginRequest(plugin_name=self._config.name, plugin_idx=self._config.index)
        try:
            await conn.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), timeout=REGISTER_TIMEOUT)
        except StatusError as exc:
            raise RegistrationError(
                f"the runtime refused plugin {self._config.name!r} index {self._config.index!r}: {exc.message}"
            ) from exc
        except (ConnectionClosed, TimeoutError) as exc:
            logger.warning("registration did not complete: %s", exc or type(exc).__name__)
            return False
        # A runtime-launched plugin of NRI v0.6 is never sent Synchronize, so for it
        # Configure is the end of the handshake; an external one waits for the sync.
        waiter = self._configured if self._preconnected is not None else self._registered
        try:
            await asyncio.wait_for(_first(waiter.wait(), conn.wait_closed()), REGISTER_TIMEOUT * 2)
        except TimeoutError:
            logger.warning("runtime did not configure and synchronize us in time; reconnecting")
            return False
        if conn.closed:
            return False
        self._registered.set()
        self.registrations += 1
        if self._metrics is not None:
            self._metrics.registrations.inc()
        rt = self.runtime
        logger.info(
            "registered with %s %s as %s-%s, events %s",
            rt.name if rt else "?",
            rt.version if rt else "?",
            self._config.index,
            self._config.name,
            ",".join(e.name for e in events_of(self._wanted)) or "none",
        )
        await _first(conn.wait_closed(), self._stopping.wait())
        return True

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass

    async def _call_shutdown(self) -> None:
        handler = self._handlers.get("shutdown")
        if handler is not None:
            try:
                await handler()
            except Exception:
                logger.exception("plugin shutdown handler failed")

    # -- dispatch -----------------------------------------------------------

    async def _dispatch(self, request: InboundRequest) -> bytes:
        if request.service != PLUGIN_SERVICE:
            raise StatusError(Code.UNIMPLEMENTED, f"service {request.service}")
        route = self._routes.get(request.method)
        if route is None:
            raise StatusError(Code.UNIMPLEMENTED, f"method {request.method}")
        # StateChange is counted under the event it carries (see _on_state_change).
        if self._metrics is not None and request.method != "StateChange":
            self._metrics.event(request.method)
        # The handler's budget: the runtime's own deadline for this request when it
        # sent one (containerd does), else the request timeout it configured.
        deadline = request.deadline
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.timeouts.request
        with deadline_scope(deadline):
            reply = await route(request.payload)
        return reply.SerializeToString()

    def _build_routes(self) -> dict[str, Callable[[bytes], Awaitable[Message]]]:
        routes: dict[str, Callable[[bytes], Awaitable[Message]]] = {
            "Configure": self._on_configure,
            "Synchronize": self._on_synchronize,
            "Shutdown": self._on_shutdown,
            "CreateContainer": self._on_create_container,
            "UpdateContainer": self._on_update_container,
            "StopContainer": self._on_stop_container,
            "StateChange": self._on_state_change,
            "UpdatePodSandbox": self._on_update_pod_sandbox,
            "ValidateContainerAdjustment": self._on_validate,
        }
        # NRI v0.12 sends the notification events as dedicated RPCs; each carries
        # the same pod/container pair StateChange did and answers an empty reply.
        for event, (request_type, reply_type) in _NOTIFICATION_RPCS.items():
            routes[_rpc_name(event)] = self._notification_route(event, request_type, reply_type)
        return routes

    def _notification_route(
        self, event: Event, request_type: type[Message], reply_type: type[Message]
    ) -> Callable[[bytes], Awaitable[Message]]:
        async def route(payload: bytes) -> Message:
            msg: Any = _parse(request_type, payload)
            container = msg.container if hasattr(msg, "container") else None
            await self._notify(event, msg.pod, container)
            return reply_type()

        return route

    async def _invoke(self, event: Event, pod: Any, container: Any, *args: Any) -> Any:
        """Call the handler for ``event``; translate its failure into a status the runtime shows."""
        handler = self._handlers.get(HANDLER_NAMES[event])
        if handler is None:
            return None
        try:
            return await handler(*args)
        except StatusError:
            raise
        except Exception as exc:
            what = describe(_rpc_name(event), pod, container)
            if isinstance(exc, PluginError):
                # A refusal is the plugin's decision, logged by it once with its fields
                # (plugin.decisions); here only for tracing what the runtime was answered.
                logger.debug("%s refused: %s", what, exc)
                cause = str(exc)
                kind = ERROR_START_FAILED if event is Event.START_CONTAINER else ERROR_REFUSED
            else:
                logger.exception("%s: handler failed", what)
                cause = f"{type(exc).__name__}: {exc}"
                kind = ERROR_INTERNAL
            if self._metrics is not None:
                self._metrics.error(kind)
            # Names and an exception's text can carry container input: one bounded line.
            raise StatusError(Code.UNKNOWN, bounded(f"{self._config.name}: {what}: {cause}")) from exc

    async def _notify(self, event: Event, pod: Any, container: Any) -> None:
        if event.is_pod_event:
            await self._invoke(event, pod, None, pod)
        else:
            await self._invoke(event, pod, container, pod, container)

    async def _on_configure(self, payload: bytes) -> Message:
        req = _parse(api.ConfigureRequest, payload)
        self.runtime = RuntimeInfo(req.runtime_name, req.runtime_version, req.NRI_version, req.config)
        self.timeouts = Timeouts.from_configure(req.registration_timeout, req.request_timeout)
        logger.debug(
            "runtime timeouts: registration %g s, request %g s", self.timeouts.registration, self.timeouts.request
        )
        valid = valid_events(req.runtime_name, req.runtime_version, req.NRI_version)
        events = self._wanted & valid
        if dropped := self._wanted & ~valid:
            # Validation is new in NRI v0.10; on older runtimes its absence is expected.
            only_validation = dropped == Event.VALIDATE_CONTAINER_ADJUSTMENT.bit
            logger.log(
                logging.INFO if only_validation else logging.WARNING,
                "%s %s does not offer events %s; not subscribing to them%s",
                req.runtime_name,
                req.runtime_version,
                ",".join(e.name for e in events_of(dropped)),
                _NO_VALIDATION if only_validation else "",
            )
        handler = self._handlers.get("configure")
        if handler is not None:
            try:
                await handler(req.config, req.runtime_name, req.runtime_version)
            except Exception as exc:
                logger.exception("plugin configure handler failed")
                raise StatusError(Code.UNKNOWN, f"{self._config.name}: Configure: {exc}") from exc
        self._configured.set()
        return api.ConfigureResponse(events=events)

    async def _on_synchronize(self, payload: bytes) -> Message:
        req = _parse(api.SynchronizeRequest, payload)
        self._sync_pods.extend(req.pods)
        self._sync_containers.extend(req.containers)
        if req.more:
            # Split sync: every intermediate chunk must be answered more=true with
            # no updates, or the runtime drops us.
            return api.SynchronizeResponse(more=True)
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        updates: list[api.ContainerUpdate] = []
        handler = self._handlers.get("synchronize")
        if handler is not None:
            # A failing sync leaves older runtimes holding a silent zombie plugin,
            # so a handler bug is logged and answered with no updates instead.
            try:
                updates = list(await handler(pods, containers) or [])
            except Exception:
                logger.exception("plugin synchronize handler failed; continuing without updates")
                updates = []
        self._registered.set()
        return api.SynchronizeResponse(update=updates)

    async def _on_shutdown(self, payload: bytes) -> Message:
        await self._call_shutdown()
        return api.Empty()

    async def _on_create_container(self, payload: bytes) -> Message:
        req = _parse(api.CreateContainerRequest, payload)
        result = await self._invoke(Event.CREATE_CONTAINER, req.pod, req.container, req.pod, req.container)
        adjust, updates = result if isinstance(result, tuple) else (result, None)
        reply = api.CreateContainerResponse(update=list(updates or []))
        if adjust is not None:
            reply.adjust.CopyFrom(adjust)
        return reply

    async def _on_update_container(self, payload: bytes) -> Message:
        req = _parse(api.UpdateContainerRequest, payload)
        updates = await self._invoke(
            Event.UPDATE_CONTAINER, req.pod, req.container, req.pod, req.container, req.linux_resources
        )
        return api.UpdateContainerResponse(update=list(updates or []))

    async def _on_stop_container(self, payload: bytes) -> Message:
        req = _parse(api.StopContainerRequest, payload)
        updates = await self._invoke(Event.STOP_CONTAINER, req.pod, req.container, req.pod, req.container)
        return api.StopContainerResponse(update=list(updates or []))

    async def _on_update_pod_sandbox(self, payload: bytes) -> Message:
        req = _parse(api.UpdatePodSandboxRequest, payload)
        await self._invoke(
            Event.UPDATE_POD_SANDBOX, req.pod, None, req.pod, req.overhead_linux_resources, req.linux_resources
        )
        return api.UpdatePodSandboxResponse()

    async def _on_validate(self, payload: bytes) -> Message:
        req = _parse(api.ValidateContainerAdjustmentRequest, payload)
        try:
            await self._invoke(Event.VALIDATE_CONTAINER_ADJUSTMENT, req.pod, req.container, req)
        except StatusError as exc:
            return api.ValidateContainerAdjustmentResponse(reject=True, reason=exc.message)
        return api.ValidateContainerAdjustmentResponse()

    async def _on_state_change(self, payload: bytes) -> Message:
        req = _parse(api.StateChangeEvent, payload)
        try:
            event = Event(req.event)
        except ValueError:
            if self._metrics is not None:
                self._metrics.event("StateChange")
            # An event newer than this code: ignore it rather than fail the runtime's call.
            logger.debug("ignoring StateChange for unknown event %d", req.event)
            return api.Empty()
        if self._metrics is not None:
            self._metrics.event(_rpc_name(event))
        container = req.container if req.HasField("container") else None
        await self._notify(event, req.pod, container)
        return api.Empty()


# v0.12 notification RPCs: event -> (request type, reply type).
_NOTIFICATION_RPCS: dict[Event, tuple[type[Message], type[Message]]] = {
    Event.RUN_POD_SANDBOX: (api.RunPodSandboxRequest, api.RunPodSandboxResponse),
    Event.STOP_POD_SANDBOX: (api.StopPodSandboxRequest, api.StopPodSandboxResponse),
    Event.REMOVE_POD_SANDBOX: (api.RemovePodSandboxRequest, api.RemovePodSandboxResponse),
    Event.POST_UPDATE_POD_SANDBOX: (api.PostUpdatePodSandboxRequest, api.PostUpdatePodSandboxResponse),
    Event.POST_CREATE_CONTAINER: (api.PostCreateContainerRequest, api.PostCreateContainerResponse),
    Event.START_CONTAINER: (api.StartContainerRequest, api.StartContainerResponse),
    Event.POST_START_CONTAINER: (api.PostStartContainerRequest, api.PostStartContainerResponse),
    Event.POST_UPDATE_CONTAINER: (api.PostUpdateContainerRequest, api.PostUpdateContainerResponse),
    Event.REMOVE_CONTAINER: (api.RemoveContainerRequest, api.RemoveContainerResponse),
}


def _rpc_name(event: Event) -> str:
    return "".join(part.capitalize() for part in event.name.split("_"))


def _parse(message_type: type[Message], payload: bytes) -> Any:
    msg = message_type()
    try:
        msg.ParseFromString(payload)
    except DecodeError as exc:
        raise StatusError(Code.INVALID_ARGUMENT, f"cannot decode {message_type.__name__}: {exc}") from exc
    return msg


def _find_handlers(plugin: object) -> dict[str, Handler]:
    """The plugin's event and lifecycle methods; each must be ``async def``."""
    found: dict[str, Handler] = {}
    for name in (*HANDLER_NAMES.values(), *_LIFECYCLE_NAMES):
        method = getattr(plugin, name, None)
        if method is None:
            continue
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"{type(plugin).__name__}.{name} must be an async method")
        found[name] = method
    return found


async def _first(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` finishes; cancel the rest."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
