"""The golden files' form: JSON with one record per line, so that a file is short
enough to review and a change shows as the records it changes.

A record is an object whose values are scalars or lists of scalars (a mount, a
device, a library); such an object, and any list of scalars, is written on one
line; everything else is indented as ``json.dumps(indent=2)`` would. Keys are
sorted. Reading is plain ``json.loads``. ``check`` compares a value with its file;
``NRI_GPU_UPDATE_GOLDEN=1`` rewrites the file from the value first (then review the diff).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["UPDATE", "check", "dump"]

UPDATE = os.environ.get("NRI_GPU_UPDATE_GOLDEN") == "1"


def _flat(value: Any) -> bool:
    return not isinstance(value, dict | list) or (
        isinstance(value, list) and not any(isinstance(item, dict | list) for item in value)
    )


def _render(value: Any, depth: int) -> str:
    if not value or _flat(value) or (isinstance(value, dict) and all(_flat(v) for v in value.values())):
        return json.dumps(value, sort_keys=True)
    inner, outer = "  " * (depth + 1), "  " * depth
    if isinstance(value, dict):
        lines = [f"{inner}{json.dumps(key)}: {_render(value[key], depth + 1)}" for key in sorted(value)]
        return "{\n" + ",\n".join(lines) + f"\n{outer}}}"
    return "[\n" + ",\n".join(f"{inner}{_render(item, depth + 1)}" for item in value) + f"\n{outer}]"


def dump(value: Any) -> str:
    """``value`` as a golden file's text (ending in a newline)."""
    return _render(value, 0) + "\n"


def check(path: Path, value: Any) -> None:
    """``value`` is what the golden file at ``path`` holds; with ``UPDATE``, the file
    is written from it first."""
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dump(value))
    assert path.exists(), f"{path} is missing; run with NRI_GPU_UPDATE_GOLDEN=1 to create it, then review it"
    assert value == json.loads(path.read_text())
