"""Print the fuzzing seed and profile, so that any run can be repeated exactly."""

from __future__ import annotations

import pytest

from tests.fuzz.support import LONG_EXAMPLES, PROFILE, SEED


def _line() -> str:
    count = f", {LONG_EXAMPLES} cases per test" if PROFILE.endswith("long") else ""
    return f"fuzz: hypothesis profile {PROFILE}{count}, seed {SEED:#x} (NRI_GPU_FUZZ_SEED={SEED:#x} repeats this run)"


def pytest_report_header(config: pytest.Config) -> str:
    return _line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(_line())
