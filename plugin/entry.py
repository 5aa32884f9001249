"""The ``nri-gpu`` console script: ``hook`` to the hook's light command line, the rest to ``plugin.__main__``.

A GPU container's start waits for the CDI hook (``nri-gpu hook start-container``),
so that command imports nothing it does not need (``engine.hookmain``: no
asyncio, protobuf, NRI stub or config file); every other command gets the
whole command line. Nothing is imported here before the choice.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> int:
    if sys.argv[1:2] == ["hook"]:
        from engine.hookmain import main as hook_main

        return hook_main(sys.argv[2:])
    from plugin.__main__ import main as cli_main

    return cli_main()
