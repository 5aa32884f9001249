"""Fuzzing the NRI trunk demultiplexer (``plugin.ttrpc.mux.Demux``).

Whatever the bytes: the only exception is ``ProtocolError`` (a frame header
claiming more than ``max_frame``), raised at the same point however the bytes
are cut; pieces are never empty; and the bytes handed out per conn id are the
same for every cut. A valid trunk gives back exactly the messages put in.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.plugin.ttrpc.errors import ProtocolError
from nri_gpu.plugin.ttrpc.frames import Message, MessageDecoder, MessageType, encode_message
from nri_gpu.plugin.ttrpc.mux import GO_READ_SIZE, MAX_INBOUND_FRAME, Demux, encode_mux
from tests.fuzz.support import CUTS, cut, fuzz, mutated, typed

LIMITS = st.sampled_from([MAX_INBOUND_FRAME, 0, 1, 8, 64, GO_READ_SIZE, GO_READ_SIZE + 1])
CONN_IDS = st.one_of(st.sampled_from([1, 2, 3, 0xFFFFFFFF]), st.integers(1, 0xFFFFFFFF))
MESSAGES = st.builds(
    Message,
    stream_id=st.integers(0, 0xFFFFFFFF),
    type=st.sampled_from(list(MessageType)),
    flags=st.just(0),
    # Around GO_READ_SIZE: encode_mux splits a message there into two frames.
    data=st.one_of(st.binary(max_size=32), st.sampled_from([4085, 4086, 4087, 5000]).map(lambda n: b"m" * n)),
)
PARTS = st.lists(st.tuples(CONN_IDS, MESSAGES), max_size=5)


def trunk(parts: Sequence[tuple[int, Message]]) -> bytes:
    return b"".join(frame for conn, msg in parts for frame in encode_mux(conn, encode_message(msg)))


def demux(pieces: Sequence[bytes], limit: int) -> tuple[list[tuple[int, bytes]], ProtocolError | None]:
    """Per-conn runs of payload (adjacent pieces of one conn joined), and the error that stopped the feed."""
    demuxer = Demux(limit)
    runs: list[tuple[int, bytes]] = []
    for piece in pieces:
        got = typed(ProtocolError, demuxer.feed, piece)
        if isinstance(got, ProtocolError):
            return runs, got  # the stream is out of sync: never fed again
        for conn, payload in got:
            assert payload, "an empty piece"
            assert 0 <= conn <= 0xFFFFFFFF
            if runs and runs[-1][0] == conn:
                runs[-1] = (conn, runs[-1][1] + payload)
            else:
                runs.append((conn, payload))
    return runs, None


def _starts(runs: list[tuple[int, bytes]], head: list[tuple[int, bytes]]) -> bool:
    if not head:
        return True
    if len(head) > len(runs) or runs[: len(head) - 1] != head[:-1]:
        return False
    return runs[len(head) - 1][0] == head[-1][0] and runs[len(head) - 1][1].startswith(head[-1][1])


def check(data: bytes, cuts: Sequence[int], limit: int) -> list[tuple[int, bytes]]:
    whole, whole_error = demux([data], limit)
    pieces, pieces_error = demux(cut(data, cuts), limit)
    assert (whole_error is None) == (pieces_error is None), "an error depends on how the bytes were cut"
    if whole_error is None:
        assert whole == pieces, "the payload depends on how the bytes were cut"
    else:
        # The feed() that raises drops the pieces it had cut before the bad header
        # (the trunk is closed at once), so smaller cuts deliver more of them.
        assert str(whole_error) == str(pieces_error)
        assert _starts(pieces, whole), "the payload depends on how the bytes were cut"
    return whole


@fuzz(400)
@given(data=st.binary(max_size=2048), cuts=CUTS, limit=LIMITS)
@example(data=struct.pack(">II", 1, MAX_INBOUND_FRAME + 1), cuts=[4], limit=MAX_INBOUND_FRAME)
@example(data=struct.pack(">II", 1, MAX_INBOUND_FRAME) + b"x" * 64, cuts=[], limit=MAX_INBOUND_FRAME)
@example(data=struct.pack(">II", 0, 0) * 3 + struct.pack(">II", 7, 2) + b"ab", cuts=[1, 9, 25], limit=1)
def test_arbitrary_bytes(data: bytes, cuts: list[int], limit: int) -> None:
    check(data, cuts, limit)


@fuzz(400)
@given(data=mutated(PARTS.map(trunk), words=[GO_READ_SIZE, GO_READ_SIZE + 1, 64, 65]), cuts=CUTS, limit=LIMITS)
def test_mutated_trunks(data: bytes, cuts: list[int], limit: int) -> None:
    check(data, cuts, limit)


@fuzz(300)
@given(parts=PARTS, cuts=CUTS)
def test_valid_trunks_give_back_every_message(parts: list[tuple[int, Message]], cuts: list[int]) -> None:
    streams: dict[int, bytes] = {}
    for conn, payload in check(trunk(parts), cuts, MAX_INBOUND_FRAME):
        streams[conn] = streams.get(conn, b"") + payload
    for conn, data in streams.items():
        assert MessageDecoder().feed(data) == [msg for c, msg in parts if c == conn]
    assert set(streams) == {conn for conn, _ in parts}
