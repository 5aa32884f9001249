//! Byte-level helpers the readers of untrusted files share (`elf`, `ldcache`,
//! `cudacompat`).  (pure)

/// Python's `buf[start:end]`: clamped to the buffer, empty when reversed.
pub fn py_slice<A: Into<u128>, B: Into<u128>>(buf: &[u8], start: A, end: B) -> &[u8] {
    let len = buf.len() as u128;
    let (start, end) = (start.into().min(len) as usize, end.into().min(len) as usize);
    buf.get(start..end.max(start)).unwrap_or(&[])
}

/// `value` rounded up to a multiple of `align` (callers' values are far below
/// `u64::MAX`: no overflow).
pub fn round_up(value: u64, align: u64) -> u64 {
    (value + align - 1) / align * align
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_pythons() {
        let buf = b"abcdef";
        assert_eq!(py_slice(buf, 1u64, 3u64), b"bc");
        assert_eq!(py_slice(buf, 4u64, 2u64), b"");
        assert_eq!(py_slice(buf, 4u64, u128::MAX), b"ef");
        assert_eq!(py_slice(buf, u64::MAX, 2u64), b"");
    }

    #[test]
    fn round_up_to_alignments() {
        assert_eq!((round_up(0, 4), round_up(1, 4), round_up(4, 4), round_up(9, 8)), (0, 4, 4, 16));
    }
}
