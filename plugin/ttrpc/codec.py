"""The ttrpc Request/Response envelopes, to and from bytes.  (pure)

Theory of operation: the data of every ttrpc REQUEST message is a serialized
``Request{service, method, payload, timeout_nano, metadata}``; the data of a
RESPONSE is ``Response{status, payload}``. The RPC's own messages travel as
opaque bytes in ``payload``, so this layer never needs to know them.

Wire habits copied from Go, because the peer is Go:

* a success reply omits ``status``; an ``Empty`` success reply is therefore
  zero bytes long;
* an error reply carries only ``status`` (no payload);
* ``timeout_nano`` 0 means "no deadline".

Decoders raise ``ProtocolError`` quoting the first bytes of the garbage.

Pure module: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import DecodeError

from nri_gpu.plugin._proto import ttrpc_pb2
from nri_gpu.plugin.ttrpc.errors import Code, ProtocolError

__all__ = ["decode_request", "decode_response", "encode_request", "encode_response"]

# How much of a bad message to quote in an error: enough to recognise it.
_QUOTE_BYTES = 32


def encode_request(
    service: str,
    method: str,
    payload: bytes,
    timeout_ns: int = 0,
    metadata: Iterable[tuple[str, str]] = (),
) -> bytes:
    """Serialize a Request envelope."""
    request = ttrpc_pb2.Request(
        service=service,
        method=method,
        payload=payload,
        timeout_nano=timeout_ns,
        metadata=[ttrpc_pb2.KeyValue(key=key, value=value) for key, value in metadata],
    )
    return request.SerializeToString(deterministic=True)


def decode_request(data: bytes) -> ttrpc_pb2.Request:
    """Parse a Request envelope. Raises ProtocolError if ``data`` is not one."""
    request = ttrpc_pb2.Request()
    try:
        request.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"bad ttrpc Request ({exc}): {_quote(data)}") from exc
    return request


def encode_response(payload: bytes = b"", status: tuple[Code, str] | None = None) -> bytes:
    """Serialize a Response envelope; ``status`` None or OK means success."""
    response = ttrpc_pb2.Response(payload=payload)
    if status is not None and status[0] != Code.OK:
        code, message = status
        response.status.code = int(code)
        response.status.message = message
    return response.SerializeToString(deterministic=True)


def decode_response(data: bytes) -> tuple[bytes, Code, str]:
    """Parse a Response envelope into (payload, code, message).

    A code outside the known range becomes UNKNOWN with the number kept in the
    message, so callers can rely on a ``Code``. Raises ProtocolError on garbage.
    """
    response = ttrpc_pb2.Response()
    try:
        response.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"bad ttrpc Response ({exc}): {_quote(data)}") from exc
    if not response.HasField("status"):
        return response.payload, Code.OK, ""
    number = response.status.code
    message = response.status.message
    try:
        code = Code(number)
    except ValueError:
        code, message = Code.UNKNOWN, f"(status code {number}) {message}"
    return response.payload, code, message


def _quote(data: bytes) -> str:
    head = bytes(data[:_QUOTE_BYTES]).hex(" ")
    more = f"... ({len(data)} bytes)" if len(data) > _QUOTE_BYTES else ""
    return f"{head}{more}" if data else "(empty)"
