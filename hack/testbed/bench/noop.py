"""The do-nothing NRI plugin: our stub with handlers that return None.

It subscribes to CreateContainer and StartContainer, the two events nri-gpu
works in, and answers both at once. Run as its own process (as nri-gpu is), it
measures the floor of an NRI round trip through our Python stub: the runtime's
marshalling, ttrpc over the socket, the stub's dispatch and an empty reply.

    PYTHONPATH=hack python -m testbed.bench.noop --socket /var/run/nri/nri.sock
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.config import PluginConfig
from nri_gpu.plugin.stub import Stub

__all__ = ["NoopPlugin", "main"]

NAME = "bench-noop"


class NoopPlugin:
    async def create_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        return None

    async def start_container(self, pod: api.PodSandbox, container: api.Container) -> None:
        return None


async def _serve(config: PluginConfig) -> None:
    stub = Stub(NoopPlugin(), config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stub.stop)
    await stub.run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.bench.noop", description="the do-nothing NRI plugin (benchmark floor)"
    )
    parser.add_argument("--socket", required=True, help="the runtime's NRI socket")
    parser.add_argument("--index", default="10", help="plugin index (default 10, as nri-gpu)")
    args = parser.parse_args(argv)
    # "registered with ..." on stderr is what the test bed waits for.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve(PluginConfig(socket=args.socket, name=NAME, index=args.index)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
