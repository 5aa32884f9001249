//! The loader configuration and cache in the container, merge mode
//! (`engine/start/ldconfig.py`; its rebuild mode, which runs the trusted
//! ldconfig, is `ldrebuild`).
//!
//! The injected libraries live in folders the image's cache may not list, so
//! `/etc/ld.so.conf.d/00-nri-gpu.conf` names them (a later `ldconfig` inside the
//! container keeps them), and `merge` inserts the plan's entries into the
//! image's `/etc/ld.so.cache` where ldconfig would (`ldcache::merge`), with no
//! process run. The cache is read through the root like every file here, on
//! the root file system only (one reached through a volume counts as absent),
//! and installed through a temporary file renamed into place: nothing is ever
//! written through a link the image planted. An unreadable or garbled image
//! cache counts as empty, as the loader ignores it too; the result then lists
//! ours alone, and the image's libraries are found in the loader's default
//! folders as before.

use std::os::unix::io::AsRawFd;
use std::time::Instant;

use crate::error::{Result, WorkError};
use crate::ldcache::{self, CacheError, LdCache, MAX_CACHE_SIZE};
use crate::model::LdCacheEntry;
use crate::rootdir::{self, ReadError, RootDir, READ, WRITE};
use crate::sys;

/// 00-: before the image's own files, as the toolkit's 00-nvcr.
pub const CONF: &str = "/etc/ld.so.conf.d/00-nri-gpu.conf";
/// CUDA forward compatibility: the image's compat folder, read before ours.
/// glibc reads `include /etc/ld.so.conf.d/*.conf` through glob(3), which sorts
/// the names: "00-compat-nri-gpu.conf" < "00-nri-gpu.conf", so a rebuild scans
/// the compat folder first and lists its libcuda.so.1 before the driver's.
pub const COMPAT_CONF: &str = "/etc/ld.so.conf.d/00-compat-nri-gpu.conf";
const COMPAT_HEADER: &[u8] = b"# Written by nri-gpu at container start: CUDA forward compatibility";
pub const MAIN_CONF: &str = "/etc/ld.so.conf";
/// What the toolkit writes where there is none.
pub const MAIN_CONF_TEXT: &[u8] = b"include /etc/ld.so.conf.d/*.conf\n";
pub const CACHE: &str = "/etc/ld.so.cache";
/// No real image's cache comes near (they are well under 1 MB).
pub const CACHE_LIMIT: u64 = MAX_CACHE_SIZE as u64;
/// `current_bytes`'s limit for the configuration files.
const CONF_LIMIT: u64 = 1 << 16;

/// `00-nri-gpu.conf`: a comment line, then one folder a line.
pub fn conf_text(folders: &[String]) -> Vec<u8> {
    let mut text =
        String::from("# Written by nri-gpu at container start: the NVIDIA driver libraries injected here.\n");
    for folder in folders {
        text.push_str(folder);
        text.push('\n');
    }
    text.into_bytes()
}

/// Make `/etc/ld.so.conf` include `ld.so.conf.d` (only if it is missing) and
/// write `00-nri-gpu.conf`; true when anything was written.
pub fn write_conf(root: &RootDir, folders: &[String]) -> Result<bool> {
    let mut changed = false;
    match root.open(MAIN_CONF, sys::O_PATH, 0, 0) {
        Ok(_) => {} // exists, as the container resolves it: leave it
        Err(e) if rootdir::is_errno(&e, sys::ENOENT) => {
            let (parent, name) = rootdir::split(MAIN_CONF)?;
            let etc = root.makedirs(parent, 0o755, WRITE)?;
            rootdir::write_atomically(etc.as_raw_fd(), name, MAIN_CONF_TEXT, 0o644, MAIN_CONF)?;
            changed = true;
        }
        Err(e) => return Err(rootdir::fail(&e, MAIN_CONF)),
    }
    Ok(rootdir::write_file(root, CONF, &conf_text(folders), 0o644)? || changed)
}

/// Write `00-compat-nri-gpu.conf` naming `folder` (the CUDA compat folder) or,
/// with `None`, remove one we wrote before (a file of that name whose first line
/// is not ours is the image's: left alone); true when anything changed.
pub fn write_compat_conf(root: &RootDir, folder: Option<&str>) -> Result<bool> {
    let (parent, name) = rootdir::split(COMPAT_CONF)?;
    let folder = match folder {
        Some(folder) => folder,
        None => {
            let found = match root.find_dir(parent, WRITE)? {
                Some(found) => found,
                None => return Ok(false),
            };
            match rootdir::current_bytes(found.as_raw_fd(), name, CONF_LIMIT) {
                Some(current) if current.starts_with(COMPAT_HEADER) => {}
                _ => return Ok(false),
            }
            sys::unlink_at(found.as_raw_fd(), name, 0).map_err(|e| rootdir::fail(&e, COMPAT_CONF))?;
            return Ok(true);
        }
    };
    let mut want = COMPAT_HEADER.to_vec();
    want.extend_from_slice(b" (the image's cuda-compat libraries before the driver's).\n");
    want.extend_from_slice(folder.as_bytes());
    want.push(b'\n');
    rootdir::write_file(root, COMPAT_CONF, &want, 0o644)
}

/// Insert `entries` into the container's `/etc/ld.so.cache`; false when the cache
/// already was exactly that (a second run). An error also for an image cache
/// over a limit (size, entries, `deadline`): no real image has one, and a start
/// that pretended otherwise would hold the runtime's lock for it.
///
/// `root` is the `nodev` copy of the root (`RootDir::detached_copy`).
pub fn merge(root: &RootDir, entries: &[LdCacheEntry], deadline: Option<Instant>) -> Result<bool> {
    let current = match root.read_small(CACHE, CACHE_LIMIT, READ) {
        Ok(current) => current,
        Err(ReadError::OverLimit(message)) => {
            return Err(WorkError(format!("{} for an image's ld.so.cache", message)));
        }
        Err(ReadError::Other(_)) => None, // not a regular file: the loader cannot use it either
    };
    let data = merged_cache(current.as_deref(), entries, deadline)
        .map_err(|e| WorkError(format!("{}: {}", CACHE, e.message())))?;
    if current.as_deref() == Some(&data[..]) {
        return Ok(false);
    }
    install(root, &data)?;
    Ok(true)
}

/// The bytes `merge` installs for an image cache of `current` (`None`: none).
/// Only a limit is an error: a garbled cache counts as empty, as glibc ignores it.
pub fn merged_cache(
    current: Option<&[u8]>,
    entries: &[LdCacheEntry],
    deadline: Option<Instant>,
) -> std::result::Result<Vec<u8>, CacheError> {
    let image = match current.map(|data| ldcache::read_ld_so_cache(data, deadline)) {
        Some(Ok(image)) => image,
        Some(Err(CacheError::Limit(message))) => return Err(CacheError::Limit(message)),
        Some(Err(CacheError::Garbled(_))) | None => LdCache::default(),
    };
    let merged = ldcache::merge(&image, entries, deadline)?;
    ldcache::encode(&merged, ldcache::GENERATOR, deadline)
}

/// Install `cache` as the root's `/etc/ld.so.cache` (`write_atomically`).
pub(crate) fn install(root: &RootDir, cache: &[u8]) -> Result<()> {
    let (parent, name) = rootdir::split(CACHE)?;
    let etc = root.makedirs(parent, 0o755, WRITE)?;
    rootdir::write_atomically(etc.as_raw_fd(), name, cache, 0o644, CACHE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ldcache::tests::{fixture, fnv, manifest};
    use crate::testroot::TestRoot;
    use std::fs;
    use std::path::Path;

    /// What the manifest's `merge` line says of a result: `written|unchanged`,
    /// then `file NAME` (compared with that file) or `digest LENGTH FNV`.
    fn check_written(case: &str, expected: &str, written: bool, data: &[u8]) {
        let words = expected.split(' ').collect::<Vec<&str>>();
        assert_eq!(words[0], if written { "written" } else { "unchanged" }, "case {}", case);
        match words[1] {
            "file" => assert!(data == &fixture(words[2])[..], "case {}: not the bytes of {}", case, words[2]),
            "digest" => {
                assert_eq!(words[2], data.len().to_string(), "case {}", case);
                assert_eq!(words[3], fnv(data), "case {}", case);
            }
            other => panic!("case {}: unknown merge result {:?}", case, other),
        }
    }

    #[test]
    fn every_golden_case_merges_as_python_merges_it() {
        let manifest = manifest();
        for case in &manifest.cases {
            let ours = &manifest.ours[&case.ours];
            let data = case.data();
            let dir = TestRoot::new();
            if let Some(data) = &data {
                dir.write(CACHE, data);
            }
            match merge(&dir.root(), ours, case.deadline()) {
                Ok(written) => check_written(&case.name, &case.merge, written, &dir.read(CACHE).unwrap()),
                Err(WorkError(message)) => assert_eq!(format!("error {}", message), case.merge, "case {}", case.name),
            }
            // The same without a file system, where the file's limit is not in the way.
            if data.as_ref().map_or(true, |d| d.len() as u64 <= CACHE_LIMIT) {
                match merged_cache(data.as_deref(), ours, case.deadline()) {
                    Ok(bytes) => check_written(&case.name, &case.merge, Some(&bytes) != data.as_ref(), &bytes),
                    Err(e) => assert_eq!(format!("error {}: {}", CACHE, e), case.merge, "case {}", case.name),
                }
            }
        }
    }

    #[test]
    fn a_second_merge_writes_nothing() {
        let dir = TestRoot::new();
        dir.write(CACHE, &fixture("host-debian12.cache"));
        let ours = manifest().ours.remove("driver").unwrap();
        assert!(merge(&dir.root(), &ours, None).unwrap());
        let once = dir.read(CACHE).unwrap();
        assert!(!merge(&dir.root(), &ours, None).unwrap());
        assert!(dir.read(CACHE).unwrap() == once);
    }

    #[test]
    fn a_cache_behind_a_link_is_read_and_the_link_replaced() {
        let dir = TestRoot::new();
        dir.write("/data/cache", &fixture("real-new.cache"));
        fs::create_dir_all(dir.at("/etc")).unwrap();
        std::os::unix::fs::symlink("/data/cache", dir.at(CACHE)).unwrap(); // absolute: inside the root
        let ours = manifest().ours.remove("driver").unwrap();
        assert!(merge(&dir.root(), &ours, None).unwrap());
        assert!(!fs::symlink_metadata(dir.at(CACHE)).unwrap().file_type().is_symlink());
        assert!(dir.read(CACHE).unwrap() == fixture("real-new.merged"));
        assert!(dir.read("/data/cache").unwrap() == fixture("real-new.cache"));
    }

    #[test]
    fn a_cache_that_is_no_regular_file_counts_as_absent() {
        let dir = TestRoot::new();
        fs::create_dir_all(dir.at(CACHE)).unwrap();
        let err = merge(&dir.root(), &[], None).unwrap_err();
        assert_eq!(err.0, "/etc/ld.so.cache: Is a directory"); // read as absent, then replacing it fails
    }

    #[test]
    fn the_conf_files_are_written_once() {
        let dir = TestRoot::new();
        let folders = vec!["/usr/lib/x86_64-linux-gnu".to_string(), "/usr/lib/i386-linux-gnu".to_string()];
        assert!(write_conf(&dir.root(), &folders).unwrap());
        assert_eq!(dir.read(MAIN_CONF).unwrap(), MAIN_CONF_TEXT);
        assert_eq!(
            dir.read(CONF).unwrap(),
            b"# Written by nri-gpu at container start: the NVIDIA driver libraries injected here.\n\
              /usr/lib/x86_64-linux-gnu\n/usr/lib/i386-linux-gnu\n"
                .to_vec()
        );
        assert!(!write_conf(&dir.root(), &folders).unwrap());
        // The image's own ld.so.conf is left as it is.
        let other = TestRoot::new();
        other.write(MAIN_CONF, b"/opt/lib\n");
        assert!(write_conf(&other.root(), &[]).unwrap());
        assert_eq!(other.read(MAIN_CONF).unwrap(), b"/opt/lib\n");
    }

    #[test]
    fn the_compat_conf_is_written_and_removed_only_when_ours() {
        let dir = TestRoot::new();
        assert!(!write_compat_conf(&dir.root(), None).unwrap()); // no folder: nothing to remove
        assert!(write_compat_conf(&dir.root(), Some("/usr/local/cuda/compat")).unwrap());
        assert_eq!(
            dir.read(COMPAT_CONF).unwrap(),
            b"# Written by nri-gpu at container start: CUDA forward compatibility \
              (the image's cuda-compat libraries before the driver's).\n/usr/local/cuda/compat\n"
                .to_vec()
        );
        assert!(!write_compat_conf(&dir.root(), Some("/usr/local/cuda/compat")).unwrap());
        assert!(write_compat_conf(&dir.root(), None).unwrap());
        assert!(dir.read(COMPAT_CONF).is_none());
        assert!(!write_compat_conf(&dir.root(), None).unwrap());
        dir.write(COMPAT_CONF, b"/the/image/own\n");
        assert!(!write_compat_conf(&dir.root(), None).unwrap());
        assert!(Path::new(&dir.at(COMPAT_CONF)).exists());
    }
}
