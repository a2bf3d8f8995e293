//! Log entries: the on-media layout of one PUT, DEL or commit record, shared by the
//! t-logs (a worker thread's own log) and the b-log (what Rowan lands from primaries).
//!
//! The byte layout, its invariants and the assumptions about the medium are in
//! `docs/format/log-entry.md`; that page is the contract, this module implements it.
//! In short: an entry is one or more *blocks* (seed 000 §4.2.2, Figure 7); each block
//! is a 24 B header followed by its payload, padded with zeros to a multiple of 64 B
//! (§5.3), and no padded block is larger than the MTU. Every block carries the whole
//! metadata (kind, shard, version, lengths) plus `seq`/`cnt` and a CRC32C of itself,
//! so a block can be verified alone, wherever the NIC placed it.
//!
//! Format version 2 adds the *request record* (exactly-once retries, RIFL): a PUT or
//! DEL written for a client request may carry the request's [`RequestRecord`]
//! (client id, sequence number, the client's `first_incomplete`). Such an entry has
//! the format byte [`FORMAT_REQUEST`] in every block, and block 0's payload starts
//! with the 14 B record, before the key ([`encode_with_request`]). An entry without a
//! record is byte-for-byte a version 1 entry ([`encode`]), so pools written before
//! version 2 read unchanged.
//!
//! Format version 3 adds the *expiry time* of a PUT ([`encode_inner`]): format bit
//! [`FORMAT_EXPIRY_BIT`], and 8 B of Unix milliseconds after the record (if any),
//! before the key. Entries without one are unchanged.
//!
//! Decoders ([`parse_block`], [`parse_entry`], [`read_key`], [`Assembler::add`]) take
//! bytes from PM or the network: they never panic and never read past their input;
//! a malformed request record is a typed error ([`EntryError::BadRequest`]).
//! [`encode`], [`encode_with_request`] and [`parse_block`] do not allocate.

use std::borrow::Cow;
use std::collections::BTreeMap;

use rowankv_types::{RequestId, RequestRecord, ShardId, Version};

/// Alignment of every block: one cache line, the stride of a multi-packet SRQ.
pub const STRIDE_BYTES: usize = 64;
/// Size of a block header.
pub const HEADER_BYTES: usize = 24;
/// Largest key.
pub const KEY_BYTES_MAX: usize = 1024;
/// Largest number of blocks in one entry (`cnt` is a `u8`).
pub const BLOCKS_MAX: usize = 255;
/// Default MTU: the largest padded block.
pub const MTU_BYTES_DEFAULT: usize = 4096;
/// Smallest MTU: a header plus the largest key must fit in block 0, padded.
pub const MTU_BYTES_MIN: usize = 1088;
/// Largest MTU: a block's payload length must fit in the `u16` `payload_len`.
pub const MTU_BYTES_MAX: usize = 65536;
/// The `format` byte of an entry without a request record (format version 1, and
/// every entry version 2 writes without a record).
pub const FORMAT_V1: u8 = 1;
/// The `format` byte of an entry that carries a request record (format version 2):
/// block 0's payload starts with [`REQUEST_RECORD_BYTES`] of record, then the key.
/// (Byte 2 was a pre-release layout with a 24 B record, never released; it is
/// refused like any unknown format.)
pub const FORMAT_REQUEST: u8 = 3;
/// Size of a request record: client `u64`, seq `u40`, floor gap `u8`.
pub const REQUEST_RECORD_BYTES: usize = 14;
/// The bit of the `format` byte that says the entry carries an expiry time
/// (format version 3): block 0's payload holds [`EXPIRY_BYTES`] of it after the
/// request record (if any), before the key.
pub const FORMAT_EXPIRY_BIT: u8 = 4;
/// The `format` byte of a PUT with an expiry time and no request record.
pub const FORMAT_EXPIRY: u8 = FORMAT_V1 | FORMAT_EXPIRY_BIT;
/// The `format` byte of a PUT with a request record and an expiry time.
pub const FORMAT_REQUEST_EXPIRY: u8 = FORMAT_REQUEST | FORMAT_EXPIRY_BIT;
/// Size of an expiry time: Unix time in milliseconds, `u64`.
pub const EXPIRY_BYTES: usize = 8;
/// The most bytes before the key in block 0's payload: a request record and an
/// expiry time. Code that reads a key from raw bytes reads this far past the
/// header.
pub const RECORD_BYTES_MAX: usize = REQUEST_RECORD_BYTES + EXPIRY_BYTES;
/// The floor-gap byte meaning "no floor" (`first_incomplete` 0).
pub const FLOOR_GAP_NONE: u8 = 255;
/// Bound on the entries an [`Assembler`] holds incomplete at once.
pub const ASSEMBLER_PENDING_MAX: usize = 4096;
/// Bound on the payload bytes an [`Assembler`] holds in incomplete entries.
pub const ASSEMBLER_PENDING_BYTES_MAX: usize = 64 << 20;

const _: () = assert!(MTU_BYTES_MIN == round_up_stride(HEADER_BYTES + KEY_BYTES_MAX));
// A request record and the largest key fit block 0 at the smallest MTU.
const _: () =
    assert!(HEADER_BYTES + REQUEST_RECORD_BYTES + EXPIRY_BYTES + KEY_BYTES_MAX <= MTU_BYTES_MIN);
const _: () = assert!(MTU_BYTES_MIN.is_multiple_of(STRIDE_BYTES));
const _: () = assert!(MTU_BYTES_DEFAULT.is_multiple_of(STRIDE_BYTES));
const _: () = assert!(MTU_BYTES_MAX.is_multiple_of(STRIDE_BYTES));
const _: () = assert!(MTU_BYTES_MIN <= MTU_BYTES_DEFAULT && MTU_BYTES_DEFAULT <= MTU_BYTES_MAX);
const _: () = assert!(MTU_BYTES_MAX - HEADER_BYTES <= u16::MAX as usize);
const _: () = assert!(KEY_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(BLOCKS_MAX <= u8::MAX as usize);
// The largest value (at the largest MTU) fits in the `u32` `value_len`.
const _: () = assert!(value_bytes_max(MTU_BYTES_MAX) <= u32::MAX as usize);
// Two of the largest entries, interleaved, can be assembled at once: an entry never
// has to be dropped to make room for itself.
const _: () =
    assert!(ASSEMBLER_PENDING_BYTES_MAX >= 2 * BLOCKS_MAX * (MTU_BYTES_MAX - HEADER_BYTES));

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Write `value` under `key`.
    Put = 1,
    /// Delete `key`; the value is empty.
    Del = 2,
    /// A `<shard, CommitVer>` record: every entry of `shard` up to `version` is
    /// persisted on all replicas. Key and value are empty.
    Commit = 3,
}

impl TryFrom<u8> for Kind {
    type Error = EntryError;

    fn try_from(byte: u8) -> Result<Self, EntryError> {
        match byte {
            1 => Ok(Kind::Put),
            2 => Ok(Kind::Del),
            3 => Ok(Kind::Commit),
            other => Err(EntryError::BadKind(other)),
        }
    }
}

/// The decoded header of one block (the `crc32c` and `format` fields are checked by
/// [`parse_block`] and not kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub kind: Kind,
    pub shard: ShardId,
    pub version: Version,
    /// Index of this block within its entry, `0..cnt`.
    pub seq: u8,
    /// Number of blocks of the entry, `1..=BLOCKS_MAX`.
    pub cnt: u8,
    /// The entry's key length (same in every block).
    pub key_len: u16,
    /// The entry's total value length (same in every block).
    pub value_len: u32,
    /// Payload bytes in this block.
    pub payload_len: u16,
    /// The entry carries a request record (format byte [`FORMAT_REQUEST`], same in
    /// every block): block 0's payload starts with it.
    pub has_request: bool,
    /// The entry (a PUT) carries an expiry time ([`FORMAT_EXPIRY_BIT`] set in the
    /// format byte of every block): in block 0, after the request record.
    pub has_expiry: bool,
}

impl BlockHeader {
    /// Bytes this block occupies: header plus payload, rounded up to 64 B.
    pub fn padded_len(&self) -> usize {
        round_up_stride(HEADER_BYTES + self.payload_len as usize)
    }

    /// Bytes before the key in the entry's payload stream (request record ++
    /// expiry ++ key ++ value): [`REQUEST_RECORD_BYTES`] if it has a record, plus
    /// [`EXPIRY_BYTES`] if it has an expiry time. In block 0 the key starts here.
    pub fn record_bytes(&self) -> usize {
        record_bytes(self.has_request, self.has_expiry)
    }

    /// The format byte of its blocks.
    pub fn format(&self) -> u8 {
        format_byte(self.has_request, self.has_expiry)
    }
}

fn record_bytes(has_request: bool, has_expiry: bool) -> usize {
    let mut n = 0;
    if has_request {
        n += REQUEST_RECORD_BYTES;
    }
    if has_expiry {
        n += EXPIRY_BYTES;
    }
    n
}

fn format_byte(has_request: bool, has_expiry: bool) -> u8 {
    let mut f = FORMAT_V1;
    if has_request {
        f = FORMAT_REQUEST;
    }
    if has_expiry {
        f |= FORMAT_EXPIRY_BIT;
    }
    f
}

/// What a format byte says: `(has_request, has_expiry)`, or `None` for a byte
/// that is no format (2, 0, and anything above 7 or even).
pub fn format_flags(format: u8) -> Option<(bool, bool)> {
    match format {
        FORMAT_V1 => Some((false, false)),
        FORMAT_REQUEST => Some((true, false)),
        FORMAT_EXPIRY => Some((false, true)),
        FORMAT_REQUEST_EXPIRY => Some((true, true)),
        _ => None,
    }
}

/// Bytes before the key in block 0 of an entry whose `format` byte (byte 1 of a
/// block) is `format`: for code that locates the key in raw, not yet verified
/// bytes. 0 for a byte that is no format.
pub fn record_bytes_of_format(format: u8) -> usize {
    format_flags(format).map_or(0, |(r, e)| record_bytes(r, e))
}

/// The expiry time in block 0's `payload` of an entry with `header` (`None`
/// when it has none). The payload is a verified block 0's.
fn decode_expiry(header: &BlockHeader, payload: &[u8]) -> Option<u64> {
    if !header.has_expiry {
        return None;
    }
    let at = record_bytes(header.has_request, false);
    let mut b = [0u8; EXPIRY_BYTES];
    b.copy_from_slice(&payload[at..at + EXPIRY_BYTES]);
    Some(u64::from_le_bytes(b))
}

/// The 14 B on-media form of a request record, of its logged form
/// ([`RequestRecord::as_logged`]): client (`u64`), seq (low 40 bits, `u40`), and the
/// floor's gap below seq (`u8`; [`FLOOR_GAP_NONE`]: no floor), little-endian.
/// The caller has checked the record ([`RequestRecord::is_valid`]: seq below 2^40).
pub fn request_bytes(r: &RequestRecord) -> [u8; REQUEST_RECORD_BYTES] {
    let r = r.as_logged();
    let mut b = [0u8; REQUEST_RECORD_BYTES];
    b[0..8].copy_from_slice(&r.id.client.to_le_bytes());
    b[8..13].copy_from_slice(&r.id.seq.to_le_bytes()[..5]);
    let gap = r.id.seq - r.first_incomplete;
    b[13] = if gap <= RequestRecord::FLOOR_GAP_MAX {
        gap as u8
    } else {
        FLOOR_GAP_NONE
    };
    b
}

/// Decode and check a request record from the first 14 bytes of `bytes` (block 0's
/// payload). Malformed: `BadRequest` (client 0), `BadFloorGap` (a floor below 0); too
/// short: `Truncated`. Never panics.
pub fn decode_request(bytes: &[u8]) -> Result<RequestRecord, EntryError> {
    let Some(b) = bytes.get(..REQUEST_RECORD_BYTES) else {
        return Err(EntryError::Truncated {
            need: REQUEST_RECORD_BYTES,
            have: bytes.len(),
        });
    };
    let mut client = [0u8; 8];
    client.copy_from_slice(&b[0..8]);
    let client = u64::from_le_bytes(client);
    let mut seq = [0u8; 8];
    seq[..5].copy_from_slice(&b[8..13]);
    let seq = u64::from_le_bytes(seq);
    let gap = b[13];
    let first_incomplete = if gap == FLOOR_GAP_NONE {
        0
    } else {
        match seq.checked_sub(gap as u64) {
            Some(floor) => floor,
            None => return Err(EntryError::BadFloorGap { seq, gap }),
        }
    };
    let record = RequestRecord {
        id: RequestId { client, seq },
        first_incomplete,
    };
    check_request(&record)?;
    Ok(record)
}

fn check_request(r: &RequestRecord) -> Result<(), EntryError> {
    if r.is_valid() {
        Ok(())
    } else {
        Err(EntryError::BadRequest {
            client: r.id.client,
            seq: r.id.seq,
            first_incomplete: r.first_incomplete,
        })
    }
}

/// Why bytes are not a valid block or entry, or why an entry cannot be encoded.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum EntryError {
    /// The first 8 bytes are zero: the log ends here. Not corruption.
    #[error("end of log: zero header")]
    End,
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("bad kind {0}")]
    BadKind(u8),
    #[error("bad format {0}")]
    BadFormat(u8),
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch { stored: u32, computed: u32 },
    /// An inconsistent length, `seq` or `cnt` field, or blocks of one entry that
    /// disagree.
    #[error("bad length: {0}")]
    BadLength(String),
    #[error("key of {len} bytes exceeds {max}")]
    KeyTooLarge { len: usize, max: usize },
    #[error("value of {len} bytes exceeds {max}")]
    ValueTooLarge { len: usize, max: usize },
    /// Not a multiple of 64 in `MTU_BYTES_MIN..=MTU_BYTES_MAX`.
    #[error("bad mtu {0}")]
    BadMtu(usize),
    /// A malformed request record (to encode, or read from block 0 of a
    /// [`FORMAT_REQUEST`] entry): client 0 (no client), or `first_incomplete`
    /// above the request's own `seq`.
    #[error("bad request record: client {client}, seq {seq}, first_incomplete {first_incomplete}")]
    BadRequest {
        client: u64,
        seq: u64,
        first_incomplete: u64,
    },
    /// A request record whose floor gap reaches below seq 0.
    #[error("bad request record: floor gap {gap} below seq {seq}")]
    BadFloorGap { seq: u64, gap: u8 },
    /// An [`Assembler`] was full (`ASSEMBLER_PENDING_MAX` entries or
    /// `ASSEMBLER_PENDING_BYTES_MAX` payload bytes) and dropped its `dropped` oldest
    /// incomplete entries to hold a new block. Never returned by
    /// [`Assembler::add`] (the block was kept): whoever feeds the assembler reports
    /// it, from [`Assembler::take_dropped`], where that block lies.
    #[error("assembler full: dropped {dropped} oldest incomplete entries")]
    AssemblerFull { dropped: usize },
}

/// The largest value an entry may carry at this MTU: `BLOCKS_MAX` full blocks minus
/// the largest key. Conservative: a short key does not buy a longer value, so the
/// limit does not depend on the key.
pub const fn value_bytes_max(mtu_bytes: usize) -> usize {
    assert!(mtu_bytes >= MTU_BYTES_MIN);
    BLOCKS_MAX * (mtu_bytes - HEADER_BYTES) - KEY_BYTES_MAX
}

/// The largest value an entry with a request record may carry at this MTU:
/// [`value_bytes_max`] less the record's 14 B (the record, key and value share
/// `BLOCKS_MAX` blocks).
pub const fn value_bytes_max_with_request(mtu_bytes: usize) -> usize {
    value_bytes_max(mtu_bytes) - REQUEST_RECORD_BYTES
}

const fn round_up_stride(len: usize) -> usize {
    len.div_ceil(STRIDE_BYTES) * STRIDE_BYTES
}

fn mtu_is_valid(mtu_bytes: usize) -> bool {
    (MTU_BYTES_MIN..=MTU_BYTES_MAX).contains(&mtu_bytes) && mtu_bytes.is_multiple_of(STRIDE_BYTES)
}

/// Number of blocks of an entry of `total_len` payload bytes (key plus value), with
/// `capacity` payload bytes per block.
fn blocks_count(total_len: usize, capacity: usize) -> usize {
    total_len.div_ceil(capacity).max(1)
}

/// Size in bytes of the encoded entry (sum of padded blocks).
///
/// Panics if `mtu_bytes` is not a valid MTU (a programmer error).
pub fn encoded_len(key_len: usize, value_len: usize, mtu_bytes: usize) -> usize {
    encoded_len_for(key_len, value_len, false, false, mtu_bytes)
}

/// Size in bytes of the encoded entry with a request record.
///
/// Panics if `mtu_bytes` is not a valid MTU (a programmer error).
pub fn encoded_len_with_request(key_len: usize, value_len: usize, mtu_bytes: usize) -> usize {
    encoded_len_for(key_len, value_len, true, false, mtu_bytes)
}

/// Size in bytes of the encoded entry, with a request record or without, with
/// an expiry time or without.
///
/// Panics if `mtu_bytes` is not a valid MTU (a programmer error).
pub fn encoded_len_for(
    key_len: usize,
    value_len: usize,
    has_request: bool,
    has_expiry: bool,
    mtu_bytes: usize,
) -> usize {
    assert!(mtu_is_valid(mtu_bytes), "bad mtu {mtu_bytes}");
    let capacity = mtu_bytes - HEADER_BYTES;
    let total_len = record_bytes(has_request, has_expiry) + key_len + value_len;
    let cnt = blocks_count(total_len, capacity);
    let last_payload_len = total_len - (cnt - 1) * capacity;
    (cnt - 1) * mtu_bytes + round_up_stride(HEADER_BYTES + last_payload_len)
}

/// CRC32C of a block, `[0, 24 + payload_len)`, with the checksum field read as zero.
fn block_crc(header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[0..4]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    let crc = crc32c::crc32c_append(crc, &header[8..HEADER_BYTES]);
    crc32c::crc32c_append(crc, payload)
}

/// The header with a zero checksum field.
fn header_bytes(h: &BlockHeader) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    b[0] = h.kind as u8;
    b[1] = h.format();
    b[2..4].copy_from_slice(&h.shard.0.to_le_bytes());
    b[8..14].copy_from_slice(&h.version.0.to_le_bytes()[..6]);
    b[14] = h.seq;
    b[15] = h.cnt;
    b[16..18].copy_from_slice(&h.key_len.to_le_bytes());
    b[18..22].copy_from_slice(&h.value_len.to_le_bytes());
    b[22..24].copy_from_slice(&h.payload_len.to_le_bytes());
    b
}

/// Encode an entry without a request record into `out` (cleared first):
/// contiguous blocks, each padded to 64 B, none larger than `mtu_bytes`. Returns the
/// number of blocks. Does not allocate when `out` already has the capacity. The
/// bytes are those of format version 1.
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    shard: ShardId,
    version: Version,
    key: &[u8],
    value: &[u8],
    mtu_bytes: usize,
) -> Result<usize, EntryError> {
    encode_inner(out, kind, shard, version, key, value, None, None, mtu_bytes)
}

/// As [`encode`], for a PUT or DEL written for a client request: the entry carries
/// `request` (format byte [`FORMAT_REQUEST`]; block 0's payload starts with the 14 B
/// record, then the key). Refuses a Commit (`BadLength`), a malformed record
/// (`BadRequest`: client 0, seq at or above 2^40, or `first_incomplete > seq`), and a value above
/// [`value_bytes_max_with_request`]. Its length is [`encoded_len_with_request`].
#[allow(clippy::too_many_arguments)]
pub fn encode_with_request(
    out: &mut Vec<u8>,
    kind: Kind,
    shard: ShardId,
    version: Version,
    key: &[u8],
    value: &[u8],
    request: RequestRecord,
    mtu_bytes: usize,
) -> Result<usize, EntryError> {
    encode_inner(
        out,
        kind,
        shard,
        version,
        key,
        value,
        Some(request),
        None,
        mtu_bytes,
    )
}

/// The general form of [`encode`] and [`encode_with_request`]: a PUT may also
/// carry `expires_at_ms`, the Unix time in milliseconds from which it reads as
/// absent (format bit [`FORMAT_EXPIRY_BIT`]; [`EXPIRY_BYTES`] after the record,
/// before the key). Refuses an expiry on a Del or a Commit (`BadLength`).
#[allow(clippy::too_many_arguments)]
pub fn encode_inner(
    out: &mut Vec<u8>,
    kind: Kind,
    shard: ShardId,
    version: Version,
    key: &[u8],
    value: &[u8],
    request: Option<RequestRecord>,
    expires_at_ms: Option<u64>,
    mtu_bytes: usize,
) -> Result<usize, EntryError> {
    if !mtu_is_valid(mtu_bytes) {
        return Err(EntryError::BadMtu(mtu_bytes));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(EntryError::KeyTooLarge {
            len: key.len(),
            max: KEY_BYTES_MAX,
        });
    }
    let has_request = request.is_some();
    let has_expiry = expires_at_ms.is_some();
    let value_max = value_bytes_max(mtu_bytes) - record_bytes(has_request, has_expiry);
    if value.len() > value_max {
        return Err(EntryError::ValueTooLarge {
            len: value.len(),
            max: value_max,
        });
    }
    if version > Version::MAX {
        return Err(EntryError::BadLength(format!(
            "version {} exceeds 48 bits",
            version.0
        )));
    }
    match kind {
        Kind::Put => {}
        Kind::Del if !value.is_empty() => {
            return Err(EntryError::BadLength("a Del has no value".into()));
        }
        Kind::Commit if !key.is_empty() || !value.is_empty() => {
            return Err(EntryError::BadLength(
                "a Commit has no key and no value".into(),
            ));
        }
        Kind::Commit if has_request => {
            return Err(EntryError::BadLength(
                "a Commit has no request record".into(),
            ));
        }
        Kind::Del | Kind::Commit if has_expiry => {
            return Err(EntryError::BadLength(
                "only a Put has an expiry time".into(),
            ));
        }
        Kind::Del | Kind::Commit => {}
    }
    let record = match &request {
        Some(r) => {
            check_request(r)?;
            request_bytes(r)
        }
        None => [0u8; REQUEST_RECORD_BYTES],
    };
    let record = &record[..record_bytes(has_request, false)];
    let expiry = expires_at_ms.unwrap_or(0).to_le_bytes();
    let expiry = &expiry[..record_bytes(false, has_expiry)];

    let capacity = mtu_bytes - HEADER_BYTES;
    let key_len = key.len();
    // The payload stream: record ++ expiry ++ key ++ value, cut into blocks of
    // `capacity`.
    let total_len = record.len() + expiry.len() + key_len + value.len();
    let cnt = blocks_count(total_len, capacity);
    assert!(cnt <= BLOCKS_MAX);
    let len = encoded_len_for(key_len, value.len(), has_request, has_expiry, mtu_bytes);
    out.clear();
    out.reserve(len);

    for seq in 0..cnt {
        // This block carries bytes [begin, end) of the stream.
        let begin = seq * capacity;
        let end = (begin + capacity).min(total_len);
        let header = BlockHeader {
            kind,
            shard,
            version,
            seq: seq as u8,
            cnt: cnt as u8,
            key_len: key_len as u16,
            value_len: value.len() as u32,
            payload_len: (end - begin) as u16,
            has_request,
            has_expiry,
        };
        let start = out.len();
        out.extend_from_slice(&header_bytes(&header));
        let mut piece_start = 0;
        for piece in [record, expiry, key, value] {
            // The part of [begin, end) that falls in this piece of the stream.
            let piece_end = piece_start + piece.len();
            let from = begin.clamp(piece_start, piece_end) - piece_start;
            let to = end.clamp(piece_start, piece_end) - piece_start;
            out.extend_from_slice(&piece[from..to]);
            piece_start = piece_end;
        }
        let covered_end = out.len();
        let crc = block_crc(
            &out[start..start + HEADER_BYTES],
            &out[start + HEADER_BYTES..covered_end],
        );
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        out.resize(start + header.padded_len(), 0);
        assert!(header.padded_len() <= mtu_bytes);
    }
    assert_eq!(out.len(), len);
    Ok(cnt)
}

/// Checks a header on its own: fields that must agree with each other within one
/// block. Returns the payload capacity per block that the header implies (`None` for
/// a single-block entry, whose capacity is not recorded).
fn check_header(h: &BlockHeader) -> Result<Option<usize>, EntryError> {
    let bad = |what: String| Err(EntryError::BadLength(what));
    let cnt = h.cnt as usize;
    let seq = h.seq as usize;
    let key_len = h.key_len as usize;
    let value_len = h.value_len as usize;
    let payload_len = h.payload_len as usize;
    let record_len = h.record_bytes();
    if cnt == 0 {
        return bad("cnt 0".into());
    }
    if seq >= cnt {
        return bad(format!("seq {seq} not below cnt {cnt}"));
    }
    if key_len > KEY_BYTES_MAX {
        return Err(EntryError::KeyTooLarge {
            len: key_len,
            max: KEY_BYTES_MAX,
        });
    }
    match h.kind {
        Kind::Put => {}
        Kind::Del if value_len != 0 => return bad(format!("Del with value_len {value_len}")),
        Kind::Commit if key_len != 0 || value_len != 0 => {
            return bad(format!(
                "Commit with key_len {key_len}, value_len {value_len}"
            ));
        }
        Kind::Commit if h.has_request => return bad("Commit with a request record".into()),
        Kind::Del | Kind::Commit if h.has_expiry => {
            return bad(format!("{:?} with an expiry time", h.kind))
        }
        Kind::Del | Kind::Commit => {}
    }
    if h.padded_len() > MTU_BYTES_MAX {
        return bad(format!("payload_len {payload_len} exceeds the largest mtu"));
    }
    // The payload stream: request record (if any) ++ key ++ value.
    let total_len = record_len + key_len + value_len;
    if cnt == 1 {
        if payload_len != total_len {
            return bad(format!(
                "single block: payload_len {payload_len} != record+key+value {total_len}"
            ));
        }
        return Ok(None);
    }
    // Several blocks: all but the last are full, so each block pins the capacity.
    let capacity = if seq + 1 < cnt {
        payload_len
    } else {
        if payload_len == 0 || payload_len > total_len {
            return bad(format!(
                "last block: payload_len {payload_len}, record+key+value {total_len}"
            ));
        }
        let rest = total_len - payload_len;
        if !rest.is_multiple_of(cnt - 1) {
            return bad(format!(
                "last block: {rest} bytes do not split into {} blocks",
                cnt - 1
            ));
        }
        rest / (cnt - 1)
    };
    let mtu_bytes = capacity + HEADER_BYTES;
    if !mtu_is_valid(mtu_bytes) {
        return bad(format!("implied mtu {mtu_bytes} is not valid"));
    }
    if total_len <= (cnt - 1) * capacity || total_len > cnt * capacity {
        return bad(format!("{total_len} bytes in {cnt} blocks of {capacity}"));
    }
    let value_max = value_bytes_max(mtu_bytes) - record_len;
    if value_len > value_max {
        return Err(EntryError::ValueTooLarge {
            len: value_len,
            max: value_max,
        });
    }
    // Block 0 holds the whole record and key; implied by capacity >= MTU_BYTES_MIN -
    // 24 >= record + key_len (a const assertion).
    assert!(record_len + key_len <= capacity);
    Ok(Some(capacity))
}

/// Parse and verify one block at the start of `bytes` (`bytes` may be longer; it
/// must hold the padded block). Never panics, never reads past `bytes`, never
/// allocates (except to describe a `BadLength`). The padding is not checked. The
/// payload is returned whole: block 0 of an entry with a request record
/// (`has_request`) starts with the record, which is checked here (`BadRequest`;
/// [`decode_request`] reads it); the key follows it.
pub fn parse_block(bytes: &[u8]) -> Result<(BlockHeader, &[u8]), EntryError> {
    if bytes.len() >= 8 && bytes[..8].iter().all(|&b| b == 0) {
        return Err(EntryError::End);
    }
    let Some(b) = bytes.get(..HEADER_BYTES) else {
        return Err(EntryError::Truncated {
            need: HEADER_BYTES,
            have: bytes.len(),
        });
    };
    let kind = Kind::try_from(b[0])?;
    let Some((has_request, has_expiry)) = format_flags(b[1]) else {
        return Err(EntryError::BadFormat(b[1]));
    };
    let mut version = [0u8; 8];
    version[..6].copy_from_slice(&b[8..14]);
    let header = BlockHeader {
        kind,
        shard: ShardId(u16::from_le_bytes([b[2], b[3]])),
        version: Version(u64::from_le_bytes(version)),
        seq: b[14],
        cnt: b[15],
        key_len: u16::from_le_bytes([b[16], b[17]]),
        value_len: u32::from_le_bytes([b[18], b[19], b[20], b[21]]),
        payload_len: u16::from_le_bytes([b[22], b[23]]),
        has_request,
        has_expiry,
    };
    let padded_len = header.padded_len();
    if bytes.len() < padded_len {
        return Err(EntryError::Truncated {
            need: padded_len,
            have: bytes.len(),
        });
    }
    let payload = &bytes[HEADER_BYTES..HEADER_BYTES + header.payload_len as usize];
    let stored = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let computed = block_crc(b, payload);
    if stored != computed {
        return Err(EntryError::ChecksumMismatch { stored, computed });
    }
    check_header(&header)?;
    if has_request && header.seq == 0 {
        decode_request(payload)?;
    }
    Ok((header, payload))
}

/// A whole entry parsed from contiguous blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    pub kind: Kind,
    pub shard: ShardId,
    pub version: Version,
    /// The request record, if the entry was written for a client request
    /// (format byte [`FORMAT_REQUEST`]).
    pub request: Option<RequestRecord>,
    /// A PUT's expiry time, Unix milliseconds ([`FORMAT_EXPIRY_BIT`]).
    pub expires_at_ms: Option<u64>,
    pub key: &'a [u8],
    /// Borrowed when the entry is one block; assembled when it spans several.
    pub value: Cow<'a, [u8]>,
    /// Bytes the entry occupies (sum of its padded blocks); the next entry of a
    /// t-log starts there.
    pub encoded_len: usize,
}

/// Whether `h` belongs to the same entry as block 0 `first` (all fields but `seq`
/// and `payload_len` agree).
fn same_entry(first: &BlockHeader, h: &BlockHeader) -> bool {
    h.kind == first.kind
        && h.shard == first.shard
        && h.version == first.version
        && h.cnt == first.cnt
        && h.key_len == first.key_len
        && h.value_len == first.value_len
        && h.has_request == first.has_request
        && h.has_expiry == first.has_expiry
}

/// Parse a whole entry whose blocks are contiguous from `bytes[0]` (as in a t-log):
/// every block is verified, and the blocks must agree and come in order.
pub fn parse_entry(bytes: &[u8]) -> Result<Entry<'_>, EntryError> {
    let (first, payload0) = parse_block(bytes)?;
    if first.seq != 0 {
        return Err(EntryError::BadLength(format!(
            "entry starts at seq {}",
            first.seq
        )));
    }
    // Block 0 verified: it holds the whole record (checked) and key.
    let request = if first.has_request {
        Some(decode_request(payload0)?)
    } else {
        None
    };
    let expires_at_ms = decode_expiry(&first, payload0);
    let key_start = first.record_bytes();
    let key_end = key_start + first.key_len as usize;
    let key = &payload0[key_start..key_end];
    let mut offset = first.padded_len();
    if first.cnt == 1 {
        return Ok(Entry {
            kind: first.kind,
            shard: first.shard,
            version: first.version,
            request,
            expires_at_ms,
            key,
            value: Cow::Borrowed(&payload0[key_end..]),
            encoded_len: offset,
        });
    }
    // Grow with the bytes actually verified, not with the claimed value_len.
    let mut value = Vec::with_capacity((first.value_len as usize).min(bytes.len()));
    value.extend_from_slice(&payload0[key_end..]);
    for seq in 1..first.cnt {
        let rest = bytes.get(offset..).unwrap_or(&[]);
        let (h, payload) = parse_block(rest).map_err(|e| match e {
            EntryError::Truncated { need, have } => EntryError::Truncated {
                need: offset + need,
                have: offset + have,
            },
            other => other,
        })?;
        if h.seq != seq || !same_entry(&first, &h) {
            return Err(EntryError::BadLength(format!(
                "block {seq} of {:?} at offset {offset} is {h:?}",
                first
            )));
        }
        if seq + 1 < first.cnt && h.payload_len != first.payload_len {
            return Err(EntryError::BadLength(format!(
                "block {seq}: payload_len {} != block 0's {}",
                h.payload_len, first.payload_len
            )));
        }
        value.extend_from_slice(payload);
        offset += h.padded_len();
    }
    if value.len() != first.value_len as usize {
        return Err(EntryError::BadLength(format!(
            "blocks carry {} value bytes, value_len is {}",
            value.len(),
            first.value_len
        )));
    }
    Ok(Entry {
        kind: first.kind,
        shard: first.shard,
        version: first.version,
        request,
        expires_at_ms,
        key,
        value: Cow::Owned(value),
        encoded_len: offset,
    })
}

/// The key of the entry at the start of `bytes`, from its verified block 0, without
/// touching the value's later blocks (for index key comparisons). An entry's request
/// record, if any, is in the header's block: [`decode_request`] of the payload.
pub fn read_key(bytes: &[u8]) -> Result<(BlockHeader, &[u8]), EntryError> {
    let (header, payload) = parse_block(bytes)?;
    if header.seq != 0 {
        return Err(EntryError::BadLength(format!(
            "read_key at seq {}",
            header.seq
        )));
    }
    let key_start = header.record_bytes();
    Ok((
        header,
        &payload[key_start..key_start + header.key_len as usize],
    ))
}

/// An entry put together by an [`Assembler`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssembledEntry {
    pub kind: Kind,
    pub shard: ShardId,
    pub version: Version,
    /// The request record, if the entry carries one.
    pub request: Option<RequestRecord>,
    /// A PUT's expiry time, Unix milliseconds, if it has one.
    pub expires_at_ms: Option<u64>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

impl AssembledEntry {
    /// Its length once encoded contiguously at `mtu_bytes` (with its record, if
    /// any). Panics if `mtu_bytes` is not a valid MTU.
    pub fn encoded_len(&self, mtu_bytes: usize) -> usize {
        encoded_len_for(
            self.key.len(),
            self.value.len(),
            self.request.is_some(),
            self.expires_at_ms.is_some(),
            mtu_bytes,
        )
    }
}

#[derive(Debug)]
struct Pending {
    /// The first block's header received (any `seq`).
    header: BlockHeader,
    capacity: usize,
    /// Payload of each block received, indexed by `seq`.
    payloads: Vec<Option<Vec<u8>>>,
    received: usize,
    /// Payload bytes received.
    bytes: usize,
    /// When its first block arrived (the assembler's arrival counter).
    arrival: u64,
}

/// Assembles entries whose blocks arrive separately and in any order (the b-log,
/// seed 000 Figure 7): a multi-packet SRQ may place the blocks of one entry at
/// non-adjacent offsets. An entry is identified by `<shard, version>` and complete
/// when all its `cnt` blocks are present.
///
/// Bounded: at most `ASSEMBLER_PENDING_MAX` entries and `ASSEMBLER_PENDING_BYTES_MAX`
/// payload bytes are held incomplete. A block that would exceed a bound makes room
/// by dropping the entries whose first block arrived earliest (the blocks of a
/// live entry land close together; an old incomplete entry is most likely one whose
/// sender died part way, never acknowledged). Dropped entries are counted for the
/// caller to report ([`Assembler::take_dropped`]).
#[derive(Debug, Default)]
pub struct Assembler {
    pending: BTreeMap<(ShardId, Version), Pending>,
    /// Pending entries by arrival of their first block, oldest first.
    arrivals: BTreeMap<u64, (ShardId, Version)>,
    next_arrival: u64,
    /// Payload bytes held in pending entries.
    bytes: usize,
    /// Entries dropped to make room since the last `take_dropped`.
    dropped: usize,
}

impl Assembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Incomplete entries held.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The incomplete entries held, by shard and version.
    pub fn pending_ids(&self) -> impl Iterator<Item = (ShardId, Version)> + '_ {
        self.pending.keys().copied()
    }

    /// Payload bytes held in incomplete entries.
    pub fn pending_bytes(&self) -> usize {
        self.bytes
    }

    /// Drop every incomplete entry (not counted as dropped to make room).
    pub fn clear(&mut self) {
        self.pending.clear();
        self.arrivals.clear();
        self.bytes = 0;
    }

    /// Incomplete entries dropped to make room since the last call; resets the count.
    pub fn take_dropped(&mut self) -> usize {
        std::mem::take(&mut self.dropped)
    }

    fn drop_pending(&mut self, id: (ShardId, Version)) {
        if let Some(p) = self.pending.remove(&id) {
            self.arrivals.remove(&p.arrival);
            self.bytes -= p.bytes;
        }
    }

    /// Add one block (normally from [`parse_block`]; the header is checked again, so
    /// any header is safe). Returns the entry once its last missing block arrives.
    /// A duplicate `seq` or a header that disagrees with the entry's earlier blocks
    /// is a `BadLength`, and the block is dropped; the entry stays pending; so is a
    /// block 0 whose request record is malformed (`BadRequest`). A block
    /// that does not fit the bounds drops the oldest other entries first (see the
    /// type's doc); a refused block drops nothing.
    pub fn add(
        &mut self,
        header: BlockHeader,
        payload: &[u8],
    ) -> Result<Option<AssembledEntry>, EntryError> {
        let capacity = check_header(&header)?;
        if payload.len() != header.payload_len as usize {
            return Err(EntryError::BadLength(format!(
                "payload of {} bytes, payload_len {}",
                payload.len(),
                header.payload_len
            )));
        }
        // Block 0 of an entry with a record: the record is checked before anything
        // is held (so a malformed one drops nothing).
        let request = if header.has_request && header.seq == 0 {
            Some(decode_request(payload)?)
        } else {
            None
        };
        let key_start = header.record_bytes();
        let key_end = key_start + header.key_len as usize;
        let Some(capacity) = capacity else {
            // A single-block entry is complete at once.
            return Ok(Some(AssembledEntry {
                kind: header.kind,
                shard: header.shard,
                version: header.version,
                request,
                expires_at_ms: decode_expiry(&header, payload),
                key: payload[key_start..key_end].to_vec(),
                value: payload[key_end..].to_vec(),
            }));
        };
        let id = (header.shard, header.version);
        // Refuse before making room, so a refused block drops nothing.
        let held = self.pending.get(&id);
        if let Some(entry) = held {
            if !same_entry(&entry.header, &header) || entry.capacity != capacity {
                return Err(EntryError::BadLength(format!(
                    "block {header:?} disagrees with {:?}",
                    entry.header
                )));
            }
            if entry.payloads[header.seq as usize].is_some() {
                return Err(EntryError::BadLength(format!("duplicate block {header:?}")));
            }
        }
        let is_new = held.is_none();
        while (is_new && self.pending.len() >= ASSEMBLER_PENDING_MAX)
            || self.bytes + payload.len() > ASSEMBLER_PENDING_BYTES_MAX
        {
            let oldest = self.arrivals.values().copied().find(|&other| other != id);
            let Some(oldest) = oldest else {
                // Unreachable by the bound's const assertion: one entry always fits.
                return Err(EntryError::BadLength(format!(
                    "entry {id:?} exceeds the assembler's {ASSEMBLER_PENDING_BYTES_MAX} B"
                )));
            };
            self.drop_pending(oldest);
            self.dropped = self.dropped.saturating_add(1);
        }
        let arrival = self.next_arrival;
        let entry = self.pending.entry(id).or_insert_with(|| Pending {
            header,
            capacity,
            payloads: vec![None; header.cnt as usize],
            received: 0,
            bytes: 0,
            arrival,
        });
        if is_new {
            self.arrivals.insert(arrival, id);
            self.next_arrival += 1;
        }
        entry.payloads[header.seq as usize] = Some(payload.to_vec());
        entry.received += 1;
        entry.bytes += payload.len();
        self.bytes += payload.len();
        if entry.received < entry.payloads.len() {
            return Ok(None);
        }

        let Some(done) = self.pending.remove(&id) else {
            unreachable!("entry {id:?} was just updated");
        };
        self.arrivals.remove(&done.arrival);
        self.bytes -= done.bytes;
        let mut blocks = done.payloads.into_iter().flatten();
        let first = blocks.next().unwrap_or_default();
        // Block 0's record was checked when it was added.
        let request = if header.has_request {
            Some(decode_request(&first)?)
        } else {
            None
        };
        let mut value = Vec::with_capacity(header.value_len as usize);
        value.extend_from_slice(&first[key_end..]);
        for block in blocks {
            value.extend_from_slice(&block);
        }
        // Every block agreed on the capacity, so the lengths add up.
        assert_eq!(value.len(), header.value_len as usize);
        Ok(Some(AssembledEntry {
            kind: header.kind,
            shard: header.shard,
            version: header.version,
            request,
            expires_at_ms: decode_expiry(&header, &first),
            key: first[key_start..key_end].to_vec(),
            value,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], value: &[u8], mtu_bytes: usize) -> Vec<u8> {
        let mut out = Vec::new();
        encode(
            &mut out,
            Kind::Put,
            ShardId(7),
            Version(64),
            key,
            value,
            mtu_bytes,
        )
        .unwrap();
        out
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// Offsets of the blocks of a contiguous encoded entry.
    fn block_offsets(bytes: &[u8]) -> Vec<usize> {
        let mut offsets = Vec::new();
        let mut offset = 0;
        while offset < bytes.len() {
            offsets.push(offset);
            offset += parse_block(&bytes[offset..]).unwrap().0.padded_len();
        }
        offsets
    }

    #[test]
    fn entry_round_trip_single_block() {
        let key = pattern(16, 1);
        let value = pattern(90, 2);
        let bytes = put(&key, &value, MTU_BYTES_DEFAULT);
        assert_eq!(bytes.len(), 192); // 24 + 106 = 130 -> 192
        assert_eq!(bytes.len(), encoded_len(16, 90, MTU_BYTES_DEFAULT));
        let e = parse_entry(&bytes).unwrap();
        assert_eq!(
            (e.kind, e.shard, e.version),
            (Kind::Put, ShardId(7), Version(64))
        );
        assert_eq!(e.key, &key[..]);
        assert!(matches!(e.value, Cow::Borrowed(_)));
        assert_eq!(&e.value[..], &value[..]);
        assert_eq!(e.encoded_len, 192);
        let (h, k) = read_key(&bytes).unwrap();
        assert_eq!(k, &key[..]);
        assert_eq!(
            (h.seq, h.cnt, h.key_len, h.value_len, h.payload_len),
            (0, 1, 16, 90, 106)
        );

        let mut out = Vec::new();
        let n = encode(
            &mut out,
            Kind::Del,
            ShardId(3),
            Version(9),
            b"gone",
            b"",
            4096,
        )
        .unwrap();
        assert_eq!(n, 1);
        let e = parse_entry(&out).unwrap();
        assert_eq!(
            (e.kind, e.shard, e.version, e.key),
            (Kind::Del, ShardId(3), Version(9), &b"gone"[..])
        );
        assert!(e.value.is_empty());
        assert_eq!(e.encoded_len, 64);

        encode(
            &mut out,
            Kind::Commit,
            ShardId(u16::MAX),
            Version::MAX,
            b"",
            b"",
            4096,
        )
        .unwrap();
        let e = parse_entry(&out).unwrap();
        assert_eq!(
            (e.kind, e.shard, e.version),
            (Kind::Commit, ShardId(u16::MAX), Version::MAX)
        );
        assert!(e.key.is_empty() && e.value.is_empty());
        assert_eq!(out.len(), 64);
    }

    #[test]
    fn entry_round_trip_multi_block() {
        let key = pattern(16, 3);
        let value = pattern(10 * 1024, 4);
        let mut out = Vec::new();
        let n = encode(
            &mut out,
            Kind::Put,
            ShardId(1),
            Version(2),
            &key,
            &value,
            4096,
        )
        .unwrap();
        assert_eq!(n, 3);
        assert_eq!(out.len(), encoded_len(16, 10 * 1024, 4096));
        let offsets = block_offsets(&out);
        assert_eq!(offsets.len(), 3);
        for (i, &offset) in offsets.iter().enumerate() {
            let (h, _) = parse_block(&out[offset..]).unwrap();
            assert_eq!((h.seq as usize, h.cnt), (i, 3));
            assert!(h.padded_len() <= 4096);
            if i < 2 {
                assert_eq!(h.payload_len as usize, 4096 - HEADER_BYTES);
            }
        }
        let e = parse_entry(&out).unwrap();
        assert_eq!(e.key, &key[..]);
        assert_eq!(&e.value[..], &value[..]);
        assert_eq!(e.encoded_len, out.len());
        assert_eq!(read_key(&out).unwrap().1, &key[..]);
    }

    #[test]
    fn entry_boundary_at_mtu() {
        let key = pattern(100, 5);
        let fits = 4096 - HEADER_BYTES - key.len();
        let mut out = Vec::new();
        assert_eq!(
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(1),
                &key,
                &pattern(fits, 6),
                4096
            ),
            Ok(1)
        );
        assert_eq!(out.len(), 4096);
        let value = pattern(fits + 1, 6);
        assert_eq!(
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(1),
                &key,
                &value,
                4096
            ),
            Ok(2)
        );
        assert_eq!(out.len(), 4096 + 64);
        let e = parse_entry(&out).unwrap();
        assert_eq!(&e.value[..], &value[..]);
    }

    #[test]
    fn entry_padding_and_first_word() {
        for (key_len, value_len) in [(0, 0), (1, 0), (16, 90), (40, 0), (100, 5000), (7, 20000)] {
            let bytes = put(&pattern(key_len, 1), &pattern(value_len, 2), 4096);
            assert_eq!(bytes.len() % STRIDE_BYTES, 0);
            for offset in block_offsets(&bytes) {
                let (h, _) = parse_block(&bytes[offset..]).unwrap();
                assert_eq!(h.padded_len() % STRIDE_BYTES, 0);
                assert_ne!(
                    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap()),
                    0
                );
                let covered = offset + HEADER_BYTES + h.payload_len as usize;
                assert!(bytes[covered..offset + h.padded_len()]
                    .iter()
                    .all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn entry_every_bit_flip_detected() {
        let cases = [
            put(&pattern(16, 1), &pattern(90, 2), 4096),
            put(&pattern(16, 1), &pattern(5000, 2), 4096),
        ];
        for bytes in cases {
            for offset in block_offsets(&bytes) {
                let (h, _) = parse_block(&bytes[offset..]).unwrap();
                let covered = HEADER_BYTES + h.payload_len as usize;
                let mut copy = bytes.clone();
                for i in offset..offset + covered {
                    for bit in 0..8 {
                        copy[i] ^= 1 << bit;
                        assert!(
                            parse_block(&copy[offset..]).is_err(),
                            "flip {i}.{bit} missed"
                        );
                        assert!(parse_entry(&copy).is_err(), "flip {i}.{bit} missed");
                        copy[i] ^= 1 << bit;
                    }
                }
            }
        }
    }

    #[test]
    fn entry_end_and_truncated() {
        assert_eq!(parse_block(&[0u8; 64]), Err(EntryError::End));
        assert_eq!(parse_entry(&[0u8; 4096]), Err(EntryError::End));
        assert_eq!(read_key(&[0u8; 8]), Err(EntryError::End));
        let bytes = put(b"k", &pattern(300, 1), 4096);
        assert_eq!(
            parse_block(&bytes[..10]),
            Err(EntryError::Truncated { need: 24, have: 10 })
        );
        assert_eq!(
            parse_block(&[]),
            Err(EntryError::Truncated { need: 24, have: 0 })
        );
        assert_eq!(
            parse_block(&bytes[..bytes.len() - 1]),
            Err(EntryError::Truncated {
                need: bytes.len(),
                have: bytes.len() - 1
            })
        );
        let bytes = put(b"k", &pattern(5000, 1), 4096);
        assert_eq!(
            parse_entry(&bytes[..4096 + 10]),
            Err(EntryError::Truncated {
                need: 4096 + 24,
                have: 4096 + 10
            })
        );
    }

    #[test]
    fn entry_limits() {
        let mut out = Vec::new();
        let big_key = vec![1u8; KEY_BYTES_MAX + 1];
        assert_eq!(
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(1),
                &big_key,
                b"v",
                4096
            ),
            Err(EntryError::KeyTooLarge {
                len: 1025,
                max: 1024
            })
        );
        assert!(matches!(
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(1 << 48),
                b"k",
                b"v",
                4096
            ),
            Err(EntryError::BadLength(_))
        ));
        for mtu in [1000, 1024, 1089, 4095, 65600, 0] {
            assert_eq!(
                encode(&mut out, Kind::Put, ShardId(0), Version(1), b"k", b"v", mtu),
                Err(EntryError::BadMtu(mtu))
            );
        }
        let max = value_bytes_max(MTU_BYTES_MIN);
        let value = vec![9u8; max + 1];
        assert_eq!(
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(1),
                b"k",
                &value,
                MTU_BYTES_MIN
            ),
            Err(EntryError::ValueTooLarge { len: max + 1, max })
        );
        // The largest key with the largest value fits in BLOCKS_MAX blocks.
        let key = vec![2u8; KEY_BYTES_MAX];
        let n = encode(
            &mut out,
            Kind::Put,
            ShardId(0),
            Version(1),
            &key,
            &value[..max],
            MTU_BYTES_MIN,
        )
        .unwrap();
        assert!(n <= BLOCKS_MAX);
        let e = parse_entry(&out).unwrap();
        assert_eq!((e.key.len(), e.value.len()), (KEY_BYTES_MAX, max));
        assert!(matches!(
            encode(
                &mut out,
                Kind::Del,
                ShardId(0),
                Version(1),
                b"k",
                b"v",
                4096
            ),
            Err(EntryError::BadLength(_))
        ));
        assert!(matches!(
            encode(
                &mut out,
                Kind::Commit,
                ShardId(0),
                Version(1),
                b"k",
                b"",
                4096
            ),
            Err(EntryError::BadLength(_))
        ));
    }

    #[test]
    fn entry_encode_reuses_buffer() {
        let mut out = Vec::with_capacity(64 * 1024);
        let ptr = out.as_ptr();
        for len in [0, 100, 5000, 20000] {
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(1),
                b"key",
                &pattern(len, 0),
                4096,
            )
            .unwrap();
            assert_eq!(out.as_ptr(), ptr);
        }
    }

    /// Blocks of one entry, as (header, payload).
    fn blocks(bytes: &[u8]) -> Vec<(BlockHeader, Vec<u8>)> {
        block_offsets(bytes)
            .into_iter()
            .map(|offset| {
                let (h, p) = parse_block(&bytes[offset..]).unwrap();
                (h, p.to_vec())
            })
            .collect()
    }

    #[test]
    fn entry_assembler_out_of_order_interleaved() {
        let value_a = pattern(10 * 1024, 1);
        let value_b = pattern(6000, 2);
        let mut out = Vec::new();
        encode(
            &mut out,
            Kind::Put,
            ShardId(1),
            Version(64),
            b"alpha",
            &value_a,
            4096,
        )
        .unwrap();
        let a = blocks(&out);
        encode(
            &mut out,
            Kind::Put,
            ShardId(2),
            Version(64),
            b"beta",
            &value_b,
            4096,
        )
        .unwrap();
        let b = blocks(&out);
        assert_eq!((a.len(), b.len()), (3, 2));
        let mut asm = Assembler::new();
        assert_eq!(asm.add(a[2].0, &a[2].1), Ok(None));
        assert_eq!(asm.add(b[1].0, &b[1].1), Ok(None));
        assert_eq!(asm.pending(), 2);
        // Duplicate and conflicting blocks are refused and change nothing.
        assert!(matches!(
            asm.add(a[2].0, &a[2].1),
            Err(EntryError::BadLength(_))
        ));
        let mut conflicting = a[0].0;
        conflicting.value_len += 1;
        assert!(asm.add(conflicting, &a[0].1).is_err());
        assert_eq!(asm.add(a[0].0, &a[0].1), Ok(None));
        let got_b = asm.add(b[0].0, &b[0].1).unwrap().unwrap();
        assert_eq!(
            (got_b.shard, &got_b.key[..], &got_b.value[..]),
            (ShardId(2), &b"beta"[..], &value_b[..])
        );
        assert_eq!(asm.pending(), 1);
        let got_a = asm.add(a[1].0, &a[1].1).unwrap().unwrap();
        assert_eq!(
            (got_a.kind, got_a.shard, got_a.version),
            (Kind::Put, ShardId(1), Version(64))
        );
        assert_eq!(
            (&got_a.key[..], &got_a.value[..]),
            (&b"alpha"[..], &value_a[..])
        );
        assert_eq!(asm.pending(), 0);

        // A single-block entry completes at once.
        encode(&mut out, Kind::Del, ShardId(5), Version(3), b"k", b"", 4096).unwrap();
        let (h, p) = parse_block(&out).unwrap();
        let got = asm.add(h, p).unwrap().unwrap();
        assert_eq!((got.kind, &got.key[..]), (Kind::Del, &b"k"[..]));
    }

    #[test]
    fn entry_assembler_bounded() {
        let mut asm = Assembler::new();
        let mut out = Vec::new();
        let value = pattern(5000, 0);
        let mut first = Vec::new();
        for v in 0..ASSEMBLER_PENDING_MAX as u64 {
            encode(
                &mut out,
                Kind::Put,
                ShardId(0),
                Version(v),
                b"k",
                &value,
                4096,
            )
            .unwrap();
            let (h, p) = parse_block(&out).unwrap();
            assert_eq!(asm.add(h, p), Ok(None));
            if v == 0 {
                first = blocks(&out);
            }
        }
        assert_eq!(
            asm.pending_bytes(),
            ASSEMBLER_PENDING_MAX * (4096 - HEADER_BYTES)
        );
        assert_eq!(asm.take_dropped(), 0);
        encode(
            &mut out,
            Kind::Put,
            ShardId(0),
            Version(1 << 40),
            b"k",
            &value,
            4096,
        )
        .unwrap();
        let (h, p) = parse_block(&out).unwrap();
        // Full: the oldest entry (version 0) is dropped to hold the new one.
        assert_eq!(asm.add(h, p), Ok(None));
        assert_eq!(asm.pending(), ASSEMBLER_PENDING_MAX);
        assert_eq!(asm.take_dropped(), 1);
        assert_eq!(asm.take_dropped(), 0);
        // Its later blocks start it afresh, which drops the next oldest.
        assert_eq!(asm.add(first[1].0, &first[1].1), Ok(None));
        assert_eq!(asm.take_dropped(), 1);
        // A refused block drops nothing.
        assert!(asm.add(first[1].0, &first[1].1).is_err());
        assert_eq!(asm.take_dropped(), 0);
        assert_eq!(asm.pending(), ASSEMBLER_PENDING_MAX);
        asm.clear();
        assert_eq!((asm.pending(), asm.pending_bytes()), (0, 0));
        assert_eq!(asm.add(h, p), Ok(None));
        assert_eq!(asm.take_dropped(), 0);
    }
}
