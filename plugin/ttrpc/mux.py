"""NRI trunk multiplexer framing, sans I/O.  (pure)

Theory of operation: NRI runs two logical ttrpc connections over one unix
stream (the "trunk"). Every piece of a logical connection's bytes travels in a
frame::

    [u32 BE conn id][u32 BE payload length N][N bytes of payload]

There are no open, close or flow-control frames.

Receiving: frame boundaries mean nothing; the payloads of one conn id
concatenate into that connection's byte stream. ``Demux.feed`` therefore hands
out payload pieces as soon as they arrive and buffers nothing but a partial
8-byte header, so a huge frame costs no memory here (the ttrpc decoder above
enforces the message limit). A header claiming an absurd length still raises
``ProtocolError``: no legitimate writer produces one, and after it the stream
cannot be trusted.

Sending is constrained by the Go reader on the other end, which hands out one
whole frame per read and fails (dropping the plugin) if the frame is bigger
than the buffer its ttrpc layer offers: 4096 bytes at the start of a message,
exactly the remaining length after that. Hence ``encode_mux``, per message:
one frame if it fits in 4096 bytes, else exactly ``M[:4096]`` and ``M[4096:]``;
never two messages in one frame, never an empty frame. The two-frame split
also keeps us far below the Go mux's 256-queued-frames-per-conn limit.

Pure module: no I/O.
"""

from __future__ import annotations

import struct

from nri_gpu.plugin.ttrpc.errors import ProtocolError

__all__ = ["GO_READ_SIZE", "MAX_INBOUND_FRAME", "MUX_HEADER_SIZE", "Demux", "encode_mux"]

MUX_HEADER_SIZE = 8
# Size of the bufio.Reader between Go's mux and its ttrpc channel.
GO_READ_SIZE = 4096
# Go v0.6.1 writes frames of up to 16 MiB, later versions at most one
# ttrpc message (10 bytes + 4 MiB). Anything beyond both is garbage.
MAX_INBOUND_FRAME = 16 * 1024 * 1024 + 4 * 1024 * 1024

_HEADER = struct.Struct(">II")
_U32_MAX = 0xFFFFFFFF


def encode_mux(conn_id: int, message: bytes) -> list[bytes]:
    """Return the mux frames (header + payload each) that carry one ttrpc message.

    ``message`` must be exactly one whole ttrpc message (header and data).
    Raises ValueError for a conn id outside 1..2**32-1 (0 is reserved) or an
    empty message.
    """
    if not 1 <= conn_id <= _U32_MAX:
        raise ValueError(f"mux conn id {conn_id!r} is not in 1..{_U32_MAX}")
    if not message:
        raise ValueError("refusing to send an empty mux frame")
    if len(message) <= GO_READ_SIZE:
        return [_HEADER.pack(conn_id, len(message)) + message]
    head, tail = message[:GO_READ_SIZE], message[GO_READ_SIZE:]
    if len(tail) > _U32_MAX:
        raise ValueError(f"message of {len(message)} bytes does not fit a mux frame")
    return [_HEADER.pack(conn_id, len(head)) + head, _HEADER.pack(conn_id, len(tail)) + tail]


class Demux:
    """Incremental splitter of the trunk byte stream into (conn id, payload) pieces.

    After ``feed`` raised ProtocolError the stream is out of sync and the
    demuxer must not be fed again.
    """

    def __init__(self, max_frame: int = MAX_INBOUND_FRAME) -> None:
        self._max = max_frame
        self._header = bytearray()
        self._conn_id = 0
        self._remaining = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        """Consume ``data``; return payload pieces in arrival order.

        Raises ProtocolError if a frame header claims more than ``max_frame``.
        """
        pieces: list[tuple[int, bytes]] = []
        view = memoryview(data)
        pos = 0
        end = len(view)
        while pos < end:
            if self._remaining:
                taken = min(self._remaining, end - pos)
                pieces.append((self._conn_id, bytes(view[pos : pos + taken])))
                self._remaining -= taken
                pos += taken
                continue
            chunk = view[pos : pos + MUX_HEADER_SIZE - len(self._header)]
            self._header += chunk
            pos += len(chunk)
            if len(self._header) == MUX_HEADER_SIZE:
                conn_id, length = _HEADER.unpack(self._header)
                self._header.clear()
                if length > self._max:
                    raise ProtocolError(f"mux frame for conn {conn_id} claims {length} bytes, more than {self._max}")
                # A zero-length frame leaves _remaining at 0: skipped.
                self._conn_id = conn_id
                self._remaining = length
        return pieces
