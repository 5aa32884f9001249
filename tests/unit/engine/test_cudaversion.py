"""The CUDA version probe: a child interpreter that loads the driver's libcuda, read
as the NVML probe is (``engine.drain.bounded_output``): its output bounded, and a
child that outlives the time limit, or a grandchild still holding its pipe, killed
with its whole group rather than waited for."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from nri_gpu.engine import cudaversion


def test_a_probe_that_prints_without_end_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudaversion, "_PROBE", "import sys\nwhile True: sys.stdout.write('x' * 65536)\n")
    version, why = cudaversion.read_cuda_version("/nonexistent/libcuda.so.1", timeout=10)
    assert version is None and why is not None and "wrote more than" in why, why


def test_a_grandchild_holding_the_pipe_is_killed_at_the_time_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The probe answers, then leaves a process with its stdout open: waiting for the
    end of the output would wait for that process (subprocess.run does, past its own
    timeout). The group is killed at the limit, and the answer is not taken."""
    marker = tmp_path / "grandchild"
    probe = (
        "import os, sys, time\n"
        "print(0, 12040, flush=True)\n"
        "if os.fork() == 0:\n"
        f"    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
    )
    monkeypatch.setattr(cudaversion, "_PROBE", probe)
    version, why = cudaversion.read_cuda_version("/nonexistent/libcuda.so.1", timeout=1)
    assert version is None and why is not None and "did not answer" in why, why
    assert _ends(int(marker.read_text())), "the grandchild was left running"


def _ends(pid: int) -> bool:
    """Whether ``pid`` exits (the SIGKILL sent to its group is on its way) or is gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 10)[0])
    finally:
        os.close(fd)


def test_a_probe_that_answers_gives_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudaversion, "_PROBE", "print(0, 12040)\n")
    assert cudaversion.read_cuda_version("/nonexistent/libcuda.so.1") == ("12.4", None)
