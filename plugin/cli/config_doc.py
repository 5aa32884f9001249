"""The annotated default config file, built from one table of options.  (pure)

``nri-gpu config default`` prints ``default_config()``; the README's config
section is the same text. Each option is listed once here with its default (as
TOML) and its documentation; tests check that the text parses into exactly the
built-in defaults and that every field of the settings classes is listed, so the
documentation cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass

from nri_gpu.plugin.config import DEFAULT_INDEX, DEFAULT_NAME, DEFAULT_SOCKET
from nri_gpu.plugin.logfmt import DEFAULT_LOG_FORMAT, DEFAULT_LOG_LEVEL, LOG_FORMATS, LOG_LEVELS

# What each of logfmt's formats looks like (a KeyError here: a new format needs its words).
_FORMAT_DOCS = {"text": "one line per decision, in words", "json": "one object per line, with fields"}


@dataclass(frozen=True)
class Option:
    table: str  # "plugin", "engine", "policy" or "cdi"
    key: str
    default: str  # the default, written as a TOML value
    doc: str  # one or more lines, each becomes a comment line


OPTIONS: tuple[Option, ...] = (
    Option(
        "plugin",
        "socket",
        f'"{DEFAULT_SOCKET}"',
        "The runtime's NRI socket to connect to (containerd: socket_path in\n"
        '[plugins."io.containerd.nri.v1.nri"]; CRI-O: nri_listen in [crio.nri]).\n'
        "Unused when the runtime launches the plugin itself (NRI_PLUGIN_SOCKET).",
    ),
    Option(
        "plugin",
        "name",
        f'"{DEFAULT_NAME}"',
        "Plugin name the runtime shows in its logs; letters, digits and . _ + - only.",
    ),
    Option(
        "plugin",
        "index",
        f'"{DEFAULT_INDEX}"',
        "Two-digit index: the order among NRI plugins (lower runs first).",
    ),
    Option("plugin", "log_level", f'"{DEFAULT_LOG_LEVEL}"', f"One of {', '.join(LOG_LEVELS)}."),
    Option(
        "plugin",
        "reconnect_min",
        "0.05",
        "Seconds before the first reconnect attempt when the runtime goes away;\n"
        "the delay doubles up to reconnect_max.",
    ),
    Option(
        "plugin",
        "reconnect_max",
        "0.25",
        "Longest delay, in seconds, between reconnect attempts. Short on purpose: after a\n"
        "runtime restart, pods the runtime starts before we are back get no GPUs (it does\n"
        "not wait for external plugins), and a dial of a missing socket costs nothing.",
    ),
    Option(
        "plugin",
        "log_format",
        f'"{DEFAULT_LOG_FORMAT}"',
        " or ".join(f'"{name}" ({_FORMAT_DOCS[name]})' for name in LOG_FORMATS) + ".",
    ),
    Option(
        "plugin",
        "metrics_address",
        '"127.0.0.1:9402"',
        'host:port (or [v6]:port) serving /healthz and /metrics; "" turns the server off.\n'
        "Security: it answers anyone who can reach it, without authentication; keep it on\n"
        "loopback unless the port is protected. The DaemonSet's pod has a network namespace\n"
        'of its own and listens on "0.0.0.0:9402" there, the pod\'s address the kubelet probes.',
    ),
    Option(
        "engine",
        "driver_root",
        '"/"',
        'Where the driver\'s files live: "/" or, with the GPU operator, "/run/nvidia/driver".',
    ),
    Option("engine", "dev_root", '"/"', "Directory under which dev/nvidia* device nodes are found."),
    Option("engine", "proc_root", '"/proc"', "The procfs to read (/proc/driver/nvidia, /proc/devices)."),
    Option(
        "engine",
        "ld_cache",
        '"merge"',
        'How a GPU container\'s ld.so cache gets the driver libraries. "merge": they are\n'
        "inserted into the image's own cache where ldconfig would put them; no process\n"
        'runs. "rebuild": the ldconfig below rebuilds the whole cache, as the toolkit does;\n'
        "it also lists libraries the image left out of its own cache, at 7-11 ms more per\n"
        "container start.",
    ),
    Option(
        "engine",
        "ldconfig",
        '"/sbin/ldconfig"',
        "The host's trusted ldconfig that rebuilds a GPU container's ld.so cache (\"rebuild\").\n"
        "Security: it runs from a descriptor opened here, never the image's binary;\n"
        "point it only at a root-owned file.",
    ),
    Option(
        "engine",
        "host_root",
        '"/"',
        'Where the host\'s "/" appears to the plugin: "/" on the host; "/host" in a container\n'
        'that mounts the host there (then give the roots above as "/host/..."). Mount\n'
        "sources handed to the runtime are translated back to host paths.",
    ),
    Option(
        "engine",
        "mps",
        "false",
        "Give compute containers the MPS control daemon's pipe folder /tmp/nvidia-mps\n"
        "(read-only, as the persistenced and fabric manager sockets always are).\n"
        "Security: /tmp belongs to every local account. The folder is taken only when no\n"
        "link leads to it, it is no mount point, and it and /tmp are root's and writable\n"
        "by no one else (/tmp sticky); otherwise it is skipped with a warning. Turn it on\n"
        "only where the MPS daemon runs as root.",
    ),
    Option(
        "policy",
        "accept_env_unprivileged",
        "true",
        "Honour NVIDIA_VISIBLE_DEVICES in unprivileged containers (the toolkit's default).\n"
        "Security: an image that bakes in NVIDIA_VISIBLE_DEVICES=all then gets every GPU\n"
        "of the node, around the scheduler; set false on shared clusters and use the\n"
        "nvidia.com/gpus annotations (or the device plugin's volume mounts) instead.",
    ),
    Option(
        "policy",
        "accept_volume_mounts",
        "false",
        "Read the device plugin's /dev/null markers under /var/run/nvidia-container-devices/\n"
        "(its volume-mounts strategy); off by default, as in the toolkit. The Kubernetes\n"
        "manifests turn it on, and accept_env_unprivileged off.",
    ),
    Option(
        "policy",
        "namespaces",
        '["*"]',
        'Kubernetes namespaces whose pods may get GPUs at all, by any source: "*" for all,\n'
        'or a list such as ["ml", "research"]. A pod elsewhere that asks by annotation or\n'
        "volume markers is refused; one whose env asks (nvidia/cuda images say all) runs\n"
        "without GPUs, and the log says why. A pod made without a namespace (straight\n"
        'through CRI) passes only "*". Security: on a shared cluster list the namespaces\n'
        'that run GPU work; with "*" every namespace\'s pods may get GPUs.',
    ),
    Option(
        "policy",
        "annotation_namespaces",
        '"*"',
        'Kubernetes namespaces whose pods may use the nvidia.com/gpus annotations: "*" for\n'
        'all, or a list such as ["ml", "research"]; they must pass namespaces too.\n'
        'Security: with "*" anyone who can create a pod can ask for any GPU by annotation.',
    ),
    Option(
        "policy",
        "capabilities",
        '["all"]',
        "Upper bound on NVIDIA_DRIVER_CAPABILITIES (compute, compat32, graphics, utility,\n"
        "video, display, ngx, or all); a request beyond it is capped and the plan says so.",
    ),
    Option(
        "policy",
        "require_checks",
        "true",
        "Evaluate NVIDIA_REQUIRE_* (e.g. cuda>=12.0); false skips every check.",
    ),
    Option(
        "policy",
        "legacy_image_all_gpus",
        "false",
        "The toolkit gives a legacy CUDA image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset)\n"
        "every GPU when it names none. We see every container of the node, so this is off:\n"
        "such an image gets GPUs only when it asks. Security: true hands all GPUs to any\n"
        "such image.",
    ),
    Option(
        "policy",
        "mig_monitor_namespaces",
        '["kube-system", "gpu-operator"]',
        "Namespaces whose pods may ask for NVIDIA_MIG_MONITOR_DEVICES=all (the device plugin,\n"
        "GPU feature discovery and DCGM do on MIG nodes: NVML there needs the monitor\n"
        'capability). "*" for all. The toolkit asks for CAP_SYS_ADMIN, which NRI does not\n'
        "show a plugin; a pod elsewhere that asks is refused. Security: the monitor\n"
        "capability shows every MIG device of the container's GPUs (memory, processes).",
    ),
    Option(
        "policy",
        "mig_config_namespaces",
        "[]",
        "Namespaces whose pods may ask for NVIDIA_MIG_CONFIG_DEVICES=all (NVIDIA's mig-manager:\n"
        "create and destroy MIG instances). Refused together with specific MIG devices, as\n"
        "the toolkit does. Security: the config capability reshapes every tenant's MIG devices.",
    ),
    Option(
        "policy",
        "refuse_mig_mode_gpus",
        "false",
        "A whole-GPU request (0, GPU-..., a bus id) for a GPU in MIG mode: CUDA sees no device\n"
        "in it. false serves it with a note in the log; true refuses the container.",
    ),
    Option(
        "policy",
        "equipped_containers",
        '"stand-aside"',
        "A container that CDI already gave GPUs (Kubernetes DRA, the device plugin's\n"
        'cdi-annotations or cdi-cri strategies, a cdi.k8s.io/ annotation): "stand-aside" adds\n'
        'nothing (the spec did the whole job); "complete" adds only what CDI cannot: the\n'
        "/proc/driver/nvidia view limited to its GPUs and the ld.so.cache entries of the\n"
        "driver libraries it mounts. Either way a request of ours for other GPUs than it\n"
        "has is refused, naming both.",
    ),
    Option(
        "policy",
        "cuda_compat",
        "true",
        "CUDA forward compatibility, as the toolkit's default: when an image's\n"
        "/usr/local/cuda/compat holds one libcuda.so.<version> newer than the host driver\n"
        "(and its fwd-compatibility note, if any, lists the driver's branch), its libraries\n"
        "go before the driver's in the container's ld.so.conf.d and ld.so.cache; otherwise\n"
        "the log says why not. Security: the folder is image data, read in the container's\n"
        "root by descriptor, bounded; false leaves it unread.",
    ),
    Option(
        "cdi",
        "spec",
        '""',
        "A CDI spec for nerdctl, podman and other CDI users that nri-gpu run keeps current:\n"
        "written at start and whenever the node's inventory changes, removed when the driver\n"
        'or its GPUs are gone; "" keeps none. Suggested: "/etc/cdi/nri-gpu.json".\n'
        "Its folder must be root's alone. Another spec of kind nvidia.com/gpu in the same\n"
        "folder (NVIDIA's nvidia-cdi-refresh writes /var/run/cdi/nvidia.yaml) would make\n"
        "the CDI cache drop both: then none is written (ours is removed) and the log says\n"
        "why. In /etc/cdi a /var/run/cdi spec of that kind wins, and the log says so.",
    ),
    Option(
        "cdi",
        "hook_path",
        '""',
        'Absolute path of the nri-gpu-hook the spec names; "" for the one beside this nri-gpu.',
    ),
    Option(
        "cdi",
        "allow_untrusted_hook",
        "false",
        "Write the spec even when users other than root can change its hook.\n"
        "Security: the hook runs as root at every GPU container start; tests only.",
    ),
)

TABLES = ("plugin", "engine", "policy", "cdi")
_TABLE_DOCS = {
    "plugin": "How the plugin reaches the runtime. Flags (--socket, --name, --index, --log-level, --log-format, --metrics-address) override these.",
    "engine": "Where the node's files are. Flags --driver-root, --dev-root, --proc-root override these.",
    "policy": "Who may ask for GPUs, and how.",
    "cdi": "The CDI spec nri-gpu run keeps current. The flag --cdi-spec overrides spec.",
}

HEADER = (
    "# nri-gpu configuration (TOML), as printed by `nri-gpu config default`.\n"
    "# Every key is optional and shows its default. Unknown keys and wrong types are\n"
    "# refused at start with the key named. Use: nri-gpu run --config FILE\n"
)


def _comment(text: str) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in text.splitlines())


def default_config() -> str:
    """The annotated default config file."""
    parts = [HEADER]
    for table in TABLES:
        parts.append(f"\n[{table}]\n")
        parts.append(_comment(_TABLE_DOCS[table]))
        for option in OPTIONS:
            if option.table == table:
                parts.append("\n" + _comment(option.doc) + f"{option.key} = {option.default}\n")
    return "".join(parts)
