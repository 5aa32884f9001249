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
//! The reasons are log lines users read: word for word Python's, including the
//! text of Python's JSON and UTF-8 decoding errors (`pyjson` below).

use crate::error::{cut, py_repr};

pub const COMPAT_DIR: &str = "/usr/local/cuda/compat";
pub const NOTE_SECTION: &str = ".note.cuda.fwd_compatibility";
pub const NOTE_OWNER: &str = "NVIDIA Corporation";
/// A cuda-compat folder holds about a dozen; more is refused, not listed at length.
pub const MAX_ENTRIES: usize = 256;
const PREFIX: &str = "libcuda.so.";
const MAX_NOTE_DRIVERS: usize = 64;

/// The parts of `.note.cuda.fwd_compatibility` the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub cuda_version: String,
    /// Driver branches as Python's `str(int)` writes them (JSON integers have no bound).
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

/// The one `libcuda.so.*.*` among `names` (the folder's entries), or None and
/// why not ("" when there is none at all).
pub fn candidate<S: AsRef<str>>(names: &[S]) -> (Option<String>, String) {
    let mut found: Vec<&str> = names
        .iter()
        .map(|n| n.as_ref())
        .filter(|n| n.strip_prefix(PREFIX).map_or(false, |rest| rest.contains('.')))
        .collect();
    found.sort_unstable();
    match found.len() {
        0 => (None, String::new()),
        1 => (found.first().map(|n| n.to_string()), String::new()),
        n => {
            let shown = found.iter().take(4).copied().collect::<Vec<_>>().join(", ");
            let more = if n > 4 { ", ..." } else { "" };
            let why =
                format!("{} candidates in {} ({}{}): the driver's libraries are used", n, COMPAT_DIR, shown, more);
            (None, why)
        }
    }
}

/// The note held by the section's bytes (`align`: its `sh_addralign`), as the
/// toolkit reads it: None when it is empty or not NVIDIA's. An error (Python's
/// `ValueError` text) for a note of NVIDIA's whose JSON is not what it must be.
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
    if strip_nul(py_slice(section, 12, name_end)) != NOTE_OWNER.as_bytes() {
        return Ok(None);
    }
    let desc = strip_nul(py_slice(section, name_end, name_end + descsz));
    let text = std::str::from_utf8(desc).map_err(|e| not_json(&utf8_error_text(desc, &e)))?;
    let data = pyjson::parse(text, 2).map_err(|e| not_json(&e.to_string()))?;
    let members = match data {
        pyjson::Value::Object(members) => members,
        _ => return Err(format!("{}: not a JSON object", NOTE_SECTION)),
    };
    let get = |key: &str| members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v); // the last one, as a dict
    let empty_list = pyjson::Value::Array(Vec::new());
    let empty_text = pyjson::Value::Str(String::new());
    let (cuda, drivers) = match (get("CUDA Version").unwrap_or(&empty_text), get("Driver").unwrap_or(&empty_list)) {
        (pyjson::Value::Str(cuda), pyjson::Value::Array(drivers)) if drivers.len() <= MAX_NOTE_DRIVERS => {
            (cuda, drivers)
        }
        _ => return Err(format!("{}: unexpected 'CUDA Version' or 'Driver'", NOTE_SECTION)),
    };
    let mut branches = Vec::new();
    for driver in drivers {
        match driver {
            pyjson::Value::Int(text) => branches.push(text.clone()),
            _ => return Err(format!("{}: 'Driver' must list driver branches as numbers", NOTE_SECTION)),
        }
    }
    Ok(Some(Note { cuda_version: cut(cuda, 32).to_string(), drivers: branches }))
}

fn not_json(why: &str) -> String {
    format!("{}: not JSON ({})", NOTE_SECTION, why)
}

/// Python's `buf[start:end]`.
fn py_slice(buf: &[u8], start: u128, end: u128) -> &[u8] {
    let len = buf.len() as u128;
    let (start, end) = (start.min(len) as usize, end.min(len) as usize);
    buf.get(start..end.max(start)).unwrap_or(&[])
}

/// Python's `raw.strip(b"\0")`.
fn strip_nul(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|&b| b != 0).unwrap_or(raw.len());
    let end = raw.iter().rposition(|&b| b != 0).map_or(start, |at| at + 1);
    raw.get(start..end.max(start)).unwrap_or(&[])
}

/// Python's `str(UnicodeDecodeError)` for `raw.decode("utf-8")`: both decoders
/// stop at the same maximal invalid part (Unicode's recommended practice).
fn utf8_error_text(raw: &[u8], err: &std::str::Utf8Error) -> String {
    let start = err.valid_up_to();
    let first = raw.get(start).copied().unwrap_or(0);
    let (end, reason) = match err.error_len() {
        None => (raw.len(), "unexpected end of data"),
        Some(1) if matches!(first, 0x80..=0xC1 | 0xF5..=0xFF) => (start + 1, "invalid start byte"),
        Some(n) => (start + n, "invalid continuation byte"),
    };
    if end - start == 1 {
        format!("'utf-8' codec can't decode byte 0x{:02x} in position {}: {}", first, start, reason)
    } else {
        format!("'utf-8' codec can't decode bytes in position {}-{}: {}", start, end - 1, reason)
    }
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

/// `json.loads` as CPython 3.11 does it (its C scanner), for a note's JSON: what
/// it accepts and the words and positions of its errors ("Expecting ',' delimiter:
/// line 1 column 5 (char 4)"). Positions count characters, as Python's do.
///
/// Iterative (no recursion whatever the nesting) and bounded by the text: values
/// deeper than `keep` levels are checked but not kept (an empty container of
/// their kind stands for them). Where Python differs: a string holding a lone
/// surrogate escape (`"\ud800"`) keeps U+FFFD in its place; nesting past
/// Python's recursion limit, a `RecursionError` there, parses here.
pub(crate) mod pyjson {
    use std::fmt;

    #[derive(Clone, Debug, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        /// The digits as Python's `str(int(...))` writes them.
        Int(String),
        Float,
        Str(String),
        Array(Vec<Value>),
        /// Members in order; a repeated key's last value is the one Python keeps.
        Object(Vec<(String, Value)>),
    }

    /// Python's `JSONDecodeError`.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Error {
        pub message: &'static str,
        pub pos: usize,
        line: usize,
        column: usize,
    }

    impl fmt::Display for Error {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}: line {} column {} (char {})", self.message, self.line, self.column, self.pos)
        }
    }

    enum Frame {
        Array { items: Vec<Value>, keep: bool },
        Object { members: Vec<(String, Value)>, key: String, keep: bool },
    }

    struct Scanner {
        text: Vec<char>,
    }

    type Scan<T> = Result<T, (&'static str, usize)>;

    /// `json.loads(text)`.
    pub fn parse(text: &str, keep: usize) -> Result<Value, Error> {
        let scanner = Scanner { text: text.chars().collect() };
        scanner.document(keep).map_err(|(message, pos)| scanner.error(message, pos))
    }

    impl Scanner {
        fn error(&self, message: &'static str, pos: usize) -> Error {
            let before = self.text.get(..pos).unwrap_or(&self.text);
            let line = before.iter().filter(|&&c| c == '\n').count() + 1;
            let column = match before.iter().rposition(|&c| c == '\n') {
                Some(at) => pos - at,
                None => pos + 1,
            };
            Error { message, pos, line, column }
        }

        fn at(&self, idx: usize) -> Option<char> {
            self.text.get(idx).copied()
        }

        fn is(&self, idx: usize, c: char) -> bool {
            self.at(idx) == Some(c)
        }

        fn skip_space(&self, mut idx: usize) -> usize {
            while matches!(self.at(idx), Some(' ' | '\t' | '\n' | '\r')) {
                idx += 1;
            }
            idx
        }

        fn matches(&self, idx: usize, word: &str) -> bool {
            word.chars().enumerate().all(|(i, c)| self.is(idx + i, c))
        }

        fn document(&self, keep: usize) -> Scan<Value> {
            if self.is(0, '\u{feff}') {
                return Err(("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0));
            }
            let (value, end) = self.value(self.skip_space(0), keep)?;
            let end = self.skip_space(end);
            if end != self.text.len() {
                return Err(("Extra data", end));
            }
            Ok(value)
        }

        /// One JSON value at `idx` and the index after it (`scan_once`).
        fn value(&self, mut idx: usize, keep: usize) -> Scan<(Value, usize)> {
            let mut stack: Vec<Frame> = Vec::new();
            loop {
                // A term: a scalar, or the opening of a container (pushed).
                let mut value = match self.at(idx) {
                    None => return Err(("Expecting value", idx)),
                    Some('"') => {
                        let (text, next) = self.string(idx + 1)?;
                        idx = next;
                        Value::Str(text)
                    }
                    Some('{') => {
                        idx = self.skip_space(idx + 1);
                        if self.is(idx, '}') {
                            idx += 1;
                            Value::Object(Vec::new())
                        } else {
                            let (key, next) = self.key(idx)?;
                            idx = next;
                            stack.push(Frame::Object { members: Vec::new(), key, keep: stack.len() < keep });
                            continue;
                        }
                    }
                    Some('[') => {
                        idx = self.skip_space(idx + 1);
                        if self.is(idx, ']') {
                            idx += 1;
                            Value::Array(Vec::new())
                        } else {
                            stack.push(Frame::Array { items: Vec::new(), keep: stack.len() < keep });
                            continue;
                        }
                    }
                    Some('n') if self.matches(idx, "null") => {
                        idx += 4;
                        Value::Null
                    }
                    Some('t') if self.matches(idx, "true") => {
                        idx += 4;
                        Value::Bool(true)
                    }
                    Some('f') if self.matches(idx, "false") => {
                        idx += 5;
                        Value::Bool(false)
                    }
                    Some('N') if self.matches(idx, "NaN") => {
                        idx += 3;
                        Value::Float
                    }
                    Some('I') if self.matches(idx, "Infinity") => {
                        idx += 8;
                        Value::Float
                    }
                    Some('-') if self.matches(idx, "-Infinity") => {
                        idx += 9;
                        Value::Float
                    }
                    Some(_) => {
                        let (number, next) = self.number(idx)?;
                        idx = next;
                        number
                    }
                };
                // Hand the value to the containers it closes, up to one that
                // wants another term.
                loop {
                    match stack.last_mut() {
                        None => return Ok((value, idx)),
                        Some(Frame::Array { items, keep }) => {
                            if *keep {
                                items.push(value);
                            }
                            idx = self.skip_space(idx);
                            if self.is(idx, ']') {
                                idx += 1;
                                value = match stack.pop() {
                                    Some(Frame::Array { items, .. }) => Value::Array(items),
                                    _ => Value::Null, // never: the top was this array
                                };
                                continue;
                            }
                            if !self.is(idx, ',') {
                                return Err(("Expecting ',' delimiter", idx));
                            }
                            idx = self.skip_space(idx + 1);
                            break;
                        }
                        Some(Frame::Object { members, key, keep }) => {
                            if *keep {
                                members.push((std::mem::take(key), value));
                            }
                            idx = self.skip_space(idx);
                            if self.is(idx, '}') {
                                idx += 1;
                                value = match stack.pop() {
                                    Some(Frame::Object { members, .. }) => Value::Object(members),
                                    _ => Value::Null, // never: the top was this object
                                };
                                continue;
                            }
                            if !self.is(idx, ',') {
                                return Err(("Expecting ',' delimiter", idx));
                            }
                            let (next_key, next) = self.key(self.skip_space(idx + 1))?;
                            *key = next_key;
                            idx = next;
                            break;
                        }
                    }
                }
            }
        }

        /// A member's key and its `:` at `idx`: the index of its value.
        fn key(&self, idx: usize) -> Scan<(String, usize)> {
            if !self.is(idx, '"') {
                return Err(("Expecting property name enclosed in double quotes", idx));
            }
            let (key, next) = self.string(idx + 1)?;
            let idx = self.skip_space(next);
            if !self.is(idx, ':') {
                return Err(("Expecting ':' delimiter", idx));
            }
            Ok((key, self.skip_space(idx + 1)))
        }

        /// `_match_number_unicode`, its index arithmetic kept as it is.
        fn number(&self, start: usize) -> Scan<(Value, usize)> {
            let len = self.text.len();
            let digit = |idx: usize| matches!(self.at(idx), Some('0'..='9'));
            let mut idx = start;
            if self.is(idx, '-') {
                idx += 1;
                if idx >= len {
                    return Err(("Expecting value", start));
                }
            }
            if matches!(self.at(idx), Some('1'..='9')) {
                idx += 1;
                while digit(idx) {
                    idx += 1;
                }
            } else if self.is(idx, '0') {
                idx += 1;
            } else {
                return Err(("Expecting value", start));
            }
            let mut is_float = false;
            if idx + 1 < len && self.is(idx, '.') && digit(idx + 1) {
                is_float = true;
                idx += 2;
                while digit(idx) {
                    idx += 1;
                }
            }
            if idx + 1 < len && matches!(self.at(idx), Some('e' | 'E')) {
                let e_start = idx;
                idx += 1;
                if idx + 1 < len && matches!(self.at(idx), Some('-' | '+')) {
                    idx += 1;
                }
                while digit(idx) {
                    idx += 1;
                }
                if digit(idx - 1) {
                    is_float = true;
                } else {
                    idx = e_start;
                }
            }
            if is_float {
                return Ok((Value::Float, idx));
            }
            let text: String = self.text.get(start..idx).unwrap_or(&[]).iter().collect();
            Ok((Value::Int(if text == "-0" { "0".to_string() } else { text }), idx))
        }

        /// `scanstring_unicode`: the string whose first character is at `end` (after
        /// its quote) and the index after its closing quote.
        fn string(&self, mut end: usize) -> Scan<(String, usize)> {
            let len = self.text.len();
            let begin = end - 1;
            let mut out = String::new();
            loop {
                let mut next = end;
                while let Some(d) = self.at(next) {
                    if d == '"' || d == '\\' {
                        break;
                    }
                    if (d as u32) <= 0x1f {
                        return Err(("Invalid control character at", next));
                    }
                    next += 1;
                }
                let c = match self.at(next) {
                    Some(c) => c,
                    None => return Err(("Unterminated string starting at", begin)),
                };
                out.extend(self.text.get(end..next).unwrap_or(&[]));
                next += 1;
                if c == '"' {
                    return Ok((out, next));
                }
                if next == len {
                    return Err(("Unterminated string starting at", begin));
                }
                let escaped = self.at(next).unwrap_or('\0');
                if escaped != 'u' {
                    end = next + 1;
                    let plain = match escaped {
                        '"' => '"',
                        '\\' => '\\',
                        '/' => '/',
                        'b' => '\u{8}',
                        'f' => '\u{c}',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        _ => return Err(("Invalid \\escape", end - 2)),
                    };
                    out.push(plain);
                    continue;
                }
                next += 1;
                end = next + 4;
                if end >= len {
                    return Err(("Invalid \\uXXXX escape", next - 1));
                }
                let mut code = self.hex4(next).ok_or(("Invalid \\uXXXX escape", end - 5))?;
                // A surrogate pair: the low half must follow at once.
                if (0xD800..=0xDBFF).contains(&code) && end + 6 < len && self.is(end, '\\') && self.is(end + 1, 'u') {
                    let low = self.hex4(end + 2).ok_or(("Invalid \\uXXXX escape", end + 1))?;
                    if (0xDC00..=0xDFFF).contains(&low) {
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                        end += 6;
                    }
                }
                out.push(char::from_u32(code).unwrap_or('\u{fffd}')); // a lone surrogate
            }
        }

        fn hex4(&self, idx: usize) -> Option<u32> {
            let mut code = 0;
            for i in 0..4 {
                code = (code << 4) | self.at(idx + i)?.to_digit(16)?;
            }
            Some(code)
        }
    }
}

/// The golden fixtures shared with the Python tests
/// (`hook/tests/fixtures/compat/expected.json`, written by
/// `tests/unit/engine/test_compat_rust_fixtures.py`), read as values to compare.
#[cfg(test)]
pub(crate) mod fixture {
    use super::pyjson::Value;

    pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/compat");

    pub fn load() -> Value {
        let text = std::fs::read_to_string(format!("{}/expected.json", DIR)).expect("expected.json");
        super::pyjson::parse(&text, usize::MAX).expect("expected.json is JSON")
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

    pub fn int(value: &Value) -> &str {
        match value {
            Value::Int(digits) => digits,
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

    pub fn number<N: ToString>(n: N) -> Value {
        Value::Int(n.to_string())
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
        let (name, why) = candidate(entries);
        let name = match name {
            None => return (false, why),
            Some(name) => name,
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
            (Some("libcuda.so.555.58.02".to_string()), String::new())
        );
        assert_eq!(candidate(&["libcuda.so.1"]), (None, String::new()));
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
            candidate(&names).1,
            "5 candidates in /usr/local/cuda/compat (libcuda.so.1.1, libcuda.so.2.1, libcuda.so.3.1, \
             libcuda.so.4.1, ...): the driver's libraries are used"
        );
    }

    #[test]
    fn json_errors_are_pythons() {
        let cases = [
            ("", "Expecting value: line 1 column 1 (char 0)"),
            ("[1,", "Expecting value: line 1 column 4 (char 3)"),
            ("{\"a\" 1}", "Expecting ':' delimiter: line 1 column 6 (char 5)"),
            ("{\"a\": 1,}", "Expecting property name enclosed in double quotes: line 1 column 9 (char 8)"),
            ("[1 2]", "Expecting ',' delimiter: line 1 column 4 (char 3)"),
            ("{}\n x", "Extra data: line 2 column 2 (char 4)"),
            ("\"abc", "Unterminated string starting at: line 1 column 1 (char 0)"),
            ("\"a\\x\"", "Invalid \\escape: line 1 column 3 (char 2)"),
            ("\"\\u12G4\"", "Invalid \\uXXXX escape: line 1 column 3 (char 2)"),
            ("\"a\u{1}\"", "Invalid control character at: line 1 column 3 (char 2)"),
            ("\u{feff}{}", "Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)"),
        ];
        for (text, want) in cases {
            assert_eq!(pyjson::parse(text, 8).unwrap_err().to_string(), want, "{:?}", text);
        }
    }

    #[test]
    fn deep_nesting_is_parsed_without_recursion() {
        let text = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(
            pyjson::parse(&text, 2),
            Ok(pyjson::Value::Array(vec![pyjson::Value::Array(vec![pyjson::Value::Array(vec![])])]))
        );
    }

    // ------------------------------------------------------------ the fixtures shared with Python

    use super::fixture::{self, find, flag, get, hex, int, list, members, text};
    use super::pyjson::Value;

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

    fn note_fields(note: &Note) -> Vec<(&'static str, Value)> {
        let drivers = note.drivers.iter().map(|d| Value::Int(d.clone())).collect();
        vec![("cuda_version", Value::Str(note.cuda_version.clone())), ("drivers", Value::Array(drivers))]
    }

    #[test]
    fn note_sections_read_as_python_reads_them() {
        let golden = fixture::load();
        let cases = list(get(&golden, "notes"));
        assert!(cases.len() > 150);
        check_note_cases(cases);
    }

    /// More note cases in the fixture's form, from a file (a differential run
    /// against Python: `NRI_GPU_NOTE_CASES=<file> cargo test -- --ignored`).
    #[test]
    #[ignore]
    fn note_cases_from_a_file() {
        let path = std::env::var("NRI_GPU_NOTE_CASES").expect("NRI_GPU_NOTE_CASES");
        let cases = pyjson::parse(&std::fs::read_to_string(path).unwrap(), usize::MAX).unwrap();
        check_note_cases(list(&cases));
        eprintln!("{} note cases agree", list(&cases).len());
    }

    fn check_note_cases(cases: &[Value]) {
        for case in cases {
            let name = text(get(case, "name"));
            let align: u64 = int(get(case, "align")).parse().unwrap();
            let got = parse_note(&spec_section(case), flag(get(case, "little_endian")), align);
            match got {
                Err(err) => assert_eq!(find(case, "error").map(text), Some(err.as_str()), "{}", name),
                Ok(None) => assert_eq!(find(case, "note"), Some(&Value::Null), "{}", name),
                Ok(Some(note)) => {
                    for (key, value) in note_fields(&note) {
                        assert_eq!(find(case, key), Some(&value), "{}: {}", name, key);
                    }
                }
            }
        }
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
            let (name, why) = candidate(&names);
            let want = list(get(record, "result"));
            let want_name = match &want[0] {
                Value::Null => None,
                name => Some(text(name).to_string()),
            };
            assert_eq!((name, why.as_str()), (want_name, text(&want[1])), "{:?}", names);
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
