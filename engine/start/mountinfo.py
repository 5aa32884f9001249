"""What ``/proc/<pid>/mountinfo`` says about a mount namespace.  (pure)

Which mounts are procfs: procfs is where magic links live (``/proc/<n>/root``,
``/proc/<n>/fd/<k>``, ``/proc/<n>/cwd``): a path through one of them leaves the
container's root. The trusted ldconfig runs with every procfs mount of the
container covered, so it cannot reach one even through a symlink the image
planted.
"""

from __future__ import annotations

import re

__all__ = ["proc_mount_points"]

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as \ooo (octal). Most
    # fields have none: those are returned as they are, without a pass per character.
    if "\\" not in field:
        return field
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _mounts(text: str) -> list[tuple[str, str, str]]:
    """(mount point, file system type, source) of every line; ``ValueError`` names a bad one."""
    out: list[tuple[str, str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            raise ValueError(f"mountinfo: malformed line {line!r}")
        out.append((_unescape(fields[4]), tail[0], _unescape(tail[1]) if len(tail) > 1 else ""))
    return out


def proc_mount_points(text: str) -> tuple[str, ...]:
    """Mount points (as the namespace's processes see them) of every ``proc`` mount,
    outermost first, without those below another one (covering that covers them).

    Sample input (one line of a runc container's mountinfo)::

        1043 1041 0:82 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw

    >>> proc_mount_points("1 0 0:1 / / rw - overlay o rw\\n2 1 0:2 / /proc rw - proc proc rw\\n"
    ...                   "3 2 0:3 / /proc/kcore rw - tmpfs t rw\\n4 1 0:4 / /host\\\\040proc rw - proc p rw\\n")
    ('/host proc', '/proc')

    Raises ``ValueError`` naming a line that is not in mountinfo's format.
    """
    points = [point for point, kind, _ in _mounts(text) if kind == "proc"]
    kept: list[str] = []
    for point in sorted(set(points), key=lambda p: (p.count("/"), p)):
        if not any(point == k or point.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(point)
    return tuple(sorted(kept))
