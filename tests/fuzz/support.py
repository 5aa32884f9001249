"""What every fuzz test shares: the settings profiles, the seed, the hang guard and the mutators.

Profiles. ``nri-gpu-fuzz`` is the default: each test runs the few hundred cases
it asks for, so the whole directory takes well under a minute. With
``NRI_GPU_FUZZ_LONG=1`` the ``nri-gpu-fuzz-long`` profile runs ``LONG_EXAMPLES``
cases per test instead. Profiles are applied per test (``fuzz``), never loaded
globally, so the rest of the suite keeps Hypothesis' defaults.

Reproducibility. Every test runs under ``@seed(SEED)``: the same inputs on every
run and machine. ``SEED`` is fixed, printed in pytest's header and summary, and
``NRI_GPU_FUZZ_SEED`` picks another one to explore further. No example database
is written (``database=None``): a failure found is kept as an explicit
``@example`` in the test module instead.

Hangs. The Hypothesis deadline fails a case that takes over ``DEADLINE_MS``
(real cases take microseconds to a few milliseconds, so this is generous).
A deadline is only measured once a case returns, so ``typed`` also arms a
``SIGALRM`` timer that interrupts a case still running after ``HANG_SECONDS``.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from nri_gpu.plugin.ttrpc.frames import MAX_MESSAGE
from nri_gpu.plugin.ttrpc.mux import GO_READ_SIZE, MAX_INBOUND_FRAME

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_SEED = 0x4E524947  # "NRIG"
SEED = int(os.environ.get("NRI_GPU_FUZZ_SEED") or str(DEFAULT_SEED), 0)
LONG = os.environ.get("NRI_GPU_FUZZ_LONG", "") not in ("", "0")
LONG_EXAMPLES = 100_000
PROFILE = "nri-gpu-fuzz-long" if LONG else "nri-gpu-fuzz"
DEADLINE_MS = 1000
HANG_SECONDS = 10.0

settings.register_profile(
    "nri-gpu-fuzz",
    database=None,
    deadline=timedelta(milliseconds=DEADLINE_MS),
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile("nri-gpu-fuzz-long", settings.get_profile("nri-gpu-fuzz"), max_examples=LONG_EXAMPLES)


def fuzz(examples: int, *, deadline_ms: int = DEADLINE_MS) -> Callable[[F], F]:
    """Decorator for a ``@given`` test: the active profile, ``examples`` cases by default, the fixed seed."""

    def apply(test: F) -> F:
        count = LONG_EXAMPLES if LONG else examples
        chosen = settings(
            settings.get_profile(PROFILE), max_examples=count, deadline=timedelta(milliseconds=deadline_ms)
        )
        return hypothesis_seed(SEED)(chosen(test))

    return apply


class Hang(AssertionError):
    """A case ran longer than ``HANG_SECONDS``: the code under test loops or blocks."""


@contextmanager
def hang_guard(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Interrupt the block with ``Hang`` after ``seconds`` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum: int, frame: object) -> None:
        raise Hang(f"a single case ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def typed(errors: type[E] | tuple[type[E], ...], call: Callable[..., T], *args: Any, **kwargs: Any) -> T | E:
    """``call(*args)``'s result, or the exception if it is one of ``errors``; anything else propagates (a failure)."""
    with hang_guard():
        try:
            return call(*args, **kwargs)
        except errors as exc:
            assert str(exc), f"{type(exc).__name__} without a message"
            return exc


# -- byte mutators ----------------------------------------------------------------------

# Lengths and ids that sit on a limit, just over one, or at the edge of a u32.
INTERESTING_U32: tuple[int, ...] = tuple(
    sorted(
        {
            0,
            1,
            2,
            7,
            8,
            9,
            10,
            0x7F,
            0x80,
            0xFF,
            0x100,
            0xFFFF,
            0x10000,
            GO_READ_SIZE - 1,
            GO_READ_SIZE,
            GO_READ_SIZE + 1,
            MAX_MESSAGE - 1,
            MAX_MESSAGE,
            MAX_MESSAGE + 1,
            MAX_INBOUND_FRAME - 1,
            MAX_INBOUND_FRAME,
            MAX_INBOUND_FRAME + 1,
            0x7FFFFFFF,
            0x80000000,
            0xFFFFFFFE,
            0xFFFFFFFF,
        }
    )
)
# Protobuf varints: lengths and numbers past int32, int64 and uint64.
INTERESTING_VARINTS = (0, 1, 127, 128, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63, 2**64 - 1)

_BYTE_OPS = ("truncate", "drop_head", "flip", "byte", "u32be", "u32le", "varint", "insert", "delete", "repeat")


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _words(extra: Sequence[int]) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(sorted({*INTERESTING_U32, *extra})), st.integers(0, 0xFFFFFFFF))


@st.composite
def mutated(draw: st.DrawFn, seeds: st.SearchStrategy[bytes], *, words: Sequence[int] = (), max_ops: int = 4) -> bytes:
    """A valid encoding from ``seeds``, then 1..``max_ops`` structure-blind edits.

    The edits are those that break framing: truncation, bit flips, a u32 (big or
    little endian) or a protobuf varint overwritten with a limit value, bytes
    inserted, deleted or repeated.
    """
    data = bytearray(draw(seeds))
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(_BYTE_OPS))
        pos = draw(st.integers(0, len(data)))
        if op == "truncate":
            del data[pos:]
        elif op == "drop_head":
            del data[:pos]
        elif op in ("flip", "byte") and pos < len(data):
            data[pos] = data[pos] ^ (1 << draw(st.integers(0, 7))) if op == "flip" else draw(st.integers(0, 255))
        elif op in ("u32be", "u32le"):
            data[pos : pos + 4] = draw(_words(words)).to_bytes(4, "big" if op == "u32be" else "little")
        elif op == "varint":
            value = varint(draw(st.sampled_from(INTERESTING_VARINTS)))
            if draw(st.booleans()):
                value = b"\xff" * 10 + b"\x01"  # overlong: 11 bytes
            data[pos : pos + draw(st.integers(0, 10))] = value
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "repeat":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 32))]
    return bytes(data)


def cut(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``data`` split at the positions ``cuts`` (taken modulo its length): how a transport might deliver it."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


CUTS = st.lists(st.integers(0, 1 << 16), max_size=24)


# -- text mutators ----------------------------------------------------------------------

# Runs of digits around Python's 4300-digit int() limit, and awkward characters.
_TEXT_INSERTS = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["9" * 10, "1" * 4301, "0" * 5000 + "1", "٣", "\x00", "\r", "\n", "\u2028", "\x0b", " ", ",", ":"]),
)
_TEXT_OPS = ("truncate", "insert", "delete", "replace", "repeat", "case")


@st.composite
def mutated_text(draw: st.DrawFn, seeds: st.SearchStrategy[str], *, max_ops: int = 3) -> str:
    """A well-formed text from ``seeds``, then 1..``max_ops`` edits (cuts, insertions, huge numbers)."""
    text = draw(seeds)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(_TEXT_OPS))
        pos = draw(st.integers(0, len(text)))
        if op == "truncate":
            text = text[:pos]
        elif op == "insert":
            text = text[:pos] + draw(_TEXT_INSERTS) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 8)) :]
        elif op == "replace":
            text = text[:pos] + draw(_TEXT_INSERTS) + text[pos + 1 :]
        elif op == "repeat":
            text = text[:pos] + text[pos : pos + draw(st.integers(1, 40))] * draw(st.integers(2, 5)) + text[pos:]
        else:
            text = text[:pos] + text[pos:].swapcase()
    return text
