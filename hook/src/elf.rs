//! Is an ELF executable static; what ldconfig reads from a shared library
//! (`engine/start/elf.py`; pure: every byte comes through a `read` callback).
//!
//! The trusted ldconfig runs with the container's root as `/`. A dynamically
//! linked binary would be loaded by the *container's* `ld-linux` (the kernel
//! resolves `PT_INTERP` in the process's root) and with the container's
//! `/etc/ld.so.preload`: code from the image with the plugin's privileges. So only
//! a binary without an interpreter is run (glibc's ldconfig is static everywhere
//! it is shipped: `static-pie` on Debian 12).
//!
//! The CUDA compat folder is image data: its libraries are looked at through
//! `read(offset, size)` (a `pread` of a descriptor checked to be a regular file),
//! a few bounded pieces each, never the whole file. Any bytes may come back:
//! positions are computed without overflow and every piece is bounded.

use std::fmt;
use std::io;

use crate::bytes::{py_slice, round_up};

/// Program headers follow the 64-byte ELF header in every toolchain's output.
pub const HEAD_SIZE: usize = 65536;

/// `read(offset, size)`: up to `size` bytes at `offset`, fewer only at the end of the file.
pub type Read<'a> = &'a dyn Fn(u64, usize) -> io::Result<Vec<u8>>;

const MAGIC: &[u8] = b"\x7fELF";
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_NOTE: u32 = 4;
const SHT_NOTE: u32 = 7;
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SONAME: i64 = 14;
const ET_DYN: u16 = 3;
const NT_GNU_ABI_TAG: u32 = 1;
/// The most any one read asks for.
const PIECE: u64 = 65536;
/// A fwd-compatibility note is about 100 bytes.
const NOTE_LIMIT: u64 = 4096;
const SONAME_LIMIT: usize = 4096;
const MAX_SECTIONS: u16 = 4096;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;

/// ldconfig's flags word for a 64-bit library (FLAG_ELF_LIBC6 with the ABI's
/// FLAG_*_LIB64; glibc's sysdeps readelflib.c sets it whatever the library needs).
fn lib64_flags(machine: u16) -> Option<i32> {
    match machine {
        62 => Some(0x0303),  // EM_X86_64
        183 => Some(0x0A03), // EM_AARCH64
        _ => None,
    }
}

/// Why a file could not be read as the ELF file it must be.
#[derive(Debug)]
pub enum ElfError {
    /// Its bytes are not what they must be (Python's `ValueError`): the message is Python's.
    Invalid(String),
    /// A read failed (Python's `OSError`).
    Read(io::Error),
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElfError::Invalid(message) => f.write_str(message),
            ElfError::Read(err) => f.write_str(&os_error_text(err)),
        }
    }
}

impl From<io::Error> for ElfError {
    fn from(err: io::Error) -> ElfError {
        ElfError::Read(err)
    }
}

type Result<T> = std::result::Result<T, ElfError>;

fn invalid<T, S: Into<String>>(message: S) -> Result<T> {
    Err(ElfError::Invalid(message.into()))
}

/// Python's `str(OSError)`: `[Errno 5] Input/output error`.
pub fn os_error_text(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => format!("[Errno {}] {}", code, crate::sys::strerror_text(code)),
        None => err.to_string(),
    }
}

// ------------------------------------------------------------------ bytes

/// The unsigned `size`-byte field at `at` (little- or big-endian); None past the end.
fn field(buf: &[u8], at: u64, size: usize, little: bool) -> Option<u64> {
    let start = usize::try_from(at).ok()?;
    let bytes = buf.get(start..start.checked_add(size)?)?;
    let mut value: u64 = 0;
    for i in 0..bytes.len() {
        let byte = if little { bytes.get(bytes.len() - 1 - i)? } else { bytes.get(i)? };
        value = (value << 8) | u64::from(*byte);
    }
    Some(value)
}

fn u16_at(buf: &[u8], at: u64, little: bool) -> u16 {
    field(buf, at, 2, little).unwrap_or(0) as u16
}

fn u32_at(buf: &[u8], at: u64, little: bool) -> u32 {
    field(buf, at, 4, little).unwrap_or(0) as u32
}

fn u64_at(buf: &[u8], at: u64, little: bool) -> u64 {
    field(buf, at, 8, little).unwrap_or(0)
}

/// The bytes before the first NUL.
fn until_nul(raw: &[u8]) -> &[u8] {
    match raw.iter().position(|&b| b == 0) {
        Some(end) => raw.get(..end).unwrap_or(raw),
        None => raw,
    }
}

/// `read` at an offset past what a file can hold reads nothing, as at its end.
fn read_at(read: Read, offset: u128, size: usize) -> Result<Vec<u8>> {
    match u64::try_from(offset) {
        Ok(offset) => Ok(read(offset, size)?),
        Err(_) => Ok(Vec::new()),
    }
}

// ------------------------------------------------------------------ interpreter

/// The `PT_INTERP` path of the ELF file starting with `head`; None when static.
/// An error for a non-ELF file, or one whose program headers lie beyond `head`.
pub fn interpreter(head: &[u8]) -> Result<Option<String>> {
    let ident = match head.get(..6) {
        Some(ident) if head.len() >= 52 => ident,
        _ => return invalid("not an ELF file"),
    };
    if ident.get(..4) != Some(MAGIC)
        || !matches!(ident.get(4), Some(1) | Some(2))
        || !matches!(ident.get(5), Some(1) | Some(2))
    {
        return invalid("not an ELF file");
    }
    let is64 = ident.get(4) == Some(&2);
    let little = ident.get(5) == Some(&1);
    let (phoff, phentsize, phnum, entry_size) = if is64 {
        if head.len() < 64 {
            return invalid("truncated ELF header");
        }
        (u64_at(head, 0x20, little), u16_at(head, 0x36, little), u16_at(head, 0x38, little), 56)
    } else {
        (u64::from(u32_at(head, 0x1C, little)), u16_at(head, 0x2A, little), u16_at(head, 0x2C, little), 32)
    };
    let table_end = u128::from(phoff) + u128::from(phentsize) * u128::from(phnum);
    if usize::from(phentsize) < entry_size || table_end > head.len() as u128 {
        return invalid("program headers beyond the part read");
    }
    for i in 0..u64::from(phnum) {
        let at = phoff + i * u64::from(phentsize); // within head (checked above)
        if u32_at(head, at, little) != PT_INTERP {
            continue;
        }
        let (offset, size) = if is64 {
            (u64_at(head, at + 8, little), u64_at(head, at + 32, little))
        } else {
            (u64::from(u32_at(head, at + 4, little)), u64::from(u32_at(head, at + 16, little)))
        };
        let end = u128::from(offset) + u128::from(size);
        let raw: &[u8] = if end <= head.len() as u128 { py_slice(head, offset, end) } else { b"?" };
        let path = String::from_utf8_lossy(until_nul(raw)).into_owned();
        return Ok(Some(if path.is_empty() { "?".to_string() } else { path }));
    }
    Ok(None)
}

// ------------------------------------------------------------------ shared libraries

/// What `ldconfig` reads from a library for its cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLibrary {
    /// DT_SONAME; None without one. Bytes that are not UTF-8 are replaced
    /// (Python keeps them with `surrogateescape`).
    pub soname: Option<String>,
    /// ldconfig's flags word: 0x0303 for x86-64.
    pub flags: i32,
    /// From the `.note.ABI-tag` note (0 without one), in 32 bits as ldconfig
    /// computes it (an OS field over 255 keeps its low byte).
    pub osversion: u32,
}

/// A `SHT_NOTE` section's bytes, the file's byte order and the section's alignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteSection {
    pub data: Vec<u8>,
    pub little_endian: bool,
    pub align: u64,
}

struct Head {
    little: bool,
    e_type: u16,
    machine: u16,
    phoff: u64,
    shoff: u64,
    phentsize: u16,
    phnum: u16,
    shentsize: u16,
    shnum: u16,
    shstrndx: u16,
}

struct Segment {
    p_type: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
    align: u64,
}

struct Section {
    name: u32,
    sh_type: u32,
    offset: u64,
    size: u64,
    align: u64,
}

fn head(read: Read) -> Result<Head> {
    let raw = read(0, 64)?;
    if raw.len() < 64 || raw.get(..4) != Some(MAGIC) || !matches!(raw.get(5), Some(1) | Some(2)) {
        return invalid("not an ELF file");
    }
    if raw.get(4) != Some(&2) {
        return invalid("not a 64-bit ELF file");
    }
    let little = raw.get(5) == Some(&1);
    Ok(Head {
        little,
        e_type: u16_at(&raw, 0x10, little),
        machine: u16_at(&raw, 0x12, little),
        phoff: u64_at(&raw, 0x20, little),
        shoff: u64_at(&raw, 0x28, little),
        phentsize: u16_at(&raw, 0x36, little),
        phnum: u16_at(&raw, 0x38, little),
        shentsize: u16_at(&raw, 0x3A, little),
        shnum: u16_at(&raw, 0x3C, little),
        shstrndx: u16_at(&raw, 0x3E, little),
    })
}

/// The `count` entries of `entsize` bytes at `offset`, in one read of at most
/// `limit` bytes; each entry at least `size` bytes long.
fn table(read: Read, offset: u64, entsize: u16, count: u16, size: usize, limit: usize) -> Result<Vec<Vec<u8>>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let total = usize::from(entsize) * usize::from(count); // at most 2^32: no overflow
    if usize::from(entsize) < size || total > limit {
        return invalid(format!("a table of {} entries of {} bytes: over {} bytes", count, entsize, limit));
    }
    let raw = read(offset, total)?;
    if raw.len() < total {
        return invalid("a table beyond the end of the file");
    }
    Ok(raw.chunks_exact(usize::from(entsize)).take(usize::from(count)).map(|c| c.to_vec()).collect())
}

fn segments(read: Read, head: &Head) -> Result<Vec<Segment>> {
    let little = head.little;
    let rows = table(read, head.phoff, head.phentsize, head.phnum, PHDR_SIZE, PIECE as usize)?;
    // p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
    Ok(rows
        .iter()
        .map(|r| Segment {
            p_type: u32_at(r, 0, little),
            offset: u64_at(r, 8, little),
            vaddr: u64_at(r, 16, little),
            filesz: u64_at(r, 32, little),
            align: u64_at(r, 48, little),
        })
        .collect())
}

/// A 64-bit ELF file: its header, read once, and the reader of the rest.
pub struct Elf<'a> {
    read: Read<'a>,
    head: Head,
}

/// `Elf::open(read)?.shared_library()`.
pub fn shared_library(read: Read) -> Result<Option<SharedLibrary>> {
    Elf::open(read)?.shared_library()
}

impl<'a> Elf<'a> {
    /// The file `read` reads; an error unless it starts with a 64-bit ELF header.
    pub fn open(read: Read<'a>) -> Result<Elf<'a>> {
        Ok(Elf { read, head: head(read)? })
    }

    /// The soname, flags and ABI note of this shared library; None for one of
    /// another kind (not `ET_DYN`, an ABI ldconfig has no 64-bit flags for here).
    /// An error for headers that point outside the file or past the limits.
    pub fn shared_library(&self) -> Result<Option<SharedLibrary>> {
        shared_library_of(self.read, &self.head)
    }

    /// The `SHT_NOTE` section called `name`; None when there is none. An error
    /// for headers out of bounds, a note over 4 KiB.
    pub fn note_section(&self, name: &str) -> Result<Option<NoteSection>> {
        note_section_of(self.read, &self.head, name)
    }
}

fn shared_library_of(read: Read, head: &Head) -> Result<Option<SharedLibrary>> {
    let flags = match lib64_flags(head.machine) {
        Some(flags) if head.e_type == ET_DYN => flags,
        _ => return Ok(None),
    };
    let segments = segments(read, head)?;
    let mut soname = None;
    let mut osversion = 0;
    for segment in &segments {
        let piece = segment.filesz.min(PIECE) as usize;
        if segment.p_type == PT_DYNAMIC {
            soname = self::soname(read, head.little, &read(segment.offset, piece)?, &segments)?;
        } else if segment.p_type == PT_NOTE {
            let align = if segment.align == 8 { 8 } else { 4 };
            match abi_tag(head.little, &read(segment.offset, piece)?, align)? {
                Some(found) if found != 0 => osversion = found,
                _ => {}
            }
        }
    }
    Ok(Some(SharedLibrary { soname, flags, osversion }))
}

fn soname(read: Read, little: bool, dynamic: &[u8], segments: &[Segment]) -> Result<Option<String>> {
    let mut strtab = None;
    let mut name = None;
    for entry in dynamic.chunks_exact(16) {
        let tag = u64_at(entry, 0, little) as i64;
        let value = u64_at(entry, 8, little);
        if tag == DT_NULL {
            break;
        }
        if tag == DT_STRTAB {
            strtab = Some(value);
        } else if tag == DT_SONAME {
            name = Some(value);
        }
    }
    let (strtab, name) = match (strtab, name) {
        (Some(strtab), Some(name)) => (strtab, name),
        _ => return Ok(None),
    };
    // The string table's address to a file offset.
    for s in segments {
        if s.p_type == PT_LOAD && s.vaddr <= strtab && u128::from(strtab) < u128::from(s.vaddr) + u128::from(s.filesz) {
            let at = u128::from(s.offset) + u128::from(strtab - s.vaddr) + u128::from(name);
            let raw = read_at(read, at, SONAME_LIMIT)?;
            if !raw.contains(&0) {
                return invalid("DT_SONAME: no string");
            }
            return Ok(Some(String::from_utf8_lossy(until_nul(&raw)).into_owned()));
        }
    }
    invalid("DT_STRTAB: outside the file's loaded segments")
}

/// glibc's `osversion` from a `GNU` `NT_GNU_ABI_TAG` note among `notes`, in 32
/// bits as ldconfig computes it; an error for a tag whose descriptor runs past
/// the notes.
fn abi_tag(little: bool, notes: &[u8], align: u64) -> Result<Option<u32>> {
    let len = notes.len() as u64;
    let mut pos: u64 = 0; // below 2^17 + 2^34 throughout: no overflow
    while pos + 12 <= len {
        let namesz = u64::from(u32_at(notes, pos, little));
        let descsz = u64::from(u32_at(notes, pos + 4, little));
        let n_type = u32_at(notes, pos + 8, little);
        let name_at = pos + 12;
        let desc_at = name_at + round_up(namesz, 4);
        let name = py_slice(notes, name_at, name_at + namesz);
        if n_type == NT_GNU_ABI_TAG && name == b"GNU\0" && descsz >= 16 {
            if desc_at + 16 > len {
                return invalid("an ABI tag note cut short");
            }
            let byte = |i: u64| u32_at(notes, desc_at + 4 * i, little) & 0xFF;
            return Ok(Some((byte(0) << 24) | (byte(1) << 16) | (byte(2) << 8) | byte(3)));
        }
        pos = desc_at + round_up(descsz, align);
    }
    Ok(None)
}

fn note_section_of(read: Read, head: &Head, name: &str) -> Result<Option<NoteSection>> {
    let little = head.little;
    if head.shnum > MAX_SECTIONS {
        return invalid(format!("{} sections: over {}", head.shnum, MAX_SECTIONS));
    }
    let limit = usize::from(MAX_SECTIONS) * 64;
    let rows = table(read, head.shoff, head.shentsize, head.shnum, SHDR_SIZE, limit)?;
    // sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, sh_addralign, sh_entsize
    let sections: Vec<Section> = rows
        .iter()
        .map(|r| Section {
            name: u32_at(r, 0, little),
            sh_type: u32_at(r, 4, little),
            offset: u64_at(r, 24, little),
            size: u64_at(r, 32, little),
            align: u64_at(r, 48, little),
        })
        .collect();
    let strings = match sections.get(usize::from(head.shstrndx)) {
        Some(strings) => strings,
        None => return Ok(None),
    };
    let names = read(strings.offset, strings.size.min(PIECE) as usize)?;
    let mut wanted = name.as_bytes().to_vec();
    wanted.push(0);
    for section in &sections {
        let at = section.name as usize;
        let found = at.checked_add(wanted.len()).and_then(|end| names.get(at..end));
        if section.sh_type != SHT_NOTE || found != Some(&wanted[..]) {
            continue;
        }
        if section.size > NOTE_LIMIT {
            return invalid(format!("{}: {} bytes, over {}", name, section.size, NOTE_LIMIT));
        }
        let data = read(section.offset, section.size as usize)?;
        return Ok(Some(NoteSection { data, little_endian: little, align: section.align }));
    }
    Ok(None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal little-endian ELF64 header plus program headers (type, offset, size).
    fn elf64(phdrs: &[(u32, u64, u64)], tail: &[u8]) -> Vec<u8> {
        let mut out = b"\x7fELF\x02\x01\x01".to_vec();
        out.extend_from_slice(&[0; 9]);
        out.extend_from_slice(&3u16.to_le_bytes());
        out.extend_from_slice(&62u16.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // entry
        out.extend_from_slice(&64u64.to_le_bytes()); // phoff
        out.extend_from_slice(&0u64.to_le_bytes()); // shoff
        out.extend_from_slice(&0u32.to_le_bytes());
        for v in [64u16, 56, phdrs.len() as u16, 0, 0, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for &(t, off, size) in phdrs {
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            for v in [off, 0, 0, size, size, 0] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        out.extend_from_slice(tail);
        out
    }

    /// `read` over bytes in memory, as the fixtures' Python side reads them.
    pub(crate) fn reader(data: &[u8]) -> impl Fn(u64, usize) -> io::Result<Vec<u8>> + '_ {
        move |offset, size| {
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
            let end = start.saturating_add(size).min(data.len());
            Ok(data[start..end].to_vec())
        }
    }

    #[test]
    fn a_synthetic_dynamic_executable() {
        let start = 64 + 2 * 56;
        let data = elf64(&[(6, 64, 112), (3, start, 28)], b"/lib64/ld-linux-x86-64.so.2\0");
        assert_eq!(interpreter(&data).unwrap().as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
    }

    #[test]
    fn a_synthetic_static_executable() {
        assert_eq!(interpreter(&elf64(&[(1, 0, 0)], b"")).unwrap(), None);
    }

    #[test]
    fn not_an_elf_file() {
        let mut bad_class = b"\x7fELF\x03\x01".to_vec();
        bad_class.extend_from_slice(&[0; 60]);
        for data in [&b"#!/bin/sh\n"[..], b"", &bad_class] {
            assert_eq!(interpreter(data).unwrap_err().to_string(), "not an ELF file");
        }
    }

    #[test]
    fn program_headers_beyond_what_was_read() {
        let mut data = elf64(&[(1, 0, 0)], b"");
        data[0x20..0x28].copy_from_slice(&((HEAD_SIZE * 2) as u64).to_le_bytes());
        assert_eq!(interpreter(&data).unwrap_err().to_string(), "program headers beyond the part read");
        data[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(interpreter(&data).is_err());
    }

    #[test]
    fn an_interpreter_past_the_head_reads_as_a_question_mark() {
        let data = elf64(&[(3, u64::MAX, 2)], b"");
        assert_eq!(interpreter(&data).unwrap().as_deref(), Some("?"));
    }

    #[test]
    fn a_truncated_abi_note_says_what_python_says() {
        let mut notes = Vec::new();
        for v in [4u32, 16, 1] {
            notes.extend_from_slice(&v.to_le_bytes());
        }
        notes.extend_from_slice(b"GNU\0\0\0\0\0\0\0\0\0");
        let err = abi_tag(true, &notes, 4).unwrap_err().to_string();
        assert_eq!(err, "an ABI tag note cut short");
    }

    #[test]
    fn a_failed_read_is_pythons_oserror_text() {
        let read = |_: u64, _: usize| -> io::Result<Vec<u8>> { Err(io::Error::from_raw_os_error(5)) };
        let err = shared_library(&read).unwrap_err().to_string();
        assert_eq!(err, "[Errno 5] Input/output error");
    }

    #[test]
    fn hostile_headers_never_panic() {
        // Every header byte set to each of a few extreme values, one at a time.
        let base = crate::cudacompat::fixture::file("libcuda-note.so");
        for at in 0..base.len().min(512) {
            for value in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut data = base.clone();
                data[at] = value;
                let read = reader(&data);
                let _ = shared_library(&read);
                let _ = Elf::open(&read).and_then(|elf| elf.note_section(".note.cuda.fwd_compatibility"));
                let _ = interpreter(&data);
            }
        }
    }

    /// What test_compat_rust_fixtures.elf_record says of a file, said here.
    fn record(data: &[u8]) -> crate::json::Value {
        use crate::cudacompat::fixture::{number, object, outcome, string, to_hex};
        use crate::json::Value;
        let read = reader(data);
        let head = &data[..data.len().min(HEAD_SIZE)];
        let text_or_null = |text: Option<String>| text.map_or(Value::Null, Value::Str);
        let mut members = vec![
            ("interpreter", outcome(interpreter(head).map(text_or_null))),
            (
                "shared_library",
                outcome(shared_library(&read).map(|lib| match lib {
                    None => Value::Null,
                    Some(lib) => object(vec![
                        ("soname", text_or_null(lib.soname)),
                        ("flags", number(lib.flags)),
                        ("osversion", number(lib.osversion)),
                    ]),
                })),
            ),
        ];
        match Elf::open(&read).and_then(|elf| elf.note_section(crate::cudacompat::NOTE_SECTION)) {
            Err(err) => members.push(("note_section", outcome::<ElfError>(Err(err)))),
            Ok(None) => members.push(("note_section", outcome::<ElfError>(Ok(Value::Null)))),
            Ok(Some(found)) => {
                let section = object(vec![
                    ("data", string(&to_hex(&found.data))),
                    ("little_endian", Value::Bool(found.little_endian)),
                    ("align", number(found.align)),
                ]);
                members.push(("note_section", outcome::<ElfError>(Ok(section))));
                let note = crate::cudacompat::parse_note(&found.data, found.little_endian, found.align);
                let note = note.map(|note| match note {
                    None => Value::Null,
                    Some(note) => object(vec![
                        ("cuda_version", Value::Str(note.cuda_version)),
                        ("drivers", Value::Array(note.drivers.iter().map(number).collect())),
                    ]),
                });
                members.push(("note", outcome(note)));
            }
        }
        object(members)
    }

    #[test]
    fn the_fixture_files_read_as_python_reads_them() {
        use crate::cudacompat::fixture::{file, get, load, members, sorted};
        let golden = load();
        let files = members(get(&golden, "elf"));
        assert!(files.len() > 30);
        for (name, want) in files {
            assert_eq!(sorted(&record(&file(name))), sorted(want), "{}", name);
        }
    }

    /// More files in the fixture's form (`data` in hex), from a file (a
    /// differential run against Python: `NRI_GPU_ELF_CASES=<file> cargo test -- --ignored`).
    #[test]
    #[ignore]
    fn elf_cases_from_a_file() {
        use crate::cudacompat::fixture::{get, hex, list, sorted, text};
        let path = std::env::var("NRI_GPU_ELF_CASES").expect("NRI_GPU_ELF_CASES");
        let cases = crate::cudacompat::fixture::parse(&std::fs::read_to_string(path).unwrap());
        for case in list(&cases) {
            let got = record(&hex(text(get(case, "data"))));
            assert_eq!(sorted(&got), sorted(get(case, "record")), "{}", text(get(case, "name")));
        }
        eprintln!("{} files agree", list(&cases).len());
    }
}
