"""Fuzzing the ttrpc Request/Response envelopes (``plugin.ttrpc.codec``) and the sans-IO pipeline.

``decode_request`` and ``decode_response`` must turn any bytes (truncated,
bit-flipped, with lengths and varints past every limit) into a value or a
``ProtocolError`` with a short message; a valid envelope round-trips. The
pipeline test feeds a whole trunk through ``Demux``, ``MessageDecoder`` and
the codec, as the connection's reader does: only ``TtrpcError`` may come out.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.plugin._proto import ttrpc_pb2
from nri_gpu.plugin.ttrpc.codec import decode_request, decode_response, encode_request, encode_response
from nri_gpu.plugin.ttrpc.errors import Code, ProtocolError, TtrpcError
from nri_gpu.plugin.ttrpc.frames import Message, MessageDecoder, MessageType, encode_message
from nri_gpu.plugin.ttrpc.mux import Demux, encode_mux
from tests.fuzz.support import fuzz, mutated, typed, varint

TEXT = st.text(max_size=24)
REQUESTS = st.builds(
    encode_request,
    service=TEXT,
    method=TEXT,
    payload=st.binary(max_size=64),
    timeout_ns=st.one_of(st.just(0), st.integers(0, 2**63 - 1)),
    metadata=st.lists(st.tuples(TEXT, TEXT), max_size=3),
)
STATUS = st.one_of(st.none(), st.tuples(st.sampled_from(list(Code)), TEXT))
RESPONSES = st.builds(encode_response, payload=st.binary(max_size=64), status=STATUS)
ENVELOPES = st.one_of(REQUESTS, RESPONSES)
# Field 3 (payload, bytes) claiming far more bytes than follow; a status code past int32.
HUGE_LENGTH = b"\x1a" + varint(2**32 + 5) + b"abc"
BIG_CODE = b"\x0a\x0b\x08" + varint(2**40) + b"\x12\x04boom"


def check_request(data: bytes) -> None:
    got = typed(ProtocolError, decode_request, data)
    if isinstance(got, ProtocolError):
        assert len(str(got)) < 1000, "the error quotes too much"
    else:
        assert isinstance(got, ttrpc_pb2.Request)


def check_response(data: bytes) -> None:
    got = typed(ProtocolError, decode_response, data)
    if isinstance(got, ProtocolError):
        assert len(str(got)) < 1000, "the error quotes too much"
    else:
        payload, code, message = got
        assert isinstance(payload, bytes) and isinstance(code, Code) and isinstance(message, str)


@fuzz(500)
@given(data=st.one_of(st.binary(max_size=512), mutated(ENVELOPES)))
@example(data=HUGE_LENGTH)
@example(data=BIG_CODE)
@example(data=b"\xff" * 11)
@example(data=b"\x0a\x02\xc3\x28")  # service: invalid UTF-8
def test_arbitrary_and_mutated_envelopes(data: bytes) -> None:
    check_request(data)
    check_response(data)


@fuzz(300)
@given(
    service=TEXT,
    method=TEXT,
    payload=st.binary(max_size=64),
    timeout=st.integers(0, 2**63 - 1),
    metadata=st.lists(st.tuples(TEXT, TEXT), max_size=3),
    status=STATUS,
)
def test_valid_envelopes_round_trip(
    service: str,
    method: str,
    payload: bytes,
    timeout: int,
    metadata: list[tuple[str, str]],
    status: tuple[Code, str] | None,
) -> None:
    request = decode_request(encode_request(service, method, payload, timeout, metadata))
    assert (request.service, request.method, request.payload, request.timeout_nano) == (
        service,
        method,
        payload,
        timeout,
    )
    assert [(kv.key, kv.value) for kv in request.metadata] == metadata
    if status is None or status[0] is Code.OK:
        assert decode_response(encode_response(payload, status)) == (payload, Code.OK, "")
    else:
        assert decode_response(encode_response(payload, status)) == (payload, *status)


def _trunk(items: list[tuple[int, int, bytes]]) -> bytes:
    out = b""
    for conn, mtype, body in items:
        out += b"".join(encode_mux(conn, encode_message(Message(1, mtype, 0, body))))
    return out


TRUNKS = st.lists(
    st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3, 9]), mutated(ENVELOPES, max_ops=2)), max_size=4
).map(_trunk)


def pipeline(data: bytes) -> None:
    demux = Demux()
    decoders = {1: MessageDecoder(), 2: MessageDecoder()}
    for conn, piece in demux.feed(data):
        if conn not in decoders:
            continue
        for event in decoders[conn].feed(piece):
            if isinstance(event, Message) and event.type == MessageType.REQUEST:
                check_request(event.data)
            elif isinstance(event, Message) and event.type == MessageType.RESPONSE:
                check_response(event.data)


@fuzz(400)
@given(data=st.one_of(mutated(TRUNKS), TRUNKS, st.binary(max_size=256)))
def test_trunk_through_demux_decoder_and_codec(data: bytes) -> None:
    typed(TtrpcError, pipeline, data)
