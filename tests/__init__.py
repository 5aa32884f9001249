"""nri-gpu's tests.

gRPC (the test bed's CRI client) is loaded only by the test bed's gRPC process
(``hack/testbed/grpc_process.py``), never by a test process: one may host the
plugin (``PluginThread``), which forks its start worker, and gRPC's at-fork
handlers would restart its threads in that worker.
"""
