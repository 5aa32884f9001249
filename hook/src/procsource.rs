//! The procfs view's source: what a GPU-restricted `/proc/driver/nvidia` is made
//! of (`engine/start/procsource.py`).
//!
//! One code path for a real node and a simulated one; what differs is the
//! `ProcSource` strategy, chosen once from the work by `source_for`:
//!
//! * `DriverProcfs` (a real node): the source is the container's own
//!   `/proc/driver/nvidia`, taken inside, before the view hides it, and the view
//!   goes over it;
//! * `HostDirectory` (a simulated node, whose procfs has no driver): the source
//!   is a host directory, taken from its host path before the view is built (the
//!   kernel, 6.18 checked, refuses to clone from a detached tree of another mount
//!   namespace; the hook runs in the container's namespace before `pivot_root`,
//!   where the host path still names the host's tree). The view goes over the
//!   container's `/proc/driver/nvidia` if it has one, else over `/proc/driver`
//!   with an `nvidia/` level (procfs cannot mkdir).
//!
//! Either way a `Source` is taken (`take`: the copied files and a detached clone
//! of each kept `gpus/<bus>` and capability file or folder, each opened without
//! following any symlink); `procview` carries the clones in and attaches them
//! with `move_mount`.

use std::os::unix::io::{AsRawFd, OwnedFd, RawFd};

use crate::error::{cut, py_isspace, py_repr, Result, WorkError};
use crate::rootdir::{fail, is_errno, read_regular, RootDir};
use crate::sys;

pub const CAPS: &str = "capabilities";
const COPIED: [&str; 3] = ["version", "registry", "params"];
const LIMIT: u64 = 1 << 20;
/// For /proc paths: procfs has no plain symlinks on them, so any link met is planted.
pub const NOFOLLOW: u64 = sys::RESOLVE_NO_SYMLINKS;
/// A clone of what an fd already names (opened with `NOFOLLOW`: no link on the way).
const CLONE_FD: u32 = sys::OPEN_TREE_CLONE | sys::OPEN_TREE_CLOEXEC | sys::AT_RECURSIVE | sys::AT_EMPTY_PATH;
const MODIFY: &str = "ModifyDeviceFiles";
// The driver's capability folders: `gpu<M>`, `gi<G>`, `ci<C>` (engine/migfs.py).
const MAX_GPU_MINOR: u32 = 31;
const MAX_GPU_INSTANCE: u32 = 14;
const MAX_COMPUTE_INSTANCE: u32 = 7;

/// One file the view holds a copy of: its name, content and permission bits.
pub struct CopiedFile {
    pub name: &'static str,
    pub data: Vec<u8>,
    pub mode: u32,
}

/// What the view is made of, taken from the source tree before anything hides it:
/// the copied files, a detached clone of each kept `gpus/<bus>` directory, of each
/// capability file shown (path under `capabilities/` -> clone) and, for
/// `proc_caps_all`, of the whole `capabilities/` directory (`caps_all`). The
/// clones close when it is dropped.
pub struct Source {
    pub files: Vec<CopiedFile>,
    pub gpus: Clones,
    pub caps: Clones,
    pub caps_all: Option<OwnedFd>,
}

/// Detached clones by name (bus id, capability path), in the order taken.
pub type Clones = Vec<(String, OwnedFd)>;

/// Read and clone what the view needs from the directory fd `tree` (a driver's
/// `/proc/driver/nvidia`). Called in the namespace `tree` belongs to: a clone of a
/// mount of another namespace is refused by the kernel. `caps`: the capability
/// files to show (`StartWork.proc_caps`); `caps_all`: the whole `capabilities/`
/// folder instead (each of `caps` must still be there). Fails naming a bus id or
/// a capability file the source does not have.
pub fn take(tree: RawFd, bus_ids: &[String], caps: &[String], caps_all: bool) -> Result<Source> {
    check_names(bus_ids, caps)?;
    let files = read_sources(tree)?;
    let gpus = clone_gpus(tree, bus_ids)?;
    let (caps, caps_all) = clone_caps(tree, caps, caps_all)?;
    Ok(Source { files, gpus, caps, caps_all })
}

/// Each bus id and capability becomes a path opened in the source and a mount
/// point made in the view: only the names `StartWork.__post_init__` lets through.
fn check_names(bus_ids: &[String], caps: &[String]) -> Result<()> {
    for bus in bus_ids {
        if !is_bus_id(bus) {
            return Err(WorkError(format!("bad bus id {}", py_repr(bus))));
        }
    }
    for cap in caps {
        if !is_cap_path(cap) {
            return Err(WorkError(format!(
                "proc cap {}: not a capability file the driver makes",
                py_repr(cut(cap, 200))
            )));
        }
    }
    Ok(())
}

/// Where the view's content comes from, and where the view goes: the one thing a
/// real node and a simulated one do differently (see the module doc).
pub enum ProcSource {
    DriverProcfs,
    HostDirectory(HostDirectory),
}

/// A simulated node: its driver tree is a host directory (`path`), carried in.
pub struct HostDirectory {
    pub path: String,
    taken: Option<Source>,
}

/// The strategy for `StartWork.proc_source`: None on a real node, a host
/// directory on a simulated one.
pub fn source_for(proc_source: Option<&str>) -> ProcSource {
    match proc_source {
        None => ProcSource::DriverProcfs,
        Some(path) => ProcSource::HostDirectory(HostDirectory { path: path.to_string(), taken: None }),
    }
}

/// A host directory's strategy with its source already taken, as `take_outside`
/// leaves it: for the tests, which take the source themselves.
pub fn host_directory_taken(path: &str, taken: Source) -> ProcSource {
    ProcSource::HostDirectory(HostDirectory { path: path.to_string(), taken: Some(taken) })
}

impl ProcSource {
    /// In the marker ("container", "host"): a view from another source is replaced.
    pub fn name(&self) -> &'static str {
        match self {
            ProcSource::DriverProcfs => "container",
            ProcSource::HostDirectory(_) => "host",
        }
    }

    /// Whether `take_outside` has anything to do (the caller times it as a step then).
    pub fn takes_outside(&self) -> bool {
        matches!(self, ProcSource::HostDirectory(_))
    }

    /// From the host's paths, before the container's root is worked on: take what
    /// can only be taken there.
    pub fn take_outside(&mut self, bus_ids: &[String], caps: &[String], caps_all: bool) -> Result<()> {
        match self {
            ProcSource::DriverProcfs => Ok(()), // nothing of the host's: the container's own tree is the source
            ProcSource::HostDirectory(host) => {
                let tree = sys::openat_fd(sys::AT_FDCWD, &host.path, sys::O_PATH | sys::O_DIRECTORY, 0)
                    .map_err(|e| WorkError(format!("{}: {}", host.path, sys::error_text(&e))))?;
                host.taken = Some(take(tree.as_raw_fd(), bus_ids, caps, caps_all)?);
                Ok(())
            }
        }
    }

    /// In the container's root, before the view hides `own` (its
    /// `/proc/driver/nvidia`, None when it has none): the view's source, now the
    /// caller's; None for no view at all.
    pub fn take_inside(
        &mut self,
        own: Option<RawFd>,
        bus_ids: &[String],
        caps: &[String],
        caps_all: bool,
    ) -> Result<Option<Source>> {
        match self {
            ProcSource::DriverProcfs => match own {
                Some(fd) => take(fd, bus_ids, caps, caps_all).map(Some),
                None if !bus_ids.is_empty() || !caps.is_empty() || caps_all => {
                    Err(WorkError::new("/proc/driver/nvidia: not in the container (is the NVIDIA driver loaded?)"))
                }
                None => Ok(None), // no driver, and nothing to show
            },
            ProcSource::HostDirectory(host) => match host.taken.take() {
                Some(taken) => Ok(Some(taken)),
                None => Err(WorkError(format!("{}: not taken before entering the container", host.path))),
            },
        }
    }

    /// Where the view goes in `root`.
    pub fn place(&self, root: &RootDir, own: Option<RawFd>) -> Result<Place> {
        match (self, own) {
            (_, Some(fd)) => {
                Ok(Place { target: fd, owned: None, parent: "/proc/driver", name: "nvidia", nested: false })
            }
            // take_inside refused or skipped already
            (ProcSource::DriverProcfs, None) => Err(WorkError::new("/proc/driver/nvidia: not in the container")),
            (ProcSource::HostDirectory(_), None) => {
                let fd = root.opendir("/proc/driver", NOFOLLOW)?;
                Ok(Place { target: fd.as_raw_fd(), owned: Some(fd), parent: "/proc", name: "driver", nested: true })
            }
        }
    }

    /// Release what `take_outside` took and nobody used.
    pub fn close(&mut self) {
        if let ProcSource::HostDirectory(host) = self {
            host.taken = None;
        }
    }
}

/// The directory the view is mounted over (`fd`), where it is (`parent`, `name`)
/// and whether the view has an `nvidia/` level of its own (`nested`: it covers
/// `/proc/driver`).
pub struct Place {
    target: RawFd,
    owned: Option<OwnedFd>, // the directory's fd when the place opened it (closed with it)
    pub parent: &'static str,
    pub name: &'static str,
    pub nested: bool,
}

impl Place {
    pub fn fd(&self) -> RawFd {
        self.owned.as_ref().map_or(self.target, AsRawFd::as_raw_fd)
    }
}

/// The files the view copies (name, content, mode); missing ones left out.
fn read_sources(tree: RawFd) -> Result<Vec<CopiedFile>> {
    let mut files = Vec::new();
    for name in COPIED.iter() {
        let what = format!("driver/nvidia/{}", name);
        // O_NONBLOCK: a FIFO planted there is refused by read_regular, never waited on.
        let flags = sys::O_RDONLY | sys::O_NOFOLLOW | sys::O_NONBLOCK | sys::O_NOCTTY;
        let fd = match sys::openat2(tree, name, flags, 0, NOFOLLOW) {
            Ok(fd) => fd,
            Err(e) if is_errno(&e, sys::ENOENT) => continue,
            Err(e) => return Err(fail(&e, &what)),
        };
        let (mut data, info) = read_regular(fd.as_raw_fd(), &what, LIMIT)?;
        let mode = info.mode & 0o777;
        if *name == "params" {
            data = params_with_device_modification_disabled(&data);
        }
        files.push(CopiedFile { name, data, mode });
    }
    Ok(files)
}

/// A detached copy of `gpus/<bus>` per bus id, each opened first as the
/// capability files are (no link on the way, `gpus` included). A bus id listed
/// twice is cloned once (the Python's dict).
fn clone_gpus(tree: RawFd, bus_ids: &[String]) -> Result<Clones> {
    let mut clones = Clones::new();
    for bus in bus_ids {
        let path = format!("gpus/{}", bus);
        let fd = match sys::openat2(tree, &path, sys::O_PATH | sys::O_DIRECTORY, 0, NOFOLLOW) {
            Ok(fd) => fd,
            Err(e) if is_errno(&e, sys::ENOENT) || is_errno(&e, sys::ENOTDIR) => {
                return Err(WorkError(format!("bus id {} is not on this node", bus)))
            }
            Err(e) => return Err(fail(&e, &format!("driver/nvidia/{}", path))),
        };
        insert(&mut clones, bus, clone(fd, &path)?);
    }
    Ok(clones)
}

/// A detached copy of each capability file (none with `caps_all`: each is
/// checked, the whole `capabilities/` folder is cloned instead).
fn clone_caps(tree: RawFd, caps: &[String], caps_all: bool) -> Result<(Clones, Option<OwnedFd>)> {
    let mut clones = Clones::new();
    for cap in caps {
        let fd = open_cap(tree, cap)?;
        if !caps_all {
            insert(&mut clones, cap, clone(fd, &format!("{}/{}", CAPS, cap))?);
        }
    }
    let whole = if caps_all { Some(clone(open_source(tree, CAPS, sys::O_DIRECTORY)?, CAPS)?) } else { None };
    Ok((clones, whole))
}

fn insert(clones: &mut Clones, key: &str, fd: OwnedFd) {
    match clones.iter_mut().find(|(name, _)| name == key) {
        Some(entry) => entry.1 = fd,
        None => clones.push((key.to_string(), fd)),
    }
}

/// A detached copy of what `fd` (closed here) names; `path` for messages.
fn clone(fd: OwnedFd, path: &str) -> Result<OwnedFd> {
    sys::open_tree(fd.as_raw_fd(), "", CLONE_FD).map_err(|e| fail(&e, &format!("driver/nvidia/{}", path)))
}

/// An `O_PATH` fd of `capabilities/<cap>`, a regular file; an error if it is gone
/// (the instance was destroyed since the container was planned).
fn open_cap(tree: RawFd, cap: &str) -> Result<OwnedFd> {
    let path = format!("{}/{}", CAPS, cap);
    let fd = open_source(tree, &path, 0)?;
    let info = sys::fstat(fd.as_raw_fd()).map_err(|e| fail(&e, &format!("driver/nvidia/{}", path)))?;
    if !info.is_reg() {
        return Err(WorkError(format!("driver/nvidia/{}: not a regular file", path)));
    }
    Ok(fd)
}

fn open_source(tree: RawFd, path: &str, flags: u64) -> Result<OwnedFd> {
    sys::openat2(tree, path, sys::O_PATH | flags, 0, NOFOLLOW).map_err(|e| {
        if is_errno(&e, sys::ENOENT) {
            WorkError(format!(
                "driver/nvidia/{} is not on this node (a MIG instance destroyed since the container was planned?)",
                path
            ))
        } else {
            fail(&e, &format!("driver/nvidia/{}", path))
        }
    })
}

// ---------------------------------------------------------------- names and params

/// Whether `name` may be a bus id: one path component (not empty, `.` or `..`,
/// no `/`), no NUL or newline (`StartWork.__post_init__`).
pub fn is_bus_id(name: &str) -> bool {
    !(name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0', '\n']))
}

/// Whether `path` names a capability file the driver makes under
/// `/proc/driver/nvidia/capabilities/`: `mig/config`, `mig/monitor`,
/// `gpu<M>/mig/gi<G>/access` or `gpu<M>/mig/gi<G>/ci<C>/access` (M 0..31, G 0..14,
/// C 0..7, no leading zeros): `engine.start.work.is_cap_path`.
pub fn is_cap_path(path: &str) -> bool {
    if path == "mig/config" || path == "mig/monitor" {
        return true;
    }
    let parts: Vec<&str> = path.split('/').collect();
    if !(parts.len() == 4 || parts.len() == 5) || parts.get(1) != Some(&"mig") || parts.last() != Some(&"access") {
        return false;
    }
    let numbered = |at: usize, prefix: &str, maximum: u32| {
        parts.get(at).map_or(false, |name| folder_number(name, prefix, maximum).is_some())
    };
    numbered(0, "gpu", MAX_GPU_MINOR)
        && numbered(2, "gi", MAX_GPU_INSTANCE)
        && (parts.len() == 4 || numbered(3, "ci", MAX_COMPUTE_INSTANCE))
}

/// The number of a `<prefix><N>` folder name (N without leading zeros, two digits
/// at most) when N is at most `maximum`.
fn folder_number(name: &str, prefix: &str, maximum: u32) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if !matches!(digits.as_bytes(), [b'0'] | [b'1'..=b'9'] | [b'1'..=b'9', b'0'..=b'9']) {
        return None;
    }
    let number: u32 = digits.parse().ok()?;
    if number <= maximum {
        Some(number)
    } else {
        None
    }
}

/// The params file to show a container: every `ModifyDeviceFiles` line set to 0
/// (`engine.procfs.params_with_device_modification_disabled`).
///
/// With `ModifyDeviceFiles: 0` the driver's user-space libraries do not try to
/// create or chmod `/dev/nvidia*` inside the container. Everything else is kept
/// byte for byte (line endings, spacing, order); a file without the key gets
/// `ModifyDeviceFiles: 0` appended. Bytes, as the Python's surrogateescape round
/// trip: a line is cut at "\n" only (the kernel's lines), its key and value
/// stripped of what Python's `str.strip` strips.
pub fn params_with_device_modification_disabled(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 24);
    let mut found = false;
    for line in kernel_lines(text) {
        let body_len = line.len() - line.iter().rev().take_while(|&&b| b == b'\r' || b == b'\n').count();
        let (body, ending) = line.split_at(body_len);
        match modified(body) {
            Some(new_body) => {
                found = true;
                out.extend_from_slice(&new_body);
                out.extend_from_slice(ending);
            }
            None => out.extend_from_slice(line),
        }
    }
    if !found {
        if out.last().map_or(false, |&b| b != b'\n') {
            out.push(b'\n'); // lines end at "\n" only
        }
        out.extend_from_slice(format!("{}: 0\n", MODIFY).as_bytes());
    }
    out
}

/// `body` (a line without its ending) with its value set to 0 when its key is
/// `ModifyDeviceFiles`, the spacing around the value kept.
fn modified(body: &[u8]) -> Option<Vec<u8>> {
    let colon = body.iter().position(|&b| b == b':')?;
    let (key, value) = (&body[..colon], &body[colon + 1..]);
    // A key with bytes that are not UTF-8 is never the name (the Python's surrogates are not space).
    if std::str::from_utf8(key).ok()?.trim_matches(py_isspace) != MODIFY {
        return None;
    }
    let (start, end) = (leading_space(value), value.len() - trailing_space(value));
    let mut new_body = Vec::with_capacity(body.len() + 2);
    new_body.extend_from_slice(&body[..colon + 1]);
    if start < end {
        new_body.extend_from_slice(&value[..start]);
        new_body.push(b'0');
        new_body.extend_from_slice(&value[end..]);
    } else {
        new_body.extend_from_slice(value);
        new_body.extend_from_slice(b" 0");
    }
    Some(new_body)
}

/// Lines as the kernel ends them, at "\n" only, each with its "\n" (the last
/// without one when the text does not end with it): `engine.procfs._kernel_lines`.
fn kernel_lines(text: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |at| at + 1);
        let (line, after) = rest.split_at(end);
        lines.push(line);
        rest = after;
    }
    lines
}

/// Bytes of Python space at the start of `value` (the valid UTF-8 part counts;
/// a byte that is not UTF-8 ends it).
fn leading_space(value: &[u8]) -> usize {
    let valid = match std::str::from_utf8(value) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&value[..e.valid_up_to()]).unwrap_or(""),
    };
    valid.char_indices().find(|&(_, c)| !py_isspace(c)).map_or(valid.len(), |(at, _)| at)
}

/// Bytes of Python space at the end of `value`, decoded backwards (UTF-8 resyncs
/// at each character's first byte, so this is what decoding forwards finds).
fn trailing_space(value: &[u8]) -> usize {
    let mut end = value.len();
    'chars: while end > 0 {
        for size in 1..=4usize {
            let start = match end.checked_sub(size) {
                Some(start) => start,
                None => break 'chars,
            };
            if let Ok(text) = std::str::from_utf8(&value[start..end]) {
                let mut chars = text.chars();
                match (chars.next(), chars.next()) {
                    (Some(c), None) if py_isspace(c) => {
                        end = start;
                        continue 'chars;
                    }
                    _ => break 'chars,
                }
            }
        }
        break; // not UTF-8: a surrogate in the Python, not space
    }
    value.len() - end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(text: &[u8]) -> Vec<u8> {
        params_with_device_modification_disabled(text)
    }

    #[test]
    fn params_say_modify_device_files_0() {
        assert_eq!(
            params(b"RmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n"),
            b"RmLogonRC: 1\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n".to_vec()
        );
        assert_eq!(params(b"ModifyDeviceFiles:\n"), b"ModifyDeviceFiles: 0\n".to_vec());
        assert_eq!(params(b"ModifyDeviceFiles:   \r\n"), b"ModifyDeviceFiles:    0\r\n".to_vec());
        assert_eq!(params(b"ModifyDeviceFiles: 1:2\nx"), b"ModifyDeviceFiles: 0\nx".to_vec());
    }

    #[test]
    fn params_without_the_key_get_it_appended() {
        assert_eq!(params(b""), b"ModifyDeviceFiles: 0\n".to_vec());
        assert_eq!(params(b"a: 1"), b"a: 1\nModifyDeviceFiles: 0\n".to_vec());
        assert_eq!(params(b"a: 1\n"), b"a: 1\nModifyDeviceFiles: 0\n".to_vec());
        assert_eq!(params(b"\n\n"), b"\n\nModifyDeviceFiles: 0\n".to_vec());
    }

    /// Each expected output is what the Python function gives (surrogateescape round trip).
    #[test]
    fn params_match_the_python_on_odd_bytes() {
        let cases: [(&[u8], &[u8]); 8] = [
            (
                b"  ModifyDeviceFiles \x1c:\t 1 \x1f\r\r\nModifyDeviceFiles:2",
                b"  ModifyDeviceFiles \x1c:\t 0 \x1f\r\r\nModifyDeviceFiles:0",
            ),
            (b"ModifyDeviceFiles: 1\xe2\x80\xa8 2\n", b"ModifyDeviceFiles: 0\n"),
            (b"ModifyDeviceFiles: \xff1\xfe \n", b"ModifyDeviceFiles: 0 \n"),
            (b"\xffModifyDeviceFiles: 1\n", b"\xffModifyDeviceFiles: 1\nModifyDeviceFiles: 0\n"),
            (b"ModifyDeviceFiles:\xc2\xa0 1\xe3\x80\x80\n", b"ModifyDeviceFiles:\xc2\xa0 0\xe3\x80\x80\n"),
            (b"Modify\xe2\x80\xa8DeviceFiles: 1\n", b"Modify\xe2\x80\xa8DeviceFiles: 1\nModifyDeviceFiles: 0\n"),
            (b"ModifyDeviceFiles: \xe2\x80\n", b"ModifyDeviceFiles: 0\n"),
            (b"ModifyDeviceFiles: \xe2\x80\xa8\n", b"ModifyDeviceFiles: \xe2\x80\xa8 0\n"),
        ];
        for (text, want) in cases.iter() {
            assert_eq!(params(text), want.to_vec(), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn a_rewritten_file_is_stable() {
        let once = params(b"x: 1\nModifyDeviceFiles:\t1\t\r\n");
        assert_eq!(params(&once), once);
    }

    #[test]
    fn cap_paths_are_the_drivers_names_only() {
        for good in
            ["mig/monitor", "mig/config", "gpu2/mig/gi2/ci0/access", "gpu31/mig/gi14/ci7/access", "gpu0/mig/gi0/access"]
        {
            assert!(is_cap_path(good), "{}", good);
        }
        for bad in [
            "gpu32/mig/gi0/access",
            "mig/../x",
            "gpu01/mig/gi0/access",
            "gpu1/mig/gi15/access",
            "gpu1/mig/gi1/ci8/access",
            "gpu1/mig/gi1/ci00/access",
            "gpu1/mig/gi1/ci0/access/x",
            "gpu1/mig/gi1",
            "gpu1/x/gi1/access",
            "gpu1/mig/ci1/access",
            "gpu+1/mig/gi1/access",
            "/gpu1/mig/gi1/access",
            "fabric-imex-mgmt",
            "",
            "mig/monitor/",
            "gpu\u{0661}/mig/gi1/access",
        ] {
            assert!(!is_cap_path(bad), "{}", bad);
        }
    }

    #[test]
    fn a_bus_id_is_one_clean_path_component() {
        assert!(is_bus_id("0000:07:00.0"));
        for bad in ["", ".", "..", "../x", "a/b", "a\0b", "a\nb"] {
            assert!(!is_bus_id(bad), "{:?}", bad);
        }
    }

    #[test]
    fn the_work_chooses_the_strategy() {
        let real = source_for(None);
        assert_eq!((real.name(), real.takes_outside()), ("container", false));
        let simulated = source_for(Some("/sim/proc/driver/nvidia"));
        assert_eq!((simulated.name(), simulated.takes_outside()), ("host", true));
        match simulated {
            ProcSource::HostDirectory(host) => assert_eq!(host.path, "/sim/proc/driver/nvidia"),
            ProcSource::DriverProcfs => panic!("a host directory was expected"),
        }
    }

    #[test]
    fn without_a_driver_tree_a_real_node_skips_the_view_or_refuses_gpus() {
        let mut real = ProcSource::DriverProcfs;
        assert!(real.take_inside(None, &[], &[], false).unwrap().is_none());
        let loaded = "/proc/driver/nvidia: not in the container (is the NVIDIA driver loaded?)";
        let gpus = ["0000:07:00.0".to_string()];
        assert_eq!(real.take_inside(None, &gpus, &[], false).err().unwrap().0, loaded);
        assert_eq!(real.take_inside(None, &[], &["mig/monitor".to_string()], false).err().unwrap().0, loaded);
        assert_eq!(real.take_inside(None, &[], &[], true).err().unwrap().0, loaded);
    }

    #[test]
    fn a_host_directory_is_taken_on_the_host_or_not_at_all() {
        let mut missing = source_for(Some("/nonexistent/driver/nvidia"));
        let gpus = ["0000:07:00.0".to_string()];
        assert_eq!(
            missing.take_outside(&gpus, &[], false).err().unwrap().0,
            "/nonexistent/driver/nvidia: No such file or directory"
        );
        assert_eq!(
            missing.take_inside(None, &gpus, &[], false).err().unwrap().0,
            "/nonexistent/driver/nvidia: not taken before entering the container"
        );
    }

    #[test]
    fn names_that_are_not_the_drivers_are_refused_before_any_open() {
        let root = sys::openat_fd(sys::AT_FDCWD, "/", sys::O_PATH | sys::O_DIRECTORY, 0).unwrap();
        let take_with = |bus: &[&str], caps: &[&str]| {
            let bus: Vec<String> = bus.iter().map(|s| s.to_string()).collect();
            let caps: Vec<String> = caps.iter().map(|s| s.to_string()).collect();
            take(root.as_raw_fd(), &bus, &caps, false).err().map(|e| e.0)
        };
        assert_eq!(
            take_with(&[], &["../../../etc/shadow"]).as_deref(),
            Some("proc cap '../../../etc/shadow': not a capability file the driver makes")
        );
        assert_eq!(take_with(&["../x"], &[]).as_deref(), Some("bad bus id '../x'"));
        assert_eq!(take_with(&[".."], &[]).as_deref(), Some("bad bus id '..'"));
        assert_eq!(take_with(&[""], &[]).as_deref(), Some("bad bus id ''"));
    }
}
