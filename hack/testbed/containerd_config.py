"""containerd's config.toml for the test bed, for config version 2 (1.7) and 3 (2.x).

Every path points into the instance's workdir, so two daemons never share state:
root, state, temp, the gRPC/ttrpc sockets, the NRI socket and plugin dirs, runc's
state root, CNI and CDI dirs, and the opt/image-verifier dirs (defaults under /opt).

The NRI table ``io.containerd.nri.v1.nri`` is the same in both versions. CRI moved:
1.7 has one ``io.containerd.grpc.v1.cri`` plugin; 2.x splits it into
``io.containerd.cri.v1.runtime`` (runtimes, CDI, oom/apparmor knobs) and
``io.containerd.cri.v1.images`` (snapshotter, pinned sandbox image), keeping only the
streaming server under ``io.containerd.grpc.v1.cri``. Checked with
``containerd --config X config dump`` on both versions.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .images import PAUSE

if TYPE_CHECKING:
    from .containerd import Containerd

__all__ = ["render"]


def render(c: Containerd) -> str:
    """The config.toml text for ``c`` (its version picks the config format)."""
    return _v2(c) if c.version.startswith("1.") else _v3(c)


def _toml(value: object) -> str:
    # JSON strings, numbers, booleans and lists of them are valid TOML values.
    return json.dumps(value)


def _common(c: Containerd, version: int) -> str:
    w = c.workdir
    return f"""\
version = {version}
root = {_toml(str(w / "root"))}
state = {_toml(str(w / "state"))}
temp = {_toml(str(w / "tmp"))}

[grpc]
  address = {_toml(str(c.address))}

[ttrpc]
  address = {_toml(str(c.address) + ".ttrpc")}

[debug]
  level = {_toml(c.log_level)}

[plugins]
{_nri(c) if c.nri else ""}
  [plugins.'io.containerd.internal.v1.opt']
    path = {_toml(str(w / "opt"))}
"""


def _nri(c: Containerd) -> str:
    # Without it (Containerd(nri=False)) NRI has containerd's defaults: off in 1.7.
    return f"""\
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    disable_connections = {_toml(c.nri_disable_connections)}
    socket_path = {_toml(str(c.nri_socket))}
    plugin_path = {_toml(str(c.nri_plugin_dir))}
    plugin_config_path = {_toml(str(c.nri_config_dir))}
    plugin_registration_timeout = {_toml(c.nri_registration_timeout)}
    plugin_request_timeout = {_toml(c.nri_request_timeout)}
"""


def _runc(c: Containerd, prefix: str) -> str:
    return f"""
      [{prefix}.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{prefix}.runtimes.runc.options]
          BinaryName = {_toml(str(c.runtime.runc))}
          Root = {_toml(str(c.runc_root))}
          SystemdCgroup = false
"""


def _v2(c: Containerd) -> str:
    """containerd 1.7: CRI is one plugin, ``io.containerd.grpc.v1.cri``."""
    cri = "plugins.'io.containerd.grpc.v1.cri'"
    return (
        _common(c, 2)
        + f"""
  [{cri}]
    sandbox_image = {_toml(PAUSE)}
    # Root here lacks CAP_SYS_RESOURCE: an oom_score_adj below containerd's own fails
    # runc create ("failed to update /proc/self/oom_score_adj: Permission denied").
    restrict_oom_score_adj = true
    disable_apparmor = true
    enable_selinux = false
    enable_cdi = true
    cdi_spec_dirs = [{_toml(str(c.cdi_dir))}]
    # The streaming server (exec/attach over HTTP) listens even when unused; port 0
    # lets several daemons run at once.
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [{cri}.containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
{_runc(c, cri + ".containerd")}
    [{cri}.cni]
      bin_dir = {_toml(str(c.workdir / "cni" / "bin"))}
      conf_dir = {_toml(str(c.workdir / "cni" / "net.d"))}
"""
    )


def _v3(c: Containerd) -> str:
    """containerd 2.x: CRI is split into ``io.containerd.cri.v1.runtime`` and
    ``.images``; the streaming server stays under ``io.containerd.grpc.v1.cri``."""
    rt = "plugins.'io.containerd.cri.v1.runtime'"
    im = "plugins.'io.containerd.cri.v1.images'"
    return (
        _common(c, 3)
        + f"""
  [{im}]
    snapshotter = "overlayfs"
    [{im}.pinned_images]
      sandbox = {_toml(PAUSE)}

  [{rt}]
    restrict_oom_score_adj = true   # no CAP_SYS_RESOURCE here, see the 1.7 config
    disable_apparmor = true
    enable_selinux = false
    enable_cdi = true
    cdi_spec_dirs = [{_toml(str(c.cdi_dir))}]
    [{rt}.containerd]
      default_runtime_name = "runc"
{_runc(c, rt + ".containerd")}
    [{rt}.cni]
      bin_dirs = [{_toml(str(c.workdir / "cni" / "bin"))}]
      conf_dir = {_toml(str(c.workdir / "cni" / "net.d"))}

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = {_toml(str(c.workdir / "image-verifier"))}   # default is under /opt
"""
    )
