//! The hook's one error: a step cannot be done, and the message says why,
//! naming the path or value at fault (as `engine.start.work.WorkError`); and
//! the Python string behaviour messages and parsers keep (`repr`, slicing by
//! characters, `isspace`).

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkError(pub String);

impl WorkError {
    pub fn new<S: Into<String>>(message: S) -> WorkError {
        WorkError(message.into())
    }
}

impl fmt::Display for WorkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub type Result<T> = std::result::Result<T, WorkError>;

/// Python's `repr()` of a string, for messages that quote a value as the Python
/// engine does (`'abc'`, with `\n`, `\\` and non-printables escaped; `"it's"`).
pub fn py_repr(value: &str) -> String {
    let quote = if value.contains('\'') && !value.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(value.len() + 2);
    out.push(quote);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The first `n` characters of `value` (Python's `value[:n]`).
pub fn cut(value: &str, n: usize) -> &str {
    match value.char_indices().nth(n) {
        Some((at, _)) => &value[..at],
        None => value,
    }
}

/// Python's `str.isspace`: Unicode's White_Space and the ASCII separators
/// U+001C..U+001F.
pub fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_is_pythons() {
        assert_eq!(py_repr("abc"), "'abc'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("a\nb\\"), "'a\\nb\\\\'");
        assert_eq!(py_repr("\u{1}"), "'\\x01'");
    }

    #[test]
    fn cut_counts_characters() {
        assert_eq!(cut("héllo", 2), "hé");
        assert_eq!(cut("ab", 5), "ab");
    }
}
