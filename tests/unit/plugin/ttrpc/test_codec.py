from __future__ import annotations

import pytest

from nri_gpu.plugin._proto import ttrpc_pb2
from nri_gpu.plugin.ttrpc import (
    Code,
    Message,
    MessageType,
    ProtocolError,
    decode_request,
    decode_response,
    encode_message,
    encode_mux,
    encode_request,
    encode_response,
)


def on_the_wire(conn_id: int, message: Message) -> bytes:
    return b"".join(encode_mux(conn_id, encode_message(message)))


def test_request_round_trip() -> None:
    data = encode_request("svc.Name", "Method", b"\x00\x01payload", timeout_ns=123, metadata=[("k", "v"), ("k", "w")])
    request = decode_request(data)
    assert request.service == "svc.Name"
    assert request.method == "Method"
    assert request.payload == b"\x00\x01payload"
    assert request.timeout_nano == 123
    assert [(kv.key, kv.value) for kv in request.metadata] == [("k", "v"), ("k", "w")]


def test_register_plugin_request_matches_spec_section_13() -> None:
    # nri-protocol.md §13, laid out as the spec lays it out.
    expected = (
        bytes.fromhex("00 00 00 02  00 00 00 4c")  # mux: conn 2, 76 payload bytes
        + bytes.fromhex("00 00 00 42  00 00 00 01  01  00")  # ttrpc: L=66, stream 1, Request
        + bytes.fromhex("0a 1c") + b"nri.pkg.api.v1alpha1.Runtime"
        + bytes.fromhex("12 0e") + b"RegisterPlugin"
        + bytes.fromhex("1a 0c 0a 06") + b"devinj" + bytes.fromhex("12 02") + b"10"
        + bytes.fromhex("20 80 a8 d6 b9 07")
    )  # fmt: skip
    body = encode_request(
        "nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"\n\x06devinj\x12\x0210", timeout_ns=2_000_000_000
    )
    assert on_the_wire(2, Message(1, MessageType.REQUEST, 0, body)) == expected


def test_empty_success_reply_matches_spec_section_13() -> None:
    body = encode_response()
    assert body == b""  # status omitted on success, like Go
    wire = on_the_wire(2, Message(1, MessageType.RESPONSE, 0, body))
    assert wire == bytes.fromhex("00 00 00 02 00 00 00 0a 00 00 00 00 00 00 00 01 02 00")
    assert decode_response(body) == (b"", Code.OK, "")


def test_error_reply_matches_spec_section_13() -> None:
    text = "invalid plugin index: x"
    body = encode_response(status=(Code.UNKNOWN, text))
    assert body == bytes([0x0A, len(text) + 4, 0x08, 0x02, 0x12, len(text)]) + text.encode()
    assert decode_response(body) == (b"", Code.UNKNOWN, text)


def test_configure_reply_payload_matches_spec_section_13() -> None:
    body = encode_response(b"\x10\x88\x08")
    assert body == bytes.fromhex("12 03 10 88 08")
    assert decode_response(body) == (b"\x10\x88\x08", Code.OK, "")


def test_explicit_ok_status_is_omitted() -> None:
    assert encode_response(b"x", (Code.OK, "ignored")) == encode_response(b"x")


def test_status_present_with_code_zero_decodes_as_ok() -> None:
    # Go treats `status != nil && code == 0` as success; so must we.
    body = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=0, message=""), payload=b"p").SerializeToString()
    assert decode_response(body) == (b"p", Code.OK, "")


def test_unknown_status_number_becomes_unknown_and_keeps_the_number() -> None:
    body = ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=99, message="odd")).SerializeToString()
    _payload, code, message = decode_response(body)
    assert code is Code.UNKNOWN
    assert "99" in message
    assert "odd" in message


GARBAGE = {
    "bad-varint": b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    "truncated-field": b"\x0a\x10abc",
    "bad-utf8-string": b"\x0a\x02\xff\xfe",
    "wire-type-7": b"\x0f",
}


@pytest.mark.parametrize("data", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_request_raises_protocol_error_quoting_it(data: bytes) -> None:
    with pytest.raises(ProtocolError, match=data[:2].hex(" ")):
        decode_request(data)


@pytest.mark.parametrize("data", [GARBAGE["bad-varint"], GARBAGE["truncated-field"], b"\x12\x05ab"], ids=str)
def test_garbage_response_raises_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="Response"):
        decode_response(data)
