//! Requests: the server side's streaming parser for what a Redis client sends.
//!
//! A connection reads bytes into a buffer and calls [`RequestParser::parse`] on the
//! unconsumed part until it returns `Ok(None)`:
//!
//! ```text
//! loop {
//!     match parser.parse(&buffer)? {           // Err: reply err.reply(), then close
//!         Some((request, consumed)) => { buffer.drain(..consumed); execute(request) }
//!         None => break,                        // read more bytes, then call again
//!     }
//! }
//! ```
//!
//! Two framings are accepted, chosen by the first byte as Redis chooses: `*` starts a
//! multibulk request (`*<argc>\r\n` then `argc` bulk strings `$<len>\r\n<bytes>\r\n`,
//! what every client library sends); anything else is an inline command, one line
//! ended by `\n` or `\r\n` and split into words by Redis's rules (below), what a
//! person types into `telnet` or `nc`.
//!
//! # Contract
//!
//! - `Ok(Some((request, consumed)))`: `request` is complete and used the first
//!   `consumed` bytes of the buffer. The caller drops them before the next call.
//! - `Ok(None)`: the buffer holds no complete request yet. The caller appends bytes
//!   and calls again with the same unconsumed bytes at the front (the parser keeps
//!   the arguments it already has and resumes where it stopped, so a request arriving
//!   in many pieces is parsed once, not once per piece).
//! - `Err(e)`: the bytes are not Redis protocol. Redis answers `e.reply()` and
//!   closes the connection (it sets `CLIENT_CLOSE_AFTER_REPLY`); **the caller must
//!   close it too**, since the stream has no reliable place to resume. Requests
//!   complete before the bad bytes have already been returned, one per call, as
//!   Redis executes them. The parser is reset and may be reused for a new stream.
//! - Empty requests (`*0\r\n`, `*-1\r\n`, blank inline lines) are skipped, as Redis
//!   skips them without a reply; their bytes are counted in the `consumed` of the
//!   next request.
//!
//! # Limits (Redis's defaults)
//!
//! | limit                      | default   | Redis name           | error when exceeded                  |
//! | -------------------------- | --------- | -------------------- | ------------------------------------ |
//! | `bulk_bytes_max`           | 512 MiB   | `proto-max-bulk-len` | `invalid bulk length`                |
//! | `multibulk_len_max`        | 1,048,576 | (6.x's hard limit)   | `invalid multibulk length`           |
//! | `inline_bytes_max`         | 64 KiB    | `PROTO_INLINE_MAX_SIZE` | `too big inline request`; for a `*`/`$` length line, `too big mbulk count string` / `too big bulk count string` |
//! | arguments before AUTH      | 10        | (fixed)              | `unauthenticated multibulk length`   |
//! | bulk bytes before AUTH     | 16,384    | (fixed)              | `unauthenticated bulk length`        |
//!
//! The last two apply only while the connection is not authenticated and the server
//! requires a password ([`RequestParser::set_auth_required`]), as in Redis ≥ 6.2.
//! A length line or inline line counts as too long as soon as more than the limit
//! has arrived without its end, so the answer does not depend on how the stream was
//! split into reads.
//!
//! Nothing is allocated for a length before the bytes it announces have arrived:
//! `*1048576\r\n` reserves room for no more arguments than the bytes present can
//! hold, and `$536870912\r\n` copies nothing until all 512 MiB are in the buffer.
//! (The caller's buffer is what holds a large argument while it arrives; cap it as
//! Redis caps its query buffer, `client-query-buffer-limit`, 1 GiB by default.)
//!
//! # Inline commands
//!
//! Split as Redis's `sdssplitargs` splits them: words are separated by spaces, tabs,
//! CR and LF; `"..."` quotes a word, inside which `\xHH` is a byte in hex, `\n`,
//! `\r`, `\t`, `\b`, `\a` are those characters and `\` before any other character
//! is that character; `'...'` quotes a word literally except `\'`; a quote may
//! start in the middle of a word (`a"b c"` is `ab c`); a closing quote must be
//! followed by white space or the end of the line, and an unterminated quote is an
//! error (`unbalanced quotes in request`). As in Redis (which splits a C string),
//! a NUL byte ends the line: the bytes after it are ignored.
//!
//! # Where this is stricter than Redis
//!
//! Redis does not look at the two bytes it skips after a bulk string's data, nor at
//! the byte after the `\r` of a length line. This parser requires them to be
//! `\r\n`: a client that sends more or fewer bytes than it announced is refused
//! (`expected CRLF after bulk string`, or `invalid bulk length`/`invalid multibulk
//! length` for a length line) instead of having its bytes read as something else.

use crate::num::{parse_i64_redis, push_usize};
use crate::value::Value;

/// Redis's `proto-max-bulk-len` default: the largest argument, 512 MiB.
pub const BULK_BYTES_MAX_DEFAULT: usize = 512 * 1024 * 1024;
/// The most arguments in one multibulk request (Redis 6's fixed limit).
pub const MULTIBULK_LEN_MAX_DEFAULT: usize = 1024 * 1024;
/// Redis's `PROTO_INLINE_MAX_SIZE`: the longest inline request, and the longest a
/// `*` or `$` length line may grow before its end arrives.
pub const INLINE_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// Redis refuses a request with more arguments than this before AUTH.
pub const UNAUTHENTICATED_MULTIBULK_LEN_MAX: usize = 10;
/// Redis refuses an argument longer than this before AUTH.
pub const UNAUTHENTICATED_BULK_BYTES_MAX: usize = 16 * 1024;

/// The smallest encoding of one argument, `$0\r\n\r\n`: a multibulk request never
/// reserves room for more arguments than the bytes present could hold at this size.
const BULK_BYTES_MIN: usize = 6;

// A request that passes the pre-AUTH limits passes the configured ones by default.
const _: () = assert!(UNAUTHENTICATED_MULTIBULK_LEN_MAX <= MULTIBULK_LEN_MAX_DEFAULT);
const _: () = assert!(UNAUTHENTICATED_BULK_BYTES_MAX <= BULK_BYTES_MAX_DEFAULT);

/// The request parser's bounds (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// The longest argument of a multibulk request (`proto-max-bulk-len`).
    pub bulk_bytes_max: usize,
    /// The most arguments of a multibulk request.
    pub multibulk_len_max: usize,
    /// The longest inline request, and the longest length line.
    pub inline_bytes_max: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            bulk_bytes_max: BULK_BYTES_MAX_DEFAULT,
            multibulk_len_max: MULTIBULK_LEN_MAX_DEFAULT,
            inline_bytes_max: INLINE_BYTES_MAX_DEFAULT,
        }
    }
}

/// One command: its name and its arguments, all binary safe.
///
/// Invariant: there is always a name (`argv` is never empty); the name may be empty
/// bytes (`*1\r\n$0\r\n\r\n`), which no command matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    argv: Vec<Vec<u8>>,
}

impl Request {
    /// A request from its words, name first. Panics on an empty `argv` (a
    /// programmer error: the parser never makes one).
    pub fn new(argv: Vec<Vec<u8>>) -> Request {
        assert!(!argv.is_empty(), "a request has at least its command name");
        Request { argv }
    }

    /// The command name as sent (Redis matches it case-insensitively: see [`Request::is`]).
    pub fn name(&self) -> &[u8] {
        &self.argv[0]
    }

    /// The arguments after the name.
    pub fn args(&self) -> &[Vec<u8>] {
        &self.argv[1..]
    }

    /// Name and arguments, as Redis's `argv`.
    pub fn argv(&self) -> &[Vec<u8>] {
        &self.argv
    }

    pub fn into_argv(self) -> Vec<Vec<u8>> {
        self.argv
    }

    /// Whether the command name is `name`, ignoring ASCII case (`GET`, `get`, `GeT`).
    pub fn is(&self, name: &str) -> bool {
        self.name().eq_ignore_ascii_case(name.as_bytes())
    }

    /// Appends this request as a multibulk request, what a client sends.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_request(&self.argv, out);
    }
}

/// Appends the multibulk request of `argv` (name first) to `out`: what a client
/// library sends, and what RowanKV's RESP load generator sends.
pub fn encode_request<A: AsRef<[u8]>>(argv: &[A], out: &mut Vec<u8>) {
    out.push(b'*');
    push_usize(out, argv.len());
    out.extend_from_slice(b"\r\n");
    for arg in argv {
        let arg = arg.as_ref();
        out.push(b'$');
        push_usize(out, arg.len());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Bytes that are not Redis protocol. `Display` (and [`ProtocolError::reply`]) give
/// Redis's exact error line; after answering it the connection must be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// `*<n>` where `n` is not a number by Redis's rules or exceeds `multibulk_len_max`.
    #[error("ERR Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    /// More than 10 arguments before AUTH.
    #[error("ERR Protocol error: unauthenticated multibulk length")]
    UnauthenticatedMultibulkLength,
    /// `$<n>` where `n` is not a number, negative, or exceeds `bulk_bytes_max`.
    #[error("ERR Protocol error: invalid bulk length")]
    InvalidBulkLength,
    /// An argument over 16 KiB before AUTH.
    #[error("ERR Protocol error: unauthenticated bulk length")]
    UnauthenticatedBulkLength,
    /// A multibulk element that does not start with `$` (the byte found).
    #[error("ERR Protocol error: expected '$', got '{}'", (*.0 as char).escape_default())]
    ExpectedDollar(u8),
    /// A `*` length line longer than `inline_bytes_max`.
    #[error("ERR Protocol error: too big mbulk count string")]
    TooBigMultibulkCountString,
    /// A `$` length line longer than `inline_bytes_max`.
    #[error("ERR Protocol error: too big bulk count string")]
    TooBigBulkCountString,
    /// An inline request longer than `inline_bytes_max`.
    #[error("ERR Protocol error: too big inline request")]
    TooBigInlineRequest,
    /// An inline request with an unterminated quote, or a closing quote followed by
    /// something other than white space.
    #[error("ERR Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// A bulk string's data not followed by `\r\n` (RowanKV only: see the module docs).
    #[error("ERR Protocol error: expected CRLF after bulk string")]
    BulkNotTerminated,
}

impl ProtocolError {
    /// The error line exactly as Redis sends it (without `-` and CRLF). Differs from
    /// `Display` only for [`ProtocolError::ExpectedDollar`], whose byte Redis sends
    /// raw: a CR or LF as a space, and a NUL ends the message (Redis formats it as
    /// a C string).
    pub fn message(&self) -> Vec<u8> {
        match *self {
            ProtocolError::ExpectedDollar(byte) => {
                let mut line = b"ERR Protocol error: expected '$', got '".to_vec();
                match byte {
                    0 => return line,
                    b'\r' | b'\n' => line.push(b' '),
                    other => line.push(other),
                }
                line.push(b'\'');
                line
            }
            _ => self.to_string().into_bytes(),
        }
    }

    /// The error reply to send before closing the connection.
    pub fn reply(&self) -> Value {
        Value::Error(self.message())
    }
}

/// A multibulk request whose arguments have not all arrived.
#[derive(Debug)]
struct Partial {
    argc: usize,
    argv: Vec<Vec<u8>>,
    /// Where the next argument's `$` line starts in the caller's buffer.
    next_bytes: usize,
}

/// The streaming request parser of one connection (see the module docs for the
/// contract). It holds the progress of a request that has not fully arrived.
#[derive(Debug)]
pub struct RequestParser {
    limits: RequestLimits,
    auth_required: bool,
    /// Bytes at the buffer's front that held only empty requests.
    skipped_bytes: usize,
    partial: Option<Partial>,
}

impl RequestParser {
    pub fn new(limits: RequestLimits) -> RequestParser {
        assert!(
            limits.multibulk_len_max >= 1,
            "a request needs room for its name"
        );
        assert!(
            limits.inline_bytes_max >= 1,
            "an inline request needs room for its name"
        );
        // Keeps `start + len + 2` far from overflow and every length an i64.
        assert!(limits.bulk_bytes_max <= i64::MAX as usize / 2);
        assert!(limits.multibulk_len_max <= i64::MAX as usize);
        RequestParser {
            limits,
            auth_required: false,
            skipped_bytes: 0,
            partial: None,
        }
    }

    pub fn limits(&self) -> RequestLimits {
        self.limits
    }

    /// Whether the pre-AUTH limits apply: true while the server requires a password
    /// and this connection has not authenticated (Redis's `authRequired`). Set it
    /// between requests.
    pub fn set_auth_required(&mut self, auth_required: bool) {
        self.auth_required = auth_required;
    }

    /// Forgets a partly parsed request (for a connection that drops its buffer).
    pub fn reset(&mut self) {
        self.skipped_bytes = 0;
        self.partial = None;
    }

    /// The next complete request at the front of `buffer` (see the module docs).
    pub fn parse(&mut self, buffer: &[u8]) -> Result<Option<(Request, usize)>, ProtocolError> {
        let result = self.parse_next(buffer);
        if !matches!(result, Ok(None)) {
            self.reset();
        }
        result
    }

    fn parse_next(&mut self, buffer: &[u8]) -> Result<Option<(Request, usize)>, ProtocolError> {
        loop {
            if self.partial.is_some() {
                return self.continue_multibulk(buffer);
            }
            let start = self.skipped_bytes;
            assert!(
                start <= buffer.len(),
                "the buffer lost bytes the parser had read: call parse with the same unconsumed bytes"
            );
            let Some(&first) = buffer.get(start) else {
                return Ok(None);
            };
            if first == b'*' {
                let Some(line) = find_line(buffer, start, self.limits.inline_bytes_max)
                    .map_err(|TooLong| ProtocolError::TooBigMultibulkCountString)?
                else {
                    return Ok(None);
                };
                let count = parse_i64_redis(&buffer[start + 1..line.end])
                    .ok_or(ProtocolError::InvalidMultibulkLength)?;
                if count > self.limits.multibulk_len_max as i64 {
                    return Err(ProtocolError::InvalidMultibulkLength);
                }
                if self.auth_required && count > UNAUTHENTICATED_MULTIBULK_LEN_MAX as i64 {
                    return Err(ProtocolError::UnauthenticatedMultibulkLength);
                }
                if !line.crlf {
                    return Err(ProtocolError::InvalidMultibulkLength);
                }
                if count <= 0 {
                    self.skipped_bytes = line.next;
                    continue;
                }
                let argc = count as usize;
                let reserve = argc.min((buffer.len() - line.next) / BULK_BYTES_MIN);
                self.partial = Some(Partial {
                    argc,
                    argv: Vec::with_capacity(reserve),
                    next_bytes: line.next,
                });
            } else {
                match self.parse_inline(buffer, start)? {
                    Inline::Incomplete => return Ok(None),
                    Inline::Empty { next } => self.skipped_bytes = next,
                    Inline::Request(request, next) => return Ok(Some((request, next))),
                }
            }
        }
    }

    fn continue_multibulk(
        &mut self,
        buffer: &[u8],
    ) -> Result<Option<(Request, usize)>, ProtocolError> {
        let limits = self.limits;
        let auth_required = self.auth_required;
        let Some(partial) = self.partial.as_mut() else {
            return Ok(None);
        };
        assert!(
            partial.next_bytes <= buffer.len(),
            "the buffer lost bytes the parser had read: call parse with the same unconsumed bytes"
        );
        while partial.argv.len() < partial.argc {
            let start = partial.next_bytes;
            let Some(line) = find_line(buffer, start, limits.inline_bytes_max)
                .map_err(|TooLong| ProtocolError::TooBigBulkCountString)?
            else {
                return Ok(None);
            };
            if buffer[start] != b'$' {
                return Err(ProtocolError::ExpectedDollar(buffer[start]));
            }
            let len = parse_i64_redis(&buffer[start + 1..line.end])
                .ok_or(ProtocolError::InvalidBulkLength)?;
            if len < 0 || len > limits.bulk_bytes_max as i64 {
                return Err(ProtocolError::InvalidBulkLength);
            }
            if auth_required && len > UNAUTHENTICATED_BULK_BYTES_MAX as i64 {
                return Err(ProtocolError::UnauthenticatedBulkLength);
            }
            if !line.crlf {
                return Err(ProtocolError::InvalidBulkLength);
            }
            let data_start = line.next;
            let data_end = data_start + len as usize;
            if buffer.len() < data_end + 2 {
                return Ok(None);
            }
            if &buffer[data_end..data_end + 2] != b"\r\n" {
                return Err(ProtocolError::BulkNotTerminated);
            }
            partial.argv.push(buffer[data_start..data_end].to_vec());
            partial.next_bytes = data_end + 2;
        }
        let consumed = partial.next_bytes;
        let argv = std::mem::take(&mut partial.argv);
        Ok(Some((Request::new(argv), consumed)))
    }

    fn parse_inline(&self, buffer: &[u8], start: usize) -> Result<Inline, ProtocolError> {
        let max = self.limits.inline_bytes_max;
        let Some(newline) = buffer[start..].iter().position(|&b| b == b'\n') else {
            if buffer.len() - start > max {
                return Err(ProtocolError::TooBigInlineRequest);
            }
            return Ok(Inline::Incomplete);
        };
        // Had the stream been cut just before the `\n`, more than `max` bytes would
        // have been waiting without one: the same error, whatever the reads.
        if newline > max {
            return Err(ProtocolError::TooBigInlineRequest);
        }
        let mut line = &buffer[start..start + newline];
        if let Some(stripped) = line.strip_suffix(b"\r") {
            line = stripped;
        }
        let argv = split_inline(line).ok_or(ProtocolError::UnbalancedQuotes)?;
        let next = start + newline + 1;
        if argv.is_empty() {
            Ok(Inline::Empty { next })
        } else {
            Ok(Inline::Request(Request::new(argv), next))
        }
    }
}

impl Default for RequestParser {
    fn default() -> Self {
        RequestParser::new(RequestLimits::default())
    }
}

/// Parses the first request of `buffer` with a fresh parser: the contract of
/// [`RequestParser::parse`] without resuming (each call starts from the front).
pub fn parse_request(
    buffer: &[u8],
    limits: RequestLimits,
) -> Result<Option<(Request, usize)>, ProtocolError> {
    RequestParser::new(limits).parse(buffer)
}

enum Inline {
    Incomplete,
    Empty { next: usize },
    Request(Request, usize),
}

/// A length line (`*3\r\n`, `$5\r\n`) found at the front of the buffer.
struct Line {
    /// Index of its `\r`.
    end: usize,
    /// Whether the `\r` is followed by `\n`.
    crlf: bool,
    /// Index of the byte after the line.
    next: usize,
}

/// The line starting at `start` went on for more than the limit.
struct TooLong;

/// Finds the `\r` that ends the line at `start` (Redis looks for `\r`, then wants
/// one more byte). `Ok(None)` while that byte has not arrived; `Err` once more than
/// `max` bytes precede the `\r` or, without one, have arrived.
fn find_line(buffer: &[u8], start: usize, max: usize) -> Result<Option<Line>, TooLong> {
    let rest = &buffer[start..];
    match rest.iter().position(|&b| b == b'\r') {
        None if rest.len() > max => Err(TooLong),
        None => Ok(None),
        Some(cr) if cr > max => Err(TooLong),
        Some(cr) => match rest.get(cr + 1) {
            None => Ok(None),
            Some(&after) => Ok(Some(Line {
                end: start + cr,
                crlf: after == b'\n',
                next: start + cr + 2,
            })),
        },
    }
}

/// C's `isspace` in the C locale.
fn is_c_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn hex_value(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// Splits an inline request into words as Redis's `sdssplitargs` does (module
/// docs); `None` for unbalanced quotes.
fn split_inline(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    // sdssplitargs reads a C string: the line ends at its first NUL.
    let line = match line.iter().position(|&b| b == 0) {
        Some(nul) => &line[..nul],
        None => line,
    };
    // The byte at `i`, 0 past the end (the C string's terminator).
    let at = |i: usize| line.get(i).copied().unwrap_or(0);
    let mut words = Vec::new();
    let mut i = 0;
    loop {
        while at(i) != 0 && is_c_space(at(i)) {
            i += 1;
        }
        if at(i) == 0 {
            return Some(words);
        }
        let mut word = Vec::new();
        let mut in_double = false;
        let mut in_single = false;
        let mut done = false;
        while !done {
            let c = at(i);
            if in_double {
                if c == b'\\' && at(i + 1) == b'x' {
                    if let (Some(high), Some(low)) = (hex_value(at(i + 2)), hex_value(at(i + 3))) {
                        word.push(high * 16 + low);
                        i += 3;
                    } else {
                        // `\x` without two hex digits: an ordinary escape of `x`.
                        word.push(b'x');
                        i += 1;
                    }
                } else if c == b'\\' && at(i + 1) != 0 {
                    i += 1;
                    word.push(match at(i) {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                } else if c == b'"' {
                    if at(i + 1) != 0 && !is_c_space(at(i + 1)) {
                        return None;
                    }
                    done = true;
                } else if c == 0 {
                    return None;
                } else {
                    word.push(c);
                }
            } else if in_single {
                if c == b'\\' && at(i + 1) == b'\'' {
                    i += 1;
                    word.push(b'\'');
                } else if c == b'\'' {
                    if at(i + 1) != 0 && !is_c_space(at(i + 1)) {
                        return None;
                    }
                    done = true;
                } else if c == 0 {
                    return None;
                } else {
                    word.push(c);
                }
            } else {
                match c {
                    b' ' | b'\n' | b'\r' | b'\t' | 0 => done = true,
                    b'"' => in_double = true,
                    b'\'' => in_single = true,
                    other => word.push(other),
                }
            }
            if at(i) != 0 {
                i += 1;
            }
        }
        words.push(word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's words and the bytes it used, or why not.
    type Parsed = Result<Option<(Vec<Vec<u8>>, usize)>, ProtocolError>;

    fn parse(bytes: &[u8]) -> Parsed {
        parse_request(bytes, RequestLimits::default())
            .map(|r| r.map(|(req, n)| (req.into_argv(), n)))
    }

    fn words(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn err(bytes: &[u8]) -> String {
        match parse(bytes) {
            Err(e) => e.to_string(),
            other => panic!(
                "expected an error for {:?}, got {other:?}",
                String::from_utf8_lossy(bytes)
            ),
        }
    }

    #[test]
    fn multibulk() {
        let bytes = b"*2\r\n$3\r\nGET\r\n$3\r\nfoo\r\n";
        assert_eq!(
            parse(bytes),
            Ok(Some((words(&["GET", "foo"]), bytes.len())))
        );
        let binary = b"*1\r\n$4\r\n\r\n\0\xff\r\n";
        assert_eq!(
            parse(binary),
            Ok(Some((vec![b"\r\n\0\xff".to_vec()], binary.len())))
        );
        assert_eq!(parse(b"*1\r\n$0\r\n\r\n"), Ok(Some((vec![vec![]], 10))));
    }

    #[test]
    fn every_prefix_of_a_request_is_incomplete() {
        let bytes = b"*2\r\n$3\r\nSET\r\n$10\r\n0123456789\r\n";
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn pipelined_requests_come_one_at_a_time() {
        let mut stream = Vec::new();
        encode_request(&["PING"], &mut stream);
        encode_request(&["ECHO", "hi"], &mut stream);
        stream.extend_from_slice(b"PING\r\n");
        let mut parser = RequestParser::default();
        let mut rest = &stream[..];
        let mut seen = Vec::new();
        while let Some((request, consumed)) = parser.parse(rest).expect("valid") {
            seen.push(request.into_argv());
            rest = &rest[consumed..];
        }
        assert!(rest.is_empty());
        assert_eq!(
            seen,
            vec![words(&["PING"]), words(&["ECHO", "hi"]), words(&["PING"])]
        );
    }

    #[test]
    fn resumes_where_it_stopped() {
        let mut stream = Vec::new();
        encode_request(&["SET", "key", "value"], &mut stream);
        let mut parser = RequestParser::default();
        for cut in 1..stream.len() {
            assert_eq!(parser.parse(&stream[..cut]), Ok(None));
        }
        let (request, consumed) = parser.parse(&stream).expect("valid").expect("complete");
        assert_eq!(request.into_argv(), words(&["SET", "key", "value"]));
        assert_eq!(consumed, stream.len());
    }

    #[test]
    fn empty_requests_are_skipped() {
        let bytes = b"*0\r\n*-1\r\n\r\n\n   \r\n*1\r\n$4\r\nPING\r\n";
        assert_eq!(parse(bytes), Ok(Some((words(&["PING"]), bytes.len()))));
        assert_eq!(parse(b"*0\r\n*-1\r\n\n"), Ok(None));
        // Any negative count is an empty request to Redis.
        assert_eq!(parse(b"*-5\r\nPING\r\n"), Ok(Some((words(&["PING"]), 11))));
    }

    #[test]
    fn multibulk_length_errors() {
        for bad in [
            &b"*x\r\n"[..],
            b"*\r\n",
            b"*-0\r\n",
            b"*01\r\n",
            b"*+1\r\n",
            b"*1 \r\n",
            b"*1048577\r\n",
            b"*99999999999999999999\r\n",
            b"*1\rx",
        ] {
            assert_eq!(
                err(bad),
                "ERR Protocol error: invalid multibulk length",
                "{bad:?}"
            );
        }
        assert_eq!(parse(b"*1048576\r\n"), Ok(None));
    }

    #[test]
    fn bulk_length_errors() {
        for bad in [
            &b"*1\r\n$x\r\n"[..],
            b"*1\r\n$-1\r\n",
            b"*1\r\n$\r\n",
            b"*1\r\n$01\r\n",
            b"*1\r\n$536870913\r\n",
            b"*1\r\n$1\rx",
        ] {
            assert_eq!(
                err(bad),
                "ERR Protocol error: invalid bulk length",
                "{bad:?}"
            );
        }
        // 512 MiB exactly is allowed, and nothing is read until it has all arrived.
        assert_eq!(parse(b"*1\r\n$536870912\r\nabc"), Ok(None));
    }

    #[test]
    fn expected_dollar() {
        assert_eq!(
            err(b"*1\r\n:1\r\n"),
            "ERR Protocol error: expected '$', got ':'"
        );
        assert_eq!(
            err(b"*2\r\n$1\r\na\r\nx\r\n"),
            "ERR Protocol error: expected '$', got 'x'"
        );
        assert_eq!(
            err(b"*1\r\n*1\r\n"),
            "ERR Protocol error: expected '$', got '*'"
        );
        let error = parse(b"*1\r\n\r\n").expect_err("empty line");
        assert_eq!(
            error.message(),
            b"ERR Protocol error: expected '$', got ' '"
        );
        let error = parse(b"*1\r\n\xff\r\n").expect_err("high byte");
        assert_eq!(
            error.message(),
            b"ERR Protocol error: expected '$', got '\xff'"
        );
        assert_eq!(
            error.reply(),
            Value::Error(b"ERR Protocol error: expected '$', got '\xff'".to_vec())
        );
        assert_eq!(
            error.to_string(),
            "ERR Protocol error: expected '$', got '\\u{ff}'"
        );
        let error = parse(b"*1\r\n\0\r\n").expect_err("NUL");
        assert_eq!(error.message(), b"ERR Protocol error: expected '$', got '");
    }

    #[test]
    fn bulk_must_end_with_crlf() {
        assert_eq!(
            err(b"*1\r\n$3\r\nfooXY"),
            "ERR Protocol error: expected CRLF after bulk string"
        );
        assert_eq!(
            err(b"*1\r\n$3\r\nfoo\rX"),
            "ERR Protocol error: expected CRLF after bulk string"
        );
        assert_eq!(parse(b"*1\r\n$3\r\nfoo\r"), Ok(None));
    }

    #[test]
    fn too_big_count_strings() {
        let mut long = b"*".to_vec();
        long.extend(std::iter::repeat_n(b'1', INLINE_BYTES_MAX_DEFAULT - 1));
        // Exactly the limit (counted from the `*`, as Redis counts) without a CR:
        // still waiting.
        assert_eq!(parse(&long), Ok(None));
        long.push(b'1');
        assert_eq!(err(&long), "ERR Protocol error: too big mbulk count string");
        long.extend_from_slice(b"\r\n");
        assert_eq!(err(&long), "ERR Protocol error: too big mbulk count string");

        let mut long = b"*1\r\n$".to_vec();
        long.extend(std::iter::repeat_n(b'1', INLINE_BYTES_MAX_DEFAULT));
        assert_eq!(err(&long), "ERR Protocol error: too big bulk count string");
    }

    #[test]
    fn too_big_inline() {
        let mut line = vec![b'a'; INLINE_BYTES_MAX_DEFAULT];
        assert_eq!(parse(&line), Ok(None));
        line.push(b'a');
        assert_eq!(err(&line), "ERR Protocol error: too big inline request");
        line.push(b'\n');
        assert_eq!(err(&line), "ERR Protocol error: too big inline request");
        let mut fits = vec![b'a'; INLINE_BYTES_MAX_DEFAULT - 1];
        fits.extend_from_slice(b"\r\n");
        assert_eq!(parse(&fits).expect("fits").expect("complete").1, fits.len());
    }

    #[test]
    fn unauthenticated_limits() {
        let mut parser = RequestParser::default();
        parser.set_auth_required(true);
        assert_eq!(
            parser.parse(b"*11\r\n"),
            Err(ProtocolError::UnauthenticatedMultibulkLength)
        );
        assert_eq!(
            ProtocolError::UnauthenticatedMultibulkLength.to_string(),
            "ERR Protocol error: unauthenticated multibulk length"
        );
        assert_eq!(
            parser.parse(b"*1\r\n$16385\r\n"),
            Err(ProtocolError::UnauthenticatedBulkLength)
        );
        assert_eq!(
            ProtocolError::UnauthenticatedBulkLength.to_string(),
            "ERR Protocol error: unauthenticated bulk length"
        );
        // The absolute limits are checked first, as Redis checks them.
        assert_eq!(
            parser.parse(b"*2000000\r\n"),
            Err(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(
            parser.parse(b"*1\r\n$600000000\r\n"),
            Err(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(parser.parse(b"*10\r\n"), Ok(None));
        parser.reset();
        assert_eq!(parser.parse(b"*1\r\n$16384\r\n"), Ok(None));
        parser.reset();
        parser.set_auth_required(false);
        assert_eq!(parser.parse(b"*11\r\n"), Ok(None));
    }

    #[test]
    fn configured_limits() {
        let limits = RequestLimits {
            bulk_bytes_max: 4,
            multibulk_len_max: 2,
            inline_bytes_max: 8,
        };
        assert_eq!(
            parse_request(b"*3\r\n", limits),
            Err(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(
            parse_request(b"*1\r\n$5\r\n", limits),
            Err(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            parse_request(b"PING PONG\n", limits),
            Err(ProtocolError::TooBigInlineRequest)
        );
        let (request, _) = parse_request(b"*2\r\n$4\r\nPING\r\n$4\r\nPONG\r\n", limits)
            .expect("fits")
            .expect("complete");
        assert_eq!(request.into_argv(), words(&["PING", "PONG"]));
    }

    #[test]
    fn error_resets_the_parser() {
        let mut parser = RequestParser::default();
        assert_eq!(parser.parse(b"*2\r\n$3\r\nGET\r\n"), Ok(None));
        assert_eq!(
            parser.parse(b"*2\r\n$3\r\nGET\r\n:1\r\n"),
            Err(ProtocolError::ExpectedDollar(b':'))
        );
        let (request, _) = parser.parse(b"PING\r\n").expect("fresh").expect("complete");
        assert!(request.is("ping"));
    }

    #[test]
    fn inline_words() {
        let cases: &[(&[u8], &[&[u8]])] = &[
            (b"PING\r\n", &[b"PING"]),
            (b"PING\n", &[b"PING"]),
            (b"  set  a   b  \r\n", &[b"set", b"a", b"b"]),
            (b"set\ta\tb\n", &[b"set", b"a", b"b"]),
            (b"set \"a b\" c\n", &[b"set", b"a b", b"c"]),
            (b"set \"\\x41\\x4a\\x4A\" c\n", &[b"set", b"AJJ", b"c"]),
            (
                b"set \"\\n\\r\\t\\b\\a\\\\\\\"\\q\" c\n",
                &[b"set", b"\n\r\t\x08\x07\\\"q", b"c"],
            ),
            (b"set \"\\x4\" c\n", &[b"set", b"x4", b"c"]),
            (b"set \"\\xZZ\"\n", &[b"set", b"xZZ"]),
            (b"set 'a \"b\" \\n' c\n", &[b"set", b"a \"b\" \\n", b"c"]),
            (b"set 'it\\'s'\n", &[b"set", b"it's"]),
            (b"set a\"b c\" d\n", &[b"set", b"ab c", b"d"]),
            (b"echo \"\"\n", &[b"echo", b""]),
            (b"echo ''\n", &[b"echo", b""]),
            (b"echo \"x\"\x0b\n", &[b"echo", b"x"]),
            (b"echo a\x0bb\n", &[b"echo", b"a\x0bb"]),
            (b"echo \xff\xfe\n", &[b"echo", b"\xff\xfe"]),
            (b"echo a\0 ignored \"\n", &[b"echo", b"a"]),
            (b"echo \"\\x00\"\n", &[b"echo", b"\0"]),
            (b"echo a\rb\n", &[b"echo", b"a", b"b"]),
        ];
        for (line, expected) in cases {
            let expected: Vec<Vec<u8>> = expected.iter().map(|w| w.to_vec()).collect();
            let got = parse(line).map(|r| r.map(|(argv, _)| argv));
            assert_eq!(
                got,
                Ok(Some(expected)),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn unbalanced_quotes() {
        for line in [
            &b"set \"a\n"[..],
            b"set 'a\n",
            b"set \"a\"b\n",
            b"set 'a'b\n",
            b"set a\"b c\"d\n",
            b"set \"a\\\"\n",
            b"set \"a\0\"\n",
            b"set \"abc\\\n",
        ] {
            assert_eq!(
                err(line),
                "ERR Protocol error: unbalanced quotes in request",
                "{line:?}"
            );
        }
    }

    #[test]
    fn inline_waits_for_its_newline() {
        assert_eq!(parse(b"PING"), Ok(None));
        assert_eq!(parse(b"PING\r"), Ok(None));
        assert_eq!(parse(b"set \"unterminated"), Ok(None));
    }

    #[test]
    fn request_accessors() {
        let request = Request::new(words(&["GeT", "k"]));
        assert!(request.is("get"));
        assert!(!request.is("set"));
        assert_eq!(request.name(), b"GeT");
        assert_eq!(request.args(), &words(&["k"])[..]);
        assert_eq!(request.argv().len(), 2);
        let mut out = Vec::new();
        request.encode(&mut out);
        assert_eq!(out, b"*2\r\n$3\r\nGeT\r\n$1\r\nk\r\n");
    }

    #[test]
    #[should_panic(expected = "at least its command name")]
    fn empty_request_is_a_programmer_error() {
        Request::new(Vec::new());
    }
}
