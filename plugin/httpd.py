"""``/healthz`` and ``/metrics`` over a deliberately small HTTP/1.1 server.

Theory of operation
-------------------
One request per connection: read the request line and the header block (both
bounded in size, all of it within ``READ_TIMEOUT``), ignore the headers, answer
with ``Connection: close`` and close. At most ``MAX_CLIENTS`` connections are
served at once; beyond that a connection is closed unanswered. So a slow or
hostile client costs at most a few kilobytes for a few seconds, and the server
never competes with the NRI trunk for long on the event loop.

``GET /healthz``: 200 with ``{"status": "ok", "registered": true, ...}`` while
the stub is registered with the runtime, else 503 with the reason.
``GET /metrics``: the Prometheus text exposition format 0.0.4. Other paths 404,
other methods 405.

(The module is not called ``http`` so it never shadows the standard library's.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plugin.metrics import PluginMetrics
from plugin.stub import Stub

logger = logging.getLogger(__name__)

MAX_REQUEST_LINE = 4096
MAX_HEADER_BYTES = 16384
READ_TIMEOUT = 5.0
MAX_CLIENTS = 16
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Health:
    ok: bool
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{k}: {v}" for k, v in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def _text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def stub_health(stub: Stub) -> Callable[[], Health]:
    """The stub's registration state as a health check."""

    def check() -> Health:
        details: dict[str, Any] = {"registered": stub.registered, "registrations": stub.registrations}
        if stub.runtime is not None:
            details["runtime"] = f"{stub.runtime.name} {stub.runtime.version}"
        if stub.registered:
            return Health(True, details)
        if stub.registrations:
            details["reason"] = "the connection to the runtime was lost; reconnecting"
        else:
            details["reason"] = "not registered with the runtime yet"
        return Health(False, details)

    return check


class StatusServer:
    """Serves ``/healthz`` from ``health()`` and ``/metrics`` from ``metrics``."""

    def __init__(self, health: Callable[[], Health], metrics: PluginMetrics) -> None:
        self._health = health
        self._metrics = metrics
        self._server: asyncio.Server | None = None
        self._clients = 0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the status server is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; raises OSError when it cannot bind."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def route(self, method: str, target: str) -> Response:
        path = target.split("?", 1)[0]
        if path not in ("/healthz", "/metrics"):
            return _text(404, f"not found: {path} (try /healthz or /metrics)")
        if method != "GET":
            return Response(405, b"only GET is supported\n", headers=(("Allow", "GET"),))
        if path == "/metrics":
            return Response(200, self._metrics.render().encode(), METRICS_CONTENT_TYPE)
        health = self._health()
        body = {"status": "ok" if health.ok else "unavailable", **health.details}
        return Response(200 if health.ok else 503, (json.dumps(body) + "\n").encode(), JSON_CONTENT_TYPE)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._clients >= MAX_CLIENTS:
            writer.close()
            return
        self._clients += 1
        try:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    response = await self._read(reader)
            except TimeoutError:
                response = _text(408, "request not received in time")
            writer.write(response.encode())
            async with asyncio.timeout(READ_TIMEOUT):
                await writer.drain()
        except (OSError, TimeoutError) as exc:
            logger.debug("status client went away: %s", exc or type(exc).__name__)
        except Exception:
            logger.exception("status request failed")
        finally:
            self._clients -= 1
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def _read(self, reader: asyncio.StreamReader) -> Response:
        line = await _read_line(reader, MAX_REQUEST_LINE)
        if line is None:
            return _text(414, f"request line longer than {MAX_REQUEST_LINE} bytes")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
            return _text(400, "malformed request line")
        # Headers are not used, but read them so closing does not reset the
        # connection under the client's feet before it reads our answer.
        budget = MAX_HEADER_BYTES
        while True:
            header = await _read_line(reader, budget)
            if header is None:
                return _text(431, f"headers longer than {MAX_HEADER_BYTES} bytes")
            budget -= len(header)
            if header in (b"\r\n", b"\n", b""):
                break
        return self.route(parts[0], parts[1])


async def _read_line(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """A line of at most ``limit`` bytes (b"" at end of stream), or None if longer."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        line = exc.partial
    except asyncio.LimitOverrunError:
        return None
    return None if len(line) > limit else line
