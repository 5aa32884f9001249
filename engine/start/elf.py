"""Is an ELF executable static, from its first bytes.  (pure)

The trusted ldconfig runs with the container's root as ``/``. A dynamically
linked binary would be loaded by the *container's* ``ld-linux`` (the kernel
resolves ``PT_INTERP`` in the process's root) and with the container's
``/etc/ld.so.preload``: code from the image with the plugin's privileges. So only
a binary without an interpreter is run (glibc's ldconfig is static everywhere
it is shipped: ``static-pie`` on Debian 12).
"""

from __future__ import annotations

import struct

__all__ = ["HEAD_SIZE", "interpreter"]

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
