"""The compiled hook's own tests (the ``hook/`` crate), run with the suite.

``cargo test --release`` with the cargo hack/setup builds the hook with
(``testbed.rust_toolchain``), into the checkout's ``hook/target`` as
hack/setup does (so a current build is reused). Besides the unit tests, two
suites have a ``main()`` of their own (``harness = false``: the mounts need a
private mount namespace, which libtest's threads forbid): ``procview`` (the
procfs view) and ``ldrebuild`` (the confined ldconfig). Without root they print
that they skipped, and cargo still says ok: here, as root, each must have run
its cases and passed them all: the names it printed ``test <name> ... ok`` (or
``skipped``) are exactly those of the suite's own table in its source, read at run
time so that a case added there is counted without editing this file.

Without a cargo (none installed and Debian's cannot be fetched) the test skips;
``NRI_GPU_E2E_REQUIRE=1`` (CI) turns that skip into a failure, and then also
wants no ``ldrebuild`` case skipped (its probes need gcc's static libc, which
CI has, as tests/integration/test_start.py's confinement probe does).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from testbed import rust_toolchain
from tests.integration.hookrun import cannot_run

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [
    "test",
    "--release",
    "--locked",
    "--offline",
    "--manifest-path",
    "hook/Cargo.toml",
    "--config",
    "hook/.cargo/config.toml",
]
SUITES = ("procview", "ldrebuild")
# Each suite's last line: "procview: 21 passed; 0 failed", "ldrebuild: 13 passed; 0 failed; 0 skipped".
_SUMMARY = r"^{suite}: (\d+) passed; (\d+) failed(?:; (\d+) skipped)?$"
# Its main(): `let tests: Vec<(&str, Test)> = vec![("name", function), ...];`
_TABLE = re.compile(r"let tests: Vec<\(&str, Test\)> = vec!\[(.*?)\];", re.DOTALL)
_ENTRY = re.compile(r'\(\s*"(\w+)"\s*,')
_CASE = re.compile(r"^test (\S+) \.\.\. (\w+)$")


def suite_cases(suite: str) -> list[str]:
    """The names in ``hook/tests/<suite>.rs``'s table of cases, in order."""
    source = (ROOT / "hook" / "tests" / f"{suite}.rs").read_text()
    tables = _TABLE.findall(source)
    assert len(tables) == 1, f"hook/tests/{suite}.rs: {len(tables)} tables of cases, not one"
    names = _ENTRY.findall(tables[0])
    assert names and len(names) == tables[0].count('"') // 2, f"hook/tests/{suite}.rs: unread entries"
    return names


def cases_run(stdout: str) -> dict[str, list[tuple[str, str]]]:
    """Each harness-less suite's ``test <name> ... <outcome>`` lines, by suite: those
    printed between the run before it (libtest's ``test result:``) and its summary."""
    runs: dict[str, list[tuple[str, str]]] = {}
    lines: list[tuple[str, str]] = []
    for line in stdout.splitlines():
        case = _CASE.match(line)
        if case:
            lines.append((case[1], case[2]))
        elif line.startswith(("test result:", "running ")):
            lines = []
        elif (suite := line.split(":", 1)[0]) in SUITES and re.match(_SUMMARY.format(suite=suite), line):
            runs[suite], lines = lines, []
    return runs


def test_the_crates_own_tests_pass() -> None:
    try:
        cargo = rust_toolchain.cargo()
    except rust_toolchain.ToolchainError as exc:
        cannot_run(f"no cargo to run the hook's tests with: {exc}")
        return
    env = {**os.environ, "CARGO_TARGET_DIR": str(ROOT / "hook" / "target")}
    for name in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS"):  # they would replace the config's static linking
        env.pop(name, None)
    done = subprocess.run(
        [cargo, *COMMAND], cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1800
    )
    out = done.stdout + done.stderr
    tail = f"cargo {' '.join(COMMAND)} ({cargo}), exit status {done.returncode}:\n{out[-8000:]}"
    if done.returncode != 0:
        pytest.fail(tail, pytrace=False)
    assert "test result: ok." in out and "test result: FAILED" not in out, tail
    for suite in SUITES:
        found = re.search(_SUMMARY.format(suite=suite), out, re.MULTILINE)
        if os.geteuid() != 0:
            assert found or f"{suite}: skipped: needs root" in out, tail
            continue
        assert f"{suite}: skipped" not in out, tail
        assert found is not None, f"no summary line of {suite}:\n{tail}"
        passed, failed, skipped = int(found[1]), int(found[2]), int(found[3] or 0)
        cases, ran = suite_cases(suite), cases_run(done.stdout).get(suite, [])
        assert [name for name, _ in ran] == cases, f"{suite}: ran {ran}, its table lists {cases}:\n{tail}"
        assert {outcome for _, outcome in ran} <= {"ok", "skipped"}, f"{suite}: {ran}\n{tail}"
        assert (passed + skipped, failed) == (len(cases), 0), tail
        assert skipped == sum(outcome == "skipped" for _, outcome in ran), tail
        if os.environ.get("NRI_GPU_E2E_REQUIRE") == "1":
            assert skipped == 0, f"{suite}: {skipped} cases skipped:\n{tail}"
