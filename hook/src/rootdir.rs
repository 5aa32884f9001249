//! The container's root as a directory fd, and every path resolved against it
//! (`engine/start/rootdir.py`, whose reasons hold here word for word).
//!
//! A path string handed to `open` would follow whatever the image put on the
//! way: an absolute symlink, `..`, or a procfs magic link such as `/proc/1/root`
//! that leads back out to the host. So every path inside the container is
//! resolved with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from the root
//! fd: symlinks are followed as the container would see them (absolute ones
//! restart at the container's root, `..` stops there) and magic links are
//! refused. Final components are then handled with the `*at` calls relative to a
//! resolved directory fd, with no-follow flags.
//!
//! Files are read and written through `RootDir::detached_copy`: a detached clone
//! of the container's mount tree that is `nodev,nosuid` throughout and writable
//! at its top. A device node of the image or of a volume cannot be opened through
//! it, the container's own mounts keep their flags, and the clone goes away with
//! the process. Every open is one `openat2` with `O_NONBLOCK | O_NOCTTY` (a FIFO
//! opened that way for reading never waits), then `fstat` decides.

use std::io;
use std::os::unix::io::{AsRawFd, OwnedFd, RawFd};

use crate::error::{Result, WorkError};
use crate::sys;

pub const IN_ROOT: u64 = sys::RESOLVE_IN_ROOT | sys::RESOLVE_NO_MAGICLINKS;
/// For a directory written into: stay on the container's root file system. A
/// link (or a path) into a volume or a host bind mount is refused: there the
/// hook's rights are not the container's.
pub const WRITE: u64 = sys::RESOLVE_NO_XDEV;
/// For a file read: the same. A file reached through a volume counts as absent.
pub const READ: u64 = sys::RESOLVE_NO_XDEV;
const DIR: u64 = sys::O_PATH | sys::O_DIRECTORY;
const CLONE: u32 = sys::OPEN_TREE_CLONE | sys::OPEN_TREE_CLOEXEC | sys::AT_RECURSIVE | sys::AT_EMPTY_PATH;

/// A reader's sentence for `err` on the container path `path` (`rootdir.describe`).
pub fn describe(err: &io::Error, path: &str) -> String {
    match err.raw_os_error() {
        Some(sys::ELOOP) => format!(
            "{}: refused: its resolution meets a link not followed here (a symlink, a /proc magic link or a loop)",
            path
        ),
        Some(sys::EXDEV) => format!(
            "{}: refused: it leads out of the container's root file system (into a volume or another mount), \
             where the plugin's rights are not the container's",
            path
        ),
        Some(sys::ENOTDIR) => format!("{}: a path component is not a directory", path),
        Some(sys::EROFS) => format!("{}: read-only file system", path),
        _ => format!("{}: {}", path, sys::error_text(err)),
    }
}

/// `WorkError(describe(err, path))`.
pub fn fail(err: &io::Error, path: &str) -> WorkError {
    WorkError(describe(err, path))
}

pub fn is_errno(err: &io::Error, code: i32) -> bool {
    err.raw_os_error() == Some(code)
}

/// `/a/b/c` -> (`/a/b`, `c`) for a clean absolute path with a final name.
pub fn split(path: &str) -> Result<(&str, &str)> {
    let (parent, name) = match path.rfind('/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(WorkError(format!("{} has no final file name", crate::error::py_repr(path))));
    }
    Ok((if parent.is_empty() { "/" } else { parent }, name))
}

/// A file bigger than its reader's limit.
#[derive(Debug)]
pub enum ReadError {
    OverLimit(String),
    Other(WorkError),
}

impl From<ReadError> for WorkError {
    fn from(err: ReadError) -> WorkError {
        match err {
            ReadError::OverLimit(message) => WorkError(message),
            ReadError::Other(err) => err,
        }
    }
}

/// The container's root directory (an `O_PATH` directory fd).
pub struct RootDir {
    fd: OwnedFd,
}

impl RootDir {
    /// The directory `path` (on the host: the bundle's root before `pivot_root`).
    pub fn open_path(path: &str) -> io::Result<RootDir> {
        Ok(RootDir { fd: sys::openat_fd(sys::AT_FDCWD, path, DIR, 0)? })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A detached clone of the mount tree at this root: `nodev,nosuid` on every
    /// mount, writable at the top mount only. Nothing of the container's own mounts
    /// changes.
    pub fn detached_copy(&self) -> Result<RootDir> {
        let fd = sys::open_tree(self.fd(), "", CLONE)
            .map_err(|e| WorkError(describe(&e, "/") + " (cloning the container's mounts)"))?;
        let safe = sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOSUID;
        let setup = || -> io::Result<()> {
            // Private: a clone of a shared mount would otherwise join its peer group.
            sys::mount_setattr(fd.as_raw_fd(), "", sys::AT_EMPTY_PATH | sys::AT_RECURSIVE, safe, 0, sys::MS_PRIVATE)?;
            // A file system read-only itself (erofs) stays so: a write then fails
            // naming its path, and work that writes nothing still runs.
            sys::mount_setattr(fd.as_raw_fd(), "", sys::AT_EMPTY_PATH, 0, sys::MOUNT_ATTR_RDONLY, 0)
        };
        setup().map_err(|e| WorkError(describe(&e, "/") + " (setting up the writable copy of the root)"))?;
        Ok(RootDir { fd })
    }

    /// An fd for `path` resolved in the root; the caller explains an error.
    pub fn open(&self, path: &str, flags: u64, mode: u64, resolve: u64) -> io::Result<OwnedFd> {
        sys::openat2(self.fd(), path, flags, mode, IN_ROOT | resolve)
    }

    /// An `O_PATH` fd of the directory at `path`.
    pub fn opendir(&self, path: &str, resolve: u64) -> Result<OwnedFd> {
        self.open(path, DIR, 0, resolve).map_err(|e| fail(&e, path))
    }

    /// Like `opendir`, `None` when `path` does not exist.
    pub fn find_dir(&self, path: &str, resolve: u64) -> Result<Option<OwnedFd>> {
        match self.open(path, DIR, 0, resolve) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if is_errno(&e, sys::ENOENT) => Ok(None),
            Err(e) => Err(fail(&e, path)),
        }
    }

    /// `mkdir -p` inside the root; an `O_PATH` fd of the directory, by default on
    /// the root file system only (`WRITE`). Each prefix is resolved from the root
    /// again, so a symlink on the way is followed as the container will follow it;
    /// one that points nowhere is an error.
    pub fn makedirs(&self, path: &str, mode: u32, resolve: u64) -> Result<OwnedFd> {
        let mut fd = self.fd.try_clone().map_err(|e| fail(&e, "/"))?;
        let mut prefix = String::new();
        for name in path.split('/').filter(|p| !p.is_empty()) {
            prefix.push('/');
            prefix.push_str(name);
            let found = match self.find_dir(&prefix, resolve)? {
                Some(found) => found,
                None => {
                    match sys::mkdir_at(fd.as_raw_fd(), name, mode) {
                        Ok(()) => {}
                        Err(e) if is_errno(&e, sys::EEXIST) => {} // a dangling link (below) or a racing mkdir
                        Err(e) => return Err(fail(&e, &prefix)),
                    }
                    match self.find_dir(&prefix, resolve)? {
                        Some(found) => found,
                        None => {
                            return Err(WorkError(format!(
                                "{}: a symlink to nowhere in the container is in the way",
                                prefix
                            )))
                        }
                    }
                }
            };
            fd = found;
        }
        Ok(fd)
    }

    /// Contents of the regular file at `path` (links followed in the root, by
    /// default on the root file system only), `None` if it does not exist or lies
    /// across a mount; an error if it is no regular file or over `limit`.
    pub fn read_small(&self, path: &str, limit: u64, resolve: u64) -> std::result::Result<Option<Vec<u8>>, ReadError> {
        let fd = match self.open(path, sys::O_RDONLY | sys::O_NONBLOCK | sys::O_NOCTTY, 0, resolve) {
            Ok(fd) => fd,
            Err(e) if is_errno(&e, sys::ENOENT) => return Ok(None),
            Err(e) if is_errno(&e, sys::EXDEV) && resolve & sys::RESOLVE_NO_XDEV != 0 => return Ok(None),
            Err(e) => return Err(ReadError::Other(fail(&e, path))),
        };
        read_regular(fd.as_raw_fd(), path, limit).map(|(data, _)| Some(data))
    }
}

/// All of the regular file `fd`, and its `stat` (taken before reading), refusing
/// FIFOs, devices and oversized files (by their size before reading, and by
/// what the reads return).
pub fn read_regular(fd: RawFd, what: &str, limit: u64) -> std::result::Result<(Vec<u8>, sys::Stat), ReadError> {
    let info = sys::fstat(fd).map_err(|e| ReadError::Other(fail(&e, what)))?;
    if !info.is_reg() {
        return Err(ReadError::Other(WorkError(format!("{}: not a regular file", what))));
    }
    if info.size > limit {
        return Err(ReadError::OverLimit(format!("{}: {} bytes, over the limit of {} bytes", what, info.size, limit)));
    }
    let data = sys::read_up_to(fd, limit + 1).map_err(|e| ReadError::Other(fail(&e, what)))?;
    if data.len() as u64 > limit {
        return Err(ReadError::OverLimit(format!(
            "{}: more than {} bytes, over the limit of {} bytes",
            what, limit, limit
        )));
    }
    Ok((data, info))
}

/// Replace `name` in `dirfd` with a file holding `data`: a temporary created with
/// `O_EXCL | O_NOFOLLOW` (never written through a planted link), then renamed over
/// the name (which replaces a link rather than following it).
pub fn write_atomically(dirfd: RawFd, name: &str, data: &[u8], mode: u32, what: &str) -> Result<()> {
    let tmp = format!(".{}.nri-gpu-tmp", name);
    let run = || -> io::Result<()> {
        match sys::unlink_at(dirfd, &tmp, 0) {
            Ok(()) => {}
            Err(e) if is_errno(&e, sys::ENOENT) => {}
            Err(e) => return Err(e),
        }
        let flags = sys::O_WRONLY | sys::O_CREAT | sys::O_EXCL | sys::O_NOFOLLOW | sys::O_NOCTTY;
        let fd = sys::openat_fd(dirfd, &tmp, flags, mode)?;
        sys::write_all(fd.as_raw_fd(), data)?;
        sys::fchmod_fd(fd.as_raw_fd(), mode)?; // the umask does not decide what the container gets
        drop(fd);
        sys::rename_at(dirfd, &tmp, name)
    };
    run().map_err(|e| fail(&e, what))
}

/// What the regular file `name` in `dirfd` holds, or `None` (missing, a link, a
/// device, a FIFO, over `limit`: each is replaced by `write_file`).
pub fn current_bytes(dirfd: RawFd, name: &str, limit: u64) -> Option<Vec<u8>> {
    let flags = sys::O_RDONLY | sys::O_NOFOLLOW | sys::O_NONBLOCK | sys::O_NOCTTY;
    let fd = sys::openat_fd(dirfd, name, flags, 0).ok()?;
    read_regular(fd.as_raw_fd(), name, limit).ok().map(|(data, _)| data)
}

/// `path` in the container's root holding `data`: its folder made inside the root,
/// the file replaced atomically unless it already holds exactly that; true when written.
pub fn write_file(root: &RootDir, path: &str, data: &[u8], mode: u32) -> Result<bool> {
    let (parent, name) = split(path)?;
    let folder = root.makedirs(parent, 0o755, WRITE)?;
    if current_bytes(folder.as_raw_fd(), name, 1 << 16).as_deref() == Some(data) {
        return Ok(false);
    }
    write_atomically(folder.as_raw_fd(), name, data, mode, path)?;
    Ok(true)
}

/// `/a/b`: absolute, no empty, `.` or `..` component, no NUL or newline.
pub fn is_clean_absolute(path: &str) -> bool {
    if !path.starts_with('/') || path.contains('\0') || path.contains('\n') {
        return false;
    }
    path == "/" || path[1..].split('/').all(|p| !p.is_empty() && p != "." && p != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_paths() {
        assert_eq!(split("/a/b/c").unwrap(), ("/a/b", "c"));
        assert_eq!(split("/c").unwrap(), ("/", "c"));
        assert!(split("/a/").is_err());
        assert!(split("/a/..").is_err());
    }

    #[test]
    fn clean_absolute() {
        assert!(is_clean_absolute("/"));
        assert!(is_clean_absolute("/a/b"));
        assert!(!is_clean_absolute("a/b"));
        assert!(!is_clean_absolute("/a//b"));
        assert!(!is_clean_absolute("/a/../b"));
        assert!(!is_clean_absolute("/a/"));
        assert!(!is_clean_absolute("/a\nb"));
    }

    #[test]
    fn describe_names_the_path() {
        let e = io::Error::from_raw_os_error(sys::ENOENT);
        assert_eq!(describe(&e, "/x"), "/x: No such file or directory");
        let e = io::Error::from_raw_os_error(sys::ELOOP);
        assert!(describe(&e, "/x").starts_with("/x: refused: its resolution meets a link"));
    }
}
