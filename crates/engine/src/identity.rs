//! The node identity a pool belongs to: which cluster, and which node the CM
//! handed this server (`ConfigManager::allocate_node`). Kept in the superblock
//! page, so that a server restarted on its pool rejoins under the identity it
//! had, and a pool is never served under another cluster's id by mistake.
//!
//! Record (`docs/format/segments.md`), little-endian, at [`IDENTITY_OFFSET`]:
//! magic `RKVNODE1` (8 bytes), cluster id u64, node u32, flags u32 (0, or 1:
//! *stale*, below), CRC32C of the first 24 bytes (u32). All zeros: no identity
//! yet. Formatting a pool clears it; anything else that does not check is
//! reported as corruption, never trusted.
//!
//! *Stale* ([`mark_stale`]): the server learned that the CM removed it while it
//! was down, so the pool's data predates a removal. The mark is persisted
//! before anything else, so that a server killed on its way back still knows it
//! on its next start; a server that comes back as a joining backup formats a
//! pool so marked (`crates/deploy/src/server.rs`). Writing the identity again
//! (after formatting) clears it.

use rowankv_pmem::Pool;
use rowankv_types::NodeId;

use crate::segment::SUPERBLOCK_BYTES;
use crate::EngineError;

/// Where the record lives: in the superblock page, past the geometry.
pub const IDENTITY_OFFSET: usize = 2048;
/// Bytes of the record.
pub const IDENTITY_BYTES: usize = 28;
const MAGIC: u64 = u64::from_le_bytes(*b"RKVNODE1");

/// Whose pool this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub cluster_id: u64,
    pub node: NodeId,
}

/// The flag of a stale pool.
const STALE: u32 = 1;

fn encode(id: Identity, flags: u32) -> [u8; IDENTITY_BYTES] {
    let mut b = [0u8; IDENTITY_BYTES];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&id.cluster_id.to_le_bytes());
    b[16..20].copy_from_slice(&id.node.0.to_le_bytes());
    b[20..24].copy_from_slice(&flags.to_le_bytes());
    let crc = crc32c::crc32c(&b[..24]);
    b[24..28].copy_from_slice(&crc.to_le_bytes());
    b
}

fn check_room(pool: &Pool) -> Result<(), EngineError> {
    if pool.len_bytes() < SUPERBLOCK_BYTES {
        return Err(EngineError::Corrupt(
            "pool smaller than a superblock".into(),
        ));
    }
    Ok(())
}

/// The identity recorded in `pool`, `None` if none is.
pub fn read_identity(pool: &Pool) -> Result<Option<Identity>, EngineError> {
    Ok(read_record(pool)?.map(|(id, _)| id))
}

/// Whether the pool is marked stale ([`mark_stale`]).
pub fn marked_stale(pool: &Pool) -> Result<bool, EngineError> {
    Ok(read_record(pool)?.is_some_and(|(_, flags)| flags & STALE != 0))
}

/// Mark the pool's data stale, persisted (the pool must hold an identity).
pub fn mark_stale(pool: &Pool) -> Result<(), EngineError> {
    let Some((id, flags)) = read_record(pool)? else {
        return Err(EngineError::Corrupt(
            "marking a pool stale: it holds no node identity".into(),
        ));
    };
    if flags & STALE == 0 {
        pool.write(IDENTITY_OFFSET, &encode(id, flags | STALE));
        pool.persist(IDENTITY_OFFSET, IDENTITY_BYTES);
    }
    Ok(())
}

fn read_record(pool: &Pool) -> Result<Option<(Identity, u32)>, EngineError> {
    check_room(pool)?;
    let mut b = [0u8; IDENTITY_BYTES];
    pool.read(IDENTITY_OFFSET, &mut b);
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    if u64_at(0) != MAGIC {
        return Err(EngineError::Corrupt(
            "node identity record: bad magic".into(),
        ));
    }
    let (stored, computed) = (u32_at(24), crc32c::crc32c(&b[..24]));
    if stored != computed || u32_at(20) & !STALE != 0 {
        return Err(EngineError::Corrupt(format!(
            "node identity record: checksum mismatch (stored {stored:#x}, computed {computed:#x})"
        )));
    }
    Ok(Some((
        Identity {
            cluster_id: u64_at(8),
            node: NodeId(u32_at(16)),
        },
        u32_at(20),
    )))
}

/// Record `id` in `pool`, durably.
pub fn write_identity(pool: &Pool, id: Identity) -> Result<(), EngineError> {
    check_room(pool)?;
    pool.write(IDENTITY_OFFSET, &encode(id, 0));
    pool.persist(IDENTITY_OFFSET, IDENTITY_BYTES);
    Ok(())
}

/// Forget the identity (formatting).
pub(crate) fn clear_identity(pool: &Pool) {
    pool.write(IDENTITY_OFFSET, &[0u8; IDENTITY_BYTES]);
    pool.persist(IDENTITY_OFFSET, IDENTITY_BYTES);
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
        // Any other flag is corruption.
        p.write(IDENTITY_OFFSET + 20, &2u32.to_le_bytes());
        assert!(matches!(read_identity(&p), Err(EngineError::Corrupt(_))));
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
