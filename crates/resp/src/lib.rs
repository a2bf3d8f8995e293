//! The Redis protocol (RESP2 and RESP3) for RowanKV: the library on which every
//! RowanKV server builds its RESP front end, so that a cluster can be used unchanged
//! from Redis clients, `redis-cli`, `redis-benchmark` and cluster-aware clients, and
//! on which RowanKV's own RESP load generator and tests talk to it.
//!
//! What it owns:
//! - [`value`]: the reply type [`Value`] and its [`encode`]r, which writes a reply in
//!   the client's [`Protocol`] and downgrades RESP3-only types for RESP2 clients as
//!   Redis does;
//! - [`request`]: the server's streaming [`RequestParser`] (multibulk and inline
//!   requests, pipelining, Redis's limits and protocol errors, word for word);
//! - [`reply`]: the client's streaming [`ReplyParser`] for RESP2 and RESP3 replies;
//! - [`errors`]: the error replies a command layer needs, worded as Redis words them;
//! - [`slot`]: Redis Cluster's hash slot of a key ([`key_slot`]).
//!
//! What it must never depend on: networking, threads, clocks, or any other RowanKV
//! crate. It is pure code over byte slices, so the servers, the client tools and the
//! simulator can all use it, and every decoder can be fuzzed in isolation. The
//! format, limits and errors are written down in `docs/format/resp.md`.
//!
//! Invariants every parser here keeps, for bytes from the network:
//! - it never panics, whatever the bytes (its asserts guard only the caller's
//!   contract and its configured limits);
//! - it never allocates according to a length it has read before the bytes that
//!   length announces have arrived;
//! - it never recurses per nesting level, so no input overflows the stack;
//! - how the stream was split into reads never changes what it returns.
//!
//! After a protocol error the connection must be closed, as Redis closes it.
#![forbid(unsafe_code)]

/// Decimal numbers as Redis reads them (the command layer reads its arguments
/// with these too).
pub mod num;

pub mod errors;
pub mod reply;
pub mod request;
pub mod slot;
pub mod value;

pub use reply::{parse_reply, ReplyLimits, ReplyParseError, ReplyParser};
pub use request::{
    encode_request, parse_request, ProtocolError, Request, RequestLimits, RequestParser,
};
pub use slot::{key_slot, SLOT_COUNT};
pub use value::{encode, format_double, Protocol, Value};
