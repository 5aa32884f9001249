"""Generic ttrpc transport over the NRI multiplexed trunk.

Knows nothing of NRI: it moves opaque request and reply payloads between a
ttrpc client and server that share one unix stream socket. Only
``connection`` does I/O; ``frames``, ``mux`` and ``codec`` are pure.
"""

from nri_gpu.plugin.ttrpc.codec import decode_request, decode_response, encode_request, encode_response
from nri_gpu.plugin.ttrpc.connection import Handler, InboundRequest, MuxConnection
from nri_gpu.plugin.ttrpc.errors import (
    Code,
    ConnectionClosed,
    MessageTooLarge,
    ProtocolError,
    StatusError,
    TtrpcError,
    Unimplemented,
)
from nri_gpu.plugin.ttrpc.frames import (
    HEADER_SIZE,
    MAX_MESSAGE,
    Message,
    MessageDecoder,
    MessageType,
    Oversized,
    encode_message,
)
from nri_gpu.plugin.ttrpc.mux import GO_READ_SIZE, MAX_INBOUND_FRAME, MUX_HEADER_SIZE, Demux, encode_mux

__all__ = [
    "GO_READ_SIZE",
    "HEADER_SIZE",
    "MAX_INBOUND_FRAME",
    "MAX_MESSAGE",
    "MUX_HEADER_SIZE",
    "Code",
    "ConnectionClosed",
    "Demux",
    "Handler",
    "InboundRequest",
    "Message",
    "MessageDecoder",
    "MessageTooLarge",
    "MessageType",
    "MuxConnection",
    "Oversized",
    "ProtocolError",
    "StatusError",
    "TtrpcError",
    "Unimplemented",
    "decode_request",
    "decode_response",
    "encode_message",
    "encode_mux",
    "encode_request",
    "encode_response",
]
