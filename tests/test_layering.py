"""The dependency rules of the layout, checked on the source (no imports run).

The folders ``engine/`` and ``plugin/`` install as ``nri_gpu.engine`` and
``nri_gpu.plugin`` (pyproject.toml): one distinctive top-level name.

- Nothing imports ``engine`` or ``plugin`` by their folder names: in the checkout
  those would load a second copy of every module beside the installed one.
- ``nri_gpu.engine`` never imports ``nri_gpu.plugin``: the engine must stay usable on its own.
- ``nri_gpu.plugin`` uses the engine through its front door, the names
  ``engine/__init__.py`` exports (``from nri_gpu.engine import parse_request``),
  never a submodule: what the plugin may depend on is that list, and the
  engine's modules stay free to move.
- The NRI adapter (``nri_gpu.plugin``, but ``plugin.cli``) never imports the
  command line and host set-up (``nri_gpu.plugin.cli``), which imports it.
- ``nri_gpu.plugin.ttrpc`` is generic: it imports nothing of NRI, the stub or the engine.
- modules marked ``(pure)`` in their docstring import no I/O modules and call no
  builtin ``open``, so they stay testable with plain values and cannot block the
  event loop.
- ``engine/`` and ``plugin/`` use no relative import: every rule above reads
  absolute names, and ``from ..cli import x`` would slip past them all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_MODULES = {
    "os",
    "socket",
    "asyncio",
    "subprocess",
    "ctypes",
    "shutil",
    "select",
    "selectors",
    "signal",
    "pathlib",
    "io",
    "tempfile",
    "glob",
    "fcntl",
    "mmap",
}


def modules(package: str) -> Iterator[Path]:
    yield from sorted(p for p in (ROOT / package).rglob("*.py") if "_pb2" not in p.name)


def imports_of(path: Path) -> set[str]:
    """The absolute names ``path`` imports (relative imports are refused on their own)."""
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


ENGINE, PLUGIN, CLI = "nri_gpu.engine", "nri_gpu.plugin", "nri_gpu.plugin.cli"


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


PYTHON_SOURCES = [
    p
    for p in sorted(ROOT.rglob("*.py"))
    if not {".venv", "build", "target", ".git"} & set(p.relative_to(ROOT).parts) and "_pb2" not in p.name
]


@pytest.mark.parametrize("path", PYTHON_SOURCES, ids=rel)
def test_nothing_imports_the_folders_by_name(path: Path) -> None:
    bad = {m for m in imports_of(path) if within(m, "engine") or within(m, "plugin")}
    assert not bad, f"{rel(path)} imports {sorted(bad)}: import them as {ENGINE} and {PLUGIN}"


@pytest.mark.parametrize("path", list(modules("engine")), ids=rel)
def test_engine_never_imports_plugin(path: Path) -> None:
    bad = {m for m in imports_of(path) if within(m, PLUGIN)}
    assert not bad, f"{rel(path)} imports {sorted(bad)}"


ADAPTER = [p for p in modules("plugin") if "cli" not in p.relative_to(ROOT / "plugin").parts]


def test_the_adapter_and_the_command_line_are_both_there() -> None:
    assert ROOT / "plugin" / "stub.py" in ADAPTER and ROOT / "plugin" / "cli" / "__main__.py" not in ADAPTER


@pytest.mark.parametrize("path", ADAPTER, ids=rel)
def test_the_nri_adapter_never_imports_the_command_line(path: Path) -> None:
    bad = {m for m in imports_of(path) if within(m, CLI)}
    bad |= {f"{PLUGIN}.{a}" for a in names_from(path, PLUGIN) if a == "cli"}
    assert not bad, f"{rel(path)} imports {sorted(bad)}"


def names_from(path: Path, module: str) -> set[str]:
    """The names ``from <module> import ...`` takes in ``path``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == module:
            found.update(a.name for a in node.names)
    return found


def engine_exports() -> set[str]:
    """``engine.__all__``, read from the source (importing the engine is not this test's business)."""
    tree = ast.parse((ROOT / "engine" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return set(value)
    raise AssertionError("engine/__init__.py has no literal __all__")


def engine_imports_beside_the_front_door(path: Path) -> set[str]:
    """What ``path`` takes from the engine other than its exported names:
    ``import nri_gpu.engine.x``, ``from nri_gpu.engine.x import y``, and ``from
    nri_gpu.engine import z`` where ``z`` is not in ``engine.__all__`` (a
    submodule, or a name not exported)."""
    exported = engine_exports()
    bad: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            bad.update(a.name for a in node.names if a.name.startswith(ENGINE + "."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith(ENGINE + "."):
                bad.add(node.module)
            elif node.module == ENGINE:
                bad.update(f"{ENGINE}.{a.name}" for a in node.names if a.name not in exported)
    return bad


def test_engine_exports_are_read() -> None:
    assert {"parse_request", "may_request", "make_plan", "InventoryCache", "start_work", "cdi_spec"} <= engine_exports()


@pytest.mark.parametrize("path", list(modules("plugin")), ids=rel)
def test_plugin_uses_only_the_engines_front_door(path: Path) -> None:
    bad = engine_imports_beside_the_front_door(path)
    assert not bad, f"{rel(path)} imports {sorted(bad)}: import the name from {ENGINE}, exported there"


@pytest.mark.parametrize(
    "source",
    [
        "from nri_gpu.engine.plan import plan\n",
        "import nri_gpu.engine.discover\n",
        "from nri_gpu.engine import discover\n",
        "def f():\n    from nri_gpu.engine.start import runner\n",
    ],
    ids=["from-submodule", "import-submodule", "submodule-from-package", "inside-a-function"],
)
def test_the_front_door_check_sees_a_submodule_import(tmp_path: Path, source: str) -> None:
    path = tmp_path / "violation.py"
    path.write_text("from nri_gpu.engine import make_plan\n" + source)
    assert engine_imports_beside_the_front_door(path)


@pytest.mark.parametrize("path", list(modules("plugin/ttrpc")), ids=rel)
def test_ttrpc_is_generic(path: Path) -> None:
    allowed = (f"{PLUGIN}.ttrpc", f"{PLUGIN}._proto.ttrpc_pb2", f"{PLUGIN}._proto")
    bad = {m for m in imports_of(path) if m.startswith(("nri_gpu", "plugin", "engine")) and not m.startswith(allowed)}
    assert not bad, f"{rel(path)} imports {sorted(bad)}"
    assert "nri_pb2" not in path.read_text(), f"{rel(path)} mentions the NRI messages"


PURE = [p for pkg in ("plugin", "engine") for p in modules(pkg) if is_pure(p)]


def test_there_are_pure_modules_to_check() -> None:
    assert len(PURE) >= 5, [rel(p) for p in PURE]


def io_of(path: Path) -> set[str]:
    """The I/O modules ``path`` imports, and ``open()`` if it calls the builtin."""
    bad = {m for m in imports_of(path) if m.split(".")[0] in IO_MODULES}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            bad.add(f"open() at line {node.lineno}")
    return bad


@pytest.mark.parametrize("path", PURE, ids=rel)
def test_pure_modules_do_no_io(path: Path) -> None:
    bad = io_of(path)
    assert not bad, f"{rel(path)} is marked (pure) but does I/O: {sorted(bad)}"


@pytest.mark.parametrize(
    "source",
    [
        "from pathlib import Path\n",
        "import io\n",
        "def f():\n    import tempfile\n",
        "from glob import glob\n",
        "import fcntl, mmap\n",
        "def f(p):\n    return open(p).read()\n",
    ],
    ids=["pathlib", "io", "tempfile-in-a-function", "glob", "fcntl-mmap", "builtin-open"],
)
def test_the_pure_check_sees_io(tmp_path: Path, source: str) -> None:
    path = tmp_path / "violation.py"
    path.write_text('"""A parser.  (pure)"""\n' + source)
    assert is_pure(path) and io_of(path)


def relative_imports(path: Path) -> list[str]:
    """Each ``from .x import y`` in ``path``, as written, with its line."""
    return [
        f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import {', '.join(a.name for a in node.names)}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]


@pytest.mark.parametrize("path", [*modules("engine"), *modules("plugin")], ids=rel)
def test_no_relative_imports(path: Path) -> None:
    bad = relative_imports(path)
    assert not bad, f"{rel(path)} imports relatively (the layering rules read absolute names): {bad}"


@pytest.mark.parametrize(
    "source",
    ["from ..cli import main\n", "from . import stub\n", "def f():\n    from .cli.setup import x\n"],
    ids=["parent", "sibling", "inside-a-function"],
)
def test_the_relative_import_check_sees_one(tmp_path: Path, source: str) -> None:
    path = tmp_path / "handlers.py"
    path.write_text("from nri_gpu.engine import make_plan\n" + source)
    assert relative_imports(path)
