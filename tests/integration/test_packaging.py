"""The wheel installs one top-level name, ``nri_gpu``, beside anything else.

Before, it installed top-level ``plugin`` and ``engine``, names other
distributions use too: installed together, one would overwrite the other's
files. Built as the README installs it (``pip install`` of the checkout into a
fresh venv: the bench's ``install_nri_gpu``, which compiles the hook too), next
to a distribution of our own making whose packages are called ``engine`` and
``plugin``.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from testbed.bench.cdi import install_nri_gpu


def _other_distribution(where: Path) -> Path:
    """A wheel of a distribution ``someone-elses`` with top-level ``engine`` and ``plugin``."""
    src = where / "other"
    for package in ("engine", "plugin"):
        (src / package).mkdir(parents=True)
        (src / package / "__init__.py").write_text(f"WHO = 'someone else: {package}'\n")
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "someone-elses"\nversion = "1.0"\n'
        '[tool.setuptools]\npackages = ["engine", "plugin"]\n'
    )
    out = where / "other-wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def test_nri_gpu_installs_beside_another_engine_and_plugin(tmp_path: Path) -> None:
    nri_gpu = install_nri_gpu(tmp_path / "ours")
    venv = nri_gpu.parent.parent
    (wheel,) = (tmp_path / "ours" / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/", 1)[0] for name in zf.namelist()}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {"nri_gpu"}, tops
    other = _other_distribution(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "pip", "-q", "--python", str(venv / "bin/python"), "install", "--no-deps", str(other)],
        check=True,
        capture_output=True,
    )
    probe = (
        "import engine, plugin, nri_gpu.engine, nri_gpu.plugin.cli.entry as entry;"
        "print(engine.WHO); print(plugin.WHO); print(callable(entry.main)); print(nri_gpu.engine.make_plan.__module__)"
    )
    done = subprocess.run([str(venv / "bin/python"), "-I", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:4] == [
        "someone else: engine",
        "someone else: plugin",
        "True",
        "nri_gpu.engine.plan",
    ]
    for command in ([str(nri_gpu), "--help"], [str(venv / "bin/nri-gpu-hook"), "--help"]):
        shown = subprocess.run(command, capture_output=True, text=True, check=False)
        assert shown.returncode == 0 and "usage" in shown.stdout, (command, shown.stderr)
