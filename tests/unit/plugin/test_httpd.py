"""/healthz and /metrics on a real loopback socket, with the stub on the fake runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import pytest

from plugin import httpd
from plugin._proto import nri_pb2 as api
from plugin.config import PluginConfig
from plugin.errors import PluginError
from plugin.httpd import Health, StatusServer, stub_health
from plugin.metrics import PluginMetrics
from plugin.stub import Stub
from tests.fake_runtime import FakeRuntime, container, pod


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


class Plugin:
    async def create_container(self, p: api.PodSandbox, c: api.Container) -> None:
        if c.name == "refused":
            raise PluginError("no such GPU")


async def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    assert status_line.startswith("HTTP/1.1 ")
    assert int(headers["content-length"]) == len(body)
    return int(status_line.split(" ")[1]), headers, body


def get(port: int, path: str, method: str = "GET") -> Awaitable[tuple[int, dict[str, str], bytes]]:
    return request(port, f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n".encode())


async def started(health: Any = None, metrics: PluginMetrics | None = None) -> StatusServer:
    server = StatusServer(health or (lambda: Health(True)), metrics or PluginMetrics())
    await server.start("127.0.0.1", 0)
    return server


def test_healthz_is_503_before_registration_and_200_after() -> None:
    async def main() -> None:
        metrics = PluginMetrics()
        runtime = FakeRuntime()
        stub = Stub(Plugin(), PluginConfig(), preconnected=await runtime.socketpair(), metrics=metrics)
        server = await started(stub_health(stub), metrics)
        try:
            status, headers, body = await get(server.port, "/healthz")
            assert status == 503 and headers["content-type"] == "application/json"
            assert headers["connection"] == "close"
            doc = json.loads(body)
            assert doc["status"] == "unavailable" and doc["registered"] is False
            assert "not registered" in doc["reason"]
            assert "nri_gpu_registered 0\n" in (await get(server.port, "/metrics"))[2].decode()

            task = asyncio.ensure_future(stub.run())
            await runtime.wait_ready()
            await stub.wait_registered(5)
            status, _, body = await get(server.port, "/healthz")
            doc = json.loads(body)
            assert status == 200, doc
            assert doc["status"] == "ok" and doc["registered"] is True and doc["registrations"] == 1
            assert doc["runtime"] == "containerd 1.7.24~ds1"

            await runtime.create_container(pod(), container("main"))
            status, headers, body = await get(server.port, "/metrics?x=1")
            assert status == 200 and headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            text = body.decode()
            assert 'nri_gpu_events_total{event="CreateContainer"} 1\n' in text
            assert 'nri_gpu_events_total{event="Configure"} 1\n' in text
            assert "nri_gpu_registered 1\n" in text and "nri_gpu_registrations_total 1\n" in text

            with pytest.raises(Exception, match="no such GPU"):
                await runtime.create_container(pod(), container("refused"))
            text = (await get(server.port, "/metrics"))[2].decode()
            assert 'nri_gpu_events_total{event="CreateContainer"} 2\n' in text
            assert 'nri_gpu_errors_total{kind="refused"} 1\n' in text
            stub.stop()
            await asyncio.wait_for(task, 5)
        finally:
            await server.stop()
            await runtime.shutdown()

    run(main())


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/", 404), ("GET", "/metricsx", 404), ("POST", "/metrics", 405), ("DELETE", "/healthz", 405)],
    ids=["root", "near-miss", "post", "delete"],
)
def test_other_paths_and_methods(method: str, path: str, status: int) -> None:
    async def main() -> None:
        server = await started()
        try:
            got, headers, _ = await get(server.port, path, method)
            assert got == status
            if status == 405:
                assert headers["allow"] == "GET"
        finally:
            await server.stop()

    run(main())


@pytest.mark.parametrize(
    "raw",
    [b"GARBAGE\r\n\r\n", b"GET /metrics\r\n\r\n", b"GET /x SPDY/3\r\n\r\n"],
    ids=["one-word", "no-version", "not-http"],
)
def test_malformed_request_line_is_400(raw: bytes) -> None:
    async def main() -> None:
        server = await started()
        try:
            assert (await request(server.port, raw))[0] == 400
        finally:
            await server.stop()

    run(main())


@pytest.mark.parametrize("size", [httpd.MAX_REQUEST_LINE + 10, httpd.MAX_HEADER_BYTES * 4], ids=["long", "huge"])
def test_oversized_request_line_is_refused_without_hanging(size: int) -> None:
    async def main() -> None:
        server = await started()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /" + b"a" * size + b" HTTP/1.1\r\n\r\n")
            try:
                await writer.drain()
                data = await asyncio.wait_for(reader.read(), 5)
            except ConnectionResetError:
                data = b""  # closed with our bytes unread: refused all the same
            finally:
                writer.close()
            assert data == b"" or data.startswith(b"HTTP/1.1 414 ")
            # The server is still there for the next client.
            assert (await get(server.port, "/healthz"))[0] == 200
        finally:
            await server.stop()

    run(main())


def test_oversized_headers_are_431() -> None:
    async def main() -> None:
        server = await started()
        try:
            raw = b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"p" * 1000 + b"\r\n"
            status, _, _ = await request(server.port, raw * 1 + (b"X-Pad: " + b"p" * 1000 + b"\r\n") * 20 + b"\r\n")
            assert status == 431
        finally:
            await server.stop()

    run(main())


def test_a_silent_client_is_answered_408_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd, "READ_TIMEOUT", 0.2)

    async def main() -> None:
        server = await started()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /healthz HTTP/1.1\r\n")  # and never the blank line
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert data.startswith(b"HTTP/1.1 408 ")
        finally:
            await server.stop()

    run(main())


def test_too_many_clients_are_turned_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpd, "MAX_CLIENTS", 1)
    monkeypatch.setattr(httpd, "READ_TIMEOUT", 2.0)

    async def main() -> None:
        server = await started()
        try:
            _, slow = await asyncio.open_connection("127.0.0.1", server.port)
            await asyncio.sleep(0.1)  # let the server take it
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            try:
                data = await asyncio.wait_for(reader.read(), 1)
            except ConnectionResetError:
                data = b""
            writer.close()
            slow.close()
            assert data == b""
        finally:
            await server.stop()

    run(main())
