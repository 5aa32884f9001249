//! The `rebuild` ld.so.cache mode: the container's cache rebuilt by the host's
//! trusted static ldconfig, confined (`engine/start/ldconfig.py`'s
//! `open_trusted`, `run`, `cache_lists`, `engine/start/confine.py`, and
//! `actions._trusted_here` for the hook's case), as the NVIDIA toolkit does: it
//! also lists libraries the image left out of its own cache. The CVEs that
//! shaped how:
//!
//! * CVE-2024-0136/0137: never run a binary from the image. The ldconfig run is
//!   the host's, opened before anything of the container is looked at, copied
//!   into a sealed memfd, executed by fd, and only if it is static: a dynamic
//!   one would be loaded by the container's `ld-linux` and honour its
//!   `ld.so.preload`.
//! * CVE-2025-23266 (NVIDIAScape): no environment reaches it, so no `LD_PRELOAD`
//!   or `LD_LIBRARY_PATH` of the image either (static anyway), and cwd is `/`.
//! * CVE-2025-23267 and its relatives: ldconfig writes *nothing* in the
//!   container. It runs as `nobody` without capabilities, with `-X` (no SONAME
//!   links: glibc takes a SONAME such as `../../data/x` as it is and would plant
//!   a link wherever it points), with `-i` (the image's aux cache is not read),
//!   and puts its cache in a private tmpfs. This process then installs the cache
//!   like every other file it writes: resolved in the root, on the root file
//!   system only, through a temporary file renamed into place.
//! * Procfs magic links: ldconfig's view of the container has every procfs
//!   mount covered, so `/proc/1/root` or `/proc/1/fd/N` lead nowhere.
//!
//! The hook runs as runc's `createContainer` hook: already in the container's
//! namespaces, before `pivot_root`, the container's root a directory (a mount
//! of its own) that the ldconfig process `chroot`s into. That process, forked
//! into a fresh pid namespace (pid 1 there: no process of the pod can name it,
//! so none can ptrace it, open its `/proc/<pid>` or take an fd from it):
//!
//! * takes a private copy of the mount namespace, and makes every mount in it
//!   private, read-only, `nodev` and `nosuid`: no device node a conf file or
//!   library folder points at can be opened;
//! * attaches the output tmpfs (owned by `nobody`) over `/proc` and covers
//!   every other procfs mount of the container with an empty read-only tmpfs;
//! * gets fresh net, IPC and UTS namespaces, none of the container's nor the
//!   host's: a crafted ELF file that took over ldconfig reaches no abstract
//!   socket, SysV object or process of anyone's;
//! * becomes `nobody` with no capability left, bounding set included,
//!   `no_new_privs`, and not dumpable, also after the exec (which makes a
//!   process dumpable again only when its uid may read the binary: the sealed
//!   copy is one `nobody` may only execute); 10 s of CPU, 64 MiB files;
//! * exec's the binary by fd with an empty environment, cwd `/`, stdin
//!   `/dev/null`, stdout and stderr into this process's pipe, no other fd;
//! * dies with this process (`PR_SET_PDEATHSIG`, and a look at its pidfd
//!   after the last change of uid).
//!
//! Between `fork` and `exec` the child makes only async-signal-safe calls and
//! allocates nothing: every path, message part and argument vector is made
//! before the fork (`ChildPlan`), and errors are written with `write(2)`.

use std::collections::HashSet;
use std::convert::Infallible;
use std::ffi::CString;
use std::io;
use std::os::raw::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use crate::error::{py_isspace, py_repr, Result, WorkError};
use crate::model::LdCacheEntry;
use crate::rootdir::{self, RootDir};
use crate::sys::{
    _exit, close, errno, fchdir, fchmod, prctl, setns, sigprocmask, syscall, write, MountAttr, OpenHow, SigSet,
    FSCONFIG_CMD_CREATE, FSCONFIG_SET_STRING, FSMOUNT_CLOEXEC, FSOPEN_CLOEXEC, PR_SET_DUMPABLE, SYS_CLOSE_RANGE,
    SYS_FSCONFIG, SYS_FSMOUNT, SYS_FSOPEN, SYS_MOUNT_SETATTR, SYS_MOVE_MOUNT, SYS_OPENAT2, SYS_PIDFD_OPEN,
};
use crate::{elf, ldcache, ldconf, sys};

/// `nobody`, and `nogroup`: no more rights in the container than its least user.
const UID: u32 = 65534;
/// Where the output tmpfs is attached, in ldconfig's private namespace only.
const OUTPUT: &str = "/proc";
const CACHE_NAME: &str = "ld.so.cache";
/// `ldconfig -X -i -f /etc/ld.so.conf -C /proc/ld.so.cache`, NUL-terminated for `execveat`.
const ARGV: [&[u8]; 7] =
    [b"ldconfig\0", b"-X\0", b"-i\0", b"-f\0", b"/etc/ld.so.conf\0", b"-C\0", b"/proc/ld.so.cache\0"];
const CPU_SECONDS: u64 = 10;
const FILE_SIZE: u64 = 64 << 20;
/// A static ldconfig is about 1 MB.
const BINARY_LIMIT: u64 = 64 << 20;
/// The output kept of a failing ldconfig, and the part of it a message quotes.
const TAIL: usize = 4096;
const TAIL_QUOTED: usize = 1000;
/// mountinfo with the host's mounts and the container's: a few KB; one with
/// thousands of mounts is refused rather than parsed at length (characters, as
/// the Python reads it).
const MOUNTINFO_LIMIT: usize = 4 << 20;
const MOUNTINFO: &str = "/proc/self/mountinfo";
/// The whole of this namespace's mountinfo before pivot_root (the host's mounts
/// too): 256k mounts of 256 bytes; the hook's time limit bounds the reading.
const HOST_MOUNTINFO_LIMIT: usize = 64 << 20;

// <linux/sched.h>
const CLONE_NEWUTS: c_int = 0x0400_0000;
const CLONE_NEWIPC: c_int = 0x0800_0000;
const CLONE_NEWPID: c_int = 0x2000_0000;
const CLONE_NEWNET: c_int = 0x4000_0000;
const VIEW_NAMESPACES: c_int = sys::CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
// <fcntl.h>, <linux/memfd.h>
const F_DUPFD_CLOEXEC: c_int = 1030;
const F_ADD_SEALS: c_int = 1033;
const SEALS: c_int = 0x1 | 0x2 | 0x4 | 0x8; // F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE
const MFD_CLOEXEC: c_uint = 0x1;
const MFD_ALLOW_SEALING: c_uint = 0x2;
/// Linux 6.3: executable even under `vm.memfd_noexec=1`.
const MFD_EXEC: c_uint = 0x10;
// <linux/prctl.h>, <linux/capability.h>, <sys/resource.h>, <signal.h>, <poll.h>
const PR_SET_PDEATHSIG: c_int = 1;
const PR_CAPBSET_DROP: c_int = 24;
const PR_SET_NO_NEW_PRIVS: c_int = 38;
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Past every capability any kernel knows (41 in 6.x): a loop bound only.
const CAP_BOUND: u64 = 1024;
const RLIMIT_CPU: c_int = 0;
const RLIMIT_FSIZE: c_int = 1;
const RLIMIT_NOFILE: c_int = 7;
const SIGKILL: c_int = 9;
const SIG_SETMASK: c_int = 2;
const POLLIN: i16 = 0x1;
/// ldconfig's copy of the container: nothing to write, no device to open, no setuid.
const VIEW_FLAGS: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOSUID;
/// The last errno a kernel gives (EHWPOISON): the texts the child may need.
const LAST_ERRNO: i32 = 133;

// Per architecture (the generic table's numbers are `sys`'s). The credential
// calls go to the kernel directly: glibc's wrappers would broadcast them to every
// thread it knows of, machinery a forked child (one thread) has no use for.
#[cfg(target_arch = "x86_64")]
mod nr {
    pub const SETGROUPS: i64 = 116;
    pub const SETRESUID: i64 = 117;
    pub const SETRESGID: i64 = 119;
    pub const CAPSET: i64 = 126;
    pub const EXECVEAT: i64 = 322;
}
#[cfg(target_arch = "aarch64")]
mod nr {
    pub const SETGROUPS: i64 = 159;
    pub const SETRESUID: i64 = 147;
    pub const SETRESGID: i64 = 149;
    pub const CAPSET: i64 = 91;
    pub const EXECVEAT: i64 = 281;
}

extern "C" {
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn getpid() -> c_int;
    fn poll(fds: *mut PollFd, count: c_ulong, timeout: c_int) -> c_int;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn chdir(path: *const c_char) -> c_int;
    fn chroot(path: *const c_char) -> c_int;
    fn unshare(flags: c_int) -> c_int;
    fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize;
    fn setrlimit(resource: c_int, limit: *const Rlimit) -> c_int;
    fn getrlimit(resource: c_int, limit: *mut Rlimit) -> c_int;
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
    fn sendfile(out: c_int, from: c_int, offset: *mut i64, count: usize) -> isize;
}

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

#[repr(C)]
struct Rlimit {
    current: u64,
    max: u64,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: c_int,
}

#[repr(C)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

// ---------------------------------------------------------------- the host side

/// What the ldconfig run needs from the host side, opened before anything of the
/// container is looked at: the sealed copy of the binary, the host's `/dev/null`
/// (stdin), the container's root (`chroot`ed into), this process's pid namespace
/// (set back for its children after ldconfig's was made in a fresh one; `None`
/// when out of sight: a hook makes no process after ldconfig's), and the mount
/// points of the container's procfs mounts, relative to its root.
#[derive(Debug)]
pub struct Trusted {
    pub path: String,
    binary: OwnedFd,
    devnull: OwnedFd,
    chroot: OwnedFd,
    own_pid_namespace: Option<OwnedFd>,
    pub proc_mounts: Vec<String>,
}

/// `Trusted` for a hook (`actions._trusted_here`): already in the container's
/// namespaces, so none to join; `root` (the directory `rootfs`) is `chroot`ed
/// into; the procfs mounts to cover are those under `rootfs` in this mount namespace.
pub fn trusted_here(root: &RootDir, rootfs: &str, ldconfig_path: &str) -> Result<Trusted> {
    let real = real_path(rootfs);
    let prefix = real.trim_end_matches('/');
    // Before pivot_root this namespace holds the host's mounts as well as the
    // container's: only the container's count against the bound, or any tenant
    // with enough volumes on the node could fail every other tenant's start.
    let points = proc_mounts_under(prefix)?;
    let binary = open_trusted(ldconfig_path)?;
    let under = format!("{}/", prefix);
    let proc_mounts = points
        .iter()
        .filter(|p| p.starts_with(&under))
        .filter_map(|p| p.get(prefix.len()..))
        .map(String::from)
        .collect();
    let devnull = sys::openat_fd(sys::AT_FDCWD, "/dev/null", sys::O_RDWR | sys::O_NOCTTY, 0).map_err(os_error)?;
    let own_pid_namespace = sys::openat_fd(sys::AT_FDCWD, "/proc/self/ns/pid", sys::O_RDONLY, 0).ok();
    let chroot = dup_cloexec(root.fd()).map_err(os_error)?;
    Ok(Trusted { path: ldconfig_path.to_string(), binary, devnull, chroot, own_pid_namespace, proc_mounts })
}

/// What a start step reports for an `OSError` raised without a message of ours: its text.
fn os_error(err: io::Error) -> WorkError {
    WorkError(sys::error_text(&err))
}

/// `os.path.realpath`: the path itself when it cannot be resolved.
fn real_path(path: &str) -> String {
    match std::fs::canonicalize(path) {
        Ok(real) => real.to_str().map(String::from).unwrap_or_else(|| path.to_string()),
        Err(_) => path.to_string(),
    }
}

fn dup_cloexec(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor we hold; the result is a new descriptor of ours.
    let new = unsafe { fcntl(fd, F_DUPFD_CLOEXEC, 0 as c_int) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The procfs mount points of `/proc/self/mountinfo` at `prefix` or below it
/// (`actions._proc_mounts` of the container's mounts). Refused when the whole
/// file is over `HOST_MOUNTINFO_LIMIT` bytes, or the container's lines over
/// `MOUNTINFO_LIMIT` characters (cut short, one could be left uncovered for
/// ldconfig).
fn proc_mounts_under(prefix: &str) -> Result<Vec<String>> {
    let fd = sys::openat_fd(sys::AT_FDCWD, MOUNTINFO, sys::O_RDONLY | sys::O_NOCTTY, 0).map_err(os_error)?;
    let data = sys::read_up_to(fd.as_raw_fd(), HOST_MOUNTINFO_LIMIT as u64 + 1).map_err(os_error)?;
    if data.len() > HOST_MOUNTINFO_LIMIT {
        return Err(WorkError(format!("{}: over {} bytes (the host's mounts)", MOUNTINFO, HOST_MOUNTINFO_LIMIT)));
    }
    container_proc_mounts(&data, prefix, MOUNTINFO_LIMIT)
}

/// `proc_mounts_under` on the mountinfo `data`, with the container's lines bounded by `limit`.
fn container_proc_mounts(data: &[u8], prefix: &str, limit: usize) -> Result<Vec<String>> {
    let under = format!("{}/", prefix);
    let ours = |point: &str| point == prefix || point.starts_with(&under);
    proc_mount_points(data, &ours, limit).map_err(|refused| match refused {
        // A ValueError in the Python, which the start step reports with its type's name.
        Refused::Malformed(message) => WorkError(format!("ValueError: {}", message)),
        Refused::OverLimit => WorkError(format!("{}: over {} bytes (the container's mounts)", MOUNTINFO, limit)),
    })
}

// ---------------------------------------------------------------- mountinfo (engine/start/mountinfo.py)

/// Why mountinfo's procfs mounts are not told.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// A line not in mountinfo's format (the message names it).
    Malformed(String),
    /// The lines of the mounts wanted are over the limit.
    OverLimit,
}

/// Mount points (as the namespace's processes see them) of every `proc` mount
/// among those `wanted` takes by mount point, outermost first, without those
/// below another one (covering that covers them), sorted; in one pass over the
/// mountinfo `data`. A line not in mountinfo's format is refused naming it, as
/// are the wanted mounts' lines over `limit` characters. Each line as the kernel
/// ends it (at "\n") is read; a wanted one is then read as Python's
/// `splitlines` cuts it (a mount point with a "\r" may make two lines of it),
/// which fails only once every line was read (any other refusal goes first).
fn proc_mount_points(
    data: &[u8],
    wanted: &dyn Fn(&str) -> bool,
    limit: usize,
) -> std::result::Result<Vec<String>, Refused> {
    let mut points = Vec::new();
    let mut chars = 0usize;
    let mut late = None;
    for raw in data.split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(raw);
        let (point, kind) = match mount(&line).map_err(Refused::Malformed)? {
            Some((point, kind)) if wanted(&point) => (point, kind),
            _ => continue,
        };
        chars += line.chars().count() + 1;
        if chars > limit {
            return Err(Refused::OverLimit);
        }
        if !line.contains(is_line_boundary) {
            match kind {
                Some("proc") => points.push(point),
                Some(_) => {}
                None => late = late.or_else(|| Some(malformed(&line))),
            }
            continue;
        }
        for part in py_splitlines(&line) {
            match mount(part) {
                Ok(Some((point, Some("proc")))) => points.push(point),
                Ok(Some((_, None))) => late = late.or_else(|| Some(malformed(part))),
                Ok(_) => {}
                Err(message) => late = late.or(Some(message)),
            }
        }
    }
    match late {
        Some(message) => Err(Refused::Malformed(message)),
        None => Ok(outermost(points)),
    }
}

/// The mount point (unescaped) and the file system type (None when nothing
/// follows " - ") of one mountinfo line; None for a blank line; why a line is
/// not in mountinfo's format.
fn mount(line: &str) -> std::result::Result<Option<(String, Option<&str>)>, String> {
    if line.chars().all(py_isspace) {
        return Ok(None);
    }
    let (left, right) = match line.find(" - ") {
        Some(at) => (&line[..at], &line[at + 3..]),
        None => return Err(malformed(line)),
    };
    match py_split(left).nth(4) {
        Some(point) => Ok(Some((unescape(point), py_split(right).next()))),
        None => Err(malformed(line)),
    }
}

/// `points` without repeats and those below another one, sorted.
fn outermost(mut points: Vec<String>) -> Vec<String> {
    points.sort();
    points.dedup();
    points.sort_by(|a, b| (a.matches('/').count(), a).cmp(&(b.matches('/').count(), b)));
    let mut kept: Vec<String> = Vec::new();
    for point in points {
        let covered = kept.iter().any(|k| point == *k || point.starts_with(&format!("{}/", k.trim_end_matches('/'))));
        if !covered {
            kept.push(point);
        }
    }
    kept.sort();
    kept
}

fn malformed(line: &str) -> String {
    format!("mountinfo: malformed line {}", py_repr(line))
}

/// The kernel writes space, tab, newline and backslash as `\ooo` (octal).
fn unescape(field: &str) -> String {
    if !field.contains('\\') {
        return field.to_string();
    }
    let chars: Vec<char> = field.chars().collect();
    let mut out = String::with_capacity(field.len());
    let mut at = 0;
    while let Some(&c) = chars.get(at) {
        let digits = chars.get(at + 1..at + 4).filter(|d| d.iter().all(|d| ('0'..='7').contains(d)));
        match (c, digits) {
            ('\\', Some(digits)) => {
                let value = digits.iter().fold(0u32, |n, d| n * 8 + (*d as u32 - '0' as u32));
                out.push(char::from_u32(value).unwrap_or('\u{fffd}'));
                at += 4;
            }
            _ => {
                out.push(c);
                at += 1;
            }
        }
    }
    out
}

/// Python's `str.split()`: runs of white space separate, none are kept.
fn py_split(text: &str) -> impl Iterator<Item = &str> {
    text.split(py_isspace).filter(|word| !word.is_empty())
}

/// Whether Python's `str.splitlines()` ends a line at `c`.
fn is_line_boundary(c: char) -> bool {
    matches!(c, '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

/// Python's `str.splitlines()`: `\r\n` and every line boundary Python knows.
fn py_splitlines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if !is_line_boundary(c) {
            continue;
        }
        lines.push(&text[start..at]);
        start = at + c.len_utf8();
        if c == '\r' {
            if let Some(&(next, '\n')) = chars.peek() {
                chars.next();
                start = next + 1;
            }
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

// ---------------------------------------------------------------- the binary

/// The host's ldconfig, checked (a root-owned regular file no one else may
/// write, executable, and static), as an fd of a sealed copy the ldconfig
/// process may execute but not read.
///
/// Why a copy: `execve` makes a process dumpable again when its uid may read
/// the binary, and `nobody` may read the host's ldconfig; a dumpable process
/// can be ptraced by any other process of its uid that can name it, which could
/// then hand this process a cache of its making. A copy in a sealed memfd that
/// `nobody` may only execute keeps the process undumpable through the exec, and
/// what runs is exactly what was checked: the host file could change after the
/// check, the copy cannot.
fn open_trusted(path: &str) -> Result<OwnedFd> {
    let fail = |e: io::Error| WorkError(format!("{}: {}", path, sys::error_text(&e)));
    let fd = sys::openat_fd(sys::AT_FDCWD, path, sys::O_RDONLY | sys::O_NOCTTY, 0).map_err(fail)?;
    let info = sys::fstat(fd.as_raw_fd()).map_err(fail)?;
    if !info.is_reg() || info.mode & 0o111 == 0 {
        return Err(WorkError(format!("{}: not an executable file", path)));
    }
    if info.uid != 0 || info.mode & 0o022 != 0 {
        return Err(WorkError(format!("{}: must be owned by root and writable by root only", path)));
    }
    if info.size > BINARY_LIMIT {
        return Err(WorkError(format!(
            "{}: {} bytes, over the limit of {} bytes for ldconfig",
            path, info.size, BINARY_LIMIT
        )));
    }
    let copy = sealed_copy(fd.as_raw_fd(), info.size, path)?;
    drop(fd);
    let head = sys::pread(copy.as_raw_fd(), 0, elf::HEAD_SIZE).map_err(os_error)?;
    match elf::interpreter(&head) {
        Err(err) => Err(WorkError(format!("{}: {}", path, err))),
        Ok(Some(interp)) => Err(WorkError(format!(
            "{} is dynamically linked (interpreter {}): inside the container it would be loaded \
             by the image's own loader; configure a statically linked ldconfig",
            path, interp
        ))),
        Ok(None) => Ok(copy),
    }
}

/// A read-only fd of a memfd holding the `size` bytes of `fd`: sealed against
/// any change, mode 0511 (root may read it; others, `nobody` among them, may
/// only execute it).
fn sealed_copy(fd: RawFd, size: u64, path: &str) -> Result<OwnedFd> {
    let fail = |e: io::Error| WorkError(format!("{}: copying it for the run: {}", path, sys::error_text(&e)));
    let flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
    // A kernel before 6.3 knows no MFD_EXEC (and execs any memfd); with
    // vm.memfd_noexec=2 no memfd may be executed: the second try fails too.
    let memfd = new_memfd(flags | MFD_EXEC).or_else(|_| new_memfd(flags)).map_err(fail)?;
    let mut done: u64 = 0;
    while done < size {
        let mut offset = done as i64;
        let want = std::cmp::min(size - done, 1 << 30) as usize;
        // SAFETY: two descriptors we hold and an offset variable of ours.
        let sent = unsafe { sendfile(memfd.as_raw_fd(), fd, &mut offset, want) };
        if sent < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(sys::EINTR) {
                continue;
            }
            return Err(fail(err));
        }
        if sent == 0 {
            return Err(WorkError(format!("{}: shorter than its size ({} of {} bytes)", path, done, size)));
        }
        done += sent as u64;
    }
    // SAFETY: plain calls on a descriptor we hold.
    if unsafe { fchmod(memfd.as_raw_fd(), 0o511) } < 0 || unsafe { fcntl(memfd.as_raw_fd(), F_ADD_SEALS, SEALS) } < 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    // exec refuses a file open for writing (ETXTBSY): keep a read-only fd only.
    let again = format!("/proc/self/fd/{}", memfd.as_raw_fd());
    sys::openat_fd(sys::AT_FDCWD, &again, sys::O_RDONLY | sys::O_NOCTTY, 0).map_err(fail)
}

fn new_memfd(flags: c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; the result is a new descriptor of ours.
    let fd = unsafe { memfd_create(b"nri-gpu-ldconfig\0".as_ptr() as *const c_char, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

// ---------------------------------------------------------------- the cache

/// Whether the container's cache already lists every path of `entries` (the
/// plan's, which are what ldconfig lists for our libraries). Unreadable, too big
/// or garbled: false, rebuild it.
pub fn cache_lists(copy: &RootDir, entries: &[LdCacheEntry], deadline: Option<Instant>) -> bool {
    if entries.is_empty() {
        return false;
    }
    let data = match copy.read_small(ldconf::CACHE, ldconf::CACHE_LIMIT, rootdir::READ) {
        Ok(Some(data)) => data,
        _ => return false,
    };
    let listed = match ldcache::read_ld_so_cache(&data, deadline) {
        Ok(listed) => listed,
        Err(_) => return false,
    };
    let paths: HashSet<&[u8]> = listed.entries.iter().map(|entry| entry.path.as_bytes()).collect();
    entries.iter().all(|entry| paths.contains(entry.path.as_bytes()))
}

/// Rebuild the container's cache with the trusted ldconfig and install it as
/// `/etc/ld.so.cache` through `copy` (the detached copy of the root).
pub fn run(copy: &RootDir, trusted: &Trusted, deadline: Instant) -> Result<()> {
    let cache = output_tmpfs()?;
    let plan = ChildPlan::new(trusted)?;
    let (out_read, out_write) = pipe()?;
    let pid = fork_confined(trusted, &plan, out_write.as_raw_fd(), cache.as_raw_fd())?;
    drop(out_write);
    let collected = collect(out_read.as_raw_fd(), deadline);
    let stop = match &collected {
        Ok((_, timed_out)) => *timed_out,
        Err(_) => true, // no reader left: it must not run on
    };
    if stop {
        // SAFETY: our own child, not yet reaped.
        unsafe { kill(pid, SIGKILL) };
    }
    let status = reap(pid)?;
    drop(out_read);
    let (tail, timed_out) = collected.map_err(os_error)?;
    if timed_out {
        return Err(WorkError(format!("{} did not finish before the deadline and was killed", trusted.path)));
    }
    if let Some(how) = failure(status) {
        let text = quoted_tail(&tail);
        let said = if text.is_empty() { String::new() } else { format!(": {}", text) };
        return Err(WorkError(format!("{} {}{}", trusted.path, how, said)));
    }
    let data = read_cache(cache.as_raw_fd(), &trusted.path)?;
    drop(cache);
    ldconf::install(copy, &data)
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut ends: [c_int; 2] = [-1, -1];
    // SAFETY: pipe2 fills the two ints we pass.
    if unsafe { pipe2(ends.as_mut_ptr(), sys::O_CLOEXEC as c_int) } < 0 {
        return Err(os_error(io::Error::last_os_error()));
    }
    let [read_end, write_end] = ends;
    // SAFETY: two new descriptors of ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(read_end), OwnedFd::from_raw_fd(write_end)) })
}

/// The ldconfig process, pid 1 of a fresh pid namespace (not the container's:
/// nothing of the pod can see it). A plain `fork` of this single-threaded process.
fn fork_confined(trusted: &Trusted, plan: &ChildPlan, output: RawFd, cache: RawFd) -> Result<c_int> {
    // How the child tells that this process died.
    // SAFETY: pidfd_open of our own pid; the result is a new descriptor of ours.
    let parent = unsafe { syscall(SYS_PIDFD_OPEN, getpid() as c_long, 0 as c_long) };
    if parent < 0 {
        return Err(os_error(io::Error::last_os_error()));
    }
    // SAFETY: just made, owned by no one else.
    let parent = unsafe { OwnedFd::from_raw_fd(parent as RawFd) };
    // SAFETY: a flag word; affects the children made next only.
    if unsafe { unshare(CLONE_NEWPID) } < 0 {
        return Err(WorkError(format!("unshare(0x20000000): {}", sys::strerror_text(errno()))));
    }
    let fds = ChildFds {
        binary: trusted.binary.as_raw_fd(),
        devnull: trusted.devnull.as_raw_fd(),
        chroot: trusted.chroot.as_raw_fd(),
        output,
        cache,
        parent: parent.as_raw_fd(),
    };
    // SAFETY: this process is single-threaded; the child runs exec_confined alone,
    // which makes async-signal-safe calls only and never returns.
    let pid = unsafe { fork() };
    if pid == 0 {
        exec_confined(plan, &fds);
    }
    let fork_error = errno();
    if let Some(own) = &trusted.own_pid_namespace {
        // Back to ours for any later child (and thread: the kernel refuses one
        // while the pid namespace for children differs).
        // SAFETY: a namespace fd we hold.
        if unsafe { setns(own.as_raw_fd(), CLONE_NEWPID) } < 0 {
            let message = format!("setns(nstype=0x20000000): {}", sys::strerror_text(errno()));
            if pid > 0 {
                // SAFETY: our own child, killed and reaped before the error is told.
                unsafe { kill(pid, SIGKILL) };
                let _ = reap(pid);
            }
            return Err(WorkError(message));
        }
    }
    if pid < 0 {
        return Err(WorkError(sys::strerror_text(fork_error)));
    }
    Ok(pid)
}

fn reap(pid: c_int) -> Result<c_int> {
    let mut status: c_int = 0;
    loop {
        // SAFETY: waits for our own child; status is ours.
        if unsafe { waitpid(pid, &mut status, 0) } >= 0 {
            return Ok(status);
        }
        if errno() != sys::EINTR {
            return Err(os_error(io::Error::last_os_error()));
        }
    }
}

/// The tail of ldconfig's output until it closes it; (tail, timed out).
fn collect(fd: RawFd, deadline: Instant) -> io::Result<(Vec<u8>, bool)> {
    let mut tail = Vec::new();
    let mut chunk = vec![0u8; 65536];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok((tail, true));
        }
        let left_ms = std::cmp::min((deadline - now).as_millis(), c_int::MAX as u128) as c_int;
        let mut wanted = PollFd { fd, events: POLLIN, revents: 0 };
        // SAFETY: one pollfd of ours.
        let ready = unsafe { poll(&mut wanted, 1, std::cmp::max(1, left_ms)) };
        if ready < 0 && errno() != sys::EINTR {
            return Err(io::Error::last_os_error());
        }
        if ready <= 0 {
            continue;
        }
        // SAFETY: reads into our buffer, at most its length.
        let got = unsafe { read(fd, chunk.as_mut_ptr() as *mut c_void, chunk.len()) };
        if got < 0 {
            if errno() == sys::EINTR {
                continue;
            }
            return Err(io::Error::last_os_error());
        }
        if got == 0 {
            return Ok((tail, false));
        }
        tail.extend_from_slice(chunk.get(..got as usize).unwrap_or(&[]));
        if tail.len() > TAIL {
            tail.drain(..tail.len() - TAIL);
        }
    }
}

/// How a wait status is a failure ("exited with status 3", "was killed by
/// SIGSEGV"), `None` for exit status 0.
fn failure(status: c_int) -> Option<String> {
    let signal = status & 0x7f;
    if signal == 0 {
        let code = (status >> 8) & 0xff;
        return if code == 0 { None } else { Some(format!("exited with status {}", code)) };
    }
    Some(format!("was killed by {}", signal_name(signal)))
}

/// Python's `signal.Signals(n).name` (a number for realtime signals other than
/// the first and last, where Python has no name).
fn signal_name(signal: c_int) -> String {
    #[rustfmt::skip]
    const NAMES: [&str; 31] = [
        "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGKILL", "SIGUSR1",
        "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGSTKFLT", "SIGCHLD", "SIGCONT", "SIGSTOP",
        "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGURG", "SIGXCPU", "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",
        "SIGPWR", "SIGSYS",
    ];
    match signal {
        34 => "SIGRTMIN".to_string(),
        64 => "SIGRTMAX".to_string(),
        n => match usize::try_from(n - 1).ok().and_then(|i| NAMES.get(i)) {
            Some(name) => name.to_string(),
            None => format!("signal {}", n),
        },
    }
}

/// The output quoted in a failure: decoded (errors replaced), stripped, its last 1000 characters.
fn quoted_tail(tail: &[u8]) -> String {
    let text = String::from_utf8_lossy(tail);
    let text = text.trim_matches(py_isspace);
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(TAIL_QUOTED)).collect()
}

fn read_cache(cache: RawFd, path: &str) -> Result<Vec<u8>> {
    let flags = sys::O_RDONLY | sys::O_NOFOLLOW | sys::O_NONBLOCK | sys::O_NOCTTY;
    let fd = sys::openat_fd(cache, CACHE_NAME, flags, 0)
        .map_err(|e| WorkError(format!("{} wrote no cache ({})", path, sys::error_text(&e))))?;
    Ok(rootdir::read_regular(fd.as_raw_fd(), "the new ld.so.cache", ldconf::CACHE_LIMIT)?.0)
}

/// A detached tmpfs only `nobody` (ldconfig) can write: where its cache goes.
fn output_tmpfs() -> Result<OwnedFd> {
    const OPTIONS: [TmpfsOption; 5] = [
        TmpfsOption { key: b"uid\0", value: b"65534\0", call: b"fsconfig(uid=65534)" },
        TmpfsOption { key: b"gid\0", value: b"65534\0", call: b"fsconfig(gid=65534)" },
        TmpfsOption { key: b"mode\0", value: b"0700\0", call: b"fsconfig(mode=0700)" },
        TmpfsOption { key: b"size\0", value: b"64m\0", call: b"fsconfig(size=64m)" },
        TmpfsOption { key: b"nr_inodes\0", value: b"16\0", call: b"fsconfig(nr_inodes=16)" },
    ];
    let fd = new_tmpfs(&OPTIONS, false).map_err(|failed| WorkError(failed.strerror()))?;
    // SAFETY: a new mount fd of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An empty read-only tmpfs, to cover a procfs mount with.
const EMPTY: [TmpfsOption; 3] = [
    TmpfsOption { key: b"mode\0", value: b"0555\0", call: b"fsconfig(mode=0555)" },
    TmpfsOption { key: b"size\0", value: b"4k\0", call: b"fsconfig(size=4k)" },
    TmpfsOption { key: b"nr_inodes\0", value: b"1\0", call: b"fsconfig(nr_inodes=1)" },
];

/// One `fsconfig` string of a tmpfs, NUL-terminated, and how its failure is told.
struct TmpfsOption {
    key: &'static [u8],
    value: &'static [u8],
    call: &'static [u8],
}

/// A detached `nosuid,nodev,noexec` tmpfs, as a mount fd (`syscalls.new_tmpfs`).
/// Not `sys::new_tmpfs`, which makes C strings of its options: this one
/// allocates nothing, as the ldconfig process makes its empty ones after the fork.
fn new_tmpfs(options: &[TmpfsOption], read_only: bool) -> std::result::Result<c_int, Failed<'static>> {
    // SAFETY (this block's calls): NUL-terminated static strings and descriptors of ours.
    let fs = unsafe { syscall(SYS_FSOPEN, b"tmpfs\0".as_ptr(), FSOPEN_CLOEXEC as c_long) } as c_int;
    if fs < 0 {
        return Err(Failed::now(Says::Call(b"fsopen('tmpfs')")));
    }
    let closing = |says: Says<'static>| {
        let failed = Failed::now(says);
        // SAFETY: the fs context fd made above.
        unsafe { close(fs) };
        failed
    };
    for option in options {
        let (key, value) = (option.key.as_ptr(), option.value.as_ptr());
        // SAFETY: see above.
        if unsafe { syscall(SYS_FSCONFIG, fs as c_long, FSCONFIG_SET_STRING as c_long, key, value, 0 as c_long) } < 0 {
            return Err(closing(Says::Call(option.call)));
        }
    }
    let none = std::ptr::null::<c_char>();
    // SAFETY: see above.
    if unsafe { syscall(SYS_FSCONFIG, fs as c_long, FSCONFIG_CMD_CREATE as c_long, none, none, 0 as c_long) } < 0 {
        return Err(closing(Says::Call(b"fsconfig(cmd=6)")));
    }
    let ro = if read_only { sys::MOUNT_ATTR_RDONLY } else { 0 };
    let flags = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC | ro;
    // SAFETY: see above.
    let mount = unsafe { syscall(SYS_FSMOUNT, fs as c_long, FSMOUNT_CLOEXEC as c_long, flags as c_long) } as c_int;
    if mount < 0 {
        return Err(closing(Says::Call(b"fsmount")));
    }
    // SAFETY: see above.
    unsafe { close(fs) };
    Ok(mount)
}

// ---------------------------------------------------------------- errors, told without allocating

/// An `OSError` (or `ValueError`) of the Python, as its parts: the errno and how
/// the failed call is named.
#[derive(Clone, Copy)]
enum Says<'a> {
    /// `[Errno N] text`: an `os` function.
    Plain,
    /// `[Errno N] call: text`: a `syscalls` wrapper.
    Call(&'a [u8]),
    /// `[Errno N] text: 'path'`: an `os` function given a path (the repr).
    Path(&'a [u8]),
    /// `[Errno N] text: fd`: `os.execve` given an fd.
    Fd(c_int),
    /// `[Errno N] prctl(PR_CAPBSET_DROP, cap): text`.
    CapDrop(u64),
    /// A `ValueError`: its message alone.
    Value(&'static [u8]),
}

#[derive(Clone, Copy)]
struct Failed<'a> {
    errno: i32,
    says: Says<'a>,
}

impl<'a> Failed<'a> {
    fn now(says: Says<'a>) -> Failed<'a> {
        Failed { errno: errno(), says }
    }

    /// Python's `exc.strerror` (what a start step reports for an `OSError`).
    fn strerror(&self) -> String {
        let text = sys::strerror_text(self.errno);
        match self.says {
            Says::Call(call) => format!("{}: {}", String::from_utf8_lossy(call), text),
            Says::CapDrop(cap) => format!("prctl(PR_CAPBSET_DROP, {}): {}", cap, text),
            Says::Value(message) => String::from_utf8_lossy(message).into_owned(),
            Says::Plain | Says::Path(_) | Says::Fd(_) => text,
        }
    }

    /// `str(exc)` into `line`, the errno's text from `texts`.
    fn tell(&self, texts: &[Vec<u8>], line: &mut Line) {
        if let Says::Value(message) = self.says {
            line.push(message);
            return;
        }
        line.push(b"[Errno ");
        line.number(self.errno as u64);
        line.push(b"] ");
        let text = |line: &mut Line| match usize::try_from(self.errno).ok().and_then(|n| texts.get(n)) {
            Some(text) => line.push(text),
            None => {
                line.push(b"Unknown error ");
                line.number(self.errno as u64);
            }
        };
        match self.says {
            Says::Plain | Says::Value(_) => text(line),
            Says::Call(call) => {
                line.push(call);
                line.push(b": ");
                text(line);
            }
            Says::CapDrop(cap) => {
                line.push(b"prctl(PR_CAPBSET_DROP, ");
                line.number(cap);
                line.push(b"): ");
                text(line);
            }
            Says::Path(path) => {
                text(line);
                line.push(b": ");
                line.push(path);
            }
            Says::Fd(fd) => {
                text(line);
                line.push(b": ");
                line.number(fd as u64);
            }
        }
    }
}

/// A message built on the stack (cut at its size).
struct Line {
    bytes: [u8; 2048],
    len: usize,
}

impl Line {
    fn push(&mut self, data: &[u8]) {
        for &b in data {
            if let Some(slot) = self.bytes.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }

    fn number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            if let Some(slot) = digits.get_mut(at) {
                *slot = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || at == 0 {
                break;
            }
        }
        let (_, used) = digits.split_at(at);
        self.push(used);
    }

    fn text(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or(&[])
    }
}

// ---------------------------------------------------------------- the child (confine.exec_confined)

/// Everything the ldconfig process needs, made before the fork.
struct ChildPlan {
    argv: [*const c_char; 8],
    envp: [*const c_char; 1],
    output: Cover,
    /// The other procfs mount points, each covered by an empty tmpfs.
    covered: Vec<Cover>,
    /// `strerror` of every errno, for messages written after the fork.
    errno_texts: Vec<Vec<u8>>,
    /// Where to stop closing descriptors if the kernel has no `close_range`.
    fd_limit: u64,
}

/// A mount point in the container's root and how a failure to open it is told
/// (`confine._attach`: `{point}: openat2({point!r})`).
struct Cover {
    path: CString,
    call: Vec<u8>,
}

impl Cover {
    fn new(point: &str) -> Result<Cover> {
        let path = CString::new(point).map_err(|_| WorkError(format!("{}: a NUL in a mount point", py_repr(point))))?;
        Ok(Cover { path, call: format!("{}: openat2({})", point, py_repr(point)).into_bytes() })
    }
}

impl ChildPlan {
    fn new(trusted: &Trusted) -> Result<ChildPlan> {
        let mut argv = [std::ptr::null(); 8];
        for (slot, word) in argv.iter_mut().zip(ARGV.iter()) {
            *slot = word.as_ptr() as *const c_char;
        }
        let covered = trusted.proc_mounts.iter().filter(|p| p.as_str() != OUTPUT).map(|p| Cover::new(p));
        let mut limit = Rlimit { current: 0, max: 0 };
        // SAFETY: fills the struct we pass.
        let fd_limit = if unsafe { getrlimit(RLIMIT_NOFILE, &mut limit) } == 0 { limit.max } else { 1 << 20 };
        Ok(ChildPlan {
            argv,
            envp: [std::ptr::null()],
            output: Cover::new(OUTPUT)?,
            covered: covered.collect::<Result<Vec<Cover>>>()?,
            errno_texts: (0..=LAST_ERRNO).map(|n| sys::strerror_text(n).into_bytes()).collect(),
            fd_limit: std::cmp::min(fd_limit, 1 << 20),
        })
    }
}

/// The descriptors the child starts from (the parent's numbers).
struct ChildFds {
    binary: RawFd,
    devnull: RawFd,
    chroot: RawFd,
    output: RawFd,
    cache: RawFd,
    parent: RawFd,
}

/// Why the child stops before the exec.
enum Stop<'a> {
    Failed(Failed<'a>),
    /// This process died meanwhile: ldconfig must not run orphaned.
    ParentGone,
}

impl<'a> From<Failed<'a>> for Stop<'a> {
    fn from(failed: Failed<'a>) -> Stop<'a> {
        Stop::Failed(failed)
    }
}

/// In the forked ldconfig process: confine, then exec. Never returns; any failure
/// is written to the pipe (`nri-gpu: before running ldconfig: ...`) and ends it
/// with status 127.
fn exec_confined(plan: &ChildPlan, fds: &ChildFds) -> ! {
    let stop = match confine_and_exec(plan, fds) {
        Ok(never) => match never {},
        Err(stop) => stop,
    };
    match stop {
        Stop::ParentGone => {
            // SAFETY: ends this forked process at once.
            unsafe { _exit(126) }
        }
        Stop::Failed(failed) => {
            let mut line = Line { bytes: [0; 2048], len: 0 };
            line.push(b"nri-gpu: before running ldconfig: ");
            failed.tell(&plan.errno_texts, &mut line);
            line.push(b"\n");
            let text = line.text();
            // SAFETY: write(2) of our stack buffer, then _exit: both async-signal-safe.
            unsafe {
                write(2, text.as_ptr() as *const c_void, text.len());
                _exit(127)
            }
        }
    }
}

/// A libc result: the value, or `Failed` with the errno now.
fn checked(result: c_long, says: Says<'_>) -> std::result::Result<c_int, Failed<'_>> {
    if result < 0 {
        Err(Failed::now(says))
    } else {
        Ok(result as c_int)
    }
}

fn confine_and_exec<'a>(plan: &'a ChildPlan, fds: &ChildFds) -> std::result::Result<Infallible, Stop<'a>> {
    // Above the stdio numbers first: a hook started with closed stdio may hold
    // any of these as fd 0, 1 or 2, which the dup2 calls would clobber.
    let binary = dup_above(fds.binary)?;
    let devnull = dup_above(fds.devnull)?;
    let output = dup_above(fds.output)?;
    let parent = dup_above(fds.parent)?;
    let chroot_fd = dup_above(fds.chroot)?;
    let cache = dup_above(fds.cache)?;
    // SAFETY (every call below): plain syscalls on descriptors and buffers of ours,
    // each async-signal-safe; nothing allocates.
    checked(unsafe { dup2(devnull, 0) } as c_long, Says::Plain)?;
    checked(unsafe { dup2(output, 1) } as c_long, Says::Plain)?;
    checked(unsafe { dup2(output, 2) } as c_long, Says::Plain)?;
    // This process killed on timeout takes ldconfig along. The kernel clears the
    // setting when the uid changes, so it is set again after that, and a parent
    // that died in between (or before the first) is noticed through its pidfd: as
    // pid 1 of its own pid namespace this process has no parent pid to look at.
    parent_death_signal()?;
    // Before pivot_root "/" is still the host's. Changed into before unshare,
    // which moves root and cwd to the new namespace's copies (the fd itself would
    // keep naming the old namespace's mount).
    checked(unsafe { fchdir(chroot_fd) } as c_long, Says::Plain)?;
    checked(unsafe { chroot(b".\0".as_ptr() as *const c_char) } as c_long, Says::Path(b"'.'"))?;
    // A private copy of the container's mount namespace: what is covered here is
    // covered for ldconfig only, never for the container. Fresh net, IPC and UTS
    // namespaces come along (not the container's: a pod's sidecar shares those).
    checked(unsafe { unshare(VIEW_NAMESPACES) } as c_long, Says::Call(b"unshare(0x4c020000)"))?;
    let flags = (sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC) as c_int;
    let root = checked(unsafe { open(b"/\0".as_ptr() as *const c_char, flags) } as c_long, Says::Path(b"'/'"))?;
    let view = MountAttr { attr_set: VIEW_FLAGS, attr_clr: 0, propagation: sys::MS_PRIVATE, userns_fd: 0 };
    let at = (sys::AT_EMPTY_PATH | sys::AT_RECURSIVE) as c_long;
    let size = std::mem::size_of::<MountAttr>();
    let empty = b"\0".as_ptr();
    checked(
        unsafe { syscall(SYS_MOUNT_SETATTR, root as c_long, empty, at, &view as *const MountAttr, size) },
        Says::Call(b"mount_setattr"),
    )?;
    attach(root, &plan.output, cache)?;
    for point in &plan.covered {
        attach(root, point, new_tmpfs(&EMPTY, true)?)?;
    }
    // Nothing of the hook's (the container's roots, its pipes) is held once this
    // process is nobody's: only the binary and the parent's pidfd are kept.
    close_fds_except(&[binary, parent], plan.fd_limit);
    for (resource, value) in [(RLIMIT_CPU, CPU_SECONDS), (RLIMIT_FSIZE, FILE_SIZE)] {
        set_limit(resource, value)?;
    }
    become_nobody()?;
    checked(unsafe { prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) } as c_long, Says::Call(b"prctl(PR_SET_DUMPABLE)"))?;
    parent_death_signal()?;
    if has_exited(parent)? {
        return Err(Stop::ParentGone);
    }
    checked(unsafe { chdir(b"/\0".as_ptr() as *const c_char) } as c_long, Says::Path(b"'/'"))?;
    close_fds_except(&[binary], plan.fd_limit);
    let nothing = SigSet { bits: [0; 16] };
    checked(unsafe { sigprocmask(SIG_SETMASK, &nothing, std::ptr::null_mut()) } as c_long, Says::Plain)?;
    unsafe {
        syscall(
            nr::EXECVEAT,
            binary as c_long,
            empty,
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
            sys::AT_EMPTY_PATH as c_long,
        )
    };
    Err(Failed::now(Says::Fd(binary)).into())
}

fn dup_above(fd: RawFd) -> std::result::Result<c_int, Failed<'static>> {
    // SAFETY: fcntl on a descriptor of ours.
    checked(unsafe { fcntl(fd, F_DUPFD_CLOEXEC, 10 as c_int) } as c_long, Says::Plain)
}

fn parent_death_signal() -> std::result::Result<(), Failed<'static>> {
    // SAFETY: a prctl with plain values.
    checked(
        unsafe { prctl(PR_SET_PDEATHSIG, SIGKILL as c_ulong, 0, 0, 0) } as c_long,
        Says::Call(b"prctl(PR_SET_PDEATHSIG)"),
    )
    .map(|_| ())
}

/// Attach the detached `mount` over the directory `point` of the root (no
/// symlink followed on the way); closes `mount`.
fn attach<'a>(root: c_int, point: &'a Cover, mount: c_int) -> std::result::Result<(), Failed<'a>> {
    let how = OpenHow {
        flags: sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC,
        mode: 0,
        resolve: rootdir::IN_ROOT | sys::RESOLVE_NO_SYMLINKS,
    };
    let size = std::mem::size_of::<OpenHow>();
    // SAFETY: a NUL-terminated path made before the fork, a struct of ours.
    let target = unsafe { syscall(SYS_OPENAT2, root as c_long, point.path.as_ptr(), &how as *const OpenHow, size) };
    if target < 0 {
        let failed = Failed::now(Says::Call(&point.call));
        // SAFETY: the mount fd we were handed.
        unsafe { close(mount) };
        return Err(failed);
    }
    let empty = b"\0".as_ptr();
    let flags = (sys::MOVE_MOUNT_F_EMPTY_PATH | sys::MOVE_MOUNT_T_EMPTY_PATH) as c_long;
    // SAFETY: two descriptors of ours and static empty paths.
    let moved = unsafe { syscall(SYS_MOVE_MOUNT, mount as c_long, empty, target, empty, flags) };
    let failed = Failed::now(Says::Call(b"move_mount('' -> '')"));
    // SAFETY: descriptors of ours, not used again.
    unsafe {
        close(target as c_int);
        close(mount);
    }
    if moved < 0 {
        return Err(failed);
    }
    Ok(())
}

/// `resource.setrlimit(resource, (value, value))`, with its `ValueError`s.
fn set_limit(resource: c_int, value: u64) -> std::result::Result<(), Failed<'static>> {
    let limit = Rlimit { current: value, max: value };
    // SAFETY: a struct of ours.
    if unsafe { setrlimit(resource, &limit) } == 0 {
        return Ok(());
    }
    let failed = Failed::now(Says::Plain);
    Err(match failed.errno {
        sys::EINVAL => Failed { says: Says::Value(b"current limit exceeds maximum limit"), ..failed },
        1 => Failed { says: Says::Value(b"not allowed to raise maximum limit"), ..failed }, // EPERM
        _ => failed,
    })
}

fn become_nobody() -> std::result::Result<(), Failed<'static>> {
    // Every capability the kernel knows, whatever this program knows of.
    let mut cap: u64 = 0;
    while cap < CAP_BOUND {
        // SAFETY: a prctl with plain values.
        if unsafe { prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) } < 0 {
            if errno() == sys::EINVAL {
                break; // no such capability: past the last one
            }
            return Err(Failed::now(Says::CapDrop(cap)));
        }
        cap += 1;
    }
    // No supplementary groups, then real, effective and saved gid and uid (from
    // uid 0 to another, the kernel clears every capability).
    let id = UID as c_long;
    // SAFETY: credential syscalls with plain values (setgroups with none).
    checked(unsafe { syscall(nr::SETGROUPS, 0 as c_long, std::ptr::null::<u32>()) }, Says::Plain)?;
    checked(unsafe { syscall(nr::SETRESGID, id, id, id) }, Says::Plain)?;
    checked(unsafe { syscall(nr::SETRESUID, id, id, id) }, Says::Plain)?;
    // And we make sure.
    let header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
    let none = [
        CapData { effective: 0, permitted: 0, inheritable: 0 },
        CapData { effective: 0, permitted: 0, inheritable: 0 },
    ];
    // SAFETY: structs of ours, the v3 layout (two data words).
    checked(unsafe { syscall(nr::CAPSET, &header as *const CapHeader, none.as_ptr()) }, Says::Call(b"capset"))?;
    // SAFETY: a prctl with plain values.
    checked(unsafe { prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as c_long, Says::Call(b"prctl(PR_SET_NO_NEW_PRIVS)"))
        .map(|_| ())
}

/// A pidfd is readable once its process has exited.
fn has_exited(pidfd: c_int) -> std::result::Result<bool, Failed<'static>> {
    let mut wanted = PollFd { fd: pidfd, events: POLLIN, revents: 0 };
    // SAFETY: one pollfd of ours.
    checked(unsafe { poll(&mut wanted, 1, 0) } as c_long, Says::Plain).map(|ready| ready > 0)
}

/// Nothing of the hook's reaches ldconfig but stdio and the binary.
/// Close every descriptor above stdio but those in `keep` (at most four);
/// `limit`: where to stop on a kernel without `close_range`. Allocates nothing
/// (the ldconfig process calls it after its fork); public for its test.
pub fn close_fds_except(keep: &[c_int], limit: u64) {
    let mut kept = [c_int::MAX; 4];
    let n = keep.len().min(kept.len());
    kept[..n].copy_from_slice(&keep[..n]);
    kept.sort_unstable();
    // SAFETY: close_range over our own descriptor table.
    let mut low: c_long = 3;
    let mut done = true;
    for &fd in kept.iter().filter(|&&fd| fd != c_int::MAX && fd >= 3) {
        let fd = fd as c_long;
        if fd > low {
            done &= unsafe { syscall(SYS_CLOSE_RANGE, low, fd - 1, 0 as c_long) } == 0;
        }
        low = low.max(fd + 1);
    }
    done &= unsafe { syscall(SYS_CLOSE_RANGE, low, c_uint::MAX as c_long, 0 as c_long) } == 0;
    if done {
        return;
    }
    // A kernel before 5.9: one by one, up to the hard limit.
    let mut fd: c_long = 3;
    while (fd as u64) < limit {
        if !kept.contains(&(fd as c_int)) {
            // SAFETY: closing a descriptor number of ours (most are not open).
            unsafe { close(fd as c_int) };
        }
        fd += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every mount's procfs mount points, as Python's `proc_mount_points` gives them.
    fn all_proc_mount_points(text: &str) -> std::result::Result<Vec<String>, String> {
        proc_mount_points(text.as_bytes(), &|_| true, usize::MAX).map_err(|refused| match refused {
            Refused::Malformed(message) => message,
            Refused::OverLimit => "over the limit".to_string(),
        })
    }

    #[test]
    fn proc_mount_points_keep_the_outermost() {
        let text = "1 0 0:1 / / rw - overlay o rw\n2 1 0:2 / /proc rw - proc proc rw\n\
                    3 2 0:3 / /proc/kcore rw - tmpfs t rw\n4 1 0:4 / /host\\040proc rw - proc p rw\n\
                    5 2 0:5 / /proc/sys rw - proc proc rw\n\n";
        assert_eq!(all_proc_mount_points(text).unwrap(), vec!["/host proc".to_string(), "/proc".to_string()]);
    }

    #[test]
    fn proc_mount_points_refuse_a_malformed_line() {
        let err = all_proc_mount_points("1 0 0:1 / /\n").unwrap_err();
        assert_eq!(err, "mountinfo: malformed line '1 0 0:1 / /'");
        assert!(all_proc_mount_points("1 0 0:1 / / rw -\n").is_err());
        assert!(all_proc_mount_points("1 0 0:1 / / rw - \n").is_err());
        assert!(all_proc_mount_points("1 0 / / - proc p rw\n").is_err());
        assert_eq!(all_proc_mount_points("1 0 / / rw - proc p rw\n").unwrap(), vec!["rw".to_string()]);
    }

    #[test]
    fn proc_mount_points_split_lines_as_python() {
        // \r ends a line for Python's splitlines: the rest is a line of its own.
        let text = "2 1 0:2 / /proc rw - proc proc rw\r\n3 1 0:3 / /a\x0bb rw - proc p rw\n";
        assert!(all_proc_mount_points(text).is_err());
        let text = "2 1 0:2 / /proc rw - proc proc rw\r\n3 1 0:3 / /x\x1cy rw - proc p rw\n";
        assert!(all_proc_mount_points(text).is_err());
        let text = "2 1 0:2 / /proc rw - proc proc rw\r\n   \n";
        assert_eq!(all_proc_mount_points(text).unwrap(), vec!["/proc".to_string()]);
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        assert_eq!(unescape("/a\\04"), "/a\\04");
        assert_eq!(unescape("/a\\8xx"), "/a\\8xx");
        assert_eq!(unescape("/a\\777"), "/a\u{1ff}");
    }

    #[test]
    fn failure_says_how() {
        assert_eq!(failure(0), None);
        assert_eq!(failure(3 << 8).as_deref(), Some("exited with status 3"));
        assert_eq!(failure(9).as_deref(), Some("was killed by SIGKILL"));
        assert_eq!(failure(11 | 0x80).as_deref(), Some("was killed by SIGSEGV"));
        assert_eq!(signal_name(31), "SIGSYS");
        assert_eq!(signal_name(34), "SIGRTMIN");
        assert_eq!(signal_name(40), "signal 40");
    }

    #[test]
    fn tail_is_stripped_and_cut() {
        assert_eq!(quoted_tail(b"  hello\n"), "hello");
        let long = "é".repeat(1500);
        assert_eq!(quoted_tail(long.as_bytes()).chars().count(), 1000);
        assert_eq!(quoted_tail(b"\xff ok"), "\u{fffd} ok");
    }

    #[test]
    fn failures_are_told_as_python_tells_them() {
        let texts: Vec<Vec<u8>> = (0..=LAST_ERRNO).map(|n| sys::strerror_text(n).into_bytes()).collect();
        let told = |failed: Failed| {
            let mut line = Line { bytes: [0; 2048], len: 0 };
            failed.tell(&texts, &mut line);
            String::from_utf8(line.text().to_vec()).unwrap()
        };
        let eperm = |says| Failed { errno: 1, says };
        assert_eq!(
            told(eperm(Says::Call(b"unshare(0x4c020000)"))),
            "[Errno 1] unshare(0x4c020000): Operation not permitted"
        );
        assert_eq!(told(eperm(Says::Path(b"'.'"))), "[Errno 1] Operation not permitted: '.'");
        assert_eq!(told(eperm(Says::Plain)), "[Errno 1] Operation not permitted");
        assert_eq!(told(Failed { errno: 8, says: Says::Fd(12) }), "[Errno 8] Exec format error: 12");
        assert_eq!(told(eperm(Says::CapDrop(40))), "[Errno 1] prctl(PR_CAPBSET_DROP, 40): Operation not permitted");
        assert_eq!(told(eperm(Says::Value(b"not allowed"))), "not allowed");
        assert_eq!(told(Failed { errno: 1000, says: Says::Plain }), "[Errno 1000] Unknown error 1000");
        let cover = Cover::new("/proc").unwrap();
        assert_eq!(
            told(Failed { errno: 2, says: Says::Call(&cover.call) }),
            "[Errno 2] /proc: openat2('/proc'): No such file or directory"
        );
        assert_eq!(eperm(Says::Call(b"fsmount")).strerror(), "fsmount: Operation not permitted");
        assert_eq!(eperm(Says::Path(b"'/'")).strerror(), "Operation not permitted");
    }

    #[test]
    fn a_line_is_cut_at_its_size() {
        let mut line = Line { bytes: [0; 2048], len: 0 };
        line.push(&[b'x'; 3000]);
        line.number(12);
        assert_eq!(line.text().len(), 2048);
        let mut line = Line { bytes: [0; 2048], len: 0 };
        line.number(0);
        line.number(u64::MAX);
        assert_eq!(line.text(), b"018446744073709551615");
    }

    #[test]
    fn only_the_containers_mounts_count_against_the_bound() {
        // Before pivot_root the host's mounts are listed too: a tenant's thousands of
        // volumes must not fail another container's start.
        let host = "36 25 0:32 / /var/lib/kubelet/pods/x/volumes/v rw - tmpfs tmpfs rw\n".repeat(1000);
        let ours = "40 39 0:5 / /run/b/rootfs/proc rw,nosuid - proc proc rw\n\
                    41 39 0:5 / /run/b/rootfs/srv/proc rw - proc proc rw\n\
                    42 25 0:5 / /run/b/rootfs-other/proc rw - proc proc rw\n";
        let data = format!("{}{}", host, ours);
        let found = container_proc_mounts(data.as_bytes(), "/run/b/rootfs", 200).unwrap();
        assert_eq!(found, vec!["/run/b/rootfs/proc", "/run/b/rootfs/srv/proc"]);
        // Cut short, one could be left uncovered: over the bound is refused.
        let over = container_proc_mounts(data.as_bytes(), "/run/b/rootfs", 100).unwrap_err();
        assert!(over.0.contains("over 100 bytes (the container's mounts)"), "{}", over.0);
        let bad = container_proc_mounts(b"not a mountinfo line\n", "/x", 100).unwrap_err();
        assert!(bad.0.starts_with("ValueError: mountinfo: malformed line"), "{}", bad.0);
    }

    #[test]
    fn open_trusted_checks_the_file() {
        let missing = open_trusted("/nonexistent/ldconfig").err().unwrap();
        assert_eq!(missing.0, "/nonexistent/ldconfig: No such file or directory");
        let dir = std::env::temp_dir().join(format!("ldrebuild-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("plain");
        std::fs::write(&plain, b"data").unwrap();
        let path = plain.to_str().unwrap();
        assert_eq!(open_trusted(path).err().unwrap().0, format!("{}: not an executable file", path));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
