"""Fuzzing the ``NVIDIA_REQUIRE_*`` language (``engine.requirements``).

An image's env is hostile input. ``parse_expression`` returns an expression
that prints back to itself, or raises ``RequirementError``; ``check`` against
any node facts (versions the node reports may be garbage too) returns notes or
raises ``RequirementError``; ``compare_versions`` is a total order on versions
of any length.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from engine.errors import RequirementError
from engine.model import Gpu
from engine.requirements import NodeFacts, check, compare_versions, parse_expression
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
TEXTS = st.one_of(EXPRESSIONS, mutated_text(EXPRESSIONS), st.text(max_size=30))
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


@fuzz(200)
@given(text=TEXTS)
@example(text="cuda>=" + "9" * 5000)
@example(text="cuda>=12.0,,driver>=1")
@example(text="brand=\u0130")
def test_parse_expression(text: str) -> None:
    got = typed(RequirementError, parse_expression, text, what="NVIDIA_REQUIRE_CUDA")
    if not isinstance(got, RequirementError):
        assert got.alternatives
        assert str(parse_expression(str(got))) == str(got), "does not print back to itself"


@fuzz(200)
@given(
    requirements=st.lists(st.tuples(st.sampled_from(["NVIDIA_REQUIRE_CUDA", "CUDA_VERSION"]), TEXTS), max_size=3),
    cuda=FACT,
    driver=FACT,
    gpus=GPUS,
)
def test_check(requirements: list[tuple[str, str]], cuda: str | None, driver: str | None, gpus: list[Gpu]) -> None:
    got = typed(RequirementError, check, requirements, NodeFacts(cuda, driver), gpus)
    if not isinstance(got, RequirementError):
        assert all(isinstance(note, str) for note in got)


@fuzz(200)
@given(a=VERSION, b=VERSION, c=VERSION)
def test_compare_versions_is_a_total_order(a: str, b: str, c: str) -> None:
    ab = typed((), compare_versions, a, b)
    assert ab == -compare_versions(b, a) and compare_versions(a, a) == 0
    if ab <= 0 and compare_versions(b, c) <= 0:
        assert compare_versions(a, c) <= 0
