//! The start work, step by step, in the container's root before `pivot_root`
//! (`engine.start.actions.perform_in_bundle` and its `_steps`).
//!
//! runc runs a `createContainer` hook in the container's namespaces after the
//! spec's mounts are in place and before `pivot_root`: the host's files are still
//! at their paths and the container's root is the bundle's `root.path`
//! directory, with the spec's mounts under it. Nothing is entered; that directory
//! is opened as the `RootDir` every path is resolved against. Then:
//!
//! 1. root copy: a detached clone of the container's mount tree, `nodev` and
//!    `nosuid` throughout, writable at its top; every file is read and written
//!    through it (no device node of the image or of a volume can be opened, and a
//!    read-only root stays read-only);
//! 2. procfs isolation: mounted on the container's live tree;
//! 3. symlinks, the application profile;
//! 4. CUDA forward compatibility: is the image's `/usr/local/cuda/compat` newer
//!    than the driver? Then its libraries go first;
//! 5. `ld.so.conf` files, then the driver's entries merged into the image's own
//!    ld.so cache.
//!
//! Every step is idempotent; a failure names its step.

use std::time::Instant;

use crate::error::WorkError;
use crate::model::{LdCacheMode, StartWork};
use crate::rootdir::RootDir;
use crate::{appprofile, compat, ipc, ldconf, ldrebuild, links, procsource, procview, sys};

/// A step failed: its name and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepFailed {
    pub step: String,
    pub message: String,
}

/// Runs one step: a failure is named after the innermost step it comes from.
fn step<T, F: FnOnce() -> Result<T, Failure>>(name: &str, run: F) -> Result<T, StepFailed> {
    run().map_err(|failure| match failure {
        Failure::Step(failed) => failed,
        Failure::Work(err) => StepFailed { step: name.to_string(), message: err.0 },
    })
}

/// Inside a step: a plain error (named after this step) or an inner step's failure.
enum Failure {
    Work(WorkError),
    Step(StepFailed),
}

impl From<WorkError> for Failure {
    fn from(err: WorkError) -> Failure {
        Failure::Work(err)
    }
}

impl From<StepFailed> for Failure {
    fn from(failed: StepFailed) -> Failure {
        Failure::Step(failed)
    }
}

/// Whose roots a container's never is: this process's and pid 1's.
const NOT_CONTAINERS: [(&str, &str); 2] =
    [("/proc/self/root", "the plugin's"), ("/proc/1/root", "the host's (pid 1's)")];

/// Do `work` in the container whose root is the directory `rootfs`.
pub fn perform_in_bundle(rootfs: &str, work: &StartWork, deadline: Instant) -> Result<(), StepFailed> {
    let (root, mut source, seen, trusted) = step("enter", || {
        let root = RootDir::open_path(rootfs)
            .map_err(|e| WorkError(format!("container root {}: {}", rootfs, sys::error_text(&e))))?;
        let here = sys::fstat(root.fd())
            .map_err(|e| WorkError(format!("container root {}: {}", rootfs, sys::error_text(&e))))?;
        for (path, whose) in NOT_CONTAINERS.iter() {
            // Out of sight (pid 1 without the host's pid namespace): nothing to compare.
            if let Ok(seen) = std::fs::metadata(path).map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino())
            }) {
                if seen == (here.dev, here.ino) {
                    return Err(WorkError(format!("container root {} is {} root", rootfs, whose)).into());
                }
            }
        }
        let mut source = procsource::source_for(work.proc_source.as_deref());
        let seen = if work.ipc.is_empty() {
            Vec::new()
        } else {
            // The hook sees the host's paths as they are.
            step("IPC endpoints", || ipc::on_host(work).map_err(Failure::from))?
        };
        let trusted = if !work.ldconfig_folders.is_empty() && work.ld_cache == LdCacheMode::Rebuild {
            Some(step("ldconfig", || ldrebuild::trusted_here(&root, rootfs, &work.ldconfig).map_err(Failure::from))?)
        } else {
            None
        };
        if source.takes_outside() {
            step("procfs isolation", || {
                source.take_outside(&work.visible_bus_ids, &work.proc_caps, work.proc_caps_all).map_err(Failure::from)
            })?;
        }
        Ok((root, source, seen, trusted))
    })?;
    let result = run_steps(&root, &mut source, &seen, trusted.as_ref(), work, deadline);
    source.close();
    result
}

fn run_steps(
    live: &RootDir,
    source: &mut procsource::ProcSource,
    seen: &ipc::Seen,
    trusted: Option<&ldrebuild::Trusted>,
    work: &StartWork,
    deadline: Instant,
) -> Result<(), StepFailed> {
    if !seen.is_empty() {
        step("IPC endpoints", || ipc::check(live, seen).map_err(Failure::from))?;
    }
    let copy = step("root copy", || live.detached_copy().map_err(Failure::from))?;
    step("procfs isolation", || {
        let made = procview::isolate(live, &work.visible_bus_ids, source, &copy, &work.proc_caps, work.proc_caps_all);
        source.close(); // what was taken on the host and not used (a view kept)
        made.map_err(Failure::from)
    })?;
    step("symlinks", || links::create(&copy, &work.symlinks).map_err(Failure::from))?;
    if !work.app_profile.is_empty() {
        step("application profile", || appprofile::write(&copy, &work.app_profile).map_err(Failure::from))?;
    }
    if work.ldconfig_folders.is_empty() {
        return Ok(());
    }
    let found = if work.cuda_compat {
        step("CUDA compat", || Ok(compat::check(&copy, &work.driver_version)))?
    } else {
        compat::Compat::default()
    };
    // The compat folder's entries go in after the driver's: each goes before its
    // ties, so before the driver's library of the same name.
    let mut entries = work.ld_cache_entries.clone();
    entries.extend(found.entries.iter().cloned());
    let changed = step("ld.so.conf", || {
        let conf = ldconf::write_conf(&copy, &work.ldconfig_folders)?;
        Ok(ldconf::write_compat_conf(&copy, found.folder())? || conf)
    })?;
    match trusted {
        None => step("ld.so.cache", || ldconf::merge(&copy, &entries, Some(deadline)).map(drop).map_err(Failure::from)),
        // "rebuild": the trusted ldconfig was opened on the host for it.
        Some(trusted) => step("ldconfig", || {
            if changed || !ldrebuild::cache_lists(&copy, &entries, Some(deadline)) {
                ldrebuild::run(&copy, trusted, deadline)?;
            }
            Ok(())
        }),
    }
}
