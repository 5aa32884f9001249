"""The containerd and runc binaries the end-to-end tests run, taken from Debian.

Why these builds (see the measured facts in the project's reference notes):
* containerd 1.7.24 from trixie and 2.1.9 from sid: both are dynamically linked Go
  needing only glibc >= 2.34, so they run on a bookworm host. They span NRI 0.6 - 0.8.
* runc 1.1.5 from bookworm: trixie's runc needs glibc 2.38, which bookworm lacks.

containerd finds ``containerd-shim-runc-v2`` (and the shim finds ``runc`` unless the
config names it) on PATH, so each containerd version gets a ``bin/`` dir of symlinks
that the daemon's PATH starts with.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import debs
from .cache import cache_dir, locked

__all__ = ["VERSIONS", "Runtime", "fetch", "fetch_runc"]

# containerd version -> (suite, Debian version glob). Globs, so a rebuild (-6 -> -7,
# +deb13u2) is picked up while the upstream version the tests were written for stays.
_CONTAINERD = {
    "1.7.24": ("trixie", "1.7.24~ds1-*"),
    "2.1.9": ("sid", "2.1.9+ds1-*"),
}
_RUNC = ("runc", "bookworm", "1.1.5+ds1-*")
VERSIONS: tuple[str, ...] = tuple(_CONTAINERD)


@dataclass(frozen=True)
class Runtime:
    """Paths of one containerd version's binaries; ``bin_dir`` goes first on PATH."""

    version: str
    containerd: Path
    shim: Path
    ctr: Path
    runc: Path
    bin_dir: Path


def fetch_runc() -> Path:
    """Return the path of the runc binary (downloads it on first use)."""
    package, suite, version = _RUNC
    runc = debs.extract(package, suite, version) / "usr/sbin/runc"
    if not runc.is_file():
        raise debs.DebError(f"{package} from {suite} has no usr/sbin/runc")
    return runc


def fetch(version: str) -> Runtime:
    """Fetch containerd ``version`` ("1.7.24" or "2.1.9") and runc; return their paths.

    Raises KeyError for an unknown version, debs.DebError (or DebUnavailable, offline)
    when a package cannot be had.
    """
    if version not in _CONTAINERD:
        raise KeyError(f"unknown containerd version {version!r}; known: {', '.join(VERSIONS)}")
    suite, deb_version = _CONTAINERD[version]
    root = debs.extract("containerd", suite, deb_version)
    tools = {name: root / "usr/bin" / name for name in ("containerd", "containerd-shim-runc-v2", "ctr")}
    for path in tools.values():
        if not path.is_file():
            raise debs.DebError(f"containerd {version} from {suite} lacks {path.name} ({path})")
    runc = fetch_runc()
    bin_dir = _link_dir(f"containerd-{version}", {**tools, "runc": runc})
    return Runtime(
        version=version,
        containerd=bin_dir / "containerd",
        shim=bin_dir / "containerd-shim-runc-v2",
        ctr=bin_dir / "ctr",
        runc=bin_dir / "runc",
        bin_dir=bin_dir,
    )


def _link_dir(name: str, targets: dict[str, Path]) -> Path:
    """Make ``<cache>/bin/<name>/`` hold exactly these symlinks; rebuilt atomically when
    a target changed (a new Debian revision), otherwise left alone."""
    bin_root = cache_dir() / "bin"
    final = bin_root / name
    if all((final / link).is_symlink() and os.readlink(final / link) == str(t) for link, t in targets.items()):
        return final
    bin_root.mkdir(parents=True, exist_ok=True)
    with locked(bin_root / f".{name}.lock"):
        tmp = Path(tempfile.mkdtemp(dir=bin_root, prefix=f".{name}-"))
        os.chmod(tmp, 0o755)
        for link, target in targets.items():
            (tmp / link).symlink_to(target)
        old = bin_root / f".{name}.old"
        if final.exists():
            os.replace(final, old)  # rename(2) cannot replace a non-empty dir
        os.replace(tmp, final)
        if old.exists():
            for entry in old.iterdir():
                entry.unlink()
            old.rmdir()
    return final
