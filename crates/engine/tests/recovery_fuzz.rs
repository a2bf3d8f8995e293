//! Recovery from arbitrary and corrupted images: an error or a report, never a
//! panic, never an out-of-bounds read, and never a value that was not written.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use rowankv_engine::{Engine, EngineConfig, EngineError};
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_types::ShardId;

const POOL_BYTES: usize = 256 << 10;

/// Every value each (shard, key) was ever given.
type Written = BTreeMap<(u16, Vec<u8>), BTreeSet<Vec<u8>>>;

fn config() -> EngineConfig {
    EngineConfig {
        segment_size_bytes: 16 << 10,
        mtu_bytes: 2048,
        shard_count: 4,
        workers: 1,
        keys_per_shard_expected: 64,
        ..EngineConfig::default()
    }
}

/// A pool image with entries in it, and every value each key ever had.
fn written_image() -> (Vec<u8>, Written) {
    let pool = Pool::anonymous(POOL_BYTES, PoolOptions::default()).unwrap();
    let engine = Engine::create(pool.clone(), config()).unwrap();
    let mut written: Written = BTreeMap::new();
    for i in 0..600u32 {
        let shard = (i % 4) as u16;
        let key = format!("key-{}", i % 50).into_bytes();
        let len = if i % 97 == 0 {
            3000
        } else {
            (i % 150) as usize
        };
        let value: Vec<u8> = (0..len).map(|j| (i as usize * 7 + j) as u8).collect();
        engine.put(0, ShardId(shard), &key, &value).unwrap();
        written.entry((shard, key)).or_default().insert(value);
    }
    let mut image = vec![0u8; POOL_BYTES];
    pool.read(0, &mut image);
    (image, written)
}

/// Open `image` and read every key: must not panic; values must be ones written.
fn open_and_read(image: &[u8], written: &Written) {
    let pool = Pool::from_image(image, PoolOptions::default()).unwrap();
    let Ok((engine, _report)) = Engine::open(pool, config()) else {
        return;
    };
    for ((shard, key), values) in written {
        match engine.get(ShardId(*shard), key) {
            Ok(Some((v, _))) => assert!(values.contains(&v), "a value never written appeared"),
            Ok(None) | Err(EngineError::Corrupt(_)) => {}
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_images_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..8192), fill in any::<u8>()) {
        let mut image = vec![fill; POOL_BYTES];
        image[..bytes.len()].copy_from_slice(&bytes);
        let pool = Pool::from_image(&image, PoolOptions::default()).unwrap();
        prop_assert!(Engine::open(pool, config()).is_err(), "random bytes are no superblock");
    }

    #[test]
    fn superblocks_with_any_geometry_never_panic(seg in any::<u64>(), count in any::<u64>(), data in any::<u64>(), small in 0u64..64) {
        // A superblock whose checksum is right but whose geometry is arbitrary.
        let mut image = vec![0u8; POOL_BYTES];
        image[0..8].copy_from_slice(b"RKVPOOL1");
        image[8..12].copy_from_slice(&1u32.to_le_bytes());
        let seg = if small % 2 == 0 { seg } else { (small + 1) * 4096 };
        let count = if small % 3 == 0 { count } else { small };
        image[16..24].copy_from_slice(&seg.to_le_bytes());
        image[24..32].copy_from_slice(&count.to_le_bytes());
        image[32..40].copy_from_slice(&data.to_le_bytes());
        let crc = crc32c_of(&image[..40]);
        image[40..44].copy_from_slice(&crc.to_le_bytes());
        let pool = Pool::from_image(&image, PoolOptions::default()).unwrap();
        let _ = Engine::open(pool, config());
    }

    #[test]
    fn corrupted_written_images_recover_or_report(
        damage in proptest::collection::vec((0usize..POOL_BYTES, proptest::collection::vec(any::<u8>(), 1..64)), 1..8)
    ) {
        let (mut image, written) = written_image();
        for (at, bytes) in damage {
            let end = (at + bytes.len()).min(POOL_BYTES);
            image[at..end].copy_from_slice(&bytes[..end - at]);
        }
        open_and_read(&image, &written);
    }
}

fn crc32c_of(b: &[u8]) -> u32 {
    // The superblock's checksum is CRC32C, as `docs/format/segments.md` says.
    crc32c::crc32c(b)
}

#[test]
fn a_corrupted_entry_is_reported_and_skipped_and_the_others_survive() {
    let pool = Pool::anonymous(POOL_BYTES, PoolOptions::default()).unwrap();
    let engine = Engine::create(pool.clone(), config()).unwrap();
    let mut addrs = Vec::new();
    for i in 0..40u32 {
        let w = engine
            .put(0, ShardId(0), format!("k{i}").as_bytes(), &[i as u8; 100])
            .unwrap();
        addrs.push(w.addr);
    }
    drop(engine);
    // Flip a byte inside the 20th entry's value.
    let at = addrs[20] as usize + 60;
    let mut b = [0u8];
    pool.read(at, &mut b);
    pool.write(at, &[b[0] ^ 0xFF]);
    let (engine, report) = Engine::open(pool, config()).unwrap();
    assert_eq!(report.skipped_blocks.len(), 1, "{report:?}");
    assert!(
        report.skipped_blocks[0].2.contains("checksum"),
        "{report:?}"
    );
    for i in (0..40u32).filter(|&i| i != 20) {
        let got = engine.get(ShardId(0), format!("k{i}").as_bytes()).unwrap();
        assert_eq!(got.map(|(v, _)| v), Some(vec![i as u8; 100]), "k{i}");
    }
    // The corrupted entry is never trusted.
    assert_eq!(engine.get(ShardId(0), b"k20").unwrap(), None);
}
