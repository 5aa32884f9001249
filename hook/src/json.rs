//! A bounded JSON reader: the hook's `json.loads`, for its three inputs (the OCI
//! state on stdin, the bundle's config.json, its own work description).
//!
//! config.json carries what a container's author chose (env, annotations,
//! mounts), so the reader takes hostile input: RFC 8259 strictly, UTF-8
//! validated, one pass in linear time, nesting bounded by the caller (an
//! explicit stack, never recursion, so `[[[[…` of 16 MiB cannot overflow ours).
//! Messages have the shape of Python's `json` ("Expecting value: line 1
//! column 1 (char 0)"), positions counted in characters after a skipped BOM, as
//! Python counts them; a byte that is not UTF-8 is reported as Python's codec
//! reports it ("'utf-8' codec can't decode byte 0xff in position 0: invalid
//! start byte"), before any syntax error, since Python decodes first.
//!
//! Where `json.loads(bytes)` differs:
//! - NaN, Infinity and -Infinity are refused ("Expecting value"); Python takes them.
//! - A lone surrogate, escaped (`"\ud800"`) or encoded (ED A0 80), is refused:
//!   a Rust string cannot hold it; Python keeps it in its str.
//! - An integer beyond i64 becomes `Float` (Python keeps it exact, and refuses
//!   more than 4300 digits); the hook only reads small integers.
//! - Only UTF-8 (RFC 8259 section 8.1); Python also detects UTF-16 and UTF-32.
//! - Nesting beyond `max_depth` is a `JsonError`; Python raises RecursionError
//!   (not a ValueError) somewhere near 1000 levels.

use std::fmt;
use std::str::Utf8Error;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    /// Members in document order, duplicates kept; `get` answers the last one.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The member named `key`, the last one of that name as Python's dict keeps
    /// it; None unless this is an object. Linear: the hook's objects are small.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let members = self.as_object()?;
        members.iter().rev().find(|(name, _)| name == key).map(|(_, value)| value)
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    /// Only an `Int`: a float such as 1.0 is no integer, as in Python.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(number) => Some(*number),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(flag) => Some(*flag),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(members) => Some(members),
            _ => None,
        }
    }
}

/// Why a text is not JSON, with its position, in the words of Python's
/// JSONDecodeError or UnicodeDecodeError.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError(pub String);

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

const BOM: &[u8] = b"\xef\xbb\xbf";

/// `data` as one JSON value, nested at most `max_depth` arrays/objects deep
/// (`[]` is depth 1). `max_depth` also bounds the recursion of dropping the
/// value, so keep it to hundreds.
pub fn parse(data: &[u8], max_depth: usize) -> Result<Value, JsonError> {
    // Python decodes bytes that start with a BOM as utf-8-sig: one BOM goes,
    // and positions count from after it.
    let data = data.strip_prefix(BOM).unwrap_or(data);
    let text = std::str::from_utf8(data).map_err(|err| decode_error(data, &err))?;
    let mut parser = Parser { text, pos: 0, max_depth };
    let value = parser.document()?;
    parser.skip_whitespace();
    if parser.pos != text.len() {
        return Err(parser.error("Extra data", parser.pos));
    }
    Ok(value)
}

/// Python's UnicodeDecodeError text for the first bad byte(s): both decoders
/// take the same maximal invalid sequence (the Unicode recommended practice).
fn decode_error(data: &[u8], err: &Utf8Error) -> JsonError {
    let start = err.valid_up_to();
    let first = data.get(start).copied().unwrap_or(0);
    let (end, reason) = if matches!(first, 0x80..=0xc1 | 0xf5..=0xff) {
        (start + 1, "invalid start byte")
    } else {
        match err.error_len() {
            Some(len) => (start + len, "invalid continuation byte"),
            None => (data.len(), "unexpected end of data"),
        }
    };
    let text = if end.saturating_sub(start) <= 1 {
        format!("'utf-8' codec can't decode byte 0x{:02x} in position {}: {}", first, start, reason)
    } else {
        format!("'utf-8' codec can't decode bytes in position {}-{}: {}", start, end - 1, reason)
    };
    JsonError(text)
}

/// An array or object still open, with what it holds so far; an object also
/// holds the name of the member whose value is being read.
enum Frame {
    Array(Vec<Value>),
    Object(Vec<(String, Value)>, String),
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    max_depth: usize,
}

impl<'a> Parser<'a> {
    /// One value and everything in it: each turn reads a value's start; a
    /// scalar or an empty container is complete and is handed up to the open
    /// containers, which close or go on to their next member.
    fn document(&mut self) -> Result<Value, JsonError> {
        let mut stack: Vec<Frame> = Vec::new();
        loop {
            let mut value = match self.value_start(&mut stack)? {
                Some(value) => value,
                None => continue,
            };
            loop {
                let frame = match stack.pop() {
                    Some(frame) => frame,
                    None => return Ok(value),
                };
                match frame {
                    Frame::Array(mut items) => {
                        items.push(value);
                        if self.comma_or_close(b']')? {
                            stack.push(Frame::Array(items));
                            break;
                        }
                        value = Value::Array(items);
                    }
                    Frame::Object(mut members, name) => {
                        members.push((name, value));
                        if self.comma_or_close(b'}')? {
                            let name = self.member_name()?;
                            stack.push(Frame::Object(members, name));
                            break;
                        }
                        value = Value::Object(members);
                    }
                }
            }
        }
    }

    /// A complete value, or None when a non-empty container was opened (pushed).
    fn value_start(&mut self, stack: &mut Vec<Frame>) -> Result<Option<Value>, JsonError> {
        self.skip_whitespace();
        let start = self.pos;
        let opens = matches!(self.peek(), Some(b'[') | Some(b'{'));
        if opens && stack.len() >= self.max_depth {
            let what = format!("Nesting deeper than {} levels", self.max_depth);
            return Err(self.error(&what, start));
        }
        let value = match self.peek() {
            Some(b'[') => {
                self.pos += 1;
                self.skip_whitespace();
                if self.eat(b']') {
                    Value::Array(Vec::new())
                } else {
                    stack.push(Frame::Array(Vec::new()));
                    return Ok(None);
                }
            }
            Some(b'{') => {
                self.pos += 1;
                self.skip_whitespace();
                if self.eat(b'}') {
                    Value::Object(Vec::new())
                } else {
                    let name = self.member_name()?;
                    stack.push(Frame::Object(Vec::new(), name));
                    return Ok(None);
                }
            }
            Some(b'"') => Value::Str(self.string()?),
            Some(b'-') | Some(b'0'..=b'9') => self.number()?,
            _ => self.literal()?,
        };
        Ok(Some(value))
    }

    fn literal(&mut self) -> Result<Value, JsonError> {
        let (word, value): (&[u8], Value) = match self.peek() {
            Some(b'n') => (b"null", Value::Null),
            Some(b't') => (b"true", Value::Bool(true)),
            Some(b'f') => (b"false", Value::Bool(false)),
            _ => return Err(self.error("Expecting value", self.pos)),
        };
        if !self.rest().starts_with(word) {
            return Err(self.error("Expecting value", self.pos));
        }
        self.pos += word.len();
        Ok(value)
    }

    /// After an item: true at a comma (another item follows), false at `close`.
    fn comma_or_close(&mut self, close: u8) -> Result<bool, JsonError> {
        self.skip_whitespace();
        if self.eat(close) {
            return Ok(false);
        }
        if self.eat(b',') {
            return Ok(true);
        }
        Err(self.error("Expecting ',' delimiter", self.pos))
    }

    /// A member's name and its colon.
    fn member_name(&mut self) -> Result<String, JsonError> {
        self.skip_whitespace();
        if self.peek() != Some(b'"') {
            return Err(self.error("Expecting property name enclosed in double quotes", self.pos));
        }
        let name = self.string()?;
        self.skip_whitespace();
        if !self.eat(b':') {
            return Err(self.error("Expecting ':' delimiter", self.pos));
        }
        Ok(name)
    }

    /// A string from its opening quote: plain runs are copied whole, so the
    /// work is linear in the string's length.
    fn string(&mut self) -> Result<String, JsonError> {
        let start = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while matches!(self.peek(), Some(byte) if byte != b'"' && byte != b'\\' && byte >= 0x20) {
                self.pos += 1;
            }
            // The run ends at an ASCII byte or the end, so on a char boundary.
            out.push_str(self.text.get(run..self.pos).unwrap_or_default());
            match self.peek() {
                None => return Err(self.error("Unterminated string starting at", start)),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => self.escape(&mut out, start)?,
                Some(_) => return Err(self.error("Invalid control character at", self.pos)),
            }
        }
    }

    fn escape(&mut self, out: &mut String, start: usize) -> Result<(), JsonError> {
        let backslash = self.pos;
        let kind = match self.byte_at(backslash + 1) {
            Some(kind) => kind,
            None => return Err(self.error("Unterminated string starting at", start)),
        };
        self.pos = backslash + 2;
        let decoded = match kind {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => self.unicode_escape(backslash)?,
            _ => return Err(self.error("Invalid \\escape", backslash)),
        };
        out.push(decoded);
        Ok(())
    }

    /// `\uXXXX`, or a surrogate pair of two; a surrogate alone is refused, as
    /// a Rust string cannot hold it.
    fn unicode_escape(&mut self, backslash: usize) -> Result<char, JsonError> {
        let first = self.hex4(backslash + 2)?;
        self.pos = backslash + 6;
        let code = match first {
            0xd800..=0xdbff if self.rest().starts_with(b"\\u") => {
                let second = self.hex4(self.pos + 2)?;
                if (0xdc00..=0xdfff).contains(&second) {
                    self.pos += 6;
                    Some(0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00))
                } else {
                    None
                }
            }
            _ => Some(first),
        };
        match code.and_then(char::from_u32) {
            Some(decoded) => Ok(decoded),
            None => Err(self.error(&format!("Unpaired surrogate \\u{:04x}", first), backslash)),
        }
    }

    /// The four hex digits at `at`; the error names the `u` before them.
    fn hex4(&self, at: usize) -> Result<u32, JsonError> {
        match self.text.as_bytes().get(at..at + 4) {
            Some(digits) if digits.iter().all(u8::is_ascii_hexdigit) => {
                Ok(digits.iter().fold(0, |code, &digit| code * 16 + (digit as char).to_digit(16).unwrap_or(0)))
            }
            _ => Err(self.error("Invalid \\uXXXX escape", at - 1)),
        }
    }

    /// Python's number: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, the
    /// longest prefix that matches; what follows is left to the caller ("1."
    /// is the number 1 and then "Extra data", as in Python).
    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let mut end = start;
        if self.byte_at(end) == Some(b'-') {
            end += 1;
        }
        match self.byte_at(end) {
            Some(b'0') => end += 1,
            Some(b'1'..=b'9') => end = self.digits_end(end),
            _ => return Err(self.error("Expecting value", start)),
        }
        let mut integral = true;
        if self.byte_at(end) == Some(b'.') && self.is_digit_at(end + 1) {
            end = self.digits_end(end + 1);
            integral = false;
        }
        if matches!(self.byte_at(end), Some(b'e') | Some(b'E')) {
            let mut exponent = end + 1;
            if matches!(self.byte_at(exponent), Some(b'+') | Some(b'-')) {
                exponent += 1;
            }
            if self.is_digit_at(exponent) {
                end = self.digits_end(exponent);
                integral = false;
            }
        }
        self.pos = end;
        let literal = self.text.get(start..end).unwrap_or_default();
        if integral {
            if let Ok(number) = literal.parse::<i64>() {
                return Ok(Value::Int(number));
            }
        }
        // Beyond i64, or a fraction/exponent; overflow reads as inf, as in Python.
        literal.parse::<f64>().map(Value::Float).map_err(|_| self.error("Expecting value", start))
    }

    fn digits_end(&self, mut at: usize) -> usize {
        while self.is_digit_at(at) {
            at += 1;
        }
        at
    }

    fn is_digit_at(&self, at: usize) -> bool {
        matches!(self.byte_at(at), Some(b'0'..=b'9'))
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ') | Some(b'\t') | Some(b'\n') | Some(b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn peek(&self) -> Option<u8> {
        self.byte_at(self.pos)
    }

    fn byte_at(&self, at: usize) -> Option<u8> {
        self.text.as_bytes().get(at).copied()
    }

    fn rest(&self) -> &'a [u8] {
        self.text.as_bytes().get(self.pos..).unwrap_or_default()
    }

    /// `what` at byte `at`, placed as Python places it: line, column and
    /// offset counted in characters.
    fn error(&self, what: &str, at: usize) -> JsonError {
        let before = self.text.as_bytes().get(..at).unwrap_or_default();
        let line_start = before.iter().rposition(|&byte| byte == b'\n').map_or(0, |newline| newline + 1);
        let line = before.iter().filter(|&&byte| byte == b'\n').count() + 1;
        let column = count_chars(before.get(line_start..).unwrap_or_default()) + 1;
        JsonError(format!("{}: line {} column {} (char {})", what, line, column, count_chars(before)))
    }
}

/// Characters in valid UTF-8: every byte but the continuation bytes.
fn count_chars(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&byte| byte & 0xc0 != 0x80).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPTH: usize = 64;

    fn ok(data: &[u8]) -> Value {
        match parse(data, DEPTH) {
            Ok(value) => value,
            Err(err) => panic!("{:?}: {}", String::from_utf8_lossy(data), err),
        }
    }

    fn err(data: &[u8]) -> String {
        match parse(data, DEPTH) {
            Ok(value) => panic!("{:?} parsed as {:?}", String::from_utf8_lossy(data), value),
            Err(err) => err.to_string(),
        }
    }

    fn s(text: &str) -> Value {
        Value::Str(text.to_string())
    }

    #[test]
    fn valid_documents() {
        let cases: Vec<(&[u8], Value)> = vec![
            (b"null", Value::Null),
            (b" true ", Value::Bool(true)),
            (b"\t\r\n false", Value::Bool(false)),
            (b"42", Value::Int(42)),
            (b"-0", Value::Int(0)),
            (b"-0.0", Value::Float(-0.0)),
            (b"9223372036854775807", Value::Int(i64::MAX)),
            (b"-9223372036854775808", Value::Int(i64::MIN)),
            (b"9223372036854775808", Value::Float(9223372036854775808.0)),
            (b"1.5", Value::Float(1.5)),
            (b"1E+2", Value::Float(100.0)),
            (b"1e-2", Value::Float(0.01)),
            (b"1e400", Value::Float(f64::INFINITY)),
            (b"-1e400", Value::Float(f64::NEG_INFINITY)),
            (b"1e-400", Value::Float(0.0)),
            (b"\"Hello world!\"", s("Hello world!")),
            (b"\"\\u0000\"", s("\0")),
            (b"\"\\/\\\\\\\"\\b\\f\\n\\r\\t\"", s("/\\\"\u{8}\u{c}\n\r\t")),
            (b"\"\\u00e9\\u00E9\"", s("\u{e9}\u{e9}")),
            (b"\"\\ud83d\\ude00\"", s("\u{1f600}")),
            (b"\"\\uD83D\\uDE00\"", s("\u{1f600}")),
            ("\"é€😀\"".as_bytes(), s("é€😀")),
            (b"\"a\x7fb\"", s("a\u{7f}b")),
            (b"[]", Value::Array(vec![])),
            (b"[ ]", Value::Array(vec![])),
            (b"{ }", Value::Object(vec![])),
            (
                b"[1, [2, []], {}]",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Array(vec![Value::Int(2), Value::Array(vec![])]),
                    Value::Object(vec![]),
                ]),
            ),
            (b"{\"\\u0000\":1}", Value::Object(vec![("\0".to_string(), Value::Int(1))])),
            (
                b"{\"a\" : 1 , \"a\":2}",
                Value::Object(vec![("a".to_string(), Value::Int(1)), ("a".to_string(), Value::Int(2))]),
            ),
            // Python decodes bytes with a BOM as utf-8-sig.
            (b"\xef\xbb\xbf{}", Value::Object(vec![])),
        ];
        for (data, expected) in cases {
            assert_eq!(ok(data), expected, "{:?}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn rfc8259_examples() {
        let image = ok(br#"{
              "Image": {
                  "Width":  800,
                  "Height": 600,
                  "Title":  "View from 15th Floor",
                  "Thumbnail": {
                      "Url":    "http://www.example.com/image/481989943",
                      "Height": 125,
                      "Width":  100
                  },
                  "Animated" : false,
                  "IDs": [116, 943, 234, 38793]
                }
            }"#);
        let inner = image.get("Image").unwrap();
        assert_eq!(inner.get("Width").and_then(Value::as_i64), Some(800));
        assert_eq!(inner.get("Title").and_then(Value::as_str), Some("View from 15th Floor"));
        assert_eq!(inner.get("Thumbnail").and_then(|t| t.get("Width")).and_then(Value::as_i64), Some(100));
        assert_eq!(inner.get("Animated").and_then(Value::as_bool), Some(false));
        let ids: Vec<i64> =
            inner.get("IDs").and_then(Value::as_array).unwrap().iter().filter_map(Value::as_i64).collect();
        assert_eq!(ids, vec![116, 943, 234, 38793]);

        let places = ok(br#"[
              {
                 "precision": "zip",
                 "Latitude":  37.7668,
                 "Longitude": -122.3959,
                 "Address":   "",
                 "City":      "SAN FRANCISCO",
                 "State":     "CA",
                 "Zip":       "94107",
                 "Country":   "US"
              },
              {
                 "precision": "zip",
                 "Latitude":  37.371991,
                 "Longitude": -122.026020,
                 "Address":   "",
                 "City":      "SUNNYVALE",
                 "State":     "CA",
                 "Zip":       "94085",
                 "Country":   "US"
              }
            ]"#);
        let places = places.as_array().unwrap();
        assert_eq!(places.len(), 2);
        assert_eq!(places[1].get("Longitude"), Some(&Value::Float(-122.02602)));
        assert_eq!(places[1].get("City").and_then(Value::as_str), Some("SUNNYVALE"));
        assert_eq!(places[0].get("Address").and_then(Value::as_str), Some(""));
        assert_eq!(places[0].as_object().map(<[_]>::len), Some(8));
    }

    /// Messages as Python 3.11's json.loads(bytes) gives them (checked there),
    /// except where marked.
    #[test]
    fn invalid_documents() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "Expecting value: line 1 column 1 (char 0)"),
            (b"  ", "Expecting value: line 1 column 3 (char 2)"),
            (b"\n\n  x", "Expecting value: line 3 column 3 (char 4)"),
            (b"[1,]", "Expecting value: line 1 column 4 (char 3)"),
            (b"[1,,2]", "Expecting value: line 1 column 4 (char 3)"),
            (b"{\"a\":1,}", "Expecting property name enclosed in double quotes: line 1 column 8 (char 7)"),
            (b"{1:2}", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
            (b"{", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
            (b"01", "Extra data: line 1 column 2 (char 1)"),
            (b"-01", "Extra data: line 1 column 3 (char 2)"),
            (b"1.", "Extra data: line 1 column 2 (char 1)"),
            (b"1e", "Extra data: line 1 column 2 (char 1)"),
            (b"1e+", "Extra data: line 1 column 2 (char 1)"),
            (b"[1.5e]", "Expecting ',' delimiter: line 1 column 5 (char 4)"),
            (b"[01]", "Expecting ',' delimiter: line 1 column 3 (char 2)"),
            (b".5", "Expecting value: line 1 column 1 (char 0)"),
            (b"-", "Expecting value: line 1 column 1 (char 0)"),
            (b"[-]", "Expecting value: line 1 column 2 (char 1)"),
            (b"+1", "Expecting value: line 1 column 1 (char 0)"),
            (b"nul", "Expecting value: line 1 column 1 (char 0)"),
            (b"[true,nul]", "Expecting value: line 1 column 7 (char 6)"),
            (b"True", "Expecting value: line 1 column 1 (char 0)"),
            (b"true false", "Extra data: line 1 column 6 (char 5)"),
            (b"1 2", "Extra data: line 1 column 3 (char 2)"),
            (b"[1]x", "Extra data: line 1 column 4 (char 3)"),
            (b"{\"a\":1}}", "Extra data: line 1 column 8 (char 7)"),
            (b"{}\x00", "Extra data: line 1 column 3 (char 2)"),
            (b"\t[\r1\n]\x0c", "Extra data: line 2 column 2 (char 6)"),
            (b"\x00", "Expecting value: line 1 column 1 (char 0)"),
            (b"[1 2]", "Expecting ',' delimiter: line 1 column 4 (char 3)"),
            (b"[1", "Expecting ',' delimiter: line 1 column 3 (char 2)"),
            (b"{\"a\":1", "Expecting ',' delimiter: line 1 column 7 (char 6)"),
            (b"{\"a\":1 \"b\":2}", "Expecting ',' delimiter: line 1 column 8 (char 7)"),
            (b"{\"a\" 1}", "Expecting ':' delimiter: line 1 column 6 (char 5)"),
            (b"{\"a\"", "Expecting ':' delimiter: line 1 column 5 (char 4)"),
            (b"{\"a\":", "Expecting value: line 1 column 6 (char 5)"),
            (b"[", "Expecting value: line 1 column 2 (char 1)"),
            (b"\"abc", "Unterminated string starting at: line 1 column 1 (char 0)"),
            (b"\"\\", "Unterminated string starting at: line 1 column 1 (char 0)"),
            (b"\"\x01\"", "Invalid control character at: line 1 column 2 (char 1)"),
            (b"[\"a\nb\"]", "Invalid control character at: line 1 column 4 (char 3)"),
            (b"\"a\tb\"", "Invalid control character at: line 1 column 3 (char 2)"),
            ("\"é\x01\"".as_bytes(), "Invalid control character at: line 1 column 3 (char 2)"),
            (b"\"\\x\"", "Invalid \\escape: line 1 column 2 (char 1)"),
            ("\"é\\q\"".as_bytes(), "Invalid \\escape: line 1 column 3 (char 2)"),
            (b"\"\\u12\"", "Invalid \\uXXXX escape: line 1 column 3 (char 2)"),
            (b"\"\\u12x4\"", "Invalid \\uXXXX escape: line 1 column 3 (char 2)"),
            (b"\"\\u", "Invalid \\uXXXX escape: line 1 column 3 (char 2)"),
            (b"\"\\ud83d\\u12\"", "Invalid \\uXXXX escape: line 1 column 9 (char 8)"),
            (b"\"\\ud83d\\u12zz\"", "Invalid \\uXXXX escape: line 1 column 9 (char 8)"),
            ("é".as_bytes(), "Expecting value: line 1 column 1 (char 0)"),
            ("\u{feff}\né x".as_bytes(), "Expecting value: line 2 column 1 (char 1)"),
            // Python: one BOM is skipped, a second one is no value.
            (b"\xef\xbb\xbf", "Expecting value: line 1 column 1 (char 0)"),
            (b"\xef\xbb\xbf\xef\xbb\xbf1", "Expecting value: line 1 column 1 (char 0)"),
            (b" \xef\xbb\xbf1", "Expecting value: line 1 column 2 (char 1)"),
            // UTF-8 is checked first, as Python decodes first.
            (b"\xff", "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
            (b"[1,\xff", "'utf-8' codec can't decode byte 0xff in position 3: invalid start byte"),
            (b"\xef\xbb\xbf\"\xff\"", "'utf-8' codec can't decode byte 0xff in position 1: invalid start byte"),
            (b"\"\x80", "'utf-8' codec can't decode byte 0x80 in position 1: invalid start byte"),
            (b"\"\xc0\xaf\"", "'utf-8' codec can't decode byte 0xc0 in position 1: invalid start byte"),
            (b"\"\xc1\x81\"", "'utf-8' codec can't decode byte 0xc1 in position 1: invalid start byte"),
            (b"\"\xe0\x80\xaf\"", "'utf-8' codec can't decode byte 0xe0 in position 1: invalid continuation byte"),
            (b"\"\xf8\"", "'utf-8' codec can't decode byte 0xf8 in position 1: invalid start byte"),
            (b"\"\xe2\x82\"", "'utf-8' codec can't decode bytes in position 1-2: invalid continuation byte"),
            (b"\"\xe2\x82", "'utf-8' codec can't decode bytes in position 1-2: unexpected end of data"),
            (b"\"\xe2", "'utf-8' codec can't decode byte 0xe2 in position 1: unexpected end of data"),
            (b"\"\xf4\x90\x80\x80\"", "'utf-8' codec can't decode byte 0xf4 in position 1: invalid continuation byte"),
            // Differences from Python, which accepts these.
            (b"NaN", "Expecting value: line 1 column 1 (char 0)"),
            (b"Infinity", "Expecting value: line 1 column 1 (char 0)"),
            (b"[-Infinity]", "Expecting value: line 1 column 2 (char 1)"),
            (b"\"\\ud800\"", "Unpaired surrogate \\ud800: line 1 column 2 (char 1)"),
            (b"\"\\ude00\"", "Unpaired surrogate \\ude00: line 1 column 2 (char 1)"),
            (b"\"\\ud83dx\"", "Unpaired surrogate \\ud83d: line 1 column 2 (char 1)"),
            (b"\"\\ud83d\\u0041\"", "Unpaired surrogate \\ud83d: line 1 column 2 (char 1)"),
            (b"\"\\ud83d\\ud83d\"", "Unpaired surrogate \\ud83d: line 1 column 2 (char 1)"),
            // Python: "Unterminated string", past the lone surrogate.
            (b"\"\\ud83d\\\"", "Unpaired surrogate \\ud83d: line 1 column 2 (char 1)"),
            (b"\"\xed\xa0\x80\"", "'utf-8' codec can't decode byte 0xed in position 1: invalid continuation byte"),
            // Python: "Invalid \uXXXX escape" (it wants a byte after the four digits).
            (b"\"\\u1234", "Unterminated string starting at: line 1 column 1 (char 0)"),
            (b"/* c */ 1", "Expecting value: line 1 column 1 (char 0)"),
            (b"'a'", "Expecting value: line 1 column 1 (char 0)"),
            (b"\xc2\xa01", "Expecting value: line 1 column 1 (char 0)"),
        ];
        for (data, expected) in cases {
            assert_eq!(err(data), *expected, "{:?}", String::from_utf8_lossy(data));
        }
    }

    fn nested(depth: usize, open: &str, close: &str) -> Vec<u8> {
        format!("{}{}", open.repeat(depth), close.repeat(depth)).into_bytes()
    }

    #[test]
    fn nesting_is_bounded() {
        assert!(parse(&nested(DEPTH, "[", "]"), DEPTH).is_ok());
        assert!(parse(&nested(DEPTH, "{\"a\":[", "]}"), 2 * DEPTH).is_ok());
        assert_eq!(
            parse(&nested(DEPTH + 1, "[", "]"), DEPTH).unwrap_err().to_string(),
            "Nesting deeper than 64 levels: line 1 column 65 (char 64)"
        );
        assert!(parse(&nested(DEPTH, "{\"a\":[", "]}"), 2 * DEPTH - 1).is_err());
        assert_eq!(parse(b"1", 0), Ok(Value::Int(1)));
        assert!(parse(b"[]", 0).is_err());
        // 16 MiB of brackets: refused at the limit, with no deep recursion.
        let deep = vec![b'['; 16 << 20];
        assert_eq!(
            parse(&deep, 512).unwrap_err().to_string(),
            "Nesting deeper than 512 levels: line 1 column 513 (char 512)"
        );
        let mut wide = b"[".to_vec();
        wide.extend(b"[],".repeat(1 << 20));
        wide.extend(b"[]]");
        assert_eq!(parse(&wide, 2).map(|value| value.as_array().map(<[_]>::len)), Ok(Some((1 << 20) + 1)));
    }

    /// Inputs of megabytes (a long string, many members, long numbers) read to
    /// the right values (their time is hack/bench's to measure).
    #[test]
    fn large_inputs_read_to_their_values() {
        let mut long = b"\"".to_vec();
        long.extend(b"abc\\n\xc3\xa9".repeat(2 << 20));
        long.push(b'"');
        let text = ok(&long);
        assert_eq!(text.as_str().map(str::len), Some(6 << 21));

        let mut many = b"{".to_vec();
        for index in 0..200_000 {
            many.extend(format!("\"k{}\":{},", index, index).as_bytes());
        }
        many.extend(b"\"k0\":-1}");
        let object = ok(&many);
        assert_eq!(object.as_object().map(<[_]>::len), Some(200_001));
        assert_eq!(object.get("k0").and_then(Value::as_i64), Some(-1));
        assert_eq!(object.get("k199999").and_then(Value::as_i64), Some(199_999));

        let digits = vec![b'7'; 1 << 20];
        assert_eq!(ok(&digits), Value::Float(f64::INFINITY));
        let mut fraction = b"0.".to_vec();
        fraction.extend(vec![b'3'; 1 << 20]);
        assert!(matches!(ok(&fraction), Value::Float(f) if (f - 1.0 / 3.0).abs() < 1e-15));
    }

    #[test]
    fn accessors() {
        let value = ok(b"{\"s\":\"x\",\"i\":3,\"f\":3.0,\"b\":true,\"a\":[null],\"o\":{},\"s\":\"last\"}");
        assert_eq!(value.get("s").and_then(Value::as_str), Some("last"));
        assert_eq!(value.get("i").and_then(Value::as_i64), Some(3));
        assert_eq!(value.get("f").and_then(Value::as_i64), None);
        assert_eq!(value.get("b").and_then(Value::as_bool), Some(true));
        assert_eq!(value.get("a").and_then(Value::as_array), Some(&[Value::Null][..]));
        assert_eq!(value.get("o").and_then(Value::as_object).map(<[_]>::len), Some(0));
        assert_eq!(value.get("missing"), None);
        assert_eq!(value.get("i").and_then(|i| i.get("i")), None);
        assert_eq!(ok(b"[\"s\"]").get("s"), None);
        assert_eq!(value.get("s").and_then(Value::as_i64), None);
        assert_eq!(value.get("i").and_then(Value::as_str), None);
    }

    /// A seeded xorshift64*, so failures repeat.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// What random strings are made of: escapes, controls, all UTF-8 lengths.
    const CHARS: &str = "aZ0 \"\\/\n\t\0\u{1f}\u{7f}é€\u{ffff}😀\u{10ffff}";

    fn random_value(rng: &mut Rng, depth: usize) -> Value {
        let kinds = if depth == 0 { 5 } else { 7 };
        match rng.below(kinds) {
            0 => Value::Null,
            1 => Value::Bool(rng.below(2) == 1),
            2 => Value::Int(match rng.below(3) {
                0 => rng.below(100) as i64,
                1 => -(rng.below(1000) as i64),
                _ => rng.next() as i64,
            }),
            3 => {
                let float = f64::from_bits(rng.next());
                Value::Float(if float.is_finite() { float } else { rng.below(1000) as f64 / 8.0 })
            }
            4 => Value::Str(random_string(rng)),
            5 => Value::Array((0..rng.below(5)).map(|_| random_value(rng, depth - 1)).collect()),
            _ => Value::Object((0..rng.below(5)).map(|_| (random_string(rng), random_value(rng, depth - 1))).collect()),
        }
    }

    fn random_string(rng: &mut Rng) -> String {
        let count = CHARS.chars().count() as u64;
        (0..rng.below(8)).filter_map(|_| CHARS.chars().nth(rng.below(count) as usize)).collect()
    }

    fn write_space(rng: &mut Rng, out: &mut String) {
        for _ in 0..rng.below(3) {
            out.push([' ', '\t', '\n', '\r'][rng.below(4) as usize]);
        }
    }

    fn write_string(rng: &mut Rng, text: &str, out: &mut String) {
        out.push('"');
        for c in text.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '/' if rng.below(2) == 0 => out.push_str("\\/"),
                '\n' if rng.below(2) == 0 => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 || rng.below(4) == 0 => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{:04x}", unit));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    fn write_value(rng: &mut Rng, value: &Value, out: &mut String) {
        write_space(rng, out);
        match value {
            Value::Null => out.push_str("null"),
            Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
            Value::Int(number) => out.push_str(&number.to_string()),
            // Debug is the shortest text that reads back to the same float and
            // always has a '.' or an exponent ("1.0", "1e-7").
            Value::Float(number) => out.push_str(&format!("{:?}", number)),
            Value::Str(text) => write_string(rng, text, out),
            Value::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write_value(rng, item, out);
                }
                write_space(rng, out);
                out.push(']');
            }
            Value::Object(members) => {
                out.push('{');
                for (index, (name, item)) in members.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    write_space(rng, out);
                    write_string(rng, name, out);
                    write_space(rng, out);
                    out.push(':');
                    write_value(rng, item, out);
                }
                write_space(rng, out);
                out.push('}');
            }
        }
        write_space(rng, out);
    }

    #[test]
    fn random_documents_read_back() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..5000 {
            let value = random_value(&mut rng, 4);
            let mut text = String::new();
            write_value(&mut rng, &value, &mut text);
            assert_eq!(parse(text.as_bytes(), 4), Ok(value), "{:?}", text);
            // Cut short, the same text is an error, never a panic.
            let cut = rng.below(text.len() as u64) as usize;
            let _ = parse(text.as_bytes().get(..cut).unwrap(), 4);
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng(7);
        let alphabet = b"[]{}\",:\\u0123456789abcdefABCDEF-+.eEtrufalsn \t\n\r\x00\x1f\xc3\xa9\xed\xff";
        for _ in 0..20_000 {
            let data: Vec<u8> =
                (0..rng.below(24)).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]).collect();
            let _ = parse(&data, 3);
        }
    }
}
