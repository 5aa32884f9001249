//! glibc's `/etc/ld.so.cache`: read without glibc, the driver's entries inserted
//! where ldconfig would put them, and written as ldconfig writes it
//! (`engine/ldcache.py` and `engine/ldcache_merge.py`, whose reasons hold here).
//!
//! Layouts (glibc's `sysdeps/generic/dl-cache.h`, `elf/cache.c`; native-endian
//! fields, little-endian read only):
//!
//! * **new** (the default since glibc 2.32): a 48-byte header (magic and version
//!   `glibc-ld.so.cache1.1`, u32 nlibs at 20, u32 len_strings at 24, the flags
//!   byte at 28 whose low two bits say the byte order, u32 extension_offset at
//!   32), `nlibs` entries of 24 bytes (i32 flags, u32 key, u32 value, u32
//!   osversion, u64 hwcap), then the strings. Offsets count from the header.
//!   The extension directory (at a file offset, a multiple of 4): u32 magic,
//!   u32 count, then sections of u32 tag, flags, offset, size; tag 1 lists the
//!   `glibc-hwcaps` subdirectory names as u32 string offsets, which an entry
//!   with bit 62 of `hwcap` set (alone above the ISA level) indexes.
//! * **old** (`ld.so-1.7.0`): a 16-byte header (magic, NUL, u32 nlibs), entries
//!   of 12 bytes (i32 flags, u32 key, u32 value), then the strings; offsets
//!   count from the end of the entries.
//! * **compat**: an old cache whose string table starts with a whole new cache
//!   (at the end of the old entries rounded up to 8); like glibc we read the
//!   new part when it is there, else the old one.
//!
//! Every way the bytes can be wrong is `CacheError::Garbled` naming the field or
//! offset; counts are checked against the size before anything is unpacked, a
//! string is at most `MAX_STRING` bytes and all strings together at most
//! `DECODE_FACTOR` times the file. On top of that, limits no real cache comes
//! near (`CacheError::Limit`): `MAX_CACHE_SIZE` bytes, `MAX_ENTRIES` entries, an
//! optional deadline. Strings are kept as bytes (Python decodes them with
//! `surrogateescape`, which gives back the same bytes), as slices of one shared
//! copy of the file: a hostile cache whose entries all share long strings costs
//! no more memory than its size.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::rc::Rc;
use std::time::Instant;

use crate::bytes::{py_slice, round_up};
use crate::model::LdCacheEntry;

pub const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
pub const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache";
pub const NEW_VERSION: &[u8] = b"1.1";
const OLD_HEADER_SIZE: u64 = 16;
const OLD_ENTRY_SIZE: u64 = 12;
const NEW_HEADER_SIZE: u64 = 48;
const NEW_ENTRY_SIZE: u64 = 24;
const NEW_ALIGN: u64 = 8; // alignof(struct cache_file_new): where the new part of a compat cache starts
pub const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
pub const EXTENSION_TAG_GENERATOR: u32 = 0;
pub const EXTENSION_TAG_HWCAPS: u32 = 1;
pub const HWCAP_EXTENSION: u64 = 1 << 62;
const ISA_LEVEL_BITS: u32 = 10;
const EXTENSION_SIZE: u64 = 8; // magic, count
const SECTION_SIZE: u64 = 16; // tag, flags, offset, size
const MAX_HWCAPS: u64 = 64; // glibc knows four x86-64 levels and a handful elsewhere

const ENDIAN_MASK: u8 = 0x03;
const ENDIAN_INVALID: u8 = 1;
const ENDIAN_LITTLE: u8 = 2;
const ENDIAN_BIG: u8 = 3;

pub const FLAG_REQUIRED_MASK: i32 = 0xFF00;
/// The required-ABI values (ldconfig.h) whose libraries are 64-bit (LP64):
/// sparc64, ia64, x86-64, s390x, ppc64, mips64 n64 (and nan2008), aarch64,
/// loongarch64 (soft and double float). Not mips n32 or x32 (32-bit pointers),
/// nor RISC-V, whose flags name only the float ABI.
const LIB64_ABIS: [i32; 10] = [0x0100, 0x0200, 0x0300, 0x0400, 0x0500, 0x0700, 0x0A00, 0x0E00, 0x1100, 0x1200];

/// PATH_MAX: no library name or path in a real cache is longer.
pub const MAX_STRING: usize = 4096;
/// Decoded text allowed per byte of cache (real caches: about 1).
const DECODE_FACTOR: u64 = 16;
/// Real caches: a CUDA image's ~30 KB and a few hundred entries, a desktop's
/// ~200 KB and a few thousand. Far above both, far below what hurts.
pub const MAX_CACHE_SIZE: usize = 8 << 20;
pub const MAX_ENTRIES: u64 = 1 << 16;
/// Entries handled between two looks at the deadline.
const CHUNK: usize = 4096;

/// What `encode` names as the cache's generator (`ldconfig -p` prints it).
pub const GENERATOR: &str = "nri-gpu: the image's cache with the NVIDIA driver libraries added";

/// Why a cache is refused: over a size, count or time limit (Python's
/// `LdCacheLimit`), or not a cache / garbled (a plain `DiscoveryError`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheError {
    Limit(String),
    Garbled(String),
}

impl CacheError {
    pub fn message(&self) -> &str {
        match self {
            CacheError::Limit(message) | CacheError::Garbled(message) => message,
        }
    }
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

type CacheResult<T> = std::result::Result<T, CacheError>;

fn garbled<T>(message: String) -> CacheResult<T> {
    Err(CacheError::Garbled(message))
}

/// A string of the cache: a slice of a shared buffer (the file read, or one of
/// ours), compared as its bytes.
#[derive(Clone)]
pub struct Text {
    buf: Rc<[u8]>,
    start: usize,
    end: usize,
}

impl Text {
    pub fn new(bytes: &[u8]) -> Text {
        Text { buf: Rc::from(bytes), start: 0, end: bytes.len() }
    }

    fn slice(buf: &Rc<[u8]>, start: usize, end: usize) -> Text {
        Text { buf: Rc::clone(buf), start, end }
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or(&[])
    }

    /// The text as a `String`, bytes that are not UTF-8 replaced (for messages).
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Text {}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string_lossy())
    }
}

/// One entry as the cache holds it (`engine.model.LdCacheEntry` with byte strings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    pub name: Text,
    pub path: Text,
    pub flags: i32,
    pub is_64bit: bool,
    pub hwcap: u64,
    pub osversion: u32,
}

impl CacheEntry {
    pub fn from_model(entry: &LdCacheEntry) -> CacheEntry {
        CacheEntry {
            name: Text::new(entry.name.as_bytes()),
            path: Text::new(entry.path.as_bytes()),
            flags: entry.flags,
            is_64bit: entry.is_64bit,
            hwcap: entry.hwcap,
            osversion: entry.osversion,
        }
    }

    /// Whether it lives in a `glibc-hwcaps` subdirectory.
    pub fn is_hwcaps(&self) -> bool {
        is_hwcaps_entry(self.hwcap)
    }
}

/// A whole cache: its entries in file order and the `glibc-hwcaps` subdirectory
/// names its extension entries index (empty when it has none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LdCache {
    pub entries: Vec<CacheEntry>,
    pub hwcaps: Vec<Text>,
}

/// `CacheError::Limit` when `deadline` has passed.
pub fn check_deadline(deadline: Option<Instant>, what: &str) -> CacheResult<()> {
    match deadline {
        Some(at) if Instant::now() > at => {
            Err(CacheError::Limit(format!("ld.so.cache: {} did not finish before the deadline", what)))
        }
        _ => Ok(()),
    }
}

/// Whether a cache entry's flags word names a 64-bit ABI.
pub fn is_64bit_flags(flags: i32) -> bool {
    LIB64_ABIS.contains(&(flags & FLAG_REQUIRED_MASK))
}

/// glibc's `dl_cache_hwcap_extension`: bit 62 alone above the ISA level bits.
pub fn is_hwcaps_entry(hwcap: u64) -> bool {
    (hwcap >> 32) & !((1u64 << ISA_LEVEL_BITS) - 1) == HWCAP_EXTENSION >> 32
}

// --------------------------------------------------------------------------- reading

/// Every entry of an ld.so.cache, in file order (ldconfig sorts them), and the
/// `glibc-hwcaps` names of its extension section (`read_ld_so_cache`).
pub fn read_ld_so_cache(data: &[u8], deadline: Option<Instant>) -> CacheResult<LdCache> {
    if data.len() > MAX_CACHE_SIZE {
        return Err(CacheError::Limit(format!(
            "ld.so.cache of {} bytes: over the limit of {} bytes",
            data.len(),
            MAX_CACHE_SIZE
        )));
    }
    let buf: Rc<[u8]> = Rc::from(data);
    if data.starts_with(OLD_MAGIC) {
        return parse_old_or_compat(&buf, deadline);
    }
    if data.starts_with(NEW_MAGIC) {
        return parse_new(&buf, 0, deadline);
    }
    garbled(format!(
        "not an ld.so.cache: starts with {}, expected {} or {}",
        bytes_repr(data.get(..20).unwrap_or(data)),
        bytes_repr(NEW_MAGIC),
        bytes_repr(OLD_MAGIC)
    ))
}

/// One entry's fields as the file has them.
struct Row {
    flags: i32,
    key: u32,
    value: u32,
    osversion: u32,
    hwcap: u64,
}

/// The `nlibs` entries of `size` bytes from `start`: the old format's (12 bytes)
/// have no osversion or hwcap.
fn rows(data: &[u8], start: u64, nlibs: u64, size: u64) -> Vec<Row> {
    let new = size == NEW_ENTRY_SIZE;
    (0..nlibs)
        .map(|i| {
            let at = start + i * size;
            Row {
                flags: u32_at(data, at) as i32,
                key: u32_at(data, at + 4),
                value: u32_at(data, at + 8),
                osversion: if new { u32_at(data, at + 12) } else { 0 },
                hwcap: if new { u64_at(data, at + 16) } else { 0 },
            }
        })
        .collect()
}

fn parse_old_or_compat(buf: &Rc<[u8]>, deadline: Option<Instant>) -> CacheResult<LdCache> {
    let data: &[u8] = buf;
    let size = data.len() as u64;
    if size < OLD_HEADER_SIZE {
        return garbled(format!(
            "truncated ld.so.cache: the old-format header needs {} bytes, the file has {}",
            OLD_HEADER_SIZE, size
        ));
    }
    let nlibs = u64::from(u32_at(data, 12));
    let entries_end = entries_end(size, "old-format", 12, OLD_HEADER_SIZE, nlibs, OLD_ENTRY_SIZE)?;
    let new_start = round_up(entries_end, NEW_ALIGN);
    let magic = py_slice(data, new_start, new_start + NEW_MAGIC.len() as u64);
    let version = py_slice(data, new_start + NEW_MAGIC.len() as u64, new_start + 20);
    if size >= new_start + NEW_HEADER_SIZE && magic == NEW_MAGIC && version == NEW_VERSION {
        return parse_new(buf, new_start, deadline); // compat: glibc reads the new part
    }
    check_count(nlibs, "old-format", 12)?; // before anything is unpacked
    check_deadline(deadline, "reading the strings")?; // before the rows are unpacked
    let rows = rows(data, OLD_HEADER_SIZE, nlibs, OLD_ENTRY_SIZE);
    let entries = build_entries(buf, entries_end, entries_end, size, &rows, deadline)?;
    Ok(LdCache { entries, hwcaps: Vec::new() })
}

fn check_count(nlibs: u64, kind: &str, field: u64) -> CacheResult<()> {
    if nlibs > MAX_ENTRIES {
        return Err(CacheError::Limit(format!(
            "{} ld.so.cache nlibs={} (offset {}): over the limit of {} entries",
            kind, nlibs, field, MAX_ENTRIES
        )));
    }
    Ok(())
}

fn parse_new(buf: &Rc<[u8]>, base: u64, deadline: Option<Instant>) -> CacheResult<LdCache> {
    let data: &[u8] = buf;
    let size = data.len() as u64;
    let left = size.saturating_sub(base);
    if left < NEW_HEADER_SIZE {
        return garbled(format!(
            "truncated ld.so.cache: the new-format header at offset {} needs {} bytes, {} are left",
            base, NEW_HEADER_SIZE, left
        ));
    }
    let version = py_slice(data, base + 17, base + 20);
    if version != NEW_VERSION {
        return garbled(format!(
            "unsupported ld.so.cache version {} at offset {}, expected {}",
            bytes_repr(version),
            base + 17,
            bytes_repr(NEW_VERSION)
        ));
    }
    let nlibs = u64::from(u32_at(data, base + 20));
    let len_strings = u64::from(u32_at(data, base + 24));
    let flags = py_slice(data, base + 28, base + 29).first().copied().unwrap_or(0);
    let extension = u64::from(u32_at(data, base + 32));
    match flags & ENDIAN_MASK {
        ENDIAN_BIG => {
            return garbled(format!(
                "ld.so.cache is big-endian (flags byte {:#04x} at offset {}); only little-endian caches are read",
                flags,
                base + 28
            ))
        }
        ENDIAN_INVALID => {
            return garbled(format!(
                "ld.so.cache marks itself invalid (flags byte {:#04x} at offset {})",
                flags,
                base + 28
            ))
        }
        _ => {}
    }
    let entries_start = base + NEW_HEADER_SIZE;
    let entries_end = entries_end(size, "new-format", base + 20, entries_start, nlibs, NEW_ENTRY_SIZE)?;
    check_count(nlibs, "new-format", base + 20)?; // before anything is unpacked
    let strings_end = entries_end + len_strings;
    if strings_end > size {
        return garbled(format!(
            "ld.so.cache len_strings={} (offset {}): the string table would end at {}, \
             past the end of the file ({} bytes)",
            len_strings,
            base + 24,
            strings_end,
            size
        ));
    }
    // Before the rows are unpacked: a deadline gone already costs no work at all.
    check_deadline(deadline, "reading the strings")?;
    let rows = rows(data, entries_start, nlibs, NEW_ENTRY_SIZE);
    let entries = build_entries(buf, base, entries_end, strings_end, &rows, deadline)?;
    let hwcaps = if extension != 0 { hwcaps_names(buf, base, extension, deadline)? } else { Vec::new() };
    Ok(LdCache { entries, hwcaps })
}

/// Where `nlibs` entries of `size` bytes from `start` end; garbled past the file,
/// saying so when the count byte-swapped would fit (a big-endian cache).
fn entries_end(file_size: u64, kind: &str, field: u64, start: u64, nlibs: u64, size: u64) -> CacheResult<u64> {
    let end = start + nlibs * size;
    if end <= file_size {
        return Ok(end);
    }
    let mut why = format!("{} ld.so.cache nlibs={} (offset {}): ", kind, nlibs, field);
    why += &format!(
        "{} entries of {} bytes from offset {} end at {}, past the end of the file ({} bytes)",
        nlibs, size, start, end, file_size
    );
    let swapped = u64::from((nlibs as u32).swap_bytes());
    if start + swapped * size <= file_size {
        why += &format!(
            "; byte-swapped it would be {}, so the cache looks big-endian (only little-endian caches are read)",
            swapped
        );
    }
    garbled(why)
}

/// The entries of `rows`; string offsets count from `base`, strings lie in
/// [`start`, `end`) of the file.
fn build_entries(
    buf: &Rc<[u8]>,
    base: u64,
    start: u64,
    end: u64,
    rows: &[Row],
    deadline: Option<Instant>,
) -> CacheResult<Vec<CacheEntry>> {
    let data: &[u8] = buf;
    let table = py_slice(data, start, end);
    let first = start - base; // the table's offset, counted as the entries' offsets are
    let budget = DECODE_FACTOR * data.len() as u64 + 65536;
    let keys = rows.iter().map(|r| r.key).collect::<Vec<u32>>();
    let values = rows.iter().map(|r| r.value).collect::<Vec<u32>>();
    // Python reads a table shaped as ldconfig writes it in bulk, and decides
    // anything else one offset at a time; the two count the decoded text
    // differently, so the shape decides which budget applies.
    let in_bulk = bulk_shape(table, first, &keys, &values, budget);
    check_deadline(deadline, "reading the strings")?;
    let seen = if in_bulk {
        one_by_one(table, first, base, &[("key", &keys), ("value", &values)], u64::MAX, None)?
    } else {
        one_by_one(table, first, base, &[("key", &keys), ("value", &values)], budget, deadline)?
    };
    let text = |offset: u32| -> Text {
        let (from, to) = seen.get(&offset).copied().unwrap_or((0, 0));
        Text::slice(buf, to_usize(start) + from, to_usize(start) + to)
    };
    let mut out = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(CHUNK) {
        check_deadline(deadline, "building the entries")?;
        out.extend(chunk.iter().map(|row| CacheEntry {
            name: text(row.key),
            path: text(row.value),
            flags: row.flags,
            is_64bit: is_64bit_flags(row.flags),
            hwcap: row.hwcap,
            osversion: row.osversion,
        }));
    }
    Ok(out)
}

/// Whether Python's bulk pass (`_strings_in_bulk`) reads this table: ASCII, every
/// value where a string starts, every key the start of a string, a tail of its
/// own path or else found one by one, no string over `MAX_STRING`, the paths
/// (each counted every time it is used) within `budget`.
fn bulk_shape(table: &[u8], first: u64, keys: &[u32], values: &[u32], budget: u64) -> bool {
    let nuls = table.iter().filter(|&&b| b == 0).count() as u64;
    if !table.is_ascii() || nuls > 2 * keys.len() as u64 + 16 {
        return false;
    }
    // offset -> length of each string that a NUL ends, where one starts.
    let mut natural: HashMap<u64, usize> = HashMap::new();
    let mut from = 0usize;
    for (at, &byte) in table.iter().enumerate() {
        if byte == 0 {
            natural.insert(first + from as u64, at - from);
            from = at + 1;
        }
    }
    let mut paths = Vec::with_capacity(values.len());
    for value in values {
        match natural.get(&u64::from(*value)) {
            Some(&length) => paths.push(length),
            None => return false,
        }
    }
    let total = paths.iter().map(|&n| n as u64).sum::<u64>();
    if total > budget || paths.iter().any(|&n| n > MAX_STRING) {
        return false;
    }
    let tail = |key: u32, value: u32, length: usize| value <= key && u64::from(key - value) <= length as u64;
    if keys.iter().zip(values).zip(&paths).all(|((&k, &v), &n)| tail(k, v, n)) {
        return true; // each name the tail of its own path
    }
    let mut longest = 0usize;
    let mut missing = Vec::new();
    for ((&key, &value), &length) in keys.iter().zip(values).zip(&paths) {
        if let Some(&own) = natural.get(&u64::from(key)) {
            longest = longest.max(own);
        } else if !(value < key && u64::from(key - value) <= length as u64) {
            missing.push(key); // a tail of another string: a 32-bit name inside the 64-bit path
        }
    }
    if !missing.is_empty() && one_by_one(table, first, 0, &[("key", &missing)], budget - total, None).is_err() {
        return false;
    }
    longest <= MAX_STRING
}

/// offset -> (start, end) in `table` of the string of every offset the entries
/// use, each checked; garbled naming the first fault (`_strings_one_by_one`).
fn one_by_one(
    table: &[u8],
    first: u64,
    base: u64,
    fields: &[(&str, &[u32])],
    budget: u64,
    deadline: Option<Instant>,
) -> CacheResult<HashMap<u32, (usize, usize)>> {
    let mut budget = budget;
    let mut seen: HashMap<u32, (usize, usize)> = HashMap::new();
    for &(field, offsets) in fields {
        for (count, &offset) in offsets.iter().enumerate() {
            if count % CHUNK == 0 {
                check_deadline(deadline, "reading the strings")?;
            }
            if seen.contains_key(&offset) {
                continue;
            }
            let nul = u64::from(offset).checked_sub(first).and_then(|pos| find_nul(table, pos));
            let (pos, nul) = match nul {
                Some(found) => found,
                None => return Err(string_error(table.len(), base, base + first, count, field, offset)),
            };
            budget = match budget.checked_sub((nul - pos) as u64) {
                Some(left) => left,
                None => {
                    return garbled(format!(
                        "ld.so.cache entry {}: its strings bring the total past {}x the file's size; \
                         the offsets overlap in a way ldconfig never writes",
                        count, DECODE_FACTOR
                    ))
                }
            };
            seen.insert(offset, (pos, nul));
        }
    }
    Ok(seen)
}

/// (pos, the NUL after it) when one lies within `MAX_STRING` bytes of `pos`.
fn find_nul(table: &[u8], pos: u64) -> Option<(usize, usize)> {
    let pos = usize::try_from(pos).ok()?;
    let window = table.get(pos..)?;
    let window = window.get(..MAX_STRING + 1).unwrap_or(window);
    window.iter().position(|&b| b == 0).map(|at| (pos, pos + at))
}

fn string_error(table_len: usize, base: u64, start: u64, index: usize, field: &str, offset: u32) -> CacheError {
    let pos = base + u64::from(offset);
    let end = start + table_len as u64;
    if !(start <= pos && pos < end) {
        return CacheError::Garbled(format!(
            "ld.so.cache entry {}: {} offset {} (file offset {}) is outside the string table [{}, {})",
            index, field, offset, pos, start, end
        ));
    }
    CacheError::Garbled(format!(
        "ld.so.cache entry {}: the {} string at file offset {} has no NUL within {} bytes",
        index,
        field,
        pos,
        (end - pos).min(MAX_STRING as u64 + 1)
    ))
}

/// The `glibc-hwcaps` subdirectory names of the extension directory at file
/// offset `offset`; string offsets count from `base`. Checked as glibc's
/// `cache_extension_load` checks it: anything malformed gives no names (the
/// loader goes on without them). The directory can hold one section per 16
/// bytes of the file: `deadline` is looked at as they are read.
fn hwcaps_names(buf: &Rc<[u8]>, base: u64, offset: u64, deadline: Option<Instant>) -> CacheResult<Vec<Text>> {
    let data: &[u8] = buf;
    let size = data.len() as u64;
    if offset % 4 != 0 || offset + EXTENSION_SIZE > size {
        return Ok(Vec::new());
    }
    let magic = u32_at(data, offset);
    let count = u64::from(u32_at(data, offset + 4));
    if magic != EXTENSION_MAGIC || offset + EXTENSION_SIZE + count * SECTION_SIZE > size {
        return Ok(Vec::new());
    }
    let strings = py_slice(data, base, size);
    let budget = DECODE_FACTOR * size + 65536;
    let mut names = Vec::new();
    for i in 0..count {
        if i % CHUNK as u64 == 0 {
            check_deadline(deadline, "reading the extension")?;
        }
        let at = offset + EXTENSION_SIZE + i * SECTION_SIZE;
        let (tag, start, length) =
            (u32_at(data, at), u64::from(u32_at(data, at + 8)), u64::from(u32_at(data, at + 12)));
        if start + length > size {
            return Ok(Vec::new());
        }
        if tag != EXTENSION_TAG_HWCAPS || length == 0 || start % 4 != 0 || length % 4 != 0 || length / 4 > MAX_HWCAPS {
            continue; // glibc ignores an unknown tag and drops a malformed hwcaps section
        }
        let table = (0..length / 4).map(|k| u32_at(data, start + 4 * k)).collect::<Vec<u32>>();
        let found = match one_by_one(strings, 0, base, &[("key", &table)], budget, None) {
            Ok(found) => found,
            Err(_) => return Ok(Vec::new()),
        };
        names = table
            .iter()
            .map(|o| {
                let (from, to) = found.get(o).copied().unwrap_or((0, 0));
                Text::slice(buf, to_usize(base) + from, to_usize(base) + to)
            })
            .collect();
    }
    Ok(names)
}

// --------------------------------------------------------------------------- merging

/// glibc's `_dl_cache_libcmp`: <0, 0, >0 as `left` sorts before, with or after
/// `right`: digit runs compare as numbers, in C's `int` (overflow wraps), other
/// bytes as x86's signed `char`. A string ends at its first NUL, as in C.
pub fn libcmp(left: &[u8], right: &[u8]) -> i32 {
    let at = |p: &[u8], i: usize| p.get(i).copied().unwrap_or(0);
    let (mut i, mut j) = (0usize, 0usize);
    while at(left, i) != 0 {
        let (c1, c2) = (at(left, i), at(right, j));
        if c1.is_ascii_digit() {
            if !c2.is_ascii_digit() {
                return 1;
            }
            let mut val1 = i32::from(c1 - b'0');
            let mut val2 = i32::from(c2 - b'0');
            i += 1;
            j += 1;
            while at(left, i).is_ascii_digit() {
                val1 = val1.wrapping_mul(10).wrapping_add(i32::from(at(left, i) - b'0'));
                i += 1;
            }
            while at(right, j).is_ascii_digit() {
                val2 = val2.wrapping_mul(10).wrapping_add(i32::from(at(right, j) - b'0'));
                j += 1;
            }
            if val1 != val2 {
                return val1.wrapping_sub(val2);
            }
        } else if c2.is_ascii_digit() {
            return -1;
        } else if c1 != c2 {
            return i32::from(c1 as i8) - i32::from(c2 as i8);
        } else {
            i += 1;
            j += 1;
        }
    }
    i32::from(at(left, i) as i8) - i32::from(at(right, j) as i8)
}

/// ldconfig's `compare(e1, e2)`: >0 when `e1` goes after `e2`: name descending,
/// flags descending, `glibc-hwcaps` entries first (two of them keep their
/// order), more hwcap bits, higher hwcap, higher osversion first.
fn compare(e1: &CacheEntry, e2: &CacheEntry) -> i32 {
    let res = libcmp(e2.name.as_bytes(), e1.name.as_bytes());
    if res != 0 {
        return res;
    }
    if e1.flags != e2.flags {
        return if e1.flags < e2.flags { 1 } else { -1 };
    }
    let (ext1, ext2) = (e1.is_hwcaps(), e2.is_hwcaps());
    if ext1 || ext2 {
        return if ext1 && ext2 {
            0
        } else if ext1 {
            -1
        } else {
            1
        };
    }
    let pairs = [
        (u64::from(e1.hwcap.count_ones()), u64::from(e2.hwcap.count_ones())),
        (e1.hwcap, e2.hwcap),
        (u64::from(e1.osversion), u64::from(e2.osversion)),
    ];
    for (a, b) in pairs {
        if a != b {
            return if b > a { 1 } else { -1 };
        }
    }
    0
}

/// `image`'s entries with `ours` inserted as ldconfig would (`ldcache_merge.merge`):
/// each before the entries it ties with (ldconfig scans our folders first), by
/// a binary search of the list as it is, sorted or not (an unsorted image cache
/// only misleads its own loader). An image entry with the name and path of one
/// of ours is the same library: ours replaces it. A `glibc-hwcaps` entry whose
/// subdirectory name is missing is dropped: no loader can use it.
pub fn merge(image: &LdCache, ours: &[LdCacheEntry], deadline: Option<Instant>) -> CacheResult<LdCache> {
    let ours = ours.iter().map(CacheEntry::from_model).collect::<Vec<CacheEntry>>();
    let replaced = ours.iter().map(|e| (e.name.as_bytes(), e.path.as_bytes())).collect::<HashSet<(&[u8], &[u8])>>();
    let kept = image
        .entries
        .iter()
        .filter(|e| !replaced.contains(&(e.name.as_bytes(), e.path.as_bytes())) && named(e, image.hwcaps.len()))
        .collect::<Vec<&CacheEntry>>();
    let mut list = Interleaved { kept: &kept, ours: &ours, placed: Vec::new() };
    for (index, entry) in ours.iter().enumerate() {
        check_deadline(deadline, "the merge")?;
        let at = list.bisect_left(entry);
        list.insert(at, index);
    }
    Ok(LdCache { entries: list.collect(), hwcaps: image.hwcaps.clone() })
}

fn named(entry: &CacheEntry, hwcaps: usize) -> bool {
    !entry.is_hwcaps() || ((entry.hwcap & 0xFFFF_FFFF) as usize) < hwcaps
}

/// The merged list without moving the image's entries at each insertion: the
/// kept image entries, with ours at the positions `placed` records (ascending),
/// so that an insertion costs O(ours), not O(image).
struct Interleaved<'a> {
    kept: &'a [&'a CacheEntry],
    ours: &'a [CacheEntry],
    /// (position in the merged list, index in `ours`), by position.
    placed: Vec<(usize, usize)>,
}

impl<'a> Interleaved<'a> {
    fn len(&self) -> usize {
        self.kept.len() + self.placed.len()
    }

    fn get(&self, at: usize) -> Option<&'a CacheEntry> {
        let before = self.placed.partition_point(|&(p, _)| p < at);
        match self.placed.get(before) {
            Some(&(p, index)) if p == at => self.ours.get(index),
            _ => at.checked_sub(before).and_then(|k| self.kept.get(k)).copied(),
        }
    }

    /// Python's `bisect.bisect_left`: the first position whose entry does not sort before `entry`.
    fn bisect_left(&self, entry: &CacheEntry) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let before = self.get(mid).map_or(false, |e| compare(e, entry) < 0);
            if before {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    fn insert(&mut self, at: usize, index: usize) {
        let from = self.placed.partition_point(|&(p, _)| p < at);
        for moved in self.placed.iter_mut().skip(from) {
            moved.0 += 1;
        }
        self.placed.insert(from, (at, index));
    }

    fn collect(&self) -> Vec<CacheEntry> {
        (0..self.len()).filter_map(|at| self.get(at).cloned()).collect()
    }
}

// --------------------------------------------------------------------------- writing

/// The bytes of `cache` in glibc's new format (little-endian), with an extension
/// directory naming `generator` and, if `cache.hwcaps` is not empty, the
/// `glibc-hwcaps` names its entries index (`ldcache_merge.encode`). Each string
/// is stored once (no suffix sharing).
pub fn encode(cache: &LdCache, generator: &str, deadline: Option<Instant>) -> CacheResult<Vec<u8>> {
    let count = cache.entries.len() as u64;
    let mut strings = StringTable::new(NEW_HEADER_SIZE + NEW_ENTRY_SIZE * count);
    let mut rows = Vec::with_capacity(cache.entries.len() * NEW_ENTRY_SIZE as usize);
    for chunk in cache.entries.chunks(CHUNK) {
        check_deadline(deadline, "writing the merged cache")?;
        for e in chunk {
            let key = strings.add(e.name.as_bytes())?;
            let value = strings.add(e.path.as_bytes())?;
            rows.extend_from_slice(&e.flags.to_le_bytes());
            rows.extend_from_slice(&key.to_le_bytes());
            rows.extend_from_slice(&value.to_le_bytes());
            rows.extend_from_slice(&e.osversion.to_le_bytes());
            rows.extend_from_slice(&e.hwcap.to_le_bytes());
        }
    }
    let mut hwcaps = Vec::new();
    for name in &cache.hwcaps {
        hwcaps.extend_from_slice(&strings.add(name.as_bytes())?.to_le_bytes());
    }
    let extension_offset = round_up(strings.end, 4);
    let text = generator.as_bytes();
    let sections: u32 = if hwcaps.is_empty() { 1 } else { 2 };
    let data_start = extension_offset + EXTENSION_SIZE + u64::from(sections) * SECTION_SIZE;

    let mut out = Vec::with_capacity(to_usize(data_start) + hwcaps.len() + text.len());
    out.extend_from_slice(NEW_MAGIC);
    out.extend_from_slice(NEW_VERSION);
    out.extend_from_slice(&word(count)?.to_le_bytes());
    out.extend_from_slice(&word(strings.data.len() as u64)?.to_le_bytes());
    out.extend_from_slice(&[ENDIAN_LITTLE, 0, 0, 0]);
    out.extend_from_slice(&word(extension_offset)?.to_le_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&rows);
    out.extend_from_slice(&strings.data);
    out.resize(to_usize(extension_offset), 0);
    for value in [EXTENSION_MAGIC, sections, EXTENSION_TAG_GENERATOR, 0] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&word(data_start + hwcaps.len() as u64)?.to_le_bytes());
    out.extend_from_slice(&word(text.len() as u64)?.to_le_bytes());
    if !hwcaps.is_empty() {
        for value in [EXTENSION_TAG_HWCAPS, 0, word(data_start)?, word(hwcaps.len() as u64)?] {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
    out.extend_from_slice(&hwcaps);
    out.extend_from_slice(text);
    Ok(out)
}

/// A file offset or size as the format's u32 (Python's `struct.pack` would raise
/// past it; no cache within the limits comes near).
fn word(value: u64) -> CacheResult<u32> {
    u32::try_from(value).map_err(|_| {
        CacheError::Limit(format!("ld.so.cache: the merged cache would need offset {}, past 4 GiB", value))
    })
}

/// NUL-terminated strings, each stored once; offsets count from the file's start.
struct StringTable<'a> {
    offsets: HashMap<&'a [u8], u32>,
    data: Vec<u8>,
    end: u64,
}

impl<'a> StringTable<'a> {
    fn new(start: u64) -> StringTable<'a> {
        StringTable { offsets: HashMap::new(), data: Vec::new(), end: start }
    }

    fn add(&mut self, text: &'a [u8]) -> CacheResult<u32> {
        if let Some(&found) = self.offsets.get(text) {
            return Ok(found);
        }
        let found = word(self.end)?;
        self.offsets.insert(text, found);
        self.data.extend_from_slice(text);
        self.data.push(0);
        self.end += text.len() as u64 + 1;
        Ok(found)
    }
}

// --------------------------------------------------------------------------- bytes

/// The little-endian u32 at `at`, 0 past the end (callers checked the size first).
fn u32_at(data: &[u8], at: u64) -> u32 {
    <[u8; 4]>::try_from(py_slice(data, at, at + 4)).map(u32::from_le_bytes).unwrap_or(0)
}

fn u64_at(data: &[u8], at: u64) -> u64 {
    <[u8; 8]>::try_from(py_slice(data, at, at + 8)).map(u64::from_le_bytes).unwrap_or(0)
}

/// An offset already checked against the file's size (at most `MAX_CACHE_SIZE`).
fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Python's `repr()` of a `bytes` value: `b'...'`, or `b"..."` when it holds a
/// `'` and no `"`; `\\`, the quote, `\t`, `\n`, `\r` escaped, other bytes
/// outside ' '..'~' as `\xNN`.
pub fn bytes_repr(data: &[u8]) -> String {
    let quote = if data.contains(&b'\'') && !data.contains(&b'"') { b'"' } else { b'\'' };
    let mut out = String::with_capacity(data.len() + 3);
    out.push('b');
    out.push(quote as char);
    for &byte in data {
        match byte {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b if b == quote => {
                out.push('\\');
                out.push(b as char);
            }
            b if !(0x20..0x7f).contains(&b) => out.push_str(&format!("\\x{:02x}", b)),
            b => out.push(b as char),
        }
    }
    out.push(quote as char);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    //! The golden cases of `tests/fixtures/ldcache/cases.txt` (written by the
    //! Python code: `tests/unit/engine/test_ldcache_rust_fixtures.py`), and the
    //! edges beyond them.

    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::time::Duration;

    pub(crate) fn fixture_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ldcache")
    }

    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let path = fixture_dir().join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {}", path.display(), e))
    }

    /// One `case` block of the manifest.
    pub(crate) struct Case {
        pub name: String,
        pub input: Option<String>,
        pub pad: usize,
        pub deadline_passed: bool,
        pub ours: String,
        /// The `parse` line and the dump lines after it.
        pub parse: Vec<String>,
        pub merge: String,
    }

    impl Case {
        /// The input's bytes, padded; `None`: no cache in the image.
        pub fn data(&self) -> Option<Vec<u8>> {
            let mut data = fixture(self.input.as_deref()?);
            if self.pad > 0 {
                data.resize(self.pad, 0);
            }
            Some(data)
        }

        pub fn deadline(&self) -> Option<Instant> {
            if self.deadline_passed {
                Some(passed())
            } else {
                None
            }
        }
    }

    pub(crate) struct Manifest {
        pub ours: HashMap<String, Vec<LdCacheEntry>>,
        pub cases: Vec<Case>,
    }

    pub(crate) fn manifest() -> Manifest {
        let text = String::from_utf8(fixture("cases.txt")).expect("cases.txt is UTF-8");
        let mut manifest = Manifest { ours: HashMap::new(), cases: Vec::new() };
        let mut lines = text.lines();
        while let Some(line) = lines.next() {
            if let Some(name) = line.strip_prefix("ours ") {
                let block = lines.by_ref().take_while(|l| *l != "end").map(parse_entry).collect();
                manifest.ours.insert(name.to_string(), block);
            } else if let Some(name) = line.strip_prefix("case ") {
                let mut case = Case {
                    name: name.to_string(),
                    input: None,
                    pad: 0,
                    deadline_passed: false,
                    ours: String::new(),
                    parse: Vec::new(),
                    merge: String::new(),
                };
                for line in lines.by_ref().take_while(|l| *l != "end") {
                    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
                    match word {
                        "input" if rest != "-" => case.input = Some(rest.to_string()),
                        "input" => {}
                        "pad" => case.pad = rest.parse().unwrap(),
                        "deadline" => case.deadline_passed = rest == "passed",
                        "ours" => case.ours = rest.to_string(),
                        "parse" | "hwcaps" | "entry" => case.parse.push(line.to_string()),
                        "merge" => case.merge = rest.to_string(),
                        _ => panic!("cases.txt: unknown line {:?}", line),
                    }
                }
                manifest.cases.push(case);
            }
        }
        assert!(manifest.cases.len() > 40, "cases.txt holds {} cases", manifest.cases.len());
        manifest
    }

    fn parse_entry(line: &str) -> LdCacheEntry {
        let words = line.split(' ').collect::<Vec<&str>>();
        assert_eq!(words.len(), 7, "{:?}", line);
        LdCacheEntry {
            name: String::from_utf8(unescape(words[5])).unwrap(),
            path: String::from_utf8(unescape(words[6])).unwrap(),
            flags: words[1].parse().unwrap(),
            is_64bit: words[2] == "1",
            hwcap: words[3].parse().unwrap(),
            osversion: words[4].parse().unwrap(),
        }
    }

    pub(crate) fn escape(raw: &[u8]) -> String {
        if raw.is_empty() {
            return "%".to_string();
        }
        raw.iter()
            .map(
                |&b| {
                    if (0x21..=0x7e).contains(&b) && b != b'%' {
                        (b as char).to_string()
                    } else {
                        format!("%{:02X}", b)
                    }
                },
            )
            .collect()
    }

    fn unescape(word: &str) -> Vec<u8> {
        if word == "%" {
            return Vec::new(); // the empty string
        }
        let bytes = word.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                out.push(u8::from_str_radix(&word[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        out
    }

    pub(crate) fn fnv(data: &[u8]) -> String {
        let mut value: u64 = 0xCBF2_9CE4_8422_2325;
        for &byte in data {
            value = (value ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3);
        }
        format!("{:016x}", value)
    }

    /// An instant already past.
    pub(crate) fn passed() -> Instant {
        match Instant::now().checked_sub(Duration::from_secs(1)) {
            Some(at) => at,
            None => {
                let at = Instant::now();
                std::thread::sleep(Duration::from_millis(2));
                at
            }
        }
    }

    /// `read_ld_so_cache`'s answer in the manifest's words.
    fn parse_lines(data: Option<&[u8]>, deadline: Option<Instant>) -> Vec<String> {
        let data = match data {
            Some(data) => data,
            None => return vec!["parse absent".to_string()],
        };
        let cache = match read_ld_so_cache(data, deadline) {
            Ok(cache) => cache,
            Err(CacheError::Limit(m)) => return vec![format!("parse limit {}", m)],
            Err(CacheError::Garbled(m)) => return vec![format!("parse garbled {}", m)],
        };
        let mut lines = cache.hwcaps.iter().map(|n| format!("hwcaps {}", escape(n.as_bytes()))).collect::<Vec<_>>();
        lines.extend(cache.entries.iter().map(|e| {
            format!(
                "entry {} {} {} {} {} {}",
                e.flags,
                e.is_64bit as u8,
                e.hwcap,
                e.osversion,
                escape(e.name.as_bytes()),
                escape(e.path.as_bytes())
            )
        }));
        let text = lines.iter().map(|l| format!("{}\n", l)).collect::<String>();
        let head = format!("parse ok {} {} {}", cache.entries.len(), cache.hwcaps.len(), fnv(text.as_bytes()));
        if text.len() <= 4096 {
            lines.insert(0, head);
            lines
        } else {
            vec![head]
        }
    }

    #[test]
    fn every_golden_case_reads_as_python_reads_it() {
        for case in manifest().cases {
            let data = case.data();
            assert_eq!(parse_lines(data.as_deref(), case.deadline()), case.parse, "case {}", case.name);
        }
    }

    // ----------------------------------------------------------------------- edges

    fn entry(name: &str, path: &str, flags: i32, hwcap: u64, osversion: u32) -> LdCacheEntry {
        LdCacheEntry {
            name: name.to_string(),
            path: path.to_string(),
            flags,
            is_64bit: is_64bit_flags(flags),
            hwcap,
            osversion,
        }
    }

    fn driver() -> Vec<LdCacheEntry> {
        manifest().ours.remove("driver").unwrap()
    }

    /// Small pseudo-random numbers, the same at every run.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }

    #[test]
    fn libcmp_is_glibcs() {
        let cases: [(&str, &str, i32); 7] = [
            ("libz.so.1", "libz.so.1", 0),
            ("libc.so.10", "libc.so.9", 1),      // digit runs are numbers
            ("libc.so.010", "libc.so.10", 0),    // leading zeros do not count
            ("libfoo2.so", "libfooa.so", 1),     // a digit sorts after any other character
            ("liba.so", "liba.so.1", -1),        // a prefix first
            ("libé.so", "libz.so", -1),          // bytes >= 0x80 are negative (x86's signed char)
            ("lib3000000000.so", "lib1.so", -1), // C's int wraps: 3000000000 becomes negative
        ];
        for (left, right, sign) in cases {
            assert_eq!(libcmp(left.as_bytes(), right.as_bytes()).signum(), sign, "{} {}", left, right);
            assert_eq!(libcmp(right.as_bytes(), left.as_bytes()).signum(), -sign, "{} {}", right, left);
        }
        assert_eq!(libcmp(b"a\0b", b"a\0c"), 0); // a C string ends at its NUL
        assert!(libcmp(b"lib99999999999999999999.so", b"lib1.so") != 0); // wraps, never panics
    }

    #[test]
    fn bytes_repr_is_pythons() {
        assert_eq!(bytes_repr(b""), "b''");
        assert_eq!(bytes_repr(b"ld.so-1.7.0"), "b'ld.so-1.7.0'");
        assert_eq!(bytes_repr(b"it's"), "b\"it's\"");
        assert_eq!(bytes_repr(b"'\""), "b'\\'\"'");
        assert_eq!(bytes_repr(b"\0\x7f\xff\t\\"), "b'\\x00\\x7f\\xff\\t\\\\'");
    }

    #[test]
    fn over_the_size_limit_is_a_limit() {
        let data = vec![0u8; MAX_CACHE_SIZE + 1];
        let err = read_ld_so_cache(&data, None).unwrap_err();
        assert_eq!(err, CacheError::Limit("ld.so.cache of 8388609 bytes: over the limit of 8388608 bytes".into()));
    }

    fn header(nlibs: u32, len_strings: u32) -> Vec<u8> {
        let mut data = b"glibc-ld.so.cache1.1".to_vec();
        data.extend_from_slice(&nlibs.to_le_bytes());
        data.extend_from_slice(&len_strings.to_le_bytes());
        data.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
        data.resize(48, 0);
        data
    }

    #[test]
    fn the_entry_limit_is_checked_before_anything_is_unpacked() {
        let mut data = header(MAX_ENTRIES as u32 + 1, 0);
        data.resize(48 + 24 * (MAX_ENTRIES as usize + 1), 0);
        let err = read_ld_so_cache(&data, None).unwrap_err();
        assert!(matches!(err, CacheError::Limit(_)), "{:?}", err);
        // At the limit itself: read (and garbled, its offsets being 0).
        let mut data = header(MAX_ENTRIES as u32, 1);
        data.resize(48 + 24 * MAX_ENTRIES as usize, 0);
        data.push(0);
        let err = read_ld_so_cache(&data, None).unwrap_err();
        assert_eq!(
            err,
            CacheError::Garbled(
                "ld.so.cache entry 0: key offset 0 (file offset 0) is outside the string table [1572912, 1572913)"
                    .into()
            )
        );
    }

    #[test]
    fn a_passed_deadline_is_a_limit_at_each_step() {
        let real = fixture("real-new.cache");
        let err = read_ld_so_cache(&real, Some(passed())).unwrap_err();
        assert_eq!(
            err,
            CacheError::Limit("ld.so.cache: reading the strings did not finish before the deadline".into())
        );
        let image = read_ld_so_cache(&real, None).unwrap();
        let err = merge(&image, &driver(), Some(passed())).unwrap_err();
        assert_eq!(err, CacheError::Limit("ld.so.cache: the merge did not finish before the deadline".into()));
        assert!(merge(&image, &[], Some(passed())).is_ok()); // nothing to insert: nothing to wait for
        let err = encode(&image, GENERATOR, Some(passed())).unwrap_err();
        assert_eq!(err.message(), "ld.so.cache: writing the merged cache did not finish before the deadline");
        assert!(encode(&LdCache::default(), GENERATOR, Some(passed())).is_ok());
        let later = Instant::now() + Duration::from_secs(3600);
        assert!(read_ld_so_cache(&real, Some(later)).is_ok());
    }

    #[test]
    fn merging_the_same_entries_again_gives_the_same_bytes() {
        let ours = driver();
        let mut inputs = vec![Vec::new()];
        for case in manifest().cases {
            if let (Some(data), false) = (case.data(), case.deadline_passed) {
                if data.len() < 1 << 20 {
                    inputs.push(data);
                }
            }
        }
        for data in inputs {
            let image = read_ld_so_cache(&data, None).unwrap_or_default();
            let once = encode(&merge(&image, &ours, None).unwrap(), GENERATOR, None).unwrap();
            let reread = read_ld_so_cache(&once, None).unwrap();
            let twice = encode(&merge(&reread, &ours, None).unwrap(), GENERATOR, None).unwrap();
            assert!(once == twice, "not idempotent for an input of {} bytes", data.len());
            let same = encode(&reread, GENERATOR, None).unwrap();
            assert!(same == once, "re-encoding changed a cache of {} bytes", once.len());
        }
    }

    #[test]
    fn a_merge_into_a_sorted_cache_stays_sorted() {
        for name in ["real-new.cache", "host-debian12.cache", "real-new-hwcaps.cache", "hwcaps.cache"] {
            let image = read_ld_so_cache(&fixture(name), None).unwrap();
            let merged = merge(&image, &driver(), None).unwrap();
            for pair in merged.entries.windows(2) {
                assert!(compare(&pair[0], &pair[1]) <= 0, "{}: {:?} before {:?}", name, pair[0], pair[1]);
            }
            assert_eq!(merged.hwcaps, image.hwcaps);
        }
    }

    /// Python's `list.insert(bisect_left(...))`, one entry after the other, on
    /// the list as it is, sorted or not: what `Interleaved` must give.
    fn naive_merge(image: &[CacheEntry], ours: &[CacheEntry]) -> Vec<CacheEntry> {
        let mut list = image.to_vec();
        for entry in ours {
            let (mut lo, mut hi) = (0, list.len());
            while lo < hi {
                let mid = (lo + hi) / 2;
                if compare(&list[mid], entry) < 0 {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            list.insert(lo, entry.clone());
        }
        list
    }

    #[test]
    fn the_interleaved_list_inserts_as_python_lists_do() {
        let names = ["liba.so.1", "libb.so.2", "libc.so.10", "libc.so.9", "libz.so", "libé.so"];
        let mut rng = Lcg(7);
        for round in 0..200 {
            let mut pick = |n: usize| -> Vec<LdCacheEntry> {
                (0..n)
                    .map(|i| {
                        let name = names[rng.next() as usize % names.len()];
                        let flags = [0x0303, 0x0003, 0x0A03][rng.next() as usize % 3];
                        let hwcap = [0, 1, 3, HWCAP_EXTENSION][rng.next() as usize % 4];
                        entry(name, &format!("/p/{}/{}", i, name), flags, hwcap, rng.next() as u32 % 3)
                    })
                    .collect()
            };
            let image = pick(round % 23);
            let ours = pick(round % 7 + 1);
            let mut cache = LdCache {
                entries: image.iter().map(CacheEntry::from_model).collect(),
                hwcaps: vec![Text::new(b"x86-64-v3")],
            };
            if round % 2 == 0 {
                cache.entries.sort_by(|a, b| compare(a, b).cmp(&0));
            }
            let merged = merge(&cache, &ours, None).unwrap();
            let ours = ours.iter().map(CacheEntry::from_model).collect::<Vec<_>>();
            let kept = cache
                .entries
                .iter()
                .filter(|e| !ours.iter().any(|o| o.name == e.name && o.path == e.path))
                .cloned()
                .collect::<Vec<_>>();
            assert_eq!(merged.entries, naive_merge(&kept, &ours), "round {}", round);
        }
    }

    #[test]
    fn no_input_makes_the_reader_panic() {
        let mut seeds = Vec::new();
        for name in ["real-new.cache", "real-old.cache", "real-compat.cache", "real-new-hwcaps.cache", "hwcaps.cache"] {
            seeds.push(fixture(name));
        }
        for seed in &seeds {
            for cut in 0..seed.len() {
                let _ = read_ld_so_cache(&seed[..cut], None);
            }
        }
        let mut rng = Lcg(42);
        for round in 0..20000 {
            let mut data = seeds[round % seeds.len()].clone();
            for _ in 0..1 + rng.next() % 4 {
                let at = rng.next() as usize % data.len();
                data[at] = match rng.next() % 4 {
                    0 => 0,
                    1 => 0xff,
                    _ => rng.next() as u8,
                };
            }
            if let Ok(cache) = read_ld_so_cache(&data, None) {
                let merged = merge(&cache, &[entry("libcuda.so.1", "/x/libcuda.so.1", 0x0303, 0, 0)], None).unwrap();
                let bytes = encode(&merged, GENERATOR, None).unwrap();
                assert_eq!(read_ld_so_cache(&bytes, None).unwrap().entries.len(), merged.entries.len());
            }
        }
    }

    #[test]
    fn what_encode_writes_reads_back_the_same() {
        for name in ["real-new.cache", "real-old.cache", "real-new-hwcaps.cache", "hwcaps.cache", "hand-new.cache"] {
            let cache = read_ld_so_cache(&fixture(name), None).unwrap();
            let data = encode(&cache, GENERATOR, None).unwrap();
            assert_eq!(read_ld_so_cache(&data, None).unwrap(), cache, "{}", name);
            assert!(data.ends_with(GENERATOR.as_bytes()));
        }
        assert!(encode(&LdCache::default(), GENERATOR, None).unwrap().starts_with(b"glibc-ld.so.cache1.1\0\0\0\0"));
    }

    #[test]
    fn strings_are_shared_not_copied() {
        // 60000 entries naming one 4000-byte path: one copy of the file, not 240 MB.
        let path_at = 48 + 24 * 60000u32;
        let mut data = header(60000, 4001);
        for _ in 0..60000 {
            for word in [0x0303u32, path_at + 3999, path_at, 0, 0, 0] {
                data.extend_from_slice(&word.to_le_bytes());
            }
        }
        data.extend(std::iter::repeat(b'a').take(4000));
        data.push(0);
        let cache = read_ld_so_cache(&data, None).unwrap();
        assert_eq!(cache.entries.len(), 60000);
        assert_eq!(cache.entries[0].path.as_bytes().len(), 4000);
        assert!(Rc::ptr_eq(&cache.entries[0].path.buf, &cache.entries[59999].name.buf));
    }
}
