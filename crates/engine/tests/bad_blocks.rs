//! Blocks that verify but cannot be assembled — a duplicate of a block already
//! held, a block that disagrees with its entry's earlier blocks, more incomplete
//! entries than the assembler may hold — are reported and skipped, as a torn block
//! is: they never fail recovery of the whole pool, never wedge digest, and every
//! other entry around them is kept.

use std::sync::Arc;

use rowankv_engine::entry::{self, Assembler, Kind, ASSEMBLER_PENDING_MAX};
use rowankv_engine::{BackupLog, BackupLogConfig, Engine, EngineConfig};
use rowankv_fabric::LoopbackNic;
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_types::{SegmentId, ShardId, Version};

const MTU: usize = 2048;
const SEGMENT: usize = 16 << 10;
const GRACE_NS: u64 = 1_000;
/// The shard of the split entries.
const SHARD: u16 = 1;

fn config() -> EngineConfig {
    EngineConfig {
        segment_size_bytes: SEGMENT,
        mtu_bytes: MTU,
        shard_count: 4,
        workers: 1,
        keys_per_shard_expected: 256,
        ..EngineConfig::default()
    }
}

fn pool(bytes: usize) -> Arc<Pool> {
    Pool::anonymous(bytes, PoolOptions::default()).unwrap()
}

fn encoded(kind: Kind, shard: u16, version: u64, key: &[u8], value: &[u8], mtu: usize) -> Vec<u8> {
    let mut out = Vec::new();
    entry::encode(
        &mut out,
        kind,
        ShardId(shard),
        Version(version),
        key,
        value,
        mtu,
    )
    .unwrap();
    out
}

fn value(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// The blocks of an encoded entry, each padded.
fn blocks(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = entry::parse_block(&bytes[at..]).unwrap().0.padded_len();
        out.push(bytes[at..at + len].to_vec());
        at += len;
    }
    out
}

/// Write `parts` back to back into a fresh remote-log segment (as remote WRITEs
/// would land them), durably.
fn land(engine: &Engine, parts: &[Vec<u8>]) -> (SegmentId, Vec<usize>) {
    let (seg, offset) = engine.alloc_remote_segment().unwrap();
    let base = engine.layout().data_offset + offset;
    let mut at = 0;
    let mut offsets = Vec::new();
    for part in parts {
        assert!(at + part.len() <= SEGMENT, "parts overflow the segment");
        engine.pool().write(base + at, part);
        offsets.push(at);
        at += part.len();
    }
    engine.pool().persist(base, at);
    (seg, offsets)
}

/// The split entry (2 blocks at MTU 2048), three single-block entries to put
/// between its blocks, and what each should read back as.
struct Fixture {
    split: Vec<Vec<u8>>,
    split_value: Vec<u8>,
    singles: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
}

fn fixture() -> Fixture {
    let split_value = value(3000, 1);
    let split = blocks(&encoded(Kind::Put, SHARD, 7, b"split", &split_value, MTU));
    assert_eq!(split.len(), 2);
    let singles = (0..3u8)
        .map(|i| {
            let key = format!("single-{i}").into_bytes();
            let v = value(100, i);
            let bytes = encoded(Kind::Put, SHARD, 10 + i as u64, &key, &v, MTU);
            (key, v, bytes)
        })
        .collect();
    Fixture {
        split,
        split_value,
        singles,
    }
}

fn assert_all_readable(engine: &Engine, f: &Fixture, what: &str) {
    let got = engine.get(ShardId(SHARD), b"split").unwrap();
    assert_eq!(
        got,
        Some((f.split_value.clone(), Version(7))),
        "{what}: the split entry"
    );
    for (key, v, _) in &f.singles {
        let got = engine.get(ShardId(SHARD), key).unwrap().map(|(v, _)| v);
        assert_eq!(
            got.as_ref(),
            Some(v),
            "{what}: {:?}",
            String::from_utf8_lossy(key)
        );
    }
}

/// Land `[split 0][single 0][bad][single 1][split 1][single 2]`, power off, recover:
/// recovery succeeds, reports the bad block at its offset, and keeps every entry.
fn recovery_skips(bad: Vec<u8>, why: &str) {
    let pool = pool(1 << 20);
    let f = fixture();
    let offsets = {
        let engine = Engine::create(pool.clone(), config()).unwrap();
        let parts = [
            f.split[0].clone(),
            f.singles[0].2.clone(),
            bad,
            f.singles[1].2.clone(),
            f.split[1].clone(),
            f.singles[2].2.clone(),
        ];
        land(&engine, &parts).1
    };
    let (engine, report) = match Engine::open(pool, config()) {
        Ok(x) => x,
        Err(e) => panic!("recovery failed on a {why} block: {e}"),
    };
    assert_eq!(report.skipped_blocks.len(), 1, "{report:?}");
    assert_eq!(report.skipped_blocks[0].1, offsets[2], "{report:?}");
    assert!(report.skipped_blocks[0].2.contains(why), "{report:?}");
    assert_eq!(report.incomplete_entries, 0, "{report:?}");
    assert_all_readable(&engine, &f, "after recovery");
}

#[test]
fn recovery_skips_a_duplicate_block_and_keeps_the_rest() {
    recovery_skips(fixture().split[0].clone(), "duplicate");
}

#[test]
fn recovery_skips_a_disagreeing_block_and_keeps_the_rest() {
    // Block 1 of another entry with the same shard and version but another length.
    let other = blocks(&encoded(
        Kind::Put,
        SHARD,
        7,
        b"split",
        &value(3500, 2),
        MTU,
    ));
    recovery_skips(other[1].clone(), "disagrees");
}

#[test]
fn digest_skips_a_duplicate_block_and_moves_on() {
    let engine = Arc::new(Engine::create(pool(1 << 20), config()).unwrap());
    let blog = BackupLog::<LoopbackNic>::passive(
        engine.clone(),
        BackupLogConfig {
            digest_count: 2,
            grace_ns: GRACE_NS,
            ..BackupLogConfig::default()
        },
    )
    .unwrap();
    let f = fixture();
    let commit = encoded(Kind::Commit, SHARD, 12, &[], &[], MTU);
    let (first, _) = land(
        &engine,
        &[
            f.split[0].clone(),
            f.singles[0].2.clone(),
            f.split[0].clone(),
            f.singles[1].2.clone(),
            f.split[1].clone(),
        ],
    );
    let (second, _) = land(&engine, &[f.singles[2].2.clone(), commit]);
    blog.enqueue_sealed(first, 0);
    blog.enqueue_sealed(second, 0);
    assert_eq!(blog.control_step(GRACE_NS).unwrap().segments_used, 2);
    for d in 0..2 {
        match blog.digest_step(d) {
            Ok(n) => assert_eq!(n, 2, "digest {d} parses both segments"),
            Err(e) => panic!("digest {d} stuck on a duplicate block: {e}"),
        }
        assert_eq!(blog.digest_step(d).unwrap(), 0, "digest {d} moved on");
    }
    assert_all_readable(&engine, &f, "after digest");
    assert_eq!(blog.try_commit(), 2, "both segments commit");
}

#[test]
fn recovery_drops_the_oldest_incomplete_entries_when_the_assembler_is_full() {
    // One more incomplete entry (block 0 of 2, the rest never landed) than the
    // assembler holds, then a whole entry whose blocks landed apart.
    let pool = pool(16 << 20);
    let f = fixture();
    let lone: Vec<Vec<u8>> = (0..=ASSEMBLER_PENDING_MAX as u64)
        .map(|v| {
            let bytes = encoded(Kind::Put, 2, 1 + v, b"torn", &value(3000, 3), MTU);
            blocks(&bytes).swap_remove(0)
        })
        .collect();
    {
        let engine = Engine::create(pool.clone(), config()).unwrap();
        for chunk in lone.chunks(SEGMENT / MTU) {
            land(&engine, chunk);
        }
        land(
            &engine,
            &[
                f.split[0].clone(),
                f.singles[0].2.clone(),
                f.split[1].clone(),
                f.singles[1].2.clone(),
                f.singles[2].2.clone(),
            ],
        );
    }
    let (engine, report) = match Engine::open(pool, config()) {
        Ok(x) => x,
        Err(e) => panic!("recovery failed on a full assembler: {e}"),
    };
    let full: Vec<_> = report
        .skipped_blocks
        .iter()
        .filter(|(_, _, why)| why.contains("assembler full"))
        .collect();
    // The last lone block and the split entry's first block each drop the oldest.
    assert_eq!(full.len(), 2, "{full:?}");
    assert!(full.iter().all(|f| f.2.contains("dropped 1 ")), "{full:?}");
    assert_eq!(report.incomplete_entries, ASSEMBLER_PENDING_MAX - 1);
    assert_all_readable(&engine, &f, "after recovery");
}

#[test]
fn the_assembler_drops_its_oldest_incomplete_entries_past_its_byte_bound() {
    // Entries of 4 blocks at the largest MTU; block 0 of each arrives, the rest
    // later. 1,100 such blocks are 72 MB: more than the assembler may hold.
    let mtu = entry::MTU_BYTES_MAX;
    let count = 1_100u64;
    let value = value(3 * (mtu - entry::HEADER_BYTES), 4);
    let all: Vec<Vec<Vec<u8>>> = (0..count)
        .map(|v| blocks(&encoded(Kind::Put, 0, 1 + v, b"big", &value, mtu)))
        .collect();
    let mut asm = Assembler::new();
    for e in &all {
        let (h, p) = entry::parse_block(&e[0]).unwrap();
        assert_eq!(asm.add(h, p), Ok(None));
    }
    let held = asm.pending() * (mtu - entry::HEADER_BYTES);
    assert!(
        asm.pending() < count as usize,
        "the assembler holds all {} incomplete entries ({held} B)",
        asm.pending()
    );
    // The newest entries are still held and complete; the oldest were dropped.
    let newest = all.last().unwrap();
    let mut done = None;
    for b in &newest[1..] {
        let (h, p) = entry::parse_block(b).unwrap();
        done = asm.add(h, p).unwrap();
    }
    assert_eq!(done.map(|e| e.value), Some(value.clone()));
    for b in &all[0][1..] {
        let (h, p) = entry::parse_block(b).unwrap();
        assert_eq!(asm.add(h, p), Ok(None), "the oldest entry was dropped");
    }
}
