"""The plugin layer's exceptions.  (pure)"""

from __future__ import annotations

from nri_gpu.plugin.logfmt import printable

MAX_MESSAGE = 4096  # characters of a refusal the runtime shows: a few lines, never megabytes


class PluginError(Exception):
    """An expected refusal by a handler; its message goes to the runtime in the failed CRI call.

    Handlers raise it (or translate their own layer's errors into it) when a
    request is wrong, so it must name the bad value. The value comes from the
    container: the message is made one printable line (control characters
    escaped) of at most ``MAX_MESSAGE`` characters, whatever the layer below put
    in it. Any other exception is treated as a bug: it is logged with its
    traceback and reported with its type name.
    """

    def __init__(self, message: str) -> None:
        super().__init__(bounded(str(message)))


def bounded(message: str) -> str:
    """``message`` as one printable line of at most ``MAX_MESSAGE`` characters."""
    total = len(message)
    text = printable(message[:MAX_MESSAGE])  # cut first: escaping megabytes would itself be slow
    if total <= MAX_MESSAGE and len(text) <= MAX_MESSAGE:
        return text
    suffix = f"... ({total} characters in all)"
    return text[: MAX_MESSAGE - len(suffix)] + suffix


class RegistrationError(Exception):
    """The runtime refused our registration (bad name or index): retrying cannot help."""
