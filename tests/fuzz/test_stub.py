"""Fuzzing how NRI requests are decoded and answered: ``plugin.stub`` over ``MuxConnection``.

1. ``Stub._dispatch`` (the handler the connection calls for every request) gets
   a method name and a payload that is a valid NRI request, garbled. It must
   answer with the method's reply message or raise ``StatusError``
   (INVALID_ARGUMENT for an undecodable payload, UNIMPLEMENTED for an unknown
   method). The plugin's handlers do nothing, so no other status is legitimate.
2. A whole trunk of such requests (and garbage) goes through a real
   ``MuxConnection`` serving the stub. The loop must end only by EOF or a
   ``ProtocolError`` of the mux, never crash or log an error, and on EOF every
   request and every oversized message must have had exactly one reply.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as Proto
from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.config import PluginConfig
from nri_gpu.plugin.stub import _NOTIFICATION_RPCS, HANDLER_NAMES, PLUGIN_SERVICE, Stub, _rpc_name
from nri_gpu.plugin.ttrpc import (
    Code,
    ConnectionClosed,
    InboundRequest,
    Message,
    MessageDecoder,
    MessageType,
    MuxConnection,
    Oversized,
    ProtocolError,
    StatusError,
    decode_response,
    encode_message,
    encode_mux,
    encode_request,
)
from nri_gpu.plugin.ttrpc.mux import Demux
from tests.fuzz.support import fuzz, hang_guard, mutated, typed

# method -> (request type, reply type), for every RPC the stub routes.
RPCS: dict[str, tuple[type[Proto], type[Proto]]] = {
    "Configure": (api.ConfigureRequest, api.ConfigureResponse),
    "Synchronize": (api.SynchronizeRequest, api.SynchronizeResponse),
    "Shutdown": (api.Empty, api.Empty),
    "CreateContainer": (api.CreateContainerRequest, api.CreateContainerResponse),
    "UpdateContainer": (api.UpdateContainerRequest, api.UpdateContainerResponse),
    "StopContainer": (api.StopContainerRequest, api.StopContainerResponse),
    "StateChange": (api.StateChangeEvent, api.Empty),
    "UpdatePodSandbox": (api.UpdatePodSandboxRequest, api.UpdatePodSandboxResponse),
    "ValidateContainerAdjustment": (api.ValidateContainerAdjustmentRequest, api.ValidateContainerAdjustmentResponse),
    **{_rpc_name(event): types for event, types in _NOTIFICATION_RPCS.items()},
}
TYPED_CODES = {Code.INVALID_ARGUMENT, Code.UNIMPLEMENTED}


class NullPlugin:
    """A plugin with every handler, each doing nothing: any failure is the stub's own."""


async def _nothing(*args: Any) -> None:
    return None


for _name in (*HANDLER_NAMES.values(), "configure", "synchronize", "shutdown"):
    setattr(NullPlugin, _name, staticmethod(_nothing))


TEXT = st.text(max_size=16)
VERSIONS = st.one_of(TEXT, st.sampled_from(["1.7.24", "v2.1.4", "0.10.0", "2.1.4+unknown", "1" * 4400 + ".0"]))
PODS = st.builds(
    api.PodSandbox,
    id=TEXT,
    name=TEXT,
    namespace=TEXT,
    annotations=st.dictionaries(
        st.sampled_from(["nvidia.com/gpus", "nvidia.com/gpus.container.c", "x"]), TEXT, max_size=2
    ),
)
CONTAINERS = st.builds(
    api.Container,
    id=TEXT,
    name=st.sampled_from(["c", "", "main"]),
    env=st.lists(st.sampled_from(["NVIDIA_VISIBLE_DEVICES=0", "CUDA_VERSION=12.4", "A=b", "=", ""]), max_size=3),
    pid=st.integers(0, 2**32 - 1),
)


@st.composite
def nri_request(draw: st.DrawFn, method: str) -> bytes:
    """A valid request for ``method``, its pod and container filled in."""
    msg = RPCS[method][0]() if method in RPCS else api.CreateContainerRequest()
    fields = msg.DESCRIPTOR.fields_by_name
    if "pod" in fields:
        cast(Any, msg).pod.CopyFrom(draw(PODS))
    if "container" in fields:
        cast(Any, msg).container.CopyFrom(draw(CONTAINERS))
    if isinstance(msg, api.ConfigureRequest):
        msg.config, msg.runtime_name = draw(TEXT), draw(st.sampled_from(["containerd", "cri-o", ""]))
        msg.runtime_version, msg.NRI_version = draw(VERSIONS), draw(VERSIONS)
    elif isinstance(msg, api.SynchronizeRequest):
        msg.pods.extend(draw(st.lists(PODS, max_size=2)))
        msg.containers.extend(draw(st.lists(CONTAINERS, max_size=2)))
        msg.more = draw(st.booleans())
    elif isinstance(msg, api.StateChangeEvent):
        msg.event = cast(Any, draw(st.integers(-1, 40)))
    return msg.SerializeToString()


METHODS = st.one_of(st.sampled_from(sorted(RPCS)), TEXT)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, bytes]:
    method = draw(METHODS)
    payload = draw(st.one_of(nri_request(method), mutated(nri_request(method)), st.binary(max_size=64)))
    return method, payload


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop_runner:
        yield loop_runner


def dispatch(runner: asyncio.Runner, method: str, payload: bytes) -> bytes | StatusError:
    stub = Stub(NullPlugin(), PluginConfig())
    request = InboundRequest(PLUGIN_SERVICE, method, payload, stream_id=1, deadline=None, metadata=())
    return typed(StatusError, runner.run, stub._dispatch(request))


@fuzz(500)
@given(call=calls())
@example(call=("CreateContainer", b"\x0a\xff\xff\xff\xff\x0f"))  # pod: a length of 2**32 - 1
@example(call=("StateChange", b"\x08" + b"\xff" * 9 + b"\x01"))  # event: -1 as a 10-byte varint
@example(call=("Synchronize", b"\x0a\x02\x0a\x80"))  # a pod whose id is cut short
def test_garbled_payloads_get_a_reply_or_a_typed_status(runner: asyncio.Runner, call: tuple[str, bytes]) -> None:
    method, payload = call
    got = dispatch(runner, method, payload)
    if isinstance(got, StatusError):
        assert got.code in TYPED_CODES, f"{method}: {got}"
        if got.code is Code.INVALID_ARGUMENT:
            assert "cannot decode" in got.message
    else:
        assert method in RPCS
        RPCS[method][1]().ParseFromString(got)  # the reply is the method's reply type


def test_configure_with_a_huge_version_reads_it_as_unknown(runner: asyncio.Runner) -> None:
    """Found by this fuzzer: parse_version called int() on 4400 digits (ValueError)."""
    payload = api.ConfigureRequest(runtime_name="containerd", runtime_version="1" * 4400 + ".0").SerializeToString()
    stub = Stub(NullPlugin(), PluginConfig())
    request = InboundRequest(PLUGIN_SERVICE, "Configure", payload, stream_id=1, deadline=None, metadata=())
    reply = runner.run(stub._dispatch(request))
    api.ConfigureResponse().ParseFromString(reply)


# -- the whole connection loop --------------------------------------------------------


class FakeWriter:
    """Enough of asyncio.StreamWriter for MuxConnection: keeps what is written."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.transport = self

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        return None


class ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def error_log() -> Iterator[ErrorLog]:
    handler = ErrorLog()
    logger = logging.getLogger("nri_gpu.plugin")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@st.composite
def request_messages(draw: st.DrawFn) -> bytes:
    method, payload = draw(calls())
    service = draw(st.one_of(st.just(PLUGIN_SERVICE), TEXT))
    timeout = draw(st.one_of(st.just(0), st.integers(1, 2**63 - 1)))
    body = encode_request(service, method, payload, timeout)
    body = draw(st.one_of(st.just(body), mutated(st.just(body), max_ops=2)))
    stream_id = draw(st.one_of(st.integers(1, 50).map(lambda n: 2 * n - 1), st.integers(0, 0xFFFFFFFF)))
    mtype = draw(st.one_of(st.just(int(MessageType.REQUEST)), st.integers(0, 255)))
    return encode_message(Message(stream_id, mtype, 0, body))


ITEMS = st.one_of(
    st.tuples(st.just(1), request_messages()),
    st.tuples(st.sampled_from([1, 2, 3]), st.binary(min_size=1, max_size=24)),
)
TRUNKS = st.lists(ITEMS, max_size=6).map(lambda items: b"".join(f for c, m in items for f in encode_mux(c, m)))


def expected_replies(trunk: bytes) -> int | None:
    """How many replies a correct server owes for ``trunk`` (None: the mux is broken, replies may be lost)."""
    decoder = MessageDecoder()
    events: list[Message | Oversized] = []
    try:
        for conn, piece in Demux().feed(trunk):
            if conn == 1:
                events.extend(decoder.feed(piece))
    except ProtocolError:
        return None
    return sum(1 for e in events if isinstance(e, Oversized) or e.type == MessageType.REQUEST)


async def serve(trunk: bytes) -> tuple[BaseException | None, bytes]:
    reader = asyncio.StreamReader()
    writer = FakeWriter()
    stub = Stub(NullPlugin(), PluginConfig())
    conn = MuxConnection(reader, cast(asyncio.StreamWriter, writer), serve_conn=1, call_conn=2, handler=stub._dispatch)
    conn.start()
    reader.feed_data(trunk)
    # Let the reader split everything and every handler task answer before EOF cancels them.
    for _ in range(10_000):
        await asyncio.sleep(0)
        if not conn._tasks and not conn.closed:
            await asyncio.sleep(0)
            if not conn._tasks:
                break
        if conn.closed:
            break
    reader.feed_eof()
    await asyncio.wait_for(conn.wait_closed(), 5)
    await conn.close()
    return conn.close_reason, bytes(writer.data)


@fuzz(300, deadline_ms=2000)
@given(trunk=st.one_of(TRUNKS, mutated(TRUNKS)))
@example(trunk=struct.pack(">II", 1, 0xFFFFFFFF))
@example(trunk=b"".join(encode_mux(1, struct.pack(">IIBB", 0xFFFFFFFF, 1, 1, 0) + b"x" * 64)))
@example(trunk=b"".join(encode_mux(1, encode_message(Message(1, 1, 0, b"\x0a\xff")))))
def test_the_connection_loop_survives_any_trunk(runner: asyncio.Runner, trunk: bytes) -> None:
    with error_log() as errors, hang_guard():
        reason, written = runner.run(serve(trunk))
    assert not errors.records, [r.getMessage() for r in errors.records]
    assert isinstance(reason, ConnectionClosed | ProtocolError), repr(reason)
    replies: list[Message | Oversized] = []
    decoder = MessageDecoder()
    for conn, piece in Demux().feed(written):
        assert conn == 1
        replies.extend(decoder.feed(piece))
    assert decoder.buffered == 0
    for reply in replies:
        assert isinstance(reply, Message) and reply.type == MessageType.RESPONSE
        _, code, message = decode_response(reply.data)
        assert code in {Code.OK, Code.RESOURCE_EXHAUSTED, Code.DEADLINE_EXCEEDED} | TYPED_CODES, message
    owed = expected_replies(trunk)
    if isinstance(reason, ConnectionClosed):
        assert owed is not None
        assert len(replies) == owed, f"{owed} requests, {len(replies)} replies"


def test_a_decode_error_is_what_protobuf_raises() -> None:
    # The stub and the codec catch exactly DecodeError; check the runtime still raises that.
    with pytest.raises(DecodeError):
        api.CreateContainerRequest().ParseFromString(b"\x0a\xff")
