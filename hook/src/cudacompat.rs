//! CUDA forward compatibility: whether a container's loader takes the image's
//! `/usr/local/cuda/compat` libraries over the driver's
//! (`engine/cudacompat.py`; pure).
//!
//! A CUDA image newer than the node's driver may ship NVIDIA's `cuda-compat`
//! package: a newer `libcuda.so.<version>` (and the libraries it loads) in
//! `/usr/local/cuda/compat`. The toolkit's `enable-cuda-compat` hook puts that
//! folder first in the loader's search when it is newer than the driver; this
//! module makes the same decision from plain values (`compat` reads them):
//!
//! 1. `candidate`: the folder's entries named like `libcuda.so.*.*` (the
//!    toolkit's glob). None: nothing to do. Two or more: the driver's libraries
//!    win (which one would the image mean?).
//! 2. `parse_note`: the candidate's ELF section `.note.cuda.fwd_compatibility`
//!    (a note owned by `NVIDIA Corporation` whose description is JSON:
//!    `{"Format": 1, "CUDA Version": "13.0", "Driver": [535, 550, 570], ...}`).
//! 3. `decide`: with a note, compat is used when the host driver's major is in
//!    its `Driver` list *and* the compat driver version (from the file name) is
//!    newer than the host's; without one, when the compat major is greater than
//!    the host's (the toolkit's older rule). Versions compare numerically, field
//!    by field (the toolkit compares majors as strings: `"1000" < "555"`).
//!
//! `library_key` says under which name glibc's `ldconfig` lists a library of
//! the folder, so a merged cache lists what a rebuild would.
//!
//! The reasons are word for word Python's, but for the words of a note's JSON
//! error, which are `json`'s (the shape of Python's: "Expecting value: line 1
//! column 1 (char 0)"), and the few notes `json` reads otherwise than Python's
//! (a lone surrogate, a leading BOM, NaN and Infinity, an integer beyond i64:
//! see its doc).

use crate::bytes::py_slice;
use crate::error::{cut, py_repr};
use crate::json::{self, Value};

pub const COMPAT_DIR: &str = "/usr/local/cuda/compat";
pub const NOTE_SECTION: &str = ".note.cuda.fwd_compatibility";
pub const NOTE_OWNER: &str = "NVIDIA Corporation";
/// A cuda-compat folder holds about a dozen; more is refused, not listed at length.
pub const MAX_ENTRIES: usize = 256;
const PREFIX: &str = "libcuda.so.";
const MAX_NOTE_DRIVERS: usize = 64;
/// How deep a note's JSON may nest: about where Python's `json` meets its
/// recursion limit (a 4 KiB note could nest 2048 deep).
const NOTE_DEPTH: usize = 1000;

/// The parts of `.note.cuda.fwd_compatibility` the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub cuda_version: String,
    /// Driver branches in decimal, as the reasons list them.
    pub drivers: Vec<String>,
}

/// `use`: the compat folder goes first; `reason`: one line for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub r#use: bool,
    pub reason: String,
    /// `libcuda.so.555.58.02`, when there was one candidate; "" otherwise.
    pub library: String,
}

impl Decision {
    pub fn new<S: Into<String>, L: Into<String>>(r#use: bool, reason: S, library: L) -> Decision {
        Decision { r#use, reason: reason.into(), library: library.into() }
    }
}

/// `"555.58.02"` -> [555, 58, 2]; None unless dot-separated decimal fields
/// (at most 32 characters, so every field fits a u128).
pub fn version_fields(text: &str) -> Option<Vec<u128>> {
    if text.is_empty() || text.chars().count() > 32 {
        return None;
    }
    let mut fields = Vec::new();
    for part in text.split('.') {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        fields.push(part.parse::<u128>().ok()?);
    }
    Some(fields)
}

/// What a compat folder holds of `libcuda.so.*.*` files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// None at all: nothing to say.
    None,
    One(String),
    /// Two or more: why none is used.
    Many(String),
}

/// The one `libcuda.so.*.*` among `names` (the folder's entries), or why not.
pub fn candidate<S: AsRef<str>>(names: &[S]) -> Candidate {
    let mut found: Vec<&str> = names
        .iter()
        .map(|n| n.as_ref())
        .filter(|n| n.strip_prefix(PREFIX).map_or(false, |rest| rest.contains('.')))
        .collect();
    found.sort_unstable();
    match found.as_slice() {
        [] => Candidate::None,
        [one] => Candidate::One(one.to_string()),
        _ => {
            let n = found.len();
            let shown = found.iter().take(4).copied().collect::<Vec<_>>().join(", ");
            let more = if n > 4 { ", ..." } else { "" };
            Candidate::Many(format!(
                "{} candidates in {} ({}{}): the driver's libraries are used",
                n, COMPAT_DIR, shown, more
            ))
        }
    }
}

/// The note held by the section's bytes (`align`: its `sh_addralign`), as the
/// toolkit reads it: None when it is empty or not NVIDIA's. An error (Python's
/// `ValueError` text, but for a JSON error's own words) for a note of NVIDIA's
/// whose JSON is not what it must be.
pub fn parse_note(section: &[u8], little_endian: bool, align: u64) -> Result<Option<Note>, String> {
    let word = |at: usize| -> u128 {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(section.get(at..at + 4).unwrap_or(&[0; 4]));
        u128::from(if little_endian { u32::from_le_bytes(bytes) } else { u32::from_be_bytes(bytes) })
    };
    if section.len() < 12 {
        return Ok(None);
    }
    let (namesz, descsz) = (word(0), word(4));
    if namesz == 0 || descsz == 0 {
        return Ok(None);
    }
    let align = u128::from(align.max(1));
    let name_end = 12 + (namesz + align - 1) / align * align; // below 2^66: no overflow
    if strip_nul(py_slice(section, 12u8, name_end)) != NOTE_OWNER.as_bytes() {
        return Ok(None);
    }
    let desc = strip_nul(py_slice(section, name_end, name_end + descsz));
    let data = json::parse(desc, NOTE_DEPTH).map_err(|e| format!("{}: not JSON ({})", NOTE_SECTION, e))?;
    if data.as_object().is_none() {
        return Err(format!("{}: not a JSON object", NOTE_SECTION));
    }
    let unexpected = || format!("{}: unexpected 'CUDA Version' or 'Driver'", NOTE_SECTION);
    let cuda = match data.get("CUDA Version") {
        None => "",
        Some(Value::Str(cuda)) => cuda,
        Some(_) => return Err(unexpected()),
    };
    let drivers = match data.get("Driver") {
        None => &[][..],
        Some(Value::Array(drivers)) if drivers.len() <= MAX_NOTE_DRIVERS => drivers,
        Some(_) => return Err(unexpected()),
    };
    let mut branches = Vec::new();
    for driver in drivers {
        match driver {
            Value::Int(branch) => branches.push(branch.to_string()),
            _ => return Err(format!("{}: 'Driver' must list driver branches as numbers", NOTE_SECTION)),
        }
    }
    Ok(Some(Note { cuda_version: cut(cuda, 32).to_string(), drivers: branches }))
}

/// Python's `raw.strip(b"\0")`.
fn strip_nul(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|&b| b != 0).unwrap_or(raw.len());
    let end = raw.iter().rposition(|&b| b != 0).map_or(start, |at| at + 1);
    raw.get(start..end.max(start)).unwrap_or(&[])
}

/// Whether `library` (the one candidate's name) is used over the host driver
/// `host_version`, given its note (None: it has none).
pub fn decide(library: &str, note: Option<&Note>, host_version: &str) -> Decision {
    let version: String = library.chars().skip(PREFIX.len()).collect();
    let place = format!("{} in {}", library, COMPAT_DIR);
    let used = |reason: String| Decision::new(true, reason, library);
    let unused = |reason: String| Decision::new(false, reason, library);
    let (mine, host) = match (version_fields(&version), version_fields(host_version)) {
        (None, _) => {
            return unused(format!(
                "{}: {} is not a driver version: the driver's libraries are used",
                place,
                py_repr(&version)
            ))
        }
        (_, None) => {
            return unused(format!(
                "{}: the host driver's version {} is unknown: not used",
                place,
                py_repr(host_version)
            ))
        }
        (Some(mine), Some(host)) => (mine, host),
    };
    // version_fields gives one field at least.
    let (my_major, host_major) = (mine.first().copied().unwrap_or(0), host.first().copied().unwrap_or(0));
    let note = match note {
        None if my_major > host_major => {
            return used(format!(
                "{} is used over the driver {} (no forward-compatibility note: its major is greater)",
                place, host_version
            ))
        }
        None => {
            return unused(format!(
                "{} is not newer than the driver {} (no forward-compatibility note: its major must be greater): \
                 the driver's libraries are used",
                place, host_version
            ))
        }
        Some(note) => note,
    };
    let listed = note.drivers.iter().take(16).cloned().collect::<Vec<_>>().join(",");
    let branches = if listed.is_empty() { "none".to_string() } else { listed };
    let cuda = if note.cuda_version.is_empty() { "?" } else { &note.cuda_version };
    if !note.drivers.iter().any(|d| *d == host_major.to_string()) {
        return unused(format!(
            "{} (CUDA {}) does not support the driver branch {} (its note lists {}): the driver's libraries are used",
            place, cuda, host_major, branches
        ));
    }
    if mine <= host {
        return unused(format!(
            "{} is not newer than the driver {}: the driver's libraries are used",
            place, host_version
        ));
    }
    used(format!(
        "{} (CUDA {}, for driver branches {}) is used over the driver {}",
        place, cuda, branches, host_version
    ))
}

/// Whether `ldconfig` looks at the folder entry `name` at all: `lib*` or `ld-*`
/// with `.so` in it (glibc's `elf/ldconfig.c`, `search_dir`).
pub fn looks_like_library(name: &str) -> bool {
    (name.starts_with("lib") || name.starts_with("ld-")) && name.contains(".so")
}

/// The cache name `ldconfig` gives the folder entry `name`, a library whose
/// `DT_SONAME` is `soname`: the soname (the entry's own name without one),
/// except for a link named like the library's `.so` for `ld(1)`
/// (`libcuda.so -> libcuda.so.1`), listed under its own name.
pub fn library_key(name: &str, soname: Option<&str>, is_link: bool) -> String {
    let soname = match soname {
        Some(soname) if !soname.is_empty() => soname,
        _ => return name.to_string(),
    };
    if is_link && (name == soname || (name.ends_with(".so") && soname.starts_with(name))) {
        return name.to_string();
    }
    soname.to_string()
}

/// The golden fixtures shared with the Python tests
/// (`hook/tests/fixtures/compat/expected.json`, written by
/// `tests/unit/engine/test_compat_rust_fixtures.py`), read as values to compare.
#[cfg(test)]
pub(crate) mod fixture {
    use crate::json::Value;

    pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/compat");
    /// An integer beyond i64, kept exact as a string after this prefix (`json`
    /// would read it as a float).
    const BIG: &str = "big integer ";

    pub fn load() -> Value {
        parse(&std::fs::read_to_string(format!("{}/expected.json", DIR)).expect("expected.json"))
    }

    /// A fixture file's JSON text, its integers beyond i64 kept (`int` reads them).
    pub fn parse(text: &str) -> Value {
        let mut quoted = String::with_capacity(text.len());
        let (mut in_string, mut escaped) = (false, false);
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            if in_string {
                in_string = escaped || c != '"';
                escaped = !escaped && c == '\\';
                quoted.push(c);
            } else if c == '-' || c.is_ascii_digit() {
                let mut end = at + 1;
                while let Some((next, d)) = chars.peek().copied() {
                    if !(d.is_ascii_digit() || matches!(d, '.' | 'e' | 'E' | '+' | '-')) {
                        break;
                    }
                    end = next + 1;
                    chars.next();
                }
                let number = &text[at..end];
                let integral = number.trim_start_matches('-').bytes().all(|b| b.is_ascii_digit());
                if integral && number.parse::<i64>().is_err() {
                    quoted.push_str(&format!("\"{}{}\"", BIG, number));
                } else {
                    quoted.push_str(number);
                }
            } else {
                in_string = c == '"';
                quoted.push(c);
            }
        }
        crate::json::parse(quoted.as_bytes(), 64).expect("a fixture is JSON")
    }

    pub fn file(name: &str) -> Vec<u8> {
        std::fs::read(format!("{}/{}", DIR, name)).expect(name)
    }

    pub fn get<'a>(value: &'a Value, key: &str) -> &'a Value {
        find(value, key).unwrap_or_else(|| panic!("no {:?} in {:?}", key, value))
    }

    pub fn find<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
        members(value).iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn members(value: &Value) -> &[(String, Value)] {
        match value {
            Value::Object(members) => members,
            _ => panic!("not an object: {:?}", value),
        }
    }

    pub fn list(value: &Value) -> &[Value] {
        match value {
            Value::Array(items) => items,
            _ => panic!("not a list: {:?}", value),
        }
    }

    pub fn text(value: &Value) -> &str {
        match value {
            Value::Str(text) => text,
            _ => panic!("not a string: {:?}", value),
        }
    }

    /// An integer's digits, however big.
    pub fn int(value: &Value) -> String {
        match value {
            Value::Int(number) => number.to_string(),
            Value::Str(text) if text.starts_with(BIG) => text[BIG.len()..].to_string(),
            _ => panic!("not an integer: {:?}", value),
        }
    }

    pub fn flag(value: &Value) -> bool {
        match value {
            Value::Bool(flag) => *flag,
            _ => panic!("not a bool: {:?}", value),
        }
    }

    pub fn hex(text: &str) -> Vec<u8> {
        (0..text.len() / 2).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex")).collect()
    }

    pub fn to_hex(data: &[u8]) -> String {
        data.iter().map(|b| format!("{:02x}", b)).collect()
    }

    pub fn string(text: &str) -> Value {
        Value::Str(text.to_string())
    }

    /// An integer as `parse` reads it.
    pub fn number<N: ToString>(n: N) -> Value {
        let digits = n.to_string();
        digits.parse().map(Value::Int).unwrap_or_else(|_| Value::Str(format!("{}{}", BIG, digits)))
    }

    pub fn object(members: Vec<(&str, Value)>) -> Value {
        Value::Object(members.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Python's `outcome`: `{"value": ...}` or `{"error": ...}`.
    pub fn outcome<E: ToString>(result: Result<Value, E>) -> Value {
        match result {
            Ok(value) => object(vec![("value", value)]),
            Err(err) => object(vec![("error", Value::Str(err.to_string()))]),
        }
    }

    /// Whether a reason agrees with Python's: the same text, or both saying a
    /// note is not JSON in the same sentence, the JSON error's own words aside.
    pub fn reasons_agree(got: &str, want: &str) -> bool {
        const NOT_JSON: &str = ".note.cuda.fwd_compatibility: not JSON (";
        let after = |rest: &str| rest.rsplit_once(')').map(|(_, after)| after.to_string());
        match (got.split_once(NOT_JSON), want.split_once(NOT_JSON)) {
            (Some((before, rest)), Some((want_before, want_rest))) => {
                before == want_before && after(rest) == after(want_rest)
            }
            _ => got == want,
        }
    }

    /// Objects with their members sorted by key (the file's order), to compare.
    pub fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(members) => {
                let mut members: Vec<(String, Value)> = members.iter().map(|(k, v)| (k.clone(), sorted(v))).collect();
                members.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Object(members)
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: [&str; 4] = ["libcuda.so", "libcuda.so.1", "libnvidia-nvvm.so.4", "libnvidia-ptxjitcompiler.so.1"];

    /// The note `tests/unit/engine/test_cudacompat.py` builds.
    fn note(drivers: &[i64], cuda: &str, owner: &[u8], align: usize) -> Vec<u8> {
        let list = drivers.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        let desc = format!("{{\"Format\": 1, \"CUDA Version\": \"{}\", \"Driver\": [{}], \"Device\": []}}", cuda, list);
        let mut name = owner.to_vec();
        name.push(0);
        let pad = (align - name.len() % align) % align;
        let mut out = Vec::new();
        for v in [name.len() as u32, desc.len() as u32, 1] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&name);
        out.extend(std::iter::repeat(0).take(pad));
        out.extend_from_slice(desc.as_bytes());
        out
    }

    fn nvidia(drivers: &[i64]) -> Vec<u8> {
        note(drivers, "13.0", b"NVIDIA Corporation", 4)
    }

    /// test_cudacompat.run: (use, reason).
    fn run(entries: &[&str], raw: Option<&[u8]>, host: &str, align: u64) -> (bool, String) {
        let name = match candidate(entries) {
            Candidate::One(name) => name,
            Candidate::None => return (false, String::new()),
            Candidate::Many(why) => return (false, why),
        };
        let parsed = match raw.map(|raw| parse_note(raw, true, align)) {
            None => None,
            Some(Ok(parsed)) => parsed,
            Some(Err(e)) => return (false, format!("{}: {}", name, e)),
        };
        let decision = decide(&name, parsed.as_ref(), host);
        (decision.r#use, decision.reason)
    }

    fn with_layout(last: &str) -> Vec<&str> {
        let mut all = LAYOUT.to_vec();
        all.push(last);
        all
    }

    #[test]
    fn the_golden_cases_of_test_cudacompat() {
        let host = "550.163.01";
        let golden = fixture::load();
        let golden = fixture::get(fixture::get(&golden, "decisions"), "cases");
        let mut not_json = nvidia(&[550]);
        let cut_at = not_json.len() - 3;
        not_json.truncate(cut_at);
        not_json.extend_from_slice(b"}}}");
        let cases: Vec<(&str, (bool, String))> = vec![
            ("newer-major-no-note", run(&with_layout("libcuda.so.555.58.02"), None, host, 4)),
            ("same-major-newer-minor-no-note", run(&with_layout("libcuda.so.550.200.01"), None, host, 4)),
            ("older-no-note", run(&with_layout("libcuda.so.535.183.06"), None, host, 4)),
            ("equal-no-note", run(&with_layout("libcuda.so.550.163.01"), None, host, 4)),
            ("note-lists-branch", run(&with_layout("libcuda.so.580.65.06"), Some(&nvidia(&[535, 550, 570])), host, 4)),
            ("note-excludes-branch", run(&with_layout("libcuda.so.580.65.06"), Some(&nvidia(&[535, 570])), host, 4)),
            ("note-lists-branch-but-older", run(&with_layout("libcuda.so.550.54.15"), Some(&nvidia(&[550])), host, 4)),
            (
                "note-8-aligned",
                run(
                    &with_layout("libcuda.so.580.65.06"),
                    Some(&note(&[550], "13.0", b"NVIDIA Corporation", 8)),
                    host,
                    8,
                ),
            ),
            (
                "note-of-another-owner",
                run(&with_layout("libcuda.so.580.65.06"), Some(&note(&[], "13.0", b"Someone Else", 4)), host, 4),
            ),
            ("note-not-json", run(&with_layout("libcuda.so.580.65.06"), Some(&not_json), host, 4)),
            ("two-candidates", run(&["libcuda.so.555.58.02", "libcuda.so.560.35.03"], None, host, 4)),
            ("no-candidate", run(&["libcuda.so.1", "libcuda.so"], None, host, 4)),
            ("not-a-version", run(&["libcuda.so.999.x"], None, host, 4)),
            ("major-1000-beats-555", run(&["libcuda.so.1000.1.1"], None, "555.58.02", 4)),
            ("unknown-host-driver", run(&["libcuda.so.555.58.02"], None, "", 4)),
        ];
        let expected_use =
            [true, false, false, false, true, false, false, true, true, false, false, false, false, true, false];
        assert_eq!(fixture::members(golden).len(), cases.len());
        for ((case, (r#use, reason)), want_use) in cases.iter().zip(expected_use) {
            assert_eq!(*r#use, want_use, "{}", case);
            let want = fixture::get(fixture::get(golden, case), "result");
            assert_eq!(fixture::flag(fixture::get(want, "use")), *r#use, "{}", case);
            assert_eq!(fixture::text(fixture::get(want, "reason")), reason, "{}", case);
        }
    }

    #[test]
    fn a_note_with_sizes_past_its_section_is_read_as_far_as_it_goes() {
        let raw = nvidia(&[550]);
        let err = parse_note(&raw[..raw.len() - 10], true, 4).unwrap_err();
        assert!(err.contains("not JSON"), "{}", err);
    }

    #[test]
    fn a_note_listing_a_huge_driver_array_is_refused() {
        let drivers: Vec<i64> = (0..1000).collect();
        let err = parse_note(&nvidia(&drivers), true, 4).unwrap_err();
        assert!(err.contains("unexpected"), "{}", err);
    }

    #[test]
    fn library_keys_are_ldconfigs() {
        let cases = [
            ("libcuda.so.555.58.02", Some("libcuda.so.1"), false, "libcuda.so.1"),
            ("libcuda.so.1", Some("libcuda.so.1"), true, "libcuda.so.1"),
            ("libcuda.so", Some("libcuda.so.1"), true, "libcuda.so"),
            ("libnvidia-gpucomp.so.555.58.02", None, false, "libnvidia-gpucomp.so.555.58.02"),
            ("libcuda-other.so", Some("libcuda.so.1"), true, "libcuda.so.1"),
        ];
        for (name, soname, is_link, key) in cases {
            assert_eq!(library_key(name, soname, is_link), key, "{}", name);
        }
    }

    #[test]
    fn version_fields_are_numbers() {
        assert_eq!(version_fields("550.163.01"), Some(vec![550, 163, 1]));
        assert_eq!(version_fields("12.x"), None);
        assert_eq!(version_fields(""), None);
        assert_eq!(version_fields("1..2"), None);
        assert_eq!(version_fields("+1"), None);
        assert_eq!(version_fields(&"9".repeat(32)), Some(vec![99999999999999999999999999999999]));
        assert_eq!(version_fields(&"9".repeat(33)), None);
    }

    #[test]
    fn the_doc_examples() {
        assert_eq!(
            candidate(&["libcuda.so.1", "libcuda.so.555.58.02"]),
            Candidate::One("libcuda.so.555.58.02".to_string())
        );
        assert_eq!(candidate(&["libcuda.so.1"]), Candidate::None);
        assert!(decide("libcuda.so.555.58.02", None, "550.163.01").r#use);
        assert_eq!(
            decide("libcuda.so.550.54.15", None, "550.163.01").reason,
            "libcuda.so.550.54.15 in /usr/local/cuda/compat is not newer than the driver 550.163.01 (no \
             forward-compatibility note: its major must be greater): the driver's libraries are used"
        );
        let desc = br#"{"CUDA Version": "12.5", "Driver": [535, 550]}"#;
        let mut raw = Vec::new();
        for v in [19u32, desc.len() as u32, 1] {
            raw.extend_from_slice(&v.to_le_bytes());
        }
        raw.extend_from_slice(b"NVIDIA Corporation\0\0");
        raw.extend_from_slice(desc);
        let want = Note { cuda_version: "12.5".to_string(), drivers: vec!["535".to_string(), "550".to_string()] };
        assert_eq!(parse_note(&raw, true, 4), Ok(Some(want)));
    }

    #[test]
    fn five_candidates_are_shown_as_four() {
        let names = ["libcuda.so.5.1", "libcuda.so.4.1", "libcuda.so.3.1", "libcuda.so.2.1", "libcuda.so.1.1"];
        assert_eq!(
            candidate(&names),
            Candidate::Many(
                "5 candidates in /usr/local/cuda/compat (libcuda.so.1.1, libcuda.so.2.1, libcuda.so.3.1, \
                 libcuda.so.4.1, ...): the driver's libraries are used"
                    .to_string()
            )
        );
    }

    // ------------------------------------------------------------ the fixtures shared with Python

    use super::fixture::{self, find, flag, get, hex, int, list, members, number, text};

    /// The note a note case describes (test_compat_rust_fixtures.spec_section).
    fn spec_section(spec: &Value) -> Vec<u8> {
        if let Some(raw) = find(spec, "section") {
            return hex(text(raw));
        }
        let desc = match find(spec, "desc") {
            Some(desc) => text(desc).as_bytes().to_vec(),
            None => hex(text(get(spec, "desc_hex"))),
        };
        let mut name = find(spec, "owner").map_or("NVIDIA Corporation", text).as_bytes().to_vec();
        name.push(0);
        let pad: usize = find(spec, "pad").map_or(4, |p| int(p).parse().unwrap());
        let big = find(spec, "big_endian_sizes").map_or(false, flag);
        let descsz: u32 = find(spec, "descsz").map_or(desc.len() as u32, |d| int(d).parse().unwrap());
        let mut out = Vec::new();
        for v in [name.len() as u32, descsz, 1] {
            out.extend_from_slice(&if big { v.to_be_bytes() } else { v.to_le_bytes() });
        }
        out.extend_from_slice(&name);
        out.extend(std::iter::repeat(0).take((pad - name.len() % pad) % pad));
        out.extend_from_slice(&desc);
        out
    }

    /// The note cases `json` reads otherwise than Python's `json.loads` (each
    /// named, with why), where the outcome differs; any other difference fails.
    const KNOWN_DIFFERENCES: [(&str, &str); 6] = [
        ("json-002", "a Driver past i64: json reads a float, refused; Python keeps the integer"),
        ("json-011", "NaN and Infinity: not JSON for json; floats for Python, then refused as branches"),
        ("json-018", "a lone surrogate escape: refused by json (no Rust string holds one); Python keeps it"),
        ("json-019", "a lone surrogate escape before another escape: the same"),
        ("json-020", "a low surrogate escape before a high one: the same"),
        ("json-049", "a leading BOM: json skips it as json.loads(bytes) does; Python decodes first, then refuses it"),
    ];

    #[test]
    fn note_sections_read_as_python_reads_them() {
        let golden = fixture::load();
        let cases = list(get(&golden, "notes"));
        assert!(cases.len() > 150);
        let known: Vec<&str> = KNOWN_DIFFERENCES.iter().map(|(name, _)| *name).collect();
        assert_eq!(differing_note_cases(cases), known);
    }

    /// More note cases in the fixture's form, from a file (a differential run
    /// against Python: `NRI_GPU_NOTE_CASES=<file> cargo test -- --ignored`).
    #[test]
    #[ignore]
    fn note_cases_from_a_file() {
        let path = std::env::var("NRI_GPU_NOTE_CASES").expect("NRI_GPU_NOTE_CASES");
        let cases = fixture::parse(&std::fs::read_to_string(path).unwrap());
        assert_eq!(differing_note_cases(list(&cases)), Vec::<&str>::new());
        eprintln!("{} note cases agree", list(&cases).len());
    }

    /// The names of the cases whose outcome is not Python's: another note, an
    /// error where Python has none or the other way round, another error but
    /// for the words of a JSON error.
    fn differing_note_cases(cases: &[Value]) -> Vec<&str> {
        let mut differing = Vec::new();
        for case in cases {
            let name = text(get(case, "name"));
            let align: u64 = int(get(case, "align")).parse().unwrap();
            let got = parse_note(&spec_section(case), flag(get(case, "little_endian")), align);
            let agrees = match (&got, find(case, "error")) {
                (Err(err), Some(want)) => fixture::reasons_agree(err, text(want)),
                (Ok(None), None) => find(case, "note") == Some(&Value::Null),
                (Ok(Some(note)), None) => {
                    let drivers = Value::Array(note.drivers.iter().map(number).collect());
                    find(case, "cuda_version").map(text) == Some(note.cuda_version.as_str())
                        && find(case, "drivers") == Some(&drivers)
                }
                _ => false,
            };
            if !agrees {
                eprintln!("{}: {:?}, Python: {:?}", name, got, case);
                differing.push(name);
            }
        }
        differing
    }

    #[test]
    fn decisions_are_pythons() {
        let golden = fixture::load();
        let decisions = get(&golden, "decisions");
        for (case, record) in members(get(decisions, "cases")) {
            let entries: Vec<&str> = list(get(record, "entries")).iter().map(text).collect();
            let raw = match get(record, "note") {
                Value::Null => None,
                note => Some(hex(text(note))),
            };
            let align: u64 = int(get(record, "align")).parse().unwrap();
            let (r#use, reason) = run(&entries, raw.as_deref(), text(get(record, "host")), align);
            let want = get(record, "result");
            assert_eq!((r#use, reason.as_str()), (flag(get(want, "use")), text(get(want, "reason"))), "{}", case);
        }
        for record in list(get(decisions, "decide")) {
            let note = match get(record, "note") {
                Value::Null => None,
                note => Some(Note {
                    cuda_version: text(get(note, "cuda_version")).to_string(),
                    drivers: list(get(note, "drivers")).iter().map(|d| int(d).to_string()).collect(),
                }),
            };
            let library = text(get(record, "library"));
            let got = decide(library, note.as_ref(), text(get(record, "host")));
            let want = get(record, "result");
            let want = Decision::new(flag(get(want, "use")), text(get(want, "reason")), text(get(want, "library")));
            assert_eq!(got, want, "{}", library);
        }
        for record in list(get(decisions, "candidate")) {
            let names: Vec<&str> = list(get(record, "names")).iter().map(text).collect();
            let want = list(get(record, "result"));
            let want = match (&want[0], text(&want[1])) {
                (Value::Null, "") => Candidate::None,
                (Value::Null, why) => Candidate::Many(why.to_string()),
                (name, _) => Candidate::One(text(name).to_string()),
            };
            assert_eq!(candidate(&names), want, "{:?}", names);
        }
        for record in list(get(decisions, "version_fields")) {
            let got = version_fields(text(get(record, "text")));
            let want = match get(record, "result") {
                Value::Null => None,
                fields => Some(list(fields).iter().map(|f| int(f).parse::<u128>().unwrap()).collect::<Vec<_>>()),
            };
            assert_eq!(got, want, "{:?}", text(get(record, "text")));
        }
        for record in list(get(decisions, "library_key")) {
            let soname = match get(record, "soname") {
                Value::Null => None,
                soname => Some(text(soname)),
            };
            let got = library_key(text(get(record, "name")), soname, flag(get(record, "is_link")));
            assert_eq!(got, text(get(record, "result")));
        }
        for record in list(get(decisions, "looks_like_library")) {
            assert_eq!(looks_like_library(text(get(record, "name"))), flag(get(record, "result")));
        }
    }
}
