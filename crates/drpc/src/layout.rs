//! The byte layout of the receiver's pool and of the messages: the pool header, the
//! per-connection headers, the apply record, the redo rings and their entries, the
//! replies. `docs/drpc.md` has the same tables; a change here changes the format
//! version there.
//!
//! Invariants this module keeps:
//! - every multi-byte field is little-endian; every 8-byte field that is updated in
//!   place (`head_abs`, `done_seq`, an entry's `seq`) is 8-byte aligned, so one store
//!   is failure-atomic;
//! - a ring entry starts 64 B aligned, never straddles a chunk (hence never the end of
//!   the ring), and is recognised only if its checksum matches: a torn entry is never
//!   taken for a request;
//! - an apply record is recognised only if its length is in bounds and its checksum
//!   matches;
//! - decoders never panic on the bytes they read (PM contents and peer messages are
//!   outside input): they return `None` or a typed error.

use rowankv_pmem::Pool;

use crate::ConnId;

/// The ring's alignment: the PCIe data word and the multi-packet SRQ's stride.
pub const ENTRY_ALIGN_BYTES: usize = 64;
/// Bytes of an entry's header (seq, body length, checksum, count, flags).
pub const ENTRY_HEADER_BYTES: usize = 24;
/// Bytes of a request's header inside an entry's body (op, length).
pub const REQUEST_HEADER_BYTES: usize = 8;
/// Bytes of the pool header.
pub const POOL_HEADER_BYTES: usize = 64;
/// Bytes of one connection header (one cache line, so one persist covers it).
pub const CONN_HEADER_BYTES: usize = 64;
/// Bytes of an apply record's header.
pub const APPLY_HEADER_BYTES: usize = 24;
/// Bytes of one state write's header inside an apply record.
pub const WRITE_HEADER_BYTES: usize = 16;
/// Bytes of a reply message's header.
pub const REPLY_HEADER_BYTES: usize = 24;
/// Connections a pool can hold (bounds the header area).
pub const CONNECTIONS_MAX: u32 = 256;
/// Requests one entry may carry (a batch, Figure 6).
pub const ENTRY_REQUESTS_MAX: usize = u16::MAX as usize;

/// The largest seq and absolute ring address a pool may hold: far below `u64::MAX`,
/// so that no sum of them with a length can overflow. A connection would need
/// centuries at a billion requests a second to reach it; a header beyond it is corrupt.
pub const SEQ_MAX: u64 = 1 << 62;
pub const ABS_MAX: u64 = 1 << 62;

/// "RKVDRPC1", little-endian.
pub const POOL_MAGIC: u64 = u64::from_le_bytes(*b"RKVDRPC1");
pub const FORMAT_VERSION: u32 = 1;

const PAGE_BYTES: usize = 4096;

const _: () =
    assert!(ENTRY_HEADER_BYTES.is_multiple_of(8) && REQUEST_HEADER_BYTES.is_multiple_of(8));
const _: () = assert!(ENTRY_HEADER_BYTES < ENTRY_ALIGN_BYTES);
const _: () = assert!(CONN_HEADER_BYTES == rowankv_pmem::CACHELINE_BYTES);
const _: () =
    assert!(POOL_HEADER_BYTES + CONNECTIONS_MAX as usize * CONN_HEADER_BYTES <= 5 * PAGE_BYTES);

pub fn align_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The geometry of a receiver's pool, fixed when it is formatted and recorded in
/// its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGeometry {
    /// Connections (each has its own ring and header).
    pub connections: u32,
    /// Bytes of one connection's ring; a multiple of `chunk_bytes`.
    pub ring_bytes: usize,
    /// Bytes of a chunk: the unit the receiver posts as a receive buffer for the
    /// SEND variants, and the largest entry. A multiple of 64.
    pub chunk_bytes: usize,
    /// Bytes of the state the operator keeps in PM; a multiple of 64.
    pub state_bytes: usize,
    /// Bytes of the apply record area: bounds one request's state writes.
    pub apply_bytes: usize,
    /// Where the receiver's area starts in its pool (a multiple of 4 KiB): 0
    /// for a pool of its own, else the part of a larger pool its owner gives
    /// it (RowanKV's `drpc` strategy: the engine's reserved area). Not recorded
    /// in the header — whoever opens the area says where it is.
    pub base: usize,
}

impl RingGeometry {
    /// Checks the relations the ring relies on.
    pub fn validate(&self) -> Result<(), String> {
        let g = self;
        if !g.base.is_multiple_of(PAGE_BYTES) {
            return Err(format!("base {} is not a multiple of 4 KiB", g.base));
        }
        if g.connections == 0 || g.connections > CONNECTIONS_MAX {
            return Err(format!(
                "connections {} not in 1..={CONNECTIONS_MAX}",
                g.connections
            ));
        }
        if g.chunk_bytes < 2 * ENTRY_ALIGN_BYTES || !g.chunk_bytes.is_multiple_of(ENTRY_ALIGN_BYTES)
        {
            return Err(format!(
                "chunk_bytes {} must be a multiple of 64, at least 128",
                g.chunk_bytes
            ));
        }
        if g.ring_bytes < 2 * g.chunk_bytes || !g.ring_bytes.is_multiple_of(g.chunk_bytes) {
            return Err(format!(
                "ring_bytes {} must be a multiple of chunk_bytes {}, at least two chunks",
                g.ring_bytes, g.chunk_bytes
            ));
        }
        if g.state_bytes == 0 || !g.state_bytes.is_multiple_of(64) {
            return Err(format!(
                "state_bytes {} must be a non-zero multiple of 64",
                g.state_bytes
            ));
        }
        if g.apply_bytes < APPLY_HEADER_BYTES + WRITE_HEADER_BYTES + 8
            || !g.apply_bytes.is_multiple_of(64)
        {
            return Err(format!(
                "apply_bytes {} must be a multiple of 64, at least 64",
                g.apply_bytes
            ));
        }
        Ok(())
    }

    pub fn chunks(&self) -> usize {
        self.ring_bytes / self.chunk_bytes
    }

    /// Largest payload of a single-request entry.
    pub fn payload_bytes_max(&self) -> usize {
        self.chunk_bytes - ENTRY_HEADER_BYTES - REQUEST_HEADER_BYTES
    }

    pub fn conn_header_offset(&self, conn: ConnId) -> usize {
        assert!(
            conn.0 < self.connections,
            "connection {conn:?} out of range"
        );
        self.base + POOL_HEADER_BYTES + conn.0 as usize * CONN_HEADER_BYTES
    }

    pub fn apply_offset(&self) -> usize {
        self.base
            + align_up(
                POOL_HEADER_BYTES + self.connections as usize * CONN_HEADER_BYTES,
                PAGE_BYTES,
            )
    }

    fn rings_offset(&self) -> usize {
        align_up(self.apply_offset() + self.apply_bytes, PAGE_BYTES)
    }

    pub fn ring_offset(&self, conn: ConnId) -> usize {
        assert!(
            conn.0 < self.connections,
            "connection {conn:?} out of range"
        );
        self.rings_offset() + conn.0 as usize * self.ring_bytes
    }

    pub fn state_offset(&self) -> usize {
        align_up(
            self.rings_offset() + self.connections as usize * self.ring_bytes,
            64,
        )
    }

    /// The pool size this geometry needs: the end of its area.
    pub fn pool_bytes(&self) -> usize {
        align_up(self.state_offset() + self.state_bytes, PAGE_BYTES)
    }

    /// Bytes of the area itself, from `base`.
    pub fn area_bytes(&self) -> usize {
        self.pool_bytes() - self.base
    }

    /// Where an entry of `len` bytes goes when the ring's tail is at `tail_abs`: at the
    /// tail if it fits in the rest of the tail's chunk, else at the next chunk's start.
    /// This is the multi-packet SRQ's rule (a message that does not fit in the rest of
    /// a buffer takes the next buffer), so a SEND lands where a WRITE would be placed.
    pub fn place(&self, tail_abs: u64, len: usize) -> u64 {
        assert!(
            len <= self.chunk_bytes,
            "entry of {len} bytes exceeds a chunk"
        );
        let chunk = self.chunk_bytes as u64;
        let rel = tail_abs % chunk;
        if rel > 0 && rel + len as u64 > chunk {
            tail_abs - rel + chunk
        } else {
            tail_abs
        }
    }

    /// The start of the chunk holding `abs`.
    pub fn chunk_start(&self, abs: u64) -> u64 {
        abs - abs % self.chunk_bytes as u64
    }

    /// Position within the ring of an absolute ring address.
    pub fn ring_pos(&self, abs: u64) -> usize {
        (abs % self.ring_bytes as u64) as usize
    }

    pub fn encode_pool_header(&self) -> [u8; POOL_HEADER_BYTES] {
        let mut h = [0u8; POOL_HEADER_BYTES];
        h[0..8].copy_from_slice(&POOL_MAGIC.to_le_bytes());
        h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.connections.to_le_bytes());
        h[16..24].copy_from_slice(&(self.ring_bytes as u64).to_le_bytes());
        h[24..32].copy_from_slice(&(self.chunk_bytes as u64).to_le_bytes());
        h[32..40].copy_from_slice(&(self.state_bytes as u64).to_le_bytes());
        h[40..48].copy_from_slice(&(self.apply_bytes as u64).to_le_bytes());
        let crc = crc32c::crc32c(&h[0..48]);
        h[48..52].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// The geometry a pool header records, or why the header is not one.
    pub fn decode_pool_header(h: &[u8]) -> Result<RingGeometry, String> {
        if h.len() < POOL_HEADER_BYTES {
            return Err("pool smaller than its header".into());
        }
        if le_u64(h, 0) != POOL_MAGIC {
            return Err("no durable-RPC pool header (bad magic)".into());
        }
        if crc32c::crc32c(&h[0..48]) != le_u32(h, 48) {
            return Err("pool header checksum mismatch".into());
        }
        let version = le_u32(h, 8);
        if version != FORMAT_VERSION {
            return Err(format!(
                "pool format version {version}, expected {FORMAT_VERSION}"
            ));
        }
        let g = RingGeometry {
            connections: le_u32(h, 12),
            ring_bytes: le_u64(h, 16) as usize,
            chunk_bytes: le_u64(h, 24) as usize,
            state_bytes: le_u64(h, 32) as usize,
            apply_bytes: le_u64(h, 40) as usize,
            base: 0,
        };
        g.validate()?;
        Ok(g)
    }
}

/// One request as it travels in an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireRequest {
    pub op: u16,
    pub payload: Vec<u8>,
}

/// Bytes a request takes in an entry's body.
pub fn request_bytes(payload_len: usize) -> usize {
    REQUEST_HEADER_BYTES + align_up(payload_len, 8)
}

/// Bytes of an entry (64 B aligned) whose body is `body_len` bytes.
pub fn entry_bytes(body_len: usize) -> usize {
    align_up(ENTRY_HEADER_BYTES + body_len, ENTRY_ALIGN_BYTES)
}

/// An entry's bytes, padded to 64 B: `requests` get seqs `seq`, `seq + 1`, ...
pub fn encode_entry(seq: u64, requests: &[(u16, &[u8])]) -> Vec<u8> {
    assert!(seq > 0, "seq 0 is the empty ring's");
    assert!(
        !requests.is_empty() && requests.len() <= ENTRY_REQUESTS_MAX,
        "an entry carries 1..={ENTRY_REQUESTS_MAX} requests"
    );
    let body_len: usize = requests.iter().map(|(_, p)| request_bytes(p.len())).sum();
    let mut e = vec![0u8; entry_bytes(body_len)];
    e[0..8].copy_from_slice(&seq.to_le_bytes());
    e[8..12].copy_from_slice(&(body_len as u32).to_le_bytes());
    e[16..18].copy_from_slice(&(requests.len() as u16).to_le_bytes());
    let mut at = ENTRY_HEADER_BYTES;
    for (op, payload) in requests {
        e[at..at + 2].copy_from_slice(&op.to_le_bytes());
        e[at + 4..at + 8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        e[at + 8..at + 8 + payload.len()].copy_from_slice(payload);
        at += request_bytes(payload.len());
    }
    let crc = entry_crc(&e, body_len);
    e[12..16].copy_from_slice(&crc.to_le_bytes());
    e
}

/// The checksum covers every byte of the header but itself, and the body.
fn entry_crc(e: &[u8], body_len: usize) -> u32 {
    let crc = crc32c::crc32c(&e[0..12]);
    crc32c::crc32c_append(crc, &e[16..ENTRY_HEADER_BYTES + body_len])
}

/// A decoded ring entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Seq of the first request; the others follow one by one.
    pub seq: u64,
    /// Bytes the entry takes in the ring (64 B aligned).
    pub len_bytes: usize,
    pub requests: Vec<WireRequest>,
}

impl Entry {
    /// One past the seq of the last request.
    pub fn end_seq(&self) -> u64 {
        self.seq + self.requests.len() as u64
    }
}

/// Reads the entry at ring position `pos` of the ring at pool offset `ring_off`, if
/// one is there whole: `room` bytes are left in its chunk, and a checksum mismatch,
/// a length out of bounds or a malformed body mean "no entry" (torn, stale or never
/// written).
pub fn read_entry(pool: &Pool, ring_off: usize, pos: usize, room: usize) -> Option<Entry> {
    if room < ENTRY_HEADER_BYTES {
        return None;
    }
    let mut h = [0u8; ENTRY_HEADER_BYTES];
    pool.read(ring_off + pos, &mut h);
    let seq = le_u64(&h, 0);
    let body_len = le_u32(&h, 8) as usize;
    let count = le_u16(&h, 16) as usize;
    if seq == 0 || count == 0 || ENTRY_HEADER_BYTES + body_len > room {
        return None;
    }
    let mut e = vec![0u8; ENTRY_HEADER_BYTES + body_len];
    e[..ENTRY_HEADER_BYTES].copy_from_slice(&h);
    pool.read(
        ring_off + pos + ENTRY_HEADER_BYTES,
        &mut e[ENTRY_HEADER_BYTES..],
    );
    decode_entry(&e)
}

/// Decodes an entry from its bytes (at least header + body); `None` if it is not a
/// whole, well-formed entry.
pub fn decode_entry(e: &[u8]) -> Option<Entry> {
    if e.len() < ENTRY_HEADER_BYTES {
        return None;
    }
    let seq = le_u64(e, 0);
    let body_len = le_u32(e, 8) as usize;
    let count = le_u16(e, 16) as usize;
    if seq == 0 || count == 0 || e.len() < ENTRY_HEADER_BYTES + body_len {
        return None;
    }
    // Seqs stay far from overflow, whatever the ring holds.
    if seq > SEQ_MAX {
        return None;
    }
    if entry_crc(e, body_len) != le_u32(e, 12) {
        return None;
    }
    let body = &e[ENTRY_HEADER_BYTES..ENTRY_HEADER_BYTES + body_len];
    let mut requests = Vec::with_capacity(count);
    let mut at = 0;
    for _ in 0..count {
        if at + REQUEST_HEADER_BYTES > body.len() {
            return None;
        }
        let op = le_u16(body, at);
        let len = le_u32(body, at + 4) as usize;
        let end = at.checked_add(request_bytes(len))?;
        if end > body.len() {
            return None;
        }
        let start = at + REQUEST_HEADER_BYTES;
        requests.push(WireRequest {
            op,
            payload: body[start..start + len].to_vec(),
        });
        at = end;
    }
    if at != body.len() {
        return None;
    }
    Some(Entry {
        seq,
        len_bytes: entry_bytes(body_len),
        requests,
    })
}

/// A write of the operator's effect to the state area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateWrite {
    /// Offset within the state area.
    pub offset: usize,
    pub bytes: Vec<u8>,
}

/// The redo record of one request's effect: which request, and the state writes it
/// makes. Written and persisted before the state is touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyRecord {
    pub conn: ConnId,
    pub seq: u64,
    pub writes: Vec<StateWrite>,
}

/// Bytes an apply record of `writes` takes.
pub fn apply_record_bytes(writes: &[StateWrite]) -> usize {
    APPLY_HEADER_BYTES
        + writes
            .iter()
            .map(|w| WRITE_HEADER_BYTES + align_up(w.bytes.len(), 8))
            .sum::<usize>()
}

pub fn encode_apply_record(r: &ApplyRecord) -> Vec<u8> {
    let total = apply_record_bytes(&r.writes);
    let mut b = vec![0u8; total];
    b[4..8].copy_from_slice(&(total as u32).to_le_bytes());
    b[8..12].copy_from_slice(&r.conn.0.to_le_bytes());
    b[12..16].copy_from_slice(&(r.writes.len() as u32).to_le_bytes());
    b[16..24].copy_from_slice(&r.seq.to_le_bytes());
    let mut at = APPLY_HEADER_BYTES;
    for w in &r.writes {
        b[at..at + 8].copy_from_slice(&(w.offset as u64).to_le_bytes());
        b[at + 8..at + 12].copy_from_slice(&(w.bytes.len() as u32).to_le_bytes());
        b[at + 16..at + 16 + w.bytes.len()].copy_from_slice(&w.bytes);
        at += WRITE_HEADER_BYTES + align_up(w.bytes.len(), 8);
    }
    let crc = crc32c::crc32c(&b[4..]);
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Reads the apply record of a pool, if a whole one is there.
pub fn read_apply_record(pool: &Pool, g: &RingGeometry) -> Option<ApplyRecord> {
    let off = g.apply_offset();
    let mut h = [0u8; APPLY_HEADER_BYTES];
    pool.read(off, &mut h);
    let total = le_u32(&h, 4) as usize;
    if total < APPLY_HEADER_BYTES || total > g.apply_bytes {
        return None;
    }
    let mut b = vec![0u8; total];
    pool.read(off, &mut b);
    decode_apply_record(&b, g.state_bytes)
}

/// Decodes an apply record; `None` if torn, malformed or writing outside a state of
/// `state_bytes`.
pub fn decode_apply_record(b: &[u8], state_bytes: usize) -> Option<ApplyRecord> {
    if b.len() < APPLY_HEADER_BYTES {
        return None;
    }
    let total = le_u32(b, 4) as usize;
    if total != b.len() || crc32c::crc32c(&b[4..]) != le_u32(b, 0) {
        return None;
    }
    let conn = ConnId(le_u32(b, 8));
    let count = le_u32(b, 12) as usize;
    let seq = le_u64(b, 16);
    let mut writes = Vec::new();
    let mut at = APPLY_HEADER_BYTES;
    for _ in 0..count {
        if at + WRITE_HEADER_BYTES > b.len() {
            return None;
        }
        let offset = usize::try_from(le_u64(b, at)).ok()?;
        let len = le_u32(b, at + 8) as usize;
        let end = at + WRITE_HEADER_BYTES + align_up(len, 8);
        if end > b.len() || offset.checked_add(len)? > state_bytes {
            return None;
        }
        writes.push(StateWrite {
            offset,
            bytes: b[at + WRITE_HEADER_BYTES..at + WRITE_HEADER_BYTES + len].to_vec(),
        });
        at = end;
    }
    (at == b.len()).then_some(ApplyRecord { conn, seq, writes })
}

/// What a reply reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// RFlush: the receiver's CPU persisted the entry ending with `seq`.
    Durable = 1,
    /// The request `seq` was executed; the reply bytes follow.
    Completed = 2,
}

/// A reply from the receiver to the sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub kind: ReplyKind,
    /// The receiver's backlog on this connection is above its threshold.
    pub slow_down: bool,
    pub seq: u64,
    /// The receiver's truncation point: ring bytes before it may be reused.
    pub head_abs: u64,
    pub bytes: Vec<u8>,
}

pub fn encode_reply(r: &Reply) -> Vec<u8> {
    let mut b = vec![0u8; REPLY_HEADER_BYTES + r.bytes.len()];
    b[0] = r.kind as u8;
    b[1] = u8::from(r.slow_down);
    b[4..8].copy_from_slice(&(r.bytes.len() as u32).to_le_bytes());
    b[8..16].copy_from_slice(&r.seq.to_le_bytes());
    b[16..24].copy_from_slice(&r.head_abs.to_le_bytes());
    b[REPLY_HEADER_BYTES..].copy_from_slice(&r.bytes);
    b
}

/// Decodes a reply message (a peer's bytes: malformed is an error, never a panic).
pub fn decode_reply(b: &[u8]) -> Result<Reply, &'static str> {
    if b.len() < REPLY_HEADER_BYTES {
        return Err("reply shorter than its header");
    }
    let kind = match b[0] {
        1 => ReplyKind::Durable,
        2 => ReplyKind::Completed,
        _ => return Err("unknown reply kind"),
    };
    if b[1] > 1 {
        return Err("unknown reply flags");
    }
    let len = le_u32(b, 4) as usize;
    if REPLY_HEADER_BYTES + len != b.len() {
        return Err("reply length does not match the message");
    }
    Ok(Reply {
        kind,
        slow_down: b[1] == 1,
        seq: le_u64(b, 8),
        head_abs: le_u64(b, 16),
        bytes: b[REPLY_HEADER_BYTES..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_pmem::PoolOptions;

    fn geometry() -> RingGeometry {
        RingGeometry {
            connections: 2,
            ring_bytes: 2048,
            chunk_bytes: 512,
            state_bytes: 1024,
            apply_bytes: 512,
            base: 0,
        }
    }

    #[test]
    fn entry_round_trips_and_pads_to_64() {
        let reqs: Vec<(u16, &[u8])> = vec![(7, b"hello"), (9, &[]), (1, &[0xAB; 70])];
        let e = encode_entry(42, &reqs);
        assert_eq!(e.len() % ENTRY_ALIGN_BYTES, 0);
        assert_eq!(e.len(), entry_bytes(8 + 8 + 8 + 8 + 72));
        let d = decode_entry(&e).expect("whole entry decodes");
        assert_eq!(d.seq, 42);
        assert_eq!(d.end_seq(), 45);
        assert_eq!(d.len_bytes, e.len());
        let got: Vec<(u16, &[u8])> = d.requests.iter().map(|r| (r.op, &r.payload[..])).collect();
        assert_eq!(got, reqs);
    }

    #[test]
    fn torn_entry_is_not_an_entry() {
        let e = encode_entry(3, &[(1, &[5u8; 100])]);
        // Any single byte changed anywhere in header or body is caught.
        for i in 0..ENTRY_HEADER_BYTES + REQUEST_HEADER_BYTES + 100 {
            let mut t = e.clone();
            t[i] ^= 0x40;
            assert_eq!(decode_entry(&t), None, "byte {i} flipped still decoded");
        }
        // A line that never arrived (zeros where the second line should be).
        let mut t = e.clone();
        t[64..].fill(0);
        assert_eq!(decode_entry(&t), None);
        assert_eq!(decode_entry(&[0u8; 64]), None, "zeroed ring is empty");
    }

    #[test]
    fn read_entry_respects_the_chunk_room() {
        let g = geometry();
        let pool = Pool::anonymous(g.pool_bytes(), PoolOptions::default()).unwrap();
        let ring = g.ring_offset(ConnId(1));
        let e = encode_entry(1, &[(1, &[1u8; 100])]);
        pool.write(ring + 64, &e);
        assert!(read_entry(&pool, ring, 64, 512 - 64).is_some());
        assert_eq!(
            read_entry(&pool, ring, 64, 100),
            None,
            "longer than its room"
        );
        assert_eq!(read_entry(&pool, ring, 0, 512), None);
    }

    #[test]
    fn placement_follows_the_multi_packet_srq_rule() {
        let g = geometry();
        assert_eq!(g.place(0, 512), 0);
        assert_eq!(g.place(64, 448), 64, "fits exactly in the rest");
        assert_eq!(g.place(64, 512), 512, "does not fit: next chunk");
        assert_eq!(
            g.place(1536 + 448, 128),
            2048,
            "the last chunk spills to the next lap"
        );
        assert_eq!(g.ring_pos(2048 + 64), 64);
        assert_eq!(g.chunk_start(1000), 512);
    }

    #[test]
    fn layout_regions_do_not_overlap() {
        let g = geometry();
        g.validate().unwrap();
        assert!(g.conn_header_offset(ConnId(1)) + CONN_HEADER_BYTES <= g.apply_offset());
        assert!(g.apply_offset() + g.apply_bytes <= g.ring_offset(ConnId(0)));
        assert_eq!(
            g.ring_offset(ConnId(1)),
            g.ring_offset(ConnId(0)) + g.ring_bytes
        );
        assert!(g.ring_offset(ConnId(1)) + g.ring_bytes <= g.state_offset());
        assert!(g.state_offset() + g.state_bytes <= g.pool_bytes());
        let h = g.encode_pool_header();
        assert_eq!(RingGeometry::decode_pool_header(&h), Ok(g));
        let mut bad = h;
        bad[20] ^= 1;
        assert!(RingGeometry::decode_pool_header(&bad).is_err());
        assert!(RingGeometry::decode_pool_header(&[0u8; 64]).is_err());
    }

    #[test]
    fn apply_record_round_trips_and_refuses_torn_or_out_of_bounds() {
        let r = ApplyRecord {
            conn: ConnId(1),
            seq: 9,
            writes: vec![
                StateWrite {
                    offset: 8,
                    bytes: vec![1, 2, 3],
                },
                StateWrite {
                    offset: 1000,
                    bytes: vec![7; 24],
                },
            ],
        };
        let b = encode_apply_record(&r);
        assert_eq!(b.len(), apply_record_bytes(&r.writes));
        assert_eq!(decode_apply_record(&b, 1024), Some(r.clone()));
        assert_eq!(decode_apply_record(&b, 1000), None, "write past the state");
        for i in 0..b.len() {
            let mut t = b.clone();
            t[i] ^= 0x10;
            assert_eq!(decode_apply_record(&t, 1024), None, "byte {i} flipped");
        }
    }

    #[test]
    fn reply_round_trips_and_refuses_malformed() {
        let r = Reply {
            kind: ReplyKind::Completed,
            slow_down: true,
            seq: 77,
            head_abs: 4096,
            bytes: b"ok".to_vec(),
        };
        let b = encode_reply(&r);
        assert_eq!(decode_reply(&b), Ok(r));
        assert!(decode_reply(&b[..10]).is_err());
        assert!(decode_reply(&b[..b.len() - 1]).is_err());
        let mut t = b.clone();
        t[0] = 9;
        assert!(decode_reply(&t).is_err());
    }
}
