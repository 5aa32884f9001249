//! The daemons' IPC endpoints at container start: the mount must be the host's
//! root-only inode (`engine/start/ipc.py`, `engine.root.Root.root_only_stat`).
//!
//! The spec was checked when it was written, but runc binds the host path at
//! every start, following links. If root's entry went away in between (the MPS
//! daemon quit, a tmp cleaner), any local account could have put a link to `/`
//! (or a folder of its own) there for runc to follow, then put things back. So,
//! for each endpoint the container got:
//!
//! 1. on the host side (`on_host`): the path is walked again from the driver root
//!    (no link, every folder and the entry root's alone, no mount point in a
//!    sticky folder), and its inode recorded;
//! 2. in the container's root (`check`): the destination is opened `O_PATH`
//!    (nothing is opened for I/O), links on the way resolved in the root as runc
//!    resolved them and the last one not followed, and it must be that very inode,
//!    of that type.

use std::io;
use std::os::unix::io::{AsRawFd, OwnedFd};

use crate::error::{Result, WorkError};
use crate::model::{EntryKind, IpcEndpoint, StartWork};
use crate::rootdir::{describe, is_clean_absolute, RootDir};
use crate::sys::{self, Stat};

/// (endpoint, the host inode's stat).
pub type Seen = Vec<(String, Stat)>;

const MOUNT_IN_STICKY: &str = "is a mount point in a sticky folder (its owner and mode are the mount's word)";

/// Each endpoint of `work` as it is on the host now.
pub fn on_host(work: &StartWork) -> Result<Seen> {
    let mut seen = Vec::new();
    for endpoint in &work.ipc {
        match root_only_stat(&work.ipc_root, endpoint) {
            Ok(Some(found)) => seen.push((endpoint.path.clone(), found)),
            Ok(None) => {
                // runc bound something there; with no root entry left to compare it
                // with, it may have been a user's link followed.
                return Err(WorkError(format!(
                    "IPC endpoint {}: {} is gone from the host",
                    endpoint.path,
                    host_path(&work.ipc_root, &endpoint.path)
                )));
            }
            Err(problem) => {
                return Err(WorkError(format!(
                    "IPC endpoint {}: {}; the container's mount of it may be anything",
                    endpoint.path, problem
                )))
            }
        }
    }
    Ok(seen)
}

/// Each endpoint mounted in `root` is the inode `on_host` saw.
pub fn check(root: &RootDir, seen: &Seen) -> Result<()> {
    for (path, host) in seen {
        let fd = root
            .open(path, sys::O_PATH | sys::O_NOFOLLOW, 0, 0)
            .map_err(|e| WorkError(format!("IPC endpoint {} in the container", describe(&e, path))))?;
        let mounted = sys::fstat(fd.as_raw_fd()).map_err(|e| WorkError(describe(&e, path)))?;
        if !mounted.same_inode(host) || mounted.kind() != host.kind() {
            return Err(WorkError(format!(
                "IPC endpoint {}: the container's mount is not the host's root-owned entry \
                 (the path was replaced after it was checked, and runc bound what was there); refused",
                path
            )));
        }
    }
    Ok(())
}

/// Where `node_path` lies on the host under `root` (`Root.host_path`).
fn host_path(root: &str, node_path: &str) -> String {
    let clean = format!("/{}", node_path.trim_start_matches('/'));
    if root == "/" {
        clean
    } else {
        format!("{}{}", root.trim_end_matches('/'), if clean == "/" { "" } else { &clean })
    }
}

fn type_name(kind: u32) -> &'static str {
    match kind {
        sys::S_IFSOCK => "a socket",
        sys::S_IFDIR => "a directory",
        sys::S_IFREG => "a regular file",
        sys::S_IFLNK => "a symbolic link",
        sys::S_IFIFO => "a FIFO",
        sys::S_IFCHR => "a character device",
        sys::S_IFBLK => "a block device",
        _ => "of an unknown type",
    }
}

fn check_folder(shown: &str, st: &Stat, sticky_ok: bool) -> std::result::Result<(), String> {
    if st.uid != 0 {
        return Err(format!("{} is owned by uid {}, not root", shown, st.uid));
    }
    if st.mode & 0o022 != 0 && !(sticky_ok && st.mode & sys::S_ISVTX != 0) {
        return Err(format!("{} is writable by group or others (mode {:04o})", shown, st.mode & 0o7777));
    }
    Ok(())
}

/// The stat of `endpoint.path` under `root` if it is, without following any link,
/// an entry of its kind that only root can change; `None` if it is absent; the
/// problem, naming the component, if it is there but not safe to hand out.
fn root_only_stat(root: &str, endpoint: &IpcEndpoint) -> std::result::Result<Option<Stat>, String> {
    let node_path = endpoint.path.as_str();
    if node_path == "/" || !is_clean_absolute(node_path) {
        return Err(format!("{} is not a clean absolute path", crate::error::py_repr(node_path)));
    }
    let parts: Vec<&str> = node_path[1..].split('/').collect();
    let mut fd: OwnedFd = sys::openat_fd(sys::AT_FDCWD, root, sys::O_PATH | sys::O_DIRECTORY, 0)
        .map_err(|e| format!("{}: {}", root, sys::error_text(&e)))?;
    let mut parent = sys::fstat(fd.as_raw_fd()).map_err(|e| format!("{}: {}", root, sys::error_text(&e)))?;
    check_folder(root, &parent, true)?;
    for (depth, name) in parts.iter().enumerate() {
        let shown = host_path(root, &parts[..=depth].join("/"));
        let in_sticky = parent.mode & sys::S_ISVTX != 0;
        let opened: io::Result<OwnedFd> = if in_sticky {
            // Anyone may mount a FUSE file system on a folder of theirs there: refuse
            // the crossing in the lookup itself, never asking the mounted file system.
            sys::openat2(
                fd.as_raw_fd(),
                name,
                sys::O_PATH | sys::O_NOFOLLOW,
                0,
                sys::RESOLVE_NO_XDEV | sys::RESOLVE_NO_SYMLINKS,
            )
        } else {
            sys::openat_fd(fd.as_raw_fd(), name, sys::O_PATH | sys::O_NOFOLLOW, 0)
        };
        let child = match opened {
            Ok(child) => child,
            Err(e) if e.raw_os_error() == Some(sys::ENOENT) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(sys::EXDEV) => return Err(format!("{} {}", shown, MOUNT_IN_STICKY)),
            Err(e) => return Err(format!("{}: {}", shown, sys::error_text(&e))),
        };
        fd = child;
        let last = depth + 1 == parts.len();
        let st = sys::fstat(fd.as_raw_fd()).map_err(|e| format!("{}: {}", shown, sys::error_text(&e)))?;
        let want = if last {
            match endpoint.kind {
                EntryKind::Socket => sys::S_IFSOCK,
                EntryKind::Directory => sys::S_IFDIR,
            }
        } else {
            sys::S_IFDIR
        };
        if st.kind() != want {
            if st.is_link() {
                return Err(format!("{} is a symbolic link (links are never followed here)", shown));
            }
            return Err(format!("{} is {}, not {}", shown, type_name(st.kind()), type_name(want)));
        }
        if in_sticky && st.dev != parent.dev {
            return Err(format!("{} {}", shown, MOUNT_IN_STICKY));
        }
        if st.is_dir() {
            check_folder(&shown, &st, !last)?;
        } else if st.uid != 0 {
            return Err(format!("{} is owned by uid {}, not root", shown, st.uid));
        }
        parent = st;
    }
    Ok(Some(parent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths() {
        assert_eq!(host_path("/", "/run/x"), "/run/x");
        assert_eq!(host_path("/drv", "/run/x"), "/drv/run/x");
    }
}
