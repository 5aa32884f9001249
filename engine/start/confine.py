"""The trusted ldconfig's process: confined, then exec'ed. Runs in a fresh fork only.

Forked by the worker (inside the container's mount namespace) into a fresh pid
namespace of its own (see ``ldconfig._fork``), it:

* takes a private copy of the mount namespace (``unshare``), so what it
  mounts is seen by itself alone, and makes every mount in it private,
  read-only, ``nodev`` and ``nosuid``: no device node of the image or of a
  volume that a conf file or library folder points at can be opened;
* attaches the worker's output tmpfs (owned by ``nobody``) over ``/proc`` and
  covers every other procfs mount of the container with an empty read-only
  tmpfs: no magic link (``/proc/1/root``, ``/proc/1/fd/N``) is left to climb
  out of the container's root through, whatever symlink the image planted;
* gets fresh net, IPC and UTS namespaces, none of the container's nor the
  host's: a crafted ELF file that took over ldconfig reaches no abstract
  socket, SysV object or process of anyone's;
* is pid 1 of a pid namespace of its own: no process of the pod (a sidecar
  of the same uid in a shared process namespace) can name it, so none can
  ptrace it, open its ``/proc/<pid>`` or take an fd from it (``pidfd_getfd``);
* becomes ``nobody`` (uid and gid 65534, no supplementary groups) with no
  capability left, bounding set included, ``no_new_privs``, and not dumpable,
  also after the exec (which makes a process dumpable again only when its uid
  may read the binary: ``ldconfig.open_trusted`` hands over a copy ``nobody``
  may only execute), so not even a host process of uid 65534 can ptrace it;
  10 s of CPU, 64 MiB files. ldconfig only reads the container; the one thing
  it writes is its cache, into the output tmpfs (``-C /proc/ld.so.cache``);
  ``-X`` stops it making SONAME links and ``-i`` from trusting the image's aux
  cache. (It also tries ``/var/cache/ldconfig/aux-cache``, on a read-only
  view: that fails quietly.)
* exec's the binary by fd with an empty environment, cwd ``/``, stdin
  ``/dev/null``, stdout and stderr into the worker's pipe, and no other fd;
* dies with the worker (``PR_SET_PDEATHSIG``, and a look at the worker's
  pidfd after the last change of uid).
"""

from __future__ import annotations

import fcntl
import os
import resource
import select
import signal
from dataclasses import dataclass

from nri_gpu.engine.start import syscalls
from nri_gpu.engine.start.rootdir import RootDir

__all__ = ["ARGV", "CACHE_NAME", "OUTPUT", "UID", "Trusted", "exec_confined"]

UID = 65534  # nobody, and nogroup: no more rights in the container than its least user
OUTPUT = "/proc"  # where the output tmpfs is attached, in ldconfig's private namespace only
CACHE_NAME = "ld.so.cache"
ARGV = ("ldconfig", "-X", "-i", "-f", "/etc/ld.so.conf", "-C", f"{OUTPUT}/{CACHE_NAME}")
_LIMITS = ((resource.RLIMIT_CPU, 10), (resource.RLIMIT_FSIZE, 64 << 20))
# ldconfig's copy of the container: nothing to write, no device to open, no setuid.
_VIEW_FLAGS = syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOSUID


@dataclass(frozen=True)
class Trusted:
    """What the ldconfig run needs from the host side, opened before ``setns``.

    ``binary``: the ldconfig fd; ``own_pid_namespace``: the worker's pid
    namespace, set back for its children after the ldconfig process was made in
    a fresh one;
    ``proc_mounts``: mount points of the container's procfs mounts; ``devnull``:
    the host's ``/dev/null``, for stdin.
    """

    path: str
    binary: int
    own_pid_namespace: int
    proc_mounts: tuple[str, ...]
    devnull: int


def exec_confined(trusted: Trusted, output: int, cache_mount: int, parent: int) -> None:
    """In the forked ldconfig process: confine, then exec. Never returns.

    ``output``: the pipe for stdout and stderr; ``cache_mount``: the detached
    tmpfs the cache is written into (the worker reads it from there);
    ``parent``: a pidfd of the worker."""
    try:
        # Above the stdio numbers first: a plugin started with closed stdio may
        # hold any of these as fd 0, 1 or 2, which the dup2 calls would clobber.
        binary, devnull, output, parent = (
            fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (trusted.binary, trusted.devnull, output, parent)
        )
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        # The worker killed on timeout takes this process along. The kernel clears
        # the setting when the uid changes, so it is set again after that, and a
        # worker that died in between (or before the first) is noticed through
        # its pidfd: as pid 1 of its own pid namespace this process has no
        # parent pid to look at (getppid() is 0).
        syscalls.parent_death_signal(signal.SIGKILL)
        # A private copy of the container's mount namespace: what is covered
        # here is covered for ldconfig only, never for the container.
        # Fresh net, IPC and UTS namespaces come along (not the container's: a
        # pod's sidecar shares those).
        syscalls.unshare(syscalls.CLONE_NEWNS | syscalls.CLONE_NEWNET | syscalls.CLONE_NEWIPC | syscalls.CLONE_NEWUTS)
        root = RootDir.current()
        syscalls.mount_setattr(
            root.fd,
            "",
            syscalls.AT_EMPTY_PATH | syscalls.AT_RECURSIVE,
            attr_set=_VIEW_FLAGS,
            propagation=syscalls.MS_PRIVATE,
        )
        _attach(root, OUTPUT, cache_mount)
        for point in trusted.proc_mounts:
            if point != OUTPUT:
                _attach(root, point, _empty_tmpfs())
        # Nothing of the worker's (the container's roots, its pipes) is held once this
        # process is nobody's: only the binary and the worker's pidfd are kept.
        _close_fds_except(binary, parent)
        for limit, value in _LIMITS:
            resource.setrlimit(limit, (value, value))
        _become_nobody()
        syscalls.set_dumpable(False)
        syscalls.parent_death_signal(signal.SIGKILL)
        if _has_exited(parent):
            os._exit(126)
        os.chdir("/")
        _close_fds_except(binary)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        os.execve(binary, list(ARGV), {})
    except BaseException as exc:
        try:
            os.write(2, f"nri-gpu: before running ldconfig: {exc}\n".encode())
        finally:
            os._exit(127)


def _has_exited(pidfd: int) -> bool:
    # A pidfd is readable once its process has exited.
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _attach(root: RootDir, point: str, mount: int) -> None:
    """Attach the detached ``mount`` over the directory ``point`` of the root."""
    try:
        target = root.open(point, os.O_PATH | os.O_DIRECTORY, resolve=syscalls.RESOLVE_NO_SYMLINKS)
    except OSError as exc:
        raise OSError(exc.errno, f"{point}: {exc.strerror}") from exc
    try:
        syscalls.move_mount(mount, "", target, "", syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH)
    finally:
        os.close(target)
        os.close(mount)


def _empty_tmpfs() -> int:
    return syscalls.new_tmpfs((("mode", "0555"), ("size", "4k"), ("nr_inodes", "1")), read_only=True)


def _become_nobody() -> None:
    cap = 0
    while syscalls.capbset_drop(cap):  # every capability the kernel knows, whatever this Python knows of
        cap += 1
    # No supplementary groups, then real, effective and saved gid and uid (from uid 0
    # to another, the kernel clears every capability). glibc applies each to every
    # thread it knows of: after a fork, this one alone.
    os.setgroups([])
    os.setresgid(UID, UID, UID)
    os.setresuid(UID, UID, UID)
    syscalls.capset(frozenset())  # and we make sure
    syscalls.no_new_privs()


def _close_fds_except(*keep: int) -> None:
    # Nothing of the plugin's (sockets, the result pipe) reaches ldconfig.
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = max(low, fd + 1)
    os.closerange(low, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
