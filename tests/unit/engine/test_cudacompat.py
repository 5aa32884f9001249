"""The CUDA forward-compatibility decision (``engine.cudacompat``): golden cases.

Each case is the compat folder's entry names, the candidate's note (its raw
section bytes, or none) and the host driver's version; the expected decision
and its log line are in ``tests/golden/cuda-compat.json``
(``NRI_GPU_UPDATE_GOLDEN=1`` rewrites it).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfigError, Policy, policy_from_mapping
from nri_gpu.engine.cudacompat import Decision, candidate, decide, library_key, parse_note
from tests.unit.engine import golden

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "cuda-compat.json"
LAYOUT = ["libcuda.so", "libcuda.so.1", "libnvidia-nvvm.so.4", "libnvidia-ptxjitcompiler.so.1"]


def note(drivers: list[int], cuda: str = "13.0", *, owner: bytes = b"NVIDIA Corporation", align: int = 4) -> bytes:
    desc = json.dumps({"Format": 1, "CUDA Version": cuda, "Driver": drivers, "Device": []}).encode()
    name = owner + b"\0"
    padded = name + b"\0" * (-len(name) % align)
    return struct.pack("<III", len(name), len(desc), 1) + padded + desc


# name: (folder entries, note bytes or None, host driver version[, the note section's alignment])
CASES: dict[str, tuple[list[str], bytes | None, str] | tuple[list[str], bytes | None, str, int]] = {
    "newer-major-no-note": ([*LAYOUT, "libcuda.so.555.58.02"], None, "550.163.01"),
    "same-major-newer-minor-no-note": ([*LAYOUT, "libcuda.so.550.200.01"], None, "550.163.01"),
    "older-no-note": ([*LAYOUT, "libcuda.so.535.183.06"], None, "550.163.01"),
    "equal-no-note": ([*LAYOUT, "libcuda.so.550.163.01"], None, "550.163.01"),
    "note-lists-branch": ([*LAYOUT, "libcuda.so.580.65.06"], note([535, 550, 570]), "550.163.01"),
    "note-excludes-branch": ([*LAYOUT, "libcuda.so.580.65.06"], note([535, 570]), "550.163.01"),
    "note-lists-branch-but-older": ([*LAYOUT, "libcuda.so.550.54.15"], note([550]), "550.163.01"),
    "note-8-aligned": ([*LAYOUT, "libcuda.so.580.65.06"], note([550], align=8), "550.163.01", 8),
    "note-of-another-owner": ([*LAYOUT, "libcuda.so.580.65.06"], note([], owner=b"Someone Else"), "550.163.01"),
    "note-not-json": ([*LAYOUT, "libcuda.so.580.65.06"], note([550])[:-3] + b"}}}", "550.163.01"),
    "two-candidates": (["libcuda.so.555.58.02", "libcuda.so.560.35.03"], None, "550.163.01"),
    "no-candidate": (["libcuda.so.1", "libcuda.so"], None, "550.163.01"),
    "not-a-version": (["libcuda.so.999.x"], None, "550.163.01"),
    "major-1000-beats-555": (["libcuda.so.1000.1.1"], None, "555.58.02"),
    "unknown-host-driver": (["libcuda.so.555.58.02"], None, ""),
}


def run(entries: list[str], raw: bytes | None, host: str, align: int = 4) -> dict[str, object]:
    name, why = candidate(entries)
    if name is None:
        return {"use": False, "reason": why}
    try:
        parsed = None if raw is None else parse_note(raw, little_endian=True, align=align)
    except ValueError as exc:
        return {"use": False, "reason": f"{name}: {exc}"}
    decision: Decision = decide(name, parsed, host)
    return {"use": decision.use, "reason": decision.reason}


def test_golden() -> None:
    got = {case: run(*args) for case, args in CASES.items()}
    golden.check(GOLDEN, got)


@pytest.mark.parametrize(
    ("case", "use"),
    [
        ("newer-major-no-note", True),
        ("same-major-newer-minor-no-note", False),
        ("older-no-note", False),
        ("equal-no-note", False),
        ("note-lists-branch", True),
        ("note-excludes-branch", False),
        ("note-lists-branch-but-older", False),
        ("note-8-aligned", True),
        ("note-of-another-owner", True),  # no note of NVIDIA's: the major rule (580 > 550)
        ("note-not-json", False),
        ("two-candidates", False),
        ("no-candidate", False),
        ("not-a-version", False),
        ("major-1000-beats-555", True),  # numbers, not the toolkit's string comparison
        ("unknown-host-driver", False),
    ],
)
def test_decision(case: str, use: bool) -> None:
    """The rules the golden file must keep: a wrong golden cannot pass both."""
    assert run(*CASES[case])["use"] is use


def test_a_note_with_sizes_past_its_section_is_read_as_far_as_it_goes() -> None:
    raw = note([550])
    cut = raw[: len(raw) - 10]
    with pytest.raises(ValueError, match="not JSON"):
        parse_note(cut, little_endian=True, align=4)


def test_a_note_nested_past_the_parsers_recursion_is_not_json() -> None:
    """json.loads raises RecursionError (no ValueError) past ~1000 levels, which a
    4 KiB note can hold: it must be a reason, not a failed start."""
    desc = b"[" * 3000 + b"]" * 3000
    name = b"NVIDIA Corporation\0"
    raw = struct.pack("<III", len(name), len(desc), 1) + name + b"\0" * (-len(name) % 4) + desc
    with pytest.raises(ValueError, match="not JSON"):
        parse_note(raw, little_endian=True, align=4)


def test_a_note_listing_a_huge_driver_array_is_refused() -> None:
    with pytest.raises(ValueError, match="unexpected"):
        parse_note(note(list(range(1000))), little_endian=True, align=4)


@pytest.mark.parametrize(
    ("name", "soname", "is_link", "key"),
    [
        ("libcuda.so.555.58.02", "libcuda.so.1", False, "libcuda.so.1"),
        ("libcuda.so.1", "libcuda.so.1", True, "libcuda.so.1"),
        ("libcuda.so", "libcuda.so.1", True, "libcuda.so"),
        ("libnvidia-gpucomp.so.555.58.02", None, False, "libnvidia-gpucomp.so.555.58.02"),
        ("libcuda-other.so", "libcuda.so.1", True, "libcuda.so.1"),
    ],
)
def test_library_key_is_ldconfigs(name: str, soname: str | None, is_link: bool, key: str) -> None:
    assert library_key(name, soname, is_link=is_link) == key


def test_the_policy_switch_is_on_by_default_and_turns_off() -> None:
    assert Policy().cuda_compat is True
    assert policy_from_mapping({"cuda_compat": False}).cuda_compat is False
    with pytest.raises(EngineConfigError, match=r"policy\.cuda_compat"):
        policy_from_mapping({"cuda_compat": "no"})
