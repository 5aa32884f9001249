"""Log formats: the plain text line, or one JSON object per line.  (pure)

Either way a record is one line: the text format escapes control characters
(``\\n``, ``\\x1b``, U+2028, ...) in the message and indents every line of a
traceback, so an env name or value quoted in a message cannot forge a line; the
JSON format escapes them too, including the line separators JSON would allow raw
(U+2028, U+2029, U+0085), which some log shippers split on.

Handlers attach the structured form of a decision as
``logger.info(..., extra={"nri_gpu": {...}})``; the text format ignores it (the
message already says it in words), the JSON format merges its keys into the
object beside ``time``, ``level``, ``logger`` and ``message``::

    {"time": "2026-01-02T03:04:05.678Z", "level": "info", "logger": "nri_gpu.plugin.handlers",
     "message": "container \\"c\\" in pod \\"ns/p\\": GPUs 0, ...", "event": "CreateContainer",
     "pod": "p", "namespace": "ns", "container": "c", "gpus": [0], "duration_ms": 0.41}
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

# The level names of ``plugin.log_level`` and ``--log-level``, quietest last. This
# module is the one list of levels and formats: config validation, the command
# line's choices, ``nri-gpu config default`` and the chart's checks read them here.
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
DEFAULT_LOG_FORMAT = "text"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
EXTRA_KEY = "nri_gpu"
# Keys the formatter owns; structured fields never overwrite them.
_RESERVED = ("time", "level", "logger", "message", "exception")


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped as Python would write it.

    >>> printable('a\\nb\\x1b[2J \\u2028 ü')
    'a\\\\nb\\\\x1b[2J \\\\u2028 ü'
    """
    if text.isprintable():  # the common case, at C speed
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class TextFormatter(logging.Formatter):
    """The plain line, ``TEXT_FORMAT``; a record never spans lines except for its traceback, indented."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    # Continuation lines start with spaces: a line that begins with a timestamp is always a record.
    return "\n".join("  " + printable(line) for line in text.split("\n"))


# Control characters JSON lets stand raw in a string (``json.dumps`` escapes only
# those below U+0020): DEL, the C1 controls (U+0085 a line break, U+009B a
# terminal's CSI) and the Unicode line and paragraph separators.
_JSON_RAW_CONTROLS = str.maketrans({chr(c): f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), 0x2028, 0x2029)})


class JsonFormatter(logging.Formatter):
    """One JSON object per record, UTC timestamps with milliseconds."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "time": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, EXTRA_KEY, None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry[f"field_{key}" if key in _RESERVED else key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False).translate(_JSON_RAW_CONTROLS)


_FORMATTERS: dict[str, Callable[[], logging.Formatter]] = {
    "text": lambda: TextFormatter(TEXT_FORMAT),
    "json": JsonFormatter,
}
# The names of ``plugin.log_format`` and ``--log-format``: exactly the formats there is a formatter for.
LOG_FORMATS = tuple(_FORMATTERS)


def make_formatter(log_format: str) -> logging.Formatter:
    """The formatter for ``plugin.log_format``; raises ValueError for an unknown one."""
    make = _FORMATTERS.get(log_format)
    if make is None:
        raise ValueError(f"unknown log format {log_format!r} (known: {', '.join(LOG_FORMATS)})")
    return make()
