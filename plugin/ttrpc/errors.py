"""Status codes and the exception family of the ttrpc transport.  (pure)

Theory of operation: every failure the transport can report belongs to one of
three kinds, and callers react differently to each, so each has its own class:

* ``ProtocolError``: the peer sent bytes we cannot make sense of. The message
  quotes the offending value so a log line is enough to debug the peer.
* ``ConnectionClosed``: the trunk is gone; nothing more will be delivered.
* ``StatusError``: an RPC completed with a non-OK gRPC status. A client call
  raises it for the peer's error reply; a server handler raises it to choose
  the status of its own reply (the connection maps it onto the wire).

Pure module: no I/O.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "Code",
    "ConnectionClosed",
    "MessageTooLarge",
    "ProtocolError",
    "StatusError",
    "TtrpcError",
    "Unimplemented",
]


class Code(IntEnum):
    """gRPC status codes; ttrpc reuses them unchanged in ``Status.code``."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class TtrpcError(Exception):
    """Base of every error raised by ``plugin.ttrpc``."""


class ProtocolError(TtrpcError):
    """The peer sent malformed bytes (the message quotes the bad value)."""


class MessageTooLarge(ProtocolError):
    """A ttrpc message is over the size limit.

    Raised when encoding an outbound message; inbound ones are reported as
    ``frames.Oversized`` events instead, because the connection must survive
    them. The text is Go ttrpc's, since it ends up in replies the runtime logs.
    """

    def __init__(self, stream_id: int, length: int, limit: int) -> None:
        super().__init__(f"message length {length} exceed maximum message size of {limit}")
        self.stream_id = stream_id
        self.length = length
        self.limit = limit


class ConnectionClosed(TtrpcError):
    """The connection is closed (peer EOF, I/O error or a local ``close()``)."""


class StatusError(TtrpcError):
    """An RPC failed with a non-OK status.

    Client side: raised by ``MuxConnection.call`` for an error reply.
    Server side: raise it from a handler to answer with exactly this status.
    """

    def __init__(self, code: Code | int, message: str = "") -> None:
        # Coerce so that ``code`` is always a Code, and refuse OK: an OK
        # "error" would go on the wire as a success with an empty payload.
        code = Code(code)
        if code is Code.OK:
            raise ValueError("StatusError needs a non-OK code")
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class Unimplemented(StatusError):
    """Raise from a handler for an unknown service or method.

    Go's wording is ``service <name>`` or ``method <name>``; NRI runtimes
    (v0.12+) probe newer RPCs and fall back only on this exact code.
    """

    def __init__(self, message: str) -> None:
        super().__init__(Code.UNIMPLEMENTED, message)
