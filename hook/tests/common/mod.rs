//! What the root-only test programs (`harness = false`: libtest's threads cannot
//! enter a mount namespace) share: a private mount namespace with a scratch tmpfs
//! in a new temporary directory, and its removal at the end; the runner of their
//! cases; and the helpers both use.

use std::ffi::CString;
use std::fs;
use std::os::raw::{c_char, c_int, c_uint, c_ulong, c_void};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::{AsRawFd, OwnedFd};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use nri_gpu_hook::sys;

extern "C" {
    fn getuid() -> c_uint;
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
        // SAFETY: a plain call.
        if unsafe { getuid() } != 0 {
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

/// A file at `path` holding `data` with permission bits `mode`, its folders made.
pub fn write<D: AsRef<[u8]> + ?Sized>(path: &Path, data: &D, mode: u32) {
    fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
    fs::write(path, data).unwrap_or_else(|e| panic!("{}: {}", path.display(), e));
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// What a case did: it ran (as every case returning `()` does), or it was
/// skipped, saying why.
pub enum Outcome {
    Ran,
    #[allow(dead_code)] // procview's cases are never skipped
    Skipped(String),
}

impl From<()> for Outcome {
    fn from(_: ()) -> Outcome {
        Outcome::Ran
    }
}

/// A case: its name and the function that runs it.
pub type Case<E, T> = (&'static str, fn(&E) -> T);

/// How a suite went.
pub struct Summary {
    suite: String,
    passed: usize,
    failed: Vec<String>,
    skipped: usize,
}

/// Run each case, as libtest would but in this one thread, with the
/// environment `env` makes of a new directory of its own under `base`; a panic
/// fails the case. A line per case is printed.
pub fn run_cases<E, T: Into<Outcome>>(
    suite: &str,
    base: &Path,
    cases: &[Case<E, T>],
    env: impl Fn(PathBuf) -> E,
) -> Summary {
    let mut summary = Summary { suite: suite.to_string(), passed: 0, failed: Vec::new(), skipped: 0 };
    for (index, (name, case)) in cases.iter().enumerate() {
        let dir = base.join(format!("t{}", index));
        fs::create_dir(&dir).expect("test directory");
        let env = env(dir);
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| case(&env).into()));
        let said = match outcome {
            Ok(Outcome::Ran) => {
                summary.passed += 1;
                "ok"
            }
            Ok(Outcome::Skipped(why)) => {
                summary.skipped += 1;
                println!("  ({})", why);
                "skipped"
            }
            Err(_) => {
                summary.failed.push(name.to_string());
                "FAILED"
            }
        };
        println!("test {} ... {}", name, said);
    }
    summary
}

impl Summary {
    /// The suite's last line ("procview: 21 passed; 0 failed; 0 skipped"); exits
    /// with status 1 when a case failed.
    pub fn finish(self) {
        println!("\n{}: {} passed; {} failed; {} skipped", self.suite, self.passed, self.failed.len(), self.skipped);
        if !self.failed.is_empty() {
            println!("failed: {}", self.failed.join(", "));
            std::process::exit(1);
        }
    }
}
