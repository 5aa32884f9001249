"""The ``EGLVisibleDGPUDevices`` application profile in the container (``engine.graphics``).

Written at start, as the ld.so.conf files are: through the detached copy of the
container's root (``RootDir``), the folder made or found on the container's own
root file system only (never through a link into a volume or a host mount), and
the file replaced atomically (``write_atomically``: a link planted at its name is
replaced, never followed). A file we already wrote with the same text is left as
it is, so a second start changes nothing. libnvidia-container put the same file
on a tmpfs it mounted over the folder; a file in the container's writable layer
needs no mount and goes away with the container.
"""

from __future__ import annotations

from nri_gpu.engine.graphics import APP_PROFILE_PATH
from nri_gpu.engine.start.rootdir import RootDir, write_file

__all__ = ["write"]


def write(root: RootDir, text: str) -> bool:
    """Write ``text`` at ``APP_PROFILE_PATH``; True when it was written (not already there)."""
    return write_file(root, APP_PROFILE_PATH, text.encode())
