"""engine.nvml: the probe's output parser, the procfs cross-check, and the probe run for
real against the simulated libnvidia-ml (hack/testbed/nvmlsim.c) and NVIDIA's own."""

from __future__ import annotations

import doctest
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine import nvml
from nri_gpu.engine.model import (
    ComputeInstance,
    Gpu,
    GpuInstance,
    MigCap,
    MigLayout,
    NvmlGpu,
    NvmlMigDevice,
    NvmlSnapshot,
)
from nri_gpu.engine.nvml import NvmlError, check_against_procfs, parse_probe_output, read_nvml
from testbed.gpunode import FIXTURE_DRIVER, LIB64, SimNode, build_node, set_nvml_behaviour

UUID0 = "GPU-15ce2c5e-15c5-5d80-3940-b9e8e29b964c"
UUID1 = "GPU-db849053-9e6a-febd-3f12-a512707c3bd3"
MIG_A = "MIG-9de66f8e-132c-c314-d10d-0ea8fb434226"
MIG_B = "MIG-40e76edf-e593-b2f3-67ab-c0ea745bd4dd"


def test_doctests() -> None:
    assert doctest.testmod(nvml).failed == 0


def line(gpus: list[dict[str, Any]]) -> str:
    return json.dumps({"gpus": gpus})


def gpu(index: Any = 0, uuid: str = UUID0, minor: int = 2, mig: Any = (1, 1), devices: Any = ()) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid,
        "minor": minor,
        "mig": None if mig is None else list(mig),
        "mig_devices": [list(d) for d in devices],
    }


# -- parse_probe_output -----------------------------------------------------------------


def test_a_probe_line_becomes_a_snapshot() -> None:
    text = line(
        [
            gpu(devices=[(0, MIG_A, 2, 0), (2, MIG_B, 2, 1)]),
            gpu(1, UUID1, 3, mig=(0, 1)),
            gpu(2, "GPU-00000000-0000-0000-0000-000000000002", 0, mig=None),
        ]
    )
    assert parse_probe_output(text) == NvmlSnapshot(
        (
            NvmlGpu(0, UUID0, 2, True, True, (NvmlMigDevice(0, MIG_A, 2, 0), NvmlMigDevice(2, MIG_B, 2, 1))),
            NvmlGpu(1, UUID1, 3, False, True),
            NvmlGpu(2, "GPU-00000000-0000-0000-0000-000000000002", 0, None, None),
        )
    )


def test_the_old_mig_uuid_form_is_accepted() -> None:
    old = f"MIG-{UUID0}/2/0"
    assert parse_probe_output(line([gpu(devices=[(0, old, 2, 0)])])).gpus[0].mig_devices[0].uuid == old


def test_a_probe_error_names_the_call_and_its_code() -> None:
    text = json.dumps({"error": {"call": "nvmlDeviceGetMigMode", "rc": 4, "text": "Insufficient Permissions"}})
    with pytest.raises(NvmlError, match=r"^nvmlDeviceGetMigMode returned 4 \(Insufficient Permissions\)$"):
        parse_probe_output(text)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "not JSON"),
        ("[]", "not an object"),
        ('{"gpus": 3}', "gpus is not a list"),
        (line([gpu()] * 33), "at most 32"),
        (line([{"index": 0}]), "GPU 0 has no 'mig'"),
        (line([gpu(index=-1)]), "GPU 0 index is -1"),
        (line([gpu(index=True)]), "GPU 0 index is True"),
        (line([gpu(index="0")]), "GPU 0 index is '0'"),
        (line([gpu(uuid="MIG-1234")]), "GPU 0 uuid is 'MIG-1234'"),
        (line([gpu(uuid="GPU-12 34")]), "GPU 0 uuid"),
        (line([gpu(minor=1 << 20)]), "GPU 0 minor is 1048576"),
        (line([gpu(mig=(2, 0))]), "GPU 0 mig is 2"),
        (line([gpu(mig=(1,))]), r"GPU 0 mig is \[1\], not \[current, pending\]"),
        (line([gpu(devices=[(0, MIG_A, 2)])]), "GPU 0 MIG device 0 is"),
        (line([gpu(devices=[(64, MIG_A, 2, 0)])]), "GPU 0 MIG device 0 index is 64"),
        (line([gpu(devices=[(0, UUID1, 2, 0)])]), "GPU 0 MIG device 0 uuid"),
        (line([gpu(devices=[(0, MIG_A, 15, 0)])]), "GPU 0 MIG device 0 gi is 15"),
        (line([gpu(devices=[(0, MIG_A, 2, 8)])]), "GPU 0 MIG device 0 ci is 8"),
        (line([gpu(devices=[(k, f"MIG-{k:08x}", 1, 0) for k in range(65)])]), "at most 64"),
        (line([gpu(devices=[(0, MIG_A, 2, 0), (0, MIG_B, 2, 1)])]), "MIG device index twice"),
        (line([gpu(devices=[(0, MIG_A, 2, 0), (1, MIG_B, 2, 0)])]), r"MIG device \(gi, ci\) twice"),
        (line([gpu(), gpu(1, UUID0.upper().replace("GPU-", "GPU-"), 3)]), "share a UUID"),
        (line([gpu(), gpu(0, UUID1, 3)]), "share a index"),
        (line([gpu(), gpu(1, UUID1, 2)]), "share a minor"),
        (line([gpu(devices=[(0, MIG_A, 2, 0)]), gpu(1, UUID1, 3, devices=[(0, MIG_A, 1, 0)])]), "share a UUID"),
        ("x" * (nvml.MAX_OUTPUT + 1), "more than"),
    ],
)
def test_malformed_probe_output_is_refused_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(NvmlError, match=named):
        parse_probe_output(text)


# -- check_against_procfs ---------------------------------------------------------------


def _cap(minor: int) -> MigCap:
    return MigCap(f"/proc/x/{minor}", minor, 0o444)


GPUS = (Gpu(0, 2, "0000:07:00.0", UUID0, "A100"), Gpu(1, 3, "0000:0f:00.0", UUID1, "A100"))
LAYOUT = MigLayout(
    236, gpu_instances=(GpuInstance(2, 2, _cap(291), (ComputeInstance(0, _cap(292)), ComputeInstance(1, _cap(293)))),)
)


def test_what_procfs_confirms_is_kept_without_warnings() -> None:
    snap = NvmlSnapshot(
        (
            NvmlGpu(0, UUID0.upper(), 2, True, True, (NvmlMigDevice(0, MIG_A, 2, 0), NvmlMigDevice(2, MIG_B, 2, 1))),
            NvmlGpu(1, UUID1, 3, False, False),
        )
    )
    assert check_against_procfs(snap, GPUS, LAYOUT) == (snap, ())


def test_gpus_that_do_not_match_procfs_are_dropped_with_a_warning() -> None:
    snap = NvmlSnapshot(
        (
            NvmlGpu(0, UUID0, 3, True, True, (NvmlMigDevice(0, MIG_A, 2, 0),)),  # minor differs
            NvmlGpu(1, "GPU-00000000-aaaa-bbbb-cccc-000000000000", 3, False, False),  # not in procfs
            NvmlGpu(2, UUID1, 3, False, False),
        )
    )
    kept, warnings = check_against_procfs(snap, GPUS, LAYOUT)
    assert kept == NvmlSnapshot((NvmlGpu(2, UUID1, 3, False, False),))
    assert warnings[0] == f"NVML GPU 0 ({UUID0}, minor 3) has minor 2 in procfs; its MIG devices are ignored"
    assert warnings[1].startswith("NVML GPU 1 (GPU-00000000-aaaa-bbbb-cccc-000000000000, minor 3) not in procfs")
    # procfs's two CIs now have no NVML name: said, not silently.
    assert [w.split(" is not listed")[0] for w in warnings[2:]] == [
        "MIG device gpu2/mig/gi2/ci0",
        "MIG device gpu2/mig/gi2/ci1",
    ]


def test_mig_devices_procfs_does_not_show_are_dropped_with_a_warning() -> None:
    snap = NvmlSnapshot(
        (
            NvmlGpu(
                0,
                UUID0,
                2,
                True,
                True,
                (
                    NvmlMigDevice(0, MIG_A, 2, 0),
                    NvmlMigDevice(1, "MIG-11111111-1111-1111-1111-111111111111", 2, 5),  # no ci5
                    NvmlMigDevice(2, "MIG-22222222-2222-2222-2222-222222222222", 9, 0),  # no gi9
                    NvmlMigDevice(3, MIG_B, 2, 1),
                ),
            ),
        )
    )
    kept, warnings = check_against_procfs(snap, GPUS, LAYOUT)
    assert [d.index for d in kept.gpus[0].mig_devices] == [0, 3]
    assert len(warnings) == 2
    assert "0:1 (MIG-11111111-1111-1111-1111-111111111111) is gi 2 ci 5 of GPU minor 2" in warnings[0]
    assert "0:2 (MIG-22222222-2222-2222-2222-222222222222) is gi 9 ci 0" in warnings[1]


# -- the probe, run for real ------------------------------------------------------------


@pytest.fixture
def sim(tmp_path: Path) -> SimNode:
    # GPU 0 (minor 2): five MIG devices, so j has a gap; GPU 1 (minor 3): MIG on, none.
    return build_node(
        tmp_path,
        gpus=4,
        model="NVIDIA A100-SXM4-40GB",
        mig={0: [(2, [0, 1, 2]), (3, [0]), (9, [0])], 1: []},
        driver_files=FIXTURE_DRIVER,
    )


def libnvml(node: SimNode) -> str:
    return str(node.driver_root / LIB64 / "libnvidia-ml.so.1")


def test_the_probe_reads_the_simulated_nvml(sim: SimNode) -> None:
    snapshot, error = read_nvml(libnvml(sim))
    assert error is None and snapshot is not None
    assert [(g.index, g.uuid, g.minor) for g in snapshot.gpus] == [(g.index, g.uuid, g.minor) for g in sim.gpus]
    assert [(g.mig_current, g.mig_pending) for g in snapshot.gpus] == [
        (True, True),
        (True, True),
        (False, False),
        (False, False),
    ]
    devices = snapshot.gpus[0].mig_devices
    assert [(d.index, d.gi, d.ci) for d in devices] == [(0, 2, 0), (2, 2, 1), (3, 2, 2), (4, 3, 0), (5, 9, 0)]
    expected = sim.mig_devices()
    assert list(expected) == [0]
    assert [(d.index, d.uuid, d.gi, d.ci) for d in devices] == [(m.index, m.uuid, m.gi, m.ci) for m in expected[0]]
    assert all(nvml._MIG_UUID.fullmatch(d.uuid) and d.uuid[4:] == d.uuid[4:].lower() for d in devices)
    assert snapshot.gpus[1].mig_devices == ()


def test_an_init_failure_is_reported_with_nvmls_words(sim: SimNode) -> None:
    set_nvml_behaviour(sim, init_rc=9)
    assert read_nvml(libnvml(sim)) == (None, "NVML unavailable: nvmlInit_v2 returned 9 (Driver Not Loaded)")
    set_nvml_behaviour(sim, init_rc=999)
    assert read_nvml(libnvml(sim)) == (None, "NVML unavailable: nvmlInit_v2 returned 999 (Unknown Error)")


def test_a_probe_that_hangs_is_killed_and_is_an_error(sim: SimNode) -> None:
    set_nvml_behaviour(sim, init_sleep_ms=30_000)
    snapshot, error = read_nvml(libnvml(sim), timeout=0.5)
    assert snapshot is None and error is not None
    assert "did not answer within 0.5 s; killed" in error


def test_a_missing_or_broken_library_is_an_error(tmp_path: Path) -> None:
    snapshot, error = read_nvml(str(tmp_path / "libnvidia-ml.so.1"))
    assert snapshot is None and error is not None and "NVML probe of" in error and "failed (exit 1)" in error
    (tmp_path / "empty.so").write_bytes(b"")
    assert "OSError" in (read_nvml(str(tmp_path / "empty.so"))[1] or "")


def test_probe_wall_time_on_the_sim(sim: SimNode) -> None:
    times = []
    for _ in range(20):
        start = time.monotonic()
        assert read_nvml(libnvml(sim))[0] is not None
        times.append((time.monotonic() - start) * 1000)
    print(
        f"NVML probe on the sim: p50 {statistics.median(times):.1f} ms, max {max(times):.1f} ms"
    )  # measured, not asserted


def test_the_probe_s_output_is_read_only_up_to_its_limit() -> None:
    """A broken or hostile library printing without end: read a little past the
    limit, then the child's whole group is killed (``communicate`` held it all)."""
    import sys

    from nri_gpu.engine.drain import bounded_output

    for stream in ("stdout", "stderr"):
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys\nwhile True: sys.{stream}.write('x' * 65536)"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err = bounded_output(proc, 10.0, 1 << 18)  # it never stops writing: cut off at the cap, killed
        assert (1 << 18) < len(out if stream == "stdout" else err) <= (1 << 18) + 65536
        assert proc.returncode == -9
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    with pytest.raises(subprocess.TimeoutExpired):
        bounded_output(proc, 0.3, 1 << 18)
    assert proc.returncode == -9
