"""CUDA forward compatibility: whether a container's loader takes the image's
``/usr/local/cuda/compat`` libraries over the driver's.  (pure)

Theory of operation. A CUDA image newer than the node's driver may ship NVIDIA's
``cuda-compat`` package: a newer ``libcuda.so.<version>`` (and the libraries it
loads) in ``/usr/local/cuda/compat``. The toolkit's ``enable-cuda-compat`` hook
(``cmd/nvidia-cdi-hook/cudacompat``) puts that folder first in the loader's
search when it is newer than the driver; this module makes the same decision
from plain values, and the start worker (``engine.start.compat``) supplies them,
read by descriptor in the container's root:

1. ``candidate``: the folder's entries named like ``libcuda.so.*.*`` (the
   toolkit's glob). None: nothing to do. Two or more: the driver's libraries
   win (which one would the image mean?).
2. ``parse_note``: the candidate's ELF section ``.note.cuda.fwd_compatibility``
   (an ELF note owned by ``NVIDIA Corporation`` whose description is JSON:
   ``{"Format": 1, "CUDA Version": "13.0", "Driver": [535, 550, 570], ...}``).
3. ``decide``: with a note, compat is used when the host driver's major is in
   its ``Driver`` list *and* the compat driver version (from the file name) is
   newer than the host's; without one, when the compat major is greater than
   the host's (the toolkit's older rule). Versions compare numerically, field
   by field (the toolkit compares majors as strings: ``"1000" < "555"``).

``library_key`` says under which name glibc's ``ldconfig`` lists a library of
the folder, so a merged cache lists what a rebuild would.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

__all__ = [
    "COMPAT_DIR",
    "MAX_ENTRIES",
    "NOTE_SECTION",
    "Decision",
    "Note",
    "candidate",
    "decide",
    "library_key",
    "looks_like_library",
    "parse_note",
    "version_fields",
]

COMPAT_DIR = "/usr/local/cuda/compat"
NOTE_SECTION = ".note.cuda.fwd_compatibility"
NOTE_OWNER = "NVIDIA Corporation"
MAX_ENTRIES = 256  # a cuda-compat folder holds about a dozen; more is refused, not listed at length
_PREFIX = "libcuda.so."
_MAX_NOTE_DRIVERS = 64


@dataclass(frozen=True)
class Note:
    """The parts of ``.note.cuda.fwd_compatibility`` the decision reads."""

    cuda_version: str
    drivers: tuple[int, ...]


@dataclass(frozen=True)
class Decision:
    """``use``: the compat folder goes first; ``reason``: one line for the log."""

    use: bool
    reason: str
    library: str = ""  # "libcuda.so.555.58.02", when there was one candidate


def version_fields(text: str) -> tuple[int, ...] | None:
    """``"555.58.02"`` -> (555, 58, 2); None unless dot-separated decimal fields.

    >>> version_fields("550.163.01"), version_fields("12.x"), version_fields("")
    ((550, 163, 1), None, None)
    """
    parts = text.split(".")
    if not text or len(text) > 32 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def candidate(names: list[str]) -> tuple[str | None, str]:
    """The one ``libcuda.so.*.*`` among ``names`` (the folder's entries), or None
    and why not ("" when there is none at all).

    >>> candidate(["libcuda.so.1", "libcuda.so.555.58.02"])
    ('libcuda.so.555.58.02', '')
    >>> candidate(["libcuda.so.1"])
    (None, '')
    """
    found = sorted(n for n in names if n.startswith(_PREFIX) and "." in n[len(_PREFIX) :])
    if not found:
        return None, ""
    if len(found) > 1:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        return None, f"{len(found)} candidates in {COMPAT_DIR} ({shown}): the driver's libraries are used"
    return found[0], ""


def parse_note(section: bytes, *, little_endian: bool, align: int) -> Note | None:
    """The note held by the section's bytes (``align``: its ``sh_addralign``), as
    the toolkit reads it: None when it is empty or not NVIDIA's. Raises
    ``ValueError`` for a note of NVIDIA's whose JSON is not what it must be.

    >>> desc = b'{"CUDA Version": "12.5", "Driver": [535, 550]}'
    >>> raw = struct.pack("<III", 19, len(desc), 1) + b"NVIDIA Corporation\\0\\0" + desc
    >>> parse_note(raw, little_endian=True, align=4)
    Note(cuda_version='12.5', drivers=(535, 550))
    """
    if len(section) < 12:
        return None
    namesz, descsz, _ = struct.unpack_from("<III" if little_endian else ">III", section)
    if namesz == 0 or descsz == 0:
        return None
    align = max(align, 1)
    name_end = 12 + (namesz + align - 1) // align * align
    if section[12:name_end].strip(b"\0") != NOTE_OWNER.encode():
        return None
    desc = section[name_end : name_end + descsz].strip(b"\0")
    try:
        data = json.loads(desc.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{NOTE_SECTION}: not JSON ({exc})") from exc
    except RecursionError as exc:  # nesting a 4 KiB note can hold: no ValueError
        raise ValueError(f"{NOTE_SECTION}: not JSON (nested too deeply)") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{NOTE_SECTION}: not a JSON object")
    cuda = data.get("CUDA Version", "")
    drivers = data.get("Driver", [])
    if not isinstance(cuda, str) or not isinstance(drivers, list) or len(drivers) > _MAX_NOTE_DRIVERS:
        raise ValueError(f"{NOTE_SECTION}: unexpected 'CUDA Version' or 'Driver'")
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in drivers):
        raise ValueError(f"{NOTE_SECTION}: 'Driver' must list driver branches as numbers")
    return Note(cuda[:32], tuple(drivers))


def decide(library: str, note: Note | None, host_version: str) -> Decision:
    """Whether ``library`` (the one candidate's name) is used over the host
    driver ``host_version``, given its note (None: it has none).

    >>> decide("libcuda.so.555.58.02", None, "550.163.01").use
    True
    >>> print(decide("libcuda.so.550.54.15", None, "550.163.01").reason)
    libcuda.so.550.54.15 in /usr/local/cuda/compat is not newer than the driver 550.163.01 (no forward-compatibility note: its major must be greater): the driver's libraries are used
    """
    version = library[len(_PREFIX) :]
    mine, host = version_fields(version), version_fields(host_version)
    where = f"{library} in {COMPAT_DIR}"
    if mine is None:
        return Decision(
            False, f"{where}: {version!r} is not a driver version: the driver's libraries are used", library
        )
    if host is None:
        return Decision(False, f"{where}: the host driver's version {host_version!r} is unknown: not used", library)
    if note is None:
        if mine[0] > host[0]:
            return Decision(True, f"{where} is used over the driver {host_version} (no forward-compatibility note: "
                            "its major is greater)", library)  # fmt: skip
        return Decision(False, f"{where} is not newer than the driver {host_version} (no forward-compatibility "
                        "note: its major must be greater): the driver's libraries are used", library)  # fmt: skip
    branches = ",".join(str(d) for d in note.drivers[:16]) or "none"
    if host[0] not in note.drivers:
        return Decision(False, f"{where} (CUDA {note.cuda_version or '?'}) does not support the driver branch "
                        f"{host[0]} (its note lists {branches}): the driver's libraries are used", library)  # fmt: skip
    if mine <= host:
        return Decision(False, f"{where} is not newer than the driver {host_version}: the driver's libraries "
                        "are used", library)  # fmt: skip
    return Decision(True, f"{where} (CUDA {note.cuda_version or '?'}, for driver branches {branches}) is used "
                    f"over the driver {host_version}", library)  # fmt: skip


def looks_like_library(name: str) -> bool:
    """Whether ``ldconfig`` looks at the folder entry ``name`` at all: ``lib*`` or
    ``ld-*`` with ``.so`` in it (glibc's ``elf/ldconfig.c``, ``search_dir``)."""
    return name.startswith(("lib", "ld-")) and ".so" in name


def library_key(name: str, soname: str | None, *, is_link: bool) -> str:
    """The cache name ``ldconfig`` gives the folder entry ``name``, a library whose
    ``DT_SONAME`` is ``soname``: the soname (the entry's own name without one),
    except for a link named like the library's ``.so`` for ``ld(1)``
    (``libcuda.so -> libcuda.so.1``), listed under its own name.

    >>> library_key("libcuda.so.555.58.02", "libcuda.so.1", is_link=False)
    'libcuda.so.1'
    >>> library_key("libcuda.so", "libcuda.so.1", is_link=True)
    'libcuda.so'
    """
    if soname is None or not soname:
        return name
    if is_link and (name == soname or (name.endswith(".so") and soname.startswith(name))):
        return name
    return soname
