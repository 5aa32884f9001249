"""nri-gpu's tests.

gRPC (the test bed's CRI client) restarts its poller threads in every forked child
unless told not to. The plugin's start worker is such a child when the plugin runs
in the test process (``PluginThread``): it closes every inherited descriptor but its
result pipe, and gRPC's restarted threads then abort on their closed epoll fd. The
plugin itself never loads gRPC; set before any test module imports it.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
