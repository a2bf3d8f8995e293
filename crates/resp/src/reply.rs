//! Replies as a client reads them: the streaming parser behind RowanKV's RESP load
//! generator and the tests that talk to a RESP port.
//!
//! It reads RESP2 and RESP3 alike (a client cannot always know which one the next
//! reply uses: a RESP2 connection switches after `HELLO 3`), into a [`Value`]:
//!
//! | wire                         | value                                          |
//! | ---------------------------- | ---------------------------------------------- |
//! | `+`, `-`, `:`, `$`, `*`      | `SimpleString`, `Error`, `Integer`, `BulkString`, `Array` |
//! | `$-1`, `*-1`                 | `Null`, `NullArray`                            |
//! | `_`                          | `Null`                                         |
//! | `%`, `~`, `>`                | `Map`, `Set`, `Push`                           |
//! | `,`, `#`, `(`, `=`           | `Double`, `Boolean`, `BigNumber`, `Verbatim`   |
//! | `!` (blob error)             | `Error`                                        |
//! | `\|` (attribute)             | read and dropped; the value it annotates is returned |
//! | `$?`, `*?`, `;`, `.` (streamed) | refused: Redis never sends them             |
//!
//! # Contract
//!
//! The same as the request parser's: `Ok(Some((value, consumed)))` for a complete
//! reply at the front of the buffer; `Ok(None)` while it is incomplete (call again
//! with the same bytes and more: the parser resumes, keeping the elements it already
//! has); `Err` for bytes that are not RESP, after which the connection is useless
//! and the parser starts afresh. [`parse_reply`] is the stateless form.
//!
//! # Limits
//!
//! | limit               | default       | why                                                     |
//! | ------------------- | ------------- | ------------------------------------------------------- |
//! | `bulk_bytes_max`    | 512 MiB       | Redis's own `proto-max-bulk-len`                        |
//! | `aggregate_len_max` | 2^32 − 1      | hiredis's element limit                                 |
//! | `depth_max`         | 128           | nesting; Redis's deepest replies are under 10 levels    |
//! | `line_bytes_max`    | 1 MiB         | a simple string, error or number line without its CRLF  |
//!
//! The parser keeps its own stack (no recursion), so a nesting bomb (`*1\r\n`
//! repeated) is refused at `depth_max + 1` levels, never a stack overflow. Nothing
//! is allocated for a length before its bytes are there: an aggregate reserves room
//! for at most as many elements as the bytes present could encode (3 bytes each,
//! `_\r\n`), a bulk string is copied once complete.

use crate::num::parse_i64_reply;
use crate::value::Value;

/// Default bound on one bulk string (Redis's `proto-max-bulk-len`).
pub const REPLY_BULK_BYTES_MAX_DEFAULT: usize = 512 * 1024 * 1024;
/// Default bound on the elements of one aggregate.
pub const REPLY_AGGREGATE_LEN_MAX_DEFAULT: usize = u32::MAX as usize;
/// Default bound on nesting.
pub const REPLY_DEPTH_MAX_DEFAULT: usize = 128;
/// The largest `depth_max` accepted: `Value`'s drop, comparison and encoding recurse
/// once per level, so values stay shallow enough for any thread's stack.
pub const REPLY_DEPTH_MAX_LIMIT: usize = 1024;
/// Default bound on a line's content.
pub const REPLY_LINE_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// The smallest encoding of one element, `_\r\n`.
const ELEMENT_BYTES_MIN: usize = 3;

const _: () = assert!(REPLY_DEPTH_MAX_DEFAULT <= REPLY_DEPTH_MAX_LIMIT);

/// The reply parser's bounds (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyLimits {
    pub bulk_bytes_max: usize,
    pub aggregate_len_max: usize,
    pub depth_max: usize,
    pub line_bytes_max: usize,
}

impl Default for ReplyLimits {
    fn default() -> Self {
        ReplyLimits {
            bulk_bytes_max: REPLY_BULK_BYTES_MAX_DEFAULT,
            aggregate_len_max: REPLY_AGGREGATE_LEN_MAX_DEFAULT,
            depth_max: REPLY_DEPTH_MAX_DEFAULT,
            line_bytes_max: REPLY_LINE_BYTES_MAX_DEFAULT,
        }
    }
}

/// Bytes that are not a RESP2/RESP3 reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplyParseError {
    #[error("RESP reply: unknown type byte {0:#04x}")]
    UnknownType(u8),
    #[error("RESP reply: a line does not end with CRLF, or contains a CR")]
    BadLineEnd,
    #[error("RESP reply: a line is longer than line_bytes_max")]
    LineTooLong,
    #[error("RESP reply: invalid length")]
    InvalidLength,
    #[error("RESP reply: bulk string longer than bulk_bytes_max")]
    BulkTooLong,
    #[error("RESP reply: aggregate longer than aggregate_len_max")]
    AggregateTooLong,
    #[error("RESP reply: nested deeper than depth_max")]
    TooDeep,
    #[error("RESP reply: bulk data not followed by CRLF")]
    BulkNotTerminated,
    #[error("RESP reply: invalid integer")]
    InvalidInteger,
    #[error("RESP reply: invalid double")]
    InvalidDouble,
    #[error("RESP reply: invalid boolean")]
    InvalidBoolean,
    #[error("RESP reply: invalid big number")]
    InvalidBigNumber,
    #[error("RESP reply: invalid null")]
    InvalidNull,
    #[error("RESP reply: verbatim string without a 3-byte format and ':'")]
    InvalidVerbatim,
    #[error("RESP reply: streamed strings and aggregates are not supported")]
    Streamed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AggregateKind {
    Array,
    Set,
    Push,
    Map,
    /// Read like a map, then dropped.
    Attribute,
}

/// An aggregate whose elements have not all arrived.
#[derive(Debug)]
struct Open {
    kind: AggregateKind,
    /// Elements still to come (twice the pairs for a map or attribute).
    remaining: usize,
    items: Vec<Value>,
}

/// What one type byte and its line (and data) gave.
enum Item {
    Value(Value),
    Open(AggregateKind, usize),
}

/// The streaming reply parser of one connection.
#[derive(Debug)]
pub struct ReplyParser {
    limits: ReplyLimits,
    /// Where the next element starts in the caller's buffer.
    next_bytes: usize,
    stack: Vec<Open>,
}

impl ReplyParser {
    pub fn new(limits: ReplyLimits) -> ReplyParser {
        assert!(
            (1..=REPLY_DEPTH_MAX_LIMIT).contains(&limits.depth_max),
            "depth_max must be in 1..={REPLY_DEPTH_MAX_LIMIT}"
        );
        assert!(limits.bulk_bytes_max <= i64::MAX as usize / 2);
        assert!(limits.aggregate_len_max <= i64::MAX as usize / 2);
        ReplyParser {
            limits,
            next_bytes: 0,
            stack: Vec::new(),
        }
    }

    pub fn limits(&self) -> ReplyLimits {
        self.limits
    }

    /// Forgets a partly parsed reply.
    pub fn reset(&mut self) {
        self.next_bytes = 0;
        self.stack.clear();
    }

    /// The next complete reply at the front of `buffer` (see the module docs).
    pub fn parse(&mut self, buffer: &[u8]) -> Result<Option<(Value, usize)>, ReplyParseError> {
        let result = self.parse_next(buffer);
        if !matches!(result, Ok(None)) {
            self.reset();
        }
        result
    }

    fn parse_next(&mut self, buffer: &[u8]) -> Result<Option<(Value, usize)>, ReplyParseError> {
        assert!(
            self.next_bytes <= buffer.len(),
            "the buffer lost bytes the parser had read: call parse with the same unconsumed bytes"
        );
        loop {
            let Some((item, next)) = self.parse_item(buffer, self.next_bytes)? else {
                return Ok(None);
            };
            self.next_bytes = next;
            let mut value = match item {
                Item::Value(value) => value,
                Item::Open(kind, len) => {
                    if self.stack.len() >= self.limits.depth_max {
                        return Err(ReplyParseError::TooDeep);
                    }
                    let remaining = match kind {
                        AggregateKind::Map | AggregateKind::Attribute => len * 2,
                        _ => len,
                    };
                    if remaining == 0 {
                        if kind == AggregateKind::Attribute {
                            continue;
                        }
                        close(kind, Vec::new())
                    } else {
                        let reserve = remaining.min((buffer.len() - next) / ELEMENT_BYTES_MIN);
                        self.stack.push(Open {
                            kind,
                            remaining,
                            items: Vec::with_capacity(reserve),
                        });
                        continue;
                    }
                }
            };
            // Hand the finished value up, closing every aggregate it completes.
            loop {
                let Some(mut top) = self.stack.pop() else {
                    return Ok(Some((value, self.next_bytes)));
                };
                top.items.push(value);
                top.remaining -= 1;
                if top.remaining > 0 {
                    self.stack.push(top);
                    break;
                }
                let done = top;
                if done.kind == AggregateKind::Attribute {
                    // The attribute annotates the next value, which is what the
                    // enclosing aggregate (or the caller) is still waiting for.
                    break;
                }
                value = close(done.kind, done.items);
            }
        }
    }

    /// Reads the element at `start`: `Ok(None)` until all of its own bytes (not
    /// its children's) have arrived.
    fn parse_item(
        &self,
        buffer: &[u8],
        start: usize,
    ) -> Result<Option<(Item, usize)>, ReplyParseError> {
        let Some(&kind) = buffer.get(start) else {
            return Ok(None);
        };
        if !matches!(
            kind,
            b'+' | b'-'
                | b':'
                | b'$'
                | b'*'
                | b'_'
                | b','
                | b'#'
                | b'('
                | b'!'
                | b'='
                | b'%'
                | b'~'
                | b'>'
                | b'|'
        ) {
            return Err(match kind {
                b';' | b'.' => ReplyParseError::Streamed,
                other => ReplyParseError::UnknownType(other),
            });
        }
        let Some((line, next)) = self.read_line(buffer, start + 1)? else {
            return Ok(None);
        };
        let value = match kind {
            b'+' => Value::SimpleString(line.to_vec()),
            b'-' => Value::Error(line.to_vec()),
            b':' => Value::Integer(parse_i64_reply(line).ok_or(ReplyParseError::InvalidInteger)?),
            b'_' if line.is_empty() => Value::Null,
            b'_' => return Err(ReplyParseError::InvalidNull),
            b',' => Value::Double(parse_double(line).ok_or(ReplyParseError::InvalidDouble)?),
            b'#' => match line {
                b"t" => Value::Boolean(true),
                b"f" => Value::Boolean(false),
                _ => return Err(ReplyParseError::InvalidBoolean),
            },
            b'(' => {
                Value::BigNumber(parse_big_number(line).ok_or(ReplyParseError::InvalidBigNumber)?)
            }
            b'$' | b'!' | b'=' => {
                let len = parse_length(line)?;
                if len == -1 && kind == b'$' {
                    return Ok(Some((Item::Value(Value::Null), next)));
                }
                let len = usize::try_from(len).map_err(|_| ReplyParseError::InvalidLength)?;
                if len > self.limits.bulk_bytes_max {
                    return Err(ReplyParseError::BulkTooLong);
                }
                let data_end = next + len;
                if buffer.len() < data_end + 2 {
                    return Ok(None);
                }
                if &buffer[data_end..data_end + 2] != b"\r\n" {
                    return Err(ReplyParseError::BulkNotTerminated);
                }
                let data = &buffer[next..data_end];
                let value = match kind {
                    b'$' => Value::BulkString(data.to_vec()),
                    b'!' => Value::Error(data.to_vec()),
                    _ => match data {
                        [a, b, c, b':', text @ ..] => Value::Verbatim {
                            format: [*a, *b, *c],
                            text: text.to_vec(),
                        },
                        _ => return Err(ReplyParseError::InvalidVerbatim),
                    },
                };
                return Ok(Some((Item::Value(value), data_end + 2)));
            }
            _ => {
                let len = parse_length(line)?;
                if len == -1 && kind == b'*' {
                    return Ok(Some((Item::Value(Value::NullArray), next)));
                }
                let len = usize::try_from(len).map_err(|_| ReplyParseError::InvalidLength)?;
                if len > self.limits.aggregate_len_max {
                    return Err(ReplyParseError::AggregateTooLong);
                }
                let aggregate = match kind {
                    b'*' => AggregateKind::Array,
                    b'~' => AggregateKind::Set,
                    b'>' => AggregateKind::Push,
                    b'%' => AggregateKind::Map,
                    _ => AggregateKind::Attribute,
                };
                return Ok(Some((Item::Open(aggregate, len), next)));
            }
        };
        Ok(Some((Item::Value(value), next)))
    }

    /// The line starting at `start` without its CRLF, and the index after it.
    fn read_line<'b>(
        &self,
        buffer: &'b [u8],
        start: usize,
    ) -> Result<Option<(&'b [u8], usize)>, ReplyParseError> {
        let max = self.limits.line_bytes_max;
        let rest = &buffer[start..];
        // The length test comes first and counts bytes, not the newline's position
        // alone, so the error is the same however the stream was split.
        let Some(newline) = rest.iter().position(|&b| b == b'\n') else {
            if rest.len() > max + 1 {
                return Err(ReplyParseError::LineTooLong);
            }
            return Ok(None);
        };
        if newline > max + 1 {
            return Err(ReplyParseError::LineTooLong);
        }
        let Some(line) = rest[..newline].strip_suffix(b"\r") else {
            return Err(ReplyParseError::BadLineEnd);
        };
        if line.contains(&b'\r') {
            return Err(ReplyParseError::BadLineEnd);
        }
        Ok(Some((line, start + newline + 1)))
    }
}

impl Default for ReplyParser {
    fn default() -> Self {
        ReplyParser::new(ReplyLimits::default())
    }
}

/// Parses the first reply of `buffer` with a fresh parser (no resuming).
pub fn parse_reply(
    buffer: &[u8],
    limits: ReplyLimits,
) -> Result<Option<(Value, usize)>, ReplyParseError> {
    ReplyParser::new(limits).parse(buffer)
}

fn close(kind: AggregateKind, items: Vec<Value>) -> Value {
    match kind {
        AggregateKind::Array => Value::Array(items),
        AggregateKind::Set => Value::Set(items),
        AggregateKind::Push => Value::Push(items),
        AggregateKind::Map | AggregateKind::Attribute => {
            let mut pairs = Vec::with_capacity(items.len() / 2);
            let mut items = items.into_iter();
            while let (Some(key), Some(value)) = (items.next(), items.next()) {
                pairs.push((key, value));
            }
            Value::Map(pairs)
        }
    }
}

/// A length: digits, or `-1` (the nulls); `?` is a streamed type.
fn parse_length(line: &[u8]) -> Result<i64, ReplyParseError> {
    if line == b"?" {
        return Err(ReplyParseError::Streamed);
    }
    match parse_i64_reply(line) {
        Some(len) if len >= -1 => Ok(len),
        _ => Err(ReplyParseError::InvalidLength),
    }
}

/// RESP3's double: `[+|-]digits[.digits][e[+|-]digits]`, `inf`, `-inf`, `nan`.
fn parse_double(line: &[u8]) -> Option<f64> {
    match line {
        b"inf" | b"+inf" => return Some(f64::INFINITY),
        b"-inf" => return Some(f64::NEG_INFINITY),
        b"nan" | b"-nan" | b"+nan" => return Some(f64::NAN),
        _ => {}
    }
    // Rust's parser also takes words like "infinity": admit only number characters.
    if !line
        .iter()
        .all(|&b| b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.' | b'e' | b'E'))
    {
        return None;
    }
    std::str::from_utf8(line).ok()?.parse().ok()
}

fn parse_big_number(line: &[u8]) -> Option<String> {
    let digits = match line.split_first() {
        Some((b'-' | b'+', rest)) => rest,
        _ => line,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    String::from_utf8(line.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Option<(Value, usize)>, ReplyParseError> {
        parse_reply(bytes, ReplyLimits::default())
    }

    fn whole(bytes: &[u8]) -> Value {
        match parse(bytes) {
            Ok(Some((value, consumed))) => {
                assert_eq!(
                    consumed,
                    bytes.len(),
                    "{:?}",
                    String::from_utf8_lossy(bytes)
                );
                value
            }
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn resp2_types() {
        assert_eq!(whole(b"+OK\r\n"), Value::ok());
        assert_eq!(
            whole(b"-ERR syntax error\r\n"),
            Value::error("ERR syntax error")
        );
        assert_eq!(whole(b":-7\r\n"), Value::Integer(-7));
        assert_eq!(whole(b":+7\r\n"), Value::Integer(7));
        assert_eq!(whole(b"$3\r\nf\r\n\r\n"), Value::bulk("f\r\n"));
        assert_eq!(whole(b"$0\r\n\r\n"), Value::bulk(""));
        assert_eq!(whole(b"$-1\r\n"), Value::Null);
        assert_eq!(whole(b"*-1\r\n"), Value::NullArray);
        assert_eq!(whole(b"*0\r\n"), Value::Array(vec![]));
        assert_eq!(
            whole(b"*2\r\n:1\r\n*1\r\n+a\r\n"),
            Value::Array(vec![
                Value::Integer(1),
                Value::Array(vec![Value::simple("a")])
            ])
        );
    }

    #[test]
    fn resp3_types() {
        assert_eq!(whole(b"_\r\n"), Value::Null);
        assert_eq!(whole(b",1.5\r\n"), Value::Double(1.5));
        assert_eq!(whole(b",-2E3\r\n"), Value::Double(-2000.0));
        assert_eq!(whole(b",inf\r\n"), Value::Double(f64::INFINITY));
        assert_eq!(whole(b",-inf\r\n"), Value::Double(f64::NEG_INFINITY));
        assert!(matches!(whole(b",nan\r\n"), Value::Double(d) if d.is_nan()));
        assert_eq!(whole(b"#t\r\n"), Value::Boolean(true));
        assert_eq!(whole(b"#f\r\n"), Value::Boolean(false));
        assert_eq!(
            whole(b"(-123456789012345678901234567890\r\n"),
            Value::BigNumber("-123456789012345678901234567890".into())
        );
        assert_eq!(
            whole(b"=15\r\ntxt:Some string\r\n"),
            Value::verbatim_text("Some string")
        );
        assert_eq!(
            whole(b"!21\r\nSYNTAX invalid syntax\r\n"),
            Value::error("SYNTAX invalid syntax")
        );
        assert_eq!(
            whole(b"%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n"),
            Value::Map(vec![
                (Value::simple("first"), Value::Integer(1)),
                (Value::simple("second"), Value::Integer(2))
            ])
        );
        assert_eq!(
            whole(b"~2\r\n+a\r\n+b\r\n"),
            Value::Set(vec![Value::simple("a"), Value::simple("b")])
        );
        assert_eq!(
            whole(b">2\r\n+message\r\n$2\r\nhi\r\n"),
            Value::Push(vec![Value::simple("message"), Value::bulk("hi")])
        );
        assert_eq!(whole(b"%0\r\n"), Value::Map(vec![]));
    }

    #[test]
    fn attributes_are_dropped() {
        assert_eq!(
            whole(b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n:5\r\n"),
            Value::Integer(5)
        );
        assert_eq!(
            whole(b"*2\r\n|1\r\n+ttl\r\n:3600\r\n:1\r\n:2\r\n"),
            Value::Array(vec![Value::Integer(1), Value::Integer(2)])
        );
        assert_eq!(whole(b"|0\r\n+OK\r\n"), Value::ok());
        assert_eq!(parse(b"|1\r\n+a\r\n+b\r\n"), Ok(None));
    }

    #[test]
    fn every_prefix_is_incomplete() {
        let bytes = b"*3\r\n%1\r\n$1\r\nk\r\n=8\r\ntxt:abcd\r\n,1.25\r\n(12\r\n+OK\r\n";
        let (expected, consumed) = parse(bytes).expect("valid").expect("complete");
        assert_eq!(consumed, bytes.len() - 5);
        for cut in 0..consumed {
            assert_eq!(parse(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
        let mut parser = ReplyParser::default();
        for cut in 0..consumed {
            assert_eq!(
                parser.parse(&bytes[..cut]),
                Ok(None),
                "resumed, cut at {cut}"
            );
        }
        assert_eq!(parser.parse(bytes), Ok(Some((expected, consumed))));
    }

    #[test]
    fn errors() {
        let cases: &[(&[u8], ReplyParseError)] = &[
            (b"x\r\n", ReplyParseError::UnknownType(b'x')),
            (b"+OK\n", ReplyParseError::BadLineEnd),
            (b"+O\rK\r\n", ReplyParseError::BadLineEnd),
            (b":1.5\r\n", ReplyParseError::InvalidInteger),
            (
                b":99999999999999999999\r\n",
                ReplyParseError::InvalidInteger,
            ),
            (b"$-2\r\n", ReplyParseError::InvalidLength),
            (b"$x\r\n", ReplyParseError::InvalidLength),
            (b"~-1\r\n", ReplyParseError::InvalidLength),
            (b"!-1\r\n", ReplyParseError::InvalidLength),
            (b"$3\r\nabcd\r\n", ReplyParseError::BulkNotTerminated),
            (b"$536870913\r\n", ReplyParseError::BulkTooLong),
            (b",1.5x\r\n", ReplyParseError::InvalidDouble),
            (b",infinity\r\n", ReplyParseError::InvalidDouble),
            (b",\r\n", ReplyParseError::InvalidDouble),
            (b"#x\r\n", ReplyParseError::InvalidBoolean),
            (b"(12a\r\n", ReplyParseError::InvalidBigNumber),
            (b"(-\r\n", ReplyParseError::InvalidBigNumber),
            (b"_x\r\n", ReplyParseError::InvalidNull),
            (b"=3\r\ntxt\r\n", ReplyParseError::InvalidVerbatim),
            (b"=4\r\ntxtx\r\n", ReplyParseError::InvalidVerbatim),
            (b"$?\r\n", ReplyParseError::Streamed),
            (b"*?\r\n", ReplyParseError::Streamed),
            (b";4\r\nabcd\r\n", ReplyParseError::Streamed),
        ];
        for (bytes, expected) in cases {
            assert_eq!(
                parse(bytes),
                Err(*expected),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn nesting_limit() {
        let limits = ReplyLimits {
            depth_max: 3,
            ..ReplyLimits::default()
        };
        assert_eq!(
            parse_reply(b"*1\r\n*1\r\n*1\r\n:1\r\n", limits).map(|r| r.map(|(_, n)| n)),
            Ok(Some(16))
        );
        assert_eq!(
            parse_reply(b"*1\r\n*1\r\n*1\r\n*0\r\n", limits),
            Err(ReplyParseError::TooDeep)
        );
        assert_eq!(
            parse_reply(b"*1\r\n*1\r\n%1\r\n|1\r\n", limits),
            Err(ReplyParseError::TooDeep)
        );
        let bomb = b"*1\r\n".repeat(100_000);
        assert_eq!(parse(&bomb), Err(ReplyParseError::TooDeep));
    }

    #[test]
    fn aggregate_limit() {
        let limits = ReplyLimits {
            aggregate_len_max: 2,
            ..ReplyLimits::default()
        };
        assert_eq!(
            parse_reply(b"*3\r\n", limits),
            Err(ReplyParseError::AggregateTooLong)
        );
        assert_eq!(
            parse_reply(b"%3\r\n", limits),
            Err(ReplyParseError::AggregateTooLong)
        );
        assert_eq!(parse_reply(b"*2\r\n", limits), Ok(None));
    }

    #[test]
    fn line_limit_is_independent_of_splits() {
        let limits = ReplyLimits {
            line_bytes_max: 4,
            ..ReplyLimits::default()
        };
        assert_eq!(
            parse_reply(b"+abcd\r\n", limits).map(|r| r.map(|(_, n)| n)),
            Ok(Some(7))
        );
        assert_eq!(parse_reply(b"+abcd\r", limits), Ok(None));
        assert_eq!(parse_reply(b"+abcde", limits), Ok(None));
        assert_eq!(
            parse_reply(b"+abcde\r", limits),
            Err(ReplyParseError::LineTooLong)
        );
        assert_eq!(
            parse_reply(b"+abcde\r\n", limits),
            Err(ReplyParseError::LineTooLong)
        );
        assert_eq!(
            parse_reply(b"+abcdef", limits),
            Err(ReplyParseError::LineTooLong)
        );
    }

    #[test]
    fn pipelined_replies() {
        let stream = b"+OK\r\n:1\r\n$-1\r\n";
        let mut rest = &stream[..];
        let mut parser = ReplyParser::default();
        let mut values = Vec::new();
        while let Some((value, consumed)) = parser.parse(rest).expect("valid") {
            values.push(value);
            rest = &rest[consumed..];
        }
        assert_eq!(values, vec![Value::ok(), Value::Integer(1), Value::Null]);
    }

    #[test]
    #[should_panic(expected = "depth_max")]
    fn depth_limit_is_bounded() {
        ReplyParser::new(ReplyLimits {
            depth_max: REPLY_DEPTH_MAX_LIMIT + 1,
            ..ReplyLimits::default()
        });
    }
}
