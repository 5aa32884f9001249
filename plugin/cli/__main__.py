"""``nri-gpu``: the command line. The only module that reads argv and the environment.

Commands: ``run`` (the NRI plugin), ``info`` (what discovery finds on this node),
``plan`` (what a container with the given env and pod annotations would get),
``config default``, ``install`` and ``uninstall`` (node setup, in ``install``),
``node-setup`` (the DaemonSet's init step, in ``node_setup``) and ``cdi generate``
(the CDI path, in ``cdi``; the spec's hook is the compiled ``nri-gpu-hook``, hook/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from nri_gpu.engine import (
    ContainerInfo,
    EngineConfig,
    EngineConfigError,
    EngineError,
    InventoryCache,
    discover_inventory,
    identity_blind_spots,
    inventory_text,
    inventory_to_dict,
    make_plan,
    parse_request,
    plan_text,
    plan_to_dict,
)
from nri_gpu.plugin.cli import args as cli_args
from nri_gpu.plugin.cli import cdi as cdi_cli
from nri_gpu.plugin.cli import cdi_keeper
from nri_gpu.plugin.cli import install as setup_cli
from nri_gpu.plugin.cli.cdi_keeper import WatchedInventory
from nri_gpu.plugin.config import (
    DEFAULT_INDEX,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_NAME,
    DEFAULT_SOCKET,
    ConfigError,
    Settings,
    from_toml,
    parse_address,
)
from nri_gpu.plugin.errors import RegistrationError
from nri_gpu.plugin.handlers import GpuPlugin
from nri_gpu.plugin.httpd import StatusServer, stub_health
from nri_gpu.plugin.logfmt import DEFAULT_LOG_FORMAT, LOG_FORMATS, make_formatter
from nri_gpu.plugin.metrics import PluginMetrics
from nri_gpu.plugin.stub import Stub

logger = logging.getLogger("nri-gpu")

DEFAULT_CONFIG_FILE = cli_args.DEFAULT_CONFIG_FILE


# A command: the parsed arguments and the environment in, the exit code out. Each
# subcommand names its own (``set_defaults(func=...)``); the ones that read the
# node's settings go through ``_configured`` first.
Command = Callable[[argparse.Namespace, Mapping[str, str]], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nri-gpu", description="NRI plugin that gives containers NVIDIA GPUs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    node = cli_args.node_config()
    run = commands.add_parser("run", parents=[node], help="connect to the runtime's NRI socket and serve GPU requests")
    run.add_argument("--socket", metavar="PATH", help=f"the runtime's NRI socket (default {DEFAULT_SOCKET})")
    run.add_argument("--name", help=f"plugin name shown by the runtime (default {DEFAULT_NAME})")
    run.add_argument(
        "--index", metavar="NN", help=f"two-digit plugin index, the order among plugins (default {DEFAULT_INDEX})"
    )
    run.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help=f"log lines as text or JSON objects (default {DEFAULT_LOG_FORMAT})",
    )
    run.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help=f'where /healthz and /metrics listen, "" for nowhere (default {DEFAULT_METRICS_ADDRESS})',
    )
    run.add_argument(
        "--cdi-spec",
        metavar="PATH",
        help="keep a CDI spec current at PATH (e.g. /etc/cdi/nri-gpu.json; config [cdi] spec; default none)",
    )
    run.set_defaults(func=_run_command)

    info = commands.add_parser(
        "info", parents=[node], help="show the node's GPUs, driver and libraries as discovery sees them"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_configured(_info))

    plan_cmd = commands.add_parser(
        "plan", parents=[node], help="show what a container would get (exit 1 with the reason if refused)"
    )
    plan_cmd.add_argument("--env", metavar="K=V", action="append", default=[], help="container env (repeatable)")
    plan_cmd.add_argument(
        "--annotation", metavar="K=V", action="append", default=[], help="pod annotation (repeatable)"
    )
    plan_cmd.add_argument("--container-name", default="main", help="container name (default main)")
    plan_cmd.add_argument("--namespace", default="default", help="pod namespace (default default)")
    plan_cmd.add_argument("--privileged", action="store_true", help="the container is privileged")
    plan_cmd.add_argument("--json", action="store_true", help="print JSON instead of text")
    plan_cmd.set_defaults(func=_configured(_plan))
    setup_cli.add_commands(commands)
    cdi_cli.add_commands(commands, node, _configured(_cdi_generate))
    return parser


def load_config(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Defaults < config file < flags < what the runtime passes a plugin it launched."""
    settings = Settings()
    path = args.config
    if path is None and DEFAULT_CONFIG_FILE.exists():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"--config {path}: {exc.strerror}") from exc
        settings = from_toml(text, source=str(path))
    plugin = settings.plugin.with_overrides(
        socket=getattr(args, "socket", None),
        name=getattr(args, "name", None),
        index=getattr(args, "index", None),
        log_level=args.log_level,
        log_format=getattr(args, "log_format", None),
        metrics_address=getattr(args, "metrics_address", None),
    )
    # A runtime-launched plugin is named by its file name (NN-name); the runtime
    # ignores what we would register with, so use the same to avoid confusion.
    plugin = plugin.with_overrides(name=environ.get("NRI_PLUGIN_NAME"), index=environ.get("NRI_PLUGIN_IDX"))
    try:
        engine = settings.engine.with_roots(
            driver_root=args.driver_root, dev_root=args.dev_root, proc_root=args.proc_root, host_root=args.host_root
        )
    except EngineConfigError as exc:
        raise ConfigError(exc.flag_message()) from exc  # only the root flags reach here
    cdi = settings.cdi.with_overrides(spec=getattr(args, "cdi_spec", None))
    return Settings(plugin, engine, cdi)


def preconnected_socket(environ: Mapping[str, str]) -> socket.socket | None:
    fd = environ.get("NRI_PLUGIN_SOCKET")
    if not fd:
        return None
    try:
        return socket.socket(fileno=int(fd))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"NRI_PLUGIN_SOCKET={fd!r} is not a usable socket descriptor: {exc}") from exc


async def _run(settings: Settings, sock: socket.socket | None) -> None:
    config = settings.plugin
    # Discovery once, before connecting: the first request must not pay for it.
    metrics = PluginMetrics()
    plugin = GpuPlugin(settings.engine, _inventory(settings), metrics=metrics)
    stub = Stub(plugin, config, preconnected=sock, metrics=metrics)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stub.stop)
    where = f"fd {sock.fileno()}" if sock is not None else config.socket
    logger.info("nri-gpu %s-%s starting on %s", config.index, config.name, where)
    for blind in identity_blind_spots():
        logger.warning(
            "cannot look at %s; the start work cannot refuse that namespace or root by it "
            "(it still refuses the plugin's own and checks each container's cgroup): run in the "
            "host's pid namespace with CAP_SYS_PTRACE",
            blind,
        )
    status = await _start_status_server(config.metrics_address, stub, metrics)
    try:
        await stub.run()
    finally:
        if status is not None:
            await status.stop()
    logger.info("nri-gpu stopped")


def _inventory(settings: Settings) -> InventoryCache:
    """The node's inventory (taken now); with ``[cdi] spec``, also kept in that spec."""
    if not settings.cdi.spec:
        return InventoryCache(settings.engine)
    keeper = cdi_keeper.keeper_for(settings.cdi, settings.engine, sys.argv[0] if sys.argv else "")
    if keeper is None:
        return InventoryCache(settings.engine)
    cache = WatchedInventory(settings.engine, listener=keeper.changed)
    keeper.changed(cache.current)
    keeper.start(cache)
    return cache


async def _start_status_server(address: str, stub: Stub, metrics: PluginMetrics) -> StatusServer | None:
    """Serve /healthz and /metrics; a port that cannot be bound costs them, not the GPUs."""
    if not address:
        return None
    host, port = parse_address(address)
    server = StatusServer(stub_health(stub), metrics)
    try:
        await server.start(host, port)
    except OSError as exc:
        logger.error("cannot serve /healthz and /metrics on %s: %s; continuing without them", address, exc)
        return None
    logger.info("serving /healthz and /metrics on %s", address)
    return server


def _pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {value!r}: expected KEY=VALUE")
        pairs[key] = val
    return pairs


def _info(args: argparse.Namespace, engine: EngineConfig) -> int:
    inventory = discover_inventory(engine)
    if args.json:
        print(json.dumps(inventory_to_dict(inventory), indent=2))
    else:
        sys.stdout.write(inventory_text(inventory))
    return 0


def _plan(args: argparse.Namespace, engine: EngineConfig) -> int:
    info = ContainerInfo(
        name=args.container_name,
        pod_namespace=args.namespace,
        pod_annotations=_pairs(args.annotation, "--annotation"),
        env=_pairs(args.env, "--env"),
        privileged=args.privileged,
    )
    try:
        outcome = parse_request(info, engine.policy)
        for note in outcome.notes:
            print(f"note: {note}", file=sys.stderr)
        if outcome.request is None:
            print(json.dumps(None) if args.json else "No GPU request: the container gets nothing.")
            return 0
        result = make_plan(outcome.request, discover_inventory(engine), engine)
    except EngineError as exc:
        print(f"nri-gpu: refused: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(plan_to_dict(result), indent=2))
    else:
        print(f"Request from {outcome.request.source}")
        sys.stdout.write(plan_text(result))
    return 0


def _configured(handler: Callable[[argparse.Namespace, EngineConfig], int]) -> Command:
    """``handler`` with the node's settings: config file and flags read, logging set up
    (errors only: these commands print their own results)."""

    def command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
        try:
            settings = load_config(args, environ)
        except ConfigError as exc:
            print(f"nri-gpu: {exc}", file=sys.stderr)
            return 2
        _log_to_stderr(args, logging.ERROR, "text")
        try:
            return handler(args, settings.engine)
        except ConfigError as exc:  # plan's --env and --annotation
            print(f"nri-gpu: {exc}", file=sys.stderr)
            return 2

    return command


def _log_to_stderr(args: argparse.Namespace, default_level: int, log_format: str) -> None:
    """Log to stderr in ``log_format``, at --log-level if given."""
    log_handler = logging.StreamHandler(sys.stderr)
    log_handler.setFormatter(make_formatter(log_format))
    logging.basicConfig(
        level=logging.getLevelName(args.log_level.upper()) if args.log_level else default_level,
        handlers=[log_handler],
    )


def _run_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        settings = load_config(args, environ)
        sock = preconnected_socket(environ)
    except ConfigError as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return 2
    _log_to_stderr(args, settings.plugin.logging_level, settings.plugin.log_format)
    try:
        asyncio.run(_run(settings, sock))
    except RegistrationError as exc:
        logger.error("%s", exc)
        return 1
    return 0


def _cdi_generate(args: argparse.Namespace, engine: EngineConfig) -> int:
    return cdi_cli.generate(args, engine, sys.argv[0] if sys.argv else "")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        if not environ.get("NRI_PLUGIN_SOCKET"):
            parser.print_help(sys.stderr)
            return 2
        # Launched by the runtime from its plugin directory: no arguments at all.
        args = parser.parse_args(["run"])
    command: Command = args.func
    return command(args, environ)


if __name__ == "__main__":
    sys.exit(main())
