"""Shared helpers for the ttrpc transport tests: chunking, an asyncio runner,
a connected MuxConnection pair and a raw byte-level peer."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager, suppress
from typing import Any, TypeVar

from nri_gpu.plugin.ttrpc import (
    Handler,
    Message,
    MessageDecoder,
    MessageType,
    MuxConnection,
    Oversized,
    encode_message,
    encode_mux,
    encode_request,
)
from nri_gpu.plugin.ttrpc.mux import MUX_HEADER_SIZE

T = TypeVar("T")

# Every decoding test runs these three ways (style.md, habit 3).
CHUNKINGS = ["whole", "bytewise", "random"]

# The plugin side of NRI serves conn 1 and calls on conn 2; a runtime mirrors it.
PLUGIN_CONNS = {"serve_conn": 1, "call_conn": 2}
RUNTIME_CONNS = {"serve_conn": 2, "call_conn": 1}


def split(data: bytes, how: str, seed: int = 0, max_chunk: int = 64) -> list[bytes]:
    """Cut ``data`` into the pieces a transport might deliver."""
    if how == "whole":
        return [data]
    if how == "bytewise":
        return [data[i : i + 1] for i in range(len(data))]
    if how == "random":
        rng = random.Random(seed)
        pieces = []
        pos = 0
        while pos < len(data):
            size = rng.randint(1, max_chunk)
            pieces.append(data[pos : pos + size])
            pos += size
        return pieces
    raise ValueError(how)


def run(coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
    """Run a test coroutine; the outer timeout turns a hang into a failure."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@asynccontextmanager
async def connection_pair(
    plugin_handler: Handler | None = None, runtime_handler: Handler | None = None
) -> AsyncIterator[tuple[MuxConnection, MuxConnection]]:
    """A plugin-side and a runtime-side MuxConnection over a socketpair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    plugin = await MuxConnection.from_socket(a, handler=plugin_handler, name="plugin", **PLUGIN_CONNS)
    runtime = await MuxConnection.from_socket(b, handler=runtime_handler, name="runtime", **RUNTIME_CONNS)
    try:
        yield plugin, runtime
    finally:
        await plugin.close()
        await runtime.close()


class RawPeer:
    """The far end of a trunk, spoken byte by byte: sees mux frames exactly as sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoders: dict[int, MessageDecoder] = {}
        self._ready: dict[int, list[Message | Oversized]] = {}

    @classmethod
    async def open(cls, sock: socket.socket) -> RawPeer:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send(self, conn_id: int, message: Message) -> None:
        await self.send_raw(b"".join(encode_mux(conn_id, encode_message(message))))

    async def send_request(
        self, conn_id: int, stream_id: int, method: str, payload: bytes = b"", timeout_ns: int = 0
    ) -> None:
        body = encode_request("test.Service", method, payload, timeout_ns)
        await self.send(conn_id, Message(stream_id, MessageType.REQUEST, 0, body))

    async def read_frame(self) -> tuple[int, bytes]:
        """One mux frame, boundaries preserved: (conn id, payload)."""
        header = await self.reader.readexactly(MUX_HEADER_SIZE)
        conn_id = int.from_bytes(header[:4], "big")
        length = int.from_bytes(header[4:], "big")
        return conn_id, await self.reader.readexactly(length)

    async def read_message(self, conn_id: int) -> Message | Oversized:
        """The next whole ttrpc message on ``conn_id`` (other conns are kept)."""
        ready = self._ready.setdefault(conn_id, [])
        while not ready:
            got_conn, payload = await self.read_frame()
            decoder = self._decoders.setdefault(got_conn, MessageDecoder())
            self._ready.setdefault(got_conn, []).extend(decoder.feed(payload))
        return ready.pop(0)

    async def close(self) -> None:
        self.writer.close()
        with suppress(OSError):
            await self.writer.wait_closed()


@asynccontextmanager
async def raw_pair(
    handler: Handler | None = None, *, serve_conn: int = 1, call_conn: int = 2
) -> AsyncIterator[tuple[MuxConnection, RawPeer]]:
    """A MuxConnection whose peer is a RawPeer."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = await MuxConnection.from_socket(a, serve_conn=serve_conn, call_conn=call_conn, handler=handler, name="uut")
    peer = await RawPeer.open(b)
    try:
        yield conn, peer
    finally:
        await conn.close()
        await peer.close()
