"""Hostile container images: one per class of the NVIDIA container toolkit's escape CVEs.

Each image is the glibc test image (busybox, Debian's libc6 and libc-bin) with one
trap laid for a privileged helper that prepares a GPU container:

===============  =========================================================================
case             trap (``B`` is the bait root, a HOST path, by default ``/tmp/nri-gpu-bait``)
===============  =========================================================================
``ldcache``      ``/etc/ld.so.cache -> B/ld.so.cache`` (CVE-2025-23267: ldconfig writing
                 through a link). Nothing is at ``B`` inside the image: the link dangles
                 there.
``confdir``      ``/etc/ld.so.conf.d -> B/ld.so.conf.d`` (CVE-2025-23267, CVE-2024-0133).
                 The image has its own ``B/ld.so.conf.d`` holding libc6's conf files, so a
                 helper that resolves the link inside the container root writes there.
``relconfdir``   ``/etc/ld.so.conf.d -> ../../../../../../../..B/ld.so.conf.d``: the same
                 escape with ``..`` instead of an absolute target; dangling inside.
``libdir``       ``/usr/lib/x86_64-linux-gnu -> B/lib`` (CVE-2024-0134: driver symlinks
                 created through an image link). libc6's files there are dropped.
``compat``       ``/usr/local/cuda/compat -> B/compat`` (CVE-2024-0132, CVE-2025-23359,
                 the compat folder that ``nvc`` globbed). The image also has a real
                 ``B/compat/libcuda.so.999.1`` (an ELF), so adding the compat folder to
                 the loader's path, even resolved inside the root, shows in ``ldconfig -p``.
``preload``      Image env ``LD_PRELOAD=/lib/libmark.so:/proc/self/cwd/lib/libmark.so``
                 and ``LD_LIBRARY_PATH=/evil`` plus ``NVIDIA_DRIVER_CAPABILITIES``
                 (CVE-2025-23266 "NVIDIAScape", the hook that inherited the image env).
                 ``libmark.so`` (built with gcc, no libc) appends ``<pid> <exe name>`` to
                 ``/tmp/preload-marks`` and to ``B/preload-marks`` of whatever root it runs
                 in: the second exists only on the host, so a mark there is an escape.
                 ``/evil`` holds copies of it named ``libcuda.so.1`` and
                 ``libnvidia-ml.so.1``.
``magicconf``    ``/etc/ld.so.conf.d -> /proc/self/root/B/ld.so.conf.d`` (magic link).
``magiclib``     ``/usr/lib/x86_64-linux-gnu -> /proc/1/root/B/lib`` (magic link).
``magiccache``   ``/etc/ld.so.cache -> /proc/1/cwd/B/ld.so.cache`` (magic link).
``etc``          ``/etc -> B/etc``; the image's /etc content lives at ``B/etc`` inside it,
                 so the container works when the link is resolved inside its root.
``soname``       No link at all: runs as ``nobody`` (image ``User``), and its
                 ``/etc/ld.so.conf.d/zz-evil.conf`` names ``/opt/evil``, where
                 ``libevil.so.1.0`` (gcc) has the SONAME ``../../data/planted``. glibc's
                 ldconfig makes the SONAME link ``<dir>/<soname>`` without checking for
                 ``/``: run with root's rights it plants ``/data/planted`` in whatever is
                 mounted at ``/data`` (the test mounts a root-owned host folder there,
                 which ``nobody`` cannot write).
``confvolume``   Also as ``nobody``: ``/etc/ld.so.conf.d -> /data``, the same root-owned
                 volume. Resolved inside the root, the link leads into the volume (think
                 of a hostPath of the node's own ld.so.conf.d): a writer with root's
                 rights puts ``00-nri-gpu.conf`` in a host folder the container cannot
                 write.
===============  =========================================================================

Cases of ``POD_CASES`` (tests/e2e/test_hostile_pod_start.py) lay no host bait; they
plant special files where the start work writes:

===============  =========================================================================
``devnodes``     Character devices ``c 1 3`` (``/dev/null``'s numbers: harmless, but an
                 open of one is an open of a device) at
                 ``/etc/ld.so.conf.d/00-nri-gpu.conf`` and ``/etc/ld.so.cache``.
``fifos``        FIFOs at the same two places: an open that waits would hang the start.
``cachevolume``  ``/etc/ld.so.cache -> /data/ld.so.cache``: into a volume a sidecar
                 writes, where the file is swapped between a regular file, a FIFO and
                 a device node.
===============  =========================================================================

The bait root is baked into the links, so the default is a FIXED path that tests
re-create fresh for every run: the images then stay cached like the others (under
``<cache>/images/hostile_<case>-<key>.tar``, key = inputs plus this file).
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from .images import _PATH, Image, _cached_build, _Layer, _write_layout, glibc_key, glibc_layer

__all__ = [
    "BAIT_ROOT",
    "CASES",
    "POD_CASES",
    "PRELOAD_COMMAND",
    "SONAME_TARGET",
    "VOLUME",
    "hostile_image",
    "image_name",
    "needs_gcc",
]

BAIT_ROOT = "/tmp/nri-gpu-bait"
LIBDIR = "usr/lib/x86_64-linux-gnu"
# The command the preload image's container runs: getconf is the image's one dynamic
# program (busybox is static), so its mark proves that the preload works.
PRELOAD_COMMAND = ["sh", "-c", "getconf PAGESIZE >/dev/null; exec sleep 3600"]

_MARK_C = r"""
/* LD_PRELOAD marker for hack/testbed/hostile.py. No libc: it loads into any dynamic
   process, whatever its glibc. Appends "<pid> <basename of /proc/self/exe>\n". */
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}

static void append(const char *path, const char *line, long len) {
    long fd = sys3(2 /* open */, (long)path, 02000 | 0100 | 01 /* O_APPEND|O_CREAT|O_WRONLY */, 0666);
    if (fd < 0)
        return;
    sys3(1 /* write */, fd, (long)line, len);
    sys3(3 /* close */, fd, 0, 0);
}

__attribute__((constructor)) static void mark(void) {
    char exe[256], digits[24], line[320];
    long n = sys3(89 /* readlink */, (long)"/proc/self/exe", (long)exe, sizeof exe - 1);
    long base = 0, len = 0, pid = sys3(39 /* getpid */, 0, 0, 0);
    int d = 0;
    if (n <= 0) {
        exe[0] = '?';
        n = 1;
    }
    for (long i = 0; i < n; i++)
        if (exe[i] == '/')
            base = i + 1;
    do {
        digits[d++] = (char)('0' + pid % 10);
        pid /= 10;
    } while (pid > 0);
    while (d > 0)
        line[len++] = digits[--d];
    line[len++] = ' ';
    for (long i = base; i < n; i++)
        line[len++] = exe[i];
    line[len++] = '\n';
    append("/tmp/preload-marks", line, len);
    append(BAIT_MARKS, line, len);
}
"""

CASES = (
    "ldcache",
    "confdir",
    "relconfdir",
    "libdir",
    "compat",
    "preload",
    "magicconf",
    "magiclib",
    "magiccache",
    "etc",
    "soname",
    "confvolume",
)
POD_CASES = ("devnodes", "fifos", "cachevolume")
# Where the start work writes, and the pod cases plant special files.
SPECIAL_PATHS = ("etc/ld.so.conf.d/00-nri-gpu.conf", "etc/ld.so.cache")
# The soname and confvolume images run as nobody and expect a volume at /data.
VOLUME = "/data"
SONAME_TARGET = f"{VOLUME}/planted"  # where the soname case's link would land


def image_name(case: str) -> str:
    return f"localhost/nri-gpu/hostile-{case}:1"


def needs_gcc(case: str) -> bool:
    return case in ("preload", "soname")


def _drop(layer: _Layer, path: str) -> None:
    """Remove ``path`` and everything under it from the layer."""
    path = path.strip("/")
    for key in [k for k in layer.entries if k == path or k.startswith(path + "/")]:
        del layer.entries[key]


def _move(layer: _Layer, src: str, dst: str) -> None:
    """Move ``src`` and everything under it to ``dst`` (parents of ``dst`` created)."""
    src, dst = src.strip("/"), dst.strip("/")
    moved = {k: v for k, v in layer.entries.items() if k == src or k.startswith(src + "/")}
    _drop(layer, src)
    layer.dir(dst.rpartition("/")[0])
    for key, (info, data) in sorted(moved.items()):
        new = dst + key[len(src) :]
        info.name = new
        layer.entries[new] = (info, data)


def _special(layer: _Layer, path: str, kind: bytes) -> None:
    """A FIFO, or a character device with /dev/null's numbers, at ``path``."""
    layer.dir(path.strip("/").rpartition("/")[0])
    info = tarfile.TarInfo(path.strip("/"))
    info.type, info.mode, info.mtime, info.uid, info.gid = kind, 0o666, 0, 0, 0
    info.uname = info.gname = "root"
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    layer.entries[path.strip("/")] = (info, None)


def _gcc(source: str, *flags: str) -> bytes:
    """Compile ``source`` into a shared object without libc; its bytes."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("this hostile image needs gcc")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "lib.c", Path(tmp) / "lib.so"
        src.write_text(source)
        cmd = [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-s",
            "-nostdlib",
            "-ffreestanding",
            "-fno-stack-protector",
            "-Wl,--build-id=none",
            *flags,
            "-o",
            str(out),
            str(src),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"gcc failed:\n{proc.stderr}")
        return out.read_bytes()


def _compile_mark(bait_root: str) -> bytes:
    return _gcc(_MARK_C, "-Wl,-soname,libmark.so", f'-DBAIT_MARKS="{bait_root}/preload-marks"')


def _trap(case: str, layer: _Layer, bait: str, env: list[str], user: list[str]) -> None:
    """Lay the trap of ``case`` into the glibc layer (see the module docstring)."""
    b = bait.strip("/")
    if case == "ldcache":
        layer.symlink("etc/ld.so.cache", f"{bait}/ld.so.cache")
    elif case == "confdir":
        _move(layer, "etc/ld.so.conf.d", f"{b}/ld.so.conf.d")
        layer.symlink("etc/ld.so.conf.d", f"{bait}/ld.so.conf.d")
    elif case == "relconfdir":
        _drop(layer, "etc/ld.so.conf.d")
        layer.symlink("etc/ld.so.conf.d", "../" * 8 + f"{b}/ld.so.conf.d")
    elif case == "libdir":
        _drop(layer, LIBDIR)
        layer.symlink(LIBDIR, f"{bait}/lib")
    elif case == "compat":
        elf = layer.entries["lib/x86_64-linux-gnu/libBrokenLocale.so.1"][1]
        assert elf is not None
        layer.file(f"{b}/compat/libcuda.so.999.1", elf, 0o755)
        layer.symlink(f"{b}/compat/libcuda.so.1", "libcuda.so.999.1")
        layer.symlink("usr/local/cuda/compat", f"{bait}/compat")
    elif case == "preload":
        mark = _compile_mark(bait)
        layer.file("lib/libmark.so", mark, 0o755)
        layer.file("evil/libcuda.so.1", mark, 0o755)
        layer.file("evil/libnvidia-ml.so.1", mark, 0o755)
        env += [
            "LD_PRELOAD=/lib/libmark.so:/proc/self/cwd/lib/libmark.so",
            "LD_LIBRARY_PATH=/evil",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        ]
    elif case == "magicconf":
        _drop(layer, "etc/ld.so.conf.d")
        layer.symlink("etc/ld.so.conf.d", f"/proc/self/root{bait}/ld.so.conf.d")
    elif case == "magiclib":
        _drop(layer, LIBDIR)
        layer.symlink(LIBDIR, f"/proc/1/root{bait}/lib")
    elif case == "magiccache":
        layer.symlink("etc/ld.so.cache", f"/proc/1/cwd{bait}/ld.so.cache")
    elif case == "etc":
        _move(layer, "etc", f"{b}/etc")
        layer.symlink("etc", f"{bait}/etc")
    elif case == "soname":
        soname = "../.." + SONAME_TARGET  # from /opt/evil
        layer.file("opt/evil/libevil.so.1.0", _gcc("int nri_gpu_evil;\n", f"-Wl,-soname,{soname}"), 0o755)
        layer.file("etc/ld.so.conf.d/zz-evil.conf", b"/opt/evil\n")
        layer.dir(VOLUME)
        user.append("65534:65534")
    elif case == "confvolume":
        _drop(layer, "etc/ld.so.conf.d")
        layer.symlink("etc/ld.so.conf.d", VOLUME)
        layer.dir(VOLUME)
        user.append("65534:65534")
    elif case in ("devnodes", "fifos"):
        for path in SPECIAL_PATHS:
            _drop(layer, path)
            _special(layer, path, tarfile.CHRTYPE if case == "devnodes" else tarfile.FIFOTYPE)
    elif case == "cachevolume":
        _drop(layer, "etc/ld.so.cache")
        layer.symlink("etc/ld.so.cache", f"{VOLUME}/ld.so.cache")
        layer.dir(VOLUME)
    else:
        raise ValueError(f"unknown hostile image case {case!r}; known: {', '.join(CASES + POD_CASES)}")


def hostile_image(case: str, bait_root: str = BAIT_ROOT) -> Image:
    """Return the hostile image of ``case`` with links into ``bait_root`` (an absolute
    host path), building it on first use."""
    if case not in CASES + POD_CASES:
        raise ValueError(f"unknown hostile image case {case!r}; known: {', '.join(CASES + POD_CASES)}")
    if not bait_root.startswith("/") or bait_root.rstrip("/") != bait_root or "//" in bait_root:
        raise ValueError(f"bait root must be a normalized absolute path: {bait_root!r}")
    name = image_name(case)
    key = [Path(__file__).read_bytes(), case.encode(), bait_root.encode(), *glibc_key()]
    if needs_gcc(case):
        gcc = shutil.which("gcc")
        key.append(subprocess.run([gcc, "--version"], capture_output=True).stdout if gcc else b"no gcc")

    def build(out: Path) -> tuple[str, str]:
        layer = glibc_layer()
        env: list[str] = [_PATH]
        user: list[str] = []  # the image's User, if the case sets one
        _trap(case, layer, bait_root, env, user)
        config: dict[str, object] = {"Env": env, "Cmd": ["sh"], "WorkingDir": "/"}
        if user:
            config["User"] = user[0]
        return name, _write_layout(out, name, layer, config)

    return _cached_build(f"hostile_{case}", key, build)
