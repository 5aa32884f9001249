"""Build the plugin's own image, ``localhost/nri-gpu/nri-gpu:dev``, offline.

What a DaemonSet runs: Debian bookworm's Python 3.11 run time from its .debs, glibc
(with the static ``/sbin/ldconfig`` the plugin runs for GPU containers, engine.ldconfig's
default), busybox for a shell, the pure-Python wheels of ``protobuf`` and ``tomlkit``
(the versions installed next to the tests) and the project's ``plugin`` and ``engine``
packages under ``/opt/nri-gpu``. The entrypoint is ``python3.11 -m plugin run``.

Python's .debs are taken whole except for what a daemon never imports (the test
suite, idlelib, tkinter, lib2to3, ensurepip, the C extension test modules). Only the
shared libraries the interpreter and the extension modules we import need are added:
libffi8 (ctypes), zlib1g (the interpreter, zlib), libexpat1 (the interpreter). No
OpenSSL: hashlib falls back on the interpreter's built-in hashes.

The wheels are fetched once with ``pip download --only-binary=:all: --platform any``
into ``<cache>/wheels`` (py3-none-any only, so nothing in the image is built for a
host). The image tar is cached under ``<cache>/images/`` keyed by every input,
including the bytes of the project's source files. ``hack/build-image`` writes it
for operators.

Run as a module to write the archive: ``python -m tests.testbed.plugin_image
[--output FILE]``.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from . import debs
from .cache import cache_dir, locked
from .images import _PATH, Image, _cached_build, _Layer, _write_layout, glibc_key, glibc_layer

__all__ = ["IMAGE", "INSTALL_DIR", "plugin_image", "source_files"]

IMAGE = "localhost/nri-gpu/nri-gpu:dev"
INSTALL_DIR = "/opt/nri-gpu"
SITE_PACKAGES = "usr/lib/python3/dist-packages"  # on Debian's sys.path by site.py
ROOT = Path(__file__).resolve().parents[2]  # the checkout
PACKAGES = ("plugin", "engine")
WHEELS = ("protobuf", "tomlkit")

_SUITE = "bookworm"
_PYTHON_DEBS = (
    ("python3.11-minimal", _SUITE, "3.11.2-*"),
    ("libpython3.11-minimal", _SUITE, "3.11.2-*"),
    ("libpython3.11-stdlib", _SUITE, "3.11.2-*"),
    ("libffi8", _SUITE, "3.4.4-*"),
    ("zlib1g", _SUITE, "1:1.2.13.*"),
    ("libexpat1", _SUITE, "2.5.0-*"),
)
_STDLIB = "usr/lib/python3.11/"
# Never imported by a daemon: left out to keep the image small.
_SKIP_PREFIXES = (
    "usr/share/doc", "usr/share/lintian", "usr/share/man", "usr/share/binfmts", "usr/share/applications",
    "usr/share/pixmaps",
    *(_STDLIB + sub for sub in ("test/", "idlelib/", "tkinter/", "lib2to3/", "ensurepip/", "pydoc_data/",
                                "turtledemo/", "unittest/test/", "distutils/tests/", "ctypes/test/",
                                "sqlite3/test/")),
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


def _python_trees() -> list[Path]:
    return [debs.extract(*deb) for deb in _PYTHON_DEBS]


def _wheel_versions() -> dict[str, str]:
    """The versions of the runtime dependencies installed next to the tests."""
    return {name: importlib.metadata.version(name) for name in WHEELS}


def _wheels() -> list[Path]:
    """The pure-Python wheels, from ``<cache>/wheels`` or fetched once with pip."""
    store = cache_dir() / "wheels"
    wanted = _wheel_versions()

    def find() -> list[Path]:
        found = []
        for name, version in wanted.items():
            matches = sorted(store.glob(f"{name}-{version}-py3-none-any.whl"))
            if matches:
                found.append(matches[0])
        return found

    with locked(cache_dir() / ".wheels.lock"):
        if len(find()) < len(wanted):
            store.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--platform", "any", "--implementation", "py", "--abi", "none", "--python-version", "3.11",
                   "--cache-dir", str(cache_dir() / "pip"), "--dest", str(store),
                   *(f"{name}=={version}" for name, version in wanted.items())]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"pip download of {', '.join(wanted)} failed:\n{proc.stderr[-3000:]}")
        found = find()
    if len(found) < len(wanted):
        raise RuntimeError(f"no py3-none-any wheels for {wanted} in {store}")
    return found


def _add_wheel(layer: _Layer, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if info.is_dir():
                continue
            layer.file(f"{SITE_PACKAGES}/{info.filename}", zf.read(info), 0o644)


def _build_layer(trees: list[Path], wheels: list[Path]) -> _Layer:
    layer = glibc_layer()  # busybox, libc6, libc-bin (/sbin/ldconfig)
    for tree in trees:
        _add_tree(layer, tree)
    layer.symlink("usr/bin/python3", "python3.11")
    for wheel in wheels:
        _add_wheel(layer, wheel)
    for path in source_files():
        rel = path.relative_to(ROOT).as_posix()
        layer.file(f"{INSTALL_DIR}/{rel}", path.read_bytes(), 0o644)
    layer.dir("var/run/nri")
    return layer


CONFIG = {
    "Env": [_PATH, f"PYTHONPATH={INSTALL_DIR}", "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1"],
    "Entrypoint": ["python3.11", "-m", "plugin", "run"],
    "WorkingDir": INSTALL_DIR,
    "Labels": {"org.opencontainers.image.title": "nri-gpu"},
}


def plugin_image() -> Image:
    """Return the plugin image tar, building it when an input changed."""
    trees = _python_trees()
    wheels = _wheels()
    key = [
        Path(__file__).read_bytes(),
        *glibc_key(),
        *(str(tree).encode() for tree in trees),
        *(w.read_bytes() for w in wheels),
    ]
    for path in source_files():
        key += [path.relative_to(ROOT).as_posix().encode(), path.read_bytes()]

    def build(out: Path) -> tuple[str, str]:
        return IMAGE, _write_layout(out, IMAGE, _build_layer(trees, wheels), dict(CONFIG))

    return _cached_build("nri-gpu", key, build)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build-image", description=f"Write the OCI archive of {IMAGE}.")
    parser.add_argument("--output", metavar="FILE", type=Path, default=Path("nri-gpu-image.tar"),
                        help="where to write the OCI image-layout tar (default nri-gpu-image.tar); - for stdout")
    args = parser.parse_args(argv)
    image = plugin_image()
    if str(args.output) == "-":
        with open(image.tar, "rb") as src:
            shutil.copyfileobj(src, sys.stdout.buffer)
    else:
        shutil.copyfile(image.tar, args.output)
        size = args.output.stat().st_size
        print(f"{IMAGE} ({image.manifest_digest}, {size / 2**20:.1f} MiB) -> {args.output}")
        print(f"import with: ctr -n k8s.io images import {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
