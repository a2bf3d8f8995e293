//! The node identity a pool belongs to: which cluster, and which node the CM
//! handed this server (`ConfigManager::allocate_node`). Kept in the superblock
//! page, so that a server restarted on its pool rejoins under the identity it
//! had, and a pool is never served under another cluster's id by mistake.
//!
//! Record (`docs/format/segments.md`), little-endian, in two slots of one
//! cache line each at [`IDENTITY_OFFSET`] and [`IDENTITY_OFFSET`]` + 64`:
//! magic `RKVNODE2` (8 bytes), cluster id u64, node u32, flags u32 (0, or 1:
//! *stale*, below), member term u64, sequence u32, CRC32C of the first 36 bytes
//! (u32). A change writes the slot that does not hold the current record, with
//! the next sequence number, and persists it: a write torn by a power failure
//! (PM keeps 8-byte words, not records) leaves the other slot, the record as
//! it was. The valid slot with the higher sequence is the record. A record of
//! the first format (`RKVNODE1`, 28 bytes in the first slot: no member term,
//! one slot) still reads, as member term 0. Both slots all zeros: no identity
//! yet. Formatting a pool clears both; a slot that is neither zeros nor valid
//! is ignored while the other is valid, and corruption when neither is.
//!
//! *Stale* ([`mark_stale`]): the server learned that the CM removed it while it
//! was down, so the pool's data predates a removal. The mark is persisted
//! before anything else, so that a server killed on its way back still knows it
//! on its next start; a server that comes back as a joining backup formats a
//! pool so marked (`crates/deploy/src/server.rs`). Writing the identity again
//! (after formatting) clears it.
//!
//! *Member term* ([`record_member_term`]): the newest configuration term in
//! which the server was a member when it last came up on this pool. News
//! that the CM removed it (a join answer, a configuration read) from a term
//! no newer than that is from a stale view, and must not mark the pool stale:
//! a joining backup whose fill completed, restarted within its lease and told
//! by a lagging CM that it is not a member, would otherwise format a pool the
//! CM may be promoting to a full replica.

use rowankv_pmem::Pool;
use rowankv_types::NodeId;

use crate::segment::SUPERBLOCK_BYTES;
use crate::EngineError;

/// Where the record's first slot lives: in the superblock page, past the
/// geometry. The second is one cache line further.
pub const IDENTITY_OFFSET: usize = 2048;
/// Bytes of one slot's record.
pub const IDENTITY_BYTES: usize = 40;
/// Distance between the two slots.
const SLOT_STRIDE: usize = 64;
const MAGIC: u64 = u64::from_le_bytes(*b"RKVNODE2");
/// The first format: one slot, 28 bytes, no member term.
const MAGIC_V1: u64 = u64::from_le_bytes(*b"RKVNODE1");
const V1_BYTES: usize = 28;

/// Whose pool this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub cluster_id: u64,
    pub node: NodeId,
}

/// The flag of a stale pool.
const STALE: u32 = 1;

/// One record as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    id: Identity,
    flags: u32,
    member_term: u64,
    seq: u32,
}

fn encode(r: Record) -> [u8; IDENTITY_BYTES] {
    let mut b = [0u8; IDENTITY_BYTES];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&r.id.cluster_id.to_le_bytes());
    b[16..20].copy_from_slice(&r.id.node.0.to_le_bytes());
    b[20..24].copy_from_slice(&r.flags.to_le_bytes());
    b[24..32].copy_from_slice(&r.member_term.to_le_bytes());
    b[32..36].copy_from_slice(&r.seq.to_le_bytes());
    let crc = crc32c::crc32c(&b[..36]);
    b[36..40].copy_from_slice(&crc.to_le_bytes());
    b
}

/// What a slot holds.
enum Slot {
    Empty,
    Valid(Record),
    /// Neither zeros nor a record that checks (a torn write, damage).
    Bad(String),
}

fn decode(b: &[u8; IDENTITY_BYTES], first: bool) -> Slot {
    if b.iter().all(|&x| x == 0) {
        return Slot::Empty;
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let id = Identity {
        cluster_id: u64_at(8),
        node: NodeId(u32_at(16)),
    };
    let flags = u32_at(20);
    match u64_at(0) {
        MAGIC => {
            let (stored, computed) = (u32_at(36), crc32c::crc32c(&b[..36]));
            if stored != computed {
                return Slot::Bad(format!(
                    "checksum mismatch (stored {stored:#x}, computed {computed:#x})"
                ));
            }
            if flags & !STALE != 0 {
                return Slot::Bad(format!("unknown flags {flags:#x}"));
            }
            Slot::Valid(Record {
                id,
                flags,
                member_term: u64_at(24),
                seq: u32_at(32),
            })
        }
        // The first format lives in the first slot only.
        MAGIC_V1 if first => {
            let (stored, computed) = (u32_at(24), crc32c::crc32c(&b[..24]));
            if stored != computed {
                return Slot::Bad(format!(
                    "checksum mismatch (stored {stored:#x}, computed {computed:#x})"
                ));
            }
            if flags & !STALE != 0 {
                return Slot::Bad(format!("unknown flags {flags:#x}"));
            }
            Slot::Valid(Record {
                id,
                flags,
                member_term: 0,
                seq: 0,
            })
        }
        _ => Slot::Bad("bad magic".into()),
    }
}

fn check_room(pool: &Pool) -> Result<(), EngineError> {
    if pool.len_bytes() < SUPERBLOCK_BYTES {
        return Err(EngineError::Corrupt(
            "pool smaller than a superblock".into(),
        ));
    }
    Ok(())
}

fn read_slot(pool: &Pool, slot: usize) -> Slot {
    let mut b = [0u8; IDENTITY_BYTES];
    pool.read(IDENTITY_OFFSET + slot * SLOT_STRIDE, &mut b);
    if slot == 0 && u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")) == MAGIC_V1 {
        // A first-format record is 28 bytes; what follows it is not its own.
        b[V1_BYTES..].fill(0);
    }
    decode(&b, slot == 0)
}

/// The current record and the slot it is in; `None` if there is none.
fn read_current(pool: &Pool) -> Result<Option<(Record, usize)>, EngineError> {
    check_room(pool)?;
    let slots = [read_slot(pool, 0), read_slot(pool, 1)];
    let mut best: Option<(Record, usize)> = None;
    let mut bad = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        match s {
            Slot::Empty => {}
            Slot::Valid(r) => {
                if best.is_none_or(|(b, _)| r.seq > b.seq) {
                    best = Some((*r, i));
                }
            }
            Slot::Bad(why) => bad.push(format!("slot {i}: {why}")),
        }
    }
    match best {
        Some(b) => Ok(Some(b)),
        None if bad.is_empty() => Ok(None),
        None => Err(EngineError::Corrupt(format!(
            "node identity record: {}",
            bad.join("; ")
        ))),
    }
}

/// Write `r` (its sequence set here) into the slot not holding `current`
/// (the record as read, and its slot), durably.
fn write_next(pool: &Pool, current: Option<(Record, usize)>, r: Record) -> Result<(), EngineError> {
    let (slot, seq) = match current {
        Some((c, i)) => (1 - i, c.seq.wrapping_add(1)),
        None => (0, 1),
    };
    let at = IDENTITY_OFFSET + slot * SLOT_STRIDE;
    pool.write(at, &encode(Record { seq, ..r }));
    pool.persist(at, IDENTITY_BYTES);
    Ok(())
}

/// The identity recorded in `pool`, `None` if none is.
pub fn read_identity(pool: &Pool) -> Result<Option<Identity>, EngineError> {
    Ok(read_current(pool)?.map(|(r, _)| r.id))
}

/// Whether the pool is marked stale ([`mark_stale`]).
pub fn marked_stale(pool: &Pool) -> Result<bool, EngineError> {
    Ok(read_current(pool)?.is_some_and(|(r, _)| r.flags & STALE != 0))
}

/// The member term recorded ([`record_member_term`]; 0: none).
pub fn member_term(pool: &Pool) -> Result<u64, EngineError> {
    Ok(read_current(pool)?.map_or(0, |(r, _)| r.member_term))
}

/// Mark the pool's data stale, persisted (the pool must hold an identity).
pub fn mark_stale(pool: &Pool) -> Result<(), EngineError> {
    let current = read_current(pool)?;
    let Some((r, _)) = current else {
        return Err(EngineError::Corrupt(
            "marking a pool stale: it holds no node identity".into(),
        ));
    };
    if r.flags & STALE == 0 {
        write_next(
            pool,
            current,
            Record {
                flags: r.flags | STALE,
                ..r
            },
        )?;
    }
    Ok(())
}

/// Record that the server is a member of the configuration of `term` (kept
/// if a newer term is recorded already), persisted. The pool must hold an
/// identity.
pub fn record_member_term(pool: &Pool, term: u64) -> Result<(), EngineError> {
    let current = read_current(pool)?;
    let Some((r, _)) = current else {
        return Err(EngineError::Corrupt(
            "recording a member term: the pool holds no node identity".into(),
        ));
    };
    if term > r.member_term {
        write_next(
            pool,
            current,
            Record {
                member_term: term,
                ..r
            },
        )?;
    }
    Ok(())
}

/// Record `id` in `pool`, durably: not stale, the member term kept if the
/// identity is the one recorded (0 for another).
pub fn write_identity(pool: &Pool, id: Identity) -> Result<(), EngineError> {
    check_room(pool)?;
    // A record that does not read (both slots damaged) is replaced whole.
    let current = read_current(pool).unwrap_or(None);
    let member_term = match current {
        Some((r, _)) if r.id == id => r.member_term,
        _ => 0,
    };
    write_next(
        pool,
        current,
        Record {
            id,
            flags: 0,
            member_term,
            seq: 0,
        },
    )
}

/// Forget the identity (formatting): the slot not holding the record first,
/// persisted, then the record's. A power failure between the two leaves the
/// record as it was (never an older one, which might lack the stale mark).
pub(crate) fn clear_identity(pool: &Pool) {
    let order = match read_current(pool) {
        Ok(Some((_, current))) => [1 - current, current],
        _ => [0, 1],
    };
    for slot in order {
        let at = IDENTITY_OFFSET + slot * SLOT_STRIDE;
        pool.write(at, &[0u8; IDENTITY_BYTES]);
        pool.persist(at, IDENTITY_BYTES);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_pmem::{Medium, PoolOptions};

    fn pool() -> std::sync::Arc<Pool> {
        Pool::anonymous(1 << 20, PoolOptions::new(Medium::Emulated, 1 << 20)).unwrap()
    }

    #[test]
    fn an_identity_round_trips_and_formatting_forgets_it() {
        let p = pool();
        assert_eq!(read_identity(&p).unwrap(), None);
        let id = Identity {
            cluster_id: 0xABCD,
            node: NodeId(10_007),
        };
        write_identity(&p, id).unwrap();
        assert_eq!(read_identity(&p).unwrap(), Some(id));
        clear_identity(&p);
        assert_eq!(read_identity(&p).unwrap(), None);
    }

    #[test]
    fn a_stale_mark_persists_with_the_identity_and_writing_it_again_clears_it() {
        let mut o = PoolOptions::new(Medium::Emulated, 1 << 20);
        o.crash_sim = true;
        let p = Pool::anonymous(1 << 20, o).unwrap();
        assert!(mark_stale(&p).is_err(), "no identity to mark");
        let id = Identity {
            cluster_id: 9,
            node: NodeId(4),
        };
        write_identity(&p, id).unwrap();
        assert!(!marked_stale(&p).unwrap());
        mark_stale(&p).unwrap();
        mark_stale(&p).unwrap();
        assert!(marked_stale(&p).unwrap());
        assert_eq!(read_identity(&p).unwrap(), Some(id));
        // Persisted: what a crash keeps holds the mark.
        let image =
            p.crash()
                .expect("crash simulation")
                .image(rowankv_pmem::PowerFailure::DropSubset {
                    seed: 1,
                    drop_probability: 1.0,
                });
        let again = Pool::from_image(&image, {
            let mut o = PoolOptions::new(Medium::Emulated, image.len());
            o.crash_sim = true;
            o
        })
        .unwrap();
        assert!(marked_stale(&again).unwrap());
        write_identity(&p, id).unwrap();
        assert!(!marked_stale(&p).unwrap());
        // Any other flag is corruption (of the only record there is).
        clear_identity(&p);
        write_identity(&p, id).unwrap();
        p.write(IDENTITY_OFFSET + 20, &2u32.to_le_bytes());
        assert!(matches!(read_identity(&p), Err(EngineError::Corrupt(_))));
    }

    fn crash_pool() -> std::sync::Arc<Pool> {
        let mut o = PoolOptions::new(Medium::Emulated, 1 << 20);
        o.crash_sim = true;
        Pool::anonymous(1 << 20, o).unwrap()
    }

    #[test]
    fn a_member_term_only_rises_survives_a_crash_and_is_kept_by_rewriting_the_identity() {
        let p = crash_pool();
        let id = Identity {
            cluster_id: 5,
            node: NodeId(10_002),
        };
        assert!(record_member_term(&p, 3).is_err(), "no identity yet");
        write_identity(&p, id).unwrap();
        assert_eq!(member_term(&p).unwrap(), 0);
        record_member_term(&p, 40).unwrap();
        record_member_term(&p, 12).unwrap();
        assert_eq!(
            member_term(&p).unwrap(),
            40,
            "an older term never lowers it"
        );
        mark_stale(&p).unwrap();
        assert_eq!(member_term(&p).unwrap(), 40, "marking keeps it");
        let image = p
            .crash()
            .unwrap()
            .image(rowankv_pmem::PowerFailure::DropSubset {
                seed: 3,
                drop_probability: 1.0,
            });
        let again =
            Pool::from_image(&image, PoolOptions::new(Medium::Emulated, image.len())).unwrap();
        assert_eq!(member_term(&again).unwrap(), 40);
        assert!(marked_stale(&again).unwrap());
        // Clearing the mark keeps the term; another identity, or formatting,
        // starts from none.
        write_identity(&p, id).unwrap();
        assert!(!marked_stale(&p).unwrap());
        assert_eq!(member_term(&p).unwrap(), 40);
        clear_identity(&p);
        write_identity(&p, id).unwrap();
        assert_eq!(member_term(&p).unwrap(), 0);
    }

    #[test]
    fn a_torn_change_leaves_the_record_it_was_to_replace() {
        let p = pool();
        let id = Identity {
            cluster_id: 8,
            node: NodeId(6),
        };
        write_identity(&p, id).unwrap();
        record_member_term(&p, 9).unwrap();
        // The change to the stale mark goes to the other slot; tear it as a
        // power failure between two 8-byte words would (flags written, the
        // checksum not).
        mark_stale(&p).unwrap();
        let newest = (0..2)
            .max_by_key(|&slot| {
                let mut b = [0u8; 4];
                p.read(IDENTITY_OFFSET + slot * SLOT_STRIDE + 32, &mut b);
                u32::from_le_bytes(b)
            })
            .unwrap();
        p.write(
            IDENTITY_OFFSET + newest * SLOT_STRIDE + 36,
            &[0xde, 0xad, 0xbe, 0xef],
        );
        assert_eq!(
            read_identity(&p).unwrap(),
            Some(id),
            "the old record stands"
        );
        assert!(!marked_stale(&p).unwrap(), "the torn mark never was");
        assert_eq!(member_term(&p).unwrap(), 9);
        // The next change overwrites the torn slot, not the good one.
        mark_stale(&p).unwrap();
        assert!(marked_stale(&p).unwrap());
        assert_eq!(member_term(&p).unwrap(), 9);
    }

    /// A crash at every persist point of clearing (formatting) leaves the
    /// record as it was or none at all — never the older record of the other
    /// slot, which lacks the stale mark the current one holds.
    #[test]
    fn clearing_never_exposes_the_older_record_at_any_crash_point() {
        let p = crash_pool();
        let id = Identity {
            cluster_id: 12,
            node: NodeId(10_009),
        };
        write_identity(&p, id).unwrap();
        record_member_term(&p, 4).unwrap();
        mark_stale(&p).unwrap();
        let images = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (p2, i2) = (p.clone(), images.clone());
        // At each persist point, what a power failure would keep: every
        // unpersisted line dropped, or a random half of them (a clear that
        // spanned both slots' lines at once could lose one and keep the other).
        p.crash().unwrap().set_persist_hook(Some(Box::new(move |_| {
            let c = p2.crash().unwrap();
            let mut i = i2.lock();
            for seed in 0..16 {
                i.push(c.image(rowankv_pmem::PowerFailure::DropSubset {
                    seed,
                    drop_probability: if seed == 0 { 1.0 } else { 0.5 },
                }));
            }
        })));
        clear_identity(&p);
        p.crash().unwrap().set_persist_hook(None);
        let images = images.lock();
        assert_eq!(images.len(), 2 * 16, "two persist points");
        for (k, image) in images.iter().enumerate() {
            let q =
                Pool::from_image(image, PoolOptions::new(Medium::Emulated, image.len())).unwrap();
            match read_identity(&q).unwrap() {
                None => {}
                Some(got) => {
                    assert_eq!(got, id);
                    assert!(
                        marked_stale(&q).unwrap(),
                        "crash point {k}: the older, unmarked record"
                    );
                    assert_eq!(member_term(&q).unwrap(), 4);
                }
            }
        }
        assert_eq!(read_identity(&p).unwrap(), None);
    }

    #[test]
    fn a_first_format_record_still_reads_and_the_next_change_supersedes_it() {
        let p = pool();
        let id = Identity {
            cluster_id: 0x77,
            node: NodeId(10_004),
        };
        // RKVNODE1: magic, cluster, node, flags (stale), CRC of 24 bytes.
        let mut b = [0u8; V1_BYTES];
        b[0..8].copy_from_slice(b"RKVNODE1");
        b[8..16].copy_from_slice(&id.cluster_id.to_le_bytes());
        b[16..20].copy_from_slice(&id.node.0.to_le_bytes());
        b[20..24].copy_from_slice(&STALE.to_le_bytes());
        let crc = crc32c::crc32c(&b[..24]);
        b[24..28].copy_from_slice(&crc.to_le_bytes());
        p.write(IDENTITY_OFFSET, &b);
        assert_eq!(read_identity(&p).unwrap(), Some(id));
        assert!(marked_stale(&p).unwrap());
        assert_eq!(member_term(&p).unwrap(), 0);
        record_member_term(&p, 21).unwrap();
        assert_eq!(member_term(&p).unwrap(), 21);
        assert!(marked_stale(&p).unwrap(), "the change keeps the mark");
        // A first-format record with a bad checksum is corruption.
        let q = pool();
        b[24] ^= 1;
        q.write(IDENTITY_OFFSET, &b);
        assert!(matches!(read_identity(&q), Err(EngineError::Corrupt(_))));
    }

    #[test]
    fn a_damaged_record_is_corruption_not_an_identity() {
        let p = pool();
        let id = Identity {
            cluster_id: 7,
            node: NodeId(3),
        };
        for byte in [0, 9, 17, 21, 25] {
            write_identity(&p, id).unwrap();
            let mut b = [0u8; 1];
            p.read(IDENTITY_OFFSET + byte, &mut b);
            p.write(IDENTITY_OFFSET + byte, &[b[0] ^ 0x10]);
            assert!(
                matches!(read_identity(&p), Err(EngineError::Corrupt(_))),
                "a flipped bit in byte {byte} went unnoticed"
            );
        }
    }
}
