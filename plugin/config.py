"""Plugin settings: what ``nri-gpu run`` needs to reach the runtime.  (pure)

Values come from three places, later ones winning: built-in defaults, the
config file (TOML, tables ``[plugin]`` and ``[cdi]``), command-line flags. The runtime-launched
form (``NRI_PLUGIN_*`` env) is applied by ``__main__`` on top. Every value is
validated here so a typo fails at start with the key named, not at registration
with the runtime's terser message.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from nri_gpu.engine import EngineConfig, EngineConfigError, config_from_tables
from nri_gpu.plugin.logfmt import DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL, LOG_FORMATS, LOG_LEVELS

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_NAME = "nri-gpu"
DEFAULT_INDEX = "10"

# The runtime's own rules (NRI v0.12 enforces the name set; every version the index).
_NAME_RE = re.compile(r"[A-Za-z0-9._+-]+")
_INDEX_RE = re.compile(r"[0-9]{2}")
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9402"
_PORT_RE = re.compile(r"[0-9]{1,5}")


class ConfigError(ValueError):
    """A setting is missing, unknown or has a bad value; the message names it."""


@dataclasses.dataclass(frozen=True)
class PluginConfig:
    socket: str = DEFAULT_SOCKET
    name: str = DEFAULT_NAME
    index: str = DEFAULT_INDEX
    log_level: str = DEFAULT_LOG_LEVEL
    # Seconds between reconnect attempts grow from the first to the last value.
    reconnect_min: float = 0.05
    reconnect_max: float = 0.25
    # "text" (one line per decision, words) or "json" (one object per line, with fields).
    log_format: str = DEFAULT_LOG_FORMAT
    # host:port (or [v6]:port) of /healthz and /metrics; "" turns the server off.
    # Loopback by default: it answers anyone who can reach it, without authentication.
    metrics_address: str = DEFAULT_METRICS_ADDRESS

    def __post_init__(self) -> None:
        if not self.socket:
            raise ConfigError("plugin.socket: must not be empty")
        if not _NAME_RE.fullmatch(self.name):
            raise ConfigError(f"plugin.name: {self.name!r} must be letters, digits and . _ + - only")
        if not _INDEX_RE.fullmatch(self.index):
            raise ConfigError(f"plugin.index: {self.index!r} must be exactly two digits, e.g. '10'")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"plugin.log_level: {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"plugin.log_format: {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
        if self.metrics_address:
            parse_address(self.metrics_address, key="plugin.metrics_address")
        if not 0 < self.reconnect_min <= self.reconnect_max:
            raise ConfigError(
                f"plugin.reconnect_min/max: need 0 < min <= max, got {self.reconnect_min}, {self.reconnect_max}"
            )

    @property
    def logging_level(self) -> int:
        return int(getattr(logging, self.log_level.upper()))

    def with_overrides(self, **values: Any) -> PluginConfig:
        """A copy with the given non-None values replaced (flags over file)."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "socket": (str,),
    "name": (str,),
    "index": (str, int),
    "log_level": (str,),
    "reconnect_min": (int, float),
    "reconnect_max": (int, float),
    "log_format": (str,),
    "metrics_address": (str,),
}


def parse_address(text: str, *, key: str = "address") -> tuple[str, int]:
    """``"127.0.0.1:9402"`` -> ``("127.0.0.1", 9402)``; ``"[::1]:9402"`` -> ``("::1", 9402)``.

    Raises ConfigError naming ``key`` when the host is missing, an IPv6 address
    is not bracketed, or the port is not 0-65535.
    """
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host or "]" in host:
            raise ConfigError(f"{key}: {text!r}: expected [IPv6]:port, e.g. [::1]:9402")
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"{key}: {text!r}: expected host:port, e.g. 127.0.0.1:9402")
        if ":" in host:
            raise ConfigError(f"{key}: {text!r}: put an IPv6 address in brackets, e.g. [::1]:9402")
    if any(c.isspace() for c in host):
        raise ConfigError(f"{key}: {text!r}: the host contains white space")
    if not _PORT_RE.fullmatch(port) or int(port) > 65535:
        raise ConfigError(f"{key}: {text!r}: the port must be a number 0-65535")
    return host, int(port)


def from_mapping(table: Mapping[str, Any]) -> PluginConfig:
    """Build from the ``[plugin]`` table; unknown keys and wrong types raise ConfigError."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        types = _FIELD_TYPES.get(key)
        if types is None:
            raise ConfigError(f"plugin.{key}: unknown setting (known: {', '.join(sorted(_FIELD_TYPES))})")
        if isinstance(value, bool) or not isinstance(value, types):
            raise ConfigError(f"plugin.{key}: expected {' or '.join(t.__name__ for t in types)}, got {value!r}")
        if key == "index" and isinstance(value, int):
            value = f"{value:02d}"
        values[key] = value.unwrap() if hasattr(value, "unwrap") else value
    return PluginConfig(**values)


@dataclasses.dataclass(frozen=True)
class CdiConfig:
    """The CDI spec ``nri-gpu run`` keeps current (``nri_gpu.plugin.cli.cdi_keeper``)."""

    # Absolute path of the spec file; "" keeps none.
    spec: str = ""
    # Absolute path of the nri-gpu-hook the spec names; "" for the one beside this nri-gpu.
    hook_path: str = ""
    # Write the spec even when users other than root can change the hook's files (tests only).
    allow_untrusted_hook: bool = False

    def __post_init__(self) -> None:
        for key in ("spec", "hook_path"):
            value = getattr(self, key)
            if value and not value.startswith("/"):
                raise ConfigError(f"cdi.{key}: {value!r} must be an absolute path")
        if self.spec and not self.spec.endswith(".json"):
            raise ConfigError(
                f"cdi.spec: {self.spec!r} must end in .json (nri-gpu writes JSON; the CDI cache reads .json and .yaml)"
            )

    def with_overrides(self, **values: Any) -> CdiConfig:
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})


_CDI_TYPES: dict[str, type] = {"spec": str, "hook_path": str, "allow_untrusted_hook": bool}


def cdi_from_mapping(table: Mapping[str, Any]) -> CdiConfig:
    """Build from the ``[cdi]`` table; unknown keys and wrong types raise ConfigError."""
    for key, value in table.items():
        kind = _CDI_TYPES.get(key)
        if kind is None:
            raise ConfigError(f"cdi.{key}: unknown setting (known: {', '.join(sorted(_CDI_TYPES))})")
        if not isinstance(value, kind) or (kind is str and isinstance(value, bool)):
            raise ConfigError(f"cdi.{key}: expected {kind.__name__}, got {value!r}")
    return CdiConfig(**dict(table))


# Top-level tables of the config file: the plugin's, the engine's roots and policy, the kept CDI spec.
_TABLES = ("plugin", "engine", "policy", "cdi")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the config file sets."""

    plugin: PluginConfig = dataclasses.field(default_factory=PluginConfig)
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    cdi: CdiConfig = dataclasses.field(default_factory=CdiConfig)


def from_toml(text: str, *, source: str = "config") -> Settings:
    """Parse a config file; unknown tables and keys are rejected by name.

    Read with the standard library's parser: the plugin only reads its file
    (tomlkit, which keeps comments, is for install's edits of the runtime's)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    for key in doc:
        if key not in _TABLES:
            raise ConfigError(f"{source}: unknown table or key {key!r} (known: {', '.join(_TABLES)})")
    tables = {}
    for name in _TABLES:
        table = doc.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: {name!r} must be a table")
        tables[name] = table
    try:
        engine = config_from_tables(tables["engine"], tables["policy"])
    except EngineConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return Settings(from_mapping(tables["plugin"]), engine, cdi_from_mapping(tables["cdi"]))
