"""Fetch and unpack Debian packages from any suite without installing anything.

The end-to-end tests need binaries from newer Debian suites than the host's (containerd
1.7 from trixie, 2.1 from sid) and source-only packages (cri-api, NRI protos). We never
install them: ``apt-get download`` fetches the .deb, ``dpkg -x`` unpacks it into the cache.

Theory of operation
-------------------
* Each suite gets a PRIVATE apt configuration under ``<cache>/apt/<suite>/``: its own
  one-line sources list, lists dir, package cache and an empty dpkg status. A caller
  that needs other components (the NVIDIA driver is in ``non-free``) or a foreign
  architecture (``libcuda1:i386``) gets a separate one, ``<cache>/apt/<suite>_<components>_<archs>/``,
  so the plain ``main``/amd64 lists other tests rely on are never rewritten. The system's
  sources, lists and caches are never read or written. The system's ``apt.conf.d`` IS
  still read, on purpose: that is where a CI machine puts its proxy settings. Hooks that
  it registers for ``apt-get update`` are cleared, since they refresh system caches.
* The mirror is the one the system already uses (its ``debian`` entry), read at run time;
  ``$NRI_GPU_DEBIAN_MIRROR`` overrides it. No host name is written into the project.
* ``apt-get update`` runs only when a suite's lists are missing or older than a day, or
  when a pinned version is not in them. If it fails for lack of network and old lists
  exist, the old lists are used.
* A download goes into an empty temporary dir, because ``apt-get download --print-uris``
  (and the download's own skip logic) say nothing when the .deb already sits in the
  current directory. The .deb is then kept under ``<cache>/debs/``.
* ``dpkg -x`` unpacks into a temporary dir that is renamed to
  ``<cache>/extract/<package>_<version>/``, so a reader never sees half a tree and a
  second call returns at once, with no apt run and no network.

Signatures: apt checks the suite's InRelease against the keyring named by the system's
``Signed-By`` (default ``/usr/share/keyrings/debian-archive-keyring.gpg``). Bookworm's
debian-archive-keyring (2023.3+deb12u2) already holds the 13/trixie keys, which sign both
trixie and sid today (checked with gpgv). When a suite is signed only by keys the system
lacks (sid after the next key rotation), the keyring is bootstrapped along a chain of
trust: ``debian-archive-keyring`` is taken from a suite the system CAN verify (trixie,
whose stable updates carry the next release's keys) and used for the failing suite. Only
if that fails too, and ``NRI_GPU_APT_TRUSTED=1`` is set, is the suite marked
``trusted=yes``: a documented last resort that disables signature checks for it.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from . import apt_sources
from .cache import cache_dir, locked

__all__ = ["DebError", "DebUnavailable", "available_versions", "debian_mirror", "extract"]

log = logging.getLogger(__name__)

ARCH = "amd64"
DEFAULT_COMPONENTS = ("main",)
LISTS_MAX_AGE_S = 24 * 3600
# Suites whose debian-archive-keyring may vouch for a suite the system keyring cannot
# verify; trixie is stable and signed by keys bookworm knows.
_KEYRING_CHAIN = ("trixie",)
# apt output that means "no network / mirror unreachable", as opposed to a real error.
_NETWORK_ERRORS = re.compile(
    r"Could not resolve|Temporary failure resolving|Failed to fetch|Unable to connect"
    r"|Connection (failed|timed out|refused)|Network is unreachable|Could not connect",
)
_SIGNATURE_ERRORS = re.compile(r"NO_PUBKEY|is not signed|couldn't be verified|EXPKEYSIG|Signed-By")


def private_apt_conf(root: Path, lists: Path, architectures: Sequence[str], extra: str = "") -> str:
    """An apt.conf that keeps apt's state, cache and sources under ``root`` (lists in
    ``lists``) and ignores the system's sources and preferences; ``extra`` lines are
    appended. Given with -c, so it is read AFTER the system's apt.conf.d (its proxy
    settings apply) and wins over it."""
    return f"""\
#clear APT::Update::Pre-Invoke;
#clear APT::Update::Post-Invoke;
#clear APT::Update::Post-Invoke-Success;
Dir::Etc::SourceList "{root}/sources.list";
Dir::Etc::SourceParts "{root}/empty.d";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "{root}/empty.d";
Dir::State "{root}";
Dir::State::Lists "{lists}";
Dir::State::status "{root}/status";
Dir::Cache "{root}/cache";
Dir::Cache::pkgcache "{root}/cache/pkgcache.bin";
Dir::Cache::srcpkgcache "";
APT::Architecture "{ARCH}";
APT::Architectures {{ {" ".join(f'"{a}";' for a in architectures)} }};
APT::Sandbox::User "root";
Acquire::Languages "none";
Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
{extra}
"""


class DebError(RuntimeError):
    """A package could not be fetched or unpacked; the message names package, suite
    and carries apt's stderr."""


class DebUnavailable(DebError):
    """The mirror cannot be reached (no network): callers may skip rather than fail."""


# (mirror, suite) -> the failure, so one process asks an unreachable mirror once.
_UNREACHABLE: dict[tuple[str, str], DebUnavailable] = {}


def debian_mirror() -> tuple[str, Path]:
    """(URI, keyring) of the host's Debian mirror; see apt_sources. Raises DebError."""
    try:
        return apt_sources.debian_mirror()
    except apt_sources.SourcesError as exc:
        raise DebError(str(exc)) from exc


# --------------------------------------------------------------------------- apt


class _Suite:
    """The private apt configuration of one suite (with its components and architectures)."""

    def __init__(
        self, suite: str, components: Sequence[str] = DEFAULT_COMPONENTS, architectures: Sequence[str] = (ARCH,)
    ) -> None:
        self.suite = suite
        self.components = tuple(components)
        self.architectures = tuple(architectures)
        name = suite
        if self.components != DEFAULT_COMPONENTS or self.architectures != (ARCH,):
            # Another sources line means other lists: keep them apart from the plain suite's.
            name = f"{suite}_{'+'.join(self.components)}_{'+'.join(self.architectures)}"
        self.dir = cache_dir() / "apt" / name
        self.lists = self.dir / "lists"
        self.stamp = self.lists / ".updated"
        self.conf = self.dir / "apt.conf"
        self.lock = self.dir / "lock"

    def write_config(self, uri: str, signed_by: str) -> None:
        """(Re)write sources list and apt.conf; cheap, done before each apt run so a
        changed system mirror is picked up."""
        for sub in ("lists/partial", "cache/archives/partial", "empty.d"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "status").touch()
        archs = ",".join(self.architectures)
        sources = f"deb [arch={archs} {signed_by}] {uri} {self.suite} {' '.join(self.components)}\n"
        _write_if_changed(self.dir / "sources.list", sources)
        # Pinned versions make a replayed index harmless here, and snapshot mirrors serve
        # Release files whose Valid-Until is long past.
        conf = private_apt_conf(self.dir, self.lists, self.architectures, 'Acquire::Check-Valid-Until "false";')
        _write_if_changed(self.conf, conf)

    def apt(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        cmd = ["apt-get", "-c", str(self.conf), "-q", *args]
        if args and args[0] in ("madison", "show", "policy"):
            cmd[0] = "apt-cache"
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=_apt_env())

    def lists_age(self) -> float | None:
        try:
            return time.time() - self.stamp.stat().st_mtime
        except FileNotFoundError:
            return None

    def update(self) -> None:
        """Run ``apt-get update`` for this suite, bootstrapping the keyring if needed."""
        uri, keyring = debian_mirror()
        if (uri, self.suite) in _UNREACHABLE:  # apt's own retries already took their time
            raise _UNREACHABLE[uri, self.suite]
        attempts = [f"signed-by={keyring}"]
        for signed_by in attempts:
            self.write_config(uri, signed_by)
            log.info("apt-get update (%s from %s)", self.suite, uri)
            proc = self.apt("update")
            # apt-get update exits 0 on some fetch failures; "W:"/"E:" lines tell the truth.
            out = proc.stdout + proc.stderr
            failed = proc.returncode != 0 or re.search(r"^(E:|W: Failed to fetch|Err:)", out, re.M)
            if not failed:
                self.stamp.touch()
                return
            if _SIGNATURE_ERRORS.search(out):
                if len(attempts) == 1:
                    attempts += _fallback_keyrings(self.suite)
                continue  # the next keyring, if there is one
            if _NETWORK_ERRORS.search(out):
                exc = DebUnavailable(f"apt-get update for suite {self.suite!r} could not reach {uri}:\n{_tail(out)}")
                _UNREACHABLE[uri, self.suite] = exc
                raise exc
            break
        hint = ""
        if _SIGNATURE_ERRORS.search(out):
            hint = (
                f" (no keyring verifies it: tried {', '.join(attempts)}; NRI_GPU_APT_TRUSTED=1 skips the"
                " signature check as a last resort)"
            )
        raise DebError(f"apt-get update for suite {self.suite!r} failed{hint}:\n{_tail(out)}")

    def ensure_lists(self, force: bool = False) -> None:
        age = self.lists_age()
        if not force and age is not None and age < LISTS_MAX_AGE_S:
            uri, keyring = debian_mirror()
            if not self.conf.exists():
                self.write_config(uri, f"signed-by={keyring}")
            return
        try:
            self.update()
        except DebUnavailable:
            if age is None:
                raise
            log.warning("suite %s: mirror unreachable, using lists %.0f h old", self.suite, age / 3600)

    def versions(self, package: str) -> list[str]:
        """Versions of ``package`` in this suite's lists, highest first."""
        proc = self.apt("madison", package)
        if proc.returncode != 0:
            raise DebError(f"apt-cache madison {package} ({self.suite}) failed:\n{_tail(proc.stderr)}")
        found = []
        for line in proc.stdout.splitlines():
            cols = [c.strip() for c in line.split("|")]
            if len(cols) >= 3 and cols[0] == package and "Sources" not in cols[2]:
                found.append(cols[1])
        return found  # apt lists a package's versions in descending order

    def download(self, package: str, version: str, store: Path) -> Path:
        """Download ``package=version`` into ``store`` and return the .deb's path.
        ``package`` may carry an architecture (``libcuda1:i386``), as apt spells it."""
        store.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=store, prefix=".dl-") as tmp:
            # Empty dir on purpose: apt skips (and --print-uris omits) a .deb already in cwd.
            proc = self.apt("download", f"{package}={version}", cwd=Path(tmp))
            debs = list(Path(tmp).glob("*.deb"))
            if proc.returncode != 0 or len(debs) != 1:
                out = proc.stdout + proc.stderr
                kind = DebUnavailable if _NETWORK_ERRORS.search(out) else DebError
                raise kind(f"apt-get download {package}={version} from suite {self.suite!r} failed:\n{_tail(out)}")
            final = store / debs[0].name
            os.replace(debs[0], final)
            return final


def _fallback_keyrings(suite: str) -> list[str]:
    """Keyrings to try after the system's failed to verify ``suite`` (see module doc)."""
    options = []
    for other in _KEYRING_CHAIN:
        if other == suite:
            continue
        try:
            root = extract("debian-archive-keyring", other)
        except DebError as exc:
            log.warning("cannot bootstrap keyring from %s: %s", other, exc)
            continue
        keyring = root / "usr/share/keyrings/debian-archive-keyring.gpg"
        if keyring.is_file():
            log.warning("suite %s: system keyring cannot verify it, using %s's keyring", suite, other)
            options.append(f"signed-by={keyring}")
    if os.environ.get("NRI_GPU_APT_TRUSTED") == "1":
        log.warning("suite %s: NRI_GPU_APT_TRUSTED=1, signature checks DISABLED", suite)
        options.append("trusted=yes")
    return options


def _apt_env() -> dict[str, str]:
    env = dict(os.environ, LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    env.pop("APT_CONFIG", None)
    return env


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------- extract


def _safe(version: str) -> str:
    # An epoch's ':' would break PATH entries built from these dirs; dpkg writes %3a too.
    # The same goes for a package's architecture qualifier (libcuda1:i386).
    return version.replace(":", "%3a")


def _architectures(package: str, architectures: Sequence[str]) -> tuple[str, ...]:
    """The private config's architectures: amd64, those asked for, and the package's own."""
    wanted = [ARCH, *architectures]
    _, _, qualifier = package.partition(":")
    if qualifier:
        wanted.append(qualifier)
    return tuple(dict.fromkeys(wanted))


def _cached_versions(package: str, pattern: str) -> list[str]:
    """Versions of ``package`` already unpacked in the cache that match ``pattern``."""
    root = cache_dir() / "extract"
    prefix = f"{_safe(package)}_"
    found = [
        p.name[len(prefix) :].replace("%3a", ":")
        for p in root.glob(f"{prefix}*")
        if p.is_dir() and not p.name.startswith(".")
    ]
    matching = [v for v in found if fnmatch.fnmatchcase(v, pattern)]
    # Usually one; dpkg orders several exactly (~, epochs, revisions), one process a pair.
    return sorted(matching, key=functools.cmp_to_key(_dpkg_compare), reverse=True)


def _dpkg_compare(a: str, b: str) -> int:
    if a == b:
        return 0
    lower = subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0
    return -1 if lower else 1


def available_versions(
    package: str, suite: str, *, components: Sequence[str] = DEFAULT_COMPONENTS, architectures: Sequence[str] = ()
) -> list[str]:
    """Versions of ``package`` that ``suite`` offers now, highest first (may update lists)."""
    apt_suite = _Suite(suite, components, _architectures(package, architectures))
    with locked(apt_suite.lock):
        apt_suite.ensure_lists()
        return apt_suite.versions(package)


def extract(
    package: str,
    suite: str,
    version: str | None = None,
    *,
    components: Sequence[str] = DEFAULT_COMPONENTS,
    architectures: Sequence[str] = (),
) -> Path:
    """Unpack ``package`` from Debian ``suite`` and return the directory it was unpacked in.

    ``package`` may name an architecture, ``libcuda1:i386``: that architecture is then
    added to the private apt config. ``components`` (default ``main``) and extra
    ``architectures`` select a private config of their own; callers fetching several
    packages should pass the same values to all, so one ``apt-get update`` serves them.

    ``version``: None takes the suite's current version; an exact version pins it; a
    glob (``2.1.9+ds1-*``) takes the highest matching one, and is satisfied from the
    cache first so a suite moving on does not break a machine that already has it.

    Raises DebUnavailable when the mirror cannot be reached and nothing usable is
    cached, DebError for any other failure (unknown package or version, apt error).
    """
    pattern = version or "*"
    is_exact = version is not None and not any(c in version for c in "*?[")
    if version is not None:
        cached = _cached_versions(package, pattern)
        if cached:
            return cache_dir() / "extract" / f"{_safe(package)}_{_safe(cached[0])}"
    apt_suite = _Suite(suite, components, _architectures(package, architectures))
    with locked(apt_suite.lock):
        try:
            apt_suite.ensure_lists()
        except DebUnavailable:
            cached = _cached_versions(package, pattern)
            if cached:  # offline, but some version was unpacked before: better than nothing
                return cache_dir() / "extract" / f"{_safe(package)}_{_safe(cached[0])}"
            raise
        chosen = _choose(apt_suite, package, pattern, is_exact)
        age = apt_suite.lists_age()
        if chosen is None and age is not None and age > 60:
            apt_suite.ensure_lists(force=True)  # pinned version newer than our lists?
            chosen = _choose(apt_suite, package, pattern, is_exact)
        if chosen is None:
            offered = apt_suite.versions(package)
            raise DebError(
                f"package {package!r} version {pattern!r} is not in suite {suite!r} "
                f"(offered: {', '.join(offered) or 'none'})"
            )
    return _unpack(apt_suite, package, chosen)


def _choose(apt_suite: _Suite, package: str, pattern: str, is_exact: bool) -> str | None:
    offered = apt_suite.versions(package)
    if is_exact:
        return pattern if pattern in offered else None
    matching = [v for v in offered if fnmatch.fnmatchcase(v, pattern)]
    return matching[0] if matching else None


def _unpack(apt_suite: _Suite, package: str, version: str) -> Path:
    root = cache_dir() / "extract"
    target = root / f"{_safe(package)}_{_safe(version)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f".{_safe(package)}.lock"):
        if target.is_dir():  # another process finished it while we waited
            return target
        store = cache_dir() / "debs"
        # A .deb is named <name>_<version>_<arch>.deb: match the arch, or another
        # architecture's build of the same version would do.
        name, _, arch = package.partition(":")
        debs = [store / f"{name}_{_safe(version)}_{a}.deb" for a in (arch or ARCH, "all")]
        deb = next((d for d in debs if d.is_file()), None)
        if deb is None:
            log.info("downloading %s=%s (%s)", package, version, apt_suite.suite)
            with locked(apt_suite.lock):
                deb = apt_suite.download(package, version, store)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{_safe(package)}-"))
        proc = subprocess.run(["dpkg", "-x", str(deb), str(tmp)], capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise DebError(f"dpkg -x {deb.name} ({package} from {apt_suite.suite}) failed:\n{_tail(proc.stderr)}")
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; binaries in it run as other users too
        os.replace(tmp, target)
        log.info("unpacked %s=%s into %s", package, version, target)
        return target
