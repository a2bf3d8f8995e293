//! Replies: the [`Value`] a command answers with, and its encoding for a RESP2 or a
//! RESP3 client.
//!
//! A command builds one `Value` whatever protocol its client speaks; [`encode`]
//! writes it in the client's protocol. RESP3-only types are downgraded for a RESP2
//! client exactly as Redis downgrades them (its `addReplyMap`, `addReplyDouble`, …):
//!
//! | value              | RESP3                      | RESP2                         |
//! | ------------------ | -------------------------- | ----------------------------- |
//! | `Null`             | `_\r\n`                    | `$-1\r\n` (null bulk string)  |
//! | `NullArray`        | `_\r\n`                    | `*-1\r\n` (null array)        |
//! | `Map` of n pairs   | `%n` then key, value, …    | `*2n` then key, value, …      |
//! | `Set` of n         | `~n` then the members      | `*n` then the members         |
//! | `Push` of n        | `>n` then the elements     | `*n` then the elements        |
//! | `Double(d)`        | `,<d>\r\n`                 | bulk string of the same text  |
//! | `Boolean(b)`       | `#t\r\n` / `#f\r\n`        | `:1\r\n` / `:0\r\n`           |
//! | `BigNumber(n)`     | `(<n>\r\n`                 | bulk string of the digits     |
//! | `Verbatim{f, t}`   | `=<len>\r\n<f>:<t>\r\n`    | bulk string of `t` alone      |
//!
//! Downgrading applies inside aggregates too (a map inside an array is flattened).
//! [`Value::downgraded`] gives the value a client of either protocol reads back.
//!
//! # Invariants
//!
//! - Simple strings, errors and big numbers are single lines on the wire: [`encode`]
//!   writes a CR or LF inside them as a space (Redis does this to error messages,
//!   which can echo client bytes), so no value can break the framing.
//! - Encoding recurses once per nesting level: it is meant for the replies a server
//!   builds, not for values nested thousands deep (the reply parser refuses those
//!   beyond its `depth_max`).

use crate::num::{push_i64, push_usize};

/// The protocol a connection speaks: RESP2 until the client says `HELLO 3`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Protocol {
    #[default]
    Resp2,
    Resp3,
}

impl Protocol {
    /// The protocol `HELLO <protover>` asks for, or `None` for a version Redis
    /// refuses (it answers [`crate::errors::noproto`]).
    pub fn from_version(version: i64) -> Option<Protocol> {
        match version {
            2 => Some(Protocol::Resp2),
            3 => Some(Protocol::Resp3),
            _ => None,
        }
    }

    /// The number `HELLO` reports in its `proto` field.
    pub fn version(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// One reply (or one element of an aggregate reply), RESP2 and RESP3 types alike.
///
/// Strings are bytes: Redis keys, values and even error messages (which echo the
/// client's arguments) are binary.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `+OK`: a short status line, no CR or LF.
    SimpleString(Vec<u8>),
    /// `-ERR ...`: the whole error line after the `-`, code included
    /// (`ERR syntax error`, `WRONGTYPE ...`). See [`crate::errors`].
    /// The reply parser also reads RESP3 blob errors (`!`) into this variant.
    Error(Vec<u8>),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nfoo`: binary safe.
    BulkString(Vec<u8>),
    /// A missing value: `$-1` in RESP2 (e.g. GET of a missing key), `_` in RESP3.
    Null,
    /// A missing aggregate: `*-1` in RESP2, `_` in RESP3.
    NullArray,
    /// `*n`.
    Array(Vec<Value>),
    /// RESP3 `%n`: pairs in the order given (Redis replies keep their own order).
    Map(Vec<(Value, Value)>),
    /// RESP3 `~n`.
    Set(Vec<Value>),
    /// RESP3 `,`: any `f64`, including the infinities and NaN.
    Double(f64),
    /// RESP3 `#t` / `#f`.
    Boolean(bool),
    /// RESP3 `(`: an integer of any size, as its decimal digits with an optional
    /// leading `-`.
    BigNumber(String),
    /// RESP3 `=`: text with a three-byte format (`txt`, `mkd`), shown as is by
    /// `redis-cli` (INFO and LATENCY DOCTOR use it).
    Verbatim { format: [u8; 3], text: Vec<u8> },
    /// RESP3 `>`: out-of-band data (pub/sub messages, invalidations).
    Push(Vec<Value>),
}

impl Value {
    /// `+OK`.
    pub fn ok() -> Value {
        Value::SimpleString(b"OK".to_vec())
    }

    /// A status reply such as `PONG` or `QUEUED`.
    pub fn simple(text: &str) -> Value {
        Value::SimpleString(text.as_bytes().to_vec())
    }

    /// An error reply; `line` starts with its code (`ERR`, `WRONGTYPE`, `MOVED`, …).
    pub fn error(line: impl Into<Vec<u8>>) -> Value {
        Value::Error(line.into())
    }

    /// A bulk string.
    pub fn bulk(bytes: impl Into<Vec<u8>>) -> Value {
        Value::BulkString(bytes.into())
    }

    /// A verbatim `txt` string (RESP3), a plain bulk string for RESP2 clients.
    pub fn verbatim_text(text: impl Into<Vec<u8>>) -> Value {
        Value::Verbatim {
            format: *b"txt",
            text: text.into(),
        }
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Value::Error(_))
    }

    /// An error reply's code: the bytes before its first space (`ERR`, `MOVED`).
    pub fn error_code(&self) -> Option<&[u8]> {
        match self {
            Value::Error(line) => Some(line.split(|&b| b == b' ').next().unwrap_or(line)),
            _ => None,
        }
    }

    /// Appends this value's encoding for a client of `protocol` to `out`.
    pub fn encode(&self, protocol: Protocol, out: &mut Vec<u8>) {
        encode(self, protocol, out);
    }

    /// The value a client speaking `protocol` reads back from
    /// `encode(self, protocol)`: RESP3-only types replaced as in the table of the
    /// module docs for RESP2, and the two nulls merged for RESP3.
    pub fn downgraded(&self, protocol: Protocol) -> Value {
        let down = |items: &[Value]| items.iter().map(|v| v.downgraded(protocol)).collect();
        match (self, protocol) {
            (Value::NullArray, Protocol::Resp3) => Value::Null,
            (Value::Array(items), _) => Value::Array(down(items)),
            (Value::Set(items), Protocol::Resp3) => Value::Set(down(items)),
            (Value::Push(items), Protocol::Resp3) => Value::Push(down(items)),
            (Value::Set(items) | Value::Push(items), Protocol::Resp2) => Value::Array(down(items)),
            (Value::Map(pairs), Protocol::Resp3) => Value::Map(
                pairs
                    .iter()
                    .map(|(k, v)| (k.downgraded(protocol), v.downgraded(protocol)))
                    .collect(),
            ),
            (Value::Map(pairs), Protocol::Resp2) => Value::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [k.downgraded(protocol), v.downgraded(protocol)])
                    .collect(),
            ),
            (Value::Double(d), Protocol::Resp2) => {
                Value::BulkString(format_double(*d).into_bytes())
            }
            (Value::Boolean(b), Protocol::Resp2) => Value::Integer(i64::from(*b)),
            (Value::BigNumber(n), Protocol::Resp2) => Value::BulkString(n.clone().into_bytes()),
            (Value::Verbatim { text, .. }, Protocol::Resp2) => Value::BulkString(text.clone()),
            (other, _) => other.clone(),
        }
    }
}

/// Appends the encoding of `value` for a client speaking `protocol` to `out`.
pub fn encode(value: &Value, protocol: Protocol, out: &mut Vec<u8>) {
    let resp3 = protocol == Protocol::Resp3;
    match value {
        Value::SimpleString(text) => push_line(out, b'+', text),
        Value::Error(line) => push_line(out, b'-', line),
        Value::Integer(n) => {
            out.push(b':');
            push_i64(out, *n);
            out.extend_from_slice(b"\r\n");
        }
        Value::BulkString(bytes) => push_bulk(out, bytes),
        Value::Null if resp3 => out.extend_from_slice(b"_\r\n"),
        Value::Null => out.extend_from_slice(b"$-1\r\n"),
        Value::NullArray if resp3 => out.extend_from_slice(b"_\r\n"),
        Value::NullArray => out.extend_from_slice(b"*-1\r\n"),
        Value::Array(items) => push_aggregate(out, b'*', items, protocol),
        Value::Set(items) => push_aggregate(out, if resp3 { b'~' } else { b'*' }, items, protocol),
        Value::Push(items) => push_aggregate(out, if resp3 { b'>' } else { b'*' }, items, protocol),
        Value::Map(pairs) => {
            if resp3 {
                push_header(out, b'%', pairs.len());
            } else {
                push_header(out, b'*', 2 * pairs.len());
            }
            for (key, val) in pairs {
                encode(key, protocol, out);
                encode(val, protocol, out);
            }
        }
        Value::Double(d) if resp3 => push_line(out, b',', format_double(*d).as_bytes()),
        Value::Double(d) => push_bulk(out, format_double(*d).as_bytes()),
        Value::Boolean(b) if resp3 => out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
        Value::Boolean(b) => out.extend_from_slice(if *b { b":1\r\n" } else { b":0\r\n" }),
        Value::BigNumber(digits) if resp3 => push_line(out, b'(', digits.as_bytes()),
        Value::BigNumber(digits) => push_bulk(out, digits.as_bytes()),
        Value::Verbatim { format, text } if resp3 => {
            push_header(out, b'=', text.len() + 4);
            out.extend_from_slice(format);
            out.push(b':');
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
        Value::Verbatim { text, .. } => push_bulk(out, text),
    }
}

/// The text Redis gives a double (its `d2string`): `inf`, `-inf`, `nan`, integral
/// values without a fraction (`3`, `-0`), others in the shortest form that reads
/// back to the same `f64`, with an exponent when very large or very small
/// (`1e300`, `1.5e-7`).
pub fn format_double(d: f64) -> String {
    if d.is_nan() {
        return "nan".to_string();
    }
    if d.is_infinite() {
        return if d > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    let magnitude = d.abs();
    if magnitude == 0.0 || (1e-5..1e17).contains(&magnitude) {
        format!("{d}")
    } else {
        format!("{d:e}")
    }
}

fn push_header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.push(kind);
    push_usize(out, len);
    out.extend_from_slice(b"\r\n");
}

fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    push_header(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

fn push_aggregate(out: &mut Vec<u8>, kind: u8, items: &[Value], protocol: Protocol) {
    push_header(out, kind, items.len());
    for item in items {
        encode(item, protocol, out);
    }
}

/// A one-line type: a CR or LF inside would end the line early and let the rest be
/// read as another reply, so it goes out as a space.
fn push_line(out: &mut Vec<u8>, kind: u8, text: &[u8]) {
    out.push(kind);
    out.extend(
        text.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(value: &Value, protocol: Protocol) -> String {
        let mut out = Vec::new();
        encode(value, protocol, &mut out);
        String::from_utf8(out).expect("test values are UTF-8")
    }

    fn both(value: &Value) -> (String, String) {
        (enc(value, Protocol::Resp2), enc(value, Protocol::Resp3))
    }

    #[test]
    fn simple_types() {
        assert_eq!(both(&Value::ok()), ("+OK\r\n".into(), "+OK\r\n".into()));
        let err = Value::error("ERR syntax error");
        assert_eq!(enc(&err, Protocol::Resp2), "-ERR syntax error\r\n");
        assert_eq!(enc(&err, Protocol::Resp3), "-ERR syntax error\r\n");
        assert_eq!(enc(&Value::Integer(-42), Protocol::Resp2), ":-42\r\n");
        assert_eq!(
            enc(&Value::Integer(i64::MIN), Protocol::Resp3),
            ":-9223372036854775808\r\n"
        );
        assert_eq!(enc(&Value::bulk("foo"), Protocol::Resp2), "$3\r\nfoo\r\n");
        assert_eq!(enc(&Value::bulk(""), Protocol::Resp3), "$0\r\n\r\n");
    }

    #[test]
    fn bulk_is_binary_safe() {
        let mut out = Vec::new();
        encode(&Value::bulk(&b"a\r\n\0\xff"[..]), Protocol::Resp2, &mut out);
        assert_eq!(out, b"$5\r\na\r\n\0\xff\r\n");
    }

    #[test]
    fn nulls() {
        assert_eq!(both(&Value::Null), ("$-1\r\n".into(), "_\r\n".into()));
        assert_eq!(both(&Value::NullArray), ("*-1\r\n".into(), "_\r\n".into()));
    }

    #[test]
    fn aggregates() {
        let array = Value::Array(vec![Value::Integer(1), Value::bulk("a")]);
        assert_eq!(enc(&array, Protocol::Resp2), "*2\r\n:1\r\n$1\r\na\r\n");
        assert_eq!(enc(&Value::Array(vec![]), Protocol::Resp3), "*0\r\n");
        let map = Value::Map(vec![
            (Value::bulk("k"), Value::Integer(1)),
            (Value::simple("s"), Value::Null),
        ]);
        assert_eq!(
            enc(&map, Protocol::Resp3),
            "%2\r\n$1\r\nk\r\n:1\r\n+s\r\n_\r\n"
        );
        assert_eq!(
            enc(&map, Protocol::Resp2),
            "*4\r\n$1\r\nk\r\n:1\r\n+s\r\n$-1\r\n"
        );
        let set = Value::Set(vec![Value::bulk("x")]);
        assert_eq!(
            both(&set),
            ("*1\r\n$1\r\nx\r\n".into(), "~1\r\n$1\r\nx\r\n".into())
        );
        let push = Value::Push(vec![Value::bulk("message")]);
        assert_eq!(
            both(&push),
            (
                "*1\r\n$7\r\nmessage\r\n".into(),
                ">1\r\n$7\r\nmessage\r\n".into()
            )
        );
    }

    #[test]
    fn downgrade_applies_inside_aggregates() {
        let nested = Value::Array(vec![Value::Map(vec![(
            Value::bulk("a"),
            Value::Boolean(true),
        )])]);
        assert_eq!(
            enc(&nested, Protocol::Resp2),
            "*1\r\n*2\r\n$1\r\na\r\n:1\r\n"
        );
        assert_eq!(
            nested.downgraded(Protocol::Resp2),
            Value::Array(vec![Value::Array(vec![
                Value::bulk("a"),
                Value::Integer(1)
            ])])
        );
    }

    #[test]
    fn doubles() {
        assert_eq!(
            both(&Value::Double(1.5)),
            ("$3\r\n1.5\r\n".into(), ",1.5\r\n".into())
        );
        assert_eq!(enc(&Value::Double(3.0), Protocol::Resp3), ",3\r\n");
        assert_eq!(
            enc(&Value::Double(f64::INFINITY), Protocol::Resp3),
            ",inf\r\n"
        );
        assert_eq!(
            enc(&Value::Double(f64::NEG_INFINITY), Protocol::Resp3),
            ",-inf\r\n"
        );
        assert_eq!(enc(&Value::Double(f64::NAN), Protocol::Resp3), ",nan\r\n");
        assert_eq!(enc(&Value::Double(-0.0), Protocol::Resp3), ",-0\r\n");
        assert_eq!(enc(&Value::Double(1e300), Protocol::Resp3), ",1e300\r\n");
        assert_eq!(
            enc(&Value::Double(1.5e-7), Protocol::Resp2),
            "$6\r\n1.5e-7\r\n"
        );
        for d in [
            0.1,
            1.0 / 3.0,
            1e16,
            1e17,
            123456.789,
            5e-324,
            f64::MAX,
            f64::MIN_POSITIVE,
        ] {
            let text = format_double(d);
            assert_eq!(text.parse::<f64>().ok(), Some(d), "{text}");
        }
    }

    #[test]
    fn booleans_big_numbers_verbatim() {
        assert_eq!(
            both(&Value::Boolean(true)),
            (":1\r\n".into(), "#t\r\n".into())
        );
        assert_eq!(
            both(&Value::Boolean(false)),
            (":0\r\n".into(), "#f\r\n".into())
        );
        let big = Value::BigNumber("-3492890328409238509324850943850943825024385".into());
        assert_eq!(
            both(&big),
            (
                "$44\r\n-3492890328409238509324850943850943825024385\r\n".into(),
                "(-3492890328409238509324850943850943825024385\r\n".into()
            )
        );
        let verbatim = Value::verbatim_text("Some string");
        assert_eq!(
            both(&verbatim),
            (
                "$11\r\nSome string\r\n".into(),
                "=15\r\ntxt:Some string\r\n".into()
            )
        );
    }

    #[test]
    fn line_types_cannot_break_framing() {
        let err = Value::error(&b"ERR unknown command 'a\r\nb'"[..]);
        assert_eq!(
            enc(&err, Protocol::Resp2),
            "-ERR unknown command 'a  b'\r\n"
        );
        assert_eq!(enc(&Value::simple("x\ny"), Protocol::Resp3), "+x y\r\n");
    }

    #[test]
    fn error_code() {
        assert_eq!(
            Value::error("MOVED 1 h:1").error_code(),
            Some(&b"MOVED"[..])
        );
        assert_eq!(Value::error("ERR").error_code(), Some(&b"ERR"[..]));
        assert_eq!(Value::ok().error_code(), None);
        assert!(Value::error("ERR x").is_error());
    }

    #[test]
    fn protocol_versions() {
        assert_eq!(Protocol::from_version(2), Some(Protocol::Resp2));
        assert_eq!(Protocol::from_version(3), Some(Protocol::Resp3));
        assert_eq!(Protocol::from_version(1), None);
        assert_eq!(Protocol::from_version(4), None);
        assert_eq!(Protocol::Resp3.version(), 3);
        assert_eq!(Protocol::default(), Protocol::Resp2);
    }
}
