from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpu.plugin.ttrpc import (
    GO_READ_SIZE,
    MAX_INBOUND_FRAME,
    MUX_HEADER_SIZE,
    Demux,
    Message,
    MessageDecoder,
    Oversized,
    ProtocolError,
    encode_message,
    encode_mux,
)

from .support import CHUNKINGS, split


def frame(conn_id: int, payload: bytes) -> bytes:
    return conn_id.to_bytes(4, "big") + len(payload).to_bytes(4, "big") + payload


def parse_frames(wire: bytes) -> list[tuple[int, bytes]]:
    """Split encoder output at its real frame boundaries (test oracle)."""
    frames = []
    pos = 0
    while pos < len(wire):
        conn_id = int.from_bytes(wire[pos : pos + 4], "big")
        length = int.from_bytes(wire[pos + 4 : pos + 8], "big")
        frames.append((conn_id, wire[pos + 8 : pos + 8 + length]))
        pos += 8 + length
    return frames


def demux(data: bytes, how: str) -> dict[int, bytes]:
    """Feed the demuxer; return each conn's reassembled byte stream."""
    demuxer = Demux()
    streams: dict[int, bytes] = {}
    for piece in split(data, how, seed=7, max_chunk=5000):
        for conn_id, payload in demuxer.feed(piece):
            assert payload, "the demuxer must never hand out empty pieces"
            streams[conn_id] = streams.get(conn_id, b"") + payload
    return streams


# -- encode_mux -------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 10, 100, 4095, 4096], ids=lambda n: f"{n}B")
def test_message_up_to_4096_bytes_is_one_frame(size: int) -> None:
    message = bytes(range(256)) * (size // 256) + bytes(size % 256)
    frames = encode_mux(2, message)
    assert frames == [frame(2, message)]


@pytest.mark.parametrize(
    ("size", "tail"),
    [(4097, 1), (8192, 4096), (10000, 5904), (1024 * 1024, 1024 * 1024 - 4096), (MAX_INBOUND_FRAME, None)],
    ids=["4097B", "8KiB", "10000B", "1MiB", "20MiB"],
)
def test_larger_message_is_exactly_two_frames_split_at_4096(size: int, tail: int | None) -> None:
    message = random.Random(size).randbytes(size)
    frames = encode_mux(1, message)
    assert len(frames) == 2
    assert frames[0] == frame(1, message[:GO_READ_SIZE])
    assert frames[1] == frame(1, message[GO_READ_SIZE:])
    assert len(frames[1]) - MUX_HEADER_SIZE == (tail if tail is not None else size - 4096)


def test_go_read_size_is_4096() -> None:
    # containerd 1.7.24 drops a plugin whose reply starts with a bigger frame.
    assert GO_READ_SIZE == 4096


@pytest.mark.parametrize("conn_id", [0, -1, 2**32], ids=["zero", "negative", "too-big"])
def test_encode_mux_rejects_bad_conn_ids(conn_id: int) -> None:
    with pytest.raises(ValueError):
        encode_mux(conn_id, b"x")


def test_encode_mux_accepts_max_conn_id() -> None:
    assert encode_mux(2**32 - 1, b"x") == [b"\xff\xff\xff\xff\x00\x00\x00\x01x"]


def test_encode_mux_never_sends_an_empty_frame() -> None:
    with pytest.raises(ValueError):
        encode_mux(1, b"")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 12000), min_size=1, max_size=8), st.integers(1, 2))
def test_property_each_frame_group_carries_exactly_one_message(sizes: list[int], conn_id: int) -> None:
    messages = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    for message in messages:
        frames = [parse_frames(f) for f in encode_mux(conn_id, message)]
        # One frame per element, none empty, the first never over 4096 bytes,
        # and together they are exactly this message: never a neighbour's bytes.
        assert all(len(f) == 1 for f in frames)
        payloads = [f[0][1] for f in frames]
        assert all(payloads)
        assert len(payloads[0]) <= GO_READ_SIZE
        assert len(payloads) == (1 if len(message) <= GO_READ_SIZE else 2)
        assert b"".join(payloads) == message
        assert {f[0][0] for f in frames} == {conn_id}


# -- Demux ------------------------------------------------------------------


@pytest.mark.parametrize("how", CHUNKINGS)
def test_demux_reassembles_interleaved_conns(how: str) -> None:
    wire = frame(1, b"abc") + frame(2, b"XY") + frame(1, b"def") + frame(7, b"other") + frame(2, b"Z")
    assert demux(wire, how) == {1: b"abcdef", 2: b"XYZ", 7: b"other"}


@pytest.mark.parametrize("how", CHUNKINGS)
def test_demux_skips_zero_length_frames(how: str) -> None:
    wire = frame(1, b"") + frame(1, b"a") + frame(2, b"") + frame(1, b"") + frame(1, b"b")
    assert demux(wire, how) == {1: b"ab"}


@pytest.mark.parametrize("how", CHUNKINGS)
def test_demux_streams_payload_before_the_frame_is_complete(how: str) -> None:
    demuxer = Demux()
    wire = frame(2, b"0123456789")
    pieces = []
    for piece in split(wire[:-3], how):
        pieces.extend(demuxer.feed(piece))
    assert b"".join(p for _, p in pieces) == b"0123456"
    assert demuxer.feed(wire[-3:]) == [(2, b"789")]


@pytest.mark.parametrize("how", CHUNKINGS)
def test_demux_rejects_an_insane_frame_length(how: str) -> None:
    wire = frame(1, b"ok") + (1).to_bytes(4, "big") + (MAX_INBOUND_FRAME + 1).to_bytes(4, "big")
    demuxer = Demux()
    with pytest.raises(ProtocolError, match=str(MAX_INBOUND_FRAME + 1)):
        for piece in split(wire, how):
            demuxer.feed(piece)


def test_demux_accepts_a_frame_at_the_bound() -> None:
    header = (1).to_bytes(4, "big") + MAX_INBOUND_FRAME.to_bytes(4, "big")
    assert Demux().feed(header + b"abc") == [(1, b"abc")]


def test_max_inbound_frame_covers_go_v061_frames() -> None:
    # NRI v0.6.1 writes frames of up to 16 MiB; we must not call those insane.
    assert MAX_INBOUND_FRAME >= 16 * 1024 * 1024 + 10


# -- mux and ttrpc stacked ----------------------------------------------------


@pytest.mark.parametrize("how", CHUNKINGS)
def test_stacked_round_trip_with_a_large_message(how: str) -> None:
    messages = [
        (2, Message(1, 1, 0, b"register")),
        (1, Message(1, 1, 0, b"configure")),
        (2, Message(3, 1, 0, bytes(9000))),
        (1, Message(1, 2, 0, b"")),
    ]
    wire = b"".join(b"".join(encode_mux(c, encode_message(m))) for c, m in messages)
    decoders = {1: MessageDecoder(), 2: MessageDecoder()}
    got: dict[int, list[Message | Oversized]] = {1: [], 2: []}
    demuxer = Demux()
    for piece in split(wire, how, seed=5, max_chunk=3000):
        for conn_id, payload in demuxer.feed(piece):
            got[conn_id].extend(decoders[conn_id].feed(payload))
    assert got == {c: [m for cc, m in messages if cc == c] for c in (1, 2)}


conn_messages = st.lists(
    st.tuples(
        st.sampled_from([1, 2]),
        st.builds(
            Message,
            stream_id=st.integers(0, 2**32 - 1),
            type=st.integers(0, 255),
            flags=st.integers(0, 255),
            data=st.binary(max_size=10 * 1024),
        ),
    ),
    max_size=10,
)


@settings(max_examples=150, deadline=None)
@given(messages=conn_messages, seed=st.integers(0, 2**32), max_chunk=st.integers(1, 20000))
def test_property_stacked_encode_split_decode_is_identity(
    messages: list[tuple[int, Message]], seed: int, max_chunk: int
) -> None:
    wire = b"".join(b"".join(encode_mux(c, encode_message(m))) for c, m in messages)
    demuxer = Demux()
    decoders = {1: MessageDecoder(), 2: MessageDecoder()}
    got: dict[int, list[Message | Oversized]] = {1: [], 2: []}
    for piece in split(wire, "random", seed=seed, max_chunk=max_chunk):
        for conn_id, payload in demuxer.feed(piece):
            got[conn_id].extend(decoders[conn_id].feed(payload))
    assert got == {c: [m for cc, m in messages if cc == c] for c in (1, 2)}
