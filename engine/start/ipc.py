"""The daemons' IPC endpoints at container start: the mount must be the host's root-only inode.

Why at start: the plan checked each endpoint at CreateContainer, but runc binds the
host path afterwards, following links. If root's entry went away in between (the
MPS daemon quit, a tmp cleaner), any local account could have put a link to ``/``
(or a folder of its own) there for runc to follow, then put things back. So, for
each endpoint the container got:

1. on the host side, before entering the container (``on_host``): the path is
   walked again as discovery walks it (``Root.root_only_stat``: no link, every
   folder and the entry root's alone), and its inode recorded;
2. in the container's root (``check``): the destination is opened ``O_PATH``
   (nothing is opened for I/O, not even a socket or a FIFO), links on the way
   resolved in the root as runc resolved them and the last one not followed, and
   its ``fstat`` must be that very inode, of that type.

Anything else fails the start, naming the endpoint.
"""

from __future__ import annotations

import os
import stat

from nri_gpu.engine.catalogue import IPC_TYPES
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.root import Root
from nri_gpu.engine.start.rootdir import RootDir, describe
from nri_gpu.engine.start.work import StartWork, WorkError

__all__ = ["Seen", "check", "on_host"]

Seen = tuple[tuple[str, os.stat_result], ...]  # (endpoint, the host inode's stat)


def on_host(work: StartWork) -> Seen:
    """Each endpoint of ``work`` as it is on the host now. Raises ``WorkError``
    naming the endpoint when it is gone or no longer root's alone."""
    driver = Root(work.ipc_root)
    seen = []
    for path in work.ipc:
        try:
            found = driver.root_only_stat(path, IPC_TYPES[path])
        except DiscoveryError as exc:
            raise WorkError(f"IPC endpoint {path}: {exc}; the container's mount of it may be anything") from exc
        if found is None:
            # runc bound something there; with no root entry left to compare it
            # with, it may have been a user's link followed.
            raise WorkError(f"IPC endpoint {path}: {driver.host_path(path)} is gone from the host")
        seen.append((path, found))
    return tuple(seen)


def check(root: RootDir, seen: Seen) -> None:
    """Each endpoint mounted in ``root`` is the inode ``on_host`` saw. Raises ``WorkError``."""
    for path, host in seen:
        try:
            fd = root.open(path, os.O_PATH | os.O_NOFOLLOW)
        except OSError as exc:
            raise WorkError(f"IPC endpoint {describe(exc, path)} in the container") from exc
        try:
            mounted = os.fstat(fd)
        finally:
            os.close(fd)
        if (mounted.st_dev, mounted.st_ino, stat.S_IFMT(mounted.st_mode)) != (
            host.st_dev,
            host.st_ino,
            stat.S_IFMT(host.st_mode),
        ):
            raise WorkError(
                f"IPC endpoint {path}: the container's mount is not the host's root-owned entry "
                "(the path was replaced after it was checked, and runc bound what was there); refused"
            )
