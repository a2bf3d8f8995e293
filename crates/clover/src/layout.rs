//! The bytes Clover keeps in a memory node, and the 8-byte words that link them.
//!
//! A memory node's registered region is an array of fixed-size **slots**; slot 0 is
//! never used, so offset 0 is never a valid version (it is the [`FAILED`] marker).
//! Each slot holds at most one **version** of one key:
//!
//! ```text
//! offset  size  field
//!  0       8    next      link word of the next version, or this slot's own null sentinel
//!  8       8    durable   durable_word(slot) once the writer knows its inbound link is durable (a hint)
//! 16       4    magic     MAGIC ("CLV1")
//! 20       4    gen       generation of the slot (bumped by the MS each time it frees the slot)
//! 24       8    key_id    the key's id, unique, handed out by the metadata server
//! 32       2    flags     FLAG_ABSENT: the chain's head, "no value yet"
//! 34       2    reserved
//! 36       4    value_len
//! 40       4    crc       CRC-32C of bytes 16..40 and of the value
//! 44      20    reserved
//! 64       ..   value (at most `value_bytes_max`)
//! ```
//!
//! **Words.** A *link* is `gen << 40 | slot_offset` (bit 63 clear, offset > 0); a
//! *null sentinel* is `NULL_BIT | gen << 40 | slot_offset` of the slot that holds
//! it. A version is written with `next` = its own sentinel; a writer appends by a
//! CAS of the tail's `next` from the tail's sentinel to its own link. Because both
//! words carry the slot's generation, a CAS or a walk aimed at a slot that was
//! freed and reused fails or is detected, and because the sentinel names its own
//! slot, the old value a successful CAS returns tells the writer which version it
//! was appended to — even when the interposer redirected the CAS.
//!
//! Assumptions about the medium: aligned 8-byte stores and atomics are never torn;
//! anything larger may be (a reader checks `magic`, `gen`, `key_id` and `crc`).

/// Bytes of a slot's header.
pub const HEADER_BYTES: usize = 64;
/// Offsets are below 2^40 (1 TiB of slots per memory node).
pub const OFFSET_BITS: u32 = 40;
/// Generations are below 2^22.
pub const GEN_BITS: u32 = 22;
pub const NULL_BIT: u64 = 1 << 63;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
/// The largest generation a slot may carry; a slot that reaches it is retired.
pub const GEN_MAX: u32 = GEN_MASK as u32;
/// What the interposer puts in a client's CAS result when a CAS it redirected
/// failed: neither a link nor a sentinel, so the client falls back to the MS hint.
pub const FAILED: u64 = 0;
pub const MAGIC: u32 = u32::from_le_bytes(*b"CLV1");
/// Tag bit of the `durable` word: the word is `DURABLE_BIT | link` of its own
/// slot, so a late write of it into a slot that was freed and reused (another
/// generation) means nothing.
pub const DURABLE_BIT: u64 = 1 << 62;
pub const FLAG_ABSENT: u16 = 1;

pub const NEXT_AT: usize = 0;
pub const DURABLE_AT: usize = 8;

const _: () = assert!(
    OFFSET_BITS + GEN_BITS <= 62,
    "bits 62 and 63 tag durable and null words"
);
const _: () = assert!(HEADER_BYTES.is_multiple_of(64));

/// A slot and the generation it had when a word naming it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotRef {
    pub offset: u64,
    pub gen: u32,
}

impl SlotRef {
    pub fn new(offset: u64, gen: u32) -> SlotRef {
        assert!(offset > 0 && offset <= OFFSET_MASK, "slot offset {offset}");
        assert!(gen <= GEN_MAX, "generation {gen}");
        SlotRef { offset, gen }
    }

    pub fn link(self) -> u64 {
        (u64::from(self.gen) << OFFSET_BITS) | self.offset
    }

    pub fn sentinel(self) -> u64 {
        NULL_BIT | self.link()
    }

    /// The `durable` word that marks this slot's version as durably linked.
    pub fn durable_word(self) -> u64 {
        DURABLE_BIT | self.link()
    }
}

/// What an 8-byte `next` word (or a CAS's old value) says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    /// Points at the next version.
    Link(SlotRef),
    /// The end of the chain at the slot it names.
    Null(SlotRef),
    /// Offset 0: not a version (the interposer's failure marker, or garbage).
    Invalid,
}

pub fn decode_word(w: u64) -> Word {
    let offset = w & OFFSET_MASK;
    let gen = ((w >> OFFSET_BITS) & GEN_MASK) as u32;
    if offset == 0 || (w & !NULL_BIT) >> (OFFSET_BITS + GEN_BITS) != 0 {
        return Word::Invalid;
    }
    let s = SlotRef { offset, gen };
    if w & NULL_BIT != 0 {
        Word::Null(s)
    } else {
        Word::Link(s)
    }
}

/// Bytes of one slot for values of at most `value_bytes_max`.
pub fn slot_bytes(value_bytes_max: usize) -> usize {
    HEADER_BYTES + value_bytes_max.div_ceil(64) * 64
}

/// A version as a reader decodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub next: u64,
    pub durable: bool,
    pub gen: u32,
    pub key_id: u64,
    pub absent: bool,
    pub value: Vec<u8>,
}

/// Why bytes read from a slot are not a whole version.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("slot too short: {0} bytes")]
    Short(usize),
    #[error("bad magic {0:#x}")]
    Magic(u32),
    #[error("value length {0} exceeds the slot")]
    Length(usize),
    #[error("checksum mismatch")]
    Checksum,
}

/// The bytes of a new version of `key_id` in slot `at` (its `next` is its own
/// null sentinel, `durable` clear).
pub fn encode(at: SlotRef, key_id: u64, absent: bool, value: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_BYTES + value.len()];
    b[NEXT_AT..NEXT_AT + 8].copy_from_slice(&at.sentinel().to_le_bytes());
    b[16..20].copy_from_slice(&MAGIC.to_le_bytes());
    b[20..24].copy_from_slice(&at.gen.to_le_bytes());
    b[24..32].copy_from_slice(&key_id.to_le_bytes());
    let flags = if absent { FLAG_ABSENT } else { 0 };
    b[32..34].copy_from_slice(&flags.to_le_bytes());
    b[36..40].copy_from_slice(&(value.len() as u32).to_le_bytes());
    b[HEADER_BYTES..].copy_from_slice(value);
    let crc = checksum(&b);
    b[40..44].copy_from_slice(&crc.to_le_bytes());
    b
}

fn checksum(b: &[u8]) -> u32 {
    let c = crc32c::crc32c(&b[16..40]);
    crc32c::crc32c_append(c, &b[HEADER_BYTES..])
}

/// Decode the slot at `offset`, read whole (`b.len()` is the slot's size).
pub fn decode(offset: u64, b: &[u8]) -> Result<Version, DecodeError> {
    if b.len() < HEADER_BYTES {
        return Err(DecodeError::Short(b.len()));
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let magic = u32_at(16);
    if magic != MAGIC {
        return Err(DecodeError::Magic(magic));
    }
    let value_len = u32_at(36) as usize;
    if HEADER_BYTES + value_len > b.len() {
        return Err(DecodeError::Length(value_len));
    }
    let body = &b[..HEADER_BYTES + value_len];
    if checksum(body) != u32_at(40) {
        return Err(DecodeError::Checksum);
    }
    let flags = u16::from_le_bytes([b[32], b[33]]);
    let gen = u32_at(20);
    let durable = offset > 0
        && offset <= OFFSET_MASK
        && gen <= GEN_MAX
        && u64_at(DURABLE_AT) == SlotRef::new(offset, gen).durable_word();
    Ok(Version {
        next: u64_at(NEXT_AT),
        durable,
        gen,
        key_id: u64_at(24),
        absent: flags & FLAG_ABSENT != 0,
        value: b[HEADER_BYTES..HEADER_BYTES + value_len].to_vec(),
    })
}

/// What the interposer parses of a WRITE's payload: the version's slot (from its
/// sentinel) and key, if the payload is a version written whole at its slot.
pub fn parse_written(remote_offset: u64, data: &[u8]) -> Option<(SlotRef, u64)> {
    if data.len() < HEADER_BYTES {
        return None;
    }
    let next = u64::from_le_bytes(data[0..8].try_into().ok()?);
    let magic = u32::from_le_bytes(data[16..20].try_into().ok()?);
    if magic != MAGIC {
        return None;
    }
    match decode_word(next) {
        Word::Null(s) if s.offset == remote_offset => {
            let key_id = u64::from_le_bytes(data[24..32].try_into().ok()?);
            Some((s, key_id))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn links_and_sentinels_round_trip_and_differ() {
        let s = SlotRef::new(128 * 7, 5);
        assert_eq!(decode_word(s.link()), Word::Link(s));
        assert_eq!(decode_word(s.sentinel()), Word::Null(s));
        assert_ne!(s.link(), s.sentinel());
        assert_eq!(decode_word(FAILED), Word::Invalid);
        // A reused slot's sentinel differs from the old one.
        assert_ne!(SlotRef::new(128 * 7, 6).sentinel(), s.sentinel());
    }

    #[test]
    fn a_version_round_trips_and_a_torn_one_is_refused() {
        let at = SlotRef::new(256, 3);
        let mut b = encode(at, 42, false, b"hello");
        b.resize(slot_bytes(64), 0);
        let v = decode(256, &b).unwrap();
        assert_eq!(v.key_id, 42);
        assert_eq!(v.gen, 3);
        assert_eq!(v.value, b"hello");
        assert!(!v.absent && !v.durable);
        b[DURABLE_AT..DURABLE_AT + 8].copy_from_slice(&at.durable_word().to_le_bytes());
        assert!(decode(256, &b).unwrap().durable);
        // The same word in another slot (or generation) means nothing.
        assert!(!decode(384, &b).unwrap().durable);
        assert_eq!(decode_word(v.next), Word::Null(at));
        assert_eq!(parse_written(256, &b), Some((at, 42)));
        assert_eq!(parse_written(384, &b), None);
        b[HEADER_BYTES] ^= 1;
        assert_eq!(decode(256, &b), Err(DecodeError::Checksum));
        b[16] ^= 1;
        assert!(matches!(decode(256, &b), Err(DecodeError::Magic(_))));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(64, &bytes);
            let _ = parse_written(64, &bytes);
        }

        #[test]
        fn any_word_decodes_consistently(w in any::<u64>()) {
            match decode_word(w) {
                Word::Link(s) => prop_assert_eq!(s.link(), w),
                Word::Null(s) => prop_assert_eq!(s.sentinel(), w),
                Word::Invalid => {}
            }
        }
    }
}
