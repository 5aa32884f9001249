"""Arguments several ``nri-gpu`` commands share, each set written once as a parent parser.

argparse copies a parent's arguments (and its titled groups) into every command
built with ``parents=[...]``, so a flag that two commands take has one name, one
default and one help text: ``cdi generate`` and ``install --runtime docker``
write the same spec, and their flags must not drift apart.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nri_gpu.plugin.logfmt import DEFAULT_LOG_LEVEL, LOG_LEVELS

__all__ = ["DEFAULT_CONFIG_FILE", "cdi_hook", "node_config", "roots"]

# The node's config file: read by run, info, plan and cdi generate (and install's spec) when it exists.
DEFAULT_CONFIG_FILE = Path("/etc/nri-gpu/config.toml")


def roots() -> argparse.ArgumentParser:
    """``--driver-root``, ``--dev-root``, ``--proc-root``, ``--host-root``: where discovery looks."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("node roots")
    group.add_argument("--driver-root", metavar="DIR", help="where the driver's files live (default /)")
    group.add_argument("--dev-root", metavar="DIR", help="under which dev/nvidia* are found (default /)")
    group.add_argument("--proc-root", metavar="DIR", help="the procfs to read (default /proc)")
    group.add_argument("--host-root", metavar="DIR", help="where the host's / is mounted, in a container (default /)")
    return parent


def node_config() -> argparse.ArgumentParser:
    """``--config`` (the node's TOML file), ``--log-level`` and the roots: what a command that
    reads the node's settings takes."""
    parent = argparse.ArgumentParser(add_help=False, parents=[roots()])
    parent.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help=f"TOML config file; flags override it (default {DEFAULT_CONFIG_FILE}, if it exists)",
    )
    parent.add_argument("--log-level", choices=LOG_LEVELS, help=f"default {DEFAULT_LOG_LEVEL}")
    return parent


def cdi_hook(title: str | None = None) -> tuple[argparse.ArgumentParser, argparse._ActionsContainer]:
    """``--hook-path``, ``--allow-untrusted-hook``, ``--capabilities``: the spec's hook and what it gives.

    With ``title`` they form a group of that name. Returns the parent and the place
    its arguments are in, for a command's own additions to the same group."""
    parent = argparse.ArgumentParser(add_help=False)
    place: argparse._ActionsContainer = parent if title is None else parent.add_argument_group(title)
    place.add_argument(
        "--capabilities",
        metavar="LIST",
        help="driver capabilities the spec gives, as NVIDIA_DRIVER_CAPABILITIES (default utility,compute)",
    )
    place.add_argument(
        "--hook-path",
        metavar="PATH",
        help="absolute path of nri-gpu-hook on the host (default: the one installed beside this nri-gpu)",
    )
    place.add_argument(
        "--allow-untrusted-hook",
        action="store_true",
        help="INSECURE: write the spec even when users other than root can change the hook (tests only)",
    )
    return parent, place
