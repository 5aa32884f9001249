"""Fuzzing the ttrpc message decoder (``plugin.ttrpc.frames``).

The decoder has no error path of its own: whatever the bytes, it must return
``Message`` and ``Oversized`` events, hold at most one header plus one body of
at most ``max_message`` bytes, and give the same events however the bytes are
cut into pieces. Any exception is a failure (a ``TtrpcError`` would be typed,
but the decoder documents none).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.plugin.ttrpc.errors import TtrpcError
from nri_gpu.plugin.ttrpc.frames import (
    HEADER_SIZE,
    MAX_MESSAGE,
    Message,
    MessageDecoder,
    MessageType,
    Oversized,
    encode_message,
)
from tests.fuzz.support import CUTS, cut, fuzz, mutated, typed

Event = Message | Oversized

# Small limits make "just over the limit" cheap to reach; MAX_MESSAGE is the real one.
LIMITS = st.sampled_from([MAX_MESSAGE, 0, 1, 9, 10, 64, 255, 256])
MESSAGES = st.builds(
    Message,
    stream_id=st.one_of(st.sampled_from([0, 1, 2, 3, 0xFFFFFFFF]), st.integers(0, 0xFFFFFFFF)),
    type=st.one_of(st.sampled_from(list(MessageType)), st.integers(0, 0xFF)),
    flags=st.integers(0, 0xFF),
    data=st.one_of(st.binary(max_size=64), st.integers(0, 300).map(lambda n: bytes([n & 0xFF]) * n)),
)
STREAMS = st.lists(MESSAGES, max_size=6).map(lambda msgs: b"".join(encode_message(m) for m in msgs))


def decode(pieces: Sequence[bytes], limit: int) -> list[Event]:
    """Feed ``pieces`` one by one, checking the memory bound after each; return every event."""
    decoder = MessageDecoder(limit)
    events: list[Event] = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
        assert decoder.buffered <= HEADER_SIZE + limit, f"holds {decoder.buffered} bytes with a {limit}-byte limit"
    return events


def check(data: bytes, cuts: Sequence[int], limit: int) -> list[Event]:
    whole = typed(TtrpcError, decode, [data], limit)
    pieces = typed(TtrpcError, decode, cut(data, cuts), limit)
    assert not isinstance(whole, BaseException) and not isinstance(pieces, BaseException), "the decoder raised"
    assert whole == pieces, "the events depend on how the bytes were cut"
    for event in whole:
        if isinstance(event, Message):
            assert len(event.data) <= limit
        else:
            assert event.length > limit
    return whole


@fuzz(400)
@given(data=st.binary(max_size=2048), cuts=CUTS, limit=LIMITS)
@example(data=struct.pack(">IIBB", 0xFFFFFFFF, 1, 1, 0) + b"x" * 100, cuts=[11], limit=MAX_MESSAGE)
@example(data=struct.pack(">IIBB", MAX_MESSAGE + 1, 1, 1, 0) + b"x" * 10, cuts=[], limit=MAX_MESSAGE)
@example(data=struct.pack(">IIBB", 65, 1, 1, 0) + b"x" * 70 + b"\0" * 10, cuts=[3, 40], limit=64)
def test_arbitrary_bytes(data: bytes, cuts: list[int], limit: int) -> None:
    check(data, cuts, limit)


@fuzz(400)
@given(data=mutated(STREAMS, words=[64, 65, 255, 256, 257]), cuts=CUTS, limit=LIMITS)
def test_mutated_streams(data: bytes, cuts: list[int], limit: int) -> None:
    check(data, cuts, limit)


@fuzz(300)
@given(messages=st.lists(MESSAGES, max_size=6), cuts=CUTS, limit=LIMITS)
def test_valid_streams_decode_exactly_and_oversized_ones_keep_the_stream_in_sync(
    messages: list[Message], cuts: list[int], limit: int
) -> None:
    data = b"".join(encode_message(m) for m in messages)
    expected = [m if len(m.data) <= limit else Oversized(m.stream_id, m.type, len(m.data)) for m in messages]
    assert check(data, cuts, limit) == expected
