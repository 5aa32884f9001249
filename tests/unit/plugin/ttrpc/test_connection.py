"""MuxConnection over socketpairs: against its mirror image, and against a raw
byte-level peer where the exact frames on the wire matter."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from nri_gpu.plugin.ttrpc import (
    MAX_MESSAGE,
    Code,
    ConnectionClosed,
    InboundRequest,
    Message,
    MessageType,
    MuxConnection,
    ProtocolError,
    StatusError,
    Unimplemented,
    decode_request,
    decode_response,
    encode_response,
)
from nri_gpu.plugin.ttrpc import connection as connection_module
from nri_gpu.plugin.ttrpc.mux import GO_READ_SIZE

from .support import RawPeer, connection_pair, raw_pair, run

LOGGER = "nri_gpu.plugin.ttrpc.connection"


async def echo(request: InboundRequest) -> bytes:
    return f"{request.method}:".encode() + request.payload


async def read_reply(peer: RawPeer, conn_id: int = 1) -> tuple[int, bytes, Code, str]:
    """Next RESPONSE on ``conn_id`` as (stream id, payload, code, message)."""
    message = await peer.read_message(conn_id)
    assert isinstance(message, Message)
    assert message.type == MessageType.RESPONSE
    assert message.flags == 0
    return (message.stream_id, *decode_response(message.data))


# -- calls in both directions --------------------------------------------------


def test_calls_round_trip_in_both_directions() -> None:
    async def plugin_side(request: InboundRequest) -> bytes:
        return b"plugin " + await echo(request)

    async def runtime_side(request: InboundRequest) -> bytes:
        return b"runtime " + await echo(request)

    async def scenario() -> None:
        async with connection_pair(plugin_side, runtime_side) as (plugin, runtime):
            assert await plugin.call("svc", "Register", b"x") == b"runtime Register:x"
            assert await runtime.call("svc", "Configure", b"y") == b"plugin Configure:y"
            assert await plugin.call("svc", "Empty", b"") == b"runtime Empty:"

    run(scenario())


def test_handler_may_call_the_peer_before_replying() -> None:
    # NRI: the runtime sends Configure before it answers RegisterPlugin, so the
    # plugin's reader must keep serving while its own call is outstanding.
    async def scenario() -> None:
        peer_box: list[MuxConnection] = []

        async def runtime_side(request: InboundRequest) -> bytes:
            configured = await peer_box[0].call("plugin", "Configure", b"cfg")
            return b"registered after " + configured

        async with connection_pair(echo, runtime_side) as (plugin, runtime):
            peer_box.append(runtime)
            assert await plugin.call("runtime", "RegisterPlugin", b"") == b"registered after Configure:cfg"

    run(scenario())


def test_fifty_concurrent_calls_answered_in_reverse_order() -> None:
    async def scenario() -> None:
        count = 50
        done = [asyncio.Event() for _ in range(count)]
        finished: list[int] = []

        async def runtime_side(request: InboundRequest) -> bytes:
            index = int(request.payload)
            if index + 1 < count:
                await done[index + 1].wait()  # the later request finishes first
            finished.append(index)
            done[index].set()
            return f"answer {index}".encode()

        async with connection_pair(None, runtime_side) as (plugin, _runtime):
            results = await asyncio.gather(*(plugin.call("s", "m", str(i).encode()) for i in range(count)))
        assert results == [f"answer {i}".encode() for i in range(count)]
        assert finished == list(reversed(range(count)))

    run(scenario())


def test_large_concurrent_replies_arrive_intact() -> None:
    async def big(request: InboundRequest) -> bytes:
        await asyncio.sleep(0)
        return request.payload * 5000

    async def scenario() -> None:
        async with connection_pair(big, None) as (_plugin, runtime):
            letters = [bytes([65 + i]) for i in range(20)]
            results = await asyncio.gather(*(runtime.call("s", "m", c) for c in letters))
        assert results == [c * 5000 for c in letters]

    run(scenario())


# -- status mapping -------------------------------------------------------------


def test_unknown_method_is_unimplemented_and_the_connection_survives() -> None:
    async def routed(request: InboundRequest) -> bytes:
        if request.method != "Known":
            raise Unimplemented(f"method {request.method}")
        return b"ok"

    async def scenario() -> None:
        async with connection_pair(None, routed) as (plugin, _runtime):
            with pytest.raises(StatusError) as info:
                await plugin.call("svc", "Newer", b"")
            assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, "method Newer")
            assert await plugin.call("svc", "Known", b"") == b"ok"

    run(scenario())


def test_no_handler_answers_unimplemented_service() -> None:
    async def scenario() -> None:
        async with connection_pair(None, None) as (plugin, _runtime):
            with pytest.raises(StatusError) as info:
                await plugin.call("nri.Runtime", "RegisterPlugin", b"")
            assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, "service nri.Runtime")

    run(scenario())


def test_status_error_from_handler_is_sent_as_is() -> None:
    async def refusing(request: InboundRequest) -> bytes:
        raise StatusError(Code.FAILED_PRECONDITION, "gpu 7 not found")

    async def scenario() -> None:
        async with connection_pair(refusing, None) as (_plugin, runtime):
            with pytest.raises(StatusError) as info:
                await runtime.call("s", "CreateContainer", b"")
            assert (info.value.code, info.value.message) == (Code.FAILED_PRECONDITION, "gpu 7 not found")

    run(scenario())


def test_handler_exception_is_unknown_logged_and_survivable(caplog: pytest.LogCaptureFixture) -> None:
    async def flaky(request: InboundRequest) -> bytes:
        if request.method == "Boom":
            raise RuntimeError("kaboom 42")
        return b"fine"

    async def scenario() -> None:
        async with connection_pair(flaky, None) as (_plugin, runtime):
            with pytest.raises(StatusError) as info:
                await runtime.call("s", "Boom", b"")
            assert info.value.code is Code.UNKNOWN
            assert "kaboom 42" in info.value.message
            assert await runtime.call("s", "Other", b"") == b"fine"

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run(scenario())
    logged = [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], RuntimeError)]
    assert len(logged) == 1
    assert "Boom" in logged[0].getMessage()


@pytest.mark.parametrize("result", [None, "text", 42], ids=["none", "str", "int"])
def test_handler_returning_non_bytes_is_unknown(result: object) -> None:
    async def wrong(request: InboundRequest) -> bytes:
        return result  # type: ignore[return-value]

    async def scenario() -> None:
        async with connection_pair(wrong, None) as (_plugin, runtime):
            with pytest.raises(StatusError) as info:
                await runtime.call("s", "m", b"")
            assert info.value.code is Code.UNKNOWN
            assert "not bytes" in info.value.message

    run(scenario())


def test_handlers_own_timeout_error_is_unknown_not_deadline() -> None:
    async def timing_out(request: InboundRequest) -> bytes:
        raise TimeoutError("backend slow")

    async def scenario() -> None:
        async with connection_pair(timing_out, None) as (_plugin, runtime):
            with pytest.raises(StatusError) as info:
                await runtime.call("s", "m", b"", timeout=5)
            assert info.value.code is Code.UNKNOWN
            assert "backend slow" in info.value.message

    run(scenario())


def test_handler_cancelled_by_itself_is_cancelled_status() -> None:
    async def self_cancelling(request: InboundRequest) -> bytes:
        if request.method != "Cancel":
            return b"ok"
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        future.cancel()
        return await future

    async def scenario() -> None:
        async with connection_pair(self_cancelling, None) as (_plugin, runtime):
            with pytest.raises(StatusError) as info:
                await runtime.call("s", "Cancel", b"")
            assert info.value.code is Code.CANCELLED
            assert await runtime.call("s", "After", b"") == b"ok"

    run(scenario())


# -- deadlines --------------------------------------------------------------------


def test_handler_slower_than_timeout_nano_gets_deadline_exceeded() -> None:
    async def scenario() -> None:
        seen: list[InboundRequest] = []
        cancelled = asyncio.Event()

        async def slow(request: InboundRequest) -> bytes:
            seen.append(request)
            try:
                await asyncio.Event().wait()  # never finishes on its own
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return b"too late"

        async with raw_pair(slow) as (_conn, peer):
            loop = asyncio.get_running_loop()
            start = loop.time()
            await peer.send_request(1, 1, "Slow", timeout_ns=50_000_000)
            sid, payload, code, message = await read_reply(peer)  # the handler never answers: the deadline did
            assert (sid, payload, code) == (1, b"", Code.DEADLINE_EXCEEDED)
            assert "deadline" in message
            assert cancelled.is_set()
            deadline = seen[0].deadline
            assert deadline is not None
            assert start < deadline < start + 1

    run(scenario())


def test_inbound_request_fields_reach_the_handler() -> None:
    async def scenario() -> None:
        seen: list[InboundRequest] = []

        async def recording(request: InboundRequest) -> bytes:
            seen.append(request)
            return b""

        async with connection_pair(recording, None) as (_plugin, runtime):
            await runtime.call("svc.A", "M1", b"p1", metadata=[("traceparent", "00-ab")])
            await runtime.call("svc.A", "M2", b"p2", timeout=3.0)
            await runtime.call("svc.A", "M3", b"p3", timeout=3.0, send_timeout=False)
        first, second, third = seen
        assert (first.service, first.method, first.payload) == ("svc.A", "M1", b"p1")
        assert first.metadata == (("traceparent", "00-ab"),)
        assert first.deadline is None
        assert (first.stream_id, second.stream_id, third.stream_id) == (1, 3, 5)
        assert second.deadline is not None
        assert third.deadline is None  # send_timeout=False keeps the deadline local

    run(scenario())


def test_local_call_timeout_raises_and_late_reply_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        replied = asyncio.Event()

        async def held(request: InboundRequest) -> bytes:
            if request.method == "Held":
                await release.wait()
                replied.set()
            return b"ok"

        async with connection_pair(held, None) as (_plugin, runtime):
            with pytest.raises(TimeoutError):
                await runtime.call("s", "Held", b"", timeout=0.05, send_timeout=False)
            release.set()
            await replied.wait()
            assert await runtime.call("s", "Next", b"") == b"ok"  # late reply did not confuse it

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(scenario())
    assert any("unknown stream 1" in r.getMessage() for r in caplog.records)


# -- the wire -----------------------------------------------------------------------


def test_large_reply_is_sent_as_exactly_two_mux_frames() -> None:
    big = bytes(range(256)) * 40  # 10240 bytes

    async def large(request: InboundRequest) -> bytes:
        return big if request.method == "Big" else b"small"

    async def scenario() -> None:
        async with raw_pair(large) as (_conn, peer):
            await peer.send_request(1, 1, "Big")
            first = await peer.read_frame()
            second = await peer.read_frame()
            assert first[0] == second[0] == 1
            assert len(first[1]) == GO_READ_SIZE
            message = first[1] + second[1]
            assert len(message) > GO_READ_SIZE
            assert int.from_bytes(message[:4], "big") == len(message) - 10  # one whole message
            assert message[4:10] == bytes.fromhex("00000001 02 00")
            assert decode_response(message[10:]) == (big, Code.OK, "")
            # Nothing else was in flight: the next frame is the next reply, whole.
            await peer.send_request(1, 3, "Small")
            conn_id, payload = await peer.read_frame()
            assert (conn_id, payload[4:8]) == (1, (3).to_bytes(4, "big"))
            assert decode_response(payload[10:]) == (b"small", Code.OK, "")

    run(scenario())


def test_concurrent_large_replies_never_interleave_frames() -> None:
    async def large(request: InboundRequest) -> bytes:
        await asyncio.sleep(0)
        return request.payload * 6000

    async def scenario() -> None:
        async with raw_pair(large) as (_conn, peer):
            for i in range(8):
                await peer.send_request(1, 2 * i + 1, "m", bytes([65 + i]))
            seen = set()
            for _ in range(8):
                _, head = await peer.read_frame()
                _, tail = await peer.read_frame()
                assert len(head) == GO_READ_SIZE
                message = head + tail
                assert int.from_bytes(message[:4], "big") == len(message) - 10
                sid = int.from_bytes(message[4:8], "big")
                payload, _code, _ = decode_response(message[10:])
                assert payload == bytes([65 + (sid - 1) // 2]) * 6000
                seen.add(sid)
            assert seen == {1, 3, 5, 7, 9, 11, 13, 15}

    run(scenario())


def test_large_request_is_sent_as_two_frames_and_stream_ids_go_1_3_5() -> None:
    async def scenario() -> None:
        async with raw_pair(serve_conn=1, call_conn=2) as (conn, peer):

            async def serve(count: int) -> list[int]:
                ids = []
                for _ in range(count):
                    request = await peer.read_message(2)
                    assert isinstance(request, Message)
                    assert request.type == MessageType.REQUEST
                    ids.append(request.stream_id)
                    body = decode_request(request.data)
                    reply = Message(request.stream_id, MessageType.RESPONSE, 0, encode_response(body.payload[:3]))
                    await peer.send(2, reply)
                return ids

            server = asyncio.create_task(serve(4))
            assert await conn.call("s", "a", b"one") == b"one"
            assert await conn.call("s", "b", b"two") == b"two"
            pair = await asyncio.gather(conn.call("s", "c", b"333"), conn.call("s", "d", b"444"))
            assert list(pair) == [b"333", b"444"]
            assert await server == [1, 3, 5, 7]

            # A request over 4096 bytes: header frame of exactly 4096, then the rest.
            call = asyncio.create_task(conn.call("s", "big", b"z" * 9000))
            first = await peer.read_frame()
            second = await peer.read_frame()
            assert (first[0], second[0], len(first[1])) == (2, 2, GO_READ_SIZE)
            message = first[1] + second[1]
            assert int.from_bytes(message[:4], "big") == len(message) - 10
            assert int.from_bytes(message[4:8], "big") == 9
            await peer.send(2, Message(9, MessageType.RESPONSE, 0, encode_response(b"big ok")))
            assert await call == b"big ok"

    run(scenario())


def test_empty_reply_is_a_zero_length_message() -> None:
    async def empty(request: InboundRequest) -> bytes:
        return b""

    async def scenario() -> None:
        async with raw_pair(empty) as (_conn, peer):
            await peer.send_request(1, 1, "m")
            assert await peer.read_frame() == (1, bytes.fromhex("00000000 00000001 02 00"))

    run(scenario())


# -- limits ------------------------------------------------------------------------


def test_oversized_inbound_request_gets_resource_exhausted_and_connection_survives() -> None:
    async def scenario() -> None:
        async with raw_pair(echo) as (conn, peer):
            length = MAX_MESSAGE + 1
            header = length.to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([MessageType.REQUEST, 0])
            oversized = header + bytes(length)
            # Sent as Go v0.7+ would: frames of at most 10 + 4 MiB.
            await peer.send_raw((1).to_bytes(4, "big") + (len(oversized) - 1).to_bytes(4, "big") + oversized[:-1])
            await peer.send_raw((1).to_bytes(4, "big") + (1).to_bytes(4, "big") + oversized[-1:])
            sid, payload, code, message = await read_reply(peer)
            assert (sid, payload, code) == (1, b"", Code.RESOURCE_EXHAUSTED)
            assert message == f"message length {length} exceed maximum message size of 4194304"
            await peer.send_request(1, 3, "After", b"!")
            assert await read_reply(peer) == (3, b"After:!", Code.OK, "")
            assert not conn.closed

    run(scenario())


def test_oversized_outbound_request_fails_locally() -> None:
    async def scenario() -> None:
        async with connection_pair(None, echo) as (plugin, _runtime):
            with pytest.raises(StatusError) as info:
                await plugin.call("s", "m", bytes(MAX_MESSAGE))
            assert info.value.code is Code.RESOURCE_EXHAUSTED
            assert await plugin.call("s", "m", b"x") == b"m:x"

    run(scenario())


def test_too_large_handler_reply_becomes_resource_exhausted() -> None:
    async def huge(request: InboundRequest) -> bytes:
        return bytes(MAX_MESSAGE) if request.method == "Huge" else b"small"

    async def scenario() -> None:
        async with connection_pair(huge, None) as (_plugin, runtime):
            with pytest.raises(StatusError) as info:
                await runtime.call("s", "Huge", b"")
            assert info.value.code is Code.RESOURCE_EXHAUSTED
            assert "exceed maximum message size of 4194304" in info.value.message
            assert await runtime.call("s", "Small", b"") == b"small"

    run(scenario())


def test_oversized_inbound_response_fails_only_that_call() -> None:
    async def scenario() -> None:
        async with raw_pair(serve_conn=1, call_conn=2) as (conn, peer):
            call = asyncio.create_task(conn.call("s", "m", b""))
            request = await peer.read_message(2)
            length = MAX_MESSAGE + 5
            header = length.to_bytes(4, "big") + request.stream_id.to_bytes(4, "big") + bytes([2, 0])
            body = header + bytes(length)
            await peer.send_raw((2).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body)
            with pytest.raises(StatusError) as info:
                await call
            assert info.value.code is Code.RESOURCE_EXHAUSTED
            assert not conn.closed

    run(scenario())


# -- protocol hygiene ------------------------------------------------------------------


def test_undecodable_request_is_invalid_argument() -> None:
    async def scenario() -> None:
        async with raw_pair(echo) as (_conn, peer):
            await peer.send(1, Message(1, MessageType.REQUEST, 0, b"\xff\xff\xff"))
            sid, _, code, message = await read_reply(peer)
            assert (sid, code) == (1, Code.INVALID_ARGUMENT)
            assert "ff ff ff" in message
            await peer.send_request(1, 3, "Ok")
            assert await read_reply(peer) == (3, b"Ok:", Code.OK, "")

    run(scenario())


def test_stream_id_rules_match_go_server() -> None:
    async def scenario() -> None:
        async with raw_pair(echo) as (_conn, peer):
            await peer.send_request(1, 2, "Even")
            assert await read_reply(peer) == (
                2,
                b"",
                Code.INVALID_ARGUMENT,
                "StreamID must be odd for client initiated streams",
            )
            await peer.send_request(1, 5, "First")
            assert (await read_reply(peer))[:3] == (5, b"First:", Code.OK)
            await peer.send_request(1, 5, "Reused")
            assert await read_reply(peer) == (
                5,
                b"",
                Code.INVALID_ARGUMENT,
                "StreamID cannot be re-used and must increment",
            )
            await peer.send_request(1, 3, "Lower")
            assert (await read_reply(peer))[2] is Code.INVALID_ARGUMENT
            await peer.send_request(1, 7, "Next")
            assert (await read_reply(peer))[:3] == (7, b"Next:", Code.OK)

    run(scenario())


def test_data_and_unknown_types_on_the_serve_conn_are_ignored() -> None:
    async def scenario() -> None:
        async with raw_pair(echo) as (_conn, peer):
            await peer.send(1, Message(1, MessageType.DATA, 0, b"stream data"))
            await peer.send(1, Message(3, 0x42, 0, b"future type"))
            await peer.send(1, Message(5, MessageType.RESPONSE, 0, b"stray"))
            await peer.send_request(1, 7, "Real")
            assert await read_reply(peer) == (7, b"Real:", Code.OK, "")

    run(scenario())


def test_frames_for_other_conn_ids_are_dropped() -> None:
    async def scenario() -> None:
        async with raw_pair(echo) as (_conn, peer):
            await peer.send_raw((7).to_bytes(4, "big") + (4).to_bytes(4, "big") + b"\xff\xff\xff\xff")
            await peer.send_raw((0).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\x00\x01")
            await peer.send_request(1, 1, "Real")
            assert await read_reply(peer) == (1, b"Real:", Code.OK, "")

    run(scenario())


def test_response_for_unknown_stream_id_is_harmless(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with raw_pair(serve_conn=1, call_conn=2) as (conn, peer):
            await peer.send(2, Message(41, MessageType.RESPONSE, 0, encode_response(b"nobody asked")))
            call = asyncio.create_task(conn.call("s", "m", b""))
            request = await peer.read_message(2)
            assert request.stream_id == 1
            reply = Message(1, MessageType.RESPONSE, 0, encode_response(b"answer"))
            await peer.send(2, reply)
            await peer.send(2, reply)  # a duplicate after completion is dropped too
            assert await call == b"answer"
            call2 = asyncio.create_task(conn.call("s", "m", b""))
            request2 = await peer.read_message(2)
            await peer.send(2, Message(request2.stream_id, MessageType.RESPONSE, 0, encode_response(b"second")))
            assert await call2 == b"second"
            assert not conn.closed

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    assert any("unknown stream 41" in m for m in messages)
    assert any("unknown stream 1" in m for m in messages)


def test_undecodable_response_fails_that_call_with_protocol_error() -> None:
    async def scenario() -> None:
        async with raw_pair(serve_conn=1, call_conn=2) as (conn, peer):
            call = asyncio.create_task(conn.call("s", "m", b""))
            request = await peer.read_message(2)
            await peer.send(2, Message(request.stream_id, MessageType.RESPONSE, 0, b"\xff\xff\xff"))
            with pytest.raises(ProtocolError):
                await call
            assert not conn.closed

    run(scenario())


def test_insane_mux_frame_length_closes_the_connection() -> None:
    async def scenario() -> None:
        async with raw_pair(echo) as (conn, peer):
            await peer.send_raw((1).to_bytes(4, "big") + (0xFFFFFFFF).to_bytes(4, "big"))
            await conn.wait_closed()
            assert isinstance(conn.close_reason, ProtocolError)
            assert str(0xFFFFFFFF) in str(conn.close_reason)
            assert await peer.reader.read() == b""  # the socket was closed

    run(scenario())


# -- lifecycle -----------------------------------------------------------------------


def test_peer_close_fails_pending_calls_and_wakes_wait_closed() -> None:
    async def scenario() -> None:
        started = asyncio.Event()
        handler_cancelled = asyncio.Event()

        async def stuck(request: InboundRequest) -> bytes:
            started.set()
            try:
                await asyncio.Event().wait()  # never finishes on its own
            except asyncio.CancelledError:
                handler_cancelled.set()
                raise
            return b""

        async with connection_pair(None, stuck) as (plugin, runtime):
            calls = [asyncio.create_task(plugin.call("s", "m", b"")) for _ in range(3)]
            await started.wait()
            await runtime.close()
            assert handler_cancelled.is_set()
            for call in calls:
                with pytest.raises(ConnectionClosed):
                    await call
            await plugin.wait_closed()
            await plugin.wait_closed()  # idempotent
            assert plugin.closed
            assert isinstance(plugin.close_reason, ConnectionClosed)
            with pytest.raises(ConnectionClosed):
                await plugin.call("s", "m", b"")

    run(scenario())


def test_raw_peer_eof_fails_pending_call() -> None:
    async def scenario() -> None:
        async with raw_pair(serve_conn=1, call_conn=2) as (conn, peer):
            call = asyncio.create_task(conn.call("s", "m", b""))
            await peer.read_message(2)
            await peer.close()
            with pytest.raises(ConnectionClosed):
                await call
            await conn.wait_closed()

    run(scenario())


def test_local_close_is_idempotent_and_cancels_handlers() -> None:
    async def scenario() -> None:
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def stuck(request: InboundRequest) -> bytes:
            started.set()
            try:
                await asyncio.Event().wait()  # never finishes on its own
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return b""

        async with raw_pair(stuck) as (conn, peer):
            await peer.send_request(1, 1, "Stuck")
            await started.wait()
            await conn.close()
            await conn.close()
            await conn.wait_closed()
            assert cancelled.is_set()
            assert conn.closed
            assert conn.close_reason is None
            assert await peer.reader.read() == b""  # EOF, and no reply was sent

    run(scenario())


def test_close_does_not_hang_on_a_handler_that_ignores_cancellation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module, "_CLOSE_GRACE", 0.1)
    release, started = asyncio.Event(), asyncio.Event()

    async def stubborn(request: InboundRequest) -> bytes:
        started.set()
        while True:
            try:
                await release.wait()
                return b""
            except asyncio.CancelledError:
                continue  # misbehaving: swallows the cancellation

    async def scenario() -> None:
        async with raw_pair(stubborn) as (conn, peer):
            await peer.send_request(1, 1, "Stubborn")
            await started.wait()
            closing = asyncio.ensure_future(conn.close())
            done, _ = await asyncio.wait({closing}, timeout=5)  # the handler never ends: close must not wait for it
            release.set()  # let the task finish so the loop shuts down cleanly
            assert done, "close waited for a handler that ignores cancellation"
            assert conn.closed

    run(scenario())


def test_handler_may_close_its_own_connection() -> None:
    async def scenario() -> None:
        box: list[MuxConnection] = []

        async def shutdown(request: InboundRequest) -> bytes:
            await box[0].close()
            return b"bye"

        async with connection_pair(shutdown, None) as (plugin, runtime):
            box.append(plugin)
            with pytest.raises(ConnectionClosed):
                await runtime.call("s", "Shutdown", b"")
            await plugin.wait_closed()

    run(scenario())


def test_connect_dials_a_unix_socket(tmp_path: Path) -> None:
    async def scenario() -> None:
        accepted: asyncio.Future[MuxConnection] = asyncio.get_running_loop().create_future()

        async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            runtime = MuxConnection(reader, writer, serve_conn=2, call_conn=1, handler=echo, name="rt")
            runtime.start()
            accepted.set_result(runtime)

        path = str(tmp_path / "nri.sock")
        server = await asyncio.start_unix_server(on_client, path)
        async with server:
            plugin = await MuxConnection.connect(path, serve_conn=1, call_conn=2, handler=echo)
            assert await plugin.call("s", "Register", b"") == b"Register:"
            runtime = await accepted
            assert await runtime.call("s", "Configure", b"c") == b"Configure:c"
            await plugin.close()
            await runtime.wait_closed()
            await runtime.close()

    run(scenario())


def test_connect_to_missing_socket_raises_oserror(tmp_path: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(OSError):
            await MuxConnection.connect(str(tmp_path / "absent.sock"), serve_conn=1, call_conn=2)

    run(scenario())


@pytest.mark.parametrize(("serve", "call"), [(1, 1), (0, 2), (1, 2**32)], ids=["same", "zero", "too-big"])
def test_constructor_rejects_bad_conn_ids(serve: int, call: int) -> None:
    async def scenario() -> None:
        a, b = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=a)
        try:
            with pytest.raises(ValueError):
                MuxConnection(reader, writer, serve_conn=serve, call_conn=call)
        finally:
            writer.close()
            b.close()

    run(scenario())
