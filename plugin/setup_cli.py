"""The node-setup commands of ``nri-gpu``: ``config default``, ``install``, ``uninstall``.

``__main__`` adds them to its parser and hands their parsed arguments here.
Exit codes: 0 done (or nothing to do), 1 refused (the message names the file and
key), 2 usage error. A runtime is restarted only with ``--restart``; otherwise the
command to run is printed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from plugin.config import DEFAULT_NAME
from plugin.config_doc import default_config
from plugin.config_files import FileRefused
from plugin.events import parse_version
from plugin.runtime_setup import (
    CONTAINERD_CONFIG,
    CRIO_DROPIN_DIR,
    RUNTIMES,
    FailClosed,
    Result,
    SetupError,
    fail_closed_for,
    install,
    parse_runtime_version,
    uninstall,
)

COMMANDS = ("config", "install", "uninstall")
_SERVICE = {"containerd": "containerd", "crio": "crio"}
_BINARY = {"containerd": "containerd", "crio": "crio"}


def add_commands(commands: Any) -> None:
    """Add the commands to ``commands`` (the parser's subparsers action)."""
    config = commands.add_parser("config", help="print the annotated default config file")
    config.add_argument("action", choices=("default",), help="default: the config file with every option documented")

    where = (
        f"containerd: the config file (default {CONTAINERD_CONFIG}); crio: the drop-in dir (default {CRIO_DROPIN_DIR})"
    )
    for name, text in (
        ("install", "turn on NRI in the runtime's config (keeps a backup for uninstall)"),
        ("uninstall", "undo what install changed (byte for byte when nothing else changed the file)"),
    ):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("--runtime", required=True, choices=RUNTIMES, help="the container runtime to set up")
        cmd.add_argument("--config", metavar="PATH", type=Path, help=where)
        if name == "install":
            cmd.add_argument("--socket", metavar="PATH", help="NRI socket the runtime should listen on")
            cmd.add_argument(
                "--runtime-version",
                metavar="VERSION",
                help="the runtime's release (default: asked from its binary on PATH); containerd >= 2.2 and "
                "CRI-O >= 1.34 also get the NRI default validator set to require the plugin",
            )
            cmd.add_argument(
                "--plugin-name",
                default=DEFAULT_NAME,
                metavar="NAME",
                help=f"the plugin name the runtime is to require (default {DEFAULT_NAME}; the plugin's name setting)",
            )
            closed = cmd.add_mutually_exclusive_group()
            closed.add_argument(
                "--fail-closed",
                action="store_true",
                help="containerd >= 2.2, CRI-O >= 1.34: set the NRI default validator to require the plugin, so "
                "that no container is created while it is away (every container of the node: tolerate system "
                "pods first, README 'Fail-closed')",
            )
            closed.add_argument(
                "--no-fail-closed",
                action="store_true",
                help="do not set up the default validator (the default)",
            )
        cmd.add_argument("--dry-run", action="store_true", help="print the diff; write nothing")
        cmd.add_argument("--restart", action="store_true", help="run systemctl restart for the runtime afterwards")


def _report(result: Result, dry_run: bool) -> None:
    if dry_run and result.diff:
        sys.stdout.write(result.diff)
    for message in result.messages:
        print(("would: " if dry_run and result.changed else "") + message)
    for warning in result.warnings:
        print(f"nri-gpu: warning: {warning}", file=sys.stderr)


def _fail_closed(args: argparse.Namespace) -> tuple[FailClosed | None, str]:
    """Whether install sets up the default validator, and the line that says why (not)."""
    if args.no_fail_closed:
        return None, "fail-closed: not set up (--no-fail-closed)"
    if not args.fail_closed:
        # Opt-in: a required plugin holds back every container of the node while it is
        # away, CNI and kube-proxy pods included, which can keep a node from coming back.
        return None, (
            "fail-closed: not set up; --fail-closed makes the runtime refuse every container while nri-gpu is "
            "away (README: Fail-closed on the newest runtimes)"
        )
    version, why = None, ""
    if args.runtime_version is not None:
        given = args.runtime_version.split()
        version = parse_version(given[0]) if len(given) == 1 else None
        why = f"--runtime-version {args.runtime_version!r} is not a version"
    else:
        version, why = _detect(args.runtime)
    return fail_closed_for(args.runtime, version, why, args.plugin_name)


def _detect(runtime: str) -> tuple[tuple[int, int, int] | None, str]:
    """The runtime's release from ``<binary> --version``; None and why not."""
    binary = shutil.which(_BINARY[runtime])
    if binary is None:
        return None, f"{_BINARY[runtime]} is not on PATH"
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{binary} --version: {exc}"
    version = parse_runtime_version(runtime, done.stdout)
    first = (done.stdout.strip().splitlines() or [""])[0][:100]
    return version, f"{binary} --version said {first!r}"


def main(args: argparse.Namespace) -> int:
    if args.command == "config":
        sys.stdout.write(default_config())
        return 0
    try:
        if args.command == "install":
            fail_closed, why = _fail_closed(args)
            result = install(args.runtime, args.config, args.socket, args.dry_run, fail_closed)
            result.messages.append(why)
        else:
            result = uninstall(args.runtime, args.config, args.dry_run)
    except (SetupError, FileRefused) as exc:
        print(f"nri-gpu: refused: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"nri-gpu: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
    _report(result, args.dry_run)
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    if not result.changed:
        return 0
    restart = ["systemctl", "restart", _SERVICE[args.runtime]]
    if not args.restart:
        print(f"Restart the runtime for this to take effect: {' '.join(restart)}")
        return 0
    print(f"running: {' '.join(restart)}")
    done = subprocess.run(restart, check=False)
    if done.returncode != 0:
        print(f"nri-gpu: {' '.join(restart)} failed with exit code {done.returncode}", file=sys.stderr)
        return 1
    return 0
