"""Fuzzing the NVML probe's output parser (``engine.nvml.parse_probe_output``).

The line comes from a child that ran the driver's ``libnvidia-ml``: a broken or
unexpected library may print anything. The parser returns an ``NvmlSnapshot``
within its bounds or raises ``NvmlError`` (a ``DiscoveryError``) naming the field,
never anything else; ``check_against_procfs`` then keeps only what procfs shows.
"""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import ComputeInstance, Gpu, GpuInstance, MigCap, MigLayout
from nri_gpu.engine.nvml import MAX_GPUS, MAX_MIG_DEVICES, check_against_procfs, parse_probe_output
from tests.fuzz.support import fuzz, mutated_text, typed

GPU = "GPU-15ce2c5e-15c5-5d80-3940-b9e8e29b964c"
MIG = "MIG-d4f81a18-e24a-9a82-320d-d4171b7882dd"
GOOD = json.dumps(
    {
        "gpus": [
            {
                "index": 0,
                "uuid": GPU,
                "minor": 2,
                "mig": [1, 1],
                "mig_devices": [[0, MIG, 2, 0], [2, MIG[:-1] + "e", 2, 1]],
            },
            {"index": 1, "uuid": GPU[:-1] + "d", "minor": 3, "mig": None, "mig_devices": []},
        ]
    },
    separators=(",", ":"),
)
ERROR = json.dumps({"error": {"call": "nvmlInit_v2", "rc": 9, "text": "Driver Not Loaded"}})
SAMPLES = st.sampled_from([GOOD, ERROR, GOOD.replace("1,1", "0,1"), GOOD.replace('"minor":2', '"minor":2.0')])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)
TEXTS = st.one_of(mutated_text(SAMPLES, max_ops=4), VALUES.map(json.dumps), st.text(max_size=64))

LAYOUT = MigLayout(
    caps_major=236,
    gpu_instances=(
        GpuInstance(
            2,
            2,
            MigCap("/proc/driver/nvidia/capabilities/gpu2/mig/gi2/access", 291, 0o444),
            (ComputeInstance(0, MigCap("/proc/driver/nvidia/capabilities/gpu2/mig/gi2/ci0/access", 292, 0o444)),),
        ),
    ),
)
GPUS = (Gpu(0, 2, "0000:07:00.0", GPU, "NVIDIA A100-SXM4-80GB"),)


@fuzz(300)
@given(text=TEXTS)
@example(text=GOOD)
@example(text=GOOD.replace('"minor":2', '"minor":' + "9" * 5000))
# Found by this test: a field of some 4000 digits was echoed whole in the refusal (4357 characters).
@example(
    text=GOOD.replace(
        '"MIG-d4f81a18-e24a-9a82-320d-d4171b7882dd",2', '"MIG-d4f81a18-e24a-9a82-320d-d4171b7882dd",' + "1" * 4000
    )
)
@example(text=GOOD.replace('"mig":[1,1]', '"mig":[1,' + "7" * 4200 + "]"))
@example(text=json.dumps({"gpus": [json.loads(GOOD)["gpus"][0]] * (MAX_GPUS + 1)}))
def test_probe_output(text: str) -> None:
    got = typed(DiscoveryError, parse_probe_output, text)
    if isinstance(got, DiscoveryError):
        assert len(str(got)) < 4096
        return
    assert len(got.gpus) <= MAX_GPUS
    for gpu in got.gpus:
        assert gpu.uuid.startswith("GPU-") and gpu.minor >= 0 and len(gpu.mig_devices) <= MAX_MIG_DEVICES
        assert all(0 <= d.gi <= 14 and 0 <= d.ci <= 7 and d.uuid.startswith("MIG-") for d in gpu.mig_devices)
    kept, warnings = check_against_procfs(got, GPUS, LAYOUT)
    for gpu in kept.gpus:
        assert (gpu.uuid.lower(), gpu.minor) == (GPU.lower(), 2)
        assert all((d.gi, d.ci) == (2, 0) for d in gpu.mig_devices)
    assert all(isinstance(w, str) and w for w in warnings)
