"""podman from Debian for the end-to-end tests, private to one workdir: 4.3.1
(bookworm), 5.4.2 (trixie) and 5.8.6 (sid).

Nothing is installed: the packages are unpacked into the cache (hack/testbed/debs.py)
and podman runs from there with its own configuration, all under ``workdir``:

* ``containers.conf`` (``$CONTAINERS_CONF``): conmon and runc by path (bookworm's
  runc 1.1.5, as for containerd; crun fails on these machines' hybrid cgroup
  layout), ``cgroupfs`` (no systemd), file events and file locks (the default shm
  lock is the machine-wide ``/dev/shm/libpod_lock``), a private tmp dir, and
  ``conmon_env_vars`` that hand conmon the library path and the config: conmon runs
  ``podman container cleanup`` with its own environment when a container exits, and
  without them that command fails and ``podman run`` waits 20 s for the exit code.
* ``storage.conf`` (``$CONTAINERS_STORAGE_CONF``): overlay under ``workdir``.
* ``registries.conf`` (empty) and ``policy.json`` (accept anything: the images are
  local OCI archives, ``podman pull oci-archive:…``).

bookworm's podman links libsubid and libgpgme, which a bookworm machine without
podman lacks: they are unpacked too and found through ``LD_LIBRARY_PATH``.
trixie's and sid's are built for glibc 2.38+ and newer libsubid/libgpgme: they
run relinked (hack/testbed/relink.py) to their suite's unpacked loader and
libraries (the machine's own serve the rest), with their suite's netavark (podman
5 refuses to start without one, although ``--network none`` never calls it, also
relinked) as ``helper_binaries_dir``. conmon, runc and the seccomp profile are
bookworm's for every version.

What podman still does outside ``workdir``: it reads CDI specs from ``/etc/cdi``
and ``/var/run/cdi`` (4.3 knows no other folder; the tests write a spec of their
own there, for every version, and remove it), and an image pull writes its blob-info cache to
``/var/lib/containers/cache`` (c/common 0.51 moved it under the graph root). Containers
run with ``--network none`` (no CNI, netavark or slirp needed) and explicit
``--ulimit``s: podman's defaults (nofile 1048576) exceed these machines' hard limits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nri_gpu.plugin.cli.cdi_conflicts import conflicts

from . import debs, relink, runtimes
from .cache import cache_dir
from .images import Image

__all__ = ["VERSION", "VERSIONS", "Binaries", "Podman", "fetch"]


@dataclass(frozen=True)
class _Release:
    suite: str
    podman: str  # Debian version glob; see runtimes.py for why globs
    libraries: dict[str, str]  # package -> version glob, from the same suite
    relinked: bool = False  # built for a newer glibc than the machine's: relink.py
    netavark: str | None = None  # podman 5 will not start without a network helper


_RELEASES = {
    "4.3.1": _Release(
        "bookworm",
        "4.3.1+ds1-*",
        {
            "libsubid4": "1:4.13+dfsg1-*",
            "libgpgme11": "1.18.0-*",
            "libassuan0": "2.5.5-*",
        },
    ),
    "5.4.2": _Release(
        "trixie",
        "5.4.2+ds1-*",
        {
            "libc6": "2.41-*",
            "libsubid5": "1:4.17.4-*",
            "libgpgme11t64": "1.24.2-*",
            "libassuan9": "3.0.2-*",
        },
        relinked=True,
        netavark="1.14.0-*",
    ),
    "5.8.6": _Release(
        "sid",
        "5.8.6+ds1-*",
        {
            "libc6": "2.43-*",
            "libsubid6": "1:4.20.3-*",
            "libgpgme45": "2.2.0-*",
            "libassuan9": "3.0.2-*",
            "libgpg-error0": "1.61-*",
        },
        relinked=True,
        netavark="1.14.0-*",
    ),
}
VERSIONS: tuple[str, ...] = tuple(_RELEASES)
VERSION = VERSIONS[0]
# What every version runs with, from bookworm: see the module doc.
_COMMON = {
    "conmon": ("bookworm", "2.1.6+ds1-*"),
    "golang-github-containers-common": ("bookworm", "0.50.1+ds1-*"),  # seccomp.json
}
_LIBDIR = "usr/lib/x86_64-linux-gnu"
_LOADER = "ld-linux-x86-64.so.2"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Binaries:
    """Where the unpacked podman and what it needs live."""

    podman: Path
    conmon: Path
    runc: Path
    seccomp: Path
    library_path: str  # for LD_LIBRARY_PATH
    helpers: Path | None = None  # containers.conf helper_binaries_dir (podman 5: netavark)


def fetch(version: str = VERSION) -> Binaries:
    """Unpack podman ``version`` (one of VERSIONS), conmon, libraries and runc
    (downloaded on first use); relink a newer suite's binaries to run here.

    Raises debs.DebUnavailable offline with nothing cached, debs.DebError otherwise
    (relink.RelinkError, one of them, when a relinked binary does not start).
    """
    release = _RELEASES[version]
    common = {pkg: debs.extract(pkg, suite, glob) for pkg, (suite, glob) in _COMMON.items()}
    podman = debs.extract("podman", release.suite, release.podman) / "usr/bin/podman"
    libraries = [debs.extract(pkg, release.suite, glob) / _LIBDIR for pkg, glob in release.libraries.items()]
    helpers = None
    for path in (podman, *libraries):
        if not path.exists():
            raise debs.DebError(f"unpacked podman {version} packages lack {path}")
    if release.relinked:
        loader = next((d / _LOADER for d in libraries if (d / _LOADER).is_file()), None)
        if loader is None:
            raise debs.DebError(f"podman {version}: no {_LOADER} among {release.suite}'s unpacked libraries")
        podman = relink.relink(podman, loader, libraries)
        if release.netavark is not None:
            netavark = debs.extract("netavark", release.suite, release.netavark) / "usr/lib/podman/netavark"
            helpers = relink.relink(netavark, loader, libraries).parent
    found = Binaries(
        podman=podman,
        conmon=common["conmon"] / "usr/bin/conmon",
        runc=runtimes.fetch_runc(),
        seccomp=common["golang-github-containers-common"] / "usr/share/containers/seccomp.json",
        # For bookworm's podman; a relinked one finds its own through its RPATH first.
        library_path="" if release.relinked else ":".join(str(d) for d in libraries),
        helpers=helpers,
    )
    for path in (found.conmon, found.seccomp):
        if not path.is_file():
            raise debs.DebError(f"unpacked podman packages lack {path}")
    return found


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def ulimits() -> list[str]:
    """``--ulimit`` flags within this process's hard limits (podman's defaults are not)."""
    flags = []
    for name, which, want in (("nofile", resource.RLIMIT_NOFILE, 4096), ("nproc", resource.RLIMIT_NPROC, 4096)):
        hard = resource.getrlimit(which)[1]
        value = want if hard == resource.RLIM_INFINITY else min(want, hard)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


class Podman:
    """podman with a private root, run root, tmp dir and configuration under ``workdir``."""

    def __init__(self, workdir: Path, binaries: Binaries | None = None, *, version: str = VERSION) -> None:
        self.workdir = workdir
        self.bin = binaries or fetch(version)
        self.version = version
        for sub in ("root", "run", "tmp", "net"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        self.conf = workdir / "containers.conf"
        self.storage_conf = workdir / "storage.conf"
        self.registries_conf = workdir / "registries.conf"
        self.policy = workdir / "policy.json"
        self._write_config()

    def _write_config(self) -> None:
        w = self.workdir
        conmon_env = [
            f"PATH={_PATH}",
            f"LD_LIBRARY_PATH={self.bin.library_path}",
            f"CONTAINERS_CONF={self.conf}",
            f"CONTAINERS_STORAGE_CONF={self.storage_conf}",
            f"CONTAINERS_REGISTRIES_CONF={self.registries_conf}",
        ]
        helpers = f"\nhelper_binaries_dir = {_toml_list([str(self.bin.helpers)])}" if self.bin.helpers else ""
        self.conf.write_text(f"""\
[containers]
seccomp_profile = {json.dumps(str(self.bin.seccomp))}

[engine]
cgroup_manager = "cgroupfs"{helpers}
conmon_path = {_toml_list([str(self.bin.conmon)])}
conmon_env_vars = {_toml_list(conmon_env)}
events_logger = "file"
image_copy_tmp_dir = {json.dumps(str(w / "tmp"))}
lock_type = "file"
runtime = "runc"
tmp_dir = {json.dumps(str(w / "tmp"))}

[engine.runtimes]
runc = {_toml_list([str(self.bin.runc)])}

[network]
network_config_dir = {json.dumps(str(w / "net"))}
""")
        self.storage_conf.write_text(f"""\
[storage]
driver = "overlay"
graphroot = {json.dumps(str(w / "root"))}
runroot = {json.dumps(str(w / "run"))}
""")
        self.registries_conf.write_text("")
        self.policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))

    def env(self) -> dict[str, str]:
        return {
            "PATH": _PATH,
            "HOME": str(self.workdir),
            "LD_LIBRARY_PATH": self.bin.library_path,
            "CONTAINERS_CONF": str(self.conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
            "CONTAINERS_REGISTRIES_CONF": str(self.registries_conf),
        }

    def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS``; raise RuntimeError with its output if it fails and ``check``."""
        done = subprocess.run(
            [str(self.bin.podman), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        return done

    def load(self, image: Image) -> None:
        """Store ``image`` (an OCI layout tar) under its name."""
        pulled = self("pull", "--quiet", "--signature-policy", str(self.policy), f"oci-archive:{image.tar}")
        self("tag", pulled.stdout.split()[-1], image.name)

    def run(
        self, image: str, *command: str, options: Sequence[str] = (), check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``podman run --rm`` of ``image`` with the test bed's flags and ``options``."""
        return self(
            "run", "--rm", "--network", "none", *ulimits(), *options, image, *command, check=check, timeout=timeout
        )

    def cleanup(self) -> None:
        """Remove every container (a test may leave one behind)."""
        self("rm", "--all", "--force", check=False)
        for mount in ("root/overlay", "run"):  # nothing stays mounted, but be sure
            path = self.workdir / mount
            if os.path.ismount(path):
                subprocess.run(["umount", "-l", str(path)], check=False)


# podman 4.3 reads CDI specs from /etc/cdi and /var/run/cdi only: a test's spec goes
# there, under a lock that serializes sessions, named so that a killed session's is
# recognised and removed (it would cancel ours: two specs of one kind in one folder).
CDI_DIR = Path("/var/run/cdi")
SPEC_PREFIX = "nri-gpu-test-"


class SpecFolderTaken(Exception):
    """Another spec of kind nvidia.com/gpu is in CDI_DIR: a second one would cancel both."""


@contextlib.contextmanager
def shared_spec_path(tag: str = "") -> Iterator[Path]:
    """A path in CDI_DIR for a spec of ours, held under the lock while the caller uses
    it; the file (and the folder, if made here) removed at the end. Raises
    SpecFolderTaken naming the other specs (found by ``nri_gpu.plugin.cli.cdi_conflicts``, bounded)."""
    with open(cache_dir() / ".podman-cdi.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = CDI_DIR / f"{SPEC_PREFIX}{tag}{os.getpid()}.json"
        foreign = [
            c.other
            for c in conflicts(str(path), spec_dirs=(str(CDI_DIR),))
            if c.same_folder and not Path(c.other).name.startswith(SPEC_PREFIX)
        ]
        if foreign:
            raise SpecFolderTaken(
                f"{', '.join(foreign)} already define nvidia.com/gpu in {CDI_DIR}: "
                "a second spec there would cancel both"
            )
        for stale in CDI_DIR.glob(f"{SPEC_PREFIX}*.json"):  # a killed session's: it would cancel ours
            stale.unlink(missing_ok=True)
        created = not CDI_DIR.exists()
        CDI_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)
            if created:
                with contextlib.suppress(OSError):  # someone else put a spec there meanwhile
                    CDI_DIR.rmdir()
