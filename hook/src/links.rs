//! The driver-library symlinks (`libcuda.so.1 -> libcuda.so.550.163.01`) in the
//! container (`engine/start/links.py`).
//!
//! The toolkit's `create-symlinks` hook was CVE-2024-0134: links were created by
//! path, so an image symlink on the way put them outside the container. Here the
//! link's directory is resolved inside the root (`RootDir`), the link is made with
//! `symlinkat` relative to that directory fd (where the name is free), or under a
//! temporary name that `renameat` puts in place atomically (replacing a file or a
//! stale link, never following one). A link that already points where it should
//! is left as it is, so a second run changes nothing.

use std::collections::btree_map::{BTreeMap, Entry};
use std::io;
use std::os::unix::io::{AsRawFd, OwnedFd, RawFd};

use crate::error::{Result, WorkError};
use crate::model::Symlink;
use crate::rootdir::{fail, is_errno, split, RootDir, WRITE};
use crate::sys;

/// Create every link; how many were created or replaced.
pub fn create(root: &RootDir, links: &[Symlink]) -> Result<usize> {
    let mut parents: BTreeMap<&str, OwnedFd> = BTreeMap::new();
    let mut made = 0;
    for link in links {
        let (parent, name) = split(&link.path)?;
        let dirfd = match parents.entry(parent) {
            Entry::Occupied(found) => found.get().as_raw_fd(),
            Entry::Vacant(slot) => slot.insert(root.makedirs(parent, 0o755, WRITE)?).as_raw_fd(),
        };
        match place(dirfd, name, link) {
            Ok(true) => made += 1,
            Ok(false) => {}
            Err(Placing::Io(e)) => return Err(fail(&e, &link.path)),
            Err(Placing::Work(e)) => return Err(e),
        }
    }
    Ok(made)
}

enum Placing {
    Io(io::Error),
    Work(WorkError),
}

impl From<io::Error> for Placing {
    fn from(e: io::Error) -> Placing {
        Placing::Io(e)
    }
}

fn place(dirfd: RawFd, name: &str, link: &Symlink) -> std::result::Result<bool, Placing> {
    match sys::readlink_at(dirfd, name) {
        Ok(target) if target == link.target.as_bytes() => return Ok(false),
        Ok(_) => {}
        Err(e) if is_errno(&e, sys::ENOENT) => {
            // Nothing there: symlinkat creates it atomically (and never follows a
            // name that appeared meanwhile: EEXIST, then replaced below). Half the
            // cost of temporary + rename on overlayfs, where each create is dear.
            match sys::symlink_at(&link.target, dirfd, name) {
                Ok(()) => return Ok(true),
                Err(e) if is_errno(&e, sys::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) if is_errno(&e, sys::EINVAL) => {
            // There, but not a symlink.
            if sys::lstat_at(dirfd, name)?.is_dir() {
                return Err(Placing::Work(WorkError(format!(
                    "{}: a directory is in the way of the link to {}",
                    link.path, link.target
                ))));
            }
        }
        Err(e) => return Err(e.into()),
    }
    let tmp = format!(".{}.nri-gpu-tmp", name);
    match sys::unlink_at(dirfd, &tmp, 0) {
        Ok(()) => {}
        Err(e) if is_errno(&e, sys::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    sys::symlink_at(&link.target, dirfd, &tmp)?;
    sys::rename_at(dirfd, &tmp, name)?;
    Ok(true)
}
