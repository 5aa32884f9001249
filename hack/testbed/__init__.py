"""The project's test bed: real containerd daemons with NRI, offline; and the tooling built on it.

The tests use it (``tests/e2e``, ``tests/integration``, some unit tests) and so do the
``hack/`` scripts. It is not installed: it is the top-level package ``testbed`` with
``hack/`` on ``sys.path`` (pyproject.toml's pytest ``pythonpath``; the scripts set
``PYTHONPATH``).

Modules (stdlib plus grpcio/protobuf; nothing is installed on the host):

* ``cache``      the cache directory ($NRI_GPU_CACHE, $XDG_CACHE_HOME/nri-gpu, ~/.cache/nri-gpu)
* ``apt_sources`` which Debian mirror the host uses, read from its apt sources at run time
* ``debs``       fetch and unpack a Debian package from any suite with a private apt config
* ``rust_toolchain`` the cargo that builds hook/: this machine's, else Debian bookworm's, unpacked
* ``runtimes``   containerd 1.7.24 (trixie), 2.1.9 (sid) and runc 1.1.5 (bookworm) binaries
* ``images``     the busybox and pause images, built as reproducible OCI layout tars
* ``containerd`` a private containerd daemon (start, restart, kill, scoped clean-up)
* ``containerd_config`` its config.toml, version 2 (containerd 1.7) and 3 (2.x)
* ``cri``        a CRI v1 client over stubs generated at test time from Debian's cri-api
* ``grpc_process`` the one process that makes gRPC calls (the CRI client's), so that no test
                 process hosting the plugin, which forks, loads gRPC
* ``hostops``    scoped host clean-up: mounts under a path, cgroup trees, processes
* ``gpunode``    a simulated GPU node: real NVIDIA 550.163.01 files from Debian, fake /proc and /dev
* ``ldcaches``   ld.so.cache files (new, old, compat, hwcaps) written by the real ldconfig
* ``bundle``     OCI bundles run by runc alone: containers in the "created" state (NRI StartContainer)
* ``nvmlsim``    a simulated libnvidia-ml (C, compiled here) answering from a MIG node's description
* ``podman``     podman 4.3.1 (bookworm) with private storage and config, runc, cgroupfs
* ``docker``     dockerd and docker 28.5.2 (sid), 26.1.5 (trixie) over a private containerd and CDI dir
* ``cudart``     NVIDIA's CUDA runtime wheel (pinned) and an image with a probe that calls it
* ``cudacompat`` Debian experimental's libcuda 555.58.02 as an image's cuda-compat folder
* ``vulkan_image`` an image with Debian's Vulkan loader and a probe compiled here

The tooling (each run by a ``hack/`` script):

* ``plugin_image``, ``image_debs`` the release image, from verified Debian packages (``hack/build-image``)
* ``demo``       the demo (``hack/demo``)
* ``bench``      the benchmark (``hack/bench``)
* ``gpunode``    its command line builds a simulated GPU node by hand (``hack/simulate-gpu-node``)
* ``plain_manifests``, ``helm_render`` deploy/'s plain manifests, rendered from the chart with PyYAML (``hack/gen-manifests``)

``hack/fetch-runtimes`` fills the cache; ``tests/e2e/conftest.py`` holds the fixtures.
"""
