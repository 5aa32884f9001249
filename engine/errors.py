"""The engine's exception family: one root, one subclass per stage.  (pure)

Every message names the offending value, because it ends up in front of a
user: as the reason a container was refused, or a warning at discovery.
"""

from __future__ import annotations


def quoted(text: str, limit: int = 120) -> str:
    """``text`` quoted for a message: cut short when long (the value may be
    megabytes), escaped when not printable (it must not forge a log line)."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f'"{text}"' if text.isprintable() else repr(text)


class EngineError(Exception):
    """Root of everything the engine raises on purpose."""


class DiscoveryError(EngineError):
    """The node's files could not be read or make no sense (a parser's input is malformed)."""


class RequestError(EngineError):
    """A container's GPU request is malformed or not allowed (bad list, unknown capability, policy)."""


class UnknownDeviceError(RequestError):
    """A requested GPU does not exist on this node (index out of range, unknown UUID or bus id)."""


class RequirementError(EngineError):
    """An ``NVIDIA_REQUIRE_*`` condition is not met, or cannot be parsed."""


class StartError(EngineError):
    """The work at container start (procfs view, links, ld.so cache) failed.

    ``container`` names the container as the caller described it, ``step`` the
    stage that failed (``"procfs isolation"``, ``"ldconfig"``, ...); the message
    reads ``<container>: <step>: <what went wrong>``.
    """

    def __init__(self, container: str, step: str, error: str) -> None:
        super().__init__(f"{container}: {step}: {error}" if container else f"{step}: {error}")
        self.container = container
        self.step = step
        self.error = error
