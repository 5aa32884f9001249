"""Where the compiled CDI hook, ``nri-gpu-hook`` (hook/, Rust), is installed.

pip puts it beside the ``nri-gpu`` console script, in the same bin folder of the same
virtualenv (pyproject.toml's ``[[tool.setuptools-rust.bins]]``; hack/setup keeps
.venv's current). A spec that names it names that file: found from the console script
that is running, links resolved (``/usr/local/bin/nri-gpu`` is the README's link into
the venv, where the hook is not), else from this interpreter's scripts folder.
"""

from __future__ import annotations

import os
import sysconfig

__all__ = ["HOOK_EXECUTABLE", "installed_hook"]

HOOK_EXECUTABLE = "nri-gpu-hook"
_CONSOLE_SCRIPT = "nri-gpu"


def installed_hook(argv0: str) -> str | None:
    """The absolute path of the ``nri-gpu-hook`` installed beside this ``nri-gpu``; None if
    there is none (or it is not an executable file).

    ``argv0`` is ``sys.argv[0]``: where it is the console script, the hook is looked for in
    the folder that script really is in; otherwise (``python -m nri_gpu.plugin.cli``) in the scripts
    folder of this interpreter's installation (the venv's bin)."""
    if os.path.basename(argv0) == _CONSOLE_SCRIPT and os.path.isfile(argv0):
        folder = os.path.dirname(os.path.realpath(argv0))
    else:
        folder = os.path.abspath(sysconfig.get_path("scripts"))
    path = os.path.join(folder, HOOK_EXECUTABLE)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
