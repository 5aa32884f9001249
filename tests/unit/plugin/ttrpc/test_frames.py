from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpu.plugin.ttrpc import (
    HEADER_SIZE,
    MAX_MESSAGE,
    Message,
    MessageDecoder,
    MessageTooLarge,
    MessageType,
    Oversized,
    encode_message,
)

from .support import CHUNKINGS, split


def decode(data: bytes, how: str, decoder: MessageDecoder | None = None) -> list[Message | Oversized]:
    decoder = decoder or MessageDecoder()
    events: list[Message | Oversized] = []
    for piece in split(data, how, max_chunk=4096):
        events.extend(decoder.feed(piece))
    assert decoder.buffered == 0, "a complete stream must leave nothing buffered"
    return events


def sample_messages() -> list[Message]:
    rng = random.Random(1)
    return [
        Message(2 * i + 1, rng.choice(list(MessageType)), rng.randrange(256), rng.randbytes(rng.randrange(300)))
        for i in range(40)
    ] + [Message(99, MessageType.RESPONSE, 0, b"")]


def test_header_layout() -> None:
    wire = encode_message(Message(0x01020304, MessageType.RESPONSE, 0x05, b"abc"))
    assert wire == bytes.fromhex("00000003 01020304 02 05") + b"abc"


def test_max_message_is_4_mib() -> None:
    assert MAX_MESSAGE == 4 * 1024 * 1024
    assert HEADER_SIZE == 10


@pytest.mark.parametrize("how", CHUNKINGS)
def test_round_trip_of_many_messages(how: str) -> None:
    messages = sample_messages()
    wire = b"".join(encode_message(m) for m in messages)
    assert decode(wire, how) == messages


@pytest.mark.parametrize("how", CHUNKINGS)
def test_empty_message_completes_with_its_header(how: str) -> None:
    # An Empty reply is a message with L = 0: it must not wait for more bytes.
    wire = bytes.fromhex("00000000 00000001 02 00")
    assert decode(wire, how) == [Message(1, MessageType.RESPONSE, 0, b"")]


@pytest.mark.parametrize("how", CHUNKINGS)
def test_unknown_type_is_passed_through_raw(how: str) -> None:
    wire = encode_message(Message(5, 0x7F, 0x03, b"?")) + encode_message(Message(7, 1, 0, b"ok"))
    events = decode(wire, how)
    assert events == [Message(5, 0x7F, 3, b"?"), Message(7, MessageType.REQUEST, 0, b"ok")]
    assert events[0].type == 0x7F


@pytest.mark.parametrize("how", CHUNKINGS)
def test_partial_message_is_held_until_complete(how: str) -> None:
    wire = encode_message(Message(1, MessageType.REQUEST, 0, b"x" * 100))
    decoder = MessageDecoder()
    events = []
    for piece in split(wire[:-1], how):
        events.extend(decoder.feed(piece))
    assert events == []
    assert decoder.buffered == len(wire) - 1 - HEADER_SIZE  # the header is parsed, not kept
    assert decoder.feed(wire[-1:]) == [Message(1, MessageType.REQUEST, 0, b"x" * 100)]


# The limit logic is tested twice: with a small limit so that every chunking,
# bytewise included, stays fast; and at the real 4 MiB limit (bytewise would
# take seconds there, so only whole and random).
LIMIT_CASES = [(how, 100) for how in CHUNKINGS] + [("whole", MAX_MESSAGE), ("random", MAX_MESSAGE)]
LIMIT_IDS = [f"{how}-{limit}" for how, limit in LIMIT_CASES]


@pytest.mark.parametrize(("how", "limit"), LIMIT_CASES, ids=LIMIT_IDS)
def test_message_exactly_at_limit_is_delivered(how: str, limit: int) -> None:
    msg = Message(3, MessageType.REQUEST, 0, bytes(limit))
    wire = encode_message(msg, max_message=limit)
    assert decode(wire, how, MessageDecoder(max_message=limit)) == [msg]


@pytest.mark.parametrize(("how", "limit"), LIMIT_CASES, ids=LIMIT_IDS)
def test_one_over_limit_is_skipped_unbuffered_and_decoding_continues(how: str, limit: int) -> None:
    body = b"\xab" * (limit + 1)
    oversized = (limit + 1).to_bytes(4, "big") + (9).to_bytes(4, "big") + bytes([1, 0]) + body
    following = Message(11, MessageType.REQUEST, 0, b"after")
    wire = oversized + encode_message(following)

    decoder = MessageDecoder(max_message=limit)
    events: list[Message | Oversized] = []
    peak = 0
    for piece in split(wire, how, seed=3, max_chunk=65536):
        events.extend(decoder.feed(piece))
        peak = max(peak, decoder.buffered)

    assert events == [Oversized(9, MessageType.REQUEST, limit + 1), following]
    # The body was dropped as it streamed past: never more than one header
    # plus the small following message was ever held.
    assert peak <= HEADER_SIZE + len(following.data)
    assert decoder.buffered == 0


@pytest.mark.parametrize("how", CHUNKINGS)
def test_oversized_is_reported_before_its_body_arrives(how: str) -> None:
    decoder = MessageDecoder(max_message=10)
    header = (1000).to_bytes(4, "big") + (5).to_bytes(4, "big") + bytes([2, 0])
    events = []
    for piece in split(header, how):
        events.extend(decoder.feed(piece))
    assert events == [Oversized(5, MessageType.RESPONSE, 1000)]
    assert decoder.feed(b"z" * 999) == []
    assert decoder.buffered == 0
    assert decoder.feed(b"z" + encode_message(Message(7, 2, 0, b""))) == [Message(7, 2, 0, b"")]


def test_encode_rejects_data_over_the_limit() -> None:
    encode_message(Message(1, MessageType.RESPONSE, 0, bytes(MAX_MESSAGE)))  # at the limit: fine
    with pytest.raises(MessageTooLarge) as info:
        encode_message(Message(3, MessageType.RESPONSE, 0, bytes(MAX_MESSAGE + 1)))
    assert (info.value.stream_id, info.value.length) == (3, MAX_MESSAGE + 1)


@pytest.mark.parametrize(
    ("stream_id", "mtype", "flags"),
    [(-1, 1, 0), (2**32, 1, 0), (1, 256, 0), (1, -1, 0), (1, 1, 256), (1, 1, -1)],
    ids=["sid-neg", "sid-big", "type-big", "type-neg", "flags-big", "flags-neg"],
)
def test_message_rejects_out_of_range_fields(stream_id: int, mtype: int, flags: int) -> None:
    with pytest.raises(ValueError):
        Message(stream_id, mtype, flags, b"")


messages_strategy = st.lists(
    st.builds(
        Message,
        stream_id=st.integers(0, 2**32 - 1),
        type=st.integers(0, 255),
        flags=st.integers(0, 255),
        data=st.binary(max_size=10 * 1024),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(messages=messages_strategy, seed=st.integers(0, 2**32), max_chunk=st.integers(1, 20000))
def test_property_encode_split_decode_is_identity(messages: list[Message], seed: int, max_chunk: int) -> None:
    wire = b"".join(encode_message(m) for m in messages)
    decoder = MessageDecoder()
    events: list[Message | Oversized] = []
    for piece in split(wire, "random", seed=seed, max_chunk=max_chunk):
        events.extend(decoder.feed(piece))
    assert events == messages
    assert decoder.buffered == 0
