"""Build the plugin's own image, ``localhost/nri-gpu/nri-gpu:dev``, offline.

What a DaemonSet runs: Debian bookworm's Python 3.11 run time from its .debs, glibc
(with the static ``/sbin/ldconfig`` the plugin runs for GPU containers, engine.ldconfig's
default), busybox for a shell, the pure-Python wheels of ``protobuf``, ``prometheus_client``
and ``tomlkit`` and the project's ``plugin`` and ``engine`` folders as the ``nri_gpu.plugin`` and ``nri_gpu.engine`` packages under ``/opt/nri-gpu/nri_gpu``. The
entrypoint is ``python3.11 -m nri_gpu.plugin.cli run``.

Python's .debs are taken whole except for what a daemon never imports (the test
suite, idlelib, tkinter, lib2to3, ensurepip, the C extension test modules). Only the
shared libraries the interpreter and the extension modules we import need are added:
libffi8 (ctypes), zlib1g (the interpreter, zlib), libexpat1 (the interpreter), libssl3
(ssl, which prometheus_client's exposition module imports unconditionally: without it
``import prometheus_client``, and so ``nri-gpu run``, fails; about 6 MB).

What goes in is verified and current (hack/testbed/image_debs.py): each .deb is the
newest of its release, ``-updates`` and ``-security`` (security fixes come in at the
next build), from Release files signed by Debian's keyring and not expired, and
checked against the signed index's SHA256. The wheels are exactly those pinned by
version and SHA256 in ``deploy/image-requirements.txt`` (``pip download
--require-hashes``; ``--pin-wheels`` rewrites that file from the versions installed
next to the tests), py3-none-any only, so nothing in the image is built for a host.
The image tar is cached under ``<cache>/images/`` keyed by content: every .deb's
SHA256, every wheel's bytes, every project file's bytes. ``hack/build-image`` writes it
for operators, with ``FILE.manifest.txt`` beside it: every package, version, suite and
hash that went in.

Run as a module to write the archive (``hack/build-image`` does, with ``hack/`` on
``PYTHONPATH``): ``python -m testbed.plugin_image [--output FILE] [--pin-wheels]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import image_debs
from .cache import cache_dir, locked
from .image_debs import Deb
from .images import _BUSYBOX_DEB, _LIBC_DEBS, _PATH, Image, _applets, _base_layer, _cached_build, _Layer, _write_layout

__all__ = ["IMAGE", "INSTALL_DIR", "plugin_image", "source_files"]

IMAGE = "localhost/nri-gpu/nri-gpu:dev"
INSTALL_DIR = "/opt/nri-gpu"
SITE_PACKAGES = "usr/lib/python3/dist-packages"  # on Debian's sys.path by site.py
ROOT = Path(__file__).resolve().parents[2]  # the checkout
PACKAGES = ("plugin", "engine")
WHEELS = ("protobuf", "prometheus_client", "tomlkit")  # pyproject.toml's dependencies, in its order
WHEEL_PINS = ROOT / "deploy" / "image-requirements.txt"

_SUITE = "bookworm"
_PYTHON_DEBS = (
    ("python3.11-minimal", _SUITE, "3.11.2-*"),
    ("libpython3.11-minimal", _SUITE, "3.11.2-*"),
    ("libpython3.11-stdlib", _SUITE, "3.11.2-*"),
    ("libffi8", _SUITE, "3.4.4-*"),
    ("zlib1g", _SUITE, "1:1.2.13.*"),
    ("libexpat1", _SUITE, "2.5.0-*"),
    ("libssl3", _SUITE, "3.0.*"),
)
_STDLIB = "usr/lib/python3.11/"
# Never imported by a daemon: left out to keep the image small.
_SKIP_PREFIXES = (
    "usr/share/doc",
    "usr/share/lintian",
    "usr/share/man",
    "usr/share/binfmts",
    "usr/share/applications",
    "usr/share/pixmaps",
    *(
        _STDLIB + sub
        for sub in (
            "test/",
            "idlelib/",
            "tkinter/",
            "lib2to3/",
            "ensurepip/",
            "pydoc_data/",
            "turtledemo/",
            "unittest/test/",
            "distutils/tests/",
            "ctypes/test/",
            "sqlite3/test/",
        )
    ),
)
_SKIP_NAMES = ("_test", "xxlimited", "_xxtestfuzz", "_ctypes_test")


def source_files() -> list[Path]:
    """The project files the image carries: every file of ``plugin`` and ``engine``
    except bytecode, sorted."""
    files = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append(path)
    return files


def _skipped(rel: str) -> bool:
    if rel.startswith(_SKIP_PREFIXES) or any(rel + "/" == p for p in _SKIP_PREFIXES):
        return True
    name = rel.rpartition("/")[2]
    return rel.startswith(_STDLIB + "lib-dynload/") and name.startswith(_SKIP_NAMES)


def _add_tree(layer: _Layer, root: Path) -> None:
    """Add an unpacked package's files, links and directories, leaving out _SKIP_*."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if _skipped(rel):
            continue
        if path.is_symlink():
            layer.symlink(rel, str(path.readlink()))
        elif path.is_dir():
            layer.dir(rel)
        else:
            layer.file(rel, path.read_bytes(), path.stat().st_mode & 0o7777)


def _debs() -> list[Deb]:
    """busybox, glibc and Python's run time: verified and current (image_debs)."""
    return image_debs.fetch([_BUSYBOX_DEB, *_LIBC_DEBS, *_PYTHON_DEBS])


_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+) --hash=sha256:([0-9a-f]{64})$")


def wheel_pins(text: str | None = None) -> dict[str, tuple[str, str]]:
    """name -> (version, SHA256) from deploy/image-requirements.txt."""
    pins = {}
    for line in (WHEEL_PINS.read_text() if text is None else text).splitlines():
        if line.strip() and not line.startswith("#"):
            match = _PIN.match(line.strip())
            if not match:
                raise ValueError(f"{WHEEL_PINS.name}: not NAME==VERSION --hash=sha256:HEX: {line!r}")
            pins[match.group(1)] = (match.group(2), match.group(3))
    return pins


def _pip_download(dest: Path, args: list[str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        "any",
        "--implementation",
        "py",
        "--abi",
        "none",
        "--python-version",
        "3.11",
        "--cache-dir",
        str(cache_dir() / "pip"),
        "--dest",
        str(dest),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed:\n{proc.stderr[-3000:]}")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheels() -> list[Path]:
    """The pinned wheels, from ``<cache>/wheels`` or fetched with ``--require-hashes``;
    a cached file is used only if its bytes have the pinned hash."""
    store = cache_dir() / "wheels"
    pins = wheel_pins()

    def find() -> list[Path]:
        found = []
        for name, (version, digest) in pins.items():
            path = store / f"{name}-{version}-py3-none-any.whl"
            if path.is_file() and _sha256(path) == digest:
                found.append(path)
        return found

    with locked(cache_dir() / ".wheels.lock"):
        if len(find()) < len(pins):
            store.mkdir(parents=True, exist_ok=True)
            for name in pins:  # pip keeps a file whose name matches, whatever its bytes
                path = store / f"{name}-{pins[name][0]}-py3-none-any.whl"
                if path.is_file() and _sha256(path) != pins[name][1]:
                    path.unlink()
            _pip_download(store, ["--require-hashes", "-r", str(WHEEL_PINS)])
        found = find()
    if len(found) < len(pins):
        raise RuntimeError(f"no py3-none-any wheels with the hashes of {WHEEL_PINS} in {store}")
    return found


def pin_wheels() -> str:
    """Rewrite deploy/image-requirements.txt: the versions installed next to the tests,
    with the SHA256 of the py3-none-any wheels pip fetches for them. Returns the text."""
    versions = {name: importlib.metadata.version(name) for name in WHEELS}
    lines = [
        "# The plugin image's wheels, pinned by version and SHA256: hack/build-image and",
        "# deploy/Dockerfile fetch them with pip --require-hashes. Written by",
        "# `hack/build-image --pin-wheels` from the versions installed next to the tests",
        "# (tests/unit/test_deploy.py checks they agree).",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        _pip_download(Path(tmp), [f"{name}=={version}" for name, version in versions.items()])
        for name, version in versions.items():
            (wheel,) = Path(tmp).glob(f"{name}-{version}-py3-none-any.whl")
            lines.append(f"{name}=={version} --hash=sha256:{_sha256(wheel)}")
    text = "\n".join(lines) + "\n"
    WHEEL_PINS.write_text(text)
    return text


def _add_wheel(layer: _Layer, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            layer.file(f"{SITE_PACKAGES}/{info.filename}", zf.read(info), 0o644)


def _build_layer(debs: list[Deb], wheels: list[Path]) -> _Layer:
    busybox = debs[0].tree / "usr/bin/busybox"
    layer = _base_layer(busybox.read_bytes(), _applets(busybox))
    for deb in debs[1:]:
        _add_tree(layer, deb.tree)
    layer.file("etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
    layer.symlink("usr/bin/python3", "python3.11")
    for wheel in wheels:
        _add_wheel(layer, wheel)
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        layer.file(f"{INSTALL_DIR}/nri_gpu/{rel}", path.read_bytes(), 0o644)
    layer.dir("var/run/nri")
    return layer


def _sources_digest() -> tuple[int, str]:
    digest = hashlib.sha256()
    files = source_files()
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return len(files), digest.hexdigest()


def manifest_text(image: Image, debs: list[Deb], wheels: list[Path]) -> str:
    """What went into ``image``, one line per thing: written beside the archive."""
    pins = wheel_pins()
    count, digest = _sources_digest()
    lines = [
        f"# {image.name} {image.manifest_digest}",
        "# kind name version source sha256 (.debs: as Debian's signed index states it)",
    ]
    lines += [f"deb {d.package} {d.version} debian:{d.suite} sha256:{d.sha256}" for d in debs]
    for wheel in wheels:
        name = wheel.name.split("-")[0]
        version, sha = pins[name]
        lines.append(f"wheel {name} {version} pypi sha256:{sha}")
    lines.append(f"files {'+'.join(PACKAGES)} {count}-files checkout sha256:{digest}")
    return "\n".join(lines) + "\n"


CONFIG = {
    "Env": [_PATH, f"PYTHONPATH={INSTALL_DIR}", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"],
    "Entrypoint": ["python3.11", "-m", "nri_gpu.plugin.cli", "run"],
    "WorkingDir": INSTALL_DIR,
    "Labels": {"org.opencontainers.image.title": "nri-gpu"},
}


def _build() -> tuple[Image, list[Deb], list[Path]]:
    debs = _debs()
    wheels = _wheels()
    key = [
        Path(__file__).read_bytes(),
        Path(image_debs.__file__).read_bytes(),
        *(f"{d.package}={d.version} sha256:{d.sha256}".encode() for d in debs),
        *(w.read_bytes() for w in wheels),
    ]
    for path in source_files():
        key += [path.relative_to(ROOT).as_posix().encode(), path.read_bytes()]

    def build(out: Path) -> tuple[str, str]:
        return IMAGE, _write_layout(out, IMAGE, _build_layer(debs, wheels), dict(CONFIG))

    return _cached_build("nri-gpu", key, build), debs, wheels


def plugin_image() -> Image:
    """Return the plugin image tar, building it when an input changed."""
    return _build()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build-image", description=f"Write the OCI archive of {IMAGE}.")
    parser.add_argument(
        "--output",
        metavar="FILE",
        type=Path,
        default=Path("nri-gpu-image.tar"),
        help="where to write the OCI image-layout tar (default nri-gpu-image.tar), and"
        " FILE.manifest.txt beside it; - for stdout (the manifest goes to stderr)",
    )
    parser.add_argument(
        "--pin-wheels",
        action="store_true",
        help=f"first rewrite {WHEEL_PINS.relative_to(ROOT)} from the installed versions",
    )
    args = parser.parse_args(argv)
    if args.pin_wheels:
        print(pin_wheels(), end="", file=sys.stderr)
    image, debs, wheels = _build()
    manifest = manifest_text(image, debs, wheels)
    if str(args.output) == "-":
        with open(image.tar, "rb") as src:
            shutil.copyfileobj(src, sys.stdout.buffer)
        print(manifest, end="", file=sys.stderr)
    else:
        shutil.copyfile(image.tar, args.output)
        listing = args.output.with_name(args.output.name + ".manifest.txt")
        listing.write_text(manifest)
        size = args.output.stat().st_size
        print(manifest, end="")
        print(f"{IMAGE} ({image.manifest_digest}, {size / 2**20:.1f} MiB) -> {args.output}, {listing}")
        print(f"import with: ctr -n k8s.io images import {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
