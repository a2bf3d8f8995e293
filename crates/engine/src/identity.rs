//! The node identity a pool belongs to: which cluster, and which node the CM
//! handed this server (`ConfigManager::allocate_node`). Kept in the superblock
//! page, so that a server restarted on its pool rejoins under the identity it
//! had, and a pool is never served under another cluster's id by mistake.
//!
//! Record (`docs/format/segments.md`), little-endian, at [`IDENTITY_OFFSET`]:
//! magic `RKVNODE1` (8 bytes), cluster id u64, node u32, reserved u32 (0),
//! CRC32C of the first 24 bytes (u32). All zeros: no identity yet. Formatting a
//! pool clears it; anything else that does not check is reported as corruption,
//! never trusted.

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

fn encode(id: Identity) -> [u8; IDENTITY_BYTES] {
    let mut b = [0u8; IDENTITY_BYTES];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&id.cluster_id.to_le_bytes());
    b[16..20].copy_from_slice(&id.node.0.to_le_bytes());
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
    if stored != computed || u32_at(20) != 0 {
        return Err(EngineError::Corrupt(format!(
            "node identity record: checksum mismatch (stored {stored:#x}, computed {computed:#x})"
        )));
    }
    Ok(Some(Identity {
        cluster_id: u64_at(8),
        node: NodeId(u32_at(16)),
    }))
}

/// Record `id` in `pool`, durably.
pub fn write_identity(pool: &Pool, id: Identity) -> Result<(), EngineError> {
    check_room(pool)?;
    pool.write(IDENTITY_OFFSET, &encode(id));
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
