"""The docs name tests and files that exist: a boundary in docs/security.md is only
as good as the test it names, and a renamed test must not leave it pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The READMEs name tests as the security and deploy docs do (each privilege with the test
# that holds it): they are checked the same way.
DOCS = [
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    ROOT / "deploy" / "README.md",
    ROOT / "deploy" / "helm" / "nri-gpu" / "README.md",
]
# `tests/x.py::test_a`, `::test_b` (same file as the last one named), or `tests/x.py`.
_REFERENCE = re.compile(r"`((?:tests|engine|plugin|deploy|hack)/[\w./-]+)?(?:::(\w+))?`")


def _references(text: str) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    last: str | None = None
    for match in _REFERENCE.finditer(text):
        path, name = match.group(1), match.group(2)
        if path is None and name is None:
            continue
        if path is None:
            if last is None:
                continue
            path = last
        elif path.endswith(".py"):
            last = path
        found.append((path, name))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_file_and_test_a_doc_names_exists(doc: Path) -> None:
    missing = []
    for path, name in _references(doc.read_text()):
        target = ROOT / path
        if not target.exists():
            missing.append(path)
        elif name is not None and not re.search(rf"^(?:async )?def {name}\b", target.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"{doc.name} names what does not exist: {missing}"


def test_the_reference_pattern_sees_both_forms() -> None:
    refs = _references("`tests/a.py::test_x`, `::test_y` and `deploy/README.md`")
    assert refs == [("tests/a.py", "test_x"), ("tests/a.py", "test_y"), ("deploy/README.md", None)]


# A test named alone (`test_x`, not after a file or `::`), as deploy/README.md's table does.
_BARE_TEST = re.compile(r"(?<![:\w/])`(test_\w+)`")


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)\b", path.read_text(), re.M))
    return names


def test_every_test_a_doc_names_alone_exists() -> None:
    defined = _defined_tests()
    missing = {
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in DOCS
        for name in _BARE_TEST.findall(doc.read_text())
        if name not in defined
    }
    assert not missing, f"docs name tests that do not exist: {sorted(missing)}"


def test_the_bare_pattern_leaves_the_other_forms_to_the_first_check() -> None:
    text = "`test_a`, `tests/x.py::test_b`, `::test_c`"
    assert _BARE_TEST.findall(text) == ["test_a"]
