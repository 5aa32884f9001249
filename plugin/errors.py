"""The plugin layer's exceptions.  (pure)"""

from __future__ import annotations


class PluginError(Exception):
    """An expected refusal by a handler; its message goes to the runtime as it is.

    Handlers raise it (or translate their own layer's errors into it) when a
    request is wrong: the runtime shows the message in the failed CRI call, so it
    must name the bad value. Any other exception is treated as a bug: it is logged
    with its traceback and reported with its type name.
    """


class RegistrationError(Exception):
    """The runtime refused our registration (bad name or index): retrying cannot help."""
