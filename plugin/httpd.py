"""``/healthz`` and ``/metrics`` over a deliberately small HTTP/1.1 server.

Theory of operation
-------------------
The server runs on its own thread with its own event loop, never on the loop
that serves NRI: whatever clients do to it (hundreds of idle connections,
slowloris trickles, floods of connects) costs that loop nothing. Who can reach
the port: every process of the node with ``hostNetwork``, anyone who reaches the
pod's address without it; the kubelet's probes come from the same places.

One request per connection: the request line and headers (at most
``MAX_REQUEST_BYTES`` together, the line at most ``MAX_REQUEST_LINE``) must
arrive within ``HEADER_TIMEOUT`` of the accept, else 408; the headers are
ignored; the answer has ``Connection: close`` and must leave within
``WRITE_TIMEOUT``, else the connection is dropped. So a connection lives at
most ``HEADER_TIMEOUT + SNAPSHOT_TIMEOUT + WRITE_TIMEOUT`` and holds at most
``MAX_REQUEST_BYTES``.

At most ``MAX_CLIENTS`` connections are open. When a new one arrives at the
limit, the oldest connection that has not sent a whole request yet (or is
lingering after a refusal, ``LINGER_BYTES``) is dropped to make room: a probe sends its request at once and is answered within a
millisecond, so a crowd of idle or slow connections can delay it by nothing,
and to push a probe out one must open ``MAX_CLIENTS`` connections within that
millisecond.

What the answers need from the plugin (the health check, the metrics' text)
is computed on the NRI loop, the only thread that touches those objects: one
callback per answer, coalesced (requests arriving while one is in flight share
its result), so a flood of valid requests costs that loop at most one render
at a time. When the loop does not run the callback within
``SNAPSHOT_TIMEOUT``, the answer is 503 naming the stuck loop: a wedged plugin
fails its liveness probe instead of hiding behind one that times out.

``GET /healthz``: 200 with ``{"status": "ok", "registered": true, ...}`` while
the stub is registered with the runtime, else 503 with the reason.
``GET /metrics``: the Prometheus text exposition format 0.0.4, written by
``prometheus_client`` (``plugin.metrics``). Other paths 404,
other methods 405.

(The module is not called ``http`` so it never shadows the standard library's.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from nri_gpu.plugin.metrics import CONTENT_TYPE, PluginMetrics
from nri_gpu.plugin.stub import Stub

logger = logging.getLogger(__name__)

MAX_REQUEST_LINE = 2048
MAX_REQUEST_BYTES = 8192  # request line and headers; a kubelet probe sends ~150
HEADER_TIMEOUT = 2.0  # accept to the end of the headers; a probe needs a millisecond
SNAPSHOT_TIMEOUT = 0.5  # for the NRI loop to compute an answer's body
WRITE_TIMEOUT = 2.0  # for the client to take the answer
# Far above what probes and a scraper need; well below the file descriptors the
# plugin needs for its own work (each connection is one).
MAX_CLIENTS = 256
# A request refused before it was read whole (414, 431) leaves bytes in flight; a
# close with unread bytes makes the kernel send a reset, which can destroy the
# answer before the client reads it. So such a connection is half-closed after the
# answer and read to its end, discarding at most this much (and for at most
# WRITE_TIMEOUT), as web servers do ("lingering close").
LINGER_BYTES = 64 * 1024
METRICS_CONTENT_TYPE = CONTENT_TYPE  # prometheus_client's name for the text format 0.0.4
JSON_CONTENT_TYPE = "application/json"

_END_OF_HEADERS = re.compile(rb"\r?\n\r?\n")


@dataclass(frozen=True)
class Health:
    ok: bool
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def _text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def stub_health(stub: Stub) -> Callable[[], Health]:
    """The stub's registration state as a health check."""

    def check() -> Health:
        details: dict[str, Any] = {"registered": stub.registered, "registrations": stub.registrations}
        if stub.runtime is not None:
            details["runtime"] = f"{stub.runtime.name} {stub.runtime.version}"
        if stub.registered:
            return Health(True, details)
        if stub.registrations:
            details["reason"] = "the connection to the runtime was lost; reconnecting"
        else:
            details["reason"] = "not registered with the runtime yet"
        return Health(False, details)

    return check


def parse_head(data: bytes) -> tuple[str, str] | Response | None:
    """``(method, target)`` from the bytes received so far; a Response when they
    can only be refused; None while more are needed (and allowed)."""
    line_end = data.find(b"\n")
    if line_end < 0:
        return (
            _text(414, f"request line longer than {MAX_REQUEST_LINE} bytes") if len(data) > MAX_REQUEST_LINE else None
        )
    if line_end + 1 > MAX_REQUEST_LINE:
        return _text(414, f"request line longer than {MAX_REQUEST_LINE} bytes")
    parts = data[:line_end].decode("latin-1").rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return _text(400, "malformed request line")
    end = _END_OF_HEADERS.search(data, line_end)
    if (end is None and len(data) > MAX_REQUEST_BYTES) or (end is not None and end.end() > MAX_REQUEST_BYTES):
        return _text(431, f"request line and headers longer than {MAX_REQUEST_BYTES} bytes")
    if end is None:
        return None
    return parts[0], parts[1]


class StatusServer:
    """Serves ``/healthz`` from ``health()`` and ``/metrics`` from ``metrics``.

    ``health`` and ``metrics`` are used on the loop that calls ``start`` only."""

    def __init__(self, health: Callable[[], Health], metrics: PluginMetrics) -> None:
        self._health = health
        self._metrics = metrics
        self._owner: asyncio.AbstractEventLoop | None = None  # the NRI loop
        self._loop: asyncio.AbstractEventLoop | None = None  # the server's own, on _thread
        self._thread: threading.Thread | None = None
        self._port = 0
        self._connections: OrderedDict[_Connection, None] = OrderedDict()  # open, oldest first
        self._inflight: dict[str, asyncio.Future[Any]] = {}

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._thread is None:
            raise RuntimeError("the status server is not listening")
        return self._port

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` from a thread of its own; raises OSError when it cannot bind."""
        self._owner = asyncio.get_running_loop()
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        thread = threading.Thread(target=self._run, args=(host, port, ready), name="nri-gpu-status", daemon=True)
        thread.start()
        try:
            self._port = await asyncio.wrap_future(ready)
        except BaseException:
            thread.join()
            raise
        self._thread = thread

    async def stop(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join)
        self._thread = self._loop = None

    def route(self, method: str, target: str) -> Response | str:
        """The answer, or the name of the snapshot (``healthz``, ``metrics``) it needs."""
        path = target.split("?", 1)[0]
        if path not in ("/healthz", "/metrics"):
            return _text(404, f"not found: {path} (try /healthz or /metrics)")
        if method != "GET":
            return Response(405, b"only GET is supported\n", headers=(("Allow", "GET"),))
        return path[1:]

    # ---------------------------------------------------------------- the server's thread

    def _run(self, host: str, port: int, ready: concurrent.futures.Future[int]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # this thread's only
        try:
            server = loop.run_until_complete(
                loop.create_server(lambda: _Connection(self), host, port, backlog=MAX_CLIENTS)
            )
        except BaseException as exc:
            loop.close()
            ready.set_exception(exc)
            return
        self._loop = loop
        ready.set_result(int(server.sockets[0].getsockname()[1]))
        try:
            loop.run_forever()
        finally:
            server.close()
            for conn in list(self._connections):
                conn.abort()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    def _admit(self, conn: _Connection) -> None:
        """Take ``conn``; at the limit, drop the oldest connection still sending its
        request, or lingering after its refusal (the answer is out: only its discard
        is cut short)."""
        if len(self._connections) >= MAX_CLIENTS:
            victim = next((c for c in self._connections if c.receiving or c.lingering), None)
            if victim is None:
                conn.abort()  # every slot is being answered; they are gone in a moment
                return
            logger.debug("status server: %d connections open; dropping the oldest unfinished one", MAX_CLIENTS)
            victim.abort()
            self._forget(victim)  # now: its connection_lost comes later
        self._connections[conn] = None

    def _forget(self, conn: _Connection) -> None:
        self._connections.pop(conn, None)

    async def _answer(self, method: str, target: str) -> Response:
        routed = self.route(method, target)
        if isinstance(routed, Response):
            return routed
        try:
            value = await asyncio.wait_for(asyncio.shield(self._snapshot(routed)), SNAPSHOT_TIMEOUT)
        except (TimeoutError, RuntimeError) as exc:
            # RuntimeError: the NRI loop is closed (the plugin is stopping).
            reason = f"the plugin's event loop did not answer within {SNAPSHOT_TIMEOUT} s"
            if isinstance(exc, RuntimeError):
                reason = "the plugin's event loop is not running"
            if routed == "metrics":
                return _text(503, reason)
            body = {"status": "unavailable", "reason": reason}
            return Response(503, (json.dumps(body) + "\n").encode(), JSON_CONTENT_TYPE)
        if routed == "metrics":
            return Response(200, str(value).encode(), METRICS_CONTENT_TYPE)
        health: Health = value
        body = {"status": "ok" if health.ok else "unavailable", **health.details}
        return Response(200 if health.ok else 503, (json.dumps(body) + "\n").encode(), JSON_CONTENT_TYPE)

    def _snapshot(self, name: str) -> asyncio.Future[Any]:
        """The NRI loop's ``health()`` or ``metrics.render()``: one call in flight per name."""
        pending = self._inflight.get(name)
        if pending is not None:
            return pending
        function: Callable[[], Any] = self._health if name == "healthz" else self._metrics.render
        result: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def compute() -> None:
            if not result.set_running_or_notify_cancel():
                return
            try:
                result.set_result(function())
            except BaseException as exc:
                result.set_exception(exc)

        assert self._owner is not None
        self._owner.call_soon_threadsafe(compute)  # RuntimeError once that loop is closed
        future = asyncio.wrap_future(result)
        self._inflight[name] = future
        future.add_done_callback(lambda _: self._inflight.pop(name, None))
        return future


class _Connection(asyncio.Protocol):
    """One client: receive a request (bounded), answer it, close."""

    def __init__(self, server: StatusServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.receiving = True
        self.lingering = False  # answered early: discarding what the client still sends
        self._discarded = 0
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HEADER_TIMEOUT, self._respond, _text(408, "request not received in time"))
        self._server._admit(self)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES:
                self.abort()
            return
        if not self.receiving:
            return  # anything after the headers is ignored
        self._buffer += data
        parsed = parse_head(bytes(self._buffer))
        if parsed is None:
            return
        if isinstance(parsed, Response):
            self._respond(parsed, linger=True)
            return
        self.receiving = False
        self._buffer.clear()
        self._task = asyncio.get_running_loop().create_task(self._answer(*parsed))

    def eof_received(self) -> bool | None:
        self._eof = True
        if self.lingering:
            return None  # the client has sent everything and the answer is out: close
        if self.receiving:
            self.abort()  # half a request and nothing more to come
            return None
        return True  # half-closed after its request: keep the socket open for the answer

    async def _answer(self, method: str, target: str) -> None:
        try:
            response = await self._server._answer(method, target)
        except Exception:
            logger.exception("status request failed")
            response = _text(503, "internal error")
        self._respond(response)

    def _respond(self, response: Response, *, linger: bool = False) -> None:
        """Send the answer and close; ``linger``: the request was not read whole (LINGER_BYTES)."""
        self.receiving = False
        if self._timer is not None:
            self._timer.cancel()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(response.encode())
        if linger and not self._eof and transport.can_write_eof():
            transport.write_eof()  # the answer, then our FIN; the socket closes at the client's
            self.lingering = True
        else:
            transport.close()  # after the answer is flushed
        self._timer = asyncio.get_running_loop().call_later(WRITE_TIMEOUT, self.abort)

    def abort(self) -> None:
        self.receiving = False
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.receiving = False
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
        self._server._forget(self)
