"""The driver-library symlinks (``libcuda.so.1 -> libcuda.so.550.163.01``) in the container.

The toolkit's ``create-symlinks`` hook was CVE-2024-0134: links were created
by path, so an image symlink on the way put them outside the container. Here
the link's directory is resolved inside the root (``RootDir``), the link is
made with ``symlinkat`` relative to that directory fd (where the name is
free), or under a temporary name that ``renameat`` puts in place atomically
(replacing a file or a stale link, never following one). A link that already points where it should is left as it
is, so a second run changes nothing.
"""

from __future__ import annotations

import errno
import os
import stat

from nri_gpu.engine.model import Symlink
from nri_gpu.engine.start.rootdir import RootDir, describe, split
from nri_gpu.engine.start.work import WorkError

__all__ = ["create"]


def create(root: RootDir, links: tuple[Symlink, ...]) -> int:
    """Create every link; returns how many were created or replaced. Raises ``WorkError``."""
    parents: dict[str, int] = {}
    made = 0
    try:
        for link in links:
            parent, name = split(link.path)
            if parent not in parents:
                parents[parent] = root.makedirs(parent)
            try:
                made += _place(parents[parent], name, link)
            except OSError as exc:
                raise WorkError(describe(exc, link.path)) from exc
    finally:
        for fd in parents.values():
            os.close(fd)
    return made


def _place(dirfd: int, name: str, link: Symlink) -> bool:
    try:
        if os.readlink(name, dir_fd=dirfd) == link.target:
            return False
    except FileNotFoundError:
        # Nothing there: symlinkat creates it atomically (and never follows a
        # name that appeared meanwhile: EEXIST, then replaced below). Half the
        # cost of temporary + rename on overlayfs, where each create is dear.
        try:
            os.symlink(link.target, name, dir_fd=dirfd)
            return True
        except FileExistsError:
            pass
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: there, but not a symlink
            raise
        if stat.S_ISDIR(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
            raise WorkError(f"{link.path}: a directory is in the way of the link to {link.target}") from exc
    tmp = f".{name}.nri-gpu-tmp"
    try:
        os.unlink(tmp, dir_fd=dirfd)
    except FileNotFoundError:
        pass
    os.symlink(link.target, tmp, dir_fd=dirfd)
    os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    return True
