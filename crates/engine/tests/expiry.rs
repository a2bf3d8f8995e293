//! Expiry times in the engine (log entry format version 3): a PUT may carry the
//! Unix time from which its key reads as absent. The time is in the entry, so it
//! survives a restart; reads check it on the engine's clock; the cleaner moves
//! an expired value as a tombstone of the same version, so the value's bytes are
//! reclaimed and no older value of the key comes back, not even after a restart.

use std::sync::Arc;

use rowankv_engine::entry::{self, Kind};
use rowankv_engine::{Engine, EngineConfig, Stored};
use rowankv_pmem::Pool;
use rowankv_types::{
    Clock, ManualClock, RequestId, RequestRecord, ShardId, MANUAL_CLOCK_UNIX_MS_ORIGIN,
};

#[allow(dead_code)] // each test file uses part of the helpers
mod common;
use common::POOL_BYTES;

const S0: ShardId = ShardId(0);
const S3: ShardId = ShardId(3);

fn config(clock: &Arc<ManualClock>) -> EngineConfig {
    EngineConfig {
        clock: clock.clone(),
        ..common::small_config()
    }
}

fn stored(e: &Engine, shard: ShardId, key: &[u8]) -> Option<(Vec<u8>, Stored)> {
    let mut value = Vec::new();
    e.get_stored_into(shard, key, &mut value)
        .unwrap()
        .map(|s| (value, s))
}

#[test]
fn a_value_reads_as_absent_once_its_time_has_passed_and_its_time_survives_a_restart() {
    let clock = ManualClock::new();
    let now = clock.unix_ms();
    assert_eq!(now, MANUAL_CLOCK_UNIX_MS_ORIGIN);
    let e = Engine::create(common::small_pool(false), config(&clock)).unwrap();
    let w = e
        .put_expiring(0, S0, b"session", b"token", None, now + 1_000)
        .unwrap();
    e.put(1, S0, b"forever", b"stays").unwrap();
    let (value, s) = stored(&e, S0, b"session").expect("live");
    assert_eq!(value, b"token");
    assert_eq!(
        s,
        Stored {
            version: w.version,
            expires_at_ms: Some(now + 1_000)
        }
    );
    assert_eq!(stored(&e, S0, b"forever").unwrap().1.expires_at_ms, None);

    // A restart before the time: the entry still carries it.
    let pool = e.pool().clone();
    drop(e);
    let (e, _) = Engine::open(pool, config(&clock)).unwrap();
    assert_eq!(
        stored(&e, S0, b"session").unwrap().1.expires_at_ms,
        Some(now + 1_000)
    );

    // Live through its expiry instant, as in Redis; absent one ms later.
    clock.advance_ns(1_000 * 1_000_000);
    assert!(e.get(S0, b"session").unwrap().is_some(), "at its instant");
    clock.advance_ns(1_000_000);
    assert_eq!(e.get(S0, b"session").unwrap(), None, "past its instant");
    assert_eq!(stored(&e, S0, b"session"), None);
    assert_eq!(e.get(S0, b"forever").unwrap().unwrap().0, b"stays");

    // A newer write of the key is a new value with its own (no) expiry, and
    // replaces the expired entry in the index (which finds the key behind the
    // expiry time in block 0): one entry per key.
    e.put(0, S0, b"session", b"renewed").unwrap();
    assert_eq!(e.get(S0, b"session").unwrap().unwrap().0, b"renewed");
    // With request records too (the server's writes carry them): the key then
    // starts 22 bytes into block 0's payload.
    let record = |seq| RequestRecord {
        id: RequestId { client: 7, seq },
        first_incomplete: seq,
    };
    e.put_expiring(1, S0, b"forever", b"not any more", Some(record(1)), now)
        .unwrap();
    e.put_expiring(1, S0, b"forever", b"twice", Some(record(2)), now + 5_000)
        .unwrap();
    assert_eq!(e.indexed(S0).unwrap(), 2, "one index entry per key");
    assert_eq!(e.get(S0, b"forever").unwrap().unwrap().0, b"twice");
    // SCAN lists a key while it lives, as Redis.
    let scan = |e: &Engine| {
        let mut keys = Vec::new();
        let next = e
            .scan_keys(S0, 0, 100, usize::MAX, |k| keys.push(k.to_vec()))
            .unwrap();
        assert_eq!(next, 0);
        keys.sort();
        keys
    };
    assert_eq!(scan(&e), vec![b"forever".to_vec(), b"session".to_vec()]);
    clock.advance_ns(5_001 * 1_000_000);
    assert_eq!(scan(&e), vec![b"session".to_vec()]);
}

#[test]
fn the_cleaner_reclaims_an_expired_value_and_no_older_value_comes_back() {
    let clock = ManualClock::new();
    let now = clock.unix_ms();
    let e = Engine::create(common::small_pool(false), config(&clock)).unwrap();
    // An older value without expiry, then a newer one with it: once the newer
    // one expires the key is absent, never the older value.
    let old = e.put(0, S0, b"k", &[1; 3000]).unwrap();
    let new = e
        .put_expiring(0, S0, b"k", &[2; 3000], None, now + 10)
        .unwrap();
    assert!(new.version > old.version);
    clock.advance_ns(11 * 1_000_000);
    assert_eq!(e.get(S0, b"k").unwrap(), None);

    // Churn another shard and clean until every segment has been cleaned.
    let mut expired = 0;
    let mut moved = 0;
    for i in 0..3 * POOL_BYTES / 256 {
        let key = format!("churn-{}", i % 4);
        e.put(0, S3, key.as_bytes(), &[i as u8; 200]).unwrap();
        let r = e.clean().unwrap();
        expired += r.entries_expired;
        moved += r.entries_moved;
    }
    assert_eq!(expired, 1, "the expired value moved once, as a tombstone");
    assert!(moved >= 1);
    assert_eq!(e.get(S0, b"k").unwrap(), None);
    // What is indexed now is a tombstone of the expired value's version: a
    // Del entry, its value's 3000 bytes gone.
    let mut found = Vec::new();
    e.for_each_indexed_entry(S0, |bytes| {
        let parsed = entry::parse_entry(bytes).unwrap();
        found.push((parsed.kind, parsed.version, parsed.value.len()));
    })
    .unwrap();
    assert_eq!(found, vec![(Kind::Del, new.version, 0)]);

    // After a restart the key is still absent, whatever segments the old value
    // was left in.
    let pool: Arc<Pool> = e.pool().clone();
    drop(e);
    let (e, _) = Engine::open(pool, config(&clock)).unwrap();
    assert_eq!(e.get(S0, b"k").unwrap(), None);
    assert_eq!(e.highest_version(S0).unwrap(), new.version.0);
}

#[test]
fn an_expired_value_is_not_reclaimed_before_its_time() {
    // The cleaner moves a live value with an expiry time still ahead whole,
    // with its time.
    let clock = ManualClock::new();
    let now = clock.unix_ms();
    let e = Engine::create(common::small_pool(false), config(&clock)).unwrap();
    e.put_expiring(0, S0, b"later", &[9; 1000], None, now + 60_000)
        .unwrap();
    let mut expired = 0;
    for i in 0..3 * POOL_BYTES / 256 {
        let key = format!("churn-{}", i % 4);
        e.put(0, S3, key.as_bytes(), &[i as u8; 200]).unwrap();
        expired += e.clean().unwrap().entries_expired;
    }
    assert_eq!(expired, 0);
    let (value, s) = stored(&e, S0, b"later").expect("still live");
    assert_eq!(value, vec![9; 1000]);
    assert_eq!(s.expires_at_ms, Some(now + 60_000));
}
