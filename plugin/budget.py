"""How long the request being handled may still take: the runtime's deadline.

The runtime drops a plugin that misses a request's deadline (and then creates or
starts the container without it), so every wait in a handler is bounded by the
time the runtime still gives, less a margin for the reply. The deadline comes
from the request itself (ttrpc's ``timeout_nano``, which containerd sets from its
``plugin_request_timeout``), else from the request timeout the runtime sent in
Configure, else from NRI's default (2 s). The stub sets it for the handler's
task (``deadline_scope``); handlers ask ``left()``.

Docs: docs/budgets.md has every handler's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["REPLY_MARGIN", "Timeouts", "deadline_scope", "left"]

# NRI's defaults, used when the runtime sends 0 (an NRI older than v0.7 sends nothing).
DEFAULT_REGISTRATION = 5.0
DEFAULT_REQUEST = 2.0
# Kept free at the end of every request for answering it: the reply's encoding and
# write, and the loop being late on a loaded node.
REPLY_MARGIN = 0.3
# What a timeout from Configure is clamped to: a runtime's value outside this range
# is a unit mistake, not a budget.
_SANE = (0.1, 300.0)

# Absolute, in the running loop's time() units; None outside a request.
_deadline: ContextVar[float | None] = ContextVar("nri_gpu_request_deadline", default=None)


@dataclass(frozen=True)
class Timeouts:
    """The runtime's timeouts, in seconds."""

    registration: float = DEFAULT_REGISTRATION
    request: float = DEFAULT_REQUEST

    @classmethod
    def from_configure(cls, registration_ms: int, request_ms: int) -> Timeouts:
        """From ConfigureRequest's milliseconds; 0 (not sent) means NRI's default.

        >>> Timeouts.from_configure(0, 2000)
        Timeouts(registration=5.0, request=2.0)
        >>> Timeouts.from_configure(10000, 4500)
        Timeouts(registration=10.0, request=4.5)
        """
        return cls(_seconds(registration_ms, DEFAULT_REGISTRATION), _seconds(request_ms, DEFAULT_REQUEST))


def _seconds(ms: int, default: float) -> float:
    if ms <= 0:
        return default
    return min(max(ms / 1000, _SANE[0]), _SANE[1])


@contextlib.contextmanager
def deadline_scope(deadline: float) -> Iterator[None]:
    """Within the block, ``left()`` counts down to ``deadline`` (loop time)."""
    token = _deadline.set(deadline)
    try:
        yield
    finally:
        _deadline.reset(token)


def left() -> float:
    """Seconds until the current request's deadline, less ``REPLY_MARGIN`` (never
    below 0); NRI's default request timeout less the margin outside a request (a
    test calling a handler directly). Call from the event loop's thread."""
    deadline = _deadline.get()
    if deadline is None:
        return DEFAULT_REQUEST - REPLY_MARGIN
    return max(0.0, deadline - asyncio.get_running_loop().time() - REPLY_MARGIN)
