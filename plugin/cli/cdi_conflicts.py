"""Other CDI specs that define our kind, ``nvidia.com/gpu``, where a runtime would see both.

The CDI cache (container-device-interface ``pkg/cdi/cache.go``) reads
``/etc/cdi`` and then ``/var/run/cdi``; a spec in a later folder wins over one in an
earlier folder for a device of the same name, and two specs in one folder that name
the same device are a conflict: the cache drops *both* copies, so the device works
from neither. NVIDIA's toolkit (1.18+) writes ``/var/run/cdi/nvidia.yaml`` with
the same kind and the same device names (``=0``, ``=GPU-<uuid>``, ``=all``) as ours.

``conflicts(path)`` names every such spec beside ``path`` and in the other standard
folder, with what it does to ours. Reading is bounded: at most ``_FILES_LIMIT``
entries a folder, ``_SIZE_LIMIT`` bytes a file, regular files only (links followed,
as the cache follows them; a FIFO is never waited on). A JSON spec is parsed; a
YAML one is not (no YAML parser is a dependency): its top-level ``kind:`` line is
matched as text, which finds every spec written as YAML block style, as the
toolkit writes them, and misses one whose ``kind`` sits in a flow mapping.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat

__all__ = ["KIND", "SPEC_DIRS", "Conflict", "conflicts", "spec_kind"]

KIND = "nvidia.com/gpu"
# The CDI cache's default folders, lowest priority first.
SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
_EXTENSIONS = (".json", ".yaml")  # what the cache reads; anything else it skips
_FILES_LIMIT = 256
_SIZE_LIMIT = 1 << 20
_YAML_KIND = re.compile(r"""^kind:[ \t]*(["']?)([^"'\s#]+)\1[ \t]*(?:#.*)?$""", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Conflict:
    other: str  # the other spec's path
    same_folder: bool  # True: the cache drops both; False: one shadows the other
    message: str


def spec_kind(folder_fd: int, name: str) -> str | None:
    """The ``kind`` of the spec ``name`` in the folder open as ``folder_fd``; None
    when it is no regular file, too big, unreadable or names no kind."""
    # Links are followed, as the cache follows them; but the target is checked
    # through an O_PATH handle and opened for reading only when it is a regular
    # file: whoever can write the folder must not make us open a device or a FIFO.
    try:
        handle = os.open(name, os.O_PATH | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _SIZE_LIMIT:
            return None
        fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(handle)
    try:
        data = os.read(fd, _SIZE_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > _SIZE_LIMIT:
        return None
    text = data.decode("utf-8", "replace")
    if name.endswith(".json"):
        try:
            doc = json.loads(text)
        except ValueError:
            return None  # the cache cannot load it either
        kind = doc.get("kind") if isinstance(doc, dict) else None
        return kind if isinstance(kind, str) else None
    match = _YAML_KIND.search(text)
    return match.group(2) if match else None


def _specs_of_kind(folder: str, kind: str, skip: str | None) -> list[str]:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        names = sorted(n for n in os.listdir(fd) if n.endswith(_EXTENSIONS) and n != skip)[:_FILES_LIMIT]
        return [os.path.join(folder, n) for n in names if spec_kind(fd, n) == kind]
    except OSError:
        return []
    finally:
        os.close(fd)


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def conflicts(path: str, kind: str = KIND, *, spec_dirs: tuple[str, ...] = SPEC_DIRS) -> list[Conflict]:
    """Every other spec of ``kind`` that the CDI cache would weigh against the spec
    at ``path``: in its folder (both dropped) and, when that is one of ``spec_dirs``,
    in the others (the later folder wins)."""
    folder, name = os.path.split(os.path.abspath(path))
    found = [
        Conflict(
            other,
            True,
            f"{other} also defines CDI kind {kind} in {folder}: the CDI cache drops every device both specs "
            f"name (such as {kind}=0 and {kind}=all), so those devices work from neither",
        )
        for other in _specs_of_kind(folder, kind, name)
    ]
    rank = next((i for i, d in enumerate(spec_dirs) if _same(d, folder)), None)
    if rank is None:
        return found
    for i, other_dir in enumerate(spec_dirs):
        if i == rank or _same(other_dir, folder):
            continue
        for other in _specs_of_kind(other_dir, kind, None):
            if i > rank:
                what = f"{other_dir} beats {folder}: its devices shadow those of {path} with the same names"
            else:
                what = f"{folder} beats {other_dir}: {path} shadows its devices with the same names"
            found.append(Conflict(other, False, f"{other} also defines CDI kind {kind}, and {what}"))
    return found
