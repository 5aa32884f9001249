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

/// What a successful start did; `timings_ms` per step, as the Python report.
#[derive(Debug, Default)]
pub struct Report {
    pub timings_ms: Vec<(String, f64)>,
    pub procfs: &'static str,
    pub ld_cache_written: bool,
    pub cuda_compat: String,
}

/// Times each step and names the step a failure comes from (the innermost one).
struct Steps {
    timings: Vec<(String, f64)>,
}

impl Steps {
    fn step<T, F: FnOnce(&mut Steps) -> Result<T, Failure>>(&mut self, name: &str, run: F) -> Result<T, StepFailed> {
        let began = Instant::now();
        let result = run(self);
        let took = began.elapsed().as_secs_f64() * 1000.0;
        match self.timings.iter_mut().find(|(n, _)| n == name) {
            Some((_, total)) => *total += took,
            None => self.timings.push((name.to_string(), took)),
        }
        result.map_err(|failure| match failure {
            Failure::Step(failed) => failed,
            Failure::Work(err) => StepFailed { step: name.to_string(), message: err.0 },
        })
    }
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
pub fn perform_in_bundle(rootfs: &str, work: &StartWork, deadline: Instant) -> Result<Report, StepFailed> {
    let started = Instant::now();
    let mut steps = Steps { timings: Vec::new() };
    let (root, mut source, seen, trusted) = steps.step("enter", |steps| {
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
            steps.step("IPC endpoints", |_| ipc::on_host(work).map_err(Failure::from))?
        };
        let trusted =
            if !work.ldconfig_folders.is_empty() && work.ld_cache == LdCacheMode::Rebuild {
                Some(steps.step("ldconfig", |_| {
                    ldrebuild::trusted_here(&root, rootfs, &work.ldconfig).map_err(Failure::from)
                })?)
            } else {
                None
            };
        if source.takes_outside() {
            steps.step("procfs isolation", |_| {
                source.take_outside(&work.visible_bus_ids, &work.proc_caps, work.proc_caps_all).map_err(Failure::from)
            })?;
        }
        Ok((root, source, seen, trusted))
    })?;
    let result = run_steps(&root, &mut source, &seen, trusted.as_ref(), work, &mut steps, deadline);
    source.close();
    let mut report = result?;
    steps.timings.push(("total".to_string(), started.elapsed().as_secs_f64() * 1000.0));
    report.timings_ms = steps.timings;
    Ok(report)
}

fn run_steps(
    live: &RootDir,
    source: &mut procsource::ProcSource,
    seen: &ipc::Seen,
    trusted: Option<&ldrebuild::Trusted>,
    work: &StartWork,
    steps: &mut Steps,
    deadline: Instant,
) -> Result<Report, StepFailed> {
    if !seen.is_empty() {
        steps.step("IPC endpoints", |_| ipc::check(live, seen).map_err(Failure::from))?;
    }
    let copy = steps.step("root copy", |_| live.detached_copy().map_err(Failure::from))?;
    let procfs = steps.step("procfs isolation", |_| {
        let made = procview::isolate(live, &work.visible_bus_ids, source, &copy, &work.proc_caps, work.proc_caps_all);
        source.close(); // what was taken on the host and not used (a view kept)
        made.map_err(Failure::from)
    })?;
    steps.step("symlinks", |_| links::create(&copy, &work.symlinks).map_err(Failure::from))?;
    if !work.app_profile.is_empty() {
        steps.step("application profile", |_| appprofile::write(&copy, &work.app_profile).map_err(Failure::from))?;
    }
    let mut found = compat::Compat::default();
    if !work.ldconfig_folders.is_empty() && work.cuda_compat {
        found = steps.step("CUDA compat", |_| Ok(compat::check(&copy, &work.driver_version)))?;
    }
    let mut written = false;
    if !work.ldconfig_folders.is_empty() {
        // The compat folder's entries go in after the driver's: each goes before its
        // ties, so before the driver's library of the same name.
        let mut entries = work.ld_cache_entries.clone();
        entries.extend(found.entries.iter().cloned());
        let changed = steps.step("ld.so.conf", |_| {
            let conf = ldconf::write_conf(&copy, &work.ldconfig_folders)?;
            Ok(ldconf::write_compat_conf(&copy, found.folder())? || conf)
        })?;
        match trusted {
            None => {
                written = steps
                    .step("ld.so.cache", |_| ldconf::merge(&copy, &entries, Some(deadline)).map_err(Failure::from))?
            }
            // "rebuild": the trusted ldconfig was opened on the host for it.
            Some(trusted) => {
                let took = steps.step("ldconfig", |_| {
                    if changed || !ldrebuild::cache_lists(&copy, &entries, Some(deadline)) {
                        return ldrebuild::run(&copy, trusted, deadline).map(Some).map_err(Failure::from);
                    }
                    Ok(None)
                })?;
                if let Some(took) = took {
                    // Its own line: the ldconfig process alone, fork to reap.
                    steps.timings.push(("ldconfig process".to_string(), took));
                    written = true;
                }
            }
        }
    }
    Ok(Report { timings_ms: Vec::new(), procfs, ld_cache_written: written, cuda_compat: found.note() })
}
