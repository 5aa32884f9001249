"""Fuzzing the ``NVIDIA_REQUIRE_*`` language (``engine.requirements``).

An image's env is hostile input. ``parse_expression`` returns an expression
that prints back to itself, or raises ``RequirementError``; ``check`` against
any node facts (versions the node reports may be garbage too) returns notes or
raises ``RequirementError``; ``compare_versions`` is a total order on versions
of any length.

Bounds, checked on every case: parsing and checking finish within
``CASE_SECONDS`` on 8 GPUs, and every message and note is one printable line of
at most ``MAX_MESSAGE`` characters. Hostile sizes are drawn on purpose:
megabyte values, 400k alternatives or conditions, more variables than allowed.
"""

from __future__ import annotations

import time
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.engine.errors import RequirementError
from nri_gpu.engine.model import Gpu
from nri_gpu.engine.requirements import (
    MAX_MESSAGE,
    MAX_NOTES,
    MAX_VARIABLES,
    NodeFacts,
    check,
    compare_versions,
    parse_expression,
)
from tests.fuzz.support import fuzz, mutated_text, typed

VERSION = st.one_of(
    st.sampled_from(["12.4", "12.4.0", "550.163.01", "8.0", "0", "9" * 5000, "1." * 50 + "1"]),
    st.lists(st.integers(0, 10**12).map(str), min_size=1, max_size=5).map(".".join),
)
CONDITIONS = st.tuples(
    st.sampled_from(["cuda", "driver", "arch", "brand", "CUDA", ""]),
    st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "=>", "=="]),
    st.one_of(VERSION, st.sampled_from(["tesla", "GeForce", "nvidia-rtx", "-x", ""])),
).map("".join)
EXPRESSIONS = st.lists(st.lists(CONDITIONS, min_size=1, max_size=3).map(",".join), max_size=3).map(" ".join)
# Up to 3.6 MB (one NRI message carries at most 4 MiB), built by repetition: cheap to draw.
BOMBS = st.tuples(
    st.sampled_from(["cuda>=1 ", "cuda>=1,", "brand=tesla,driver>=470,driver<471 ", "arch>=9.0,", "1", " ", ",", "é"]),
    st.sampled_from([100, 300, 2000, 100_000]),
).map(lambda t: t[0] * t[1])
TEXTS = st.one_of(EXPRESSIONS, mutated_text(EXPRESSIONS), st.text(max_size=30), BOMBS)
FACT = st.one_of(st.none(), VERSION, st.sampled_from(["", "unknown", "12.x"]), st.text(max_size=6))
GPUS = st.lists(
    st.builds(
        Gpu,
        index=st.integers(0, 7),
        minor=st.integers(0, 255),
        bus_id=st.just("0000:07:00.0"),
        uuid=st.just("GPU-1"),
        model=st.just("NVIDIA A100"),
        arch=FACT,
        brand=st.one_of(st.none(), st.sampled_from(["tesla", "Tesla", "geforce", ""])),
    ),
    max_size=3,
)


CASE_SECONDS = 0.25  # this runs on the plugin's event loop; the runtime's deadline is 2 s


def short_line(message: str) -> None:
    assert len(message) <= MAX_MESSAGE and message.isprintable(), f"{len(message)} characters: {message[:200]!r}"


def bounded(call: Any, *args: Any, **kwargs: Any) -> Any:
    began = time.perf_counter()
    got = typed(RequirementError, call, *args, **kwargs)
    seconds = time.perf_counter() - began
    assert seconds < CASE_SECONDS, f"{seconds:.3f} s"
    if isinstance(got, RequirementError):
        short_line(str(got))
    return got


@fuzz(200)
@given(text=TEXTS)
@example(text="cuda>=" + "9" * 5000)
@example(text="cuda>=12.0,,driver>=1")
@example(text="brand=\u0130")
@example(text=" ".join(["cuda>=99.0"] * 400_000))
def test_parse_expression(text: str) -> None:
    got = bounded(parse_expression, text, what="NVIDIA_REQUIRE_CUDA")
    if not isinstance(got, RequirementError):
        assert got.alternatives
        assert str(parse_expression(str(got))) == str(got), "does not print back to itself"


@fuzz(200)
@given(
    requirements=st.one_of(
        st.lists(st.tuples(st.sampled_from(["NVIDIA_REQUIRE_CUDA", "CUDA_VERSION"]), TEXTS), max_size=3),
        st.lists(st.tuples(st.text(max_size=20), TEXTS), max_size=MAX_VARIABLES + 3),
    ),
    cuda=FACT,
    driver=FACT,
    gpus=GPUS,
)
@example(requirements=[("NVIDIA_REQUIRE_CUDA", " ".join(["cuda>=99.0"] * 400_000))], cuda="12.4", driver="550", gpus=[])
def test_check(requirements: list[tuple[str, str]], cuda: str | None, driver: str | None, gpus: list[Gpu]) -> None:
    got = bounded(check, requirements, NodeFacts(cuda, driver), gpus * 3)  # up to 9 GPUs
    if not isinstance(got, RequirementError):
        assert all(isinstance(note, str) for note in got) and len(got) <= MAX_NOTES
        for note in got:
            short_line(note)


@fuzz(200)
@given(a=VERSION, b=VERSION, c=VERSION)
def test_compare_versions_is_a_total_order(a: str, b: str, c: str) -> None:
    ab = typed((), compare_versions, a, b)
    assert ab == -compare_versions(b, a) and compare_versions(a, a) == 0
    if ab <= 0 and compare_versions(b, c) <= 0:
        assert compare_versions(a, c) <= 0
