"""``engine/__init__.py``: the engine's exported names, loaded on first use."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpu import engine

ROOT = Path(__file__).parents[3]


def _submodules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(engine.__path__, "engine."))


def test_importing_engine_imports_no_submodule() -> None:
    # The CDI hook goes through ``engine`` at every GPU container's start: the
    # package itself must not pull in the planner, the runner or the probes.
    code = (
        "import json, sys; import engine; print(json.dumps(sorted(m for m in sys.modules if m.startswith('engine'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["engine"]


def test_all_lists_exactly_the_exports() -> None:
    assert len(engine.__all__) == len(set(engine.__all__))
    assert set(engine.__all__) == set(engine._EXPORTS)
    assert set(engine.__all__) <= set(dir(engine))


@pytest.mark.parametrize("name", engine.__all__)
def test_each_export_is_its_modules_object_even_after_every_submodule_is_imported(name: str) -> None:
    # Importing ``engine.plan`` binds ``plan`` on the package: an export named
    # like a submodule would then be the module, not the function.
    for module in _submodules():
        importlib.import_module(module)
    module, attribute = engine._EXPORTS[name]
    assert getattr(engine, name) is getattr(importlib.import_module(module), attribute)


def test_no_export_is_named_like_a_submodule() -> None:
    children = {m.split(".")[1] for m in _submodules()}
    assert children and not children & set(engine.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'plan_everything'"):
        engine.plan_everything  # noqa: B018
