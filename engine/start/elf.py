"""Is an ELF executable static; what ldconfig reads from a shared library.  (pure)

The trusted ldconfig runs with the container's root as ``/``. A dynamically
linked binary would be loaded by the *container's* ``ld-linux`` (the kernel
resolves ``PT_INTERP`` in the process's root) and with the container's
``/etc/ld.so.preload``: code from the image with the plugin's privileges. So only
a binary without an interpreter is run (glibc's ldconfig is static everywhere
it is shipped: ``static-pie`` on Debian 12).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["HEAD_SIZE", "Read", "SharedLibrary", "interpreter", "note_section", "shared_library"]

HEAD_SIZE = 65536  # program headers follow the 64-byte ELF header in every toolchain's output
_PT_INTERP = 3


def interpreter(head: bytes) -> str | None:
    """The ``PT_INTERP`` path of the ELF file starting with ``head``; None when static.

    >>> interpreter(b"#!/bin/sh\\n")
    Traceback (most recent call last):
    ...
    ValueError: not an ELF file

    Raises ``ValueError`` for a non-ELF file, or one whose program headers lie
    beyond ``head``.
    """
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise ValueError("not an ELF file")
    is64 = head[4] == 2
    order = "<" if head[5] == 1 else ">"
    if is64:
        if len(head) < 64:
            raise ValueError("truncated ELF header")
        (phoff,) = struct.unpack_from(order + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
        entry = order + "IIQQQQQQ"  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, ...
    else:
        (phoff,) = struct.unpack_from(order + "I", head, 0x1C)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x2A)
        entry = order + "IIIIIIII"  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, ...
    if phentsize < struct.calcsize(entry) or phoff + phentsize * phnum > len(head):
        raise ValueError("program headers beyond the part read")
    for i in range(phnum):
        fields = struct.unpack_from(entry, head, phoff + i * phentsize)
        if fields[0] != _PT_INTERP:
            continue
        offset, size = (fields[2], fields[5]) if is64 else (fields[1], fields[4])
        raw = head[offset : offset + size] if offset + size <= len(head) else b"?"
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or "?"
    return None


# --------------------------------------------------------------------------- shared libraries
#
# The CUDA compat folder is image data: its libraries are looked at through
# ``read(offset, size)`` (a ``pread`` of a descriptor the worker checked to be a
# regular file), a few bounded pieces each, never the whole file.

Read = Callable[[int, int], bytes]

_PIECE = 65536  # the most any one read asks for
_NOTE_LIMIT = 4096  # a fwd-compatibility note is about 100 bytes
_SONAME_LIMIT = 4096
_MAX_SECTIONS = 4096
_PT_LOAD, _PT_DYNAMIC, _PT_NOTE = 1, 2, 4
_SHT_NOTE = 7
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_ET_DYN = 3
# ldconfig's flags word for a 64-bit library (FLAG_ELF_LIBC6 with the ABI's
# FLAG_*_LIB64; glibc's sysdeps readelflib.c sets it whatever the library needs).
_LIB64_FLAGS = {62: 0x0303, 183: 0x0A03}  # EM_X86_64, EM_AARCH64


@dataclass(frozen=True)
class SharedLibrary:
    """What ``ldconfig`` reads from a library for its cache entry."""

    soname: str | None  # DT_SONAME; None without one
    flags: int  # ldconfig's flags word: 0x0303 for x86-64
    osversion: int  # from the ``.note.ABI-tag`` note (0 without one)


@dataclass(frozen=True)
class _Head:
    order: str
    e_type: int
    machine: int
    phoff: int
    shoff: int
    phentsize: int
    phnum: int
    shentsize: int
    shnum: int
    shstrndx: int


def _head(read: Read) -> _Head:
    raw = read(0, 64)
    if len(raw) < 64 or raw[:4] != b"\x7fELF" or raw[5] not in (1, 2):
        raise ValueError("not an ELF file")
    if raw[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    order = "<" if raw[5] == 1 else ">"
    e_type, machine = struct.unpack_from(order + "HH", raw, 0x10)
    phoff, shoff = struct.unpack_from(order + "QQ", raw, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(order + "HHHHH", raw, 0x36)
    return _Head(order, e_type, machine, phoff, shoff, phentsize, phnum, shentsize, shnum, shstrndx)


def _table(read: Read, offset: int, entsize: int, count: int, fmt: str, limit: int) -> list[tuple[int, ...]]:
    size = struct.calcsize(fmt)
    if count == 0:
        return []
    if entsize < size or entsize * count > limit:
        raise ValueError(f"a table of {count} entries of {entsize} bytes: over {limit} bytes")
    raw = read(offset, entsize * count)
    if len(raw) < entsize * count:
        raise ValueError("a table beyond the end of the file")
    return [struct.unpack_from(fmt, raw, i * entsize) for i in range(count)]


def shared_library(read: Read) -> SharedLibrary | None:
    """The soname, flags and ABI note of the 64-bit ELF shared library ``read``
    reads; None for one of another kind (not ``ET_DYN``, an ABI ldconfig has no
    64-bit flags for here). Raises ``ValueError`` for a file that is no ELF or
    whose headers point outside it or past the limits."""
    head = _head(read)
    flags = _LIB64_FLAGS.get(head.machine)
    if head.e_type != _ET_DYN or flags is None:
        return None
    o = head.order
    segments = _table(read, head.phoff, head.phentsize, head.phnum, o + "IIQQQQQQ", _PIECE)
    soname, osversion = None, 0
    for p_type, _, offset, _, _, filesz, _, align in segments:
        if p_type == _PT_DYNAMIC:
            soname = _soname(read, o, read(offset, min(filesz, _PIECE)), segments)
        elif p_type == _PT_NOTE:
            osversion = _abi_tag(o, read(offset, min(filesz, _PIECE)), 8 if align == 8 else 4) or osversion
    return SharedLibrary(soname, flags, osversion)


def _soname(read: Read, o: str, dynamic: bytes, segments: list[tuple[int, ...]]) -> str | None:
    strtab = name = None
    for pos in range(0, len(dynamic) - 15, 16):
        tag, value = struct.unpack_from(o + "qQ", dynamic, pos)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            name = value
    if strtab is None or name is None:
        return None
    for p_type, _, offset, vaddr, _, filesz, _, _ in segments:  # the string table's address to a file offset
        if p_type == _PT_LOAD and vaddr <= strtab < vaddr + filesz:
            raw = read(offset + strtab - vaddr + name, _SONAME_LIMIT)
            if b"\0" not in raw:
                raise ValueError("DT_SONAME: no string")
            return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    raise ValueError("DT_STRTAB: outside the file's loaded segments")


def _abi_tag(o: str, notes: bytes, align: int) -> int | None:
    """glibc's ``osversion`` from a ``GNU`` ``NT_GNU_ABI_TAG`` note among ``notes``,
    in 32 bits as ldconfig computes it (an OS field over 255 keeps its low byte).
    Raises ``ValueError`` for a tag whose descriptor runs past the notes."""
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, n_type = struct.unpack_from(o + "III", notes, pos)
        name_at = pos + 12
        desc_at = name_at + -(-namesz // 4) * 4
        if n_type == 1 and notes[name_at : name_at + namesz] == b"GNU\0" and descsz >= 16:
            if desc_at + 16 > len(notes):
                raise ValueError("an ABI tag note cut short")
            os_, major, minor, sub = (int(v) for v in struct.unpack_from(o + "IIII", notes, desc_at))
            return ((os_ & 0xFF) << 24) | ((major & 0xFF) << 16) | ((minor & 0xFF) << 8) | (sub & 0xFF)
        pos = desc_at + -(-descsz // align) * align
    return None


def note_section(read: Read, name: str) -> tuple[bytes, bool, int] | None:
    """The bytes of the ``SHT_NOTE`` section called ``name``, whether the file is
    little-endian and the section's alignment; None when there is none. Raises
    ``ValueError`` (no ELF file, headers out of bounds, a note over 4 KiB)."""
    head = _head(read)
    o = head.order
    if head.shnum > _MAX_SECTIONS:
        raise ValueError(f"{head.shnum} sections: over {_MAX_SECTIONS}")
    sections = _table(read, head.shoff, head.shentsize, head.shnum, o + "IIQQQQIIQQ", _MAX_SECTIONS * 64)
    if not sections or head.shstrndx >= len(sections):
        return None
    names = read(sections[head.shstrndx][4], min(sections[head.shstrndx][5], _PIECE))
    wanted = name.encode()
    for sh_name, sh_type, _, _, offset, size, _, _, align, _ in sections:
        if sh_type != _SHT_NOTE or names[sh_name : sh_name + len(wanted) + 1] != wanted + b"\0":
            continue
        if size > _NOTE_LIMIT:
            raise ValueError(f"{name}: {size} bytes, over {_NOTE_LIMIT}")
        return read(offset, size), o == "<", align
    return None
