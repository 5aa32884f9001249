"""``nri-gpu node-setup``: the DaemonSet's init step, which sets up the node itself.

Theory of operation. The init container has the host's ``/`` read-only at
``--host-root`` and, on top of it, the runtime's config folder writable. In order:

1. whether something already serves NRI is asked of the NRI socket, and its
   peer's pid kept; where it does and there is no config file, nothing is written
   (``nri_gpu.plugin.cli.node_plan.leave_unwritten``: containerd 2.x needs none);
2. the config folder is looked up inside the host root (``nri_gpu.plugin.cli.node_root``: no
   link leads out of it) and ``nri-gpu install`` (``--undo``: ``uninstall``) runs
   on that folder's descriptor, with its usual backup and record beside the config;
   a restart is done when the config changed, or when nothing serves NRI
   (``nri_gpu.plugin.cli.node_plan.restart_needed``);
3. the restart, by ``--restart-mode``: ``systemd`` runs the host's ``systemctl
   restart <service>`` chrooted into the host root, after checking that only root
   can change that binary; ``signal`` sends SIGHUP to the daemon found as the
   peer of its API socket (``SO_PEERCRED``; containerd exits on it and its service
   manager starts it again), through a pidfd, after checking its name and owner,
   and waits for it to exit; ``none`` prints the command to run;
4. setting up, it waits (``--timeout``) until the NRI socket accepts a connection
   from a daemon other than the one that served before the restart.

The host's runtime binary is never run (its version, where needed, is a flag).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from nri_gpu.plugin.cli.config_files import FileRefused
from nri_gpu.plugin.cli.node_plan import (
    PROCESS_NAME,
    RUNTIME_SOCKET,
    SERVICE,
    NodeSetupError,
    Options,
    RestartMode,
    advice,
    default_restart_mode,
    leave_unwritten,
    restart_needed,
)
from nri_gpu.plugin.cli.node_root import NodeRoot, NodeRootError
from nri_gpu.plugin.cli.runtime_setup import (
    CONTAINERD_CONFIG,
    CRIO_DROPIN_DIR,
    CRIO_DROPIN_NAME,
    Result,
    SetupError,
    fail_closed_for,
    install,
    uninstall,
)
from nri_gpu.plugin.config import DEFAULT_NAME, DEFAULT_SOCKET
from nri_gpu.plugin.events import parse_version

__all__ = ["COMMAND", "add_command", "main", "run"]

COMMAND = "node-setup"
DEFAULT_HOST_ROOT = "/host"
SYSTEMCTL = ("/usr/bin/systemctl", "/bin/systemctl")
_CONFIG = {"containerd": CONTAINERD_CONFIG, "crio": CRIO_DROPIN_DIR}
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_POLL = 0.2


def add_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    # No abbreviations: a manifest's misspelt flag must fail, not become another flag.
    cmd = commands.add_parser(
        COMMAND, allow_abbrev=False, help="the DaemonSet's init step: install through the host root, restart, wait"
    )
    cmd.add_argument("--runtime", required=True, choices=tuple(SERVICE), help="the node's container runtime")
    cmd.add_argument("--host-root", default=DEFAULT_HOST_ROOT, metavar="DIR", help="where the host's / is mounted")
    cmd.add_argument("--config", metavar="PATH", help="the node's config file (crio: drop-in folder), a host path")
    cmd.add_argument("--socket", default=DEFAULT_SOCKET, metavar="PATH", help="the NRI socket, a host path")
    cmd.add_argument("--runtime-socket", metavar="PATH", help="the runtime's API socket (signal mode finds it there)")
    cmd.add_argument("--restart-mode", choices=[m.value for m in RestartMode], help="default: signal (crio: systemd)")
    cmd.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="bound of each restart and wait")
    cmd.add_argument("--undo", action="store_true", help="run uninstall instead (on removal); no wait for NRI")
    cmd.add_argument("--fail-closed", action="store_true", help="as install's; needs --runtime-version")
    cmd.add_argument("--runtime-version", metavar="VERSION", help="the runtime's release (never asked of its binary)")
    cmd.add_argument("--plugin-name", default=DEFAULT_NAME, metavar="NAME", help="the plugin name to require")
    cmd.set_defaults(func=main)


def options_from(args: argparse.Namespace) -> Options:
    """Options from the parsed flags. Raises NodeSetupError for a bad version."""
    version = None
    if args.runtime_version is not None:
        version = parse_version(args.runtime_version)
        if version is None:
            raise NodeSetupError(f"--runtime-version {args.runtime_version!r} is not a version")
    mode = RestartMode(args.restart_mode) if args.restart_mode else default_restart_mode(args.runtime)
    options = Options(
        runtime=args.runtime,
        host_root=args.host_root,
        config=args.config or _CONFIG[args.runtime],
        nri_socket=args.socket,
        runtime_socket=args.runtime_socket or RUNTIME_SOCKET[args.runtime],
        restart_mode=mode,
        timeout=args.timeout,
        undo=args.undo,
        fail_closed=args.fail_closed,
        runtime_version=version,
    )
    options.validate()
    return options


def main(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """``node-setup``; reads no environment (the flags say it all)."""
    try:
        options = options_from(args)
    except NodeSetupError as exc:
        print(f"nri-gpu: {exc}", file=sys.stderr)
        return 2
    try:
        run(options, args.plugin_name)
    except (NodeSetupError, NodeRootError, SetupError, FileRefused) as exc:
        print(f"nri-gpu: node-setup: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"nri-gpu: node-setup: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def run(options: Options, plugin_name: str = DEFAULT_NAME) -> None:
    """Set up (or undo) the node. Raises NodeSetupError, NodeRootError, SetupError, FileRefused."""
    with NodeRoot(options.host_root) as root:
        served_by = None if options.undo else _nri_peer(root, options.nri_socket)
        fd = root.open_folder(str(_folder(options)))
        try:
            if leave_unwritten(_exists(fd, options), served_by is not None, options):
                print(
                    f"{options.nri_socket}: NRI is served (pid {served_by}) and there is no {_file(options)}: "
                    "nothing to change"
                )
                return
            result = _edit(fd, options, plugin_name)
        finally:
            os.close(fd)
        _report(result)
        if not restart_needed(result.changed, served_by is not None, options.undo):
            print(f"{options.nri_socket}: NRI is served (pid {served_by}); no restart" if served_by else "no restart")
            return
        if not result.changed:
            print(f"{options.nri_socket}: nothing serves NRI although the config is set up: restarting")
        _restart(root, options)
        if not options.undo:
            _wait_for_nri(root, options, served_by)


def _folder(options: Options) -> Path:
    """The folder install writes in: the config's (containerd), the drop-in folder (CRI-O)."""
    config = Path(options.config)
    return config.parent if options.runtime == "containerd" else config


def _file(options: Options) -> Path:
    """The file install creates where there is none."""
    return Path(options.config) if options.runtime == "containerd" else Path(options.config, CRIO_DROPIN_NAME)


def _exists(folder: int, options: Options) -> bool:
    try:
        os.stat(_file(options).name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _edit(folder: int, options: Options, plugin_name: str) -> Result:
    """install (``--undo``: uninstall) in the folder ``folder`` is a descriptor of."""
    config = Path(options.config)
    if options.undo:
        return uninstall(options.runtime, config, at=folder)
    fail_closed, why = None, "fail-closed: not set up (--fail-closed not given)"
    if options.fail_closed:
        fail_closed, why = fail_closed_for(options.runtime, options.runtime_version, "", plugin_name)
    result = install(options.runtime, config, options.nri_socket, fail_closed=fail_closed, at=folder)
    result.messages.append(why)
    return result


def _report(result: Result) -> None:
    for message in result.messages:
        print(message)
    for warning in result.warnings:
        print(f"nri-gpu: warning: {warning}", file=sys.stderr)


def _peer(root: NodeRoot, node_path: str) -> tuple[int, int]:
    """(pid, uid) of the process listening on ``node_path``; the OSError of connect."""
    with root.connect(node_path, timeout=2.0) as sock:
        pid, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def _nri_peer(root: NodeRoot, node_path: str) -> int | None:
    """The pid serving NRI at ``node_path``; None when nothing does."""
    try:
        return _peer(root, node_path)[0]
    except (FileNotFoundError, ConnectionRefusedError, TimeoutError):
        return None


def _restart(root: NodeRoot, options: Options) -> None:
    if options.restart_mode is RestartMode.NONE:
        print(f"restart mode none: restart the runtime yourself ({advice(options)})")
    elif options.restart_mode is RestartMode.SIGNAL:
        _signal(root, options)
    else:
        _systemctl(root, options)


def _signal(root: NodeRoot, options: Options) -> None:
    """SIGHUP to the daemon behind the runtime's socket; returns once it has exited."""
    name = PROCESS_NAME[options.runtime]
    try:
        pid, uid = _peer(root, options.runtime_socket)
    except (FileNotFoundError, ConnectionRefusedError, TimeoutError) as exc:
        raise NodeSetupError(f"{options.runtime_socket}: no {name} listens there ({exc.strerror or exc})") from exc
    if pid <= 1:
        raise NodeSetupError(
            f"{options.runtime_socket}: its peer is pid {pid}: "
            + ("not in this PID namespace (the pod needs hostPID)" if pid == 0 else "the service manager's socket")
            + "; use --restart-mode systemd"
        )
    pidfd = os.pidfd_open(pid)  # the signal goes to this process or to none, never to a reuse of the pid
    try:
        comm = _comm(pid)
        owner = os.stat(f"/proc/{pid}").st_uid
        if comm != name or uid != 0 or owner != 0:
            raise NodeSetupError(
                f"{options.runtime_socket}: its peer, pid {pid}, is {comm!r} of uid {owner}, not root's {name!r}; "
                "not signalling it"
            )
        print(f"restart mode signal: SIGHUP to {name} (pid {pid})")
        signal.pidfd_send_signal(pidfd, signal.SIGHUP)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # readable once the process has exited
        if not poller.poll(options.timeout * 1000):
            raise NodeSetupError(
                f"{name} (pid {pid}) still runs {options.timeout:g}s after SIGHUP; use --restart-mode systemd"
            )
    finally:
        os.close(pidfd)


def _comm(pid: int) -> str:
    """The name ``pid`` gave itself (``PR_SET_NAME``: any bytes, up to 15), read with a
    bound; bytes that are not UTF-8 are shown escaped, and so match no runtime's name."""
    fd = os.open(f"/proc/{pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        raw = os.read(fd, 64)
    finally:
        os.close(fd)
    return raw.rstrip(b"\n").decode(errors="backslashreplace")


def _systemctl(root: NodeRoot, options: Options) -> None:
    """``systemctl restart <service>`` of the host, chrooted into the host root."""
    why = []
    for candidate in SYSTEMCTL:
        try:
            root.check_root_only(candidate)
        except NodeRootError as exc:
            why.append(str(exc))
            continue
        argv = [candidate, "restart", SERVICE[options.runtime]]
        print(f"restart mode systemd: running {' '.join(argv)} on the host")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "SYSTEMD_IGNORE_CHROOT": "1"}
        try:
            done = subprocess.run(
                argv, env=env, preexec_fn=_chroot(root.path), capture_output=True, text=True, timeout=options.timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise NodeSetupError(f"{' '.join(argv)} did not finish in {options.timeout:g}s") from exc
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip()[:300]
            raise NodeSetupError(f"{' '.join(argv)} failed with exit code {done.returncode}: {said}")
        return
    raise NodeSetupError("no systemctl that only root can change: " + "; ".join(why))


def _chroot(path: str) -> Callable[[], None]:
    def enter() -> None:
        os.chroot(path)
        os.chdir("/")

    return enter


def _wait_for_nri(root: NodeRoot, options: Options, old: int | None) -> None:
    """Until a daemon other than ``old`` serves NRI at the socket; NodeSetupError after the timeout."""
    deadline = time.monotonic() + options.timeout
    last = "nothing there"
    print(f"waiting up to {options.timeout:g}s for NRI at {options.nri_socket}")
    while True:
        try:
            pid, _ = _peer(root, options.nri_socket)
            # Pid 0: the daemon is outside this PID namespace (no hostPID), old and new
            # cannot be told apart; whoever answers is taken.
            if pid != old or pid == 0:
                print(f"{options.nri_socket}: NRI is served (pid {pid})")
                return
            last = f"still served by pid {pid}, the runtime from before the restart"
        except FileNotFoundError:
            last = "nothing there"
        except (ConnectionRefusedError, TimeoutError):
            last = "a socket no one listens on"
        if time.monotonic() >= deadline:
            raise NodeSetupError(
                f"{options.nri_socket}: no NRI after {options.timeout:g}s ({last}); is the runtime restarted "
                f"({advice(options)}) and is its NRI socket_path this one?"
            )
        time.sleep(_POLL)
