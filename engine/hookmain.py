"""``nri-gpu hook start-container``: the CDI hook's own command line, light to import.

The runtime runs the hook at every GPU container's start and waits for it, so
the hook's process imports only what the start work needs: the engine's
discovery, planning and start actions, and argparse, whose parser is built only
for a command line that is not the spec's (``spec_form``). Not the rest of the
command line (``plugin.__main__``: asyncio, protobuf, the NRI stub, tomlkit), which
would cost a GPU container ~100 ms of imports for a few ms of work
(``docs/performance.md``, "The CDI path"). ``plugin.entry`` sends
``nri-gpu hook ...`` here before it imports anything else; ``nri-gpu cdi``'s
parser shares ``add_arguments`` and ``run``.

Everything comes from the arguments the CDI spec holds: no config file, no
environment. The hook bounds its own run (``--time-limit``), reads at most
``STATE_LIMIT`` + 1 bytes of stdin, and runs neither the CUDA nor the NVML
probe. Exit codes: 0 done, 1 refused (the message says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from engine.cdi import HOOK_TIME_LIMIT
from engine.config import LD_CACHE_MODES, EngineConfig, EngineConfigError
from engine.errors import EngineError
from engine.model import NvmlSnapshot
from engine.request import parse_capabilities

__all__ = ["ACTIONS", "add_arguments", "main", "run", "spec_form"]

ACTIONS = ("start-container",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The hook's arguments (the action first), as the CDI spec writes them."""
    parser.add_argument("action", choices=ACTIONS, help="start-container: a createContainer hook, OCI state on stdin")
    parser.add_argument("--capabilities", metavar="LIST", required=True, help="the capabilities the spec gives")
    parser.add_argument("--ldconfig", metavar="PATH", help="the host's static ldconfig (default /sbin/ldconfig)")
    parser.add_argument("--ld-cache", choices=LD_CACHE_MODES, help="merge (default) or rebuild the ld.so cache")
    for flag in ("--driver-root", "--dev-root", "--proc-root"):
        parser.add_argument(flag, metavar="DIR")
    parser.add_argument(
        "--time-limit",
        metavar="SECONDS",
        type=_seconds,
        default=HOOK_TIME_LIMIT,
        help=f"fail (exit 1) when not done after this long (default {HOOK_TIME_LIMIT:g})",
    )


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds between 0 and 3600")
    return seconds


def main(argv: Sequence[str] | None = None, *, prog: str = "nri-gpu hook") -> int:
    """``nri-gpu hook ARGS``: ``argv`` is ARGS (default ``sys.argv[2:]``)."""
    words = list(sys.argv[2:] if argv is None else argv)
    args = spec_form(words)
    if args is None:  # help, a mistake, any other spelling: argparse's answer and exit status
        parser = argparse.ArgumentParser(
            prog=prog, description="OCI hooks run by the runtime (written into the CDI spec)"
        )
        add_arguments(parser)
        args = parser.parse_args(words)
    return run(args, sys.stdin)


# The spec's flags (``engine.cdi.hook_command``) -> their attribute, as add_arguments names them.
_SPEC_FLAGS = {
    "--capabilities": "capabilities",
    "--ldconfig": "ldconfig",
    "--ld-cache": "ld_cache",
    "--driver-root": "driver_root",
    "--dev-root": "dev_root",
    "--proc-root": "proc_root",
    "--time-limit": "time_limit",
}


def spec_form(words: Sequence[str]) -> argparse.Namespace | None:
    """The arguments as argparse would parse them, when ``words`` are spelled as the
    spec writes them (``start-container``, then each flag once, whole, with a value
    not starting with ``-``); None for anything else, which argparse then parses.

    Building the parser costs the hook ~3 ms at every container start (its help
    formatter imports shutil, bz2 and lzma for the terminal's width), for a
    command line that is always the spec's.

    >>> spec_form(["start-container", "--capabilities", "compute"]).capabilities
    'compute'
    >>> spec_form(["start-container", "--capabilities=compute"]) is None
    True
    """
    if not words or words[0] != ACTIONS[0] or len(words) % 2 == 0:
        return None
    values: dict[str, str] = {}
    for flag, value in zip(words[1::2], words[2::2], strict=True):
        name = _SPEC_FLAGS.get(flag)
        if name is None or name in values or value.startswith("-"):
            return None
        values[name] = value
    if "capabilities" not in values or values.get("ld_cache", LD_CACHE_MODES[0]) not in LD_CACHE_MODES:
        return None
    try:
        limit = _seconds(values.pop("time_limit")) if "time_limit" in values else HOOK_TIME_LIMIT
    except argparse.ArgumentTypeError:
        return None
    found = dict.fromkeys(("ldconfig", "ld_cache", "driver_root", "dev_root", "proc_root")) | values
    return argparse.Namespace(action=ACTIONS[0], **found, time_limit=limit)


def run(args: argparse.Namespace, stdin: TextIO) -> int:
    """Do ``args.action`` (start-container) with the OCI state on ``stdin``."""
    from engine.hook import time_limit, work_timeout

    # First: whatever follows may block (a stdin that never closes, a stuck file system).
    with time_limit(args.time_limit):
        deadline = time.monotonic() + work_timeout(args.time_limit)
        try:
            engine = EngineConfig().with_roots(
                driver_root=args.driver_root,
                dev_root=args.dev_root,
                proc_root=args.proc_root,
                ldconfig=args.ldconfig,
                ld_cache=args.ld_cache,
            )
        except EngineConfigError as exc:
            print(f"nri-gpu hook: {exc.flag_message()}", file=sys.stderr)
            return 2
        return _start_container(args.capabilities, engine, stdin, deadline)


def _start_container(capabilities: str, engine: EngineConfig, stdin: TextIO, deadline: float) -> int:
    from engine.discover import discover
    from engine.hook import STATE_LIMIT, run_hook

    # runc starts the hook in the container's root; nothing of ours is looked up there.
    os.chdir("/")
    # Discovery's notes (a missing optional file) are not the runtime's business:
    # only a failure, on stderr, which runc puts in the error it returns.
    logging.basicConfig(level=logging.ERROR)
    try:
        caps = parse_capabilities(capabilities, legacy_image=False, what="--capabilities ")
        caps &= engine.policy.capabilities
        state = stdin.buffer.read(STATE_LIMIT + 1)
        left = max(0.0, deadline - time.monotonic())
        run_hook(
            state,
            engine,
            caps,
            lambda: discover(engine, cuda_version=_no_cuda_probe, nvml=_no_nvml_probe),
            timeout=left,
        )
    except EngineError as exc:
        print(f"nri-gpu hook: {exc}", file=sys.stderr)
        return 1
    return 0


def _no_cuda_probe(driver_root: str) -> tuple[str | None, str | None]:
    """The CUDA version only matters for requirements, which the hook does not check."""
    return None, "not probed by the hook"


def _no_nvml_probe(libnvml: str) -> tuple[NvmlSnapshot | None, str | None]:
    """The hook finds MIG devices by their placement (the cap nodes the spec gave),
    which needs procfs only: no NVML child at each container start."""
    return None, "not probed by the hook"
