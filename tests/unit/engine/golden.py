"""The golden files' form: JSON with one record per line, so that a file is short
enough to review and a change shows as the records it changes.

A record is an object whose values are scalars or lists of scalars (a mount, a
device, a library); such an object, and any list of scalars, is written on one
line; everything else is indented as ``json.dumps(indent=2)`` would. Keys are
sorted. Reading is plain ``json.loads``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dump"]


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
