"""hack/testbed/image_debs.py against local apt repositories signed by a key made here.

The plugin image's packages must come from the release, -updates and -security alike
(the newest wins), from Release files signed by the trusted keyring and not expired.
The real apt-get does the checking; only the mirror and its keyring are the test's.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from testbed import apt_sources, image_debs
from testbed.debs import DebError

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("apt-get", "dpkg-deb", "gpg")),
    reason="needs root, apt-get, dpkg-deb and gpg",
)

PACKAGE = "nri-gpu-probe"


def _deb(work: Path, version: str) -> Path:
    root = work / f"pkg-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share").mkdir(parents=True)
    (root / "usr/share/probe").write_text(version)
    (root / "DEBIAN/control").write_text(
        f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        "Description: probe\n"
    )
    out = work / f"{PACKAGE}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(out)], check=True, capture_output=True)
    return out


def _gpg(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["gpg", "--batch", "--homedir", str(home), *args], check=True, capture_output=True)


def _key(work: Path, name: str) -> tuple[Path, Path]:
    """A throw-away signing key: (its gpg home, its public keyring file)."""
    home = work / f"gnupg-{name}"
    home.mkdir(mode=0o700)
    _gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example.org>", "ed25519", "sign", "1d")
    keyring = work / f"{name}.gpg"
    keyring.write_bytes(_gpg(home, "--export", f"{name}@example.org").stdout)
    return home, keyring


def _suite(mirror: Path, suite: str, debs: list[Path], signer: Path, valid_for: timedelta) -> None:
    """dists/<suite> with main/binary-amd64/Packages and an InRelease signed by ``signer``."""
    dists = mirror / "dists" / suite
    binary = dists / "main" / "binary-amd64"
    binary.mkdir(parents=True)
    stanzas = []
    for deb in debs:
        rel = f"pool/main/{deb.name}"
        (mirror / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(deb, mirror / rel)
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        data = deb.read_bytes()
        stanzas.append(
            f"{control.rstrip()}\nFilename: {rel}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = "\n".join(stanzas).encode()
    (binary / "Packages").write_bytes(packages)
    (binary / "Packages.gz").write_bytes(gzip.compress(packages))
    now = datetime.now(UTC)
    fmt = "%a, %d %b %Y %H:%M:%S UTC"
    lines = [
        f"Suite: {suite}",
        f"Codename: {suite}",
        "Architectures: amd64",
        "Components: main",
        f"Date: {(now - timedelta(days=30)).strftime(fmt)}",
        f"Valid-Until: {(now + valid_for).strftime(fmt)}",
        "SHA256:",
    ]
    for name in ("main/binary-amd64/Packages", "main/binary-amd64/Packages.gz"):
        body = (dists / name).read_bytes()
        lines.append(f" {hashlib.sha256(body).hexdigest()} {len(body)} {name}")
    (dists / "Release").write_text("\n".join(lines) + "\n")
    _gpg(signer, "--clearsign", "-o", str(dists / "InRelease"), str(dists / "Release"))


@pytest.fixture
def repos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, object]]:
    """A release mirror (bookworm, bookworm-updates) and its security mirror, signed by
    ``trusted``; the test bed's cache and the host's mirror pointed at them. The gpg
    agents the keys started are stopped afterwards (they would outlive the test)."""
    monkeypatch.setenv("NRI_GPU_CACHE", str(tmp_path / "cache"))
    trusted_home, trusted_keyring = _key(tmp_path, "trusted")
    other_home, _ = _key(tmp_path, "other")
    mirror, security = tmp_path / "debian", tmp_path / "debian-security"
    monkeypatch.setattr(apt_sources, "debian_mirror", lambda: (f"file://{mirror}", trusted_keyring))
    monkeypatch.setattr(apt_sources, "_system_source_entries", lambda: [])
    debs = {v: _deb(tmp_path, v) for v in ("1.0-1", "1.0-1+deb12u1", "1.0-1+deb12u2", "2.0-1")}
    yield {"mirror": mirror, "security": security, "trusted": trusted_home, "other": other_home, "debs": debs}
    for home in (trusted_home, other_home):
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)


def _layout(
    repos: dict[str, object], *, security_signer: str = "trusted", security_valid: timedelta = timedelta(days=7)
) -> None:
    debs: dict[str, Path] = repos["debs"]  # type: ignore[assignment]
    trusted: Path = repos["trusted"]  # type: ignore[assignment]
    mirror: Path = repos["mirror"]  # type: ignore[assignment]
    _suite(mirror, "bookworm", [debs["1.0-1"], debs["2.0-1"]], trusted, timedelta(days=365))
    _suite(mirror, "bookworm-updates", [debs["1.0-1+deb12u1"]], trusted, timedelta(days=7))
    _suite(
        repos["security"],
        "bookworm-security",
        [debs["1.0-1+deb12u2"]],  # type: ignore[arg-type]
        repos[security_signer],
        security_valid,
    )  # type: ignore[arg-type]


def test_the_newest_of_release_updates_and_security_is_taken_and_checked(repos: dict[str, object]) -> None:
    _layout(repos)
    (deb,) = image_debs.fetch([(PACKAGE, "bookworm", "1.0-*")])  # 2.0 is another upstream release
    assert (deb.version, deb.suite) == ("1.0-1+deb12u2", "bookworm-security")
    debs: dict[str, Path] = repos["debs"]  # type: ignore[assignment]
    assert deb.sha256 == hashlib.sha256(debs["1.0-1+deb12u2"].read_bytes()).hexdigest()
    assert (deb.tree / "usr/share/probe").read_text() == "1.0-1+deb12u2"


def test_an_expired_security_release_is_refused(repos: dict[str, object]) -> None:
    """A replayed (old, validly signed) security Release would hold fixes back."""
    _layout(repos, security_valid=timedelta(days=-1))
    with pytest.raises(DebError, match=r"bookworm-security_InRelease expired on .*: refused"):
        image_debs.fetch([(PACKAGE, "bookworm", "1.0-*")])


def test_a_release_signed_by_a_key_outside_the_keyring_is_refused(repos: dict[str, object]) -> None:
    _layout(repos, security_signer="other")
    with pytest.raises(DebError, match=r"(?s)refused .signature, expiry or network.*NO_PUBKEY"):
        image_debs.fetch([(PACKAGE, "bookworm", "1.0-*")])
