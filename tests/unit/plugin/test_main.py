"""``nri-gpu`` as a process: exit codes, signals, errors an operator sees."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def nri_gpu(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nri_gpu.plugin.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_while_waiting_for_the_runtime_exits_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    proc = nri_gpu("run", "--socket", str(tmp_path / "absent.sock"))
    assert proc.stdout is not None
    deadline = time.monotonic() + 10
    seen = ""
    while "waiting for the runtime's NRI socket" not in seen:
        assert time.monotonic() < deadline, seen
        seen += proc.stdout.readline()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=5)
    assert proc.returncode == 0, seen + out
    assert "nri-gpu stopped" in out


def test_bad_flag_value_is_refused_before_connecting(tmp_path: Path) -> None:
    proc = nri_gpu("run", "--index", "7", "--socket", str(tmp_path / "x.sock"))
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 2
    assert "plugin.index: '7' must be exactly two digits" in out


def test_no_command_and_no_runtime_socket_prints_usage() -> None:
    proc = nri_gpu(env={"PATH": "/usr/bin:/bin"})
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 2
    assert "run" in out and "usage" in out.lower()
