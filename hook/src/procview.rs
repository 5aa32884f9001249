//! procfs isolation: the container's `/proc/driver/nvidia` shows only its GPUs
//! (`engine/start/procview.py`).
//!
//! The driver's procfs is global: every container sees every GPU under
//! `/proc/driver/nvidia/gpus` and the `params` that let NVML create device nodes.
//! As legacy `nvidia-container-cli` did (and CDI does not), a fresh tmpfs *view*
//! is mounted over it holding
//!
//! * copies of `version` and `registry` (each skipped when the source lacks it),
//! * `params` with `ModifyDeviceFiles: 0`,
//! * `gpus/<bus>` for each GPU the container got: the driver's own directory,
//!   bind-mounted,
//! * with MIG, each capability file the container got (`StartWork.proc_caps`):
//!   the driver's own file, bind-mounted over an empty file in folders made like
//!   the driver's (0555), so libcuda and NVML find the instances the container may
//!   use and no other; or, for a MIG config grant (`proc_caps_all`), the whole
//!   `capabilities/` directory bound, live. Without either, `capabilities/` is not
//!   in the view at all,
//!
//! then made read-only, `nosuid,nodev,noexec`.
//!
//! Its source comes from a `procsource::ProcSource`: the container's own tree on
//! a real node, a host directory on a simulated one.
//!
//! Order, chosen to need only what Linux 5.12 offers (`mount_setattr`): the view
//! is filled while detached (files, folders, empty mount points), attached, the
//! GPU directories and capability files bound into it (binding into a
//! still-detached tree needs a recent kernel), and only then made read-only,
//! binds included. Nobody sees the steps: the container's process has not
//! started. The marker names the GPUs and the capabilities shown: a second start
//! with the same work keeps the view, one with other work replaces it.

use std::io;
use std::os::unix::io::{AsRawFd, OwnedFd, RawFd};

use crate::error::Result;
use crate::procsource::{Place, ProcSource, Source, CAPS, NOFOLLOW};
use crate::rootdir::{fail, RootDir};
use crate::sys;

/// The "device" name of the view's tmpfs, as mountinfo shows it.
const SOURCE: &str = "nri-gpu";
/// At the view's root; procfs itself can never hold such a file.
pub const MARKER: &str = ".nri-gpu-view";
const HEADER: &[u8] = b"nri-gpu procfs view 1\n";
const UNFINISHED: &[u8] = b"nri-gpu procfs view 1\nunfinished\n";
const MARKER_LIMIT: u64 = 4096;
const TMPFS_OPTIONS: [(&str, &str); 4] = [("source", SOURCE), ("mode", "0555"), ("size", "4m"), ("nr_inodes", "4096")];
const EMPTY_BOTH: u32 = sys::MOVE_MOUNT_F_EMPTY_PATH | sys::MOVE_MOUNT_T_EMPTY_PATH;
const LOCKED: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOEXEC;

/// What the marker holds: a second run with the same work keeps the view.
/// `source`: the `ProcSource`'s name. The capabilities' line is there only when
/// some are shown: a view without MIG reads as it did before MIG was supported.
pub fn marker_text(bus_ids: &[String], source: &str, caps: &[String], caps_all: bool) -> Vec<u8> {
    let mut text = format!("source: {}\nbus ids: {}\n", source, bus_ids.join(" "));
    if caps_all {
        text.push_str("capabilities: all\n");
    } else if !caps.is_empty() {
        let mut sorted: Vec<&str> = caps.iter().map(|c| c.as_str()).collect();
        sorted.sort_unstable();
        text.push_str(&format!("capabilities: {}\n", sorted.join(" ")));
    }
    let mut marker = HEADER.to_vec();
    marker.extend_from_slice(text.as_bytes());
    marker
}

/// Whether `marker` (a marker file's first bytes) is a finished view's: a hook
/// killed mid-build leaves the unfinished one. For the tests: the hook itself
/// replaces any view whose marker is not its work's.
pub fn is_finished(marker: &[u8]) -> bool {
    marker.starts_with(HEADER) && marker.get(HEADER.len()..).map_or(false, |rest| rest.starts_with(b"source: "))
}

/// Build the view on the container's live tree `root`; "created", "kept" (ours,
/// identical, already there) or "skipped" (no driver tree anywhere and nothing
/// to show).
///
/// `source`: where the view comes from (`procsource::source_for`; for a host
/// directory, `take_outside` was called with the same `bus_ids`, `caps` and
/// `caps_all`). `files`: the `nodev` copy of the root (`RootDir::detached_copy`)
/// a marker is read through. `caps`, `caps_all`: the MIG capabilities shown.
pub fn isolate(
    root: &RootDir,
    bus_ids: &[String],
    source: &mut ProcSource,
    files: &RootDir,
    caps: &[String],
    caps_all: bool,
) -> Result<&'static str> {
    let marker = marker_text(bus_ids, source.name(), caps, caps_all);
    if let Some((parent, name, text)) = existing_view(files)? {
        if text == marker {
            return Ok("kept");
        }
        unmount(root, parent, name)?; // different work: the source is behind it
    }
    let own = root.find_dir("/proc/driver/nvidia", NOFOLLOW)?;
    let own_fd = own.as_ref().map(|fd| fd.as_raw_fd());
    // Before the view hides it; the clones close when `taken` is dropped.
    let taken = match source.take_inside(own_fd, bus_ids, caps, caps_all)? {
        Some(taken) => taken,
        None => return Ok("skipped"),
    };
    let place = source.place(root, own_fd)?;
    build(root, &place, &taken, &marker)?;
    Ok("created")
}

/// (parent, name, marker) of a view of ours: over /proc/driver, or /proc/driver/nvidia.
fn existing_view(files: &RootDir) -> Result<Option<(&'static str, &'static str, Vec<u8>)>> {
    for (parent, name) in [("/proc", "driver"), ("/proc/driver", "nvidia")] {
        let path = format!("{}/{}/{}", parent, name, MARKER);
        if let Some(text) = files.read_small(&path, MARKER_LIMIT, NOFOLLOW)? {
            return Ok(Some((parent, name, text)));
        }
    }
    Ok(None)
}

/// Unmount the view at `parent`/`name`. `umount2` takes a path; it is one name
/// relative to a directory resolved in the root, and `UMOUNT_NOFOLLOW` keeps even
/// that name from being a link. The cwd goes back to the root after.
fn unmount(root: &RootDir, parent: &str, name: &str) -> Result<()> {
    let fd = root.opendir(parent, NOFOLLOW)?;
    let done =
        sys::fchdir_fd(fd.as_raw_fd()).and_then(|()| sys::umount2_name(name, sys::MNT_DETACH | sys::UMOUNT_NOFOLLOW));
    let back = sys::fchdir_fd(root.fd());
    let path = format!("{}/{}", parent, name);
    done.and(back).map_err(|e| fail(&e, &path))
}

fn build(root: &RootDir, place: &Place, source: &Source, marker: &[u8]) -> Result<()> {
    let at = format!("{}/{}", place.parent, place.name);
    let view = sys::new_tmpfs(&TMPFS_OPTIONS, false).map_err(|e| fail(&e, &at))?;
    let nested = fill(view.as_raw_fd(), place.nested, source).map_err(|e| fail(&e, &at))?;
    let nvidia = nested.as_ref().map_or(view.as_raw_fd(), |fd| fd.as_raw_fd());
    sys::move_mount(view.as_raw_fd(), "", place.fd(), "", EMPTY_BOTH).map_err(|e| fail(&e, &at))?;
    if let Err(e) = bind_and_lock(view.as_raw_fd(), nvidia, source, marker) {
        unmount(root, place.parent, place.name)?; // leave no half-built view behind
        return Err(fail(&e, &at));
    }
    Ok(())
}

/// In the attached view: the clones bound in, the marker finished, all locked.
fn bind_and_lock(view: RawFd, nvidia: RawFd, source: &Source, marker: &[u8]) -> io::Result<()> {
    for (bus, clone) in &source.gpus {
        bind(clone.as_raw_fd(), nvidia, &format!("gpus/{}", bus), sys::O_DIRECTORY)?;
    }
    for (cap, clone) in &source.caps {
        bind(clone.as_raw_fd(), nvidia, &format!("{}/{}", CAPS, cap), 0)?;
    }
    if let Some(whole) = &source.caps_all {
        bind(whole.as_raw_fd(), nvidia, CAPS, sys::O_DIRECTORY)?;
    }
    write(view, MARKER, marker, 0o444, true)?; // now it is finished
    sys::mount_setattr(view, "", sys::AT_EMPTY_PATH | sys::AT_RECURSIVE, LOCKED, 0, sys::MS_PRIVATE)
}

/// Attach `clone` over the mount point at `path` (a directory with `kind`
/// `O_DIRECTORY`, else a file) in the view's `nvidia` level.
fn bind(clone: RawFd, nvidia: RawFd, path: &str, kind: u64) -> io::Result<()> {
    let mountpoint = sys::openat_fd(nvidia, path, sys::O_PATH | kind | sys::O_NOFOLLOW, 0)?;
    sys::move_mount(clone, "", mountpoint.as_raw_fd(), "", EMPTY_BOTH)
}

/// Write the copied files, the empty GPU directories and the capability mount
/// points (folders 0555 and empty files 0444, as the driver makes them); the fd
/// of the `nvidia` level when it is not the view's root (`nested`).
fn fill(view: RawFd, nested: bool, source: &Source) -> io::Result<Option<OwnedFd>> {
    // Marked from the start: a hook killed before the end leaves a view whose
    // marker matches no work, so the next run replaces it rather than reading it
    // as the driver's own tree.
    write(view, MARKER, UNFINISHED, 0o444, false)?;
    let level = if nested {
        mkdir(view, "nvidia")?;
        Some(sys::openat_fd(view, "nvidia", sys::O_PATH | sys::O_DIRECTORY | sys::O_NOFOLLOW, 0)?)
    } else {
        None
    };
    let nvidia = level.as_ref().map_or(view, |fd| fd.as_raw_fd());
    for file in &source.files {
        write(nvidia, file.name, &file.data, file.mode, false)?;
    }
    mkdir(nvidia, "gpus")?;
    for (bus, _) in &source.gpus {
        mkdir(nvidia, &format!("gpus/{}", bus))?;
    }
    if source.caps_all.is_some() || !source.caps.is_empty() {
        mkdir(nvidia, CAPS)?;
    }
    let mut made: Vec<String> = vec![CAPS.to_string()];
    for (cap, _) in &source.caps {
        let mut folder = CAPS.to_string();
        let parts: Vec<&str> = cap.split('/').collect();
        for part in parts.iter().take(parts.len().saturating_sub(1)) {
            folder.push('/');
            folder.push_str(part);
            if !made.contains(&folder) {
                mkdir(nvidia, &folder)?;
                made.push(folder.clone());
            }
        }
        write(nvidia, &format!("{}/{}", CAPS, cap), b"", 0o444, false)?;
    }
    Ok(level)
}

fn mkdir(dirfd: RawFd, name: &str) -> io::Result<()> {
    sys::mkdir_at(dirfd, name, 0o555)?;
    sys::chmod_at(dirfd, name, 0o555) // whatever the umask (our own tmpfs: no link to follow)
}

fn write(dirfd: RawFd, name: &str, data: &[u8], mode: u32, replace: bool) -> io::Result<()> {
    // A tmpfs of our own, holding nothing the container made: a plain create.
    let how = if replace { sys::O_TRUNC } else { sys::O_CREAT | sys::O_EXCL };
    let fd = sys::openat_fd(dirfd, name, sys::O_WRONLY | sys::O_NOFOLLOW | sys::O_NOCTTY | how, mode)?;
    sys::write_all(fd.as_raw_fd(), data)?;
    sys::fchmod_fd(fd.as_raw_fd(), mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_marker_is_the_pythons_byte_for_byte() {
        let bus = strings(&["0000:07:00.0", "0000:47:00.0"]);
        assert_eq!(
            marker_text(&bus, "host", &[], false),
            b"nri-gpu procfs view 1\nsource: host\nbus ids: 0000:07:00.0 0000:47:00.0\n".to_vec()
        );
        assert_eq!(
            marker_text(&[], "container", &[], false),
            b"nri-gpu procfs view 1\nsource: container\nbus ids: \n".to_vec()
        );
        let caps = strings(&["mig/monitor", "gpu2/mig/gi2/ci0/access", "gpu2/mig/gi2/access"]);
        assert_eq!(
            marker_text(&bus[..1], "host", &caps, false),
            b"nri-gpu procfs view 1\nsource: host\nbus ids: 0000:07:00.0\n\
              capabilities: gpu2/mig/gi2/access gpu2/mig/gi2/ci0/access mig/monitor\n"
                .to_vec()
        );
        assert_eq!(
            marker_text(&bus[..1], "host", &caps, true),
            b"nri-gpu procfs view 1\nsource: host\nbus ids: 0000:07:00.0\ncapabilities: all\n".to_vec()
        );
    }

    #[test]
    fn the_marker_names_the_source_and_the_set_of_caps() {
        let bus = strings(&["0000:07:00.0"]);
        assert_ne!(marker_text(&bus, "container", &[], false), marker_text(&bus, "host", &[], false));
        let caps = strings(&["gpu2/mig/gi2/access", "gpu2/mig/gi2/ci0/access"]);
        let reversed: Vec<String> = caps.iter().rev().cloned().collect();
        assert_eq!(marker_text(&bus, "host", &caps, false), marker_text(&bus, "host", &reversed, false));
    }

    #[test]
    fn only_a_finished_marker_is_finished() {
        assert!(is_finished(&marker_text(&[], "host", &[], false)));
        assert!(!is_finished(UNFINISHED));
        assert_eq!(UNFINISHED, b"nri-gpu procfs view 1\nunfinished\n");
        assert!(!is_finished(b"nri-gpu procfs view 1\n"));
        assert!(!is_finished(b""));
        assert!(!is_finished(b"nri-gpu procfs view 2\nsource: host\n"));
    }
}
