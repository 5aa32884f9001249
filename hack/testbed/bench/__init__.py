"""``hack/bench``: what nri-gpu costs a container, on real containerd 1.7.24 and 2.1.9.

On a simulated 8-GPU node (``gpunode.build_node(gpus=8)``), for each containerd
version in turn:

* **latency** of CRI CreateContainer + StartContainer of one container in an
  already running pod, for five variants measured side by side (interleaved,
  see ``session``): no plugin; a do-nothing plugin on our stub (``noop``);
  nri-gpu with a pod that asks for nothing; nri-gpu with 1 GPU; with 8 GPUs;
* **the plugin's own time** per step, read from its JSON log (``logparse``):
  each decision line's whole handler and its ``steps_ms`` (CreateContainer's
  request, plan and adjustment; the start engine's steps);
* a **burst** of one-GPU pods at once: the slowest handler call against the 2 s
  NRI deadline;
* **churn**: the plugin's RSS and descriptors over many GPU containers;

then the **CDI path** (``cdi``): ``podman run --rm`` and ``docker run --rm`` of a
plain container and of one with ``--device nvidia.com/gpu=0`` side by side, and the
spec's hook alone (``--cdi-only``: that part only); and then, in this process,
the CreateContainer path split into parse, plan and encode without any I/O, and
a cProfile of it (``inprocess``); and last, also in this process, what the input
limits cost (``limits``; ``--limits-only``: that part only, no containerd, no root):
the pre-filter, the request parser, the validation, the ld.so.cache reader and
the status server at the sizes a hostile container or client may reach, and a
CreateContainer waiting for a refresh of the inventory that hangs. Results: a table on stdout and a JSON document (``--output``). Modules: ``stats`` (pure), ``logparse`` (pure),
``noop``, ``session``, ``cdi``, ``inprocess``, ``limits``, ``report``, ``__main__``.
"""
