"""gRPC calls made by a process of their own, never by the test process.

Why: the test process may host the plugin (``PluginThread``), and the plugin
forks its start worker. gRPC, once a channel exists, registers at-fork handlers
that restart its poller threads in every forked child; in the worker those
threads run on descriptors the worker closes, and in the worker's ldconfig
child (made after ``unshare(CLONE_NEWPID)``, where no thread may be started)
they retry forever. The plugin itself never loads gRPC, and neither does the
process that runs it: every channel lives in this module's child process, which
forks nothing.

How: one child process per test process, started on first use
(``python grpc_process.py FD``: this file, without the ``testbed`` package). It
accepts connections on a listening unix socket made by the parent (``FD``);
each connection is one channel (its first frame names the target and options),
served by a thread of its own, and carries one call at a time: a frame
``{"method": "/pkg.Service/Method", "timeout": s}`` + the serialised request,
answered by ``{"ok": true}`` + the serialised response, or
``{"ok": false, "code": "<grpc.StatusCode name>", "details": ...}``, or
``{"ok": false, "error": ...}`` for a failure that is not an RPC's. A frame is
two big-endian u32 lengths, a JSON header and a body. The child leaves when
its stdin (a pipe from the parent) reaches EOF: when the parent exits or dies.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["GrpcChannel", "RpcFailure"]

_HEAD = struct.Struct(">II")


class RpcFailure(Exception):
    """An RPC failed: ``code`` is the name of its ``grpc.StatusCode``, ``details`` the server's text."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class GrpcChannel:
    """A gRPC channel to ``target`` (``unix:///path``), held by the gRPC process.

    One call at a time: a caller with concurrent calls holds one channel each."""

    def __init__(self, target: str, options: Sequence[tuple[str, Any]] = ()) -> None:
        self._sock = _process().connect()
        _send(self._sock, {"target": target, "options": [list(o) for o in options]})

    def call(self, method: str, request: bytes, timeout: float) -> bytes:
        """The serialised response of unary ``method`` (``/pkg.Service/Method``).
        Raises ``RpcFailure``, or ``RuntimeError`` when no RPC outcome came back."""
        _send(self._sock, {"method": method, "timeout": timeout}, request)
        reply = _recv(self._sock)
        if reply is None:
            raise RuntimeError(f"{method}: the gRPC process closed the channel")
        header, body = reply
        if header.get("ok"):
            return body
        if "code" in header:
            raise RpcFailure(str(header["code"]), str(header.get("details", "")))
        raise RuntimeError(f"{method}: {header.get('error', 'failed')}")

    def close(self) -> None:
        self._sock.close()


# --------------------------------------------------------------------------- framing


def _send(sock: socket.socket, header: dict[str, Any], body: bytes = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(_HEAD.pack(len(head), len(body)) + head + body)


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _recv(sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    """The next frame, None at EOF."""
    lengths = _recv_exactly(sock, _HEAD.size)
    if lengths is None:
        return None
    head_len, body_len = _HEAD.unpack(lengths)
    head = _recv_exactly(sock, head_len)
    body = _recv_exactly(sock, body_len)
    if head is None or body is None:
        return None
    header: dict[str, Any] = json.loads(head)
    return header, body


# --------------------------------------------------------------------------- parent side


class _Process:
    """The child process and the path of the socket it listens on."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="nri-gpu-grpc-")  # 0700: ours alone
        self.path = os.path.join(self._dir, "socket")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            listener.listen(64)  # connections made before the child accepts wait here
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(listener.fileno())],
                stdin=subprocess.PIPE,
                pass_fds=(listener.fileno(),),
            )
        finally:
            listener.close()

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        return sock

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # EOF: the child leaves
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


_lock = threading.Lock()
_running: _Process | None = None


def _process() -> _Process:
    global _running
    with _lock:
        if _running is None or _running.proc.poll() is not None:
            _running = _Process()
            atexit.register(_running.stop)
        return _running


# --------------------------------------------------------------------------- child side


def _serve(listen_fd: int) -> None:
    import grpc  # here only: this process forks nothing

    def connection(sock: socket.socket) -> None:
        with sock:
            opening = _recv(sock)
            if opening is None:
                return
            options = [(str(k), v) for k, v in opening[0].get("options", [])]
            with grpc.insecure_channel(str(opening[0]["target"]), options=options) as channel:
                methods: dict[str, Any] = {}
                while (frame := _recv(sock)) is not None:
                    header, body = frame
                    method = str(header["method"])
                    try:
                        if method not in methods:
                            methods[method] = channel.unary_unary(method)  # bytes in, bytes out
                        reply = methods[method](body, timeout=float(header["timeout"]))
                    except grpc.RpcError as exc:
                        _send(sock, {"ok": False, "code": exc.code().name, "details": exc.details() or ""})
                    except Exception as exc:  # told to the caller, who raises it
                        _send(sock, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                    else:
                        _send(sock, {"ok": True}, reply)

    def accept() -> None:
        listener = socket.socket(fileno=listen_fd)
        while True:
            sock, _ = listener.accept()
            threading.Thread(target=connection, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.buffer.read()  # until the parent closes the pipe or dies
    os._exit(0)  # daemon threads in gRPC calls: no orderly shutdown to wait for


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
