"""The node-setup commands of ``nri-gpu``: ``config default``, ``install``, ``uninstall``
and ``node-setup`` (the DaemonSet's init step, in ``nri_gpu.plugin.cli.node_setup``).

``__main__`` has ``add_commands`` add them to its parser; each names its handler here
(``set_defaults(func=...)``), install and uninstall one per runtime kind (NRI's
containerd and CRI-O, CDI's Docker and podman) behind one report and error path.
Exit codes: 0 done (or nothing to do), 1 refused (the message names the file and
key), 2 usage error. A runtime is restarted only with ``--restart``; otherwise the
command to run is printed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nri_gpu.plugin.cli import args as cli_args
from nri_gpu.plugin.cli import node_setup
from nri_gpu.plugin.cli.cdi_conflicts import conflicts
from nri_gpu.plugin.cli.config_doc import default_config
from nri_gpu.plugin.cli.config_files import FileRefused
from nri_gpu.plugin.cli.docker_setup import (
    DAEMON_JSON,
    DEFAULT_SPEC,
    SpecResult,
    Units,
    install_spec_runtime,
    needs_cdi_feature,
    parse_docker_version,
    uninstall_spec_runtime,
)
from nri_gpu.plugin.cli.runtime_setup import (
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
from nri_gpu.plugin.cli.systemd_unit import UNIT_DIR, disable_command, enable_command, enabled_links, planned_units
from nri_gpu.plugin.config import DEFAULT_NAME, ConfigError, Settings, from_toml
from nri_gpu.plugin.events import parse_version

CDI_RUNTIMES = ("docker", "podman")  # no NRI: a CDI spec (and Docker's features.cdi)
_SERVICE = {"containerd": "containerd", "crio": "crio", "docker": "docker"}
# The node config cdi generate reads by default.
_NODE_CONFIG = cli_args.DEFAULT_CONFIG_FILE
_BINARY = {"containerd": "containerd", "crio": "crio"}


def add_commands(commands: Any) -> None:
    """Add the commands to ``commands`` (the parser's subparsers action)."""
    config = commands.add_parser("config", help="print the annotated default config file")
    config.add_argument("action", choices=("default",), help="default: the config file with every option documented")
    config.set_defaults(func=_config_default)
    node_setup.add_command(commands)

    target = _target()
    cdi, cdi_group = cli_args.cdi_hook("docker, podman: the CDI spec (as nri-gpu cdi generate writes it)")
    cdi_group.add_argument(
        "--no-unit",
        action="store_true",
        help="no systemd units (nri-gpu-cdi.service and .path: the spec rewritten at boot and when the "
        "driver changes); for a node whose nri-gpu run keeps the spec ([cdi] spec)",
    )
    cmd = commands.add_parser(
        "install",
        parents=[target, cdi, cli_args.roots()],
        help="turn on NRI in the runtime's config (keeps a backup for uninstall)",
    )
    cmd.set_defaults(func=_install)
    cmd.add_argument("--socket", metavar="PATH", help="NRI socket the runtime should listen on")
    cmd.add_argument(
        "--runtime-version",
        metavar="VERSION",
        help="the runtime's release (default: asked from its binary on PATH); containerd >= 2.2 and "
        "CRI-O >= 1.34 also get the NRI default validator set to require the plugin; Docker < 28.2 gets "
        '"features": {"cdi": true}',
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

    commands.add_parser(
        "uninstall",
        parents=[target],
        help="undo what install changed (byte for byte when nothing else changed the file)",
    ).set_defaults(func=_uninstall)


def _target() -> argparse.ArgumentParser:
    """What install and uninstall both take: the runtime, its files, --dry-run and --restart."""
    where = (
        f"containerd: the config file (default {CONTAINERD_CONFIG}); crio: the drop-in dir (default {CRIO_DROPIN_DIR}); "
        f"docker: daemon.json (default {DAEMON_JSON})"
    )
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument(
        "--runtime", required=True, choices=RUNTIMES + CDI_RUNTIMES, help="the container runtime to set up"
    )
    target.add_argument("--config", metavar="PATH", type=Path, help=where)
    target.add_argument(
        "--cdi-spec",
        metavar="PATH",
        type=Path,
        default=Path(DEFAULT_SPEC),
        help=f"docker, podman: the CDI spec file (default {DEFAULT_SPEC})",
    )
    target.add_argument(
        "--unit-dir",
        metavar="DIR",
        type=Path,
        default=Path(UNIT_DIR),
        help=f"docker, podman: where the systemd units that rewrite the spec go (default {UNIT_DIR})",
    )
    target.add_argument("--dry-run", action="store_true", help="print the diff; write nothing")
    target.add_argument("--restart", action="store_true", help="run systemctl restart for the runtime afterwards")
    return target


def _config_default(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``config default``: the annotated config file."""
    sys.stdout.write(default_config())
    return 0


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


def _docker_version(args: argparse.Namespace) -> tuple[tuple[int, int, int] | None, str]:
    """Docker's release: --runtime-version, the server's, or dockerd's; None and why not."""
    if args.runtime_version is not None:
        return parse_docker_version(args.runtime_version), f"--runtime-version {args.runtime_version!r}"
    why = []
    for argv in (["docker", "version", "--format", "{{.Server.Version}}"], ["dockerd", "--version"]):
        binary = shutil.which(argv[0])
        if binary is None:
            why.append(f"{argv[0]} is not on PATH")
            continue
        try:
            done = subprocess.run([binary, *argv[1:]], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            why.append(f"{binary}: {exc}")
            continue
        version = parse_docker_version(done.stdout) if done.returncode == 0 else None
        if version is not None:
            return version, f"{' '.join(argv)} said {done.stdout.strip()[:100]!r}"
        why.append(f"{' '.join(argv)} said {(done.stdout or done.stderr).strip()[:100]!r}")
    return None, "; ".join(why)


def _spec(args: argparse.Namespace, argv0: str) -> tuple[str, str, str] | None:
    """The spec ``cdi generate`` would write, the driver root on the host and the hook
    the spec names (None, with the reason printed, when refused)."""
    # Imported here: the CDI path pulls in the engine, which containerd and CRI-O setup never need.
    from nri_gpu.engine import EngineError, discover_inventory, hook_command
    from nri_gpu.plugin.cli import cdi as cdi_cli
    from nri_gpu.plugin.cli.compiled_hook import installed_hook

    try:
        settings = (
            from_toml(_NODE_CONFIG.read_text(), source=str(_NODE_CONFIG)) if _NODE_CONFIG.exists() else Settings()
        )
        engine = settings.engine.with_roots(
            driver_root=args.driver_root, dev_root=args.dev_root, proc_root=args.proc_root, host_root=args.host_root
        )
    except (ConfigError, EngineError, OSError) as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return None
    hook_path = args.hook_path or installed_hook(argv0)
    if hook_path is None:
        print(cdi_cli.NO_HOOK, file=sys.stderr)
        return None
    if not cdi_cli._hook_is_trusted(hook_path, args.allow_untrusted_hook):
        return None
    try:
        caps = cdi_cli.capabilities(args.capabilities, engine)
        inventory = discover_inventory(engine)
        text = cdi_cli.spec_text(inventory, engine, caps, hook_command(hook_path))
    except (EngineError, ValueError) as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return None
    for conflict in conflicts(str(args.cdi_spec)):
        print(f"nri-gpu: warning: {conflict.message}", file=sys.stderr)
    return text, str(Path(engine.host_root, engine.driver_root.lstrip("/"))), hook_path


def _units(args: argparse.Namespace, driver_root: str, hook_path: str) -> Units | None:
    """The systemd units that run this install's ``cdi generate`` again, for the spec
    naming ``hook_path`` (None: --no-unit)."""
    from nri_gpu.plugin.cli.compiled_hook import installed_nri_gpu

    if args.no_unit:
        return None
    nri_gpu = installed_nri_gpu(sys.argv[0] if sys.argv else "")
    if nri_gpu is None:
        raise SetupError("cannot tell where nri-gpu is installed for the units; pass --no-unit")
    flags: list[str] = []
    for name in ("driver_root", "dev_root", "proc_root", "host_root", "capabilities"):
        if getattr(args, name):
            flags += ["--" + name.replace("_", "-"), getattr(args, name)]
    texts = planned_units(nri_gpu, hook_path, args.cdi_spec, flags, driver_root, args.unit_dir)
    return Units(args.unit_dir, texts)


def _daemon_json(args: argparse.Namespace) -> Path | None:
    """Docker's daemon.json (podman has none)."""
    return (args.config or Path(DAEMON_JSON)) if args.runtime == "docker" else None


def _cdi_install(args: argparse.Namespace) -> SpecResult | None:
    """install for Docker and podman: the spec, the units, features.cdi (None: refused, the reason printed)."""
    daemon = _daemon_json(args)
    found = _spec(args, sys.argv[0] if sys.argv else "")
    if found is None:
        return None
    text, driver_root, hook_path = found
    units = _units(args, driver_root, hook_path)
    needed, why = False, ""
    if daemon is not None:
        version, said = _docker_version(args)
        needed = needs_cdi_feature(version)
        shown = "unknown" if version is None else ".".join(map(str, version))
        why = f"Docker version {shown} ({said})" + (
            "; features.cdi is set anyway (harmless where CDI is on by default)" if version is None else ""
        )
    result = install_spec_runtime(args.runtime, args.cdi_spec, text, daemon, needed, args.dry_run, units)
    if why:
        result.messages.insert(0, why)
    return result


def _cdi_uninstall(args: argparse.Namespace) -> SpecResult | None:
    """uninstall for Docker and podman (None: the units could not be disabled, the reason printed)."""
    enabled = enabled_links(args.unit_dir)  # disabled first: removed, they would dangle
    if args.restart and not args.dry_run and enabled and _systemctl([disable_command()]) != 0:
        return None
    return uninstall_spec_runtime(args.cdi_spec, _daemon_json(args), args.dry_run, args.unit_dir)


def _nri_install(args: argparse.Namespace) -> Result:
    """install for containerd and CRI-O."""
    fail_closed, why = _fail_closed(args)
    result = install(args.runtime, args.config, args.socket, args.dry_run, fail_closed)
    result.messages.append(why)
    return result


def _nri_uninstall(args: argparse.Namespace) -> Result:
    """uninstall for containerd and CRI-O."""
    return uninstall(args.runtime, args.config, args.dry_run)


def _install(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``install``: NRI in containerd's or CRI-O's config, a CDI spec for Docker and podman."""
    if args.runtime not in CDI_RUNTIMES:
        return _setup(args, _nri_install)
    if args.socket is not None or args.fail_closed:
        print("nri-gpu: --socket and --fail-closed are for containerd and CRI-O (NRI)", file=sys.stderr)
        return 2
    return _setup(args, _cdi_install)


def _uninstall(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``uninstall``: what install changed, undone."""
    return _setup(args, _cdi_uninstall if args.runtime in CDI_RUNTIMES else _nri_uninstall)


def _setup(args: argparse.Namespace, edit: Callable[[argparse.Namespace], Result | None]) -> int:
    """Run ``edit``, report what it did and restart what its change needs."""
    result = _refusable(edit, args)
    if result is None:
        return 1
    _report(result, args.dry_run)
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    if isinstance(result, SpecResult):
        return _after_cdi(args, result)
    if not result.changed:
        return 0
    return _restart(args, "Restart the runtime for this to take effect")


def _refusable(edit: Callable[[argparse.Namespace], Result | None], args: argparse.Namespace) -> Result | None:
    """``edit(args)``; None when it was refused, the reason printed."""
    try:
        return edit(args)
    except (SetupError, FileRefused) as exc:
        print(f"nri-gpu: refused: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"nri-gpu: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
    return None


def _after_cdi(args: argparse.Namespace, result: SpecResult) -> int:
    """The units enabled (or the command shown) and Docker restarted, as the change needs."""
    if result.units_changed:
        if not args.restart:
            print("Enable the units: " + " && ".join(" ".join(c) for c in enable_command()))
        elif _systemctl(enable_command()) != 0:
            return 1
    if not result.restart:
        return 0
    return _restart(args, "Restart dockerd for daemon.json to take effect")


def _systemctl(commands: list[list[str]]) -> int:
    """Run ``commands`` (systemctl for our units) in turn; the first failure's exit code."""
    for command in commands:
        print(f"running: {' '.join(command)}")
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            print(f"nri-gpu: {' '.join(command)} failed with exit code {done.returncode}", file=sys.stderr)
            return 1
    return 0


def _restart(args: argparse.Namespace, advice: str) -> int:
    """``systemctl restart`` of the runtime with ``--restart``, else ``advice`` and the command."""
    restart = ["systemctl", "restart", _SERVICE[args.runtime]]
    if not args.restart:
        print(f"{advice}: {' '.join(restart)}")
        return 0
    print(f"running: {' '.join(restart)}")
    done = subprocess.run(restart, check=False)
    if done.returncode != 0:
        print(f"nri-gpu: {' '.join(restart)} failed with exit code {done.returncode}", file=sys.stderr)
        return 1
    return 0
