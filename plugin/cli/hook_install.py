"""Where the CDI hook is installed, checked before a spec or a unit names it.

The spec's hook runs as root at every start of a GPU container, from wherever
the spec says: ``sudo ~user/src/nri-gpu/.venv/bin/nri-gpu cdi generate`` would
make every root runtime of the node run, as root, whatever that user later puts
in that checkout. So ``cdi generate`` refuses a hook that anyone but root can
change (``check_hook``): the compiled ``nri-gpu-hook`` and every directory on the
way to it (symlinks followed as the kernel follows them, each directory a name
is looked up in checked). It is statically linked, so the file is all it runs;
a dynamically linked build (a distribution's) also runs its ELF interpreter,
checked the same way, which loads the libraries root's ld.so configuration
names.

The systemd units of ``install --runtime docker|podman`` run ``nri-gpu cdi
generate`` itself at every boot, in Python: ``check_install`` checks that
console script, its ``#!`` interpreter and every directory it imports from: the
interpreter's ``sys.path`` as it has it (``-I``) and the folders of ``plugin``
and ``engine``, each with everything under it.

"Anyone but root can change" means: not owned by uid 0, or writable by its
group or by others. A directory on the way may be writable by others if it is
sticky and root-owned (``/tmp``): no one else can then replace an entry of
root's, so a link there must be root's too (its owner may repoint it), and no
entry there may be a mount point (a user's FUSE mount reports any owner). A
directory imported from may not: anyone could add a module to it.

The interpreter is asked where it imports from, in two steps, so that nothing
that is not yet checked runs: first without ``site`` (``-I -S``: the standard
library and the folders ``site`` would read ``.pth`` files from), then, once
those are checked, with it (``-I``: ``.pth`` files, editable installs). Even the
first run imports the standard library, so before it the files alone decide
where that comes from: every ``pyvenv.cfg`` the interpreter would read, the
installation its ``home`` names and the interpreter's own (the ``lib/python3*``
folders and ``libpython``), each checked. What the interpreter's loader takes
from elsewhere (an ``LD_LIBRARY_PATH`` is not set: the query runs with an empty
environment) is root's ld.so configuration.
"""

from __future__ import annotations

import glob
import json
import os
import re
import stat
import subprocess
from collections.abc import Iterable

__all__ = ["check_file", "check_folder", "check_hook", "check_imports", "check_install", "check_tree"]

_HOPS = 40  # symlinks followed in one path, as the kernel's limit
_ELF_HEAD = 65536  # where every toolchain puts the program headers
# The sys.path entry of setuptools' editable finder (``pip install -e``): no folder,
# a key its path hook answers for; the folders it maps nri_gpu's packages to are
# what ``find_spec`` returns, checked as the packages' folders, and the finder
# module itself lies in site-packages, checked with it.
_EDITABLE_HOOK = re.compile(r"__editable__\.[A-Za-z0-9_.+-]+\.finder\.__path_hook__")
_SHEBANG_LIMIT = 256  # what the kernel reads of a script's #! line
_QUERY_TIMEOUT = 10.0
_MAX_PROBLEMS = 20

# -I -S: the standard library's folders, and every folder ``site`` would read
# .pth files from (the base installation's and, in a venv, the venv's).
_BASE_QUERY = """
import json, os, site, sys
venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
configs = [os.path.join(venv, "pyvenv.cfg"), os.path.join(venv, "bin", "pyvenv.cfg")]
sites = site.getsitepackages()
if any(os.path.isfile(c) for c in configs):
    sites += site.getsitepackages([venv])
print(json.dumps({"path": sys.path, "site": sites}))
"""
# -I: nri-gpu's own sys.path, and where its packages are (found, not imported).
# (Finding nri_gpu.plugin imports nri_gpu: a namespace package, which runs no code.)
_FULL_QUERY = """
import importlib.util, json, sys
def find(name):
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None
found = {n: find(n) for n in ("nri_gpu.plugin", "nri_gpu.engine")}
dirs = {n: list(s.submodule_search_locations or []) if s else [] for n, s in found.items()}
print(json.dumps({"path": sys.path, "packages": dirs}))
"""


def _owner_problem(path: str, info: os.stat_result, *, sticky_ok: bool) -> str | None:
    if info.st_uid != 0:
        return f"{path} is owned by uid {info.st_uid}, not root"
    if info.st_mode & 0o022 and not (sticky_ok and info.st_mode & stat.S_ISVTX):
        who = {0o020: "its group", 0o002: "others"}.get(info.st_mode & 0o022, "its group and others")
        return f"{path} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _resolve(path: str, problems: list[str], *, missing_ok: bool = False) -> tuple[str, os.stat_result] | None:
    """Follow ``path`` from ``/`` as the kernel would, checking every directory a
    name is looked up in; the resolved path and its lstat, or None (with a
    problem, unless it is missing, ``missing_ok``, and no one else could create it)."""
    if not path.startswith("/"):
        problems.append(f"{path} is not an absolute path")
        return None
    parts = [p for p in path.split("/") if p]
    current, hops = "/", _HOPS
    info = os.lstat("/")
    while parts:
        problem = _owner_problem(current, info, sticky_ok=True)
        if problem:
            problems.append(problem)
            return None
        name = parts.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)  # already resolved: its parent is the real one
            info = os.lstat(current)
            continue
        candidate = os.path.join(current, name)
        try:
            entry = os.lstat(candidate)
        except FileNotFoundError:
            # Missing is harmless only where no one else can create it.
            if not missing_ok:
                problems.append(f"{candidate} is missing")
            elif problem := _owner_problem(current, info, sticky_ok=False):
                problems.append(f"{candidate} is missing, and anyone could create it: {problem}")
            return None
        except OSError as exc:
            problems.append(f"{candidate} cannot be checked: {exc.strerror}")
            return None
        if info.st_mode & stat.S_ISVTX and entry.st_dev != info.st_dev:
            # Anyone may mount a FUSE file system on a folder of theirs in /tmp:
            # every owner and mode below it is theirs to report (as engine.root).
            problems.append(
                f"{candidate} is a mount point in a sticky folder (its owner and mode are the mount's word)"
            )
            return None
        if stat.S_ISLNK(entry.st_mode):
            if entry.st_uid != 0 and info.st_mode & 0o022:
                # A sticky folder keeps others from replacing an entry, not its owner.
                problems.append(
                    f"{candidate} is a link owned by uid {entry.st_uid} in a sticky folder others may write"
                )
                return None
            hops -= 1
            if hops < 0:
                problems.append(f"{path}: too many symbolic links")
                return None
            target = os.readlink(candidate)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                current, info = "/", os.lstat("/")
            continue
        if parts and not stat.S_ISDIR(entry.st_mode):
            problems.append(f"{candidate} is not a directory")
            return None
        current, info = candidate, entry
    return current, info


def check_file(path: str) -> list[str]:
    """Problems with running ``path``: it, and every directory on the way to it."""
    return _check(path, regular=True)


def check_folder(path: str) -> list[str]:
    """Problems with a folder a root service reads or writes (not its contents): it and
    every directory on the way. Missing is fine where only root could create it."""
    problems: list[str] = []
    found = _resolve(path, problems, missing_ok=True)
    if found is not None:
        real, info = found
        if not stat.S_ISDIR(info.st_mode):
            problems.append(f"{real} is not a directory")
        elif problem := _owner_problem(real, info, sticky_ok=False):
            problems.append(problem)
    return problems


def _check(path: str, *, regular: bool) -> list[str]:
    """Problems with ``path`` itself (a regular file if ``regular``; not a
    folder's contents) and every directory on the way to it."""
    problems: list[str] = []
    found = _resolve(path, problems)
    if found is not None:
        real, info = found
        if regular and not stat.S_ISREG(info.st_mode):
            problems.append(f"{real} is not a regular file")
        elif problem := _owner_problem(real, info, sticky_ok=False):
            problems.append(problem)
    return problems


def check_tree(path: str, *, missing_ok: bool = True, seen: set[tuple[int, int]] | None = None) -> list[str]:
    """Problems with importing from the folder ``path``: the way to it, it, and
    everything under it (links inside are followed and checked the same way)."""
    problems: list[str] = []
    seen = set() if seen is None else seen
    found = _resolve(path, problems, missing_ok=missing_ok)
    if found is not None:
        _walk(*found, problems, seen)
    return problems


def _walk(top: str, info: os.stat_result, problems: list[str], seen: set[tuple[int, int]]) -> None:
    stack = [(top, info)]
    while stack and len(problems) < _MAX_PROBLEMS:
        path, entry = stack.pop()
        if (entry.st_dev, entry.st_ino) in seen:
            continue
        seen.add((entry.st_dev, entry.st_ino))
        if problem := _owner_problem(path, entry, sticky_ok=False):
            problems.append(problem)
        if not stat.S_ISDIR(entry.st_mode):
            continue
        try:
            children = list(os.scandir(path))
        except OSError as exc:
            problems.append(f"{path} cannot be listed: {exc.strerror}")
            continue
        for child in children:
            child_info = child.stat(follow_symlinks=False)
            if stat.S_ISLNK(child_info.st_mode):
                target = _resolve(child.path, problems, missing_ok=True)
                if target is not None:
                    stack.append(target)
            else:
                stack.append((child.path, child_info))


def interpreter(executable: str) -> str | None:
    """The interpreter a script's ``#!`` line names, or None for a binary."""
    with open(executable, "rb") as f:
        head = f.read(_SHEBANG_LIMIT)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else ""


def _query(interp: str, flags: Iterable[str], code: str) -> dict[str, object]:
    done = subprocess.run(
        [interp, *flags, "-c", code], capture_output=True, env={}, cwd="/", timeout=_QUERY_TIMEOUT, check=False
    )
    if done.returncode != 0:
        raise ValueError(f"{interp} cannot be asked where it imports from (is it Python?): {done.stderr[-300:]!r}")
    value = json.loads(done.stdout)
    if not isinstance(value, dict):
        raise ValueError(f"{interp} answered {done.stdout[:100]!r}")
    return value


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


_CFG_LIMIT = 4096  # a pyvenv.cfg is a few lines


def _prefixes(interp: str) -> tuple[list[str], list[str]]:
    """(pyvenv.cfg files, installation prefixes) the interpreter at ``interp``
    reads at start-up, found from the files alone (CPython's getpath: a
    ``pyvenv.cfg`` beside the executable or one folder up, whose ``home`` is the
    base installation's bin folder; else the executable's own installation)."""
    configs, prefixes = [], []
    for where in (interp, os.path.realpath(interp)):
        bin_dir = os.path.dirname(where)
        prefixes.append(os.path.dirname(bin_dir))
        for cfg in (os.path.join(bin_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(bin_dir), "pyvenv.cfg")):
            if not os.path.lexists(cfg) or cfg in configs:
                continue
            configs.append(cfg)  # checked by the caller: anything but a regular file is refused
            if not os.path.isfile(cfg):
                continue
            with open(cfg, "rb") as f:
                text = f.read(_CFG_LIMIT).decode("utf-8", "replace")
            for line in text.splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() == "home" and value.strip():
                    home = value.strip()
                    prefixes += [home, os.path.dirname(home)]
    return configs, list(dict.fromkeys(prefixes))


def _before_running(interp: str, seen: set[tuple[int, int]]) -> list[str]:
    """Problems with what ``interp`` would load before it can be asked anything."""
    configs, prefixes = _prefixes(interp)
    problems = [p for c in configs for p in check_file(c)]
    for prefix in prefixes:
        problems += _check(prefix, regular=False) if os.path.isdir(prefix) else []
        for lib in sorted(glob.glob(os.path.join(glob.escape(prefix), "lib", "python3*"))):
            problems += check_tree(lib, seen=seen)
        for shared in sorted(glob.glob(os.path.join(glob.escape(prefix), "lib", "libpython3*"))):
            problems += check_file(shared)
        if len(problems) >= _MAX_PROBLEMS:
            break
    return list(dict.fromkeys(problems))


def check_imports(interp: str) -> list[str]:
    """Problems with where ``interp`` imports nri-gpu from, each folder checked.

    Raises ValueError when ``interp`` cannot be asked (not Python, or it failed)."""
    seen: set[tuple[int, int]] = set()
    problems = _before_running(interp, seen)
    if problems:
        return problems  # it would load that at start-up: do not run it at all
    base = _query(interp, ("-I", "-S"), _BASE_QUERY)
    dirs = [*_strings(base.get("path")), *_strings(base.get("site"))]
    problems = [p for d in dirs for p in check_tree(d, seen=seen)]
    if problems:
        return problems  # site would run .pth files from there: ask no further
    full = _query(interp, ("-I",), _FULL_QUERY)
    packages = full.get("packages")
    found = {n: _strings(d) for n, d in packages.items()} if isinstance(packages, dict) else {}
    for name in ("nri_gpu.plugin", "nri_gpu.engine"):
        if not found.get(name):
            problems.append(f"{interp} does not import nri-gpu's package {name!r}")
    paths = [d for d in _strings(full.get("path")) if not _EDITABLE_HOOK.fullmatch(d)]
    more = [*paths, *(d for ds in found.values() for d in ds)]
    problems += [p for d in more for p in check_tree(d, seen=seen)]
    return problems


def check_install(executable: str) -> list[str]:
    """Every reason a non-root user could change what ``executable`` runs; [] when none.

    ``executable`` must be a script whose ``#!`` line names a Python interpreter
    by its absolute path (a console script, as pip writes it)."""
    problems = check_file(executable)
    if problems:
        return problems
    interp = interpreter(executable)
    if not interp or not interp.startswith("/") or os.path.basename(interp) == "env":
        return [f"{executable} is not a script whose #! line names its Python interpreter by absolute path"]
    problems = check_file(interp)
    if problems:
        return [f"{executable}'s interpreter: {p}" for p in problems]
    try:
        problems = check_imports(interp)
    except (ValueError, OSError, subprocess.TimeoutExpired) as exc:
        return [str(exc)]
    return problems[:_MAX_PROBLEMS]


def check_hook(executable: str) -> list[str]:
    """Every reason a non-root user could change what the compiled hook at
    ``executable`` runs; [] when none. It must be an ELF executable: statically
    linked, or with an ELF interpreter that passes the same check."""
    from nri_gpu.engine import elf_interpreter

    problems = check_file(executable)
    if problems:
        return problems
    try:
        with open(executable, "rb") as f:
            interp = elf_interpreter(f.read(_ELF_HEAD))
    except ValueError as exc:
        return [f"{executable} is not nri-gpu's compiled hook ({exc}): pass the nri-gpu-hook installed beside nri-gpu"]
    except OSError as exc:
        return [f"{executable} cannot be read: {exc.strerror}"]
    if interp is None:
        return []
    return [f"{executable}'s ELF interpreter: {p}" for p in check_file(interp)]
