//! What the root-only test programs (`harness = false`: libtest's threads cannot
//! enter a mount namespace) share: a private mount namespace with a scratch tmpfs
//! in a new temporary directory, and its removal at the end.

use std::ffi::CString;
use std::fs;
use std::os::raw::{c_char, c_int, c_ulong, c_void};
use std::os::unix::io::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nri_gpu_hook::sys;

extern "C" {
    fn unshare(flags: c_int) -> c_int;
    fn mount(
        source: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
}

/// `mount(2)` of `source` on `target` (`fstype` None: a bind with `flags`).
pub fn mount_at(source: &str, target: &Path, fstype: Option<&str>, flags: c_ulong) {
    let (s, t) = (CString::new(source).expect("no NUL"), cstr(target));
    let kind = fstype.map(|k| CString::new(k).expect("no NUL"));
    let kind_ptr = kind.as_ref().map_or(std::ptr::null(), |k| k.as_ptr());
    // SAFETY: NUL-terminated strings that outlive the call; no data; in this
    // process's private mount namespace.
    let done = unsafe { mount(s.as_ptr(), t.as_ptr(), kind_ptr, flags, std::ptr::null()) };
    assert_eq!(done, 0, "mount {} on {:?}: {}", source, target, std::io::Error::last_os_error());
}

pub fn cstr(path: &Path) -> CString {
    CString::new(path_str(path)).expect("no NUL")
}

pub const EMPTY_BOTH: u32 = sys::MOVE_MOUNT_F_EMPTY_PATH | sys::MOVE_MOUNT_T_EMPTY_PATH;

/// The scratch tmpfs at `base`, in this process's own mount namespace.
pub struct Scratch {
    pub base: PathBuf,
    slash: OwnedFd,
}

impl Scratch {
    /// `None`, having said so, unless root (`needs`: what for). A hung test fails
    /// after 300 s rather than hang the run.
    pub fn enter(name: &str, needs: &str) -> Option<Scratch> {
        if sys::uid() != 0 {
            println!("{}: skipped: needs root ({})", name, needs);
            return None;
        }
        sys::exit_after(300.0, &format!("{}: timed out after 300 s\n", name)).expect("alarm");
        // SAFETY: a plain syscall; this process has one thread (no test harness).
        if unsafe { unshare(sys::CLONE_NEWNS) } != 0 {
            panic!("unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
        }
        let slash = sys::openat_fd(sys::AT_FDCWD, "/", sys::O_PATH | sys::O_DIRECTORY, 0).expect("open /");
        sys::mount_setattr(slash.as_raw_fd(), "", sys::AT_EMPTY_PATH | sys::AT_RECURSIVE, 0, 0, sys::MS_PRIVATE)
            .expect("make / rprivate");
        let base = std::env::temp_dir().join(format!("nri-gpu-{}-{}", name, std::process::id()));
        fs::create_dir(&base).expect("temporary directory");
        let scratch = sys::new_tmpfs(&[("mode", "0755")], false).expect("a tmpfs");
        let at = sys::openat_fd(sys::AT_FDCWD, path_str(&base), sys::O_PATH | sys::O_DIRECTORY, 0).expect("open base");
        sys::move_mount(scratch.as_raw_fd(), "", at.as_raw_fd(), "", EMPTY_BOTH).expect("mount the tmpfs");
        Some(Scratch { base, slash })
    }

    /// Unmount the tmpfs and remove its directory.
    pub fn leave(self) {
        let done = sys::fchdir_fd(self.slash.as_raw_fd())
            .and_then(|()| sys::umount2_name(path_str(&self.base).trim_start_matches('/'), sys::MNT_DETACH));
        done.expect("unmount the tmpfs");
        fs::remove_dir(&self.base).expect("remove the temporary directory");
    }
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
