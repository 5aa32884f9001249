"""The ``nri-gpu`` console script: every command goes to ``nri_gpu.plugin.cli.__main__``.

One word is answered here: ``hook``. Until 0.1 the CDI spec's hook was
``nri-gpu hook start-container``, run in Python; the hook is now the compiled
``nri-gpu-hook`` beside ``nri-gpu`` (``engine.cdi``). A spec written before
that still names ``nri-gpu hook``: it fails the GPU container's start with the
one thing to do, rather than start it without its start work.
"""

from __future__ import annotations

import sys

__all__ = ["OLD_SPEC_MESSAGE", "main"]

OLD_SPEC_MESSAGE = (
    "nri-gpu hook: this CDI spec was written by an older nri-gpu, whose hook was `nri-gpu hook`; "
    "its hook is now nri-gpu-hook: write the spec again (`nri-gpu cdi generate --output ...`, or "
    "`nri-gpu install --runtime docker|podman`)\n"
)


def main() -> int:
    if sys.argv[1:2] == ["hook"]:
        sys.stderr.write(OLD_SPEC_MESSAGE)
        return 1
    from nri_gpu.plugin.cli.__main__ import main as cli_main

    return cli_main()
