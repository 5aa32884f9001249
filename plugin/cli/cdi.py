"""``nri-gpu cdi generate``: the CDI path.

For runtimes that never reach NRI (nerdctl, podman, Docker, containerd with a
CDI annotation): ``cdi generate`` writes a CDI spec from the node's inventory
(``engine.cdi``); the runtime runs its ``createContainer`` hook, the compiled
``nri-gpu-hook`` (hook/), which does the StartContainer work with what the spec
holds (``engine.cdi.hook_work``).

That hook runs as root at every GPU container start, so ``cdi generate`` first
checks that only root can change it (``nri_gpu.plugin.cli.hook_install.check_hook``) and
refuses otherwise; ``--allow-untrusted-hook`` turns the refusal into a warning
per problem, for test machines.

Exit codes: 0 done, 1 refused (the message says why), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nri_gpu.engine import (
    LD_CACHE_MODES,
    Capability,
    EngineConfig,
    EngineError,
    HookCommand,
    Inventory,
    cdi_spec,
    discover_inventory,
    hook_command,
    parse_capabilities,
    spec_warnings,
)
from nri_gpu.plugin.cli import args as cli_args
from nri_gpu.plugin.cli.cdi_conflicts import conflicts
from nri_gpu.plugin.cli.compiled_hook import HOOK_EXECUTABLE, installed_hook
from nri_gpu.plugin.cli.config_files import FileRefused, Folder
from nri_gpu.plugin.cli.hook_install import check_hook

# Where the README installs nri-gpu, and with it the hook: root's own, named by every spec.
INSTALL_VENV = "/usr/local/lib/nri-gpu/venv"
INSTALL_LINK = "/usr/local/bin/nri-gpu"
NO_HOOK = f"nri-gpu: no {HOOK_EXECUTABLE} beside this nri-gpu (was it installed with pip?); pass --hook-path"


def add_commands(
    commands: Any,
    node_config: argparse.ArgumentParser,
    generate_command: Callable[[argparse.Namespace, Mapping[str, str]], int],
) -> None:
    """Add ``cdi`` to ``commands`` (the parser's subparsers action), with the parent
    ``node_config`` (config file, log level, roots) and ``generate_command`` as its
    command."""
    hook_args, _ = cli_args.cdi_hook()
    cdi = commands.add_parser(
        "cdi", parents=[hook_args, node_config], help="write a CDI spec for nerdctl, podman and other CDI users"
    )
    cdi.add_argument("action", choices=("generate",), help="generate: the spec of this node's GPUs")
    cdi.add_argument("--output", metavar="FILE", help="write the spec here (atomically) instead of stdout")
    cdi.add_argument("--ldconfig", metavar="PATH", help="the host's static ldconfig the hook runs (--ld-cache rebuild)")
    cdi.add_argument("--ld-cache", choices=LD_CACHE_MODES, help="how the hook updates the ld.so cache (default merge)")
    cdi.set_defaults(func=generate_command)


def spec_text(inventory: Inventory, engine: EngineConfig, caps: frozenset[Capability], hook: HookCommand) -> str:
    """The spec file's text (raises DiscoveryError on a node without GPUs)."""
    return json.dumps(cdi_spec(inventory, engine, caps, hook), indent=2) + "\n"


def capabilities(value: str | None, engine: EngineConfig) -> frozenset[Capability]:
    """The capabilities a spec gives: ``value`` (default utility,compute) within the policy's."""
    caps = parse_capabilities(value, legacy_image=False, what="--capabilities ")
    return caps & engine.policy.capabilities


def _ld_cache_flags(args: argparse.Namespace, engine: EngineConfig) -> EngineConfig:
    return engine.with_roots(ldconfig=args.ldconfig, ld_cache=args.ld_cache)


def generate(args: argparse.Namespace, engine: EngineConfig, argv0: str) -> int:
    engine = _ld_cache_flags(args, engine)
    hook_path = args.hook_path or installed_hook(argv0)
    if hook_path is None:
        print(NO_HOOK, file=sys.stderr)
        return 2
    if not _hook_is_trusted(hook_path, args.allow_untrusted_hook):
        return 1
    try:
        caps = capabilities(args.capabilities, engine)
        hook = hook_command(hook_path)
        inventory = discover_inventory(engine)
        text = spec_text(inventory, engine, caps, hook)
    except (EngineError, ValueError) as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return 1
    # What the spec leaves out (MIG devices NVML could not name): the spec is
    # still good for every device it has.
    for warning in spec_warnings(inventory):
        print(f"nri-gpu: warning: {warning}", file=sys.stderr)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    # Written anyway (asked for by hand), but never silently beside another producer's.
    for conflict in conflicts(args.output):
        print(f"nri-gpu: warning: {conflict.message}", file=sys.stderr)
    # Written whole and renamed over the name: a runtime watching the spec
    # directory never reads half a spec.
    output = Path(args.output)
    try:
        with Folder(output.parent) as folder:
            folder.write(output.name, text.encode())
    except FileRefused as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"nri-gpu: {args.output}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def _hook_is_trusted(hook_path: str, allow: bool) -> bool:
    """Refuse (False, with the reasons) a hook that users other than root can
    change; with ``allow``, say loudly that the spec is unsafe and go on."""
    problems = check_hook(hook_path)
    if not problems:
        return True
    if allow:
        lines = [
            f"nri-gpu: WARNING: --allow-untrusted-hook: the spec's hook {hook_path} runs as root at every GPU "
            "container start, and users other than root can change it:",
            *(f"nri-gpu: WARNING:   {p}" for p in problems),
            "nri-gpu: WARNING: use this spec for tests only",
        ]
    else:
        lines = [
            f"nri-gpu: refused: the spec's hook {hook_path} would run as root at every GPU container start, "
            "and users other than root can change it:",
            *(f"nri-gpu:   {p}" for p in problems),
            f"nri-gpu: install nri-gpu where only root can write (as root: python3 -m venv {INSTALL_VENV}; "
            f"{INSTALL_VENV}/bin/pip install <nri-gpu>; ln -s {INSTALL_VENV}/bin/nri-gpu {INSTALL_LINK}) and run "
            f"{INSTALL_LINK} cdi generate, or pass --hook-path",
        ]
    print("\n".join(lines), file=sys.stderr)
    return allow
