"""Build the test bed's two container images offline, byte for byte reproducibly.

No registry is reachable from CI and there is no image tool in bookworm worth
depending on, so the images are written here as OCI image-layout tar files
(https://github.com/opencontainers/image-spec/blob/main/image-layout.md):

    oci-layout, index.json, blobs/sha256/<layer .tar.gz | config | manifest>

Every tar entry has mtime 0 and uid/gid 0, gzip has mtime 0 and no name, JSON is
written with sorted keys: the same inputs give the same digests on every machine.
``index.json`` names the image with ``io.containerd.image.name`` (what ``ctr images
import`` uses) and ``org.opencontainers.image.ref.name`` (the tag, per the spec).

* ``localhost/nri-gpu/busybox:1``: Debian's static busybox with every applet link,
  /etc/passwd, /etc/group and a sticky /tmp.
* ``localhost/nri-gpu/pause:1``: the sandbox image, ``pause.c`` built with
  ``gcc -static`` (without gcc: a busybox shell loop that exits on TERM).

Built tars are cached under ``<cache>/images/`` keyed by a hash of their inputs.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import debs
from .cache import cache_dir, locked

if TYPE_CHECKING:
    from .containerd import Containerd

__all__ = ["BUSYBOX", "PAUSE", "Image", "build_all", "busybox_image", "import_all", "import_image", "pause_image"]

BUSYBOX = "localhost/nri-gpu/busybox:1"
PAUSE = "localhost/nri-gpu/pause:1"
# busybox plus Debian's glibc (libc.so.6, ld.so, ldconfig): what a CUDA base image
# gives a GPU container, so nvidia-smi can run and ``ldconfig -p`` can be read.
GLIBC = "localhost/nri-gpu/glibc:1"
_LIBC_DEBS = (("libc6", "bookworm", "2.36-*"), ("libc-bin", "bookworm", "2.36-*"))  # libc-bin has ldconfig
_BUSYBOX_DEB = ("busybox-static", "trixie", "1:1.37.0-*")
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PAUSE_C = Path(__file__).with_name("pause.c")


@dataclass(frozen=True)
class Image:
    name: str  # full reference, e.g. localhost/nri-gpu/busybox:1
    tar: Path  # OCI image-layout tar
    manifest_digest: str


@dataclass
class _Layer:
    """One image layer under construction: an in-memory tar of (path -> entry)."""

    entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = field(default_factory=dict)

    def _info(self, path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(path.strip("/"))
        info.type, info.mode, info.mtime = kind, mode, 0
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    def dir(self, path: str, mode: int = 0o755) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):  # parents first, as a real rootfs has them
            sub = "/".join(parts[:i])
            if sub not in self.entries or i == len(parts):
                self.entries[sub] = (self._info(sub, tarfile.DIRTYPE, mode if i == len(parts) else 0o755), None)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._parents(path)
        info = self._info(path, tarfile.REGTYPE, mode)
        info.size = len(data)
        self.entries[path.strip("/")] = (info, data)

    def symlink(self, path: str, target: str) -> None:
        self._parents(path)
        info = self._info(path, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self.entries[path.strip("/")] = (info, None)

    def _parents(self, path: str) -> None:
        parent = path.strip("/").rpartition("/")[0]
        if parent and parent not in self.entries:
            self.dir(parent)

    def tar_bytes(self) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.entries):
                info, data = self.entries[path]
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _write_layout(out: Path, name: str, layer: _Layer, config: dict[str, object]) -> str:
    """Write the OCI image-layout tar of a one-layer image; return the manifest digest."""
    raw = layer.tar_bytes()
    gz = gzip.compress(raw, compresslevel=6, mtime=0)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [_sha(raw)]},
        "history": [{"created_by": "nri-gpu hack/testbed/images.py"}],
    }
    config_blob = _json(image_config)
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha(config_blob),
                "size": len(config_blob),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": _sha(gz), "size": len(gz)}
            ],
        }
    )
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _sha(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                    },
                }
            ],
        }
    )
    outer = _Layer()
    outer.file("oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
    outer.file("index.json", index)
    for blob in (gz, config_blob, manifest):
        outer.file(f"blobs/sha256/{_sha(blob)[7:]}", blob)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    tmp.write_bytes(outer.tar_bytes())
    os.replace(tmp, out)  # atomic: a concurrent reader sees the old tar or the new one
    return _sha(manifest)


def _cached_build(stem: str, key_parts: list[bytes], build: Callable[[Path], tuple[str, str]]) -> Image:
    """Return the image built by ``build(tar) -> (name, manifest digest)``, reusing the
    tar whose key (hash of this module, ``key_parts``) matches."""
    key = hashlib.sha256(b"\0".join([Path(__file__).read_bytes(), *key_parts])).hexdigest()[:16]
    images = cache_dir() / "images"
    images.mkdir(parents=True, exist_ok=True)
    tar, meta = images / f"{stem}-{key}.tar", images / f"{stem}-{key}.json"
    with locked(images / f".{stem}.lock"):
        if not (tar.is_file() and meta.is_file()):
            name, digest = build(tar)
            meta.write_text(json.dumps({"name": name, "digest": digest}))
            for old in images.glob(f"{stem}-*"):  # builds of older inputs
                if old not in (tar, meta):
                    old.unlink(missing_ok=True)
    info = json.loads(meta.read_text())
    return Image(name=info["name"], tar=tar, manifest_digest=info["digest"])


def _busybox_binary() -> Path:
    return debs.extract(*_BUSYBOX_DEB) / "usr/bin/busybox"


def _base_layer(busybox: bytes, applets: list[str]) -> _Layer:
    layer = _Layer()
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "etc", "var", "run", "home"):
        layer.dir(d)
    layer.dir("tmp", 0o1777)
    layer.dir("root", 0o700)
    layer.file("bin/busybox", busybox, 0o755)
    for applet in applets:
        if applet != "bin/busybox":
            layer.symlink(applet, "/bin/busybox")
    layer.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
    layer.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    return layer


def _applets(busybox: Path) -> list[str]:
    # The static binary runs on the host; its own list is the authority on its applets.
    out = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout
    return sorted(line.strip() for line in out.splitlines() if line.strip())


def busybox_image() -> Image:
    """Return the busybox image tar, building it on first use."""
    busybox = _busybox_binary()

    def build(out: Path) -> tuple[str, str]:
        layer = _base_layer(busybox.read_bytes(), _applets(busybox))
        return BUSYBOX, _write_layout(out, BUSYBOX, layer, {"Env": [_PATH], "Cmd": ["sh"], "WorkingDir": "/"})

    return _cached_build("busybox", [busybox.read_bytes()], build)


def _compile_pause(out: Path) -> bool:
    gcc = shutil.which("gcc")
    if gcc is None:
        return False
    proc = subprocess.run([gcc, "-static", "-O2", "-s", "-o", str(out), str(_PAUSE_C)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc -static pause.c failed (is libc6-dev installed?):\n{proc.stderr}")
    return True


def pause_image() -> Image:
    """Return the pause image tar, building it on first use."""
    gcc = shutil.which("gcc") or ""
    gcc_version = subprocess.run([gcc, "--version"], capture_output=True).stdout if gcc else b"no gcc"

    def build(out: Path) -> tuple[str, str]:
        layer = _Layer()
        for d in ("dev", "proc", "sys", "etc"):  # mount points runc would create anyway
            layer.dir(d)
        with tempfile.TemporaryDirectory() as tmp:
            binary = Path(tmp) / "pause"
            if _compile_pause(binary):
                layer.file("pause", binary.read_bytes(), 0o755)
                entry = ["/pause"]
            else:
                # No compiler: a busybox shell that exits 0 on TERM. It does not reap
                # zombies, which host-network pods without a shared pid ns never make.
                busybox = _busybox_binary()
                layer = _base_layer(busybox.read_bytes(), ["bin/sh", "bin/sleep"])
                entry = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
        return PAUSE, _write_layout(out, PAUSE, layer, {"Env": [_PATH], "Entrypoint": entry, "WorkingDir": "/"})

    key = [_PAUSE_C.read_bytes(), gcc_version]
    if not gcc:
        key.append(_busybox_binary().read_bytes())
    return _cached_build("pause", key, build)


def _add_tree(layer: _Layer, root: Path) -> None:
    """Add an unpacked package's files and links (documentation left out)."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("usr/share/doc", "usr/share/lintian", "usr/share/man")):
            continue
        if path.is_symlink():
            layer.symlink(rel, os.readlink(path))
        elif path.is_dir():
            layer.dir(rel)
        else:
            layer.file(rel, path.read_bytes(), path.stat().st_mode & 0o7777)


def glibc_key() -> list[bytes]:
    """Cache key parts of the glibc image's inputs (for images derived from it)."""
    return [_busybox_binary().read_bytes(), *(str(debs.extract(*deb)).encode() for deb in _LIBC_DEBS)]


def glibc_layer() -> _Layer:
    """The glibc image's layer: the base of images derived from it (hack/testbed/hostile.py)."""
    busybox = _busybox_binary()
    layer = _base_layer(busybox.read_bytes(), _applets(busybox))
    for deb in _LIBC_DEBS:
        _add_tree(layer, debs.extract(*deb))
    layer.file("etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
    return layer


def glibc_image() -> Image:
    """busybox + Debian's libc6: a minimal image with a dynamic loader and ldconfig."""

    def build(out: Path) -> tuple[str, str]:
        return GLIBC, _write_layout(out, GLIBC, glibc_layer(), {"Env": [_PATH], "Cmd": ["sh"], "WorkingDir": "/"})

    return _cached_build("glibc", glibc_key(), build)


def build_all() -> list[Image]:
    """Build (or take from the cache) every image the test bed uses."""
    return [busybox_image(), pause_image(), glibc_image()]


def import_image(ctrd: Containerd, image: Image, namespace: str = "k8s.io") -> None:
    """Import ``image`` into ``ctrd`` with ``ctr images import`` (and unpack it for the
    configured snapshotter, so the first container does not pay for it).

    ``k8s.io`` is the namespace CRI uses; ``ctr run`` tests need ``default`` too, as
    images are per namespace. Raises RuntimeError with ctr's output on failure.
    """
    ctrd.ctr("-n", namespace, "images", "import", "--snapshotter", "overlayfs", str(image.tar))


def import_all(ctrd: Containerd, namespace: str = "k8s.io") -> list[Image]:
    images = build_all()
    for image in images:
        import_image(ctrd, image, namespace)
    return images
