"""The plugin image's Debian packages: the newest of a release, its updates and its security fixes, verified.

What the image ships runs as root on every node, so its packages are taken the way a
Debian system takes its updates, not the way the test bed takes its tools
(hack/testbed/debs.py reuses what it unpacked once, from any suite, for speed):

* One private apt configuration per release under ``<cache>/apt/image-<release>/`` with
  three sources: ``<release>`` and ``<release>-updates`` from the host's Debian mirror,
  ``<release>-security`` from its security mirror (the host's own entry for that suite,
  else the mirror's URI with ``-security``, as deb.debian.org and snapshots lay it out).
* Every Release file must be signed by Debian's archive keyring (the host's ``Signed-By``,
  default ``/usr/share/keyrings/debian-archive-keyring.gpg``; never ``trusted=yes``;
  any warning or error of ``apt-get update`` fails the build) and current: a
  ``Valid-Until`` in the past (an old, validly signed security Release replayed to
  hold fixes back) is refused. That is checked here on the InRelease files apt
  verified, because apt 2.6 did not refuse one in our tests even with
  ``Acquire::Check-Valid-Until`` on (which hosts often turn off for snapshot mirrors).
* The lists are refreshed when older than ``LISTS_MAX_AGE_S``; a package's version is the
  highest of the three suites that matches the caller's pattern (the upstream version,
  ``3.11.2-*``: security fixes come in, a new upstream release does not).
* ``apt-get download`` checks the .deb against the signed index; its SHA256 is checked
  again here against ``apt-cache show`` and recorded, and the unpacked tree is kept under
  a name that holds it, so a tree is only ever reused for the same bytes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path

from . import apt_sources
from .cache import cache_dir, locked
from .debs import ARCH, DebError, _apt_env, _safe, _tail, private_apt_conf

__all__ = ["Deb", "fetch", "security_mirror"]

LISTS_MAX_AGE_S = 6 * 3600
# apt-get update exits 0 on some failures; these lines tell the truth.
_UPDATE_FAILED = re.compile(r"^(E:|W:|Err:)", re.M)


@dataclass(frozen=True)
class Deb:
    """One package that went into the image."""

    package: str
    version: str
    suite: str  # the suite it came from: bookworm, bookworm-updates or bookworm-security
    sha256: str  # of the .deb, as the signed index states it
    tree: Path  # where it is unpacked


def security_mirror(uri: str, release: str) -> str:
    """The security archive beside ``uri``: the host's own entry for ``<release>-security``
    when it has one, else ``uri`` with ``-security`` appended to its last component."""
    for entry in apt_sources._system_source_entries():
        if "deb" in entry.types and f"{release}-security" in entry.suites and "main" in entry.components:
            return entry.uri.rstrip("/")
    return uri.rstrip("/") + "-security"


class _Release:
    def __init__(self, release: str) -> None:
        self.release = release
        self.dir = cache_dir() / "apt" / f"image-{release}"
        self.lists = self.dir / "lists"
        self.conf = self.dir / "apt.conf"

    def configure(self) -> None:
        uri, keyring = apt_sources.debian_mirror()
        if not keyring.is_file():
            raise DebError(f"no Debian archive keyring at {keyring}: install debian-archive-keyring")
        security = security_mirror(uri, self.release)
        for sub in ("lists/partial", "cache/archives/partial", "empty.d"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "status").touch()
        signed = f"[arch={ARCH} signed-by={keyring}]"
        (self.dir / "sources.list").write_text(
            f"deb {signed} {uri} {self.release} main\n"
            f"deb {signed} {uri} {self.release}-updates main\n"
            f"deb {signed} {security} {self.release}-security main\n"
        )
        self.conf.write_text(
            private_apt_conf(
                self.dir,
                self.lists,
                (ARCH,),
                """\
Acquire::Check-Valid-Until "true";
Acquire::AllowInsecureRepositories "false";
Acquire::AllowDowngradeToInsecureRepositories "false";
APT::Get::AllowUnauthenticated "false";""",
            )
        )

    def apt(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        tool = "apt-cache" if args[0] in ("madison", "show") else "apt-get"
        return subprocess.run(
            [tool, "-c", str(self.conf), "-q", *args], cwd=cwd, capture_output=True, text=True, env=_apt_env()
        )

    def refresh(self) -> None:
        stamp = self.lists / ".updated"
        if stamp.exists() and time.time() - stamp.stat().st_mtime < LISTS_MAX_AGE_S and not self.stale():
            return
        proc = self.apt("update")
        out = proc.stdout + proc.stderr
        if proc.returncode != 0 or _UPDATE_FAILED.search(out):
            raise DebError(
                f"apt-get update of {self.release}, -updates and -security refused "
                f"(signature, expiry or network):\n{_tail(out)}"
            )
        problem = self.stale()
        if problem:
            raise DebError(f"{problem}: refused (a replayed Release would hold security fixes back)")
        stamp.touch()

    def stale(self) -> str:
        """Why the verified lists cannot be used: a suite's InRelease missing or past its
        Valid-Until; "" when they can."""
        releases = sorted(self.lists.glob("*_InRelease"))
        if len(releases) != 3:
            return f"{len(releases)} of the 3 suites' InRelease files in {self.lists}"
        for path in releases:
            found = re.search(r"^Valid-Until: (.+)$", path.read_text(errors="replace"), re.M)
            if found and parsedate_to_datetime(found.group(1).replace("UTC", "+0000")).timestamp() < time.time():
                return f"{path.name} expired on {found.group(1)}"
        return ""

    def newest(self, package: str, pattern: str) -> tuple[str, str]:
        """(version, suite) of the highest version matching ``pattern`` in the three suites."""
        proc = self.apt("madison", package)
        if proc.returncode != 0:
            raise DebError(f"apt-cache madison {package} failed:\n{_tail(proc.stderr)}")
        for line in proc.stdout.splitlines():  # highest version first
            cols = [c.strip() for c in line.split("|")]
            if len(cols) == 3 and cols[0] == package and fnmatch.fnmatchcase(cols[1], pattern):
                return cols[1], cols[2].split()[1].split("/")[0]
        raise DebError(f"no {package} {pattern} in {self.release}, -updates or -security")

    def sha256(self, package: str, version: str) -> str:
        proc = self.apt("show", f"{package}={version}")
        found = re.search(r"^SHA256: ([0-9a-f]{64})$", proc.stdout, re.M)
        if proc.returncode != 0 or not found:
            raise DebError(f"apt-cache show {package}={version}: no SHA256\n{_tail(proc.stdout + proc.stderr)}")
        return found.group(1)

    def fetch(self, package: str, pattern: str) -> Deb:
        version, suite = self.newest(package, pattern)
        digest = self.sha256(package, version)
        tree = cache_dir() / "extract-image" / f"{_safe(package)}_{_safe(version)}_{digest[:16]}"
        if not tree.is_dir():
            with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".image-deb-") as tmp:
                proc = self.apt("download", f"{package}={version}", cwd=Path(tmp))
                debs = list(Path(tmp).glob("*.deb"))
                if proc.returncode != 0 or len(debs) != 1:
                    raise DebError(f"apt-get download {package}={version} failed:\n{_tail(proc.stdout + proc.stderr)}")
                got = hashlib.sha256(debs[0].read_bytes()).hexdigest()
                if got != digest:
                    raise DebError(f"{debs[0].name}: SHA256 {got}, the signed index says {digest}")
                unpacked = Path(tmp) / "tree"
                subprocess.run(["dpkg", "-x", str(debs[0]), str(unpacked)], check=True, capture_output=True)
                tree.parent.mkdir(parents=True, exist_ok=True)
                os.rename(unpacked, tree)
        return Deb(package, version, suite, digest, tree)


def fetch(packages: Sequence[tuple[str, str, str]]) -> list[Deb]:
    """Unpack each ``(package, release, version pattern)``; see the module doc."""
    result = []
    for release in dict.fromkeys(r for _, r, _ in packages):
        source = _Release(release)
        source.dir.mkdir(parents=True, exist_ok=True)
        with locked(source.dir / "lock"):
            source.configure()
            source.refresh()
            result += [source.fetch(name, pattern) for name, r, pattern in packages if r == release]
    order = {name: i for i, (name, _, _) in enumerate(packages)}
    return sorted(result, key=lambda deb: order[deb.package])
