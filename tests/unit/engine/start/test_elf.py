"""Static or not: the interpreter of an ELF file, from its first bytes."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from nri_gpu.engine.start.elf import HEAD_SIZE, interpreter


def _head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEAD_SIZE)


def _elf64(phdrs: list[tuple[int, int, int]], tail: bytes = b"") -> bytes:
    """A minimal little-endian ELF64 header plus program headers (type, offset, size)."""
    header = (
        b"\x7fELF\x02\x01\x01"
        + bytes(9)
        + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 64, 0, 0, 64, 56, len(phdrs), 0, 0, 0)
    )
    table = b"".join(struct.pack("<IIQQQQQQ", t, 0, off, 0, 0, size, size, 0) for t, off, size in phdrs)
    return header + table + tail


def test_a_synthetic_dynamic_executable() -> None:
    start = 64 + 2 * 56
    data = _elf64([(6, 64, 112), (3, start, 28)], b"/lib64/ld-linux-x86-64.so.2\0")
    assert interpreter(data) == "/lib64/ld-linux-x86-64.so.2"


def test_a_synthetic_static_executable() -> None:
    assert interpreter(_elf64([(1, 0, 0)])) is None


@pytest.mark.skipif(not Path("/sbin/ldconfig").is_file(), reason="no /sbin/ldconfig on this machine")
def test_glibcs_ldconfig_is_static() -> None:
    assert interpreter(_head("/sbin/ldconfig")) is None


@pytest.mark.skipif(shutil.which("true") is None, reason="no true(1)")
def test_coreutils_true_is_dynamic() -> None:
    found = interpreter(_head(str(shutil.which("true"))))
    assert found is not None and "ld-linux" in found


@pytest.mark.parametrize(
    "data", [b"#!/bin/sh\n", b"", b"\x7fELF\x03\x01" + bytes(60)], ids=["script", "empty", "bad-class"]
)
def test_not_an_elf_file(data: bytes) -> None:
    with pytest.raises(ValueError, match="not an ELF file"):
        interpreter(data)


def test_program_headers_beyond_what_was_read() -> None:
    data = bytearray(_elf64([(1, 0, 0)]))
    struct.pack_into("<Q", data, 0x20, HEAD_SIZE * 2)
    with pytest.raises(ValueError, match="beyond"):
        interpreter(bytes(data))
