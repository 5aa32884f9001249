from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from nri_gpu.plugin.cli.__main__ import build_parser, load_config
from nri_gpu.plugin.config import ConfigError, PluginConfig, from_toml, parse_address
from nri_gpu.plugin.logfmt import DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL, LOG_FORMATS, LOG_LEVELS, make_formatter


def test_defaults_match_the_documented_ones() -> None:
    config = PluginConfig()
    assert (config.socket, config.name, config.index) == ("/var/run/nri/nri.sock", "nri-gpu", "10")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[plugin]\nindex = "1"', "plugin.index: '1' must be exactly two digits"),
        ('[plugin]\nname = "bad name"', "plugin.name: 'bad name'"),
        ('[plugin]\nsockt = "/x"', "plugin.sockt: unknown setting"),
        ("[plugin]\nsocket = 5", "plugin.socket: expected str, got 5"),
        ('[plugin]\nlog_level = "loud"', "plugin.log_level: 'loud'"),
        ('[plugins]\nname = "x"', "unknown table or key 'plugins'"),
        ("[plugin\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_toml(text)


def test_integer_index_is_padded() -> None:
    assert from_toml("[plugin]\nindex = 5").plugin.index == "05"


def test_flags_override_the_file_and_the_runtime_env_overrides_both(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[plugin]\nname = "from-file"\nindex = "20"\nsocket = "/file.sock"\n')
    args = build_parser().parse_args(["run", "--config", str(path), "--index", "30"])
    config = load_config(args, {}).plugin
    assert (config.name, config.index, config.socket) == ("from-file", "30", "/file.sock")
    launched = load_config(args, {"NRI_PLUGIN_NAME": "gpu", "NRI_PLUGIN_IDX": "05", "NRI_PLUGIN_SOCKET": "3"}).plugin
    assert (launched.name, launched.index) == ("gpu", "05")


def test_engine_roots_and_policy_come_from_the_file_and_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[engine]\ndriver_root = "/run/nvidia/driver"\nproc_root = "/host/proc"\nld_cache = "rebuild"\n'
        '[policy]\naccept_env_unprivileged = false\nannotation_namespaces = ["ml"]\ncapabilities = ["compute", "utility"]\n'
    )
    args = build_parser().parse_args(["info", "--config", str(path), "--proc-root", "/sim/proc"])
    engine = load_config(args, {}).engine
    assert (engine.driver_root, engine.dev_root, engine.proc_root) == ("/run/nvidia/driver", "/", "/sim/proc")
    assert engine.ld_cache == "rebuild"
    assert engine.policy.accept_env_unprivileged is False
    assert engine.policy.annotation_namespaces == ("ml",)
    assert sorted(c.value for c in engine.policy.capabilities) == ["compute", "utility"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[engine]\ndriver_rot = "/x"', "engine.driver_rot: unknown setting"),
        ('[engine]\ndriver_root = "relative"', "engine.driver_root: 'relative' must be an absolute path"),
        ('[engine]\nld_cache = "ldconfig"', "engine.ld_cache: 'ldconfig' is not one of 'merge', 'rebuild'"),
        ("[engine]\nld_cache = 1", "engine.ld_cache: expected a string, got 1"),
        ("[policy]\nrequire_checks = 1", "policy.require_checks: expected true or false, got 1"),
        ('[policy]\ncapabilities = ["compute", "gpu"]', "policy.capabilities: unknown capability 'gpu'"),
        ('[policy]\nannotation_namespaces = "ml"', "policy.annotation_namespaces: expected a list"),
    ],
)
def test_bad_engine_settings_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        from_toml(text)


@pytest.mark.parametrize(
    ("text", "namespaces", "annotation_namespaces"),
    [
        ("", None, None),
        ('namespaces = ["*"]\nannotation_namespaces = "*"', None, None),
        ('namespaces = "*"', None, None),
        ('namespaces = ["ml", "research"]\nannotation_namespaces = ["ml"]', ("ml", "research"), ("ml",)),
        ("namespaces = []", (), None),
    ],
    ids=["default", "star-list", "star", "lists", "none"],
)
def test_namespaces_gate_every_source(
    text: str, namespaces: tuple[str, ...] | None, annotation_namespaces: tuple[str, ...] | None
) -> None:
    policy = from_toml(f"[policy]\n{text}\n").engine.policy
    assert (policy.namespaces, policy.annotation_namespaces) == (namespaces, annotation_namespaces)


@pytest.mark.parametrize("key", ["namespaces", "annotation_namespaces"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('"ml"', "expected a list of namespace names"),
        ("[1]", "expected a list of namespace names"),
        ('["ml", "*"]', '"*" stands alone'),
        ('["ML"]', "'ML' is not a Kubernetes namespace name"),
        ('[""]', "'' is not a Kubernetes namespace name"),
        ('["ml\\n"]', "'ml\\n' is not a Kubernetes namespace name"),
        (f'["{"a" * 64}"]', "is not a Kubernetes namespace name"),
    ],
    ids=["string", "number", "star-and-names", "upper-case", "empty", "newline", "too-long"],
)
def test_bad_namespace_lists_name_the_key_and_the_value(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"policy.{key}: ") + ".*" + re.escape(message)):
        from_toml(f"[policy]\n{key} = {value}\n")


def test_relative_root_flag_is_refused() -> None:
    args = build_parser().parse_args(["info", "--driver-root", "sim"])
    with pytest.raises(ConfigError, match=re.escape("--driver-root: 'sim' must be an absolute path")):
        load_config(args, {})


def test_a_bad_root_flag_is_named_by_its_flag_and_shown_as_given() -> None:
    # The message once came from rewriting the engine's text, which also rewrote the value.
    args = build_parser().parse_args(["info", "--driver-root", "srv/engine.d/my_root"])
    with pytest.raises(ConfigError, match=re.escape("--driver-root: 'srv/engine.d/my_root' must be an absolute path")):
        load_config(args, {})
    args = build_parser().parse_args(["info", "--proc-root", "/engine.x/../proc_root"])
    with pytest.raises(ConfigError, match=re.escape("--proc-root: '/engine.x/../proc_root' must not contain '..'")):
        load_config(args, {})


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "--config", str(tmp_path / "nope.toml")])
    with pytest.raises(ConfigError, match=r"nope\.toml: No such file"):
        load_config(args, {})


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9402", ("127.0.0.1", 9402)),
        ("localhost:0", ("localhost", 0)),
        ("[::1]:9402", ("::1", 9402)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
    ids=["v4", "name-port-0", "v6", "max-port"],
)
def test_metrics_address_forms(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected
    assert PluginConfig(metrics_address=address).metrics_address == address


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("9402", "expected host:port"),
        (":9402", "expected host:port"),
        ("::1:9402", "put an IPv6 address in brackets"),
        ("[::1]9402", "expected [IPv6]:port"),
        ("[]:9402", "expected [IPv6]:port"),
        ("127.0.0.1:65536", "the port must be a number 0-65535"),
        ("127.0.0.1:http", "the port must be a number 0-65535"),
        ("127.0.0.1:", "the port must be a number 0-65535"),
    ],
    ids=["port-only", "no-host", "bare-v6", "v6-no-colon", "empty-v6", "port-too-big", "named-port", "no-port"],
)
def test_bad_metrics_address_names_the_key(address: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        from_toml(f'[plugin]\nmetrics_address = "{address}"')
    assert "plugin.metrics_address" in str(err.value)


def test_observability_defaults_file_and_flags(tmp_path: Path) -> None:
    config = PluginConfig()
    assert (config.log_format, config.metrics_address) == ("text", "127.0.0.1:9402")
    path = tmp_path / "config.toml"
    path.write_text('[plugin]\nlog_format = "json"\nmetrics_address = "[::1]:9000"\n')
    args = build_parser().parse_args(["run", "--config", str(path)])
    assert (load_config(args, {}).plugin.log_format, load_config(args, {}).plugin.metrics_address) == (
        "json",
        "[::1]:9000",
    )
    args = build_parser().parse_args(["run", "--config", str(path), "--log-format", "text", "--metrics-address", ""])
    config = load_config(args, {}).plugin
    assert (config.log_format, config.metrics_address) == ("text", "")
    with pytest.raises(ConfigError, match=re.escape("plugin.log_format: 'xml'")):
        from_toml('[plugin]\nlog_format = "xml"')


def test_host_root_flag(tmp_path: Path) -> None:
    args = build_parser().parse_args(["plan", "--host-root", "/host", "--driver-root", "/host/run/nvidia/driver"])
    engine = load_config(args, {}).engine
    assert (engine.host_root, engine.to_host_path(engine.driver_root)) == ("/host", "/run/nvidia/driver")


def test_the_default_config_file_is_read_when_it_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nri_gpu.plugin.cli.__main__ as cli

    default = tmp_path / "config.toml"
    monkeypatch.setattr(cli, "DEFAULT_CONFIG_FILE", default)
    assert load_config(build_parser().parse_args(["run"]), {}).plugin.name == "nri-gpu"  # absent: defaults
    default.write_text('[plugin]\nname = "from-default"\n')
    assert load_config(build_parser().parse_args(["run"]), {}).plugin.name == "from-default"
    other = tmp_path / "other.toml"
    other.write_text('[plugin]\nname = "named"\n')
    assert load_config(build_parser().parse_args(["run", "--config", str(other)]), {}).plugin.name == "named"
    default.write_text("[plugin]\nbogus = 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_config(build_parser().parse_args(["run"]), {})


def _choices(command: str, dest: str) -> tuple[str, ...]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    (action,) = [a for a in commands.choices[command]._actions if a.dest == dest]  # type: ignore[index]
    return tuple(action.choices or ())


def test_log_levels_and_formats_come_from_logfmt_alone() -> None:
    """The config file, the flags and the formatter accept the same names: logfmt's."""
    assert _choices("run", "log_level") == _choices("info", "log_level") == LOG_LEVELS
    assert _choices("run", "log_format") == LOG_FORMATS
    for name in LOG_FORMATS:
        assert from_toml(f'[plugin]\nlog_format = "{name}"').plugin.log_format == name
        assert isinstance(make_formatter(name), logging.Formatter)
    for name in LOG_LEVELS:
        assert from_toml(f'[plugin]\nlog_level = "{name}"').plugin.logging_level == logging.getLevelName(name.upper())
    with pytest.raises(ConfigError, match="is not one of " + ", ".join(LOG_FORMATS)):
        from_toml('[plugin]\nlog_format = "yaml"')
    assert (PluginConfig().log_level, PluginConfig().log_format) == (DEFAULT_LOG_LEVEL, DEFAULT_LOG_FORMAT)
