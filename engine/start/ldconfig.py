"""The loader configuration and cache in the container: ``ld.so.conf.d`` + a trusted ldconfig.

The injected libraries live in folders the image's cache may not list, so
``/etc/ld.so.conf.d/00-nri-gpu.conf`` names them (a later ``ldconfig`` inside
the container keeps them) and the cache is rebuilt. The CVEs that shaped how:

* CVE-2024-0136/0137: never run a binary from the image. The ldconfig run is
  the *plugin's* own, opened on the host before entering the container and
  executed by fd (``fexecve``), and only if it is static: a dynamic one would
  be loaded by the container's ``ld-linux`` and honour its ``ld.so.preload``.
* CVE-2025-23266 (NVIDIAScape): no environment reaches it, so no ``LD_PRELOAD``
  or ``LD_LIBRARY_PATH`` of the image either (static anyway), and cwd is ``/``.
* CVE-2025-23267 (ldconfig writing through the image's links) and its
  relatives: ldconfig writes *nothing* in the container. It runs as ``nobody``
  without capabilities, with ``-X`` (no SONAME links: glibc takes a SONAME such
  as ``../../data/x`` as it is and would plant a link wherever it points), with
  ``-i`` (the image's aux cache is not read), and puts its cache in a private
  tmpfs (``confine``). This process then installs the cache like every other
  file it writes: resolved in the root, on the root file system only (never in
  a volume), through a temporary file renamed into place.
* Procfs magic links: ldconfig's view of the container has every procfs mount
  covered, so ``/proc/1/root`` or ``/proc/1/fd/N`` lead nowhere.

The driver libraries' own links are made by ``links`` before ldconfig runs.

That is the ``rebuild`` mode. The default, ``merge``, runs no process at all:
``merge`` reads the image's cache (through the root, like every file here),
inserts the plan's entries where ldconfig would (``engine.ldcache_merge``) and
installs the result the same way. An unreadable or garbled image cache counts
as empty, as the loader ignores it too; the result then lists ours alone, and
the image's libraries are found in the loader's default folders as before.
"""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import time

from nri_gpu.engine.drain import Drained, drain
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.ldcache import MAX_CACHE_SIZE, LdCache, LdCacheLimit, parse_ld_so_cache, read_ld_so_cache
from nri_gpu.engine.ldcache_merge import encode
from nri_gpu.engine.ldcache_merge import merge as merge_entries
from nri_gpu.engine.model import LdCacheEntry
from nri_gpu.engine.start import confine, elf, syscalls
from nri_gpu.engine.start.confine import Trusted
from nri_gpu.engine.start.rootdir import (
    WRITE,
    OverLimit,
    RootDir,
    current_bytes,
    describe,
    read_regular,
    split,
    write_atomically,
    write_file,
)
from nri_gpu.engine.start.work import WorkError

__all__ = [
    "COMPAT_CONF",
    "CONF",
    "Trusted",
    "cache_lists",
    "merge",
    "open_trusted",
    "run",
    "write_compat_conf",
    "write_conf",
]

CONF = "/etc/ld.so.conf.d/00-nri-gpu.conf"  # 00-: before the image's own files, as the toolkit's 00-nvcr
# CUDA forward compatibility: the image's compat folder, read before ours. glibc
# reads ``include /etc/ld.so.conf.d/*.conf`` through glob(3), which sorts the
# names (byte order in ldconfig's C locale, and 'c' sorts before 'n' in the
# usual ones too): "00-compat-nri-gpu.conf" < "00-nri-gpu.conf", so a rebuild
# scans the compat folder first and lists its libcuda.so.1 before the
# driver's, as the toolkit's "00-compat-<random>.conf" does.
COMPAT_CONF = "/etc/ld.so.conf.d/00-compat-nri-gpu.conf"
_COMPAT_HEADER = b"# Written by nri-gpu at container start: CUDA forward compatibility"
MAIN_CONF = "/etc/ld.so.conf"
MAIN_CONF_TEXT = b"include /etc/ld.so.conf.d/*.conf\n"  # what the toolkit writes where there is none
CACHE = "/etc/ld.so.cache"
_CACHE_LIMIT = MAX_CACHE_SIZE  # no real image's cache comes near (they are well under 1 MB)
_BINARY_LIMIT = 64 << 20  # a static ldconfig is about 1 MB
_MFD_EXEC = 0x0010  # <linux/memfd.h>, Linux 6.3: executable even under vm.memfd_noexec=1
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_TAIL = 4096


def open_trusted(path: str) -> int:
    """The host's ldconfig, checked (a root-owned regular file no one else may
    write, executable, and static), as an fd of a sealed copy the ldconfig
    process may execute but not read. Opened on the host, before entering the
    container. Raises ``WorkError``.

    Why a copy: ``execve`` makes a process dumpable again when its uid may read
    the binary, and ``nobody`` may read the host's ldconfig; a dumpable process
    can be ptraced by any other process of its uid that can name it (a host
    daemon running as ``nobody``, a pod with the host's pid namespace), which
    could then hand the worker a cache of its making. A copy in a sealed memfd
    that ``nobody`` may only execute keeps the process undumpable through the
    exec, and what runs is exactly what was checked: the host file could change
    after the check, the copy cannot.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkError(f"{path}: {os.strerror(exc.errno or 0)}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o111:
            raise WorkError(f"{path}: not an executable file")
        if info.st_uid != 0 or info.st_mode & 0o022:
            raise WorkError(f"{path}: must be owned by root and writable by root only")
        if info.st_size > _BINARY_LIMIT:
            raise WorkError(f"{path}: {info.st_size} bytes, over the limit of {_BINARY_LIMIT} bytes for ldconfig")
        copy = _sealed_copy(fd, info.st_size, path)
    finally:
        os.close(fd)
    try:
        try:
            interp = elf.interpreter(os.pread(copy, elf.HEAD_SIZE, 0))
        except ValueError as exc:
            raise WorkError(f"{path}: {exc}") from exc
        if interp is not None:
            raise WorkError(
                f"{path} is dynamically linked (interpreter {interp}): inside the container it would be loaded "
                "by the image's own loader; configure a statically linked ldconfig"
            )
    except BaseException:
        os.close(copy)
        raise
    return copy


def _sealed_copy(fd: int, size: int, path: str) -> int:
    """A read-only fd of a memfd holding the ``size`` bytes of ``fd``: sealed against
    any change, mode 0511 (root may read it; others, ``nobody`` among them, may
    only execute it)."""
    flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
    try:
        try:
            memfd = os.memfd_create("nri-gpu-ldconfig", flags | _MFD_EXEC)
        except OSError:  # a kernel before 6.3 knows no MFD_EXEC (and execs any memfd)
            memfd = os.memfd_create("nri-gpu-ldconfig", flags)
    except OSError as exc:  # vm.memfd_noexec=2: no memfd may be executed
        raise WorkError(f"{path}: copying it for the run: {exc.strerror or exc}") from exc
    try:
        done = 0
        while done < size:
            sent = os.sendfile(memfd, fd, done, size - done)
            if sent == 0:
                raise WorkError(f"{path}: shorter than its size ({done} of {size} bytes)")
            done += sent
        os.fchmod(memfd, 0o511)
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, _SEALS)
        # exec refuses a file open for writing (ETXTBSY): keep a read-only fd only.
        return os.open(f"/proc/self/fd/{memfd}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkError(f"{path}: copying it for the run: {exc.strerror or exc}") from exc
    finally:
        os.close(memfd)


def conf_text(folders: tuple[str, ...]) -> bytes:
    lines = ["# Written by nri-gpu at container start: the NVIDIA driver libraries injected here.", *folders]
    return ("\n".join(lines) + "\n").encode()


def write_conf(root: RootDir, folders: tuple[str, ...]) -> bool:
    """Make ``/etc/ld.so.conf`` include ``ld.so.conf.d`` (only if it is missing) and
    write ``00-nri-gpu.conf``; True when anything was written."""
    changed = False
    try:
        os.close(root.open(MAIN_CONF, os.O_PATH))  # exists, as the container resolves it: leave it
    except FileNotFoundError:
        parent, name = split(MAIN_CONF)
        etc = root.makedirs(parent)
        try:
            write_atomically(etc, name, MAIN_CONF_TEXT, 0o644, what=MAIN_CONF)
        finally:
            os.close(etc)
        changed = True
    except OSError as exc:
        raise WorkError(describe(exc, MAIN_CONF)) from exc
    return write_file(root, CONF, conf_text(folders)) or changed


def write_compat_conf(root: RootDir, folder: str | None) -> bool:
    """Write ``00-compat-nri-gpu.conf`` naming ``folder`` (the CUDA compat folder)
    or, with None, remove one we wrote before (a file of that name whose first
    line is not ours is the image's: left alone); True when anything changed."""
    parent, name = split(COMPAT_CONF)
    if folder is None:
        found = root.find_dir(parent, resolve=WRITE)
        if found is None:
            return False
        try:
            current = current_bytes(found, name)
            if current is None or not current.startswith(_COMPAT_HEADER):
                return False
            try:
                os.unlink(name, dir_fd=found)
            except OSError as exc:
                raise WorkError(describe(exc, COMPAT_CONF)) from exc
            return True
        finally:
            os.close(found)
    want = _COMPAT_HEADER + b" (the image's cuda-compat libraries before the driver's).\n" + folder.encode() + b"\n"
    return write_file(root, COMPAT_CONF, want)


def cache_lists(root: RootDir, entries: tuple[LdCacheEntry, ...], deadline: float | None = None) -> bool:
    """Whether the container's cache already lists every path of ``entries`` (the
    plan's, which are what ldconfig lists for our libraries)."""
    paths = {entry.path for entry in entries}
    if not paths:
        return False
    try:
        data = root.read_small(CACHE, _CACHE_LIMIT)
        if data is None:
            return False
        return paths <= {entry.path for entry in parse_ld_so_cache(data, deadline=deadline)}
    except (WorkError, DiscoveryError):
        return False  # unreadable, too big or garbled: rebuild it


def merge(root: RootDir, entries: tuple[LdCacheEntry, ...], deadline: float | None = None) -> bool:
    """Insert ``entries`` into the container's ``/etc/ld.so.cache``; False when
    the cache already was exactly that (a second run). Raises ``WorkError``, also
    for an image cache over a limit (size, entries, ``deadline``): no real image
    has one, and a start that pretended otherwise would hold NRI's lock for it.

    The image's cache is read on the root file system only (one reached through
    a volume counts as absent) through the ``nodev`` copy of the root."""
    try:
        current = root.read_small(CACHE, _CACHE_LIMIT)
    except OverLimit as exc:
        raise WorkError(f"{exc} for an image's ld.so.cache") from exc
    except WorkError:
        current = None  # not a regular file: the loader cannot use it either
    image = LdCache(())
    try:
        if current is not None:
            try:
                image = read_ld_so_cache(current, deadline=deadline)
            except LdCacheLimit:
                raise
            except DiscoveryError:
                pass  # garbled: glibc ignores it, and so do we
        data = encode(merge_entries(image, entries, deadline=deadline), deadline=deadline)
    except LdCacheLimit as exc:
        raise WorkError(f"{CACHE}: {exc}") from exc
    if data == current:
        return False
    _install(root, data)
    return True


def run(root: RootDir, trusted: Trusted, deadline: float) -> float:
    """Rebuild the container's cache with the trusted ldconfig and install it as
    ``/etc/ld.so.cache``; the milliseconds the ldconfig process took, fork to
    reap. Called inside the container's mount namespace. Raises ``WorkError``."""
    cache = _output_tmpfs()
    try:
        out_read, out_write = os.pipe()
        try:
            began = time.perf_counter()
            pid = _fork(trusted, out_write, cache)
            os.close(out_write)
            out_write = -1
            tail, timed_out = _collect(out_read, deadline)
            if timed_out:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            took = (time.perf_counter() - began) * 1000
        finally:
            os.close(out_read)
            if out_write >= 0:
                os.close(out_write)
        code = os.waitstatus_to_exitcode(status)
        if timed_out:
            raise WorkError(f"{trusted.path} did not finish before the deadline and was killed")
        if code != 0:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
            text = tail.decode("utf-8", "replace").strip()[-1000:]
            raise WorkError(f"{trusted.path} {how}" + (f": {text}" if text else ""))
        data = _read_cache(cache, trusted.path)
    finally:
        os.close(cache)
    _install(root, data)
    return took


def _fork(trusted: Trusted, output: int, cache: int) -> int:
    """The ldconfig process, pid 1 of a fresh pid namespace (not the container's:
    nothing of the pod can see it); its pid as the worker sees it.

    A plain ``os.fork`` of the single-threaded worker. Its at-fork handlers are
    the plugin's, which start no thread (the kernel would refuse one in a process
    that has set another pid namespace for its children): the plugin loads no
    library that does so (gRPC's would, and lives in the test bed's own process).
    """
    worker = os.pidfd_open(os.getpid())  # how the child tells that this process died
    try:
        syscalls.unshare(syscalls.CLONE_NEWPID)  # for the child made next
        try:
            pid = os.fork()
            if pid == 0:
                confine.exec_confined(trusted, output, cache, worker)  # never returns
        finally:
            syscalls.setns(trusted.own_pid_namespace, syscalls.CLONE_NEWPID)  # new threads allowed again
    finally:
        os.close(worker)
    return pid


def _read_cache(cache: int, path: str) -> bytes:
    try:
        fd = os.open(
            confine.CACHE_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=cache
        )
    except OSError as exc:
        raise WorkError(f"{path} wrote no cache ({exc.strerror})") from exc
    try:
        return read_regular(fd, "the new ld.so.cache", _CACHE_LIMIT)
    finally:
        os.close(fd)


def _install(root: RootDir, cache: bytes) -> None:
    parent, name = split(CACHE)
    etc = root.makedirs(parent)
    try:
        write_atomically(etc, name, cache, 0o644, what=CACHE)
    finally:
        os.close(etc)


def _output_tmpfs() -> int:
    """A detached tmpfs only ``nobody`` (ldconfig) can write: where its cache goes."""
    owner = str(confine.UID)
    options = (("uid", owner), ("gid", owner), ("mode", "0700"), ("size", "64m"), ("nr_inodes", "16"))
    return syscalls.new_tmpfs(options)


def _collect(fd: int, deadline: float) -> tuple[bytes, bool]:
    """The tail of ldconfig's output until it closes it; (tail, timed out)."""
    tail = bytearray()

    def keep(_: int, chunk: bytes) -> bool:
        tail.extend(chunk)
        del tail[:-_TAIL]
        return True

    timed_out = drain([fd], deadline, keep) is Drained.TIMED_OUT
    return bytes(tail), timed_out
