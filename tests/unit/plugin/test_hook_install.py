"""Where the CDI hook is installed, checked (nri_gpu.plugin.cli.hook_install), on real files: the
compiled hook a spec names (``check_hook``) and the ``nri-gpu`` console script a
systemd unit runs (``check_install``).

Every tree is built here, as root, under pytest's private directory (on the way
through the sticky, root-owned /tmp): owned by uid 1000 or given mode 0777
where a test says so. The one test that needs a Python interpreter it can trust
uses a venv of the interpreter running the tests, and is skipped, with the
reason, where that interpreter itself is not root's alone.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nri_gpu.engine import elf_interpreter
from nri_gpu.plugin.cli.hook_install import check_file, check_hook, check_install, check_tree
from testbed.plugins import NRI_GPU_HOOK

USER = 1000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds files owned by another user: needs root")


def tree(root: Path, *files: str, mode: int = 0o755) -> Path:
    """Root-owned files (mode ``mode``) and the folders to them, under ``root``."""
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(mode)
    return root


def test_a_root_owned_file_on_a_root_owned_path_is_fine(tmp_path: Path) -> None:
    tree(tmp_path, "opt/bin/nri-gpu")
    assert check_file(str(tmp_path / "opt/bin/nri-gpu")) == []
    assert check_tree(str(tmp_path / "opt")) == []


def test_a_folder_on_the_way_owned_by_a_user(tmp_path: Path) -> None:
    tree(tmp_path, "home/alice/src/nri-gpu")
    os.chown(tmp_path / "home/alice", USER, USER)
    assert check_file(str(tmp_path / "home/alice/src/nri-gpu")) == [
        f"{tmp_path}/home/alice is owned by uid 1000, not root"
    ]


def test_a_world_writable_folder_on_the_way(tmp_path: Path) -> None:
    tree(tmp_path, "shared/bin/nri-gpu")
    (tmp_path / "shared").chmod(0o777)
    assert check_file(str(tmp_path / "shared/bin/nri-gpu")) == [
        f"{tmp_path}/shared is writable by its group and others (mode 0777)"
    ]
    (tmp_path / "shared").chmod(0o775)
    assert check_file(str(tmp_path / "shared/bin/nri-gpu")) == [
        f"{tmp_path}/shared is writable by its group (mode 0775)"
    ]


def test_a_sticky_root_folder_on_the_way_is_fine_but_not_to_import_from(tmp_path: Path) -> None:
    # No one else can rename or remove root's entry of a sticky folder (as /tmp),
    # but anyone can add a module to it.
    tree(tmp_path, "tmp/lib/nri-gpu")
    (tmp_path / "tmp").chmod(0o1777)
    assert check_file(str(tmp_path / "tmp/lib/nri-gpu")) == []
    assert check_tree(str(tmp_path / "tmp")) == [f"{tmp_path}/tmp is writable by its group and others (mode 1777)"]


@pytest.mark.parametrize("mode", [0o1777, 0o1775])
def test_a_users_link_in_a_sticky_folder(tmp_path: Path, mode: int) -> None:
    # The sticky bit keeps others from replacing an entry, not its owner: alice may
    # point her link in /tmp elsewhere whenever she likes. The kernel's
    # protected_symlinks covers only world-writable sticky folders, and only where it
    # is on; a group's sticky folder (1775) never.
    tree(tmp_path, "trusted/real")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp").chmod(mode)
    (tmp_path / "tmp/nri-gpu").symlink_to(tmp_path / "trusted/real")
    os.lchown(tmp_path / "tmp/nri-gpu", USER, USER)
    assert check_file(str(tmp_path / "tmp/nri-gpu")) == [
        f"{tmp_path}/tmp/nri-gpu is a link owned by uid 1000 in a sticky folder others may write"
    ]
    os.lchown(tmp_path / "tmp/nri-gpu", 0, 0)
    assert check_file(str(tmp_path / "tmp/nri-gpu")) == []


def test_the_file_itself(tmp_path: Path) -> None:
    tree(tmp_path, "bin/mine", "bin/open")
    os.chown(tmp_path / "bin/mine", USER, USER)
    (tmp_path / "bin/open").chmod(0o757)
    assert check_file(str(tmp_path / "bin/mine")) == [f"{tmp_path}/bin/mine is owned by uid 1000, not root"]
    assert check_file(str(tmp_path / "bin/open")) == [f"{tmp_path}/bin/open is writable by others (mode 0757)"]
    assert check_file(str(tmp_path / "bin")) == [f"{tmp_path}/bin is not a regular file"]
    assert check_file(str(tmp_path / "bin/gone")) == [f"{tmp_path}/bin/gone is missing"]
    assert check_file("bin/nri-gpu") == ["bin/nri-gpu is not an absolute path"]


def test_links_are_followed_and_each_folder_on_their_way_checked(tmp_path: Path) -> None:
    # /trusted/bin/nri-gpu -> /alice/link -> /trusted/real: the file at the end is
    # root's, but alice can point her link elsewhere at any time.
    tree(tmp_path, "trusted/real", "trusted/bin/x")
    alice = tmp_path / "alice"
    alice.mkdir()
    (alice / "link").symlink_to(tmp_path / "trusted/real")
    os.chown(alice, USER, USER)
    (tmp_path / "trusted/bin/nri-gpu").symlink_to("../../alice/link")
    assert check_file(str(tmp_path / "trusted/bin/nri-gpu")) == [f"{alice} is owned by uid 1000, not root"]
    # A link to a root file through root's folders only is fine.
    (tmp_path / "trusted/bin/ok").symlink_to(tmp_path / "trusted/real")
    assert check_file(str(tmp_path / "trusted/bin/ok")) == []


def test_anything_under_a_folder_imported_from(tmp_path: Path) -> None:
    site = tree(tmp_path / "site", "pkg/__init__.py", "pkg/sub/deep.py", "evil.pth", mode=0o644)
    assert check_tree(str(site)) == []
    os.chown(site / "pkg/sub/deep.py", USER, USER)
    (site / "evil.pth").chmod(0o666)
    assert sorted(check_tree(str(site))) == [
        f"{site}/evil.pth is writable by its group and others (mode 0666)",
        f"{site}/pkg/sub/deep.py is owned by uid 1000, not root",
    ]


def test_a_link_inside_a_folder_imported_from_is_followed(tmp_path: Path) -> None:
    site = tree(tmp_path / "site", "a.py", mode=0o644)
    theirs = tree(tmp_path / "theirs", "pkg/__init__.py", mode=0o644)
    os.chown(theirs / "pkg/__init__.py", USER, USER)
    (site / "pkg").symlink_to(theirs / "pkg")
    assert check_tree(str(site)) == [f"{theirs}/pkg/__init__.py is owned by uid 1000, not root"]


def test_a_missing_folder_imported_from(tmp_path: Path) -> None:
    # python311.zip is usually missing: harmless where only root could create it.
    tree(tmp_path, "lib/x")
    assert check_tree(str(tmp_path / "lib/python311.zip")) == []
    (tmp_path / "lib").chmod(0o777)
    assert check_tree(str(tmp_path / "lib/python311.zip")) == [
        f"{tmp_path}/lib is writable by its group and others (mode 0777)"
    ]
    (tmp_path / "lib").chmod(0o1777)  # sticky: no one can replace root's entries, but anyone can add one
    assert check_tree(str(tmp_path / "lib/python311.zip")) == [
        f"{tmp_path}/lib/python311.zip is missing, and anyone could create it: "
        f"{tmp_path}/lib is writable by its group and others (mode 1777)"
    ]


@pytest.mark.parametrize(
    ("first_line", "why"),
    [("#!/usr/bin/env python3", "env"), ("\x7fELF", "a binary"), ("#!python3", "relative")],
)
def test_only_a_script_naming_its_interpreter_by_path(tmp_path: Path, first_line: str, why: str) -> None:
    hook = tmp_path / "nri-gpu"
    hook.write_text(first_line + "\nfrom nri_gpu.plugin.cli.__main__ import main\n")
    hook.chmod(0o755)
    assert check_install(str(hook)) == [
        f"{hook} is not a script whose #! line names its Python interpreter by absolute path"
    ]


def test_an_untrusted_interpreter(tmp_path: Path) -> None:
    python = tree(tmp_path / "alice", "python")
    os.chown(python, USER, USER)
    hook = tmp_path / "bin/nri-gpu"
    hook.parent.mkdir()
    hook.write_text(f"#!{python}/python\n")
    hook.chmod(0o755)
    assert check_install(str(hook)) == [f"{hook}'s interpreter: {python} is owned by uid 1000, not root"]


def test_an_interpreter_that_is_not_python(tmp_path: Path) -> None:
    hook = tmp_path / "nri-gpu"
    hook.write_text('#!/bin/sh\nexec python3 -m nri_gpu.plugin.cli "$@"\n')
    hook.chmod(0o755)
    problems = check_install(str(hook))
    assert len(problems) == 1 and problems[0].startswith("/bin/sh cannot be asked where it imports from")


def _trusted_python() -> str:
    python = os.path.realpath(sys.executable)
    base = sys.base_prefix
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    problems = check_file(python) + check_tree(os.path.join(base, "lib", version), missing_ok=False)
    if problems:
        pytest.skip(f"the interpreter running the tests is not root's alone: {problems[0]}")
    return python


def test_packages_imported_from_a_users_folder(tmp_path: Path) -> None:
    # A root-owned venv of a root-owned Python whose .pth file points at a user's
    # checkout (an editable install): the hook would import plugin and engine from it.
    python = _trusted_python()
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    checkout = tree(tmp_path / "checkout", "nri_gpu/plugin/__init__.py", "nri_gpu/engine/__init__.py", mode=0o644)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "nri-gpu.pth").write_text(f"{checkout}\n")
    hook = tmp_path / "nri-gpu"
    hook.write_text(f"#!{venv}/bin/python\nfrom nri_gpu.plugin.cli.__main__ import main\n")
    hook.chmod(0o755)
    assert check_install(str(hook)) == []

    os.chown(checkout / "nri_gpu/engine", USER, USER)
    assert check_install(str(hook)) == [f"{checkout}/nri_gpu/engine is owned by uid 1000, not root"]
    os.chown(checkout / "nri_gpu/engine", 0, 0)
    (site / "nri-gpu.pth").chmod(0o666)
    assert check_install(str(hook)) == [f"{site}/nri-gpu.pth is writable by its group and others (mode 0666)"]
    (site / "nri-gpu.pth").chmod(0o644)
    (site / "nri-gpu.pth").write_text(f"{tmp_path}/elsewhere\n")
    assert check_install(str(hook)) == [
        f"{venv}/bin/python does not import nri-gpu's package 'nri_gpu.plugin'",
        f"{venv}/bin/python does not import nri-gpu's package 'nri_gpu.engine'",
    ]


def test_a_venv_whose_home_is_a_users_python_is_refused_before_it_runs(tmp_path: Path) -> None:
    """A root-owned venv whose pyvenv.cfg ``home`` names a user's Python build: the
    interpreter would take its standard library (``encodings``, ``site``) from that
    user's tree the moment it is asked anything, running their code as root. The
    check refuses it from the files alone, before the interpreter runs once."""
    python = _trusted_python()
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    user = tmp_path / "alice-python"
    marker = tmp_path / "ran-as-root"
    stdlib = user / "lib" / version
    (user / "bin").mkdir(parents=True)
    (stdlib / "encodings").mkdir(parents=True)
    (stdlib / "os.py").write_text("")  # the landmark getpath looks for
    (stdlib / "encodings" / "__init__.py").write_text(  # early in start-up: posix is what there is
        f"import posix\nposix.close(posix.open({str(marker)!r}, posix.O_CREAT | posix.O_WRONLY, 0o644))\n"
    )
    for path in (user, user / "bin", user / "lib", stdlib, stdlib / "encodings"):
        os.chown(path, USER, USER)
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(f"home = {os.path.dirname(python)}", f"home = {user}/bin"))
    assert f"home = {user}/bin" in cfg.read_text()
    hook = tmp_path / "nri-gpu"
    hook.write_text(f"#!{venv}/bin/python\nfrom nri_gpu.plugin.cli.__main__ import main\n")
    hook.chmod(0o755)
    problems = check_install(str(hook))
    assert not marker.exists(), "the user's standard library ran as root"
    assert f"{user} is owned by uid 1000, not root" in problems


_MOUNTED_ENTRY = """
import os, subprocess, sys
from nri_gpu.plugin.cli.hook_install import check_file
where = sys.argv[1]
# What a FUSE file system alice mounts on a folder of hers (user_allow_other)
# reports: whatever she likes, here root's 0755 for its root and for every file.
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755,uid=0,gid=0", "bait", where], check=True)
with open(os.path.join(where, "nri-gpu"), "w") as f:
    f.write("#!/bin/sh\\n")
os.chmod(os.path.join(where, "nri-gpu"), 0o755)
print(check_file(os.path.join(where, "nri-gpu")))
"""


def test_a_mount_on_an_entry_of_a_sticky_folder_is_refused(tmp_path: Path) -> None:
    """In ``/tmp`` alice may make a folder and mount a FUSE file system of hers on
    it: its root and files then say they are root's, and their content is hers at
    every read. A mount on an entry of a sticky folder is refused, as
    ``engine.root`` refuses it: the owner its ``lstat`` shows is the mount's word."""
    (tmp_path / "tmp/alice").mkdir(parents=True)
    os.chmod(tmp_path / "tmp", 0o1777)
    os.chown(tmp_path / "tmp/alice", USER, USER)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _MOUNTED_ENTRY,
         str(tmp_path / "tmp/alice")],
        capture_output=True, text=True, timeout=30, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(
        [f"{tmp_path}/tmp/alice is a mount point in a sticky folder (its owner and mode are the mount's word)"]
    ), done.stdout


def test_a_pyvenv_cfg_that_is_not_a_regular_file_is_refused_before_it_runs(tmp_path: Path) -> None:
    # The interpreter would open it at start-up (a FIFO: and wait there for a writer).
    python = _trusted_python()
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "pyvenv.cfg").unlink()
    os.mkfifo(venv / "pyvenv.cfg", 0o644)
    hook = tmp_path / "nri-gpu"
    hook.write_text(f"#!{venv}/bin/python\nfrom nri_gpu.plugin.cli.__main__ import main\n")
    hook.chmod(0o755)
    assert check_install(str(hook)) == [f"{venv}/pyvenv.cfg is not a regular file"]


# -- the compiled hook ---------------------------------------------------------------------

NOT_THE_HOOK = "is not nri-gpu's compiled hook ({}): pass the nri-gpu-hook installed beside nri-gpu"


def copy_of(source: str, where: Path, mode: int = 0o755) -> Path:
    """``source`` copied to ``where`` (root's, mode ``mode``), the folders on the way made."""
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, where)
    where.chmod(mode)
    return where


def elf_naming(interpreter: bytes | None, phoff: int = 64) -> bytes:
    """A 64-bit ELF header and, with ``interpreter``, one PT_INTERP program header
    naming it at ``phoff``: all that ``check_hook`` reads of a file."""
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    count = 0 if interpreter is None else 1
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, 0x401000, phoff, 0, 0, 64, 56, count, 64, 0, 0)
    data = header.ljust(phoff, b"\0")
    if interpreter is not None:
        path = interpreter + b"\0"
        data += struct.pack("<IIQQQQQQ", 3, 4, phoff + 56, 0, 0, len(path), len(path), 1) + path
    return data


def test_the_static_hook_hack_setup_built_passes(tmp_path: Path) -> None:
    hook = copy_of(NRI_GPU_HOOK, tmp_path / "venv/bin/nri-gpu-hook")
    with open(hook, "rb") as f:
        assert elf_interpreter(f.read(65536)) is None  # static: the file is all it runs
    assert check_hook(str(hook)) == []


def test_a_hook_others_can_change_is_refused(tmp_path: Path) -> None:
    open_to_group = copy_of(NRI_GPU_HOOK, tmp_path / "bin/group", 0o775)
    assert check_hook(str(open_to_group)) == [f"{open_to_group} is writable by its group (mode 0775)"]
    theirs = copy_of(NRI_GPU_HOOK, tmp_path / "bin/theirs")
    os.chown(theirs, USER, USER)
    assert check_hook(str(theirs)) == [f"{theirs} is owned by uid 1000, not root"]
    (tmp_path / "alice").mkdir()
    os.chown(tmp_path / "alice", USER, USER)
    in_a_users_folder = copy_of(NRI_GPU_HOOK, tmp_path / "alice/nri-gpu-hook")
    assert check_hook(str(in_a_users_folder)) == [f"{tmp_path}/alice is owned by uid 1000, not root"]
    assert check_hook(str(tmp_path / "bin/gone")) == [f"{tmp_path}/bin/gone is missing"]
    assert check_hook("nri-gpu-hook") == ["nri-gpu-hook is not an absolute path"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'#!/bin/sh\nexec /usr/bin/nri-gpu-hook-real "$@"\n', "not an ELF file"),
        (b"#!/usr/local/lib/nri-gpu/venv/bin/python\nfrom nri_gpu.plugin.cli.entry import main\n", "not an ELF file"),
        (b"\x7fELF", "not an ELF file"),  # a header cut short
        (elf_naming(b"/lib64/ld-linux-x86-64.so.2", phoff=70000), "program headers beyond the part read"),
    ],
    ids=["shell-script", "console-script", "truncated", "headers-far-away"],
)
def test_anything_but_an_elf_executable_is_refused_with_the_message(tmp_path: Path, content: bytes, why: str) -> None:
    hook = tmp_path / "nri-gpu-hook"
    hook.write_bytes(content)
    hook.chmod(0o755)
    assert check_hook(str(hook)) == [f"{hook} " + NOT_THE_HOOK.format(why)]


def test_a_dynamic_hook_whose_interpreter_is_roots_passes(tmp_path: Path) -> None:
    """A distribution's build, linked dynamically: its ELF interpreter runs too, and
    is checked the same way (here /bin/true's, the system's)."""
    hook = copy_of("/bin/true", tmp_path / "bin/nri-gpu-hook")
    with open(hook, "rb") as f:
        interpreter = elf_interpreter(f.read(65536))
    if interpreter is None:
        pytest.skip("/bin/true is linked statically here")
    assert check_file(interpreter) == []
    assert check_hook(str(hook)) == []


def test_a_dynamic_hook_whose_interpreter_a_user_can_change_is_refused(tmp_path: Path) -> None:
    loader = tree(tmp_path / "alice", "ld.so")
    os.chown(loader, USER, USER)
    hook = tmp_path / "bin/nri-gpu-hook"
    hook.parent.mkdir()
    hook.write_bytes(elf_naming(str(loader / "ld.so").encode()))
    hook.chmod(0o755)
    assert check_hook(str(hook)) == [f"{hook}'s ELF interpreter: {loader} is owned by uid 1000, not root"]
    os.chown(loader, 0, 0)
    assert check_hook(str(hook)) == []
    hook.write_bytes(elf_naming(b"ld.so"))
    assert check_hook(str(hook)) == [f"{hook}'s ELF interpreter: ld.so is not an absolute path"]
