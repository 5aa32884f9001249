"""The ``nri-gpu`` console script: ``hook`` to the hook's light command line, the rest to ``plugin.__main__``.

A GPU container's start waits for the CDI hook (``nri-gpu hook start-container``),
so that command imports nothing it does not need (``engine.hookmain``: no
asyncio, protobuf, NRI stub or config file); every other command gets the
whole command line. Nothing is imported here before the choice (``gc`` and ``sys``
are built in).
"""

from __future__ import annotations

import gc
import sys

__all__ = ["main"]


def main() -> int:
    if sys.argv[1:2] == ["hook"]:
        # The hook lives for a few tens of ms and leaves no garbage worth finding:
        # without the cyclic collector, which its imports (classes by the dozen)
        # would set off again and again, it starts ~2 ms sooner (hack/bench).
        gc.disable()
        from engine import hook_main

        return hook_main(sys.argv[2:])
    from plugin.__main__ import main as cli_main

    return cli_main()
