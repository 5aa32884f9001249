"""The NVIDIA_REQUIRE_* language: parsing, truth tables, per-GPU keys, unknown facts, messages."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpu.engine import requirements
from nri_gpu.engine.errors import RequirementError
from nri_gpu.engine.model import Gpu
from nri_gpu.engine.requirements import (
    MAX_ALTERNATIVES,
    MAX_CONDITION_LENGTH,
    MAX_CONDITIONS,
    MAX_EXPRESSION_LENGTH,
    MAX_MESSAGE,
    MAX_NOTES,
    MAX_VARIABLES,
    Condition,
    Expression,
    Key,
    NodeFacts,
    Op,
    check,
    compare_versions,
    parse_expression,
)

NODE = NodeFacts(cuda="12.4", driver="550.163.01")
CUDA_IMAGE = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=535,driver<536"


def gpu(index: int = 0, arch: str | None = "8.0", brand: str | None = "tesla", model: str = "Tesla A100") -> Gpu:
    return Gpu(
        index=index, minor=index, bus_id=f"0000:0{index}:00.0", uuid=f"GPU-{index}", model=model, arch=arch, brand=brand
    )


def holds(expr: str, facts: NodeFacts = NODE, gpus: tuple[Gpu, ...] = ()) -> bool:
    try:
        check([("NVIDIA_REQUIRE_TEST", expr)], facts, gpus)
    except RequirementError as exc:
        assert "unsatisfied condition" in str(exc), exc
        return False
    return True


def test_doctests() -> None:
    assert doctest.testmod(requirements).failed == 0


# -- parsing --------------------------------------------------------------------------------------


def test_parse_structure() -> None:
    e = parse_expression("cuda>=12.0 brand=Tesla,driver>=470,driver<471")
    assert e == Expression(
        (
            (Condition(Key.CUDA, Op.GE, "12.0"),),
            (
                Condition(Key.BRAND, Op.EQ, "tesla"),
                Condition(Key.DRIVER, Op.GE, "470"),
                Condition(Key.DRIVER, Op.LT, "471"),
            ),
        )
    )


@pytest.mark.parametrize(
    ("text", "op"),
    [
        ("cuda=1", Op.EQ),
        ("cuda!=1", Op.NE),
        ("cuda<1", Op.LT),
        ("cuda<=1", Op.LE),
        ("cuda>1", Op.GT),
        ("cuda>=1", Op.GE),
    ],
)
def test_longest_operator_wins(text: str, op: Op) -> None:
    assert parse_expression(text).alternatives == ((Condition(Key.CUDA, op, "1"),),)


@pytest.mark.parametrize(
    "text", ["  cuda>=12 \t driver>=1\n", "arch=8.0", "brand!=GeForce", "driver=550.163.01", CUDA_IMAGE]
)
def test_valid_expressions_round_trip(text: str) -> None:
    e = parse_expression(text)
    assert parse_expression(str(e)) == e


@pytest.mark.parametrize(
    ("text", "named", "why"),
    [
        ("", '""', "empty"),
        ("   ", '"   "', "empty"),
        ("CUDA>=12.0", '"CUDA"', "unknown key"),
        ("foo=1", '"foo"', "unknown key"),
        ("cuda", '"cuda"', "no operator"),
        ("cuda!12", '"cuda!12"', "no operator"),
        ("cuda>=", '""', "bad version"),
        ("cuda>=12a", '"12a"', "bad version"),
        ("cuda=>12", '">12"', "bad version"),
        ("cuda<>12", '">12"', "bad version"),
        ("cuda>=-1", '"-1"', "bad version"),
        ("cuda>=12..1", '"12..1"', "bad version"),
        ("cuda>=12.", '"12."', "bad version"),
        ("cuda>=\u0661\u0662", '"\u0661\u0662"', "bad version"),
        ("cuda>=12,", "empty condition", "stray comma"),
        ("cuda>=12 ,driver>=1", "empty condition", "stray comma"),
        ("brand>=tesla", '"brand>=tesla"', "brand allows only = and !="),
        ("brand<tesla", '"brand<tesla"', "brand allows only = and !="),
        ("brand=", '""', "bad brand"),
        ("brand==tesla", '"=tesla"', "bad brand"),
        ("cuda>=12 driver", '"driver"', "no operator"),
    ],
)
def test_invalid_expressions_name_the_bad_part(text: str, named: str, why: str) -> None:
    with pytest.raises(RequirementError) as exc:
        parse_expression(text, what="NVIDIA_REQUIRE_CUDA")
    message = str(exc.value)
    assert message.startswith("NVIDIA_REQUIRE_CUDA: invalid expression"), message
    assert named in message and why in message, message


def test_check_reports_a_malformed_variable_by_name() -> None:
    with pytest.raises(RequirementError, match=r'^NVIDIA_REQUIRE_X: invalid expression: "cuda>>1"'):
        check([("NVIDIA_REQUIRE_X", "cuda>>1")], NODE, ())


# -- truth tables ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("cuda=12.4", True),
        ("cuda=12.4.0", True),
        ("cuda=12", False),
        ("cuda=12.40", False),
        ("cuda!=12.4", False),
        ("cuda!=12.5", True),
        ("cuda<12.5", True),
        ("cuda<12.4", False),
        ("cuda<12.10", True),  # numeric, not lexical
        ("cuda<=12.4", True),
        ("cuda<=12.3.99", False),
        ("cuda>12.3.9", True),
        ("cuda>12.4", False),
        ("cuda>=12.4", True),
        ("cuda>=12.10", False),
        ("cuda>=012.004", True),
        ("driver>=550.54.15", True),  # 163 > 54
        ("driver=550.163.1", True),  # 01 = 1
        ("driver<551", True),
        ("driver>550.163.01", False),
        ("driver>=550.163.01.1", False),
    ],
)
def test_each_operator_on_versions(expr: str, expected: bool) -> None:
    assert holds(expr) is expected


@pytest.mark.parametrize(
    ("expr", "facts", "expected"),
    [
        (CUDA_IMAGE, NodeFacts("12.4", "550.163.01"), True),
        (CUDA_IMAGE, NodeFacts("12.2", "535.104.05"), False),  # brand=unknown is not tesla
        ("cuda>=12.4 brand=tesla,driver>=535,driver<536", NodeFacts("12.2", "535.104.05"), True),
        ("cuda>=12.4 brand=tesla,driver>=535,driver<536", NodeFacts("12.2", "536.1"), False),
        ("cuda>=13 driver>=999 cuda<12", NodeFacts("12.4", "550"), False),
        ("cuda>=13 driver>=999 cuda<13", NodeFacts("12.4", "550"), True),
        ("cuda>=12,driver>=550,driver<551", NodeFacts("12.4", "550.1"), True),
        ("cuda>=12,driver>=550,driver<551", NodeFacts("12.4", "551"), False),
    ],
    ids=[
        "cuda-image-new-node",
        "cuda-image-old-node",
        "or-second-alt",
        "and-one-fails",
        "or-all-fail",
        "or-last",
        "and-all",
        "and-last-fails",
    ],
)
def test_spaces_or_commas_and(expr: str, facts: NodeFacts, expected: bool) -> None:
    assert holds(expr, facts, (gpu(),)) is expected


def test_several_variables_are_anded() -> None:
    ok = ("NVIDIA_REQUIRE_A", "cuda>=12")
    bad = ("NVIDIA_REQUIRE_B", "driver>=560")
    assert check([ok, ok], NODE, ()) == ()
    with pytest.raises(RequirementError, match=r"^NVIDIA_REQUIRE_B: unsatisfied condition: driver>=560"):
        check([ok, bad], NODE, ())


# -- arch and brand, per GPU -------------------------------------------------------------------------

A100 = gpu(0, "8.0", "tesla")
H100 = gpu(1, "9.0", "tesla", "NVIDIA H100")
RTX = gpu(2, "8.6", "geforce", "NVIDIA GeForce RTX 3090")
MYSTERY = gpu(3, None, None, "Mystery")


@pytest.mark.parametrize(
    ("expr", "gpus", "expected"),
    [
        ("arch>=8.0", (A100, H100), True),
        ("arch>=9.0", (A100, H100), False),
        ("arch>=9.0", (H100,), True),
        ("arch=8", (A100,), True),
        ("arch=8.0 arch=9.0", (A100, H100), True),  # each GPU satisfies some alternative
        ("arch=8.0,arch=9.0", (A100,), False),
        ("brand=tesla", (A100, H100), True),
        ("brand=Tesla", (A100,), True),
        ("brand=TESLA", (RTX,), False),
        ("brand!=geforce", (A100, RTX), False),
        ("brand!=GeForce", (A100, H100), True),
        ("brand=tesla cuda>=12", (RTX,), True),
        ("brand=tesla cuda>=13", (RTX,), False),
        ("arch>=99", (), True),  # no GPU selected
        ("brand=quadro", (), True),
        ("arch>=99", (MYSTERY,), True),  # unknown arch
        ("brand=quadro", (MYSTERY,), True),
        ("brand=quadro", (MYSTERY, RTX), False),
        ("arch>=99,cuda>=13", (MYSTERY,), False),
    ],
)
def test_arch_and_brand_per_gpu(expr: str, gpus: tuple[Gpu, ...], expected: bool) -> None:
    assert holds(expr, NODE, gpus) is expected


def test_gpu_failures_name_the_gpu() -> None:
    with pytest.raises(RequirementError) as exc:
        check([("NVIDIA_REQUIRE_ARCH", "arch>=9.0")], NODE, (H100, A100))
    assert str(exc.value) == (
        "NVIDIA_REQUIRE_ARCH: unsatisfied condition: arch>=9.0 (this node: cuda 12.4, driver 550.163.01, "
        "GPU 0 (Tesla A100): arch 8.0, brand tesla); choose other GPUs or an image without this requirement "
        "(NVIDIA_DISABLE_REQUIRE=true skips the check)"
    )


# -- unknown node facts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "facts", "notes"),
    [
        (
            "cuda>=12.8",
            NodeFacts(None, "550"),
            ("NVIDIA_REQUIRE_X: cuda>=12.8 not checked: this node's CUDA version is unknown",),
        ),
        (
            "driver>=999",
            NodeFacts("12.4", None),
            ("NVIDIA_REQUIRE_X: driver>=999 not checked: this node's driver version is unknown",),
        ),
        (
            "cuda>=1",
            NodeFacts(None, None),
            ("NVIDIA_REQUIRE_X: cuda>=1 not checked: this node's CUDA version is unknown",),
        ),
        (
            "cuda>=99 driver>=1",
            NodeFacts("12.4", None),
            ("NVIDIA_REQUIRE_X: driver>=1 not checked: this node's driver version is unknown",),
        ),
        ("driver>=500 cuda>=99", NodeFacts(None, "550"), ()),  # decided before the unknown one
        ("cuda>=1,driver>=1", NodeFacts("12.4", "550"), ()),
        (
            "cuda>=99",
            NodeFacts("12.4-beta", "550"),
            ("NVIDIA_REQUIRE_X: cuda>=99 not checked: this node's CUDA version is unknown",),
        ),
    ],
)
def test_unknown_node_versions_pass_with_a_note(expr: str, facts: NodeFacts, notes: tuple[str, ...]) -> None:
    assert check([("NVIDIA_REQUIRE_X", expr)], facts, (A100, H100)) == notes


def test_unknown_does_not_rescue_a_failing_alternative() -> None:
    with pytest.raises(RequirementError, match="unsatisfied condition: cuda>=99"):
        check([("NVIDIA_REQUIRE_X", "cuda>=99,driver>=1")], NodeFacts("12.4", None), ())


# -- messages ---------------------------------------------------------------------------------------


def test_failure_message_names_variable_condition_and_node() -> None:
    with pytest.raises(RequirementError) as exc:
        check([("NVIDIA_REQUIRE_CUDA", "cuda>=12.8")], NODE, (A100,))
    assert str(exc.value) == (
        "NVIDIA_REQUIRE_CUDA: unsatisfied condition: cuda>=12.8 (this node: cuda 12.4, driver 550.163.01); "
        "update the driver or use an image for an older CUDA (NVIDIA_DISABLE_REQUIRE=true skips the check)"
    )


def test_or_failure_lists_each_alternative() -> None:
    with pytest.raises(RequirementError) as exc:
        check([("NVIDIA_REQUIRE_CUDA", "cuda>=12.8 brand=tesla,driver>=470,driver<471")], NODE, (A100,))
    assert str(exc.value).startswith(
        "NVIDIA_REQUIRE_CUDA: unsatisfied condition: cuda>=12.8 or driver<471 (this node: cuda 12.4, driver 550.163.01)"
    )


def test_unknown_fact_shows_as_unknown_in_messages() -> None:
    with pytest.raises(RequirementError, match=r"this node: cuda unknown, driver 550"):
        check([("NVIDIA_REQUIRE_X", "driver>=560")], NodeFacts(None, "550"), ())


def test_notes_are_not_repeated_per_gpu() -> None:
    notes = check([("NVIDIA_REQUIRE_X", "cuda>=1")], NodeFacts(None, "1"), (A100, H100, RTX))
    assert len(notes) == 1


# -- properties --------------------------------------------------------------------------------------

_VERSIONS = st.lists(st.integers(0, 999), min_size=1, max_size=4).map(lambda parts: ".".join(map(str, parts)))


@given(_VERSIONS, _VERSIONS)
def test_compare_versions_is_numeric_with_zero_padding(a: str, b: str) -> None:
    def key(v: str) -> list[int]:
        parts = [int(p) for p in v.split(".")]
        return parts + [0] * (4 - len(parts))

    expected = (key(a) > key(b)) - (key(a) < key(b))
    assert compare_versions(a, b) == expected == -compare_versions(b, a)


def test_compare_versions_takes_huge_numbers() -> None:
    assert compare_versions("1" + "0" * 5000, "9" * 4999) == 1


_LANGUAGE = st.text(alphabet="cudarivebnt<>=!,. 0123456789-aT\t", max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=60), _LANGUAGE))
def test_any_text_parses_or_raises_requirement_error(text: str) -> None:
    try:
        e = parse_expression(text, what="NVIDIA_REQUIRE_X")
    except RequirementError as exc:
        assert str(exc).startswith("NVIDIA_REQUIRE_X: invalid expression")
        return
    assert parse_expression(str(e)) == e


@settings(max_examples=200, deadline=None)
@given(_LANGUAGE, st.sampled_from([NODE, NodeFacts(None, None), NodeFacts("12", "x")]))
def test_check_raises_only_requirement_error(text: str, facts: NodeFacts) -> None:
    try:
        check([("NVIDIA_REQUIRE_X", text)], facts, (A100, MYSTERY))
    except RequirementError:
        pass


# -- hostile sizes: refused at once, with a short message -------------------------------------------

EIGHT = tuple(gpu(i) for i in range(8))
# A CUDA 12.8 image's NVIDIA_REQUIRE_CUDA: 10 brands times 5 driver branches, plus cuda>=.
REAL = "cuda>=12.8 " + " ".join(
    f"brand={b},driver>={d},driver<{d + 1}"
    for d in (470, 525, 535, 550, 560)
    for b in (
        "tesla",
        "unknown",
        "nvidia",
        "nvidiartx",
        "geforce",
        "geforcertx",
        "quadro",
        "quadrortx",
        "titan",
        "titanrtx",
    )
)


@pytest.mark.parametrize(
    ("requirements", "why"),
    [
        ([("NVIDIA_REQUIRE_CUDA", "cuda>=" + "1" * (4 << 20))], f"longer than {MAX_EXPRESSION_LENGTH}"),
        ([("NVIDIA_REQUIRE_CUDA", " ".join(["cuda>=99.0"] * 400_000))], f"longer than {MAX_EXPRESSION_LENGTH}"),
        ([("NVIDIA_REQUIRE_CUDA", ",".join(["cuda>=1.0"] * 400_000))], f"longer than {MAX_EXPRESSION_LENGTH}"),
        (
            [("NVIDIA_REQUIRE_CUDA", " ".join(["cuda>=9"] * (MAX_ALTERNATIVES + 1)))],
            f"more than {MAX_ALTERNATIVES} alt",
        ),
        ([("NVIDIA_REQUIRE_CUDA", ",".join(["cuda>=1"] * 2000))], f"more than {MAX_CONDITIONS} conditions"),
        ([("NVIDIA_REQUIRE_CUDA", "cuda>=1." + "0" * 500)], f"longer than {MAX_CONDITION_LENGTH}"),
        ([(f"NVIDIA_REQUIRE_{i}", "cuda>=1") for i in range(MAX_VARIABLES + 2)], f"more than {MAX_VARIABLES}"),
        (
            [(f"NVIDIA_REQUIRE_{i}", ",".join(["cuda>=1"] * 200)) for i in range(MAX_VARIABLES)],
            f"more than {MAX_CONDITIONS} conditions",
        ),
    ],
    ids=[
        "4-mib-condition",
        "400k-alternatives",
        "400k-conditions",
        "257-alternatives",
        "2000-conditions",
        "long-condition",
        "variables",
        "total-conditions",
    ],
)
def test_requirement_bombs_are_refused_at_once(requirements: list[tuple[str, str]], why: str) -> None:
    # Before the bounds: 2.2 s on 8 GPUs and a 5.6 MB message for 400k alternatives.
    with pytest.raises(RequirementError) as exc:
        check(requirements, NODE, EIGHT)
    message = str(exc.value)  # names the bound that refused it
    assert why in message and len(message) <= MAX_MESSAGE, message[:300]


def test_a_long_list_of_failed_alternatives_is_cut_short() -> None:
    expression = " ".join(f"cuda>={13 + i}.0" for i in range(MAX_ALTERNATIVES))
    with pytest.raises(RequirementError) as exc:
        check([("NVIDIA_REQUIRE_CUDA", expression)], NODE, EIGHT)
    message = str(exc.value)
    assert message.startswith("NVIDIA_REQUIRE_CUDA: unsatisfied condition: cuda>=13.0 or cuda>=14.0 or ")
    assert f"and {MAX_ALTERNATIVES - 8} more" in message and len(message) <= MAX_MESSAGE, message


def test_a_real_cuda_image_requirement_is_well_within_the_bounds() -> None:
    assert len(parse_expression(REAL).alternatives) == 51
    assert check([("NVIDIA_REQUIRE_CUDA", REAL)], NodeFacts(cuda="12.8", driver="550.163.01"), EIGHT) == ()
    worst = [(f"NVIDIA_REQUIRE_{i}", ",".join(["arch>=1.0"] * (MAX_CONDITIONS // MAX_VARIABLES))) for i in range(16)]
    many = tuple(gpu(i, arch=f"{i}.0") for i in range(1, 9))  # eight different archs: no sharing of results
    assert check(worst, NODE, many) == ()  # the most the bounds let through is checked (its cost: a benchmark's)


def test_notes_are_few_however_many_conditions_go_unchecked() -> None:
    expression = ",".join(f"cuda>=1.{i}" for i in range(500))
    notes = check([("NVIDIA_REQUIRE_CUDA", expression)], NodeFacts(cuda=None, driver="550"), EIGHT)
    assert len(notes) == MAX_NOTES and notes[-1] == f"and {500 - MAX_NOTES + 1} more conditions not checked"
    assert notes[0] == "NVIDIA_REQUIRE_CUDA: cuda>=1.0 not checked: this node's CUDA version is unknown"
