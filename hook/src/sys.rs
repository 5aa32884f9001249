//! The one module that talks to the kernel directly: libc's `syscall(2)` for the
//! calls glibc has no wrapper for (`openat2`, the new mount API), and the few
//! libc functions std does not expose. Every wrapper returns `io::Result`, the
//! error carrying the errno (callers put the path in the message: `describe`).
//!
//! No crate beyond std: each libc function is declared here with its C
//! signature, for the 64-bit Linux targets the project builds for. The raw
//! declarations and numbers the ldconfig process needs after its `fork` (where
//! nothing may allocate) are the crate's too (`ldrebuild`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::raw::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::os::unix::io::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// <linux/sched.h>
pub const CLONE_NEWNS: c_int = 0x0002_0000;
// <fcntl.h>
pub const AT_FDCWD: c_int = -100;
pub const AT_EMPTY_PATH: c_uint = 0x1000;
pub const AT_RECURSIVE: c_uint = 0x8000;
pub const O_RDONLY: u64 = 0o0;
pub const O_WRONLY: u64 = 0o1;
pub const O_RDWR: u64 = 0o2;
pub const O_CREAT: u64 = 0o100;
pub const O_EXCL: u64 = 0o200;
pub const O_NOCTTY: u64 = 0o400;
pub const O_TRUNC: u64 = 0o1000;
pub const O_NONBLOCK: u64 = 0o4000;
pub const O_DIRECTORY: u64 = 0o200000;
pub const O_NOFOLLOW: u64 = 0o400000;
pub const O_CLOEXEC: u64 = 0o2000000;
pub const O_PATH: u64 = 0o10000000;
// <linux/mount.h>
pub const OPEN_TREE_CLONE: c_uint = 1;
pub const OPEN_TREE_CLOEXEC: c_uint = 0o2000000;
pub const MOVE_MOUNT_F_EMPTY_PATH: c_uint = 0x04;
pub const MOVE_MOUNT_T_EMPTY_PATH: c_uint = 0x40;
pub(crate) const FSOPEN_CLOEXEC: c_uint = 1;
pub(crate) const FSMOUNT_CLOEXEC: c_uint = 1;
pub(crate) const FSCONFIG_SET_STRING: c_uint = 1;
pub(crate) const FSCONFIG_CMD_CREATE: c_uint = 6;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MS_PRIVATE: u64 = 1 << 18;
pub const MNT_DETACH: c_int = 0x2;
pub const UMOUNT_NOFOLLOW: c_int = 0x8;
// <linux/openat2.h>
pub const RESOLVE_NO_XDEV: u64 = 0x01;
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;
pub const RESOLVE_IN_ROOT: u64 = 0x10;
// <errno.h>
pub const ENOENT: i32 = 2;
pub const EINTR: i32 = 4;
pub const EEXIST: i32 = 17;
pub const EXDEV: i32 = 18;
pub const ENOTDIR: i32 = 20;
pub const EINVAL: i32 = 22;
pub const EROFS: i32 = 30;
pub const ELOOP: i32 = 40;
// <sys/stat.h>
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;
pub const S_IFSOCK: u32 = 0o140000;
pub const S_IFIFO: u32 = 0o010000;
pub const S_IFCHR: u32 = 0o020000;
pub const S_IFBLK: u32 = 0o060000;
pub const S_ISVTX: u32 = 0o1000;

// The mount API and openat2 come from the generic syscall table: the same number
// on every architecture that got them after Linux 5.1.
const SYS_OPEN_TREE: c_long = 428;
pub(crate) const SYS_MOVE_MOUNT: c_long = 429;
pub(crate) const SYS_FSOPEN: c_long = 430;
pub(crate) const SYS_FSCONFIG: c_long = 431;
pub(crate) const SYS_FSMOUNT: c_long = 432;
pub(crate) const SYS_PIDFD_OPEN: c_long = 434;
pub(crate) const SYS_CLOSE_RANGE: c_long = 436;
pub(crate) const SYS_OPENAT2: c_long = 437;
pub(crate) const SYS_MOUNT_SETATTR: c_long = 442;
#[cfg(target_arch = "x86_64")]
const SYS_GETDENTS64: c_long = 217;
#[cfg(target_arch = "aarch64")]
const SYS_GETDENTS64: c_long = 61;

extern "C" {
    pub(crate) fn syscall(number: c_long, ...) -> c_long;
    fn __errno_location() -> *mut c_int;
    fn strerror(errnum: c_int) -> *const c_char;
    pub(crate) fn close(fd: c_int) -> c_int;
    pub(crate) fn setns(fd: c_int, nstype: c_int) -> c_int;
    fn umount2(target: *const c_char, flags: c_int) -> c_int;
    pub(crate) fn fchdir(fd: c_int) -> c_int;
    fn mkdirat(dirfd: c_int, path: *const c_char, mode: c_uint) -> c_int;
    fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int;
    fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, size: usize) -> isize;
    fn renameat(olddirfd: c_int, old: *const c_char, newdirfd: c_int, new: *const c_char) -> c_int;
    fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    fn openat(dirfd: c_int, path: *const c_char, flags: c_int, ...) -> c_int;
    pub(crate) fn fchmod(fd: c_int, mode: c_uint) -> c_int;
    fn fchmodat(dirfd: c_int, path: *const c_char, mode: c_uint, flags: c_int) -> c_int;
    pub(crate) fn write(fd: c_int, buf: *const c_void, count: usize) -> isize;
    pub(crate) fn _exit(status: c_int) -> !;
    fn signal(signum: c_int, handler: usize) -> usize;
    fn setitimer(which: c_int, new: *const Itimerval, old: *mut Itimerval) -> c_int;
    fn sigemptyset(set: *mut SigSet) -> c_int;
    fn sigaddset(set: *mut SigSet, signum: c_int) -> c_int;
    pub(crate) fn sigprocmask(how: c_int, set: *const SigSet, old: *mut SigSet) -> c_int;
    pub(crate) fn prctl(option: c_int, arg2: c_ulong, arg3: c_ulong, arg4: c_ulong, arg5: c_ulong) -> c_int;
}

/// glibc's `sigset_t`: 1024 bits.
#[repr(C)]
pub struct SigSet {
    pub bits: [u64; 16],
}

#[repr(C)]
struct Timeval {
    sec: i64,
    usec: i64,
}

#[repr(C)]
struct Itimerval {
    interval: Timeval,
    value: Timeval,
}

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
pub struct OpenHow {
    pub flags: u64,
    pub mode: u64,
    pub resolve: u64,
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
pub struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

/// The errno of the last failed call, as an `io::Error`.
pub fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// The errno of the last failed call (async-signal-safe: nothing allocated).
pub(crate) fn errno() -> i32 {
    // SAFETY: glibc's thread-local errno.
    unsafe { *__errno_location() }
}

/// C's `strerror(code)`: the words Python's `os.strerror` gives ("No such file or directory").
pub fn strerror_text(code: i32) -> String {
    // SAFETY: strerror returns a static (or thread-local) NUL-terminated string.
    unsafe {
        let text = strerror(code);
        if text.is_null() {
            return format!("error {}", code);
        }
        CStr::from_ptr(text).to_string_lossy().into_owned()
    }
}

/// The words for an `io::Error`: `strerror` of its errno, else its own text.
pub fn error_text(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => strerror_text(code),
        None => err.to_string(),
    }
}

pub fn cstring(path: &str) -> io::Result<CString> {
    CString::new(path).map_err(|_| io::Error::from_raw_os_error(EINVAL))
}

fn check(result: c_long) -> io::Result<c_long> {
    if result < 0 {
        Err(last_error())
    } else {
        Ok(result)
    }
}

fn owned(result: c_long) -> io::Result<OwnedFd> {
    let fd = check(result)?;
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Retry a call interrupted by a signal (the time limit's handler exits, others restart).
fn retry<F: FnMut() -> c_long>(mut call: F) -> io::Result<c_long> {
    loop {
        let result = call();
        if result < 0 && errno() == EINTR {
            continue;
        }
        return check(result);
    }
}

/// `openat2(2)`: `path` under `dirfd` with `RESOLVE_*` rules; `O_CLOEXEC` always.
pub fn openat2(dirfd: RawFd, path: &str, flags: u64, mode: u64, resolve: u64) -> io::Result<OwnedFd> {
    let name = cstring(path)?;
    let how = OpenHow { flags: flags | O_CLOEXEC, mode, resolve };
    let fd = retry(|| unsafe {
        syscall(SYS_OPENAT2, dirfd as c_long, name.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    })?;
    // SAFETY: a new descriptor of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `openat(2)` with `O_CLOEXEC`: one name relative to a directory we resolved.
pub fn openat_fd(dirfd: RawFd, name: &str, flags: u64, mode: u32) -> io::Result<OwnedFd> {
    let c = cstring(name)?;
    let fd = retry(|| unsafe { openat(dirfd, c.as_ptr(), (flags | O_CLOEXEC) as c_int, mode as c_uint) as c_long })?;
    // SAFETY: a new descriptor of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `open_tree(2)`: with `OPEN_TREE_CLONE`, a detached copy of the mount tree at `path`.
pub fn open_tree(dirfd: RawFd, path: &str, flags: c_uint) -> io::Result<OwnedFd> {
    let c = cstring(path)?;
    owned(unsafe { syscall(SYS_OPEN_TREE, dirfd as c_long, c.as_ptr(), flags as c_long) })
}

/// `move_mount(2)`.
pub fn move_mount(from: RawFd, from_path: &str, to: RawFd, to_path: &str, flags: c_uint) -> io::Result<()> {
    let f = cstring(from_path)?;
    let t = cstring(to_path)?;
    check(unsafe { syscall(SYS_MOVE_MOUNT, from as c_long, f.as_ptr(), to as c_long, t.as_ptr(), flags as c_long) })
        .map(|_| ())
}

/// `mount_setattr(2)` of `path` under `dirfd` (`AT_EMPTY_PATH` with "" for the fd itself).
pub fn mount_setattr(
    dirfd: RawFd,
    path: &str,
    flags: c_uint,
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
) -> io::Result<()> {
    let c = cstring(path)?;
    let attr = MountAttr { attr_set, attr_clr, propagation, userns_fd: 0 };
    check(unsafe {
        syscall(
            SYS_MOUNT_SETATTR,
            dirfd as c_long,
            c.as_ptr(),
            flags as c_long,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(|_| ())
}

/// A detached `nosuid,nodev,noexec` tmpfs with `options` (key, value), as a mount fd.
pub fn new_tmpfs(options: &[(&str, &str)], read_only: bool) -> io::Result<OwnedFd> {
    let kind = cstring("tmpfs")?;
    let fs = owned(unsafe { syscall(SYS_FSOPEN, kind.as_ptr(), FSOPEN_CLOEXEC as c_long) })?;
    for (key, value) in options {
        let k = cstring(key)?;
        let v = cstring(value)?;
        check(unsafe {
            syscall(SYS_FSCONFIG, fs.as_raw_fd() as c_long, FSCONFIG_SET_STRING as c_long, k.as_ptr(), v.as_ptr(), 0)
        })?;
    }
    check(unsafe {
        syscall(
            SYS_FSCONFIG,
            fs.as_raw_fd() as c_long,
            FSCONFIG_CMD_CREATE as c_long,
            std::ptr::null::<c_char>(),
            std::ptr::null::<c_char>(),
            0,
        )
    })?;
    let flags =
        MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC | if read_only { MOUNT_ATTR_RDONLY } else { 0 };
    owned(unsafe { syscall(SYS_FSMOUNT, fs.as_raw_fd() as c_long, FSMOUNT_CLOEXEC as c_long, flags as c_long) })
}

/// `umount2` of one `name` relative to the cwd (callers `fchdir` to a checked directory first).
pub fn umount2_name(name: &str, flags: c_int) -> io::Result<()> {
    let c = cstring(name)?;
    check(unsafe { umount2(c.as_ptr(), flags) } as c_long).map(|_| ())
}

pub fn fchdir_fd(fd: RawFd) -> io::Result<()> {
    check(unsafe { fchdir(fd) } as c_long).map(|_| ())
}

pub fn mkdir_at(dirfd: RawFd, name: &str, mode: u32) -> io::Result<()> {
    let c = cstring(name)?;
    check(unsafe { mkdirat(dirfd, c.as_ptr(), mode) } as c_long).map(|_| ())
}

pub fn symlink_at(target: &str, dirfd: RawFd, name: &str) -> io::Result<()> {
    let t = cstring(target)?;
    let c = cstring(name)?;
    check(unsafe { symlinkat(t.as_ptr(), dirfd, c.as_ptr()) } as c_long).map(|_| ())
}

/// `readlinkat(2)`: the link's target as bytes (up to 4096 of them).
pub fn readlink_at(dirfd: RawFd, name: &str) -> io::Result<Vec<u8>> {
    let c = cstring(name)?;
    let mut buf = vec![0u8; 4097];
    let n = unsafe { readlinkat(dirfd, c.as_ptr(), buf.as_mut_ptr() as *mut c_char, buf.len()) };
    if n < 0 {
        return Err(last_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn rename_at(dirfd: RawFd, old: &str, new: &str) -> io::Result<()> {
    let o = cstring(old)?;
    let n = cstring(new)?;
    check(unsafe { renameat(dirfd, o.as_ptr(), dirfd, n.as_ptr()) } as c_long).map(|_| ())
}

pub fn unlink_at(dirfd: RawFd, name: &str, flags: c_int) -> io::Result<()> {
    let c = cstring(name)?;
    check(unsafe { unlinkat(dirfd, c.as_ptr(), flags) } as c_long).map(|_| ())
}

pub fn fchmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    check(unsafe { fchmod(fd, mode) } as c_long).map(|_| ())
}

/// `fchmodat` without following a link (a name in a directory of our own making).
pub fn chmod_at(dirfd: RawFd, name: &str, mode: u32) -> io::Result<()> {
    let c = cstring(name)?;
    check(unsafe { fchmodat(dirfd, c.as_ptr(), mode, 0) } as c_long).map(|_| ())
}

/// `stat` of what `fd` refers to (`fstat`, through std).
pub fn fstat(fd: RawFd) -> io::Result<Stat> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: borrowed for the call only; ManuallyDrop keeps the File from closing it.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let meta = file.metadata()?;
    Ok(Stat { dev: meta.dev(), ino: meta.ino(), mode: meta.mode(), uid: meta.uid(), size: meta.size() })
}

/// The few fields of `struct stat` the hook looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub size: u64,
}

impl Stat {
    pub fn kind(&self) -> u32 {
        self.mode & S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == S_IFDIR
    }
    pub fn is_reg(&self) -> bool {
        self.kind() == S_IFREG
    }
    pub fn is_link(&self) -> bool {
        self.kind() == S_IFLNK
    }
    pub fn same_inode(&self, other: &Stat) -> bool {
        (self.dev, self.ino) == (other.dev, other.ino)
    }
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`: opens `name` `O_PATH|O_NOFOLLOW` and stats it
/// (a link is stat'ed as the link, as Python's `os.stat(..., follow_symlinks=False)`).
pub fn lstat_at(dirfd: RawFd, name: &str) -> io::Result<Stat> {
    let fd = openat_fd(dirfd, name, O_PATH | O_NOFOLLOW, 0)?;
    fstat(fd.as_raw_fd())
}

/// `pread` of up to `size` bytes at `offset` (short only at the end of the file).
pub fn pread(fd: RawFd, offset: u64, size: usize) -> io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let mut buf = vec![0u8; size];
    let mut done = 0;
    while done < size {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// What `fd` holds from where it is to its end, but at most `limit` bytes (a
/// reader that refuses more asks for one byte over its bound). Read without a
/// buffer: nothing past what is returned is taken from `fd`.
pub fn read_up_to(fd: RawFd, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    // SAFETY: borrowed for the call only; ManuallyDrop keeps the File from closing it.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let mut data = Vec::with_capacity(std::cmp::min(limit, 64 << 10) as usize);
    (&*file).take(limit).read_to_end(&mut data)?; // interrupted reads are retried
    Ok(data)
}

/// Write all of `data` to `fd`.
pub fn write_all(fd: RawFd, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    file.write_all(data)
}

/// One directory entry as `getdents64` gives it: its name and `d_type` (`DT_*`).
pub struct DirEntry {
    pub name: String,
    pub kind: u8,
}
pub const DT_UNKNOWN: u8 = 0;
pub const DT_REG: u8 = 8;
pub const DT_LNK: u8 = 10;

/// The entries of the directory open (for reading) at `fd`, `.` and `..` left out;
/// `Ok(None)` when there are more than `limit`. Names that are not UTF-8 are kept
/// lossily (no such name is ever one the hook looks for).
pub fn list_dir(fd: RawFd, limit: usize) -> io::Result<Option<Vec<DirEntry>>> {
    let mut found = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = retry(|| unsafe { syscall(SYS_GETDENTS64, fd as c_long, buf.as_mut_ptr(), buf.len()) })? as usize;
        if n == 0 {
            return Ok(Some(found));
        }
        let mut at = 0;
        while at + 19 <= n {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen < 19 || at + reclen > n {
                return Err(io::Error::from_raw_os_error(EINVAL));
            }
            let kind = buf[at + 18];
            let raw = &buf[at + 19..at + reclen];
            let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
            let name = String::from_utf8_lossy(&raw[..end]).into_owned();
            at += reclen;
            if name == "." || name == ".." {
                continue;
            }
            if found.len() >= limit {
                return Ok(None);
            }
            found.push(DirEntry { name, kind });
        }
    }
}

// ---------------------------------------------------------------- the time limit

const SIGALRM: c_int = 14;
const SIG_UNBLOCK: c_int = 1;
const ITIMER_REAL: c_int = 0;
static mut EXPIRED_MESSAGE: [u8; 256] = [0; 256];
static mut EXPIRED_LEN: usize = 0;

extern "C" fn expire(_signum: c_int) {
    // Only async-signal-safe calls: write(2) and _exit(2).
    unsafe {
        let ptr = std::ptr::addr_of!(EXPIRED_MESSAGE) as *const u8;
        write(2, ptr as *const c_void, EXPIRED_LEN);
        _exit(1);
    }
}

/// End this process with status 1 and `message` on stderr once `seconds` have passed,
/// whatever it is doing then (a read that never ends, a stuck file system).
pub fn exit_after(seconds: f64, message: &str) -> io::Result<()> {
    let bytes = message.as_bytes();
    let len = bytes.len().min(256);
    // SAFETY: set once, before the handler can run (the timer is armed after).
    unsafe {
        let dst = std::ptr::addr_of_mut!(EXPIRED_MESSAGE) as *mut u8;
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, len);
        EXPIRED_LEN = len;
        if signal(SIGALRM, expire as *const () as usize) == usize::MAX {
            return Err(last_error());
        }
    }
    // The runtime may start the hook with SIGALRM blocked (a mask is inherited
    // through exec): then the limit would never fire.
    let mut alarm = SigSet { bits: [0; 16] };
    // SAFETY: a sigset_t-sized buffer of ours.
    unsafe {
        sigemptyset(&mut alarm);
        sigaddset(&mut alarm, SIGALRM);
        if sigprocmask(SIG_UNBLOCK, &alarm, std::ptr::null_mut()) != 0 {
            return Err(last_error());
        }
    }
    let whole = seconds.floor();
    // Rounded up: a limit below a microsecond must not become {0, 0}, which
    // turns the timer off instead of firing it.
    let mut sec = whole as i64;
    let mut usec = (((seconds - whole) * 1e6).ceil() as i64).max(if sec == 0 { 1 } else { 0 });
    if usec >= 1_000_000 {
        sec += 1;
        usec = 0;
    }
    let timer = Itimerval { interval: Timeval { sec: 0, usec: 0 }, value: Timeval { sec, usec } };
    check(unsafe { setitimer(ITIMER_REAL, &timer, std::ptr::null_mut()) } as c_long).map(|_| ())
}

// <linux/prctl.h>
pub(crate) const PR_SET_DUMPABLE: c_int = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_up_to_stops_at_its_limit() {
        let path = std::env::temp_dir().join(format!("nri-gpu-read-up-to-{}", std::process::id()));
        std::fs::write(&path, vec![b'x'; 65]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(read_up_to(file.as_raw_fd(), 100).unwrap().len(), 65);
        // A file past a reader's bound is not read to its end.
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(read_up_to(file.as_raw_fd(), 64).unwrap().len(), 64);
        assert_eq!(read_up_to(file.as_raw_fd(), 64).unwrap(), b"x");
        std::fs::remove_file(&path).unwrap();
    }
}
