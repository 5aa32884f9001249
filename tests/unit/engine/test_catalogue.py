from __future__ import annotations

import doctest

import pytest

from nri_gpu.engine import catalogue
from nri_gpu.engine.model import Capability as C


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("libcuda.so.550.163.01", {C.COMPUTE, C.VIDEO}),
        ("libnvidia-ml.so.550.163.01", {C.UTILITY}),
        ("libnvcuvid.so.550.163.01", {C.VIDEO}),
        ("libGLX_nvidia.so.550.163.01", {C.GRAPHICS, C.DISPLAY}),
        ("libnvidia-ngx.so.550.163.01", {C.NGX}),
        ("libcuda.so.535.54.03", None),  # another driver's leftover
        ("libcuda.so.1", None),  # a link name, not the versioned file
        ("libnvidia-gtk3.so.550.163.01", None),  # deliberately never injected
        ("libz.so.550.163.01", None),
    ],
)
def test_library_capabilities(name: str, expected: set[C] | None) -> None:
    caps = catalogue.library_capabilities(name, "550.163.01")
    assert caps == (frozenset(expected) if expected is not None else None)


def test_doctests() -> None:
    assert doctest.testmod(catalogue).failed == 0


@pytest.mark.parametrize(
    ("model", "arch", "brand"),
    [
        ("NVIDIA A100-SXM4-80GB", "8.0", None),
        ("NVIDIA A10", "8.6", None),
        ("NVIDIA H100 80GB HBM3", "9.0", None),
        ("NVIDIA L40S", "8.9", None),
        ("Tesla T4", "7.5", "tesla"),
        ("NVIDIA GeForce RTX 4090", "8.9", "geforce"),
        ("Unknown Future GPU", None, None),
        # Whole names only: a prefix of another model's name is no match.
        ("Quadro RTX 4000", "7.5", "quadro"),  # Turing, though "RTX 40" starts its name
        ("NVIDIA RTX 4000 Ada Generation", "8.9", None),
        ("NVIDIA GeForce RTX 3080 Ti", "8.6", "geforce"),
        ("NVIDIA RTX A6000", "8.6", None),
        ("NVIDIA A10G", "8.6", None),
        ("NVIDIA A2", "8.6", None),
        ("NVIDIA A2000", None, None),  # no such model: not the A2
        ("NVIDIA L4", "8.9", None),
        ("NVIDIA T400", None, None),  # not the T4
        ("NVIDIA GH200 480GB", "9.0", None),
        ("NVIDIA B200", "10.0", None),
        ("NVIDIA Tesla V100-SXM2-16GB", "7.0", "tesla"),
        ("NVIDIA TITAN RTX", None, "titan"),
        ("NVIDIA Quadroplex", None, None),  # a brand is a whole word too
    ],
)
def test_gpu_facts(model: str, arch: str | None, brand: str | None) -> None:
    assert catalogue.gpu_facts(model) == (arch, brand)
