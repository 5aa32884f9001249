"""Where this install's ``nri-gpu`` and its compiled CDI hook, ``nri-gpu-hook``
(hook/, Rust), are.

pip puts the hook beside the ``nri-gpu`` console script, in the same bin folder of the
same virtualenv (pyproject.toml's ``[[tool.setuptools-rust.bins]]``; hack/setup keeps
.venv's current). Both are found from one folder: that of the console script that is
running, links resolved (``/usr/local/bin/nri-gpu`` is the README's link into the
venv, where the hook is not), else this interpreter's scripts folder (``python -m
nri_gpu.plugin.cli``). Never from PATH: a unit must not run another install's
``nri-gpu`` with this one's hook (or the other way round).
"""

from __future__ import annotations

import os
import sysconfig

__all__ = ["HOOK_EXECUTABLE", "installed_hook", "installed_nri_gpu"]

HOOK_EXECUTABLE = "nri-gpu-hook"
_CONSOLE_SCRIPT = "nri-gpu"


def _running_script(argv0: str) -> bool:
    return os.path.basename(argv0) == _CONSOLE_SCRIPT and os.path.isfile(argv0)


def _install_folder(argv0: str) -> str:
    """The bin folder of this install: where the console script ``argv0`` (``sys.argv[0]``)
    really is, else this interpreter's scripts folder."""
    if _running_script(argv0):
        return os.path.dirname(os.path.realpath(argv0))
    return os.path.abspath(sysconfig.get_path("scripts"))


def _executable(path: str) -> str | None:
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def installed_hook(argv0: str) -> str | None:
    """The absolute path of the ``nri-gpu-hook`` installed beside this ``nri-gpu``; None if
    there is none (or it is not an executable file)."""
    return _executable(os.path.join(_install_folder(argv0), HOOK_EXECUTABLE))


def installed_nri_gpu(argv0: str) -> str | None:
    """The ``nri-gpu`` console script of this install, for a unit to run: the one running
    as it was named (a link into the venv stays the link), else the one in the folder
    ``installed_hook`` looks in; None if there is none."""
    if _running_script(argv0) and os.access(argv0, os.X_OK):
        return os.path.abspath(argv0)
    return _executable(os.path.join(_install_folder(argv0), _CONSOLE_SCRIPT))
