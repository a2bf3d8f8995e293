//! Byte layout: the header every request and reply carries, and where each
//! connection's slots lie in the server's and the client's registered memory.
//!
//! Header (32 B, little-endian, at the start of every message):
//! ```text
//! 0        8        12       16       20       24                32
//! +--------+--------+--------+--------+--------+-----------------+
//! | seq    | len    | crc    | kind   | client | aux             |
//! | u64    | u32    | u32    | u32    | u32    | u64             |
//! +--------+--------+--------+--------+--------+-----------------+
//! followed by `len` payload bytes (none after a ScaleRPC descriptor: the payload
//! stays in the client's staging slot at offset `aux` until the server READs it).
//! ```
//! - `seq` counts a connection's requests from 1; a slot holding 0 is empty. A reply
//!   carries its request's `seq`.
//! - `crc` is CRC-32C over bytes 0..12 and 16..32 of the header and then the payload.
//!   A reader that polls memory takes a message only when `seq` is the one it waits
//!   for and the checksum matches, because a WRITE still landing (or, on `loopback`,
//!   one copied in no particular byte order) may show a new `seq` over an old body.
//! - `kind`: [`Kind`]. `client` is the connection's index at the server. `aux`: the
//!   descriptor's staging offset; an error reply's refused length.
//!
//! Server memory (one registered region; every slot 64 B aligned, `W` =
//! `inflight_max`, `C` = `clients_max`, `Q` = a request slot, `P` = a reply slot):
//! ```text
//! [ ring: C x W x Q ][ store: C x W x Q ][ results: C x W x P ]
//! ```
//! - ring: where WRITE designs land requests (slot `(seq - 1) % W` of the client's W);
//!   for SEND designs the receive buffers (shared by all clients, any buffer);
//! - store: where the receiver's CPU copies a SEND's request out of its receive
//!   buffer (DaRPC, FaSST) and where ScaleRPC's warm-up READ lands the data;
//! - results: RFP's results, written by the receiver's CPU, READ by the client.
//!
//! Client memory: `[ replies: W x P ][ staging: W x Q ]` — replies land in slot
//! `(seq - 1) % W` (WRITE designs) or are receive buffers (SEND designs); staging
//! holds ScaleRPC's warm-up data for the server to READ, and RFP's READs land in
//! the reply slots.

use crate::ServerConfig;

pub const HEADER_BYTES: usize = 32;
/// Slots start on 64 B boundaries: a cache line, so a persist of one slot never
/// covers a line of another, and the crash simulator's line never straddles two.
pub const SLOT_ALIGN_BYTES: usize = 64;

const _: () = assert!(HEADER_BYTES <= SLOT_ALIGN_BYTES && HEADER_BYTES.is_multiple_of(8));

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A request or a reply with its payload inline.
    Inline,
    /// ScaleRPC's warm-up request: the payload is in the client's staging slot.
    Descriptor,
    /// A reply refusing the handler's too-long reply (`aux` = its length).
    ReplyTooLarge,
}

impl Kind {
    fn code(self) -> u32 {
        match self {
            Kind::Inline => 1,
            Kind::Descriptor => 2,
            Kind::ReplyTooLarge => 3,
        }
    }

    fn from_code(code: u32) -> Option<Kind> {
        match code {
            1 => Some(Kind::Inline),
            2 => Some(Kind::Descriptor),
            3 => Some(Kind::ReplyTooLarge),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub seq: u64,
    pub len: u32,
    pub crc: u32,
    pub kind: Kind,
    pub client: u32,
    pub aux: u64,
}

impl Header {
    /// A header for `payload` (for a descriptor: the payload it points at).
    pub fn new(seq: u64, kind: Kind, client: u32, aux: u64, payload: &[u8]) -> Header {
        let mut h = Header {
            seq,
            len: u32::try_from(payload.len()).expect("message bounded by the config"),
            crc: 0,
            kind,
            client,
            aux,
        };
        h.crc = h.checksum(payload);
        h
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..16].copy_from_slice(&self.crc.to_le_bytes());
        b[16..20].copy_from_slice(&self.kind.code().to_le_bytes());
        b[20..24].copy_from_slice(&self.client.to_le_bytes());
        b[24..32].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    /// The header in `b` (at least 32 bytes), or `None` if it is no header at all
    /// (an empty slot, or garbage: unknown kind).
    pub fn decode(b: &[u8]) -> Option<Header> {
        let b: &[u8; HEADER_BYTES] = b.get(..HEADER_BYTES)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Header {
            seq: u64_at(0),
            len: u32_at(8),
            crc: u32_at(12),
            kind: Kind::from_code(u32_at(16))?,
            client: u32_at(20),
            aux: u64_at(24),
        })
    }

    /// Whether `payload` is the whole, untorn payload this header was made for.
    pub fn matches(&self, payload: &[u8]) -> bool {
        payload.len() == self.len as usize && self.checksum(payload) == self.crc
    }

    fn checksum(&self, payload: &[u8]) -> u32 {
        let b = self.encode();
        let crc = crc32c::crc32c(&b[0..12]);
        let crc = crc32c::crc32c_append(crc, &b[16..32]);
        crc32c::crc32c_append(crc, payload)
    }
}

fn align(bytes: usize) -> usize {
    bytes.div_ceil(SLOT_ALIGN_BYTES) * SLOT_ALIGN_BYTES
}

/// Offsets of every slot, from a configuration. Both ends compute the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    clients: usize,
    slots: usize,
    request_slot_bytes: usize,
    reply_slot_bytes: usize,
}

impl Layout {
    pub fn new(config: &ServerConfig) -> Layout {
        Layout {
            clients: config.clients_max,
            slots: config.inflight_max,
            request_slot_bytes: align(HEADER_BYTES + config.request_bytes_max),
            reply_slot_bytes: align(HEADER_BYTES + config.reply_bytes_max),
        }
    }

    /// Slots per client (= `inflight_max`).
    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn request_slot_bytes(&self) -> usize {
        self.request_slot_bytes
    }

    pub fn reply_slot_bytes(&self) -> usize {
        self.reply_slot_bytes
    }

    /// The slot a request of `seq` (from 1) uses.
    pub fn slot_of(&self, seq: u64) -> usize {
        assert!(seq >= 1, "sequence numbers start at 1");
        ((seq - 1) % self.slots as u64) as usize
    }

    fn ring_index(&self, client: usize, slot: usize) -> usize {
        assert!(
            client < self.clients && slot < self.slots,
            "slot out of layout"
        );
        client * self.slots + slot
    }

    /// Receive buffers of the server's shared receive queue (= ring slots).
    pub fn server_buffers(&self) -> usize {
        self.clients * self.slots
    }

    /// Server: the `index`-th ring slot (a receive buffer for SEND designs).
    pub fn ring_buffer(&self, index: usize) -> usize {
        assert!(index < self.server_buffers(), "buffer out of layout");
        index * self.request_slot_bytes
    }

    pub fn ring_slot(&self, client: usize, slot: usize) -> usize {
        self.ring_buffer(self.ring_index(client, slot))
    }

    pub fn store_slot(&self, client: usize, slot: usize) -> usize {
        (self.server_buffers() + self.ring_index(client, slot)) * self.request_slot_bytes
    }

    pub fn result_slot(&self, client: usize, slot: usize) -> usize {
        2 * self.server_buffers() * self.request_slot_bytes
            + self.ring_index(client, slot) * self.reply_slot_bytes
    }

    pub fn server_bytes(&self) -> usize {
        2 * self.server_buffers() * self.request_slot_bytes
            + self.server_buffers() * self.reply_slot_bytes
    }

    /// Client: where the reply of a request in `slot` lands.
    pub fn reply_slot(&self, slot: usize) -> usize {
        assert!(slot < self.slots, "slot out of layout");
        slot * self.reply_slot_bytes
    }

    pub fn staging_slot(&self, slot: usize) -> usize {
        assert!(slot < self.slots, "slot out of layout");
        self.slots * self.reply_slot_bytes + slot * self.request_slot_bytes
    }

    pub fn client_bytes(&self) -> usize {
        self.slots * (self.reply_slot_bytes + self.request_slot_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_checks_its_payload() {
        let payload = b"the payload".to_vec();
        let h = Header::new(7, Kind::Inline, 3, 99, &payload);
        let decoded = Header::decode(&h.encode()).expect("decodes");
        assert_eq!(decoded, h);
        assert!(decoded.matches(&payload));
        let mut torn = payload.clone();
        torn[4] ^= 1;
        assert!(!decoded.matches(&torn), "a torn body must not match");
        assert!(
            !decoded.matches(&payload[..5]),
            "a short body must not match"
        );
        let mut other_seq = h;
        other_seq.seq = 8;
        assert!(
            !other_seq.matches(&payload),
            "the checksum covers the sequence number"
        );
    }

    #[test]
    fn an_empty_slot_or_garbage_is_no_header() {
        assert_eq!(Header::decode(&[0u8; HEADER_BYTES]), None);
        assert_eq!(Header::decode(&[0xFFu8; HEADER_BYTES]), None);
        assert_eq!(Header::decode(&[1u8; 8]), None, "too short");
    }

    #[test]
    fn slots_are_aligned_disjoint_and_inside_the_memory() {
        let config = ServerConfig {
            clients_max: 3,
            inflight_max: 2,
            request_bytes_max: 100,
            reply_bytes_max: 10,
            ..ServerConfig::default()
        };
        let l = Layout::new(&config);
        let mut spans = Vec::new();
        for c in 0..3 {
            for s in 0..2 {
                spans.push((l.ring_slot(c, s), l.request_slot_bytes()));
                spans.push((l.store_slot(c, s), l.request_slot_bytes()));
                spans.push((l.result_slot(c, s), l.reply_slot_bytes()));
            }
        }
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "overlap: {w:?}");
        }
        for &(at, len) in &spans {
            assert_eq!(at % SLOT_ALIGN_BYTES, 0);
            assert!(at + len <= l.server_bytes());
        }
        assert_eq!(l.server_bytes() % SLOT_ALIGN_BYTES, 0);
        assert!(l.staging_slot(1) + l.request_slot_bytes() <= l.client_bytes());
        assert!(l.reply_slot(1) + l.reply_slot_bytes() <= l.staging_slot(0));
        assert_eq!(l.slot_of(1), 0);
        assert_eq!(l.slot_of(3), 0);
    }
}
