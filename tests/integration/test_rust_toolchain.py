"""The compiled hook (hook/) builds with the oldest toolchain it declares: Debian bookworm's
rustc 1.63 and cargo (hook/Cargo.toml's ``rust-version``), as hack/setup's fallback fetches
them (hack/testbed/rust_toolchain.py), offline and statically linked, as pyproject.toml
builds it; its tests compile with it too. The toolchain the project builds with day to day
is newer and accepts code 1.63 does not: this is where that is caught.

Needs Debian's packages (downloaded once, then cached); without them the tests skip, and
``NRI_GPU_E2E_REQUIRE=1`` (CI) turns that skip into a failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed import rust_toolchain
from testbed.debs import DebUnavailable

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ["--locked", "--offline", "--manifest-path", "hook/Cargo.toml", "--config", "hook/.cargo/config.toml"]


@pytest.fixture(scope="module")
def bookworm_cargo() -> Path:
    try:
        return rust_toolchain.debian_cargo()
    except DebUnavailable as exc:
        reason = f"Debian bookworm's rustc and cargo cannot be fetched: {exc}"
        if os.environ.get("NRI_GPU_E2E_REQUIRE") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


def cargo(binary: Path, *args: str, target: Path) -> None:
    """Run ``binary`` in the checkout with nothing of the user's cargo configuration or
    RUSTFLAGS (which would replace the config's); fail with its errors."""
    env = {**os.environ, "CARGO_TARGET_DIR": str(target), "CARGO_HOME": str(target / "cargo-home")}
    for name in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"):
        env.pop(name, None)
    env["CARGO_NET_OFFLINE"] = "true"
    done = subprocess.run(
        [str(binary), *args, *MANIFEST], capture_output=True, text=True, check=False, cwd=ROOT, env=env
    )
    if done.returncode != 0:
        pytest.fail(f"cargo {args[0]} with rustc 1.63 ({binary}):\n{done.stderr[-6000:]}", pytrace=False)


def test_the_hook_builds_statically_with_rust_1_63(bookworm_cargo: Path, tmp_path: Path) -> None:
    cargo(bookworm_cargo, "build", "--release", target=tmp_path)
    assert not rust_toolchain.has_interpreter(tmp_path / "release" / "nri-gpu-hook"), "not statically linked"


def test_the_hooks_tests_compile_with_rust_1_63(bookworm_cargo: Path, tmp_path: Path) -> None:
    cargo(bookworm_cargo, "test", "--no-run", target=tmp_path)


def test_the_folder_of_the_cargo_wrapper_runs_rustc_too(bookworm_cargo: Path) -> None:
    """hack/setup and hack/lint put the cargo's folder first on PATH: setuptools-rust (pip
    install) runs ``rustc -V`` from PATH before it runs cargo."""
    done = subprocess.run(
        ["rustc", "-V"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": f"{bookworm_cargo.parent}:/usr/bin:/bin"},
    )
    assert done.returncode == 0 and done.stdout.startswith("rustc 1.63."), (done.stdout, done.stderr)
