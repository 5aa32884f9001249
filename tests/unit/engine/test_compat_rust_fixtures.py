"""The compiled hook's CUDA-compat modules against the Python ones: golden
fixtures that both sides check.

``hook/tests/fixtures/compat/`` holds small ELF files (its ``build.py`` makes
them with gcc: libcuda stubs with and without NVIDIA's fwd-compatibility note,
and hostile variants) and ``expected.json``: what ``engine.start.elf``,
``engine.cudacompat`` and ``engine.start.compat`` say of those files, of a set
of note sections, of decisions and of compat folder layouts. This test
recomputes ``expected.json`` with the Python code and fails when it is stale
(``NRI_GPU_UPDATE_GOLDEN=1`` rewrites it: review the diff); the crate's unit
tests (``cargo test`` in ``hook/``: ``elf.rs``, ``cudacompat.rs``, ``compat.rs``)
read the same file and must agree exactly.

Where the two differ by design the fixture holds what Rust says, named here:
names that are not UTF-8 are held lossily in Rust (a soname's undecodable
bytes and a note's lone surrogate escapes read as U+FFFD).
"""

from __future__ import annotations

import json
import os
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.cudacompat import candidate, decide, library_key, looks_like_library, parse_note, version_fields
from nri_gpu.engine.start import compat, elf
from nri_gpu.engine.start.rootdir import RootDir
from tests.unit.engine import golden
from tests.unit.engine.test_cudacompat import CASES, run

FIXTURES = Path(__file__).resolve().parents[3] / "hook" / "tests" / "fixtures" / "compat"
EXPECTED = FIXTURES / "expected.json"
NOT_INPUTS = {"expected.json", "build.py"}
COMPAT_DIR = "usr/local/cuda/compat"


def outcome(compute: Callable[[], Any]) -> dict[str, Any]:
    """``{"value": ...}``, or ``{"error": ...}`` with the text of what Python raised
    (a ``struct.error`` too, which the reader must never leak: recorded, and then
    compared with the Rust side's text like any other)."""
    try:
        return {"value": compute()}
    except (ValueError, struct.error) as exc:
        return {"error": str(exc)}


def lossy(name: str) -> str:
    """A name read from a file (``surrogateescape``) as Rust holds it: its
    undecodable bytes as U+FFFD."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def no_surrogates(text: str) -> str:
    """A JSON string as Rust holds it: a lone surrogate escape as U+FFFD."""
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def note_value(note: Any) -> dict[str, Any] | None:
    return None if note is None else {"cuda_version": no_surrogates(note.cuda_version), "drivers": list(note.drivers)}


# --------------------------------------------------------------------------- ELF files


def elf_record(data: bytes) -> dict[str, Any]:
    def read(offset: int, size: int) -> bytes:
        return data[offset : offset + size]

    def library() -> dict[str, Any] | None:
        lib = elf.shared_library(read)
        if lib is None:
            return None
        soname = None if lib.soname is None else lossy(lib.soname)
        return {"soname": soname, "flags": lib.flags, "osversion": lib.osversion}

    record = {
        "interpreter": outcome(lambda: elf.interpreter(data[: elf.HEAD_SIZE])),
        "shared_library": outcome(library),
    }
    found: tuple[bytes, bool, int] | None = None

    def note_section() -> dict[str, Any] | None:
        nonlocal found
        found = elf.note_section(read, ".note.cuda.fwd_compatibility")
        if found is None:
            return None
        return {"data": found[0].hex(), "little_endian": found[1], "align": found[2]}

    record["note_section"] = outcome(note_section)
    if found is None:
        return record
    raw, little, align = found
    record["note"] = outcome(lambda: note_value(parse_note(raw, little_endian=little, align=align)))
    return record


def elf_records() -> dict[str, Any]:
    names = sorted(p.name for p in FIXTURES.iterdir() if p.is_file() and p.name not in NOT_INPUTS)
    return {name: elf_record((FIXTURES / name).read_bytes()) for name in names}


# --------------------------------------------------------------------------- note sections


def section(
    desc: bytes, *, owner: bytes = b"NVIDIA Corporation", pad: int = 4, order: str = "<", descsz: int | None = None
) -> bytes:
    """A note: its sizes, ``owner`` and a NUL padded to ``pad``, ``desc``."""
    name = owner + b"\0"
    sizes = struct.pack(order + "III", len(name), len(desc) if descsz is None else descsz, 1)
    return sizes + name + b"\0" * (-len(name) % pad) + desc


def spec_section(spec: dict[str, Any]) -> bytes:
    """The section a note case describes (the crate's test builds it the same way):
    its raw ``section``, or a note of ``desc`` (text) or ``desc_hex`` and the
    optional ``owner``, ``pad``, ``big_endian_sizes`` and ``descsz``."""
    if "section" in spec:
        return bytes.fromhex(spec["section"])
    desc = spec["desc"].encode() if "desc" in spec else bytes.fromhex(spec["desc_hex"])
    return section(
        desc,
        owner=spec.get("owner", "NVIDIA Corporation").encode(),
        pad=spec.get("pad", 4),
        order=">" if spec.get("big_endian_sizes") else "<",
        descsz=spec.get("descsz"),
    )


JSON_TEXTS = [
    '{"CUDA Version": "12.8", "Driver": [535, 550, 570]}',
    "{}",
    '{"Driver": [-0, -5, 0, 123456789012345678901234567890]}',
    '{"Driver": [550.0]}',
    '{"Driver": [1e3]}',
    '{"Driver": [1E+2]}',
    '{"Driver": [true]}',
    '{"Driver": [null]}',
    '{"Driver": ["550"]}',
    '{"Driver": [[550]]}',
    '{"Driver": [{}]}',
    '{"Driver": [NaN, Infinity, -Infinity]}',
    '{"Driver": 550}',
    '{"Driver": null}',
    '{"CUDA Version": 12.8}',
    '{"CUDA Version": null}',
    '{"CUDA Version": "a CUDA version string of more than thirty-two characters"}',
    '{"CUDA Version": "\\u00e9\\ud83d\\ude00x", "Driver": [550]}',
    '{"CUDA Version": "\\ud800"}',
    '{"CUDA Version": "\\ud800\\u0041"}',
    '{"CUDA Version": "\\udc00\\ud800"}',
    '{"CUDA Version": "\\ud83d\\ude0"}',
    '{"CUDA Version": "\\ud83d\\ude0G"}',
    '{"CUDA Version": "\u00e9\u20ac\U0001f600"}',
    '{"CUDA Version": "tab\\there\\n\\"\\\\\\/\\b\\f\\r"}',
    '{"CUDA Version": "1", "CUDA Version": "2"}',
    '{"Driver": [1], "Driver": []}',
    '{"CUDA\\u0020Version": "12.0"}',
    "[550]",
    '"text"',
    "5",
    "null",
    ' \t\n\r{"Driver": [550]} \n',
    '{"Driver": [' + "1," * 63 + "1]}",
    '{"Driver": [' + "1," * 64 + "1]}",
    '{"Driver": [550], "Device": [{"a": [[[{"b": [true, false, null]}]]]}]}',
    "{",
    "[",
    '{"a"',
    '{"a":',
    '{"a": 1',
    '{"a": 1,',
    '{"a": 1,}',
    "[1,]",
    "[1 2]",
    '{"a" 1}',
    "{1: 2}",
    '{"a": 1}}',
    '{"a": 1} x',
    "\ufeff{}",
    "nul",
    "tru",
    "fals",
    "NaNx",
    "-",
    "-x",
    "--1",
    "01",
    "[01]",
    "1.",
    "[1.]",
    "1.e5",
    "1e",
    "1e+",
    "[1e]",
    "[1e+]",
    "[1e+5, 1.5e-3, -0.0]",
    '"abc',
    '"a\\',
    '"a\\x"',
    '"\\u12"',
    '"\\u12G4"',
    '"\\u123',
    '"\\u1234',
    '"a\x01b"',
    '"\\ud800\\u12G4"',
    '"\\ud800\\',
    '"\\ud800\\u',
    '{"a":1}\n\n  x',
    "[\n1\n,\n]",
    "Infinit",
    "-Infinit",
    '{"a": -}',
    " ",
    '["\u00e9\u20ac", x]',
    '{"\u00e9": 1,\n "b": [1,\n  2,, 3]}',
    '{"a": [1, 2}',
    '{"a": {"b": [1}}',
    '[{"a": 1]',
]

RAW_DESCS = [
    b"\0\0\0\0",
    b'\0\0{"Driver": [550]}\0\0',
    b'{"CUDA Version": "\xff"}',
    b"\xe2\x82",
    b'{"a": "\xe2\x82"}',
    b"\xe0\x80\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xf0\x9f\x98",
    b"\xc0\xaf",
    b"abc\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xe2\x28\xa1",
    b"{\xf0\x9f\x98\x80",
]


def note_inputs() -> list[dict[str, Any]]:
    """Every note case: its name, what ``spec_section`` builds it from, and the
    ``little_endian`` and ``align`` that ``parse_note`` reads it with."""
    le4 = {"little_endian": True, "align": 4}
    cases: list[dict[str, Any]] = [{"name": f"json-{i:03d}", "desc": text, **le4} for i, text in enumerate(JSON_TEXTS)]
    cases += [{"name": f"raw-{i:02d}", "desc_hex": raw.hex(), **le4} for i, raw in enumerate(RAW_DESCS)]
    good = '{"CUDA Version": "12.8", "Driver": [550]}'
    cases += [
        {"name": "short", "section": "13000000", **le4},
        {"name": "namesz-0", "section": (struct.pack("<III", 0, 10, 1) + b"x" * 20).hex(), **le4},
        {"name": "descsz-0", "desc": "", **le4},
        {"name": "big-endian", "desc": good, "big_endian_sizes": True, "little_endian": False, "align": 4},
        {"name": "little-read-as-big", "desc": good, "little_endian": False, "align": 4},
        {"name": "align-0", "desc": good, "little_endian": True, "align": 0},
        {"name": "align-8-of-4", "desc": good, "little_endian": True, "align": 8},
        {"name": "align-8", "desc": good, "pad": 8, "little_endian": True, "align": 8},
        {"name": "align-max", "desc": good, "little_endian": True, "align": (1 << 64) - 1},
        {"name": "owner-leading-nul", "desc": good, "owner": "\0NVIDIA Corporation", **le4},
        {"name": "owner-other", "desc": good, "owner": "NVIDIA", **le4},
        {"name": "descsz-past-end", "desc": good, "descsz": 1000, **le4},
        {"name": "descsz-short", "desc": good, "descsz": 10, **le4},
    ]
    rng = random.Random(2025)
    base = '{"Format": 1, "CUDA Version": "13.0", "Driver": [535, 550, 570], "Device": []}'
    alphabet = '{}[]",:0123456789-+.eE \n\\uNaIfty'
    for i in range(40):
        text = list(base)
        for _ in range(rng.randint(1, 2)):
            at = rng.randrange(len(text))
            op = rng.choice(("delete", "insert", "replace"))
            if op == "delete":
                del text[at]
            elif op == "insert":
                text.insert(at, rng.choice(alphabet))
            else:
                text[at] = rng.choice(alphabet)
        cases.append({"name": f"mutant-{i:02d}", "desc": "".join(text), **le4})
    return cases


def note_outcome(raw: bytes, little: bool, align: int) -> dict[str, Any]:
    return outcome(lambda: note_value(parse_note(raw, little_endian=little, align=align)))


def note_records() -> list[dict[str, Any]]:
    records = []
    for spec in note_inputs():
        result = note_outcome(spec_section(spec), spec["little_endian"], spec["align"])
        # One line a case: {"error": ...}, {"note": null} or the note's fields.
        value = result.get("value")
        records.append(
            {
                **spec,
                **(value if value is not None else {"error": result["error"]} if "error" in result else {"note": None}),
            }
        )
    return records


# --------------------------------------------------------------------------- decisions


def decide_records() -> dict[str, Any]:
    """test_cudacompat's golden cases (their inputs too), and more of ``decide``'s
    corners; candidates, version fields, library keys."""
    runs = {}
    for case, args in CASES.items():
        entries, raw, host, *align = args
        runs[case] = {
            "entries": entries,
            "note": None if raw is None else raw.hex(),
            "host": host,
            "align": align[0] if align else 4,
            "result": run(*args),
        }
    plain = [
        ("libcuda.so.580.65.06", None, "550.163.01"),
        ("libcuda.so." + "9" * 32, None, "550.163.01"),
        ("libcuda.so.1." + "9" * 32, None, "550.163.01"),
        ("libcuda.so.555.58.02", None, "9" * 33),
        ("libcuda.so.555.58.02", None, "550.163.01.1"),
        ("libcuda.so.550.163.01.1", None, "550.163.01"),
        ("libcuda.so.555.58.02", None, "555"),
        ("libcuda.so.555.58.02", None, "\u0665\u0665\u0665.1"),
        ("libcuda.so.\u0665\u0665\u0665.1", None, "550.1"),
        ("libcuda.so.555..1", None, "550.1"),
        ("libcuda.so.555.58.02", None, "it's"),
        ("libcuda.so.12.x\n", None, "550.1"),
        ("libcuda", None, "550.1"),
        ("libcuda.so.580.65.06", ("13.0", [535, 550, 570]), "550.163.01"),
        ("libcuda.so.580.65.06", ("", list(range(500, 520))), "510.1"),
        ("libcuda.so.580.65.06", ("12.8", []), "550.163.01"),
        ("libcuda.so.580.65.06", ("12.8", [-550, 0]), "550.163.01"),
        ("libcuda.so.580.65.06", ("12.8", [550]), "0550.163.01"),
        ("libcuda.so.580.65.06", ("12.8", [10**40]), "550.163.01"),
        ("libcuda.so.550.163.01", ("12.8", [550]), "550.163.01"),
        ("libcuda.so.550.163.01.1", ("12.8", [550]), "550.163.01"),
        ("libcuda.so.550.163", ("12.8", [550]), "550.163.01"),
    ]
    decisions = []
    for library, note, host in plain:
        parsed = (
            None
            if note is None
            else parse_note(
                section(json.dumps({"CUDA Version": note[0], "Driver": note[1]}).encode()), little_endian=True, align=4
            )
        )
        d = decide(library, parsed, host)
        decisions.append(
            {
                "library": library,
                "note": None if note is None else {"cuda_version": note[0], "drivers": note[1]},
                "host": host,
                "result": {"use": d.use, "reason": d.reason, "library": d.library},
            }
        )
    name_sets = [
        [],
        ["libcuda.so.1", "libcuda.so"],
        ["libcuda.so.1", "libcuda.so.555.58.02"],
        ["libcuda.so.5.1", "libcuda.so.4.1", "libcuda.so.3.1", "libcuda.so.2.1", "libcuda.so.1.1"],
        ["libcuda.so.a.", "libcuda.so..", "libcuda.so.x"],
        ["libcuda.so.\u00e9.1", "libcuda.so.1.\u20ac"],
        ["LIBCUDA.so.1.1", "libcuda.so1.1", " libcuda.so.1.1"],
    ]
    texts = ["550.163.01", "12.x", "", "1..2", "+1", "1.", ".1", "9" * 32, "9" * 33, "\u0665", "0.00.000", " 1"]
    keys = [
        ("libcuda.so.555.58.02", "libcuda.so.1", False),
        ("libcuda.so.1", "libcuda.so.1", True),
        ("libcuda.so", "libcuda.so.1", True),
        ("libnvidia-gpucomp.so.555.58.02", None, False),
        ("libcuda-other.so", "libcuda.so.1", True),
        ("libcuda.so.1", "", True),
        ("libcuda.so", "libcuda.so", True),
        ("libfoo.so", "libfoo.so.2", False),
        ("libfoo.so.2", "libbar.so.2", True),
    ]
    libraries = ["libcuda.so.1", "ld-linux.so.2", "libc.so", "lib", "libfoo", "README", "xlib.so", "ld-x", "lib.so"]
    return {
        "cases": runs,
        "decide": decisions,
        "candidate": [{"names": names, "result": list(candidate(names))} for names in name_sets],
        "version_fields": [{"text": t, "result": None if (v := version_fields(t)) is None else list(v)} for t in texts],
        "library_key": [
            {"name": n, "soname": s, "is_link": k, "result": library_key(n, s, is_link=k)} for n, s, k in keys
        ],
        "looks_like_library": [{"name": n, "result": looks_like_library(n)} for n in libraries],
    }


# --------------------------------------------------------------------------- compat folders

# Each layout: its operations in a fresh root (paths relative to it) and the
# host driver's version. ["file", path, fixture], ["text", path, content],
# ["link", path, target], ["fifo", path], ["dir", path], ["files", folder, count].
C = COMPAT_DIR
HOST = "550.163.01"


def cuda_compat(version: str, lib: str = "libcuda-plain.so") -> list[list[Any]]:
    """What NVIDIA's cuda-compat package installs: the real files and their links."""
    return [
        ["dir", C],
        ["file", f"{C}/libcuda.so.{version}", lib],
        ["link", f"{C}/libcuda.so.1", f"libcuda.so.{version}"],
        ["link", f"{C}/libcuda.so", "libcuda.so.1"],
        ["file", f"{C}/libnvidia-nvvm.so.{version}", "libnvvm.so"],
        ["link", f"{C}/libnvidia-nvvm.so.4", f"libnvidia-nvvm.so.{version}"],
        ["text", f"{C}/README", "not a library\n"],
    ]


LAYOUTS: dict[str, tuple[list[list[Any]], str]] = {
    "no-folder": ([["dir", "usr/local"]], HOST),
    "empty-folder": ([["dir", C]], HOST),
    "newer-no-note": (cuda_compat("555.58.02"), HOST),
    "older-no-note": (cuda_compat("535.183.06"), HOST),
    "note-lists-branch": (cuda_compat("570.124.06", "libcuda-note.so"), HOST),
    "note-excludes-branch": (cuda_compat("570.124.06", "libcuda-note.so"), "560.35.03"),
    "note-8-aligned": (cuda_compat("580.65.06", "libcuda-note8.so"), HOST),
    "note-not-json": (cuda_compat("580.65.06", "libcuda-badjson.so"), HOST),
    "unknown-host": (cuda_compat("555.58.02"), ""),
    "not-libcuda": (
        [
            ["dir", C],
            ["file", f"{C}/libcuda.so.999.1", "libnvvm.so"],
            ["link", f"{C}/libcuda.so.1", "libcuda.so.999.1"],
        ],
        HOST,
    ),
    "no-soname": ([["dir", C], ["file", f"{C}/libcuda.so.999.1", "no-soname.so"]], HOST),
    "32-bit": ([["dir", C], ["file", f"{C}/libcuda.so.999.1", "lib32.so"]], HOST),
    "aarch64-libcuda": ([["dir", C], ["file", f"{C}/libcuda.so.999.1", "aarch64.so"]], HOST),
    "executable": ([["dir", C], ["file", f"{C}/libcuda.so.999.1", "exec-static"]], HOST),
    "script": ([["dir", C], ["file", f"{C}/libcuda.so.999.0", "script.txt"]], HOST),
    "empty-file": ([["dir", C], ["file", f"{C}/libcuda.so.999.0", "empty.bin"]], HOST),
    "table-past-end": ([["dir", C], ["file", f"{C}/libcuda.so.999.0", "phoff-past-end.so"]], HOST),
    "note-too-big": ([["dir", C], ["file", f"{C}/libcuda.so.999.0", "note-too-big.so"]], HOST),
    "link-climbing-out": (
        [["dir", C], ["link", f"{C}/libcuda.so.999.0", "../../../../../../../../etc/hostname"]],
        HOST,
    ),
    "link-absolute": ([["dir", C], ["link", f"{C}/libcuda.so.999.0", "/etc/hostname"]], HOST),
    "link-dangling": ([["dir", C], ["link", f"{C}/libcuda.so.999.0", "nowhere"]], HOST),
    "link-loop": ([["dir", C], ["link", f"{C}/libcuda.so.999.0", "libcuda.so.999.0"]], HOST),
    "folder-linked-to-etc": (
        [["dir", "usr/local/cuda"], ["dir", "etc"], ["text", "etc/libcuda.so.999.0", "not ELF"], ["link", C, "/etc"]],
        HOST,
    ),
    "folder-linked-out": ([["dir", "usr/local/cuda"], ["link", C, "../../../../../../../../../tmp"]], HOST),
    "folder-is-a-file": ([["dir", "usr/local/cuda"], ["text", C, "x"]], HOST),
    "fifo-named-libcuda": ([["dir", C], ["fifo", f"{C}/libcuda.so.999.0"]], HOST),
    "link-to-fifo": ([["dir", C], ["fifo", "fifo"], ["link", f"{C}/libcuda.so.999.0", "/fifo"]], HOST),
    "directory-named-libcuda": ([["dir", f"{C}/libcuda.so.1.2"]], HOST),
    "two-candidates": ([*cuda_compat("555.58.02"), ["file", f"{C}/libcuda.so.560.35.03", "libcuda-plain.so"]], HOST),
    "256-entries": ([*cuda_compat("555.58.02"), ["files", C, 250]], HOST),
    "257-entries": ([*cuda_compat("555.58.02"), ["files", C, 251]], HOST),
    "used-with-odd-libraries": (
        [
            *cuda_compat("555.58.02", "libcuda-note.so"),
            ["link", f"{C}/libnvidia-ptxjitcompiler.so.1", "../../../../../../../../host-ptx"],
            ["file", f"{C}/libnvidia-other.so.555.58.02", "no-soname.so"],
            ["file", f"{C}/libslash.so.1", "soname-slash.so"],
            ["file", f"{C}/libarm.so.1", "aarch64.so"],
            ["file", f"{C}/lib32.so.1", "lib32.so"],
            ["file", f"{C}/libscript.so.1", "script.txt"],
            ["file", f"{C}/libbroken.so.1", "strtab-outside.so"],
            ["file", f"{C}/ld-nvidia.so.1", "libnvvm.so"],
            ["file", f"{C}/notalib.so.1", "libnvvm.so"],
            ["fifo", f"{C}/libfifo.so.1"],
            ["link", f"{C}/libnvvm-again.so", "libnvidia-nvvm.so.4"],
        ],
        HOST,
    ),
}


def build_layout(tree: Path, operations: list[list[Any]]) -> None:
    """The layout's files under ``tree`` (the crate's tests do the same)."""
    tree.mkdir(parents=True, exist_ok=True)
    for op, path, *args in operations:
        target = tree / path
        if op == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif op == "file":
            target.write_bytes((FIXTURES / args[0]).read_bytes())
        elif op == "text":
            target.write_text(args[0])
        elif op == "link":
            os.symlink(args[0], target)
        elif op == "fifo":
            os.mkfifo(target)
        elif op == "files":
            for i in range(args[0]):
                (target / f"f{i}").touch()
        else:
            raise AssertionError(op)


def layout_records(tmp: Path) -> dict[str, Any]:
    records = {}
    for name, (operations, host) in LAYOUTS.items():
        tree = tmp / name
        build_layout(tree, operations)
        r = RootDir(os.open(tree, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        try:
            found = compat.check(r, host)
        finally:
            r.close()
        d = found.decision
        records[name] = {
            "operations": operations,
            "host": host,
            "decision": None if d is None else {"use": d.use, "reason": d.reason, "library": d.library},
            "entries": [[e.name, e.path, e.flags, e.is_64bit, e.hwcap, e.osversion] for e in found.entries],
            "folder": found.folder,
            "note": found.note,
        }
    return records


# --------------------------------------------------------------------------- the check


@pytest.fixture(scope="module")
def current(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        "elf": elf_records(),
        "notes": note_records(),
        "decisions": decide_records(),
        "layouts": layout_records(tmp_path_factory.mktemp("layouts")),
    }


def test_the_fixture_is_what_the_python_code_says(current: dict[str, Any]) -> None:
    golden.check(EXPECTED, current)


def test_the_fixture_stays_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURES.iterdir() if p.is_file())
    assert total < 200_000, f"{FIXTURES}: {total} bytes"


def test_the_libcuda_stubs_carry_the_notes_of_a_driver_library(current: dict[str, Any]) -> None:
    """The fixture means what it says: a libcuda.so.1 with NVIDIA's note and glibc's ABI tag."""
    record = current["elf"]["libcuda-note.so"]
    assert record["shared_library"] == {"value": {"soname": "libcuda.so.1", "flags": 0x0303, "osversion": 0x030200}}
    assert record["note"] == {"value": {"cuda_version": "12.8", "drivers": [535, 550, 570]}}
    assert current["layouts"]["note-lists-branch"]["decision"]["use"] is True
