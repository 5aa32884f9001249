"""The dependency rules of the layout, checked on the source (no imports run).

- ``engine`` never imports ``plugin``: the engine must stay usable on its own.
- ``plugin.ttrpc`` is generic: it imports nothing of NRI, the stub or the engine.
- modules marked ``(pure)`` in their docstring import no I/O modules, so they
  stay testable with plain values and cannot block the event loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_MODULES = {"os", "socket", "asyncio", "subprocess", "ctypes", "shutil", "select", "selectors", "signal"}


def modules(package: str) -> Iterator[Path]:
    yield from sorted(p for p in (ROOT / package).rglob("*.py") if "_pb2" not in p.name)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def is_pure(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return "(pure)" in doc


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", list(modules("engine")), ids=rel)
def test_engine_never_imports_plugin(path: Path) -> None:
    bad = {m for m in imports_of(path) if m == "plugin" or m.startswith("plugin.")}
    assert not bad, f"{rel(path)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", list(modules("plugin/ttrpc")), ids=rel)
def test_ttrpc_is_generic(path: Path) -> None:
    allowed = ("plugin.ttrpc", "plugin._proto.ttrpc_pb2", "plugin._proto")
    bad = {m for m in imports_of(path) if m.startswith(("plugin", "engine")) and not m.startswith(allowed)}
    assert not bad, f"{rel(path)} imports {sorted(bad)}"
    assert "nri_pb2" not in path.read_text(), f"{rel(path)} mentions the NRI messages"


PURE = [p for pkg in ("plugin", "engine") for p in modules(pkg) if is_pure(p)]


def test_there_are_pure_modules_to_check() -> None:
    assert len(PURE) >= 5, [rel(p) for p in PURE]


@pytest.mark.parametrize("path", PURE, ids=rel)
def test_pure_modules_do_no_io(path: Path) -> None:
    bad = {m for m in imports_of(path) if m.split(".")[0] in IO_MODULES}
    assert not bad, f"{rel(path)} is marked (pure) but imports {sorted(bad)}"
