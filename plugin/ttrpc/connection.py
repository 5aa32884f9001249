"""ttrpc over an NRI mux trunk, on asyncio: the transport's only I/O module.

Theory of operation: one ``MuxConnection`` owns one unix stream socket that
carries the mux trunk. On it, it is a ttrpc server on one logical conn id
(``serve_conn``) and a ttrpc client on another (``call_conn``). The plugin
serves 1 and calls 2; a fake runtime in tests mirrors that (serves 2, calls 1).

* One reader task reads the socket, splits it with ``Demux`` and feeds each
  conn's bytes to its own ``MessageDecoder``. It never awaits a handler, so a
  handler that calls the peer back (NRI's Configure arrives before the
  RegisterPlugin reply) cannot deadlock the trunk.
* Server side: every REQUEST gets its own task, so many run at once. The task
  applies the peer's ``timeout_nano`` as a deadline, and turns every outcome
  into exactly one RESPONSE on the request's stream id: ``StatusError`` to its
  status, deadline to DEADLINE_EXCEEDED, anything else to UNKNOWN. A failing
  handler never takes the connection down. Stream-id rules, undecodable
  requests and oversized messages are answered like Go's server does.
* Client side: stream ids are odd, from 1, increasing by 2. Each call parks a
  future in ``_pending`` under its id; the reader resolves it with the RESPONSE.
  Late or unknown responses are logged and dropped, as Go does.
* Writes go through one lock and ``encode_mux``, so the frames of a message
  are never interleaved with another message and never break the Go reader.
* Shutdown (peer EOF, I/O or framing error, or ``close()``) fails every pending
  call with ``ConnectionClosed``, cancels in-flight handlers, closes the socket
  and wakes ``wait_closed()``. Replies that finish afterwards are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, Self

from nri_gpu.plugin.ttrpc.codec import decode_request, decode_response, encode_request, encode_response
from nri_gpu.plugin.ttrpc.errors import (
    Code,
    ConnectionClosed,
    MessageTooLarge,
    ProtocolError,
    StatusError,
    TtrpcError,
)
from nri_gpu.plugin.ttrpc.frames import (
    MAX_MESSAGE,
    Message,
    MessageDecoder,
    MessageType,
    Oversized,
    encode_message,
)
from nri_gpu.plugin.ttrpc.mux import Demux, encode_mux

__all__ = ["Handler", "InboundRequest", "MuxConnection"]

logger = logging.getLogger(__name__)

_U32_MAX = 0xFFFFFFFF
_READ_SIZE = 64 * 1024
# How long close() waits for cancelled handlers and for buffered writes to
# drain: a handler that ignores cancellation, or a peer that stopped
# reading, must not make close() hang.
_CLOSE_GRACE = 1.0

_Status = tuple[Code, str]
_Reply = tuple[bytes, Code, str]


@dataclass(frozen=True, slots=True)
class InboundRequest:
    """A request received on the serve conn, as a handler sees it."""

    service: str
    method: str
    payload: bytes
    stream_id: int
    # Absolute, in loop.time() units; None when the peer sent no timeout.
    deadline: float | None
    metadata: tuple[tuple[str, str], ...]


# Returns the serialized reply payload; raise StatusError to choose the status.
Handler = Callable[[InboundRequest], Awaitable[bytes]]


class MuxConnection:
    """ttrpc server on ``serve_conn`` and client on ``call_conn`` of one trunk."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        serve_conn: int,
        call_conn: int,
        handler: Handler | None = None,
        name: str = "",
    ) -> None:
        for label, conn_id in (("serve_conn", serve_conn), ("call_conn", call_conn)):
            if not 1 <= conn_id <= _U32_MAX:
                raise ValueError(f"{label} {conn_id!r} is not in 1..{_U32_MAX}")
        if serve_conn == call_conn:
            raise ValueError(f"serve_conn and call_conn are both {serve_conn}")
        self._reader = reader
        self._writer = writer
        self._serve_conn = serve_conn
        self._call_conn = call_conn
        self._handler = handler
        self._name = name or f"ttrpc(serve={serve_conn},call={call_conn})"
        self._demux = Demux()
        self._serve_decoder = MessageDecoder()
        self._call_decoder = MessageDecoder()
        self._last_served_id = 0
        self._next_stream_id = 1
        self._pending: dict[int, asyncio.Future[_Reply]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._closed_event = asyncio.Event()
        self._closed = False
        self._close_reason: BaseException | None = None

    @classmethod
    async def connect(
        cls,
        path: str,
        *,
        serve_conn: int,
        call_conn: int,
        handler: Handler | None = None,
        name: str = "",
    ) -> Self:
        """Dial the unix socket at ``path``; return a started connection.

        Raises OSError (e.g. FileNotFoundError, ConnectionRefusedError) if the
        socket cannot be reached.
        """
        reader, writer = await asyncio.open_unix_connection(path)
        conn = cls(reader, writer, serve_conn=serve_conn, call_conn=call_conn, handler=handler, name=name)
        conn.start()
        return conn

    @classmethod
    async def from_socket(
        cls,
        sock: socket.socket,
        *,
        serve_conn: int,
        call_conn: int,
        handler: Handler | None = None,
        name: str = "",
    ) -> Self:
        """Wrap an already-connected AF_UNIX stream socket; return a started connection.

        The connection takes ownership of ``sock`` and closes it on shutdown.
        Raises ValueError if ``sock`` is not an AF_UNIX stream socket.
        """
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        conn = cls(reader, writer, serve_conn=serve_conn, call_conn=call_conn, handler=handler, name=name)
        conn.start()
        return conn

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> BaseException | None:
        """Why the trunk went away: ConnectionClosed for peer EOF, the error for
        an I/O or framing failure, None while open or after a local close()."""
        return self._close_reason

    def start(self) -> None:
        """Spawn the reader task. Idempotent; a no-op once closed."""
        if self._reader_task is None and not self._closed:
            self._reader_task = asyncio.get_running_loop().create_task(self._read_loop(), name=f"{self._name}:reader")

    async def call(
        self,
        service: str,
        method: str,
        payload: bytes,
        *,
        timeout: float | None = None,
        send_timeout: bool = True,
        metadata: Iterable[tuple[str, str]] = (),
    ) -> bytes:
        """Make one unary call on ``call_conn``; return the reply payload.

        ``timeout`` bounds the whole call locally; with ``send_timeout`` it is
        also sent to the peer as ``timeout_nano`` so the peer gives up too.
        Starts the reader if the caller forgot to.

        Raises StatusError for an error reply (RESOURCE_EXHAUSTED, locally,
        for a request over 4 MiB), ConnectionClosed if the trunk is or goes
        away, TimeoutError when ``timeout`` expires, ProtocolError for an
        undecodable reply.
        """
        if self._closed:
            raise ConnectionClosed(f"{self._name}: connection is closed")
        self.start()
        timeout_ns = 0
        if timeout is not None and send_timeout:
            # At least 1 ns: 0 on the wire would mean "no deadline at all".
            timeout_ns = max(1, int(timeout * 1e9))
        body = encode_request(service, method, payload, timeout_ns, metadata)
        stream_id = self._allocate_stream_id()
        try:
            message = encode_message(Message(stream_id, MessageType.REQUEST, 0, body))
        except MessageTooLarge as exc:
            # What Go ttrpc >= 1.2.6 does: fail locally, the peer would drop it.
            raise StatusError(Code.RESOURCE_EXHAUSTED, str(exc)) from exc
        future: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = future
        try:
            async with asyncio.timeout(timeout):
                await self._send(self._call_conn, message)
                reply, code, text = await future
        finally:
            # A reply arriving after this point is "for an unknown stream".
            self._pending.pop(stream_id, None)
        if code is not Code.OK:
            raise StatusError(code, text)
        return reply

    async def wait_closed(self) -> None:
        """Return once the trunk is gone (peer EOF, error or close()). Idempotent."""
        await self._closed_event.wait()

    async def close(self) -> None:
        """Shut down: fail pending calls, cancel handlers and the reader, close
        the socket. Idempotent; safe to call from inside a handler."""
        self._shutdown(None)
        current = asyncio.current_task()
        others = [t for t in (*self._tasks, self._reader_task) if t is not None and t is not current]
        if others:
            await asyncio.wait(others, timeout=_CLOSE_GRACE)
        try:
            async with asyncio.timeout(_CLOSE_GRACE):
                await self._writer.wait_closed()
        except TimeoutError:
            self._writer.transport.abort()
        except OSError:
            pass  # the socket already failed; it is closed either way

    # -- reading -----------------------------------------------------------

    async def _read_loop(self) -> None:
        reason: BaseException | None = ConnectionClosed("peer closed the connection")
        try:
            while data := await self._reader.read(_READ_SIZE):
                for conn_id, piece in self._demux.feed(data):
                    self._route(conn_id, piece)
        except asyncio.CancelledError:
            reason = None  # close() (or loop teardown) stopped us
            raise
        except (OSError, ProtocolError) as exc:
            logger.warning("%s: trunk failed: %s", self._name, exc)
            reason = exc
        except Exception as exc:  # a bug of ours: close tidily, loudly
            logger.exception("%s: reader crashed", self._name)
            reason = exc
        finally:
            self._shutdown(reason)

    def _route(self, conn_id: int, piece: bytes) -> None:
        if conn_id == self._serve_conn:
            for event in self._serve_decoder.feed(piece):
                self._on_serve_event(event)
        elif conn_id == self._call_conn:
            for event in self._call_decoder.feed(piece):
                self._on_call_event(event)
        else:
            # Go drops frames for conn ids it has not opened; so do we.
            logger.debug("%s: dropped %d bytes for unknown mux conn %d", self._name, len(piece), conn_id)

    def _on_serve_event(self, event: Message | Oversized) -> None:
        sid = event.stream_id
        if isinstance(event, Oversized):
            error = MessageTooLarge(sid, event.length, MAX_MESSAGE)
            logger.warning("%s: discarded inbound message on stream %d: %s", self._name, sid, error)
            self._spawn(self._reply(sid, b"", (Code.RESOURCE_EXHAUSTED, str(error))), sid)
            return
        if event.type != MessageType.REQUEST:
            # Only unary RPCs are served: DATA and unknown types are ignored, as Go does.
            logger.debug("%s: ignored message type %d on stream %d", self._name, event.type, sid)
            return
        rejection = self._check_stream_id(sid)
        if rejection is not None:
            logger.warning("%s: rejected request on stream %d: %s", self._name, sid, rejection)
            self._spawn(self._reply(sid, b"", (Code.INVALID_ARGUMENT, rejection)), sid)
            return
        self._spawn(self._serve(event), sid)

    def _check_stream_id(self, sid: int) -> str | None:
        # The same rules and words as Go's server, so a fake runtime built on
        # this class catches a client that breaks them.
        if sid % 2 != 1:
            return "StreamID must be odd for client initiated streams"
        if sid <= self._last_served_id:
            return "StreamID cannot be re-used and must increment"
        self._last_served_id = sid
        return None

    def _on_call_event(self, event: Message | Oversized) -> None:
        sid = event.stream_id
        future = self._pending.get(sid)
        if future is not None and future.done():
            future = None  # already answered or given up
        if isinstance(event, Oversized):
            error = MessageTooLarge(sid, event.length, MAX_MESSAGE)
            logger.warning("%s: discarded inbound message on stream %d: %s", self._name, sid, error)
            if future is not None:
                future.set_exception(StatusError(Code.RESOURCE_EXHAUSTED, str(error)))
            return
        if event.type != MessageType.RESPONSE:
            logger.debug("%s: ignored message type %d on stream %d", self._name, event.type, sid)
            return
        if future is None:
            # Typically a reply that arrived after our local timeout.
            logger.warning("%s: dropped response for unknown stream %d", self._name, sid)
            return
        try:
            future.set_result(decode_response(event.data))
        except ProtocolError as exc:
            future.set_exception(exc)

    # -- serving -----------------------------------------------------------

    async def _serve(self, message: Message) -> None:
        sid = message.stream_id
        try:
            request = decode_request(message.data)
        except ProtocolError as exc:
            logger.warning("%s: undecodable request on stream %d: %s", self._name, sid, exc)
            await self._reply(sid, b"", (Code.INVALID_ARGUMENT, f"unmarshal request error: {exc}"))
            return
        deadline = None
        if request.timeout_nano > 0:
            deadline = asyncio.get_running_loop().time() + request.timeout_nano / 1e9
        inbound = InboundRequest(
            service=request.service,
            method=request.method,
            payload=request.payload,
            stream_id=sid,
            deadline=deadline,
            metadata=tuple((kv.key, kv.value) for kv in request.metadata),
        )
        payload, status = await self._dispatch(inbound)
        await self._reply(sid, payload, status)

    async def _dispatch(self, request: InboundRequest) -> tuple[bytes, _Status | None]:
        """Run the handler; map every outcome onto (payload, status)."""
        where = f"{request.service}/{request.method} (stream {request.stream_id})"
        if self._handler is None:
            return b"", (Code.UNIMPLEMENTED, f"service {request.service}")
        deadline = asyncio.timeout_at(request.deadline)
        try:
            async with deadline:
                payload = await self._handler(request)
        except StatusError as exc:
            return b"", (exc.code, exc.message)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being shut down: no reply
            # The handler itself was cancelled (e.g. awaited a cancelled future).
            return b"", (Code.CANCELLED, "context canceled")
        except Exception as exc:
            # A TimeoutError the handler raised on its own is just a failure.
            if isinstance(exc, TimeoutError) and deadline.expired():
                logger.warning("%s: %s missed its deadline", self._name, where)
                return b"", (Code.DEADLINE_EXCEEDED, "context deadline exceeded")
            logger.exception("%s: handler for %s failed", self._name, where)
            return b"", (Code.UNKNOWN, str(exc) or type(exc).__name__)
        if not isinstance(payload, bytes | bytearray):
            logger.error("%s: handler for %s returned %s, not bytes", self._name, where, type(payload).__name__)
            return b"", (Code.UNKNOWN, f"handler returned {type(payload).__name__}, not bytes")
        return bytes(payload), None

    async def _reply(self, sid: int, payload: bytes, status: _Status | None) -> None:
        try:
            message = encode_message(Message(sid, MessageType.RESPONSE, 0, encode_response(payload, status)))
        except MessageTooLarge as exc:
            # Go would drop an oversized reply; a status reaches the caller.
            logger.error("%s: reply on stream %d not sent: %s", self._name, sid, exc)
            body = encode_response(status=(Code.RESOURCE_EXHAUSTED, str(exc)))
            message = encode_message(Message(sid, MessageType.RESPONSE, 0, body))
        try:
            await self._send(self._serve_conn, message)
        except ConnectionClosed:
            logger.debug("%s: dropped reply on stream %d: connection closed", self._name, sid)

    # -- writing and lifecycle ---------------------------------------------

    async def _send(self, conn_id: int, message: bytes) -> None:
        frames = encode_mux(conn_id, message)
        async with self._write_lock:
            if self._closed:
                raise ConnectionClosed(f"{self._name}: connection is closed")
            try:
                for frame in frames:
                    self._writer.write(frame)
                await self._writer.drain()
            except OSError as exc:
                self._shutdown(exc)
                raise ConnectionClosed(f"{self._name}: write failed: {exc}") from exc

    def _allocate_stream_id(self) -> int:
        sid = self._next_stream_id
        if sid > _U32_MAX:
            raise TtrpcError(f"{self._name}: client stream ids exhausted")
        self._next_stream_id += 2
        return sid

    def _spawn(self, coro: Coroutine[Any, Any, None], sid: int) -> None:
        if self._closed:
            coro.close()  # nothing could be delivered anyway
            return
        task = asyncio.get_running_loop().create_task(coro, name=f"{self._name}:stream-{sid}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # _serve maps handler errors itself; reaching here is our bug.
            logger.error("%s: %s crashed", self._name, task.get_name(), exc_info=exc)

    def _shutdown(self, reason: BaseException | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        text = f"{self._name}: connection closed" + (f": {reason}" if reason is not None else "")
        for future in self._pending.values():
            if not future.done():
                error = ConnectionClosed(text)
                error.__cause__ = reason
                future.set_exception(error)
        self._pending.clear()
        current = asyncio.current_task()
        for task in (*self._tasks, self._reader_task):
            if task is not None and task is not current:
                task.cancel()
        self._writer.close()
        self._closed_event.set()
        logger.info("%s", text)
