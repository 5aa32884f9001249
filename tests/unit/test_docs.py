"""The docs name tests and files that exist: a boundary in docs/security.md is only
as good as the test it names, and a renamed test must not leave it pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
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


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
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
