//! A primary's replicated writes: an entry appended with `append_encoded` waits in
//! its t-log segment until `publish` (every backup has it) or `abandon` (it never
//! will be acknowledged). Its segment is committed, and so open to the cleaner, only
//! once every such entry in it is settled.

use std::sync::Arc;

use rowankv_engine::entry::{self, Kind};
use rowankv_engine::Engine;
use rowankv_pmem::Pool;
use rowankv_types::{ShardId, Version};

#[allow(dead_code)] // each test file uses part of the helpers
mod common;
use common::{small_config as config, MTU, POOL_BYTES};

fn pool() -> Arc<Pool> {
    common::small_pool(false)
}

fn encoded(shard: u16, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    entry::encode(
        &mut out,
        Kind::Put,
        ShardId(shard),
        Version(version),
        key,
        value,
        MTU,
    )
    .unwrap();
    out
}

/// Overwrite four keys of shard 1 through worker 0's t-log, cleaning after every
/// write, until the pool's segments have been reused `rounds` times over.
fn churn_and_clean(engine: &Engine, rounds: usize) {
    let per_round = POOL_BYTES / 256;
    for i in 0..rounds * per_round {
        let key = format!("churn-{}", i % 4);
        engine
            .put(0, ShardId(1), key.as_bytes(), &[i as u8; 200])
            .unwrap();
        engine.clean().unwrap();
    }
}

#[test]
fn an_entry_waiting_for_its_acks_survives_cleaning_and_reuse_of_its_segment() {
    let pool = pool();
    let engine = Engine::create(pool.clone(), config()).unwrap();
    let version = engine.next_version(ShardId(0)).unwrap();
    let w = encoded(0, version.0, b"waiting", b"the acknowledged value");
    let addr = engine.append_encoded(0, &w).unwrap();
    // The t-log rolls past W's segment and the cleaner runs while W's ACKs are out.
    churn_and_clean(&engine, 3);
    // Every backup has W now: the primary publishes it and acknowledges the write.
    assert!(engine
        .publish(ShardId(0), b"waiting", addr, version, w.len())
        .unwrap());
    let got = engine.get(ShardId(0), b"waiting").unwrap();
    assert_eq!(
        got,
        Some((b"the acknowledged value".to_vec(), version)),
        "the acknowledged write reads back"
    );
    // It stays readable through more cleaning and after a restart.
    churn_and_clean(&engine, 2);
    assert_eq!(
        engine.get(ShardId(0), b"waiting").unwrap().map(|(v, _)| v),
        Some(b"the acknowledged value".to_vec())
    );
    drop(engine);
    let (engine, _) = Engine::open(pool, config()).unwrap();
    assert_eq!(
        engine.get(ShardId(0), b"waiting").unwrap(),
        Some((b"the acknowledged value".to_vec(), version)),
        "the acknowledged write survives a restart"
    );
}

#[test]
fn an_abandoned_entry_does_not_pin_its_segment() {
    let engine = Engine::create(pool(), config()).unwrap();
    let free_at_start = engine.free_segments();
    let version = engine.next_version(ShardId(0)).unwrap();
    let w = encoded(0, version.0, b"failed", b"never acknowledged");
    let addr = engine.append_encoded(0, &w).unwrap();
    // W's replication failed: it is settled without being indexed.
    engine.abandon(addr);
    // Churning through the pool many times over does not run out of space: W's
    // segment was committed and cleaned like any other.
    churn_and_clean(&engine, 4);
    assert_eq!(engine.get(ShardId(0), b"failed").unwrap(), None);
    assert!(
        engine.free_segments() + 8 >= free_at_start,
        "segments are reclaimed: {} free of {free_at_start}",
        engine.free_segments()
    );
}

#[test]
fn a_segment_with_unsettled_entries_is_closed_by_recovery() {
    let pool = pool();
    let engine = Engine::create(pool.clone(), config()).unwrap();
    let version = engine.next_version(ShardId(0)).unwrap();
    let w = encoded(0, version.0, b"in-flight", b"on some replicas only");
    engine.append_encoded(0, &w).unwrap();
    churn_and_clean(&engine, 1);
    drop(engine);
    // A crash while W's ACKs were out: recovery indexes W (its outcome is unknown)
    // and reports its segment closed, so a cold start gathers it to every replica.
    let (engine, report) = Engine::open(pool, config()).unwrap();
    assert_eq!(
        engine
            .get(ShardId(0), b"in-flight")
            .unwrap()
            .map(|(v, _)| v),
        Some(b"on some replicas only".to_vec())
    );
    let entries = engine
        .uncommitted_entries(ShardId(0), &report.closed_segments)
        .unwrap();
    assert!(
        entries
            .iter()
            .any(|e| entry::parse_entry(e).is_ok_and(|p| p.key == b"in-flight")),
        "the closed segments hold the unsettled entry ({} closed)",
        report.closed_segments.len()
    );
}
