"""The cargo that builds the compiled CDI hook (``hook/``) for hack/setup, hack/lint and the
benchmark's install.

In order: ``$CARGO`` (setuptools-rust's own override), ``cargo`` on PATH, rustup's in
``$CARGO_HOME/bin`` (``~/.cargo/bin``: a non-login shell, sudo or CI as root often lacks it on
PATH), else Debian bookworm's rustc 1.63 and cargo 1.65 (Debian's 0.66.0), fetched into the
cache. That last one is also the oldest toolchain the crate declares (``rust-version`` in
hook/Cargo.toml), so tests/integration/test_rust_toolchain.py builds the crate with it.

Debian's packages are unpacked, never installed (``debs.extract``), each into a folder of
its own; they are then hard-linked together into one tree, ``<cache>/rust-bookworm/<key>/usr``,
because rustc finds its standard library beside its own binary (``../lib/rustlib``). The
``cargo`` this module hands out there is a small script: the real cargo, with
``LD_LIBRARY_PATH`` naming the tree's libraries (``librustc_driver`` and ``libstd``, and the
libgit2, mbedtls and http-parser libraries cargo links, which few hosts have) and ``RUSTC``
the tree's rustc. The rest cargo links (libcurl3-gnutls, libssh2, libssl3) is the host's:
when one is missing, ``cargo --version`` fails and the error names it.

Run as a module (stdlib only: hack/setup runs it before .venv exists), it prints the path of
the cargo to use, or says on stderr what to install and exits 1.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from . import debs
from .cache import cache_dir, locked

__all__ = ["ToolchainError", "cargo", "debian_cargo", "found_cargo", "has_interpreter"]

SUITE = "bookworm"
# Version globs: a cached unpack satisfies them offline, a new Debian revision is taken.
PACKAGES = (
    ("rustc", "1.63.0+dfsg1-*"),
    ("libstd-rust-1.63", "1.63.0+dfsg1-*"),
    ("libstd-rust-dev", "1.63.0+dfsg1-*"),
    ("cargo", "0.66.0+ds1-*"),
    ("libgit2-1.5", "1.5.1+ds-*"),
    ("libmbedtls14", "2.28.*"),
    ("libmbedx509-1", "2.28.*"),
    ("libmbedcrypto7", "2.28.*"),
    ("libhttp-parser2.9", "2.9.4-*"),
)
_LIBS = "usr/lib/x86_64-linux-gnu"
_INSTALL_HINT = "install Rust 1.63 or newer (cargo and rustc): apt-get install cargo, or rustup"


class ToolchainError(RuntimeError):
    """No cargo could be found or fetched; the message says why."""


def found_cargo() -> str | None:
    """A cargo this machine already has: ``$CARGO``, on PATH, or in ``$CARGO_HOME/bin``."""
    for candidate in (os.environ.get("CARGO"), shutil.which("cargo")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    home = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
    rustup = os.path.join(home, "bin", "cargo")
    return rustup if os.access(rustup, os.X_OK) else None


# The wrappers beside each other: a folder to put first on PATH, where setuptools-rust
# looks for rustc (it runs ``rustc -V`` before cargo).
_WRAPPED = ("cargo", "rustc")


def _wrapper(tree: Path, tool: str) -> str:
    lib, bin_ = shlex.quote(str(tree / _LIBS)), tree / "usr/bin"
    return (
        "#!/bin/sh\n"
        "# Debian bookworm's cargo and rustc, unpacked by hack/testbed/rust_toolchain.py.\n"
        f'LD_LIBRARY_PATH={lib}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n'
        f"RUSTC={shlex.quote(str(bin_ / 'rustc'))}\n"
        f"RUSTDOC={shlex.quote(str(bin_ / 'rustdoc'))}\n"
        "export LD_LIBRARY_PATH RUSTC RUSTDOC\n"
        f'exec {shlex.quote(str(bin_ / tool))} "$@"\n'
    )


def _link_tree(source: Path, tree: Path) -> None:
    """Hard-link ``source``'s ``usr/bin`` and ``usr/lib`` into ``tree`` (both in the cache)."""
    for part in ("usr/bin", "usr/lib"):
        if (source / part).is_dir():
            shutil.copytree(source / part, tree / part, symlinks=True, dirs_exist_ok=True, copy_function=os.link)


def _check(cargo: Path) -> None:
    done = subprocess.run([str(cargo), "--version"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolchainError(f"Debian {SUITE}'s cargo does not run here: {done.stderr.strip()[-500:]}")


def debian_cargo() -> Path:
    """Debian bookworm's cargo (the wrapper script), fetched and put together on first use.

    Raises ``debs.DebUnavailable`` when the mirror cannot be reached and nothing is cached,
    ``debs.DebError`` or ``ToolchainError`` for any other failure."""
    unpacked = [debs.extract(package, SUITE, version) for package, version in PACKAGES]
    key = hashlib.sha256("\0".join(path.name for path in unpacked).encode()).hexdigest()[:16]
    root = cache_dir() / "rust-bookworm"
    cargo = root / key / "cargo"
    if not all((root / key / tool).is_file() for tool in _WRAPPED):
        _put_together(unpacked, root, key)
    _check(cargo)  # every time: the host's libraries may have gone since
    return cargo


def _put_together(unpacked: list[Path], root: Path, key: str) -> None:
    """Write ``root/key``: the trees in ``unpacked`` linked into one, and the cargo script."""
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / ".lock"):
        if all((root / key / tool).is_file() for tool in _WRAPPED):  # another process finished it meanwhile
            return
        shutil.rmtree(root / key, ignore_errors=True)  # one from before the rustc wrapper
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tree-"))
        try:
            for source in unpacked:
                _link_tree(source, tmp)
            for tool in _WRAPPED:
                script = tmp / tool
                script.write_text(_wrapper(root / key, tool))
                script.chmod(0o755)
            os.chmod(tmp, 0o755)  # mkdtemp makes 0700
            os.replace(tmp, root / key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def cargo() -> str:
    """The cargo to use: this machine's, else Debian bookworm's (raises ToolchainError)."""
    found = found_cargo()
    if found is not None:
        return found
    try:
        return str(debian_cargo())
    except (debs.DebError, OSError) as exc:
        raise ToolchainError(f"Debian {SUITE}'s rustc and cargo cannot be fetched: {exc}") from exc


def has_interpreter(binary: Path) -> bool:
    """Whether the ELF ``binary`` names a program interpreter (PT_INTERP): a dynamically
    linked executable does, a static one (static-pie included) does not."""
    with open(binary, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:  # ELFCLASS64
            raise ValueError(f"{binary}: not a 64-bit ELF file")
        (phoff,) = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    types = [struct.unpack_from("<I", table, i * phentsize)[0] for i in range(phnum)]
    return 3 in types  # PT_INTERP


def main() -> int:
    found = found_cargo()
    if found is None:
        home = os.environ.get("CARGO_HOME") or "~/.cargo"
        print(
            f"rust_toolchain: no cargo on PATH or in {home}/bin: Debian {SUITE}'s rustc 1.63 and cargo, from the cache",
            file=sys.stderr,
        )
    try:
        print(found or cargo())
    except ToolchainError as exc:
        print(f"rust_toolchain: {exc}\nrust_toolchain: {_INSTALL_HINT}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
