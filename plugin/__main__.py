"""``nri-gpu``: the command line. The only module that reads argv and the environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from plugin.config import DEFAULT_INDEX, DEFAULT_NAME, DEFAULT_SOCKET, ConfigError, PluginConfig, from_toml
from plugin.errors import RegistrationError
from plugin.handlers import GpuPlugin
from plugin.stub import Stub

logger = logging.getLogger("nri-gpu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nri-gpu", description="NRI plugin that gives containers NVIDIA GPUs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = commands.add_parser("run", help="connect to the runtime's NRI socket and serve GPU requests")
    run.add_argument("--socket", metavar="PATH", help=f"the runtime's NRI socket (default {DEFAULT_SOCKET})")
    run.add_argument("--name", help=f"plugin name shown by the runtime (default {DEFAULT_NAME})")
    run.add_argument(
        "--index", metavar="NN", help=f"two-digit plugin index, the order among plugins (default {DEFAULT_INDEX})"
    )
    run.add_argument("--config", metavar="FILE", type=Path, help="TOML config file; flags override it")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="default info")
    return parser


def load_config(args: argparse.Namespace, environ: Mapping[str, str]) -> PluginConfig:
    """Defaults < config file < flags < what the runtime passes a plugin it launched."""
    config = PluginConfig()
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as exc:
            raise ConfigError(f"--config {args.config}: {exc.strerror}") from exc
        config = from_toml(text, source=str(args.config))
    config = config.with_overrides(socket=args.socket, name=args.name, index=args.index, log_level=args.log_level)
    # A runtime-launched plugin is named by its file name (NN-name); the runtime
    # ignores what we would register with, so use the same to avoid confusion.
    return config.with_overrides(name=environ.get("NRI_PLUGIN_NAME"), index=environ.get("NRI_PLUGIN_IDX"))


def preconnected_socket(environ: Mapping[str, str]) -> socket.socket | None:
    fd = environ.get("NRI_PLUGIN_SOCKET")
    if not fd:
        return None
    try:
        return socket.socket(fileno=int(fd))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"NRI_PLUGIN_SOCKET={fd!r} is not a usable socket descriptor: {exc}") from exc


async def _run(config: PluginConfig, sock: socket.socket | None) -> None:
    stub = Stub(GpuPlugin(), config, preconnected=sock)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stub.stop)
    where = f"fd {sock.fileno()}" if sock is not None else config.socket
    logger.info("nri-gpu %s-%s starting on %s", config.index, config.name, where)
    await stub.run()
    logger.info("nri-gpu stopped")


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    if args.command is None:
        if not environ.get("NRI_PLUGIN_SOCKET"):
            build_parser().print_help(sys.stderr)
            return 2
        # Launched by the runtime from its plugin directory: no arguments at all.
        args = build_parser().parse_args(["run"])
    try:
        config = load_config(args, environ)
        sock = preconnected_socket(environ)
    except ConfigError as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.logging_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        asyncio.run(_run(config, sock))
    except RegistrationError as exc:
        logger.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
