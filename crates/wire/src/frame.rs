//! RPC frames: the control traffic between clients and servers and between servers
//! (GET/PUT/DEL, replication by RPC, segment grants, pings and their responses),
//! carried in fabric SEND/RECV messages, one frame per message.
//!
//! A frame is a fixed 40-byte header followed by a body whose layout depends on the
//! message type. Every integer is little-endian. The whole frame, header included,
//! must fit in `frame_bytes_max` (4096 B by default), which is the size of the
//! receive buffers a node posts for RPCs.
//!
//! # Header
//!
//! | bytes    | field        | type  | meaning                                              |
//! | -------- | ------------ | ----- | ---------------------------------------------------- |
//! | 0..2     | `magic`      | [u8;2]| `"RK"`                                               |
//! | 2        | `version`    | u8    | [`WIRE_VERSION`] (4)                                 |
//! | 3        | `msg_type`   | u8    | a [`MsgType`]                                        |
//! | 4..8     | `body_len`   | u32   | bytes after the header; must equal what follows      |
//! | 8..16    | `cluster_id` | u64   | the cluster the sender believes it belongs to        |
//! | 16..24   | `term`       | u64   | the sender's configuration term                      |
//! | 24..32   | `request_id` | u64   | chosen by the requester, echoed in the response      |
//! | 32..36   | `sender`     | u32   | the sender's `NodeId`                                |
//! | 36..40   | reserved     | u32   | must be zero                                         |
//!
//! # Bodies
//!
//! | type                | code | body                                                                  |
//! | ------------------- | ---- | --------------------------------------------------------------------- |
//! | `Get`               | 1    | `key_len u16, key`                                                    |
//! | `Put`               | 2    | `request` (24 B, below), `expiry` (9 B, below), `key_len u16, value_len u32, key, value` |
//! | `Del`               | 3    | `request` (24 B), `key_len u16, key`                                  |
//! | `Replicate`         | 4    | encoded log entries: the whole body, non-empty, a multiple of 64 B    |
//! | `GrantSegment`      | 5    | `log u32` (the id the backup gave the path's log), `has_sealed u8 (0 or 1), sealed u32 (0 when has_sealed = 0)` |
//! | `Ping`              | 6    | empty                                                                 |
//! | `Lease`             | 7    | empty (a server renews its lease with the configuration manager)     |
//! | `Prepare`           | 8    | `term u64` (a new configuration is in the coordination store)         |
//! | `Commit`            | 9    | `term u64` (every server holds it: unblock)                           |
//! | `Gather`            | 10   | `shard u16, cursor u32` (uncommitted entries of a shard, from cursor) |
//! | `Install`           | 11   | `shard u16`, then encoded log entries (a non-empty multiple of 64 B)  |
//! | `Ready`             | 12   | `shard u16, node u32` (`node` holds a full copy of `shard` now)       |
//! | `Config`            | 13   | `offset u32` (a page of the configuration the CM stores, from offset) |
//! | `Stats`             | 14   | empty (a server's state, answered with `Value`: JSON, version = term) |
//! | `PutIf`             | 15   | `expect` (9 B, below), then as `Put`                                  |
//! | `DelIf`             | 16   | `expect` (9 B), then as `Del`                                         |
//! | `Scan`              | 17   | `shard u16, cursor u64, count u32` (keys of a shard, answered `Keys`) |
//! | `Load`              | 18   | `window_ms u32`, then per shard (ids strictly ascending) `shard u16, requests u64, replication_writes u64` (a server's load statistics for the CM, §4.6) |
//! | `Migrate`           | 19   | `shard u16, next_version u64, last u8 (0 or 1)`, then request outcomes, each `client u64, seq u64, first_incomplete u64, version u64` (a migration's source hands `shard` to its target, §4.6: one page of the shard's request table; `last`: the hand-over is complete) |
//! | `GetMigrating`      | 20   | `key_len u16, key` (a GET the migration's target sent back to the source: answered from the index the source still holds) |
//! | `Reshard`           | 21   | `shard u16, to u32` (an operator asks the active CM to move `shard`'s primary to `to`) |
//! | `Response`          | 0x80 | `status u8`, then per status (below)                                  |
//!
//! | status | response   | rest of the body                                                    |
//! | ------ | ---------- | ------------------------------------------------------------------- |
//! | 0      | `Ok`       | `version u64`                                                       |
//! | 1      | `Value`    | `version u64, expiry (9 B), value_len u32, value`                   |
//! | 2      | `NotFound` | nothing                                                             |
//! | 3      | `Segment`  | `segment u32, offset u64, len_bytes u64`                            |
//! | 4      | `Error`    | `code u8, term u64 (the server's term), detail_len u16, detail (UTF-8)` |
//! | 5      | `Entries`  | `next u32, more u8 (0 or 1), then encoded log entries (multiple of 64 B)` |
//! | 6      | `Config`   | `term u64, total u32, len u32`, then `len` bytes of the configuration's JSON (`Config::to_json`, `total` bytes in all) from the request's offset |
//! | 7      | `Keys`     | `next u64` (0: the shard is done), then keys, each `key_len u16, key` (`KEY_BYTES_MAX` at most), to the end of the body |
//!
//! A write's `request` is the client's request record (exactly-once retries,
//! RIFL-style): `client u64, seq u64, first_incomplete u64`. All zeros: none (the
//! write is executed each time it arrives). Otherwise `client` is not 0,
//! `seq < 2^40` (what a log entry stores) and `first_incomplete ≤ seq`; the server stores the record in the write's log entry
//! and answers a request it already executed with that execution's outcome.
//!
//! A PUT's `expiry` is `tag u8, at u64`: tag 0 with 0, the value does not
//! expire; tag 1, it expires at `at`, Unix time in milliseconds (the key reads
//! as absent from then on, on the primary's clock; the time is stored in the
//! value's log entry). A `Value` answer carries the value's expiry the same way.
//!
//! A conditional write's `expect` is `tag u8, version u64`: tag 1, the key has no
//! live value (version 0); tag 2, the key's live value has exactly `version`. The
//! primary executes the write only if the condition holds and no other write of
//! the key is in flight; otherwise it answers `Error` `ConditionFailed` and writes
//! nothing. Conditional writes are how read-modify-write commands (Redis's INCR,
//! SET NX, …) are atomic per key.
//!
//! # Invariants
//!
//! - Encoding is canonical: every frame [`decode`] accepts re-encodes to the same
//!   bytes. Hence the decoder refuses trailing bytes, non-zero reserved bytes and a
//!   non-zero `sealed` when `has_sealed` is 0.
//! - Keys are at most [`KEY_BYTES_MAX`] bytes on both sides of the wire.
//! - [`decode`] reads only the slice it is given, never panics, and borrows keys,
//!   values, entries and details from it (zero copy).
//! - [`decode_header`] needs only the 40 header bytes and does not look at the message
//!   type, so that a server can answer a frame whose type or body is bad with the
//!   request id and an error code ([`FrameError::code`]).
//!
//! # Version history
//!
//! - 1: the first version (the failover messages, types 7–12 and `Entries`, came
//!   before any deployment and did not change the version).
//! - 2: `Put` and `Del` carry a request record; error code 12 (`Duplicate`).
//! - 3: a `GrantSegment`'s `log` is the id the backup handed out with the
//!   path (`docs/format/connection-manager.md`), no longer the sender's worker
//!   or a fixed id for `share`; error code 14 (`UnknownLog`) refuses a log the
//!   backup has ended. (Codes 13 and types 15–17 came with the RESP front end
//!   within version 2.)
//! - 4: `Put` and `PutIf` carry an `expiry`, and so does a `Value` answer.
//!   (Types 19–21 and error code 15 came with dynamic resharding within
//!   version 4: a peer of an older build refuses them as unknown.)

use std::fmt;

use rowankv_types::{NodeId, RequestId, RequestRecord, ShardId, Term};

/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"RK";
/// The frame format this build reads and writes.
pub const WIRE_VERSION: u8 = 4;
/// Size of the fixed header.
pub const HEADER_BYTES: usize = 40;
/// Default bound on a whole frame (header and body): the RPC receive buffer size.
pub const FRAME_BYTES_MAX_DEFAULT: usize = 4096;
/// The longest key RowanKV stores.
pub const KEY_BYTES_MAX: usize = 1024;
/// Largest key + value of one PUT. Its log entry (a 24 B header, padded to 64 B)
/// must fit one block inside one frame of `FRAME_BYTES_MAX_DEFAULT` less this
/// header, so that every replication strategy — RPC included — carries it whole.
/// The server checks this against the engine's entry format at compile time.
pub const KV_BYTES_MAX: usize =
    (FRAME_BYTES_MAX_DEFAULT - HEADER_BYTES) / 64 * 64 - 24 - REQUEST_BYTES;

/// Bytes of a write's request record, on the wire and in its log entry.
pub const REQUEST_BYTES: usize = 24;

/// Bytes of a PUT's or a value's expiry field: tag u8, at u64.
pub const EXPIRY_BYTES: usize = 9;
/// Fixed bytes of a Put body before the key: request, expiry, key_len u16,
/// value_len u32.
const PUT_FIXED_BYTES: usize = REQUEST_BYTES + EXPIRY_BYTES + 2 + 4;
/// Fixed bytes of a Get or Del body before the key: key_len u16.
const KEY_FIXED_BYTES: usize = 2;
/// Fixed bytes of a GrantSegment body: log u32, has_sealed u8, sealed u32.
const GRANT_SEGMENT_BYTES: usize = 4 + 1 + 4;
/// Fixed bytes of a Value response before the value: status u8, version u64,
/// expiry, value_len u32.
const VALUE_RESPONSE_FIXED_BYTES: usize = 1 + 8 + EXPIRY_BYTES + 4;
/// Fixed bytes of an Error response before the detail: status, code, term, detail_len.
const ERROR_RESPONSE_FIXED_BYTES: usize = 1 + 1 + 8 + 2;
/// Replicated log entries are 64 B-aligned (the stride of a Rowan buffer).
const ENTRY_ALIGN_BYTES: usize = 64;
/// The body length field is a u32, so no frame can be longer than this.
const FRAME_BYTES_LIMIT: usize = HEADER_BYTES + u32::MAX as usize;

const STATUS_OK: u8 = 0;
const STATUS_VALUE: u8 = 1;
const STATUS_NOT_FOUND: u8 = 2;
const STATUS_SEGMENT: u8 = 3;
const STATUS_ERROR: u8 = 4;
const STATUS_ENTRIES: u8 = 5;
const STATUS_CONFIG: u8 = 6;
const STATUS_KEYS: u8 = 7;
/// Bytes of a `Scan` body.
const SCAN_BYTES: usize = 2 + 8 + 4;
/// A `Config` response's status, term, total and chunk length.
pub const CONFIG_RESPONSE_FIXED_BYTES: usize = 1 + 8 + 4 + 4;
/// `shard u16, cursor u32`.
const GATHER_BYTES: usize = 2 + 4;
/// `shard u16, node u32`.
const READY_BYTES: usize = 2 + 4;
const RESHARD_BYTES: usize = 2 + 4;

// key_len travels as a u16.
const _: () = assert!(KEY_BYTES_MAX <= u16::MAX as usize);
// A Put with the longest key and a non-empty value fits a default frame.
const _: () = assert!(HEADER_BYTES + PUT_FIXED_BYTES + KEY_BYTES_MAX < FRAME_BYTES_MAX_DEFAULT);
// A default frame carries at least one replicated log entry.
const _: () = assert!(HEADER_BYTES + ENTRY_ALIGN_BYTES <= FRAME_BYTES_MAX_DEFAULT);

/// The fixed part of every frame, as decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The raw message type; [`decode`] checks it, [`decode_header`] does not.
    pub msg_type: u8,
    pub body_len: u32,
    pub cluster_id: u64,
    pub term: Term,
    pub request_id: u64,
    pub sender: NodeId,
}

impl Header {
    /// Length of the whole frame this header announces.
    pub fn frame_bytes(&self) -> usize {
        HEADER_BYTES + self.body_len as usize
    }
}

/// What the sender fills in; body_len and msg_type come from the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub cluster_id: u64,
    pub term: Term,
    pub request_id: u64,
    pub sender: NodeId,
}

/// The message type in header byte 3.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgType {
    Get = 1,
    Put = 2,
    Del = 3,
    Replicate = 4,
    GrantSegment = 5,
    Ping = 6,
    Lease = 7,
    Prepare = 8,
    Commit = 9,
    Gather = 10,
    Install = 11,
    Ready = 12,
    Config = 13,
    Stats = 14,
    PutIf = 15,
    DelIf = 16,
    Scan = 17,
    Load = 18,
    Migrate = 19,
    GetMigrating = 20,
    Reshard = 21,
    Response = 0x80,
}

impl MsgType {
    pub fn from_u8(b: u8) -> Option<MsgType> {
        Some(match b {
            1 => MsgType::Get,
            2 => MsgType::Put,
            3 => MsgType::Del,
            4 => MsgType::Replicate,
            5 => MsgType::GrantSegment,
            6 => MsgType::Ping,
            14 => MsgType::Stats,
            7 => MsgType::Lease,
            8 => MsgType::Prepare,
            9 => MsgType::Commit,
            10 => MsgType::Gather,
            11 => MsgType::Install,
            12 => MsgType::Ready,
            13 => MsgType::Config,
            15 => MsgType::PutIf,
            16 => MsgType::DelIf,
            17 => MsgType::Scan,
            18 => MsgType::Load,
            19 => MsgType::Migrate,
            20 => MsgType::GetMigrating,
            21 => MsgType::Reshard,
            0x80 => MsgType::Response,
            _ => return None,
        })
    }
}

/// A frame's body, borrowing its byte fields from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    Get {
        key: &'a [u8],
    },
    Put {
        key: &'a [u8],
        value: &'a [u8],
        /// The client's request record; `None`: executed each time it arrives.
        request: Option<RequestRecord>,
        /// Unix time in milliseconds from which the value reads as absent.
        expires_at_ms: Option<u64>,
    },
    Del {
        key: &'a [u8],
        request: Option<RequestRecord>,
    },
    /// A `Put` executed only if `expect` holds for the key.
    PutIf {
        key: &'a [u8],
        value: &'a [u8],
        request: Option<RequestRecord>,
        expires_at_ms: Option<u64>,
        expect: Expect,
    },
    /// A `Del` executed only if `expect` holds for the key.
    DelIf {
        key: &'a [u8],
        request: Option<RequestRecord>,
        expect: Expect,
    },
    /// Keys of `shard` with a live value, from `cursor` (0: the start), about
    /// `count` of them: answered `Response::Keys` by the shard's primary.
    Scan {
        shard: ShardId,
        cursor: u64,
        count: u32,
    },
    /// One or more encoded log entries, replicated by RPC: non-empty, a multiple of 64 B.
    Replicate {
        entries: &'a [u8],
    },
    /// Ask a backup for a segment for remote log `log`; `sealed`: the segment the
    /// sender filled and will not write again.
    GrantSegment {
        log: u32,
        sealed: Option<u32>,
    },
    Ping,
    /// A server renews its lease with the configuration manager (CM).
    Lease,
    /// The CM committed the configuration of `term` to the coordination store:
    /// adopt it, block requests, drop connections to removed servers, answer.
    Prepare {
        term: Term,
    },
    /// Every server answered `Prepare` for `term` and the failed servers' leases
    /// expired: unblock.
    Commit {
        term: Term,
    },
    /// The entries of `shard` that may not be on every replica, from `cursor`
    /// (answered with `Response::Entries`).
    Gather {
        shard: ShardId,
        cursor: u32,
    },
    /// Encoded log entries of `shard` to install (promotion's scatter,
    /// re-replication, cold start): non-empty, a multiple of 64 B.
    Install {
        shard: ShardId,
        entries: &'a [u8],
    },
    /// Re-replication of `shard` to `node` is complete.
    Ready {
        shard: ShardId,
        node: NodeId,
    },
    /// Ask the CM for the configuration it stores, from byte `offset` of its
    /// JSON (answered with `Response::Config`, one page a frame): how a
    /// process that cannot read the coordination store learns it.
    Config {
        offset: u32,
    },
    /// Ask a server's control role for its state (`rowankv status`): answered
    /// with `Response::Value`, the value a JSON object, the version its term.
    Stats,
    /// A server's load over its last statistics window of `window_ms` (seed
    /// 000 §4.6), for the CM: per shard, the client requests it received as
    /// the primary and the replication writes it sent per backup. `entries`:
    /// [`LOAD_ENTRY_BYTES`] each, shard ids strictly ascending
    /// ([`encode_load_entries`], [`load_entries`]).
    Load {
        window_ms: u32,
        entries: &'a [u8],
    },
    /// A migration's source hands `shard` over to its target (seed 000 §4.6):
    /// the next version to assign (so versions keep growing across the move)
    /// and one page of the shard's request table ([`MIGRATE_OUTCOME_BYTES`]
    /// each: [`encode_outcomes`], [`outcomes_in`]), so a retried write that
    /// the source executed is not executed again at the target. `last`: the
    /// final page; the target serves the shard from then on.
    Migrate {
        shard: ShardId,
        next_version: u64,
        last: bool,
        outcomes: &'a [u8],
    },
    /// A GET of a key of a migrating shard that the target does not hold yet,
    /// sent to the migration's source, which answers from its index.
    GetMigrating {
        key: &'a [u8],
    },
    /// An operator asks the active CM to move `shard`'s primary to `to` (a
    /// migration, seed 000 §4.6); answered `Ok` with the term that lists it.
    Reshard {
        shard: ShardId,
        to: NodeId,
    },
    Response(Response<'a>),
}

/// Bytes of one request outcome in a `Migrate` body.
pub const MIGRATE_OUTCOME_BYTES: usize = 32;
/// Bytes of a `Migrate` body before its outcomes.
pub const MIGRATE_FIXED_BYTES: usize = 2 + 8 + 1;

/// The outcomes of a `Migrate` body: `(record, version)` each.
pub fn encode_outcomes(outcomes: &[(RequestRecord, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(outcomes.len() * MIGRATE_OUTCOME_BYTES);
    for (r, version) in outcomes {
        out.extend_from_slice(&r.id.client.to_le_bytes());
        out.extend_from_slice(&r.id.seq.to_le_bytes());
        out.extend_from_slice(&r.first_incomplete.to_le_bytes());
        out.extend_from_slice(&version.to_le_bytes());
    }
    out
}

/// The outcomes of a decoded `Migrate` body.
pub fn outcomes_in(outcomes: &[u8]) -> impl Iterator<Item = (RequestRecord, u64)> + '_ {
    outcomes.chunks_exact(MIGRATE_OUTCOME_BYTES).map(|e| {
        let u64_at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
        (
            RequestRecord {
                id: RequestId {
                    client: u64_at(0),
                    seq: u64_at(8),
                },
                first_incomplete: u64_at(16),
            },
            u64_at(24),
        )
    })
}

fn check_outcomes(outcomes: &[u8]) -> Result<usize, FrameError> {
    if !outcomes.len().is_multiple_of(MIGRATE_OUTCOME_BYTES) {
        return Err(FrameError::FieldLength(format!(
            "migrate: outcomes must be a multiple of {MIGRATE_OUTCOME_BYTES} bytes, got {} bytes",
            outcomes.len()
        )));
    }
    for (r, _) in outcomes_in(outcomes) {
        check_request(&Some(r))?;
        if r.id.client == 0 {
            return Err(FrameError::BadRequest {
                client: 0,
                seq: r.id.seq,
                first_incomplete: r.first_incomplete,
            });
        }
    }
    Ok(outcomes.len())
}

/// Bytes of one shard's entry in a `Load` body.
pub const LOAD_ENTRY_BYTES: usize = 2 + 8 + 8;

/// The entries of a `Load` body: `(shard, requests, replication writes)`,
/// sorted by shard (duplicates of a shard are summed).
pub fn encode_load_entries(loads: &[(ShardId, u64, u64)]) -> Vec<u8> {
    let mut merged: std::collections::BTreeMap<u16, (u64, u64)> = Default::default();
    for &(shard, r, w) in loads {
        let e = merged.entry(shard.0).or_default();
        e.0 = e.0.saturating_add(r);
        e.1 = e.1.saturating_add(w);
    }
    let mut out = Vec::with_capacity(merged.len() * LOAD_ENTRY_BYTES);
    for (shard, (r, w)) in merged {
        out.extend_from_slice(&shard.to_le_bytes());
        out.extend_from_slice(&r.to_le_bytes());
        out.extend_from_slice(&w.to_le_bytes());
    }
    out
}

/// The entries of a decoded `Load` body.
pub fn load_entries(entries: &[u8]) -> impl Iterator<Item = (ShardId, u64, u64)> + '_ {
    entries.chunks_exact(LOAD_ENTRY_BYTES).map(|e| {
        let u64_at = |i: usize| u64::from_le_bytes(e[i..i + 8].try_into().expect("8 bytes"));
        (
            ShardId(u16::from_le_bytes([e[0], e[1]])),
            u64_at(2),
            u64_at(10),
        )
    })
}

fn check_load_entries(entries: &[u8]) -> Result<usize, FrameError> {
    if !entries.len().is_multiple_of(LOAD_ENTRY_BYTES) {
        return Err(FrameError::FieldLength(format!(
            "load: entries must be a multiple of {LOAD_ENTRY_BYTES} bytes, got {} bytes",
            entries.len()
        )));
    }
    let mut previous: Option<ShardId> = None;
    for (shard, _, _) in load_entries(entries) {
        if previous.is_some_and(|p| p >= shard) {
            return Err(FrameError::FieldLength(format!(
                "load: {shard} is not after the previous entry's shard (ids strictly ascending)"
            )));
        }
        previous = Some(shard);
    }
    Ok(entries.len())
}

impl Body<'_> {
    /// Whether this is a client's write (PUT or DEL, conditional or not).
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Body::Put { .. } | Body::Del { .. } | Body::PutIf { .. } | Body::DelIf { .. }
        )
    }

    /// The message type this body travels under.
    pub fn msg_type(&self) -> MsgType {
        match self {
            Body::Get { .. } => MsgType::Get,
            Body::Put { .. } => MsgType::Put,
            Body::Del { .. } => MsgType::Del,
            Body::PutIf { .. } => MsgType::PutIf,
            Body::DelIf { .. } => MsgType::DelIf,
            Body::Scan { .. } => MsgType::Scan,
            Body::Load { .. } => MsgType::Load,
            Body::Migrate { .. } => MsgType::Migrate,
            Body::GetMigrating { .. } => MsgType::GetMigrating,
            Body::Reshard { .. } => MsgType::Reshard,
            Body::Replicate { .. } => MsgType::Replicate,
            Body::GrantSegment { .. } => MsgType::GrantSegment,
            Body::Ping => MsgType::Ping,
            Body::Stats => MsgType::Stats,
            Body::Lease => MsgType::Lease,
            Body::Prepare { .. } => MsgType::Prepare,
            Body::Commit { .. } => MsgType::Commit,
            Body::Gather { .. } => MsgType::Gather,
            Body::Install { .. } => MsgType::Install,
            Body::Ready { .. } => MsgType::Ready,
            Body::Config { .. } => MsgType::Config,
            Body::Response(_) => MsgType::Response,
        }
    }

    /// The encoded body length, after checking the limits that do not depend on the
    /// frame size.
    fn encoded_len(&self) -> Result<usize, FrameError> {
        fn check_key(key: &[u8]) -> Result<(), FrameError> {
            if key.len() > KEY_BYTES_MAX {
                return Err(FrameError::KeyTooLarge { len: key.len() });
            }
            Ok(())
        }
        Ok(match self {
            Body::Get { key } | Body::GetMigrating { key } => {
                check_key(key)?;
                KEY_FIXED_BYTES + key.len()
            }
            Body::Migrate { outcomes, .. } => MIGRATE_FIXED_BYTES + check_outcomes(outcomes)?,
            Body::Reshard { .. } => RESHARD_BYTES,
            Body::Del { key, request } => {
                check_key(key)?;
                check_request(request)?;
                REQUEST_BYTES + KEY_FIXED_BYTES + key.len()
            }
            Body::Put {
                key,
                value,
                request,
                ..
            } => {
                check_request(request)?;
                check_key(key)?;
                // Saturating: an absurd value length must end in TooLarge, not overflow.
                (PUT_FIXED_BYTES + key.len()).saturating_add(value.len())
            }
            Body::PutIf {
                key,
                value,
                request,
                expect,
                ..
            } => {
                check_expect(expect)?;
                check_request(request)?;
                check_key(key)?;
                (EXPECT_BYTES + PUT_FIXED_BYTES + key.len()).saturating_add(value.len())
            }
            Body::DelIf {
                key,
                request,
                expect,
            } => {
                check_expect(expect)?;
                check_key(key)?;
                check_request(request)?;
                EXPECT_BYTES + REQUEST_BYTES + KEY_FIXED_BYTES + key.len()
            }
            Body::Scan { .. } => SCAN_BYTES,
            Body::Load { entries, .. } => 4 + check_load_entries(entries)?,
            Body::Response(Response::Keys { keys, .. }) => {
                check_keys(keys)?;
                1 + 8 + keys.len()
            }
            Body::Replicate { entries } => check_entries(entries, "replicate")?,
            Body::GrantSegment { .. } => GRANT_SEGMENT_BYTES,
            Body::Ping | Body::Lease | Body::Stats => 0,
            Body::Config { .. } => 4,
            Body::Prepare { .. } | Body::Commit { .. } => 8,
            Body::Gather { .. } => GATHER_BYTES,
            Body::Install { entries, .. } => 2 + check_entries(entries, "install")?,
            Body::Ready { .. } => READY_BYTES,
            Body::Response(Response::Entries { entries, .. }) => {
                if !entries.len().is_multiple_of(ENTRY_ALIGN_BYTES) {
                    return Err(FrameError::FieldLength(format!(
                        "entries must be a multiple of {ENTRY_ALIGN_BYTES} bytes, got {} bytes",
                        entries.len()
                    )));
                }
                1 + 4 + 1 + entries.len()
            }
            Body::Response(Response::Ok { .. }) => 1 + 8,
            Body::Response(Response::Value { value, .. }) => {
                VALUE_RESPONSE_FIXED_BYTES.saturating_add(value.len())
            }
            Body::Response(Response::NotFound) => 1,
            Body::Response(Response::Config { chunk, .. }) => {
                CONFIG_RESPONSE_FIXED_BYTES.saturating_add(chunk.len())
            }
            Body::Response(Response::Segment { .. }) => 1 + 4 + 8 + 8,
            Body::Response(Response::Error { detail, .. }) => {
                if detail.len() > u16::MAX as usize {
                    return Err(FrameError::FieldLength(format!(
                        "error detail of {} bytes exceeds the {}-byte field",
                        detail.len(),
                        u16::MAX
                    )));
                }
                ERROR_RESPONSE_FIXED_BYTES + detail.len()
            }
        })
    }
}

/// The length of a non-empty, 64 B-aligned run of entries, or why it is not one.
fn check_entries(entries: &[u8], what: &str) -> Result<usize, FrameError> {
    if entries.is_empty() || !entries.len().is_multiple_of(ENTRY_ALIGN_BYTES) {
        return Err(FrameError::FieldLength(format!(
            "{what}: entries must be a non-empty multiple of {ENTRY_ALIGN_BYTES} bytes, \
             got {} bytes",
            entries.len()
        )));
    }
    Ok(entries.len())
}

/// The answer to any request, matched to it by `request_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// A PUT or DEL is durable on every replica at this shard version.
    Ok { version: u64 },
    /// A GET found the key: its value, version and expiry time (Unix ms).
    Value {
        version: u64,
        value: &'a [u8],
        expires_at_ms: Option<u64>,
    },
    /// A GET did not find the key (or found its tombstone).
    NotFound,
    /// A segment granted to a GrantSegment: where the sender may write.
    Segment {
        segment: u32,
        offset: u64,
        len_bytes: u64,
    },
    /// The request was refused; `term` is the server's term, so that a client with a
    /// stale configuration learns it must refresh.
    Error {
        code: ErrorCode,
        term: Term,
        detail: &'a str,
    },
    /// A page of a `Gather`: encoded entries; `more`: ask again from `next`.
    Entries {
        next: u32,
        more: bool,
        entries: &'a [u8],
    },
    /// A page of a `Scan`: keys (each `key_len u16, key`: [`keys_in`] reads
    /// them, [`put_key`] writes them); `next`: the cursor to ask from, 0 when
    /// the shard is done.
    Keys { next: u64, keys: &'a [u8] },
    /// A page of the configuration the CM stores (`Config::to_json`): of
    /// `term`, `total` bytes in all, `chunk` from the request's offset.
    Config {
        term: Term,
        total: u32,
        chunk: &'a [u8],
    },
}

/// Why a request was refused.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request carries an older term than the server's.
    StaleTerm = 1,
    /// The server is not the primary of the key's shard in its configuration.
    NotPrimary = 2,
    /// The frame, key or value exceeds a limit.
    TooLarge = 3,
    /// The frame could not be decoded.
    Malformed = 4,
    /// The message type is unknown to the server.
    UnknownType = 5,
    /// An in-flight bound is reached; retry later.
    Busy = 6,
    /// The shard does not serve requests for now (failover, recovery or migration).
    Blocked = 7,
    /// No free segment is left.
    OutOfSpace = 8,
    /// The frame carries another cluster's id.
    WrongCluster = 9,
    /// A fault inside the server.
    Internal = 10,
    /// The sender is not a member of the configuration (a server removed by
    /// failover), or the receiver is not the active configuration manager.
    NotMember = 11,
    /// A write's request id is below its client's acknowledged floor: the client
    /// had its answer long ago, and the request is not executed again.
    Duplicate = 12,
    /// A conditional write's condition did not hold (or another write of the
    /// key was in flight): nothing was written.
    ConditionFailed = 13,
    /// A `GrantSegment` names a remote log the backup does not hold for the
    /// sender (any more): the backup ended it when another path of the sender
    /// arrived. The sender gives its path up and dials anew.
    UnknownLog = 14,
    /// The target of a migrating shard does not hold the key yet (seed 000
    /// §4.6): read it from the migration's source with `GetMigrating`.
    AskSource = 15,
}

impl ErrorCode {
    pub fn from_u8(b: u8) -> Option<ErrorCode> {
        Some(match b {
            1 => ErrorCode::StaleTerm,
            2 => ErrorCode::NotPrimary,
            3 => ErrorCode::TooLarge,
            4 => ErrorCode::Malformed,
            5 => ErrorCode::UnknownType,
            6 => ErrorCode::Busy,
            7 => ErrorCode::Blocked,
            8 => ErrorCode::OutOfSpace,
            9 => ErrorCode::WrongCluster,
            10 => ErrorCode::Internal,
            11 => ErrorCode::NotMember,
            12 => ErrorCode::Duplicate,
            13 => ErrorCode::ConditionFailed,
            14 => ErrorCode::UnknownLog,
            15 => ErrorCode::AskSource,
            _ => return None,
        })
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorCode::StaleTerm => "stale term",
            ErrorCode::NotPrimary => "not the primary of the shard",
            ErrorCode::TooLarge => "too large",
            ErrorCode::Malformed => "malformed frame",
            ErrorCode::UnknownType => "unknown message type",
            ErrorCode::Busy => "server busy",
            ErrorCode::Blocked => "shard blocked",
            ErrorCode::OutOfSpace => "out of space",
            ErrorCode::WrongCluster => "wrong cluster",
            ErrorCode::Internal => "internal error",
            ErrorCode::NotMember => "not a member",
            ErrorCode::Duplicate => "duplicate request",
            ErrorCode::ConditionFailed => "condition failed",
            ErrorCode::UnknownLog => "unknown remote log",
            ErrorCode::AskSource => "not migrated here yet: ask the migration's source",
        })
    }
}

/// A decoded frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub header: Header,
    pub body: Body<'a>,
}

/// Everything that can be wrong with a frame, on either side of the wire.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("bad magic {0:02x?}: a RowanKV frame starts with \"RK\" ([52, 4b])")]
    BadMagic([u8; 2]),
    #[error("unsupported wire version {0} (this build speaks version {WIRE_VERSION})")]
    BadVersion(u8),
    #[error("reserved header bytes 36..40 are not zero")]
    ReservedNonZero,
    #[error("unknown message type {0:#04x}")]
    UnknownType(u8),
    #[error("header declares a {declared}-byte body but {actual} bytes follow the header")]
    BodyLength { declared: usize, actual: usize },
    #[error("key of {len} bytes exceeds the {KEY_BYTES_MAX}-byte limit")]
    KeyTooLarge { len: usize },
    #[error("bad field length: {0}")]
    FieldLength(String),
    #[error("bad request record: client {client}, seq {seq}, first_incomplete {first_incomplete} (client 0 only with all zeros; seq below 2^40; first_incomplete at most seq)")]
    BadRequest {
        client: u64,
        seq: u64,
        first_incomplete: u64,
    },
    #[error("{0} trailing bytes after the end of the body")]
    TrailingBytes(usize),
    #[error("unknown error code {0} in an error response")]
    BadErrorCode(u8),
    #[error("unknown response status {0}")]
    BadStatus(u8),
    #[error("error detail is not valid UTF-8")]
    BadUtf8,
    #[error("frame of {len} bytes exceeds the {max}-byte frame limit")]
    TooLarge { len: usize, max: usize },
}

impl FrameError {
    /// The error code a server answers this with: UnknownType → UnknownType,
    /// TooLarge/KeyTooLarge → TooLarge, everything else → Malformed.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameError::UnknownType(_) => ErrorCode::UnknownType,
            FrameError::TooLarge { .. } | FrameError::KeyTooLarge { .. } => ErrorCode::TooLarge,
            _ => ErrorCode::Malformed,
        }
    }
}

/// Encode into `out` (cleared first) and return the frame's length. Fails with
/// TooLarge if the frame would exceed `frame_bytes_max`, with KeyTooLarge for a key
/// over KEY_BYTES_MAX, with FieldLength for an empty/misaligned Replicate or a detail
/// over u16. Does not allocate when `out` has capacity. On error `out` is left empty.
pub fn encode(
    out: &mut Vec<u8>,
    env: &Envelope,
    body: &Body<'_>,
    frame_bytes_max: usize,
) -> Result<usize, FrameError> {
    out.clear();
    let body_len = body.encoded_len()?;
    let frame_bytes = HEADER_BYTES.saturating_add(body_len);
    let max = frame_bytes_max.min(FRAME_BYTES_LIMIT);
    if frame_bytes > max {
        return Err(FrameError::TooLarge {
            len: frame_bytes,
            max,
        });
    }
    // Cannot truncate: body_len <= FRAME_BYTES_LIMIT - HEADER_BYTES = u32::MAX.
    let body_len_u32 = body_len as u32;
    out.reserve(frame_bytes);

    out.extend_from_slice(&MAGIC);
    out.push(WIRE_VERSION);
    out.push(body.msg_type() as u8);
    out.extend_from_slice(&body_len_u32.to_le_bytes());
    out.extend_from_slice(&env.cluster_id.to_le_bytes());
    out.extend_from_slice(&env.term.0.to_le_bytes());
    out.extend_from_slice(&env.request_id.to_le_bytes());
    out.extend_from_slice(&env.sender.0.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    assert_eq!(out.len(), HEADER_BYTES);

    match body {
        Body::Get { key } => {
            put_u16(out, key.len());
            out.extend_from_slice(key);
        }
        Body::Del { key, request } => {
            put_request(out, request);
            put_u16(out, key.len());
            out.extend_from_slice(key);
        }
        Body::Put {
            key,
            value,
            request,
            expires_at_ms,
        } => {
            put_request(out, request);
            put_expiry(out, *expires_at_ms);
            put_u16(out, key.len());
            put_u32(out, value.len());
            out.extend_from_slice(key);
            out.extend_from_slice(value);
        }
        Body::PutIf {
            key,
            value,
            request,
            expires_at_ms,
            expect,
        } => {
            put_expect(out, expect);
            put_request(out, request);
            put_expiry(out, *expires_at_ms);
            put_u16(out, key.len());
            put_u32(out, value.len());
            out.extend_from_slice(key);
            out.extend_from_slice(value);
        }
        Body::DelIf {
            key,
            request,
            expect,
        } => {
            put_expect(out, expect);
            put_request(out, request);
            put_u16(out, key.len());
            out.extend_from_slice(key);
        }
        Body::Scan {
            shard,
            cursor,
            count,
        } => {
            out.extend_from_slice(&shard.0.to_le_bytes());
            out.extend_from_slice(&cursor.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
        Body::Replicate { entries } => out.extend_from_slice(entries),
        Body::Load { window_ms, entries } => {
            out.extend_from_slice(&window_ms.to_le_bytes());
            out.extend_from_slice(entries);
        }
        Body::GrantSegment { log, sealed } => {
            out.extend_from_slice(&log.to_le_bytes());
            out.push(u8::from(sealed.is_some()));
            out.extend_from_slice(&sealed.unwrap_or(0).to_le_bytes());
        }
        Body::Ping | Body::Lease | Body::Stats => {}
        Body::Config { offset } => out.extend_from_slice(&offset.to_le_bytes()),
        Body::Prepare { term } | Body::Commit { term } => {
            out.extend_from_slice(&term.0.to_le_bytes())
        }
        Body::Gather { shard, cursor } => {
            out.extend_from_slice(&shard.0.to_le_bytes());
            out.extend_from_slice(&cursor.to_le_bytes());
        }
        Body::Install { shard, entries } => {
            out.extend_from_slice(&shard.0.to_le_bytes());
            out.extend_from_slice(entries);
        }
        Body::Ready { shard, node } | Body::Reshard { shard, to: node } => {
            out.extend_from_slice(&shard.0.to_le_bytes());
            out.extend_from_slice(&node.0.to_le_bytes());
        }
        Body::Migrate {
            shard,
            next_version,
            last,
            outcomes,
        } => {
            out.extend_from_slice(&shard.0.to_le_bytes());
            out.extend_from_slice(&next_version.to_le_bytes());
            out.push(u8::from(*last));
            out.extend_from_slice(outcomes);
        }
        Body::GetMigrating { key } => {
            put_u16(out, key.len());
            out.extend_from_slice(key);
        }
        Body::Response(response) => match response {
            Response::Ok { version } => {
                out.push(STATUS_OK);
                out.extend_from_slice(&version.to_le_bytes());
            }
            Response::Value {
                version,
                value,
                expires_at_ms,
            } => {
                out.push(STATUS_VALUE);
                out.extend_from_slice(&version.to_le_bytes());
                put_expiry(out, *expires_at_ms);
                put_u32(out, value.len());
                out.extend_from_slice(value);
            }
            Response::NotFound => out.push(STATUS_NOT_FOUND),
            Response::Config { term, total, chunk } => {
                out.push(STATUS_CONFIG);
                out.extend_from_slice(&term.0.to_le_bytes());
                out.extend_from_slice(&total.to_le_bytes());
                put_u32(out, chunk.len());
                out.extend_from_slice(chunk);
            }
            Response::Segment {
                segment,
                offset,
                len_bytes,
            } => {
                out.push(STATUS_SEGMENT);
                out.extend_from_slice(&segment.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len_bytes.to_le_bytes());
            }
            Response::Error { code, term, detail } => {
                out.push(STATUS_ERROR);
                out.push(*code as u8);
                out.extend_from_slice(&term.0.to_le_bytes());
                put_u16(out, detail.len());
                out.extend_from_slice(detail.as_bytes());
            }
            Response::Keys { next, keys } => {
                out.push(STATUS_KEYS);
                out.extend_from_slice(&next.to_le_bytes());
                out.extend_from_slice(keys);
            }
            Response::Entries {
                next,
                more,
                entries,
            } => {
                out.push(STATUS_ENTRIES);
                out.extend_from_slice(&next.to_le_bytes());
                out.push(u8::from(*more));
                out.extend_from_slice(entries);
            }
        },
    }
    assert_eq!(
        out.len(),
        frame_bytes,
        "encoded length disagrees with encoded_len"
    );
    Ok(frame_bytes)
}

/// Writes a length already checked to fit a u16.
fn put_u16(out: &mut Vec<u8>, len: usize) {
    let len = u16::try_from(len).expect("length checked to fit a u16 before encoding");
    out.extend_from_slice(&len.to_le_bytes());
}

/// Writes a length already checked to fit a u32 (it is shorter than the body).
fn put_u32(out: &mut Vec<u8>, len: usize) {
    let len = u32::try_from(len).expect("length checked to fit a u32 before encoding");
    out.extend_from_slice(&len.to_le_bytes());
}

/// Just the header (so a server can answer a frame whose body is bad with the right
/// request_id). Checks magic, version and the reserved bytes; needs only the first
/// [`HEADER_BYTES`] bytes and checks neither the message type nor the body length.
pub fn decode_header(bytes: &[u8]) -> Result<Header, FrameError> {
    let Some(header) = bytes.first_chunk::<HEADER_BYTES>() else {
        return Err(FrameError::Truncated {
            need: HEADER_BYTES,
            have: bytes.len(),
        });
    };
    let magic = [header[0], header[1]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if header[2] != WIRE_VERSION {
        return Err(FrameError::BadVersion(header[2]));
    }
    if header[36..40] != [0; 4] {
        return Err(FrameError::ReservedNonZero);
    }
    let mut r = Reader::new(&header[3..36], "header");
    // The header is exactly long enough for these reads; errors cannot happen but
    // are propagated rather than unwrapped.
    Ok(Header {
        msg_type: r.u8("msg_type")?,
        body_len: r.u32("body_len")?,
        cluster_id: r.u64("cluster_id")?,
        term: Term(r.u64("term")?),
        request_id: r.u64("request_id")?,
        sender: NodeId(r.u32("sender")?),
    })
}

/// A whole frame, zero-copy. Never panics on any input.
pub fn decode(bytes: &[u8]) -> Result<Frame<'_>, FrameError> {
    let header = decode_header(bytes)?;
    let body_bytes = &bytes[HEADER_BYTES..];
    if body_bytes.len() != header.body_len as usize {
        return Err(FrameError::BodyLength {
            declared: header.body_len as usize,
            actual: body_bytes.len(),
        });
    }
    let msg_type =
        MsgType::from_u8(header.msg_type).ok_or(FrameError::UnknownType(header.msg_type))?;
    let body = decode_body(msg_type, body_bytes)?;
    Ok(Frame { header, body })
}

fn decode_body(msg_type: MsgType, bytes: &[u8]) -> Result<Body<'_>, FrameError> {
    let body = match msg_type {
        MsgType::Get => {
            let mut r = Reader::new(bytes, "get");
            let key = r.key()?;
            r.finish()?;
            Body::Get { key }
        }
        MsgType::Del => {
            let mut r = Reader::new(bytes, "del");
            let request = r.request()?;
            let key = r.key()?;
            r.finish()?;
            Body::Del { key, request }
        }
        MsgType::Put => {
            let (request, expires_at_ms, key, value) = Reader::new(bytes, "put").put_fields()?;
            Body::Put {
                key,
                value,
                request,
                expires_at_ms,
            }
        }
        MsgType::PutIf => {
            let mut r = Reader::new(bytes, "put-if");
            let expect = r.expect()?;
            let (request, expires_at_ms, key, value) = r.put_fields()?;
            Body::PutIf {
                key,
                value,
                request,
                expires_at_ms,
                expect,
            }
        }
        MsgType::DelIf => {
            let mut r = Reader::new(bytes, "del-if");
            let expect = r.expect()?;
            let request = r.request()?;
            let key = r.key()?;
            r.finish()?;
            Body::DelIf {
                key,
                request,
                expect,
            }
        }
        MsgType::Scan => {
            let mut r = Reader::new(bytes, "scan");
            let shard = ShardId(r.u16("shard")?);
            let cursor = r.u64("cursor")?;
            let count = r.u32("count")?;
            r.finish()?;
            Body::Scan {
                shard,
                cursor,
                count,
            }
        }
        MsgType::Replicate => {
            check_entries(bytes, "replicate")?;
            Body::Replicate { entries: bytes }
        }
        MsgType::Lease => {
            Reader::new(bytes, "lease").finish()?;
            Body::Lease
        }
        MsgType::Load => {
            let mut r = Reader::new(bytes, "load");
            let window_ms = r.u32("window_ms")?;
            let entries = &bytes[4..];
            check_load_entries(entries)?;
            Body::Load { window_ms, entries }
        }
        MsgType::Config => {
            let mut r = Reader::new(bytes, "config");
            let offset = r.u32("offset")?;
            r.finish()?;
            Body::Config { offset }
        }
        MsgType::Prepare | MsgType::Commit => {
            let mut r = Reader::new(bytes, "prepare/commit");
            let term = Term(r.u64("term")?);
            r.finish()?;
            if msg_type == MsgType::Prepare {
                Body::Prepare { term }
            } else {
                Body::Commit { term }
            }
        }
        MsgType::Gather => {
            let mut r = Reader::new(bytes, "gather");
            let shard = ShardId(r.u16("shard")?);
            let cursor = r.u32("cursor")?;
            r.finish()?;
            Body::Gather { shard, cursor }
        }
        MsgType::Install => {
            let mut r = Reader::new(bytes, "install");
            let shard = ShardId(r.u16("shard")?);
            let entries = r.take(r.bytes.len(), "entries")?;
            check_entries(entries, "install")?;
            Body::Install { shard, entries }
        }
        MsgType::Ready => {
            let mut r = Reader::new(bytes, "ready");
            let shard = ShardId(r.u16("shard")?);
            let node = NodeId(r.u32("node")?);
            r.finish()?;
            Body::Ready { shard, node }
        }
        MsgType::Reshard => {
            let mut r = Reader::new(bytes, "reshard");
            let shard = ShardId(r.u16("shard")?);
            let to = NodeId(r.u32("to")?);
            r.finish()?;
            Body::Reshard { shard, to }
        }
        MsgType::GetMigrating => {
            let mut r = Reader::new(bytes, "get-migrating");
            let key = r.key()?;
            r.finish()?;
            Body::GetMigrating { key }
        }
        MsgType::Migrate => {
            let mut r = Reader::new(bytes, "migrate");
            let shard = ShardId(r.u16("shard")?);
            let next_version = r.u64("next_version")?;
            let last = match r.u8("last")? {
                0 => false,
                1 => true,
                other => {
                    return Err(FrameError::FieldLength(format!(
                        "migrate: last must be 0 or 1, got {other}"
                    )))
                }
            };
            let outcomes = &bytes[MIGRATE_FIXED_BYTES..];
            check_outcomes(outcomes)?;
            Body::Migrate {
                shard,
                next_version,
                last,
                outcomes,
            }
        }
        MsgType::GrantSegment => {
            let mut r = Reader::new(bytes, "grant_segment");
            let log = r.u32("log")?;
            let has_sealed = r.u8("has_sealed")?;
            let sealed = r.u32("sealed")?;
            r.finish()?;
            let sealed = match (has_sealed, sealed) {
                (0, 0) => None,
                (0, other) => {
                    return Err(FrameError::FieldLength(format!(
                        "grant_segment: sealed must be 0 when has_sealed is 0, got {other}"
                    )))
                }
                (1, segment) => Some(segment),
                (other, _) => {
                    return Err(FrameError::FieldLength(format!(
                        "grant_segment: has_sealed must be 0 or 1, got {other}"
                    )))
                }
            };
            Body::GrantSegment { log, sealed }
        }
        MsgType::Ping => {
            Reader::new(bytes, "ping").finish()?;
            Body::Ping
        }
        MsgType::Stats => {
            Reader::new(bytes, "stats").finish()?;
            Body::Stats
        }
        MsgType::Response => Body::Response(decode_response(bytes)?),
    };
    Ok(body)
}

fn decode_response(bytes: &[u8]) -> Result<Response<'_>, FrameError> {
    let mut r = Reader::new(bytes, "response");
    let response = match r.u8("status")? {
        STATUS_OK => Response::Ok {
            version: r.u64("version")?,
        },
        STATUS_VALUE => {
            let version = r.u64("version")?;
            let expires_at_ms = r.expiry()?;
            let value_len = r.u32("value_len")? as usize;
            let value = r.take(value_len, "value")?;
            Response::Value {
                version,
                value,
                expires_at_ms,
            }
        }
        STATUS_NOT_FOUND => Response::NotFound,
        STATUS_CONFIG => {
            let term = Term(r.u64("term")?);
            let total = r.u32("total")?;
            let len = r.u32("len")? as usize;
            Response::Config {
                term,
                total,
                chunk: r.take(len, "chunk")?,
            }
        }
        STATUS_SEGMENT => Response::Segment {
            segment: r.u32("segment")?,
            offset: r.u64("offset")?,
            len_bytes: r.u64("len_bytes")?,
        },
        STATUS_ERROR => {
            let code_byte = r.u8("code")?;
            let code = ErrorCode::from_u8(code_byte).ok_or(FrameError::BadErrorCode(code_byte))?;
            let term = Term(r.u64("term")?);
            let detail_len = r.u16("detail_len")? as usize;
            let detail = r.take(detail_len, "detail")?;
            let detail = std::str::from_utf8(detail).map_err(|_| FrameError::BadUtf8)?;
            Response::Error { code, term, detail }
        }
        STATUS_KEYS => {
            let next = r.u64("next")?;
            let keys = r.take(r.bytes.len(), "keys")?;
            check_keys(keys)?;
            Response::Keys { next, keys }
        }
        STATUS_ENTRIES => {
            let next = r.u32("next")?;
            let more = match r.u8("more")? {
                0 => false,
                1 => true,
                other => {
                    return Err(FrameError::FieldLength(format!(
                        "entries: more must be 0 or 1, got {other}"
                    )))
                }
            };
            let entries = r.take(r.bytes.len(), "entries")?;
            if !entries.len().is_multiple_of(ENTRY_ALIGN_BYTES) {
                return Err(FrameError::FieldLength(format!(
                    "entries: must be a multiple of {ENTRY_ALIGN_BYTES} bytes, got {} bytes",
                    entries.len()
                )));
            }
            Response::Entries {
                next,
                more,
                entries,
            }
        }
        status => return Err(FrameError::BadStatus(status)),
    };
    r.finish()?;
    Ok(response)
}

/// Append `key` to the keys of a `Response::Keys`.
pub fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    put_u16(out, key.len());
    out.extend_from_slice(key);
}

/// Bytes `key` takes in a `Response::Keys`.
pub fn key_bytes(key: &[u8]) -> usize {
    2 + key.len()
}

/// The keys of a `Response::Keys` (checked when it was decoded).
pub fn keys_in(mut keys: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        if keys.len() < 2 {
            return None;
        }
        let len = u16::from_le_bytes([keys[0], keys[1]]) as usize;
        let key = keys.get(2..2 + len)?;
        keys = &keys[2 + len..];
        Some(key)
    })
}

/// Keys as a `Response::Keys` carries them: whole, each non-empty and at most
/// `KEY_BYTES_MAX`.
fn check_keys(mut keys: &[u8]) -> Result<(), FrameError> {
    while !keys.is_empty() {
        if keys.len() < 2 {
            return Err(FrameError::FieldLength(
                "keys: a truncated key length".into(),
            ));
        }
        let len = u16::from_le_bytes([keys[0], keys[1]]) as usize;
        if len == 0 || len > KEY_BYTES_MAX || keys.len() < 2 + len {
            return Err(FrameError::FieldLength(format!(
                "keys: a key of {len} bytes with {} left",
                keys.len() - 2
            )));
        }
        keys = &keys[2 + len..];
    }
    Ok(())
}

/// What a conditional write requires of its key's live value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The key has no live value.
    Absent,
    /// The key's live value has this version.
    Version(u64),
}

/// Bytes of an encoded [`Expect`].
pub const EXPECT_BYTES: usize = 9;

/// Version 0 names no write: a condition on it is refused, as the decoder
/// refuses it.
fn check_expect(expect: &Expect) -> Result<(), FrameError> {
    match expect {
        Expect::Version(0) => Err(FrameError::FieldLength(
            "a condition on version 0 (no write has it; use Absent)".into(),
        )),
        _ => Ok(()),
    }
}

/// A PUT's fields after its condition: request, expiry, key, value.
type PutFields<'a> = (Option<RequestRecord>, Option<u64>, &'a [u8], &'a [u8]);

/// An expiry as the wire carries it: tag 0 and 0 for none.
fn put_expiry(out: &mut Vec<u8>, expires_at_ms: Option<u64>) {
    out.push(u8::from(expires_at_ms.is_some()));
    out.extend_from_slice(&expires_at_ms.unwrap_or(0).to_le_bytes());
}

fn put_expect(out: &mut Vec<u8>, expect: &Expect) {
    let (tag, v) = match *expect {
        Expect::Absent => (1u8, 0u64),
        Expect::Version(v) => (2, v),
    };
    out.push(tag);
    out.extend_from_slice(&v.to_le_bytes());
}

/// A request record as the wire carries it: all zeros for none.
fn put_request(out: &mut Vec<u8>, request: &Option<RequestRecord>) {
    let (client, seq, first) =
        request.map_or((0, 0, 0), |r| (r.id.client, r.id.seq, r.first_incomplete));
    out.extend_from_slice(&client.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
}

fn check_request(request: &Option<RequestRecord>) -> Result<(), FrameError> {
    match request {
        Some(r) if !r.is_valid() => Err(FrameError::BadRequest {
            client: r.id.client,
            seq: r.id.seq,
            first_incomplete: r.first_incomplete,
        }),
        _ => Ok(()),
    }
}

/// A bounds-checked cursor over a body; every shortfall names the message and field.
struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, what }
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], FrameError> {
        if n > self.bytes.len() {
            return Err(FrameError::FieldLength(format!(
                "{}: {field} needs {n} bytes but only {} remain in the body",
                self.what,
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], FrameError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, FrameError> {
        self.array(field).map(u16::from_le_bytes)
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// The rest of a `Put` body (of a `PutIf` after its condition): request
    /// record, lengths, key and value, and nothing after them.
    #[allow(clippy::type_complexity)]
    fn put_fields(mut self) -> Result<PutFields<'a>, FrameError> {
        let request = self.request()?;
        let expires_at_ms = self.expiry()?;
        let key_len = self.key_len()?;
        let value_len = self.u32("value_len")? as usize;
        let key = self.take(key_len, "key")?;
        let value = self.take(value_len, "value")?;
        self.finish()?;
        Ok((request, expires_at_ms, key, value))
    }

    /// A PUT's or a value's expiry time.
    fn expiry(&mut self) -> Result<Option<u64>, FrameError> {
        let tag = self.u8("expiry tag")?;
        let at = self.u64("expiry time")?;
        match (tag, at) {
            (0, 0) => Ok(None),
            (1, at) => Ok(Some(at)),
            _ => Err(FrameError::FieldLength(format!(
                "an expiry of tag {tag} and time {at} (0 with 0: none; 1 with a time)"
            ))),
        }
    }

    /// A conditional write's condition.
    fn expect(&mut self) -> Result<Expect, FrameError> {
        let tag = self.u8("expect tag")?;
        let v = self.u64("expect version")?;
        match (tag, v) {
            (1, 0) => Ok(Expect::Absent),
            (2, v) if v > 0 => Ok(Expect::Version(v)),
            _ => Err(FrameError::FieldLength(format!(
                "a condition of tag {tag} and version {v} (1 with 0: absent; 2 with a version)"
            ))),
        }
    }

    /// A write's request record (all zeros: none).
    fn request(&mut self) -> Result<Option<RequestRecord>, FrameError> {
        let client = self.u64("request client")?;
        let seq = self.u64("request seq")?;
        let first_incomplete = self.u64("request first_incomplete")?;
        if client == 0 && seq == 0 && first_incomplete == 0 {
            return Ok(None);
        }
        let record = RequestRecord {
            id: RequestId { client, seq },
            first_incomplete,
        };
        check_request(&Some(record))?;
        Ok(Some(record))
    }

    fn key_len(&mut self) -> Result<usize, FrameError> {
        let len = self.u16("key_len")? as usize;
        if len > KEY_BYTES_MAX {
            return Err(FrameError::KeyTooLarge { len });
        }
        Ok(len)
    }

    fn key(&mut self) -> Result<&'a [u8], FrameError> {
        let len = self.key_len()?;
        self.take(len, "key")
    }

    fn finish(self) -> Result<(), FrameError> {
        match self.bytes.len() {
            0 => Ok(()),
            n => Err(FrameError::TrailingBytes(n)),
        }
    }
}

/// The largest value a Put with a key of `key_len` can carry in a frame of
/// `frame_bytes_max`. 0 when the key alone does not fit, or is over [`KEY_BYTES_MAX`]
/// (no Put can carry such a key at all).
pub fn put_value_bytes_max(key_len: usize, frame_bytes_max: usize) -> usize {
    if key_len > KEY_BYTES_MAX {
        return 0;
    }
    frame_bytes_max
        .min(FRAME_BYTES_LIMIT)
        .saturating_sub(HEADER_BYTES + PUT_FIXED_BYTES + key_len)
}

/// The largest value a Value response can carry in a frame of `frame_bytes_max`.
pub fn value_response_bytes_max(frame_bytes_max: usize) -> usize {
    frame_bytes_max
        .min(FRAME_BYTES_LIMIT)
        .saturating_sub(HEADER_BYTES + VALUE_RESPONSE_FIXED_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_msg_type_and_error_code_round_trips_through_its_byte() {
        for b in 0..=u8::MAX {
            if let Some(t) = MsgType::from_u8(b) {
                assert_eq!(t as u8, b);
            }
            if let Some(c) = ErrorCode::from_u8(b) {
                assert_eq!(c as u8, b);
            }
        }
    }

    #[test]
    fn reader_reports_the_field_that_ran_short() {
        let mut r = Reader::new(&[1, 2, 3], "put");
        assert_eq!(r.u16("key_len"), Ok(0x0201));
        let err = r.u32("value_len").unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad field length: put: value_len needs 4 bytes but only 1 remain in the body"
        );
    }
}
