"""ttrpc message framing: a 10-byte header and a body, sans I/O.  (pure)

Theory of operation: one logical ttrpc connection is a byte stream of
messages, each laid out as::

    [u32 BE length L][u32 BE stream id][u8 type][u8 flags][L bytes of data]

``encode_message`` turns a ``Message`` into those bytes. ``MessageDecoder``
does the reverse incrementally: ``feed()`` takes bytes in whatever pieces the
transport delivers and returns every event completed by them, in order.

The decoder is a three-state machine (reading a header, reading a body,
skipping a body). It never holds more than one header plus the body of the
message in progress, so the memory used is bounded by ``max_message``:

* A body longer than ``max_message`` (Go: 4 MiB) is not buffered at all. The
  decoder reports ``Oversized`` as soon as the header is complete, then drops
  the body bytes as they arrive. Go answers such a message with
  RESOURCE_EXHAUSTED on its stream and keeps the connection, and the caller
  needs only the header to do the same.
* Unknown message types are passed up with their raw integer type, because
  Go ignores them rather than failing the connection; the caller decides.

Pure module: no I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from nri_gpu.plugin.ttrpc.errors import MessageTooLarge

__all__ = [
    "HEADER_SIZE",
    "MAX_MESSAGE",
    "Message",
    "MessageDecoder",
    "MessageType",
    "Oversized",
    "encode_message",
]

HEADER_SIZE = 10
# Go ttrpc's limit on the data length L (the header is not counted).
MAX_MESSAGE = 4 * 1024 * 1024

_HEADER = struct.Struct(">IIBB")
_U32_MAX = 0xFFFFFFFF


class MessageType(IntEnum):
    REQUEST = 1
    RESPONSE = 2
    DATA = 3


@dataclass(frozen=True, slots=True)
class Message:
    """One ttrpc message. ``type`` is a plain int so unknown types survive."""

    stream_id: int
    type: int
    flags: int
    data: bytes

    def __post_init__(self) -> None:
        # Checked here so a bad value fails where it is made, not as a
        # struct.error deep inside the writer.
        if not 0 <= self.stream_id <= _U32_MAX:
            raise ValueError(f"stream id {self.stream_id!r} is not a u32")
        if not 0 <= self.type <= 0xFF:
            raise ValueError(f"message type {self.type!r} is not a u8")
        if not 0 <= self.flags <= 0xFF:
            raise ValueError(f"flags {self.flags!r} is not a u8")


@dataclass(frozen=True, slots=True)
class Oversized:
    """An inbound message over the limit; its body was discarded unread."""

    stream_id: int
    type: int
    length: int


def encode_message(msg: Message, max_message: int = MAX_MESSAGE) -> bytes:
    """Return header + data of ``msg``.

    Raises MessageTooLarge if the data exceeds ``max_message``: Go ttrpc
    discards such a message and our reply or request would never arrive.
    """
    length = len(msg.data)
    if length > max_message:
        raise MessageTooLarge(msg.stream_id, length, max_message)
    return _HEADER.pack(length, msg.stream_id, msg.type, msg.flags) + msg.data


class MessageDecoder:
    """Incremental decoder for one logical connection's byte stream."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._max = max_message
        self._header = bytearray()
        # Set while a body is being read: (stream id, type, flags, length).
        self._current: tuple[int, int, int, int] | None = None
        self._body = bytearray()
        self._skip = 0

    @property
    def buffered(self) -> int:
        """Bytes held for a message not yet complete (never an oversized body)."""
        return len(self._header) + len(self._body)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message | Oversized]:
        """Consume ``data``; return the events it completes, in stream order."""
        events: list[Message | Oversized] = []
        view = memoryview(data)
        pos = 0
        end = len(view)
        while pos < end:
            if self._skip:
                taken = min(self._skip, end - pos)
                self._skip -= taken
                pos += taken
            elif self._current is None:
                pos = self._read_header(view, pos, events)
            else:
                pos = self._read_body(view, pos, events)
        return events

    def _read_header(self, view: memoryview, pos: int, events: list[Message | Oversized]) -> int:
        want = HEADER_SIZE - len(self._header)
        chunk = view[pos : pos + want]
        self._header += chunk
        pos += len(chunk)
        if len(self._header) < HEADER_SIZE:
            return pos
        length, stream_id, mtype, flags = _HEADER.unpack(self._header)
        self._header.clear()
        if length > self._max:
            events.append(Oversized(stream_id, mtype, length))
            self._skip = length
        elif length == 0:
            # Legal and common: a successful reply whose message is Empty.
            events.append(Message(stream_id, mtype, flags, b""))
        else:
            self._current = (stream_id, mtype, flags, length)
        return pos

    def _read_body(self, view: memoryview, pos: int, events: list[Message | Oversized]) -> int:
        assert self._current is not None
        stream_id, mtype, flags, length = self._current
        want = length - len(self._body)
        if not self._body and len(view) - pos >= want:
            # Fast path: the whole body is in this chunk, copy it only once.
            data = bytes(view[pos : pos + want])
            pos += want
        else:
            chunk = view[pos : pos + want]
            self._body += chunk
            pos += len(chunk)
            if len(self._body) < length:
                return pos
            data = bytes(self._body)
            self._body.clear()
        self._current = None
        events.append(Message(stream_id, mtype, flags, data))
        return pos
