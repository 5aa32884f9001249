"""What ``nri-gpu node-setup`` is to do, decided from its flags and what it found (pure).

The DaemonSet's init step sets up the node the way the GPU operator's toolkit
container does: edit the runtime's config through the mounted host root, restart
the runtime when that changed something, and wait until the runtime serves NRI.
This module holds the decisions, so that each can be tested without a node:

* ``Options.validate``: the flags, checked together (signal is refused for CRI-O,
  which reloads on SIGHUP instead of exiting; fail-closed needs the version given,
  as node-setup never runs the host's runtime binary to ask it);
* ``leave_unwritten``: no config file is created where NRI is served already;
* ``restart_needed``: a restart when the config changed, or, setting up, when the
  config was already as wanted but nothing listens on the NRI socket (an earlier
  run changed the file and was stopped before its restart);
* ``advice``: the command a person runs where node-setup does not restart.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = [
    "PROCESS_NAME",
    "RUNTIME_SOCKET",
    "SERVICE",
    "NodeSetupError",
    "Options",
    "RestartMode",
    "advice",
    "default_restart_mode",
    "leave_unwritten",
    "restart_needed",
]

# The runtime's main API socket: its peer is the daemon (signal mode finds it there).
RUNTIME_SOCKET = {"containerd": "/run/containerd/containerd.sock", "crio": "/var/run/crio/crio.sock"}
# The daemon's /proc/<pid>/comm: a socket's peer with another name is not signalled.
PROCESS_NAME = {"containerd": "containerd", "crio": "crio"}
SERVICE = {"containerd": "containerd", "crio": "crio"}


class NodeSetupError(Exception):
    """node-setup refuses or fails; the message names the value, file or process and why."""


class RestartMode(enum.Enum):
    """How the runtime is restarted after its config changed (the GPU operator's modes)."""

    SYSTEMD = "systemd"  # the host's systemctl restart <service>, run chrooted into the host root
    SIGNAL = "signal"  # SIGHUP to the daemon: containerd does not handle it and exits; its service restarts it
    NONE = "none"  # nothing: a person (or the test bed) restarts it; node-setup still waits for NRI


def default_restart_mode(runtime: str) -> RestartMode:
    """signal for containerd (the operator's default there), systemd for CRI-O."""
    return RestartMode.SIGNAL if runtime == "containerd" else RestartMode.SYSTEMD


@dataclasses.dataclass(frozen=True)
class Options:
    """node-setup's flags. Paths are the node's (the host's view), looked up under ``host_root``."""

    runtime: str
    host_root: str
    config: str
    nri_socket: str
    runtime_socket: str
    restart_mode: RestartMode
    timeout: float
    undo: bool = False
    fail_closed: bool = False
    runtime_version: tuple[int, int, int] | None = None

    def validate(self) -> None:
        """Raises NodeSetupError naming the first flag that is wrong."""
        if self.runtime not in SERVICE:
            raise NodeSetupError(f"--runtime {self.runtime!r}: node-setup knows containerd and crio")
        for flag, value in (
            ("--host-root", self.host_root),
            ("--config", self.config),
            ("--socket", self.nri_socket),
            ("--runtime-socket", self.runtime_socket),
        ):
            if not value.startswith("/") or "\0" in value or any(p == ".." for p in value.split("/")):
                raise NodeSetupError(f"{flag} {value!r} is not an absolute path without '..'")
        if self.config.rstrip("/") == "":
            raise NodeSetupError(f"--config {self.config!r} names no file")
        if not 0 < self.timeout <= 3600:
            raise NodeSetupError(f"--timeout {self.timeout!r} is not between 0 and 3600 seconds")
        if self.runtime == "crio" and self.restart_mode is RestartMode.SIGNAL:
            raise NodeSetupError(
                "--restart-mode signal: CRI-O reloads part of its config on SIGHUP and keeps running, so NRI "
                "would not come on; use systemd (or none)"
            )
        if self.fail_closed and self.runtime_version is None:
            raise NodeSetupError(
                "--fail-closed needs --runtime-version: node-setup does not run the host's runtime binary to ask it"
            )


def leave_unwritten(file_exists: bool, listening: bool, options: Options) -> bool:
    """Whether to write nothing at all: NRI is served already (containerd 2.x, CRI-O
    1.30+: on by default) and the file install would create does not exist. Creating it
    would change nothing but cost a restart of the runtime on every such node. With
    fail-closed the validator's keys are still to be written."""
    return not options.undo and listening and not file_exists and not options.fail_closed


def restart_needed(changed: bool, listening: bool, undo: bool) -> bool:
    """Whether to restart the runtime: after a change; setting up, also when the
    config needed no change but nothing serves NRI yet (the change is an earlier
    run's, which never got to its restart). An undo that changed nothing needs none."""
    if undo:
        return changed
    return changed or not listening


def advice(options: Options) -> str:
    """What a person runs to restart the runtime where node-setup does not."""
    return f"systemctl restart {SERVICE[options.runtime]}"
