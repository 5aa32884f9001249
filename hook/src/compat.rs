//! The image's CUDA compat folder, read in the container's root for the decision
//! of `cudacompat` (`engine/start/compat.py`).
//!
//! The folder is image data (the NVIDIAScape CVE, 2025-23266, lived in the
//! toolkit's handling of it), so it is read like every other file of the start
//! work: resolved in the container's root by descriptor (`RootDir`: links
//! followed as the container follows them, never out of its root, no `/proc`
//! magic link, never across a mount), through the `nodev` copy of the root (a
//! device node cannot be opened), each file opened once with `O_NONBLOCK` and
//! checked with `fstat` (a FIFO is never waited on, only regular files are
//! read), and bounded: at most `MAX_ENTRIES` folder entries, and of each library
//! a few `pread`s of at most 64 KiB (its ELF headers, its dynamic section, the
//! soname, its notes; 256 KiB for a section table), never the whole file.
//!
//! Nothing here fails the start: whatever the folder holds, a reason why the
//! driver's libraries are used instead is the worst outcome.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};

use crate::cudacompat::{
    candidate, decide, library_key, looks_like_library, parse_note, Candidate, Decision, Note, COMPAT_DIR, MAX_ENTRIES,
    NOTE_SECTION,
};
use crate::elf::{self, Elf, SharedLibrary};
use crate::error::{cut, py_repr};
use crate::model::LdCacheEntry;
use crate::rootdir::{describe, RootDir, READ};
use crate::sys;

const USED: &str = ": the driver's libraries are used";
const LIBCUDA: &str = "libcuda.so.1";

/// The decision (None: no compat folder, or no `libcuda.so.*.*` in it: nothing
/// to say) and, when the folder is used, the cache entries of its libraries as
/// `ldconfig` would list them with the folder first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compat {
    pub decision: Option<Decision>,
    pub entries: Vec<LdCacheEntry>,
}

impl Compat {
    /// The folder that goes first in the loader's search, when it does.
    pub fn folder(&self) -> Option<&'static str> {
        match &self.decision {
            Some(decision) if decision.r#use => Some(COMPAT_DIR),
            _ => None,
        }
    }

    /// The decision's line ("" when there is nothing to say): what the tests compare.
    #[cfg(test)]
    pub fn note(&self) -> String {
        self.decision.as_ref().map_or_else(String::new, |d| d.reason.clone())
    }

    fn decided(decision: Decision) -> Compat {
        Compat { decision: Some(decision), entries: Vec::new() }
    }
}

/// Look at `/usr/local/cuda/compat` in `root` (the `nodev` copy of the
/// container's root) for a driver `host_version`. Never fails for what the
/// image holds.
pub fn check(root: &RootDir, host_version: &str) -> Compat {
    let listing = match listing(root) {
        Err(reason) => return Compat::decided(Decision::new(false, reason, "")),
        Ok(None) => return Compat::default(),
        Ok(Some(listing)) => listing,
    };
    let names: Vec<&str> = listing.keys().map(|n| n.as_str()).collect();
    let name = match candidate(&names) {
        Candidate::One(name) => name,
        Candidate::None => return Compat::default(),
        Candidate::Many(why) => return Compat::decided(Decision::new(false, why, "")),
    };
    if listing.get(&name) == Some(&Kind::Other) {
        let reason = format!("{}/{} is neither a file nor a link{}", COMPAT_DIR, name, USED);
        return Compat::decided(Decision::new(false, reason, name));
    }
    let (lib, note) = match read_candidate(root, &name) {
        Err(reason) => return Compat::decided(Decision::new(false, reason, name)),
        Ok(found) => found,
    };
    let decision = decide(&name, note.as_ref(), host_version);
    if !decision.r#use {
        return Compat::decided(decision);
    }
    Compat { decision: Some(decision), entries: entries(root, &listing, (&name, &lib)) }
}

/// A folder entry's kind, not following links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Link,
    Other,
}

/// The folder's entries and their kinds, sorted by name; None without a folder;
/// an error (why the folder is not used) otherwise.
fn listing(root: &RootDir) -> Result<Option<BTreeMap<String, Kind>>, String> {
    let flags = sys::O_RDONLY | sys::O_DIRECTORY | sys::O_NONBLOCK | sys::O_CLOEXEC;
    let fd = match root.open(COMPAT_DIR, flags, 0, READ) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(sys::ENOENT) => return Ok(None),
        Err(e) => return Err(describe(&e, COMPAT_DIR) + USED),
    };
    let entries = match sys::list_dir(fd.as_raw_fd(), MAX_ENTRIES) {
        Ok(Some(entries)) => entries,
        Ok(None) => return Err(format!("{}: over {} entries{}", COMPAT_DIR, MAX_ENTRIES, USED)),
        Err(e) => return Err(describe(&e, COMPAT_DIR) + USED),
    };
    let mut found = BTreeMap::new();
    for entry in entries {
        let kind = kind_of(fd.as_raw_fd(), &entry).map_err(|e| describe(&e, COMPAT_DIR) + USED)?;
        found.insert(entry.name, kind);
    }
    Ok(Some(found))
}

/// What `os.scandir` says of an entry: its `d_type`, or (a file system that
/// gives none) an `lstat`, where an entry gone since counts as neither.
fn kind_of(dirfd: RawFd, entry: &sys::DirEntry) -> io::Result<Kind> {
    match entry.kind {
        sys::DT_LNK => Ok(Kind::Link),
        sys::DT_REG => Ok(Kind::File),
        sys::DT_UNKNOWN => match sys::lstat_at(dirfd, &entry.name) {
            Ok(info) if info.is_link() => Ok(Kind::Link),
            Ok(info) if info.is_reg() => Ok(Kind::File),
            Ok(_) => Ok(Kind::Other),
            Err(e) if e.raw_os_error() == Some(sys::ENOENT) => Ok(Kind::Other),
            Err(e) => Err(e),
        },
        _ => Ok(Kind::Other),
    }
}

/// Why `work` gave up on a file: a whole line of its own, or an error to be
/// told as `<path>: <error>` (Python's `ValueError` and `OSError` texts).
enum Failure {
    Skip(String),
    Error(String),
}

impl From<elf::ElfError> for Failure {
    fn from(err: elf::ElfError) -> Failure {
        Failure::Error(err.to_string())
    }
}

/// `work(read)` on the regular file `name` of the folder (links followed in the
/// root, not across a mount); an error is the line saying why it is not used.
fn with_file<T, F>(root: &RootDir, name: &str, work: F) -> Result<T, String>
where
    F: FnOnce(elf::Read) -> Result<T, Failure>,
{
    let path = format!("{}/{}", COMPAT_DIR, name);
    let flags = sys::O_RDONLY | sys::O_NONBLOCK | sys::O_NOCTTY | sys::O_CLOEXEC;
    let fd = root.open(&path, flags, 0, READ).map_err(|e| describe(&e, &path) + USED)?;
    let info = sys::fstat(fd.as_raw_fd()).map_err(|e| format!("{}: {}{}", path, elf::os_error_text(&e), USED))?;
    if !info.is_reg() {
        return Err(format!("{}: not a regular file{}", path, USED));
    }
    let raw = fd.as_raw_fd();
    let read = move |offset: u64, size: usize| -> io::Result<Vec<u8>> {
        if offset > i64::MAX as u64 {
            return Ok(Vec::new()); // past what any file holds: its end
        }
        sys::pread(raw, offset, size)
    };
    match work(&read) {
        Ok(value) => Ok(value),
        Err(Failure::Skip(line)) => Err(line),
        Err(Failure::Error(text)) => Err(format!("{}: {}{}", path, text, USED)),
    }
}

/// The candidate as a library and its note, once it is known to be a 64-bit
/// `libcuda.so.1` (the toolkit takes any file of that name: one that is no CUDA
/// driver library, an image's mislabelled file, has nothing to be compatible with).
fn read_candidate(root: &RootDir, name: &str) -> Result<(SharedLibrary, Option<Note>), String> {
    with_file(root, name, |read| {
        let file = Elf::open(read)?;
        let lib = match file.shared_library()? {
            Some(lib) if lib.soname.as_deref() == Some(LIBCUDA) => lib,
            found => {
                let what = match found {
                    None => "no 64-bit shared library".to_string(),
                    Some(lib) => {
                        let soname = lib.soname.as_deref().unwrap_or("None"); // Python's str(None)
                        format!("its soname is {}", py_repr(cut(soname, 100)))
                    }
                };
                let line = format!("{}/{} is not a {} ({}){}", COMPAT_DIR, name, LIBCUDA, what, USED);
                return Err(Failure::Skip(line));
            }
        };
        let note = match file.note_section(NOTE_SECTION)? {
            None => None,
            Some(found) => parse_note(&found.data, found.little_endian, found.align).map_err(Failure::Error)?,
        };
        Ok((lib, note))
    })
}

/// The folder's libraries under the names `ldconfig` lists them by, at
/// `<folder>/<name>`: one per name, files before links (as `ldconfig` prefers
/// them). One that is no ELF library is left out, as `ldconfig` does. `known`:
/// the candidate, already read.
fn entries(root: &RootDir, listing: &BTreeMap<String, Kind>, known: (&str, &SharedLibrary)) -> Vec<LdCacheEntry> {
    let mut by_key: BTreeMap<String, LdCacheEntry> = BTreeMap::new();
    for kind in [Kind::File, Kind::Link] {
        for (name, _) in listing.iter().filter(|(n, k)| **k == kind && looks_like_library(n)) {
            let read = if name == known.0 {
                Ok(Some(known.1.clone()))
            } else {
                with_file(root, name, |read| Ok(elf::shared_library(read)?))
            };
            let lib = match read {
                Ok(Some(lib)) => lib,
                _ => continue,
            };
            let key = library_key(name, lib.soname.as_deref(), kind == Kind::Link);
            if by_key.contains_key(&key) || key.contains('/') || key == "." || key == ".." {
                continue;
            }
            let entry = LdCacheEntry {
                name: key.clone(),
                path: format!("{}/{}", COMPAT_DIR, key),
                flags: lib.flags,
                is_64bit: true,
                hwcap: 0,
                osversion: lib.osversion,
            };
            by_key.insert(key, entry);
        }
    }
    by_key.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudacompat::fixture::{self, get, int, list, members, text};
    use crate::json::Value;
    use crate::testroot::TestRoot;

    const HOST: &str = "550.163.01";
    const FOLDER: &str = "usr/local/cuda/compat";

    /// The operations of a fixture layout (test_compat_rust_fixtures.build_layout).
    fn build(tree: &TestRoot, operations: &[Value]) {
        for op in operations {
            let op = list(op);
            let path = text(&op[1]);
            match text(&op[0]) {
                "dir" => tree.dir(path),
                "file" => tree.write(path, &fixture::file(text(&op[2]))),
                "text" => tree.write(path, text(&op[2]).as_bytes()),
                "link" => tree.link(path, text(&op[2])),
                "fifo" => tree.fifo(path),
                "files" => {
                    for i in 0..int(&op[2]).parse::<usize>().unwrap() {
                        tree.write(&format!("{}/f{}", path, i), b"");
                    }
                }
                other => panic!("unknown operation {}", other),
            }
        }
    }

    fn decision_value(decision: &Option<Decision>) -> Value {
        match decision {
            None => Value::Null,
            Some(d) => fixture::object(vec![
                ("use", Value::Bool(d.r#use)),
                ("reason", fixture::string(&d.reason)),
                ("library", fixture::string(&d.library)),
            ]),
        }
    }

    fn entries_value(entries: &[LdCacheEntry]) -> Value {
        Value::Array(
            entries
                .iter()
                .map(|e| {
                    Value::Array(vec![
                        fixture::string(&e.name),
                        fixture::string(&e.path),
                        fixture::number(e.flags),
                        Value::Bool(e.is_64bit),
                        fixture::number(e.hwcap),
                        fixture::number(e.osversion),
                    ])
                })
                .collect(),
        )
    }

    #[test]
    fn the_fixture_layouts_are_decided_as_python_decides() {
        let golden = fixture::load();
        let layouts = members(get(&golden, "layouts"));
        assert!(layouts.len() > 30);
        for (name, layout) in layouts {
            let tree = TestRoot::new();
            build(&tree, list(get(layout, "operations")));
            let found = check(&tree.root(), text(get(layout, "host")));
            let want = fixture::sorted(get(layout, "decision"));
            assert_eq!(fixture::sorted(&decision_value(&found.decision)), want, "{}", name);
            assert_eq!(&entries_value(&found.entries), get(layout, "entries"), "{}", name);
            let folder = found.folder().map_or(Value::Null, fixture::string);
            assert_eq!(&folder, get(layout, "folder"), "{}", name);
            assert_eq!(found.note(), text(get(layout, "note")), "{}", name);
        }
    }

    /// A cuda-compat layout of `lib` (a fixture file) as `libcuda.so.<version>`.
    fn cuda_compat(tree: &TestRoot, version: &str, lib: &str) {
        tree.dir(FOLDER);
        tree.write(&format!("{}/libcuda.so.{}", FOLDER, version), &fixture::file(lib));
        tree.link(&format!("{}/libcuda.so.1", FOLDER), &format!("libcuda.so.{}", version));
        tree.link(&format!("{}/libcuda.so", FOLDER), "libcuda.so.1");
    }

    fn entry(name: &str, osversion: u32) -> LdCacheEntry {
        LdCacheEntry {
            name: name.to_string(),
            path: format!("/{}/{}", FOLDER, name),
            flags: 0x0303,
            is_64bit: true,
            hwcap: 0,
            osversion,
        }
    }

    #[test]
    fn no_folder_says_nothing() {
        let tree = TestRoot::new();
        let found = check(&tree.root(), HOST);
        assert_eq!(found, Compat::default());
        assert_eq!((found.folder(), found.note().as_str()), (None, ""));
    }

    #[test]
    fn a_newer_libcuda_is_used_with_the_entries_ldconfig_would_list() {
        let tree = TestRoot::new();
        cuda_compat(&tree, "555.58.02", "libcuda-note.so");
        let found = check(&tree.root(), HOST);
        assert_eq!(found.folder(), Some("/usr/local/cuda/compat"));
        assert_eq!(
            found.note(),
            "libcuda.so.555.58.02 in /usr/local/cuda/compat (CUDA 12.8, for driver branches 535,550,570) is used \
             over the driver 550.163.01"
        );
        assert_eq!(found.entries, vec![entry("libcuda.so", 0x030200), entry("libcuda.so.1", 0x030200)]);
    }

    #[test]
    fn an_older_libcuda_is_not_used() {
        let tree = TestRoot::new();
        cuda_compat(&tree, "535.183.06", "libcuda-plain.so");
        let found = check(&tree.root(), HOST);
        assert_eq!(found.folder(), None);
        assert!(found.entries.is_empty());
        assert!(found.note().contains("is not newer than the driver 550.163.01"), "{}", found.note());
    }

    #[test]
    fn a_link_out_of_the_root_is_followed_in_it() {
        let tree = TestRoot::new();
        let host = TestRoot::new(); // a real newer libcuda outside the root
        host.write("libcuda.so.999.0", &fixture::file("libcuda-plain.so"));
        tree.dir(FOLDER);
        let target = host.at("libcuda.so.999.0");
        tree.link(&format!("{}/libcuda.so.999.0", FOLDER), target.to_str().unwrap());
        let found = check(&tree.root(), HOST);
        assert_eq!(
            found.note(),
            "/usr/local/cuda/compat/libcuda.so.999.0: No such file or directory: the driver's libraries are used"
        );
        // The folder itself linked to the host's: as if there were none.
        let tree = TestRoot::new();
        tree.dir("usr/local/cuda");
        tree.link(FOLDER, host.path().to_str().unwrap());
        assert_eq!(check(&tree.root(), HOST), Compat::default());
    }

    #[test]
    fn a_fifo_named_libcuda_never_blocks() {
        let tree = TestRoot::new();
        tree.dir(FOLDER);
        tree.fifo(&format!("{}/libcuda.so.1.2", FOLDER));
        let found = check(&tree.root(), HOST);
        assert_eq!(
            found.note(),
            "/usr/local/cuda/compat/libcuda.so.1.2 is neither a file nor a link: the driver's libraries are used"
        );
        // Reached through a link: opened without waiting, refused by fstat.
        let tree = TestRoot::new();
        tree.dir(FOLDER);
        tree.fifo("fifo");
        tree.link(&format!("{}/libcuda.so.1.2", FOLDER), "/fifo");
        let found = check(&tree.root(), HOST);
        assert_eq!(
            found.note(),
            "/usr/local/cuda/compat/libcuda.so.1.2: not a regular file: the driver's libraries are used"
        );
    }

    #[test]
    fn over_max_entries_are_refused_without_listing_them_all() {
        let tree = TestRoot::new();
        tree.dir(FOLDER);
        for i in 0..5000 {
            tree.write(&format!("{}/f{}", FOLDER, i), b"");
        }
        let found = check(&tree.root(), HOST);
        assert_eq!(found.note(), "/usr/local/cuda/compat: over 256 entries: the driver's libraries are used");
        assert_eq!(found.decision.map(|d| d.library), Some(String::new()));
    }

    #[test]
    fn a_huge_libcuda_costs_a_few_bounded_reads() {
        // 64 GiB (sparse) whose section table claims to lie at its end.
        let tree = TestRoot::new();
        tree.dir(FOLDER);
        let mut data = fixture::file("libcuda-plain.so");
        data[0x28..0x30].copy_from_slice(&((64u64 << 30) - 4096).to_le_bytes());
        data[0x3C..0x3E].copy_from_slice(&4000u16.to_le_bytes());
        let path = format!("{}/libcuda.so.999.0", FOLDER);
        tree.write(&path, &data);
        let file = std::fs::OpenOptions::new().write(true).open(tree.at(&path)).unwrap();
        file.set_len(64 << 30).unwrap();
        let found = check(&tree.root(), HOST);
        assert_eq!(
            found.note(),
            "/usr/local/cuda/compat/libcuda.so.999.0: a table beyond the end of the file: the driver's libraries are used"
        );
    }

    #[test]
    fn an_osversion_past_32_bits_keeps_glibcs_low_bits() {
        let tree = TestRoot::new();
        cuda_compat(&tree, "555.58.02", "abi-note-os-big.so");
        let found = check(&tree.root(), HOST);
        assert!(found.folder().is_some(), "{}", found.note());
        let big = (0x1234u64 << 24) | 0x030200;
        assert_eq!(found.entries[1], entry("libcuda.so.1", big as u32));
    }

    #[test]
    fn a_truncated_abi_note_is_a_reason_not_a_failure() {
        let tree = TestRoot::new();
        cuda_compat(&tree, "555.58.02", "abi-note-truncated.so");
        let found = check(&tree.root(), HOST);
        assert_eq!(
            found.note(),
            "/usr/local/cuda/compat/libcuda.so.555.58.02: an ABI tag note cut short: the driver's libraries are used"
        );
    }

    #[test]
    fn offsets_past_what_pread_takes_read_as_the_end() {
        // Python's os.pread raises OverflowError there.
        let tree = TestRoot::new();
        tree.dir(FOLDER);
        tree.write(&format!("{}/libcuda.so.999.0", FOLDER), &fixture::file("phoff-max.so"));
        let found = check(&tree.root(), HOST);
        assert_eq!(
            found.note(),
            "/usr/local/cuda/compat/libcuda.so.999.0: a table beyond the end of the file: the driver's libraries are used"
        );
    }
}
