"""Run NRI plugins next to a test's containerd: in a thread (test plugins) or as
the real ``nri-gpu run`` process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nri_gpu.plugin.config import PluginConfig
from nri_gpu.plugin.stub import Stub

ROOT = Path(__file__).resolve().parents[2]  # the checkout: where `python -m nri_gpu.plugin.cli` runs


# This checkout's nri-gpu (beside the running interpreter): what writes a CDI spec.
NRI_GPU = str(Path(sys.executable).with_name("nri-gpu"))
# The compiled CDI hook hack/setup installs beside it: what that spec's hook runs.
NRI_GPU_HOOK = str(Path(sys.executable).with_name("nri-gpu-hook"))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class PluginThread:
    """A plugin object served by our stub on its own event loop in a background thread."""

    def __init__(self, plugin: object, socket: Path, *, name: str = "e2e-test", index: str = "50") -> None:
        # The plugin forks its start worker: no gRPC in the process (see grpc_process).
        loaded = sorted(m for m in sys.modules if m == "grpc" or m.startswith("grpc."))
        assert not loaded, f"gRPC is loaded in the process that would host the plugin: {loaded[:3]}"
        self.plugin = plugin
        self.config = PluginConfig(socket=str(socket), name=name, index=index, reconnect_max=0.2)
        self.stub: Stub | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name=f"plugin-{name}", daemon=True)

    def _main(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self.stub = Stub(self.plugin, self.config)
            await self.stub.run()

        try:
            asyncio.run(serve())
        except BaseException as exc:  # surfaced by stop()/wait_registered()
            self.error = exc

    def start(self, timeout: float = 10.0) -> PluginThread:
        self._thread.start()
        self.wait_registered(1, timeout)
        return self

    @property
    def registrations(self) -> int:
        return self.stub.registrations if self.stub is not None else 0

    def wait_registered(self, count: int, timeout: float = 10.0) -> None:
        def done() -> bool:
            if self.error is not None:
                raise AssertionError(f"plugin thread died: {self.error!r}") from self.error
            return self.stub is not None and self.stub.registered and self.registrations >= count

        wait_until(done, timeout, f"registration #{count} of plugin {self.config.name}")

    def stop(self) -> None:
        if self._loop is not None and self.stub is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.stub.stop)
        self._thread.join(10)
        assert not self._thread.is_alive(), "plugin thread did not stop"
        if self.error is not None:
            raise AssertionError(f"plugin thread failed: {self.error!r}") from self.error

    def __enter__(self) -> PluginThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class NriGpuProcess:
    """The real ``nri-gpu run`` command, as an operator starts it beside containerd."""

    def __init__(self, socket: Path, log_path: Path, *extra: str) -> None:
        self.log_path = log_path
        self.argv = [
            sys.executable,
            "-m",
            "nri_gpu.plugin.cli",
            "run",
            "--socket",
            str(socket),
            "--log-level",
            "debug",
            *extra,
        ]
        self.cwd = ROOT
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> NriGpuProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=_clean_env()
            )
        self.wait_for_log("registered with", timeout)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 10.0, count: int = 1) -> None:
        def seen() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"nri-gpu exited with {self.proc.returncode}:\n{self.log()}")
            return self.log().count(needle) >= count

        wait_until(seen, timeout, f"{needle!r} x{count} in the nri-gpu log")

    def stop(self) -> int:
        """SIGTERM, as a DaemonSet or systemd would; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NRI_PLUGIN_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_tcp_port() -> int:
    """A loopback TCP port nobody listens on right now (for ``--metrics-address``)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthz(port: int, timeout: float = 1.0) -> dict[str, Any] | None:
    """The JSON body of ``nri-gpu run``'s /healthz on 127.0.0.1:``port`` (200 and 503
    alike); None while nothing answers there."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    except (OSError, urllib.error.URLError):
        return None
    parsed: dict[str, Any] = json.loads(body)
    return parsed


def process_usage(port: int, timeout: float = 5.0) -> tuple[int, int]:
    """(resident set size in KiB, open file descriptors) of ``nri-gpu run``, from the
    ``process_*`` metrics of its /metrics on 127.0.0.1:``port``: what an operator's
    Prometheus sees. The scrape's own connection is one of the fds, at every call alike."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    return int(values["process_resident_memory_bytes"]) // 1024, int(values["process_open_fds"])
