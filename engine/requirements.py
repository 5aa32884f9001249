"""The ``NVIDIA_REQUIRE_*`` constraint language: parse, then check against the node.  (pure)

An expression is alternatives separated by spaces (OR); each alternative is
conditions separated by commas (AND); a condition is ``<key><op><value>``:

    cuda>=12.0 brand=tesla,driver>=470,driver<471
    = cuda>=12.0  OR  (brand=tesla AND driver>=470 AND driver<471)

Keys: ``cuda`` (the CUDA version the driver supports), ``driver``, ``arch``
(compute capability) and ``brand``. Operators ``=`` ``!=`` ``<`` ``<=`` ``>``
``>=``; versions compare numerically part by part, missing parts being 0
(``12.4`` = ``12.4.0``); ``brand`` compares case-insensitively, with ``=`` and
``!=`` only. Several variables are ANDed.

As the toolkit does, the whole expression is checked once per selected GPU
(``arch`` and ``brand`` take that GPU's values), or once with no GPU. A value
nobody knows counts as satisfied: a GPU's arch or brand silently, the node's
CUDA or driver version with a note that the check could not be made.

The text comes from the image and is checked on the plugin's event loop, so
every size is bounded before work is done: at most ``MAX_VARIABLES`` variables,
``MAX_EXPRESSION_LENGTH`` characters and ``MAX_ALTERNATIVES`` alternatives per
variable, ``MAX_CONDITION_LENGTH`` characters per condition and
``MAX_CONDITIONS`` conditions in all; GPUs with the same arch and brand are
checked once. A message is at most ``MAX_MESSAGE`` characters, and there are at
most ``MAX_NOTES`` notes. (A CUDA 12.8
image asks 151 conditions in 51 alternatives, 2.4 KiB.)
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from nri_gpu.engine.errors import RequirementError, quoted
from nri_gpu.engine.model import Gpu


@dataclass(frozen=True)
class NodeFacts:
    cuda: str | None  # "12.4"; None when unknown
    driver: str | None  # "550.163.01"; None when unknown


class Key(enum.Enum):
    CUDA = "cuda"
    DRIVER = "driver"
    ARCH = "arch"
    BRAND = "brand"


class Op(enum.Enum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


@dataclass(frozen=True)
class Condition:
    key: Key
    op: Op
    value: str  # a version ("12.4") or, for brand, a lower-case name

    def __str__(self) -> str:
        return f"{self.key.value}{self.op.value}{self.value}"


Alternative = tuple[Condition, ...]  # conditions ANDed


@dataclass(frozen=True)
class Expression:
    alternatives: tuple[Alternative, ...]  # ORed; never empty

    def __str__(self) -> str:
        return " ".join(",".join(map(str, alt)) for alt in self.alternatives)


MAX_VARIABLES = 16
MAX_EXPRESSION_LENGTH = 16384
MAX_ALTERNATIVES = 256
MAX_CONDITION_LENGTH = 128
MAX_CONDITIONS = 1024  # over all variables of one container
MAX_MESSAGE = 2048
MAX_NOTES = 8
_SHOWN_FAILURES = 8  # failed alternatives a message lists before "and N more"

_KEYS = {k.value: k for k in Key}
# Longest operator first, so "<=" is never read as "<" followed by "=...".
_CONDITION = re.compile(r"([^<>=!]*)(>=|<=|!=|=|<|>)(.*)", re.DOTALL)
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)*", re.ASCII)
_BRAND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*", re.ASCII)
# For each operator, the results of compare_versions(actual, wanted) that satisfy it.
_HOLDS = {
    Op.EQ: (0,),
    Op.NE: (-1, 1),
    Op.LT: (-1,),
    Op.LE: (-1, 0),
    Op.GT: (1,),
    Op.GE: (0, 1),
}


def parse_expression(expr: str, *, what: str = "", conditions: int = MAX_CONDITIONS) -> Expression:
    """Parse one variable's value; RequirementError ("invalid expression") names the bad part.

    ``conditions`` is how many conditions it may have (what is left of ``MAX_CONDITIONS``).

    >>> str(parse_expression("cuda>=12.0  brand=Tesla,driver>=470"))
    'cuda>=12.0 brand=tesla,driver>=470'
    """
    prefix = f"{what}: " if what else ""
    # Sizes first, counted without splitting: nothing is built for a bomb.
    if len(expr) > MAX_EXPRESSION_LENGTH:
        raise RequirementError(
            f"{prefix}invalid expression: {len(expr)} characters, longer than {MAX_EXPRESSION_LENGTH}: {quoted(expr, 40)}"
        )
    words = expr.split()
    if len(words) > MAX_ALTERNATIVES:
        raise RequirementError(f"{prefix}invalid expression: more than {MAX_ALTERNATIVES} alternatives ({len(words)})")
    count = len(words) + expr.count(",")
    if count > conditions:
        raise RequirementError(
            f"{prefix}invalid expression: more than {MAX_CONDITIONS} conditions in all NVIDIA_REQUIRE_* variables"
        )
    alternatives = tuple(
        tuple(_parse_condition(text, prefix) for text in alternative.split(",")) for alternative in words
    )
    if not alternatives:
        raise RequirementError(f"{prefix}invalid expression {quoted(expr)}: it is empty")
    return Expression(alternatives)


def _parse_condition(text: str, prefix: str) -> Condition:
    def invalid(why: str) -> RequirementError:
        return RequirementError(f"{prefix}invalid expression: {quoted(text)}: {why}")

    if not text:
        raise invalid("empty condition (a stray comma?)")
    if len(text) > MAX_CONDITION_LENGTH:
        raise invalid(f"{len(text)} characters, longer than {MAX_CONDITION_LENGTH}")
    m = _CONDITION.fullmatch(text)
    if m is None:
        raise invalid("no operator (one of =, !=, <, <=, >, >=)")
    name, symbol, value = m[1], m[2], m[3]
    key = _KEYS.get(name)
    if key is None:
        raise invalid(f"unknown key {quoted(name)} (known: arch, brand, cuda, driver)")
    op = Op(symbol)
    if key is Key.BRAND:
        if op not in (Op.EQ, Op.NE):
            raise invalid("brand allows only = and !=")
        if not _BRAND.fullmatch(value):
            raise invalid(f"bad brand {quoted(value)}")
        return Condition(key, op, value.lower())
    if not _VERSION.fullmatch(value):
        raise invalid(f"bad version {quoted(value)} (only digits and dots)")
    return Condition(key, op, value)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1, part by part, missing parts 0; both must be digits and dots.

    >>> compare_versions("12.4", "12.4.0"), compare_versions("550.54.15", "550.163.01"), compare_versions("9", "10")
    (0, -1, -1)
    """

    # Compared as (length, digits) without leading zeros: no int() of huge digit strings.
    def part(p: str) -> tuple[int, str]:
        digits = p.lstrip("0")
        return len(digits), digits

    pa, pb = [part(p) for p in a.split(".")], [part(p) for p in b.split(".")]
    width = max(len(pa), len(pb))
    pa += [(0, "")] * (width - len(pa))
    pb += [(0, "")] * (width - len(pb))
    return (pa > pb) - (pa < pb)


def _holds(condition: Condition, actual: str) -> bool:
    if condition.key is Key.BRAND:
        return (actual.lower() == condition.value) == (condition.op is Op.EQ)
    return compare_versions(actual, condition.value) in _HOLDS[condition.op]


def _actual(condition: Condition, facts: NodeFacts, gpu: Gpu | None) -> str | None:
    """The value ``condition`` is checked against; None when unknown (counts as satisfied)."""
    if condition.key is Key.CUDA:
        value = facts.cuda
    elif condition.key is Key.DRIVER:
        value = facts.driver
    elif gpu is None:
        return None
    else:
        value = gpu.arch if condition.key is Key.ARCH else gpu.brand
    if value is not None and condition.key is not Key.BRAND and not _VERSION.fullmatch(value):
        return None  # the node reports something we cannot compare: unknown
    return value


def _first_failure(
    alternative: Alternative, facts: NodeFacts, gpu: Gpu | None, unknown: list[Condition]
) -> Condition | None:
    """The first condition of ``alternative`` that fails, or None; conditions on unknown node facts go to ``unknown``."""
    skipped: list[Condition] = []
    for condition in alternative:
        actual = _actual(condition, facts, gpu)
        if actual is None:
            if condition.key in (Key.CUDA, Key.DRIVER):
                skipped.append(condition)
        elif not _holds(condition, actual):
            return condition
    unknown.extend(skipped)
    return None


def _describe(facts: NodeFacts, gpu: Gpu | None) -> str:
    def shown(value: str | None) -> str:  # what the driver reports, kept to one short line
        return quoted(value, 60).strip('"') if value else "unknown"

    node = f"cuda {shown(facts.cuda)}, driver {shown(facts.driver)}"
    if gpu is not None:  # only when a GPU's arch or brand failed
        node += f", GPU {gpu.index} ({shown(gpu.model)}): arch {shown(gpu.arch)}, brand {shown(gpu.brand)}"
    return node


def _check_one(name: str, expression: Expression, facts: NodeFacts, gpu: Gpu | None, notes: list[str]) -> None:
    failures: list[Condition] = []
    for alternative in expression.alternatives:
        unknown: list[Condition] = []
        failed = _first_failure(alternative, facts, gpu, unknown)
        if failed is None:
            for condition in unknown:
                what = "CUDA" if condition.key is Key.CUDA else "driver"
                notes.append(f"{name}: {condition} not checked: this node's {what} version is unknown")
            return
        failures.append(failed)
    if any(c.key in (Key.CUDA, Key.DRIVER) for c in failures):
        hint = "update the driver or use an image for an older CUDA"
    else:
        hint = "choose other GPUs or an image without this requirement"
    per_gpu = gpu if any(c.key in (Key.ARCH, Key.BRAND) for c in failures) else None
    listed = " or ".join(map(str, failures[:_SHOWN_FAILURES]))
    if len(failures) > _SHOWN_FAILURES:
        listed += f" (and {len(failures) - _SHOWN_FAILURES} more)"
    raise RequirementError(
        f"{name}: unsatisfied condition: {listed} (this node: {_describe(facts, per_gpu)}); "
        f"{hint} (NVIDIA_DISABLE_REQUIRE=true skips the check)"
    )


def check(requirements: Sequence[tuple[str, str]], facts: NodeFacts, gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """Check every (variable, expression) against the node and the selected GPUs; all must hold.

    Returns notes (checks that could not be made); raises RequirementError for
    the first variable that is malformed or not met.
    """
    if len(requirements) > MAX_VARIABLES + 1:  # a legacy image's implied CUDA_VERSION comes on top
        raise RequirementError(f"more than {MAX_VARIABLES} NVIDIA_REQUIRE_* variables ({len(requirements)})")
    expressions: list[tuple[str, Expression]] = []
    budget = MAX_CONDITIONS
    for name, text in requirements:
        label = quoted(name, 60).strip('"')  # the request layer admits only [A-Z0-9_] names; this is a backstop
        expression = parse_expression(text, what=label, conditions=budget)
        budget -= sum(map(len, expression.alternatives))
        expressions.append((label, expression))
    # Only arch and brand differ between GPUs: one check per distinct pair, named by its first GPU.
    distinct: dict[tuple[str | None, str | None], Gpu] = {}
    for gpu in gpus:
        distinct.setdefault((gpu.arch, gpu.brand), gpu)
    notes: list[str] = []
    for name, expression in expressions:
        for one in distinct.values() if gpus else (None,):
            _check_one(name, expression, facts, one, notes)
    unique = tuple(dict.fromkeys(notes))
    if len(unique) > MAX_NOTES:  # each note is a log line: a thousand unknown conditions make one more
        return (*unique[: MAX_NOTES - 1], f"and {len(unique) - MAX_NOTES + 1} more conditions not checked")
    return unique
