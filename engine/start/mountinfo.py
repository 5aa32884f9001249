"""Which mounts of a mount namespace are procfs, from ``/proc/<pid>/mountinfo``.  (pure)

procfs is where magic links live (``/proc/<n>/root``, ``/proc/<n>/fd/<k>``,
``/proc/<n>/cwd``): a path through one of them leaves the container's root. The
trusted ldconfig runs with every procfs mount of the container covered, so it
cannot reach one even through a symlink the image planted.
"""

from __future__ import annotations

__all__ = ["proc_mount_points"]


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as \ooo (octal).
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


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
    points: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            raise ValueError(f"mountinfo: malformed line {line!r}")
        if right.split()[0] == "proc":
            points.append(_unescape(fields[4]))
    kept: list[str] = []
    for point in sorted(set(points), key=lambda p: (p.count("/"), p)):
        if not any(point == k or point.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(point)
    return tuple(sorted(kept))
