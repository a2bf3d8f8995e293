//! Exactly-once retries in the engine: log entries carry request records (format
//! version 2), and each shard's request table answers `Done(version)`, `Stale` or
//! `Unknown` for a request id. The table is rebuilt wherever entries are indexed —
//! recovery, digest on a backup, `install_entries` — is bounded (least recently
//! active client evicted, a window of seqs per client), and forgets exactly what
//! `docs/engine.md` says. Pools of format 1 entries still open, and malformed
//! records are refused.

use std::sync::Arc;

use rowankv_engine::entry::{self, EntryError, Kind};
use rowankv_engine::{
    BackupLog, BackupLogConfig, Engine, EngineConfig, EngineError, RequestOutcome, RequestStats,
    REQUEST_CLIENTS_MAX, REQUEST_WINDOW,
};
use rowankv_pmem::Pool;
use rowankv_types::{RequestId, RequestRecord, ShardId, Version};

use RequestOutcome::{Done, Stale, Unknown};

#[allow(dead_code)] // each test file uses part of the helpers
mod common;
use common::{small_config as config, MTU, POOL_BYTES};

const S0: ShardId = ShardId(0);
const S1: ShardId = ShardId(1);

fn pool() -> Arc<Pool> {
    common::small_pool(false)
}

fn rec(client: u64, seq: u64, first_incomplete: u64) -> RequestRecord {
    RequestRecord {
        id: RequestId { client, seq },
        first_incomplete,
    }
}

fn id(client: u64, seq: u64) -> RequestId {
    RequestId { client, seq }
}

fn outcome(e: &Engine, shard: ShardId, client: u64, seq: u64) -> RequestOutcome {
    e.request_outcome(shard, id(client, seq)).unwrap()
}

/// One entry, with a record or without, at `mtu`.
fn enc(
    kind: Kind,
    shard: ShardId,
    version: u64,
    key: &[u8],
    value: &[u8],
    request: Option<RequestRecord>,
    mtu: usize,
) -> Vec<u8> {
    let mut out = Vec::new();
    match request {
        Some(r) => {
            entry::encode_with_request(&mut out, kind, shard, Version(version), key, value, r, mtu)
        }
        None => entry::encode(&mut out, kind, shard, Version(version), key, value, mtu),
    }
    .unwrap();
    out
}

/// `bytes` (one encoded entry) with block 0's request record rewritten and the
/// block's checksum recomputed: a forgery only the record check refuses.
fn forge_record(bytes: &[u8], client: u64, gap: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let (h, _) = entry::parse_block(&b).unwrap();
    let at = entry::HEADER_BYTES;
    b[at..at + 8].copy_from_slice(&client.to_le_bytes());
    b[at + 13] = gap;
    let covered = entry::HEADER_BYTES + h.payload_len as usize;
    b[4..8].fill(0);
    let crc = crc32c::crc32c(&b[..covered]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Format version 1 as `docs/format/log-entry.md` describes it, written without
/// the engine's encoder (what a pool from before version 2 holds).
fn v1_bytes(kind: Kind, shard: ShardId, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let capacity = MTU - entry::HEADER_BYTES;
    let stream: Vec<u8> = key.iter().chain(value).copied().collect();
    let chunks: Vec<&[u8]> = if stream.is_empty() {
        vec![&[][..]]
    } else {
        stream.chunks(capacity).collect()
    };
    let mut out = Vec::new();
    for (seq, chunk) in chunks.iter().enumerate() {
        let mut b = vec![kind as u8, 1];
        b.extend_from_slice(&shard.0.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&version.to_le_bytes()[..6]);
        b.extend_from_slice(&[seq as u8, chunks.len() as u8]);
        b.extend_from_slice(&(key.len() as u16).to_le_bytes());
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(&(chunk.len() as u16).to_le_bytes());
        b.extend_from_slice(chunk);
        let crc = crc32c::crc32c(&b);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b.resize(b.len().div_ceil(64) * 64, 0);
        out.extend_from_slice(&b);
    }
    out
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

fn passive_blog(engine: &Arc<Engine>) -> BackupLog<rowankv_fabric::LoopbackNic> {
    BackupLog::passive(engine.clone(), BackupLogConfig::default()).unwrap()
}

#[test]
fn outcomes_are_done_for_executed_writes_stale_below_the_floor_and_unknown_otherwise() {
    let e = Engine::create(pool(), config()).unwrap();
    let w1 = e
        .put_with_request(0, S0, b"a", b"one", rec(7, 1, 1))
        .unwrap();
    let w2 = e
        .put_with_request(1, S0, b"b", b"two", rec(7, 2, 1))
        .unwrap();
    let w3 = e.delete_with_request(0, S0, b"a", rec(7, 3, 1)).unwrap();
    assert_eq!(outcome(&e, S0, 7, 1), Done(w1.version));
    assert_eq!(outcome(&e, S0, 7, 2), Done(w2.version));
    assert_eq!(outcome(&e, S0, 7, 3), Done(w3.version));
    assert_eq!(outcome(&e, S0, 7, 4), Unknown, "not executed yet");
    assert_eq!(outcome(&e, S0, 8, 1), Unknown, "another client");
    assert_eq!(
        outcome(&e, S1, 7, 1),
        Unknown,
        "each shard has its own table"
    );
    assert_eq!(e.get(S0, b"a").unwrap(), None);
    assert_eq!(
        e.get(S0, b"b").unwrap(),
        Some((b"two".to_vec(), w2.version))
    );

    // The client has had the answers of 1 and 2: they are stale from now on, and
    // their outcomes are dropped.
    let w5 = e
        .put_with_request(0, S0, b"c", b"five", rec(7, 5, 3))
        .unwrap();
    assert_eq!(outcome(&e, S0, 7, 1), Stale);
    assert_eq!(outcome(&e, S0, 7, 2), Stale);
    assert_eq!(outcome(&e, S0, 7, 3), Done(w3.version));
    assert_eq!(
        outcome(&e, S0, 7, 4),
        Unknown,
        "in flight or lost: not stale"
    );
    assert_eq!(outcome(&e, S0, 7, 5), Done(w5.version));
    assert_eq!(
        e.request_stats(S0).unwrap(),
        RequestStats {
            clients: 1,
            outcomes: 2,
            clients_evicted: 0,
            outcomes_evicted: 0,
            executed_twice: 0,
        }
    );
    // A record arriving late with a lower floor does not lower it.
    let late = e
        .put_with_request(1, S0, b"d", b"late", rec(7, 4, 2))
        .unwrap();
    assert_eq!(outcome(&e, S0, 7, 4), Done(late.version));
    assert_eq!(outcome(&e, S0, 7, 2), Stale);
    // Plain writes leave the table alone.
    e.put(0, S0, b"a", b"plain").unwrap();
    assert_eq!(e.request_stats(S0).unwrap().outcomes, 3);
    assert!(matches!(
        e.request_outcome(ShardId(9), id(7, 1)),
        Err(EngineError::NoSuchShard(_))
    ));
}

#[test]
fn a_write_that_loses_to_a_newer_version_is_still_done() {
    let e = Engine::create(pool(), config()).unwrap();
    // Two replicated writes of one key whose ACKs come back out of order: the
    // newer is published first, and the older, published after, loses. A retry
    // of the older must still not execute again.
    let v = e.next_version(S0).unwrap();
    let w = enc(Kind::Put, S0, v.0, b"k", b"old", Some(rec(3, 1, 1)), MTU);
    let x = enc(Kind::Put, S0, v.0 + 1, b"k", b"new", None, MTU);
    let addr = e.append_encoded(0, &w).unwrap();
    let addr_x = e.append_encoded(1, &x).unwrap();
    assert_eq!(
        outcome(&e, S0, 3, 1),
        Unknown,
        "appended, not yet published"
    );
    assert!(e
        .publish(S0, b"k", addr_x, Version(v.0 + 1), x.len())
        .unwrap());
    assert!(!e
        .publish_with_request(S0, b"k", addr, v, w.len(), Some(rec(3, 1, 1)))
        .unwrap());
    assert_eq!(outcome(&e, S0, 3, 1), Done(v));
    assert_eq!(
        e.get(S0, b"k").unwrap(),
        Some((b"new".to_vec(), Version(v.0 + 1)))
    );
    // A published write that wins is recorded the same way.
    let v2 = e.next_version(S0).unwrap();
    let w2 = enc(
        Kind::Put,
        S0,
        v2.0,
        b"k",
        b"newest",
        Some(rec(3, 2, 2)),
        MTU,
    );
    let addr2 = e.append_encoded(1, &w2).unwrap();
    assert!(e
        .publish_with_request(S0, b"k", addr2, v2, w2.len(), Some(rec(3, 2, 2)))
        .unwrap());
    assert_eq!(outcome(&e, S0, 3, 2), Done(v2));
    assert_eq!(outcome(&e, S0, 3, 1), Stale);
    assert_eq!(e.get(S0, b"k").unwrap(), Some((b"newest".to_vec(), v2)));
}

#[test]
fn the_table_survives_a_restart() {
    let pool = pool();
    let e = Engine::create(pool.clone(), config()).unwrap();
    let big = pattern(5000, 1); // three blocks at this MTU
    let a1 = e
        .put_with_request(0, S0, b"k", &big, rec(11, 1, 1))
        .unwrap();
    let a2 = e
        .put_with_request(1, S0, b"k", b"x", rec(11, 2, 1))
        .unwrap();
    let b1 = e
        .delete_with_request(0, S1, b"gone", rec(12, 40, 38))
        .unwrap();
    let v = e.next_version(S0).unwrap();
    let w = enc(
        Kind::Put,
        S0,
        v.0,
        b"p",
        b"published",
        Some(rec(13, 9, 9)),
        MTU,
    );
    let addr = e.append_encoded(0, &w).unwrap();
    e.publish_with_request(S0, b"p", addr, v, w.len(), Some(rec(13, 9, 9)))
        .unwrap();
    let before: Vec<RequestOutcome> = [(S0, 11, 1), (S0, 11, 2), (S1, 12, 40), (S1, 12, 37)]
        .iter()
        .map(|&(s, c, q)| outcome(&e, s, c, q))
        .collect();
    assert_eq!(
        before,
        [Done(a1.version), Done(a2.version), Done(b1.version), Stale]
    );
    drop(e);

    let (e, report) = Engine::open(pool, config()).unwrap();
    assert!(report.skipped_blocks.is_empty(), "{report:?}");
    assert_eq!(outcome(&e, S0, 11, 1), Done(a1.version), "superseded, kept");
    assert_eq!(outcome(&e, S0, 11, 2), Done(a2.version));
    assert_eq!(outcome(&e, S1, 12, 40), Done(b1.version));
    assert_eq!(outcome(&e, S1, 12, 37), Stale, "the floor is recovered too");
    assert_eq!(outcome(&e, S0, 13, 9), Done(v));
    assert_eq!(outcome(&e, S0, 11, 3), Unknown);
    assert_eq!(e.get(S0, b"k").unwrap(), Some((b"x".to_vec(), a2.version)));
    assert_eq!(e.get(S0, b"p").unwrap(), Some((b"published".to_vec(), v)));
}

/// Overwrite keys of shard 3 and clean after every write until the pool's
/// segments have been reused several times over.
fn churn_and_clean(e: &Engine) {
    for i in 0..3 * POOL_BYTES / 256 {
        let key = format!("churn-{}", i % 4);
        e.put(0, ShardId(3), key.as_bytes(), &[i as u8; 200])
            .unwrap();
        e.clean().unwrap();
    }
}

#[test]
fn cleaning_keeps_the_records_a_retry_may_still_need() {
    let pool = pool();
    let e = Engine::create(pool.clone(), config()).unwrap();
    // Client 21: seq 1 is superseded, seq 2 (which acknowledges seq 1) stays live.
    let a1 = e
        .put_with_request(0, S0, b"a", b"one", rec(21, 1, 1))
        .unwrap();
    e.put(0, S0, b"a", b"overwritten").unwrap();
    let a2 = e
        .put_with_request(0, S0, b"live", b"two", rec(21, 2, 2))
        .unwrap();
    // Client 22: its only write is superseded.
    let b1 = e
        .put_with_request(0, S0, b"b", b"one", rec(22, 1, 1))
        .unwrap();
    let b_new = e.put(0, S0, b"b", b"overwritten").unwrap();
    churn_and_clean(&e);
    // The segment they were in was cleaned and reused: their bytes are gone.
    for addr in [a1.addr, a2.addr, b1.addr] {
        let mut b = vec![0u8; 256];
        e.pool().read(addr as usize, &mut b);
        let there = entry::parse_entry(&b).ok().map(|x| x.key.to_vec());
        assert!(
            !matches!(there.as_deref(), Some(b"a" | b"live" | b"b")),
            "the segment at {addr} was not reused"
        );
    }
    // In memory nothing is forgotten.
    assert_eq!(outcome(&e, S0, 21, 2), Done(a2.version));
    assert_eq!(outcome(&e, S0, 22, 1), Done(b1.version));
    drop(e);

    let (e, _) = Engine::open(pool, config()).unwrap();
    // The live entry was copied with its record.
    assert_eq!(outcome(&e, S0, 21, 2), Done(a2.version));
    assert_eq!(
        e.get(S0, b"live").unwrap(),
        Some((b"two".to_vec(), a2.version))
    );
    // Seq 1's entry is gone, but seq 2's floor still covers it.
    assert_eq!(outcome(&e, S0, 21, 1), Stale);
    // A superseded entry whose outcome the table still held was kept for its
    // record through cleaning, so a retry after the restart is not executed
    // again (the simulator's seed 279 of `share` did so before).
    assert_eq!(outcome(&e, S0, 22, 1), Done(b1.version));
    assert_eq!(
        e.get(S0, b"b").unwrap(),
        Some((b"overwritten".to_vec(), b_new.version))
    );
}

/// The entries in `e`'s pool that carry request `id`'s record, in segments
/// not free (what a restart would read).
fn copies_of(e: &Engine, id: RequestId) -> usize {
    let mut found = 0;
    for_each_entry(e, |x| {
        found += usize::from(x.request.is_some_and(|r| r.id == id))
    });
    found
}

/// An entry a backup received twice (a primary replicates again what it
/// could not confirm) is dead twice once superseded; the cleaner keeps one
/// copy for its record, not one per occurrence. Keeping both made each copy
/// the replacement of the other at every pass, with the replaced one counted
/// live for good.
#[test]
fn cleaning_keeps_one_copy_of_a_record_seen_twice() {
    let e = Arc::new(Engine::create(pool(), config()).unwrap());
    let blog = passive_blog(&e);
    let r = rec(51, 1, 1);
    let first = enc(Kind::Put, S0, 1, b"twice", b"one", Some(r), MTU);
    let newer = enc(Kind::Put, S0, 2, b"twice", b"newer", None, MTU);
    received_twice(&e, &blog, &first, Some(&newer));
    assert_eq!(outcome(&e, S0, 51, 1), Done(Version(1)));
    assert_eq!(copies_of(&e, r.id), 2, "received twice");
    let mut dropped = 0;
    for i in 0..3 * POOL_BYTES / 256 {
        let key = format!("churn-{}", i % 4);
        e.put(0, ShardId(3), key.as_bytes(), &[i as u8; 200])
            .unwrap();
        dropped += e.clean().unwrap().records_dropped;
    }
    assert_eq!(copies_of(&e, r.id), 1, "copies of one record kept");
    assert_eq!(dropped, 1);
    assert_eq!(outcome(&e, S0, 51, 1), Done(Version(1)));
    let pool = e.pool().clone();
    drop(blog);
    drop(e);
    let (e, _) = Engine::open_replica(pool, config()).unwrap();
    assert_eq!(outcome(&e, S0, 51, 1), Done(Version(1)), "after a restart");
}

/// `entry` (of shard 0, version 1) received by a backup twice, once in each
/// per-thread b-log, then `then` (of shard 0, version 2) if given; each segment
/// filled (with writes of one key of shard 1, each superseding the last),
/// digested and committed, so that the cleaner may clean both.
fn received_twice(
    e: &Engine,
    blog: &BackupLog<rowankv_fabric::LoopbackNic>,
    entry: &[u8],
    then: Option<&[u8]>,
) {
    let mut version = 10;
    let mut filled = Vec::new();
    for worker in 0..2 {
        e.append_backup(worker, entry).unwrap();
        loop {
            let filler = enc(Kind::Put, S1, version, b"fill", &[7; 1000], None, MTU);
            version += 1;
            if let Some(seg) = e.append_backup(worker, &filler).unwrap() {
                filled.push(seg);
                break;
            }
        }
    }
    if let Some(then) = then {
        e.append_backup(0, then).unwrap();
    }
    let s0 = if then.is_some() { 2 } else { 1 };
    for (shard, v) in [(S0, s0), (S1, version - 1)] {
        e.append_backup(0, &enc(Kind::Commit, shard, v, b"", b"", None, MTU))
            .unwrap();
    }
    for &seg in &filled {
        blog.enqueue_used(seg);
    }
    for seg in e.backup_log_heads() {
        blog.digest_now(seg).unwrap();
    }
    for d in 0..BackupLogConfig::default().digest_count {
        blog.digest_step(d).unwrap();
    }
    assert_eq!(blog.try_commit(), 2, "the filled segments commit");
}

/// An entry received twice whose version is the key's latest: one copy is
/// indexed, the other is dead, and the cleaner keeps the dead one whole (its
/// record with its value). Kept as a value-less Del, it would tie with the live
/// Put at a restart, and the key would read as deleted (the simulator found
/// this, seeds 82 and 208, in a first version of the value-less copies).
#[test]
fn a_dead_copy_of_the_latest_version_keeps_its_value_through_a_restart() {
    let e = Arc::new(Engine::create(pool(), config()).unwrap());
    let blog = passive_blog(&e);
    let r = rec(52, 1, 1);
    let latest = enc(Kind::Put, S0, 1, b"latest", &[5; 900], Some(r), MTU);
    received_twice(&e, &blog, &latest, None);
    churn_and_clean(&e);
    assert_eq!(e.get(S0, b"latest").unwrap().unwrap().0, vec![5; 900]);
    // Every copy carrying the record is the Put, whole: none a Del of its
    // version, whichever a restart would install first.
    let mut copies = Vec::new();
    for_each_entry(&e, |x| {
        if x.request.is_some_and(|k| k.id == r.id) {
            copies.push((x.kind, x.value.len()));
        }
    });
    assert!(!copies.is_empty());
    assert!(
        copies.iter().all(|&c| c == (Kind::Put, 900)),
        "copies of the latest version: {copies:?}"
    );
    let pool = e.pool().clone();
    drop(blog);
    drop(e);
    let (e, _) = Engine::open_replica(pool, config()).unwrap();
    assert_eq!(
        e.get(S0, b"latest").unwrap(),
        Some((vec![5; 900], Version(1))),
        "after a restart"
    );
    assert_eq!(outcome(&e, S0, 52, 1), Done(Version(1)));
}

/// A dead entry kept for its request record, where a newer version of its key
/// is indexed, is kept as a value-less Del of its version: the record costs a
/// block, not the value's kilobytes, and the newer value still wins after a
/// restart.
#[test]
fn a_record_kept_for_a_superseded_value_does_not_keep_the_value() {
    let e = Engine::create(pool(), config()).unwrap();
    let r = rec(53, 1, 1);
    e.put_with_request(0, ShardId(3), b"big", &[9; 3000], r)
        .unwrap();
    let newer = e.put(0, ShardId(3), b"big", b"small now").unwrap();
    churn_and_clean(&e);
    assert_eq!(outcome(&e, ShardId(3), 53, 1), Done(Version(1)));
    let mut kept = Vec::new();
    for_each_entry(&e, |x| {
        if x.request.is_some_and(|k| k.id == r.id) {
            kept.push((x.kind, x.version, x.value.len()));
        }
    });
    assert_eq!(
        kept,
        vec![(Kind::Del, Version(1), 0)],
        "the record alone is kept"
    );
    let pool = e.pool().clone();
    drop(e);
    let (e, _) = Engine::open(pool, config()).unwrap();
    assert_eq!(
        e.get(ShardId(3), b"big").unwrap(),
        Some((b"small now".to_vec(), newer.version))
    );
    assert_eq!(outcome(&e, ShardId(3), 53, 1), Done(Version(1)));
}

/// Every whole entry in the engine's used segments, by `f`.
fn for_each_entry(e: &Engine, mut f: impl FnMut(&entry::Entry<'_>)) {
    use rowankv_engine::segment::{Owner, SegmentState};
    let owners = [Owner::Worker, Owner::Control, Owner::Cleaner, Owner::Backup];
    let states = [
        SegmentState::Using,
        SegmentState::Used,
        SegmentState::Committed,
    ];
    let size = e.config().segment_size_bytes;
    for seg in e.segments_in(&owners, &states) {
        let mut bytes = vec![0u8; size];
        e.pool().read(e.layout().segment_offset(seg), &mut bytes);
        let mut at = 0;
        while at < size {
            let header = match entry::parse_block(&bytes[at..]) {
                Ok((h, _)) => h,
                Err(EntryError::End) => break,
                Err(_) => {
                    at += entry::STRIDE_BYTES;
                    continue;
                }
            };
            if let Ok(x) = entry::parse_entry(&bytes[at..]) {
                f(&x);
            }
            at += header.padded_len();
        }
    }
}

#[test]
fn a_backup_rebuilds_the_table_by_digest() {
    let e = Arc::new(Engine::create(pool(), config()).unwrap());
    let blog = passive_blog(&e);
    let r1 = rec(31, 1, 1);
    let r2 = rec(31, 2, 1);
    let r3 = rec(32, 5, 5);
    let first = enc(Kind::Put, S0, 1, b"k", b"first", Some(r1), MTU);
    let second = enc(Kind::Put, S0, 2, b"k", b"second", Some(r2), MTU);
    // A three-block entry whose blocks land apart, with another entry between.
    let split = enc(Kind::Put, S1, 3, b"big", &pattern(5000, 3), Some(r3), MTU);
    let blocks: Vec<&[u8]> = {
        let mut out = Vec::new();
        let mut at = 0;
        while at < split.len() {
            let (h, _) = entry::parse_block(&split[at..]).unwrap();
            out.push(&split[at..at + h.padded_len()]);
            at += h.padded_len();
        }
        out
    };
    assert_eq!(blocks.len(), 3);
    // Out of order: the newer write first; the blocks of `split` apart.
    e.append_backup(0, &[blocks[2], blocks[1]].concat())
        .unwrap();
    e.append_backup(0, &second).unwrap();
    e.append_backup(0, blocks[0]).unwrap();
    e.append_backup(1, &first).unwrap();
    assert_eq!(outcome(&e, S0, 31, 1), Unknown, "not digested yet");
    for seg in e.backup_log_heads() {
        assert_eq!(blog.digest_now(seg).unwrap(), 0);
    }
    assert_eq!(outcome(&e, S0, 31, 1), Done(Version(1)), "lost to v2, kept");
    assert_eq!(outcome(&e, S0, 31, 2), Done(Version(2)));
    assert_eq!(outcome(&e, S1, 32, 5), Done(Version(3)), "assembled");
    assert_eq!(outcome(&e, S1, 32, 4), Stale);
    assert_eq!(
        e.get(S0, b"k").unwrap(),
        Some((b"second".to_vec(), Version(2)))
    );
    assert_eq!(
        e.get(S1, b"big").unwrap(),
        Some((pattern(5000, 3), Version(3)))
    );

    // The backup restarts: recovery reads the b-log and the assembled copy.
    let pool = e.pool().clone();
    drop(blog);
    drop(e);
    let (e, report) = Engine::open_replica(pool, config()).unwrap();
    assert_eq!(report.incomplete_entries, 0);
    assert_eq!(outcome(&e, S0, 31, 1), Done(Version(1)));
    assert_eq!(outcome(&e, S0, 31, 2), Done(Version(2)));
    assert_eq!(outcome(&e, S1, 32, 5), Done(Version(3)));
}

#[test]
fn install_entries_rebuilds_the_table_for_a_promotion_and_a_copy() {
    // A backup holds a primary's entries in its b-log; a new primary gathers them.
    let backup = Engine::create(pool(), config()).unwrap();
    let r1 = rec(41, 1, 1);
    let r2 = rec(41, 2, 1);
    let r3 = rec(42, 7, 6);
    let first = enc(Kind::Put, S0, 1, b"k", b"first", Some(r1), MTU);
    let second = enc(Kind::Del, S0, 2, b"k", b"", Some(r2), MTU);
    let big = enc(Kind::Put, S0, 3, b"big", &pattern(3000, 4), Some(r3), MTU);
    let plain = enc(Kind::Put, S0, 4, b"plain", b"no record", None, MTU);
    backup
        .append_backup(
            0,
            &[first.clone(), second.clone(), big.clone(), plain].concat(),
        )
        .unwrap();
    let gathered = backup.uncommitted_entries(S0, &[]).unwrap();
    assert_eq!(gathered.len(), 4);
    let requests: Vec<Option<RequestRecord>> = gathered
        .iter()
        .map(|b| entry::parse_entry(b).unwrap().request)
        .collect();
    assert_eq!(requests, [Some(r1), Some(r2), Some(r3), None], "kept");

    // The promoted primary: the newer entry of `k` first, so the older one is
    // skipped as `already` — and still recorded.
    let promoted = Engine::create(pool(), config()).unwrap();
    let r = promoted
        .install_entries(0, &[gathered[1].clone(), gathered[2].clone()].concat())
        .unwrap();
    assert_eq!(r.installed, 2);
    let r = promoted
        .install_entries(1, &[gathered[0].clone(), gathered[3].clone()].concat())
        .unwrap();
    assert_eq!((r.installed, r.already), (1, 1));
    assert_eq!(outcome(&promoted, S0, 41, 1), Done(Version(1)));
    assert_eq!(outcome(&promoted, S0, 41, 2), Done(Version(2)));
    assert_eq!(outcome(&promoted, S0, 42, 7), Done(Version(3)));
    assert_eq!(outcome(&promoted, S0, 42, 5), Stale);
    assert_eq!(promoted.get(S0, b"k").unwrap(), None);

    // A new backup at another MTU gets a copy of the shard (re-encoded: the
    // 3000 B value is one block at 4096, two at 2048): records are kept.
    let mut copied = Vec::new();
    promoted
        .for_each_indexed_entry(S0, |b| copied.extend_from_slice(b))
        .unwrap();
    let wide = EngineConfig {
        mtu_bytes: 4096,
        ..config()
    };
    let new_backup = Engine::create(pool(), wide.clone()).unwrap();
    assert_eq!(new_backup.install_entries(0, &copied).unwrap().installed, 3);
    assert_eq!(outcome(&new_backup, S0, 41, 2), Done(Version(2)));
    assert_eq!(outcome(&new_backup, S0, 42, 7), Done(Version(3)));
    // Only indexed entries are copied: the superseded seq 1 is not known there,
    // but seq 2's floor (1) does not cover it — the documented window.
    assert_eq!(outcome(&new_backup, S0, 41, 1), Unknown);
    assert_eq!(
        new_backup.get(S0, b"big").unwrap(),
        Some((pattern(3000, 4), Version(3)))
    );
    // And it survives that backup's restart.
    let pool = new_backup.pool().clone();
    drop(new_backup);
    let (again, _) = Engine::open_replica(pool, wide).unwrap();
    assert_eq!(outcome(&again, S0, 42, 7), Done(Version(3)));
}

#[test]
fn a_full_table_evicts_the_least_recently_active_client() {
    let e = Engine::create(pool(), config()).unwrap();
    let mut versions = Vec::new();
    for client in 1..=REQUEST_CLIENTS_MAX as u64 {
        let w = e
            .put_with_request(0, S0, b"k", b"v", rec(client, 1, 1))
            .unwrap();
        versions.push(w.version);
    }
    // Client 1 is active again: client 2 is now the least recently active.
    let again = e.put_with_request(0, S0, b"k", b"v", rec(1, 2, 1)).unwrap();
    let stats = e.request_stats(S0).unwrap();
    assert_eq!(
        (stats.clients, stats.clients_evicted),
        (REQUEST_CLIENTS_MAX, 0)
    );
    let newcomer = REQUEST_CLIENTS_MAX as u64 + 1;
    let w = e
        .put_with_request(0, S0, b"k", b"v", rec(newcomer, 1, 1))
        .unwrap();
    let stats = e.request_stats(S0).unwrap();
    assert_eq!(
        (stats.clients, stats.clients_evicted),
        (REQUEST_CLIENTS_MAX, 1)
    );
    assert_eq!(stats.outcomes, REQUEST_CLIENTS_MAX + 1);
    assert_eq!(outcome(&e, S0, 2, 1), Unknown, "evicted: forgotten");
    assert_eq!(outcome(&e, S0, 1, 1), Done(versions[0]));
    assert_eq!(outcome(&e, S0, 1, 2), Done(again.version));
    assert_eq!(outcome(&e, S0, 3, 1), Done(versions[2]));
    assert_eq!(outcome(&e, S0, newcomer, 1), Done(w.version));
    // Another shard's table is not affected.
    assert_eq!(e.request_stats(S1).unwrap(), RequestStats::default());
}

#[test]
fn a_client_keeps_a_window_of_outcomes() {
    let pool = pool();
    let e = Engine::create(pool.clone(), config()).unwrap();
    // A client that never acknowledges: one more outcome than the window.
    let mut versions = Vec::new();
    for seq in 0..=REQUEST_WINDOW as u64 {
        let key = format!("k{}", seq % 5);
        let w = e
            .put_with_request(0, S1, key.as_bytes(), b"v", rec(5, seq, 0))
            .unwrap();
        versions.push(w.version);
    }
    let check = |e: &Engine| {
        assert_eq!(outcome(e, S1, 5, 0), Stale, "dropped by the window");
        for seq in 1..=REQUEST_WINDOW as u64 {
            assert_eq!(outcome(e, S1, 5, seq), Done(versions[seq as usize]));
        }
        let stats = e.request_stats(S1).unwrap();
        assert_eq!(
            (stats.outcomes, stats.outcomes_evicted),
            (REQUEST_WINDOW, 1)
        );
    };
    check(&e);
    drop(e);
    let (e, _) = Engine::open(pool, config()).unwrap();
    check(&e);
}

#[test]
fn an_old_pool_of_format_1_entries_still_opens() {
    let pool = pool();
    let e = Engine::create(pool.clone(), config()).unwrap();
    // A plain write is format 1 byte for byte.
    let w = e.put(0, S0, b"written", b"by put").unwrap();
    let expected = v1_bytes(Kind::Put, S0, w.version.0, b"written", b"by put");
    let mut on_media = vec![0u8; expected.len()];
    e.pool().read(w.addr as usize, &mut on_media);
    assert_eq!(on_media, expected);
    // Format 1 bytes written without today's encoder: a t-log entry (published),
    // a multi-block one, a tombstone in a per-thread b-log.
    let v = e.next_version(S0).unwrap();
    let t = v1_bytes(Kind::Put, S0, v.0, b"tlog", b"format one");
    let addr = e.append_encoded(1, &t).unwrap();
    assert!(e.publish(S0, b"tlog", addr, v, t.len()).unwrap());
    let big = v1_bytes(Kind::Put, S1, 50, b"big", &pattern(5000, 9));
    let tomb = v1_bytes(Kind::Del, S1, 51, b"tomb", b"");
    e.append_backup(0, &[big, tomb].concat()).unwrap();
    drop(e);

    let (e, report) = Engine::open(pool, config()).unwrap();
    assert!(report.skipped_blocks.is_empty(), "{report:?}");
    assert!(report.corrupt_segments.is_empty());
    assert_eq!(report.entries_indexed, 4);
    assert_eq!(
        e.get(S0, b"written").unwrap(),
        Some((b"by put".to_vec(), w.version))
    );
    assert_eq!(
        e.get(S0, b"tlog").unwrap(),
        Some((b"format one".to_vec(), v))
    );
    assert_eq!(
        e.get(S1, b"big").unwrap(),
        Some((pattern(5000, 9), Version(50)))
    );
    assert_eq!(e.get(S1, b"tomb").unwrap(), None);
    assert_eq!(e.indexed(S1).unwrap(), 2);
    for s in [S0, S1] {
        assert_eq!(e.request_stats(s).unwrap(), RequestStats::default());
    }
    // And takes format 2 entries beside them.
    let r = e
        .put_with_request(0, S0, b"tlog", b"two", rec(1, 1, 1))
        .unwrap();
    assert_eq!(outcome(&e, S0, 1, 1), Done(r.version));
    assert_eq!(
        e.get(S0, b"tlog").unwrap(),
        Some((b"two".to_vec(), r.version))
    );
}

#[test]
fn malformed_records_are_refused_everywhere() {
    let e = Engine::create(pool(), config()).unwrap();
    // The write path refuses them before anything is written.
    for bad in [rec(0, 1, 1), rec(9, 4, 5)] {
        let err = e.put_with_request(0, S0, b"k", b"v", bad).unwrap_err();
        assert!(
            matches!(err, EngineError::Entry(EntryError::BadRequest { .. })),
            "{err}"
        );
        assert!(matches!(
            e.delete_with_request(0, S0, b"k", bad),
            Err(EngineError::Entry(EntryError::BadRequest { .. }))
        ));
    }
    assert_eq!(e.get(S0, b"k").unwrap(), None);
    assert_eq!(e.indexed(S0).unwrap(), 0);
    // A Commit record carries no request.
    let mut out = Vec::new();
    assert!(matches!(
        entry::encode_with_request(
            &mut out,
            Kind::Commit,
            S0,
            Version(1),
            b"",
            b"",
            rec(1, 1, 1),
            MTU
        ),
        Err(EntryError::BadLength(_))
    ));

    // Forged on the wire or on media (checksum recomputed): install refuses the
    // whole batch, recovery skips the entry and keeps the others.
    let good = enc(Kind::Put, S0, 1, b"good", b"kept", Some(rec(1, 1, 1)), MTU);
    let forged = forge_record(
        &enc(Kind::Put, S0, 2, b"forged", b"x", Some(rec(1, 2, 2)), MTU),
        0,
        0,
    );
    assert_eq!(
        entry::parse_entry(&forged).unwrap_err(),
        EntryError::BadRequest {
            client: 0,
            seq: 2,
            first_incomplete: 2
        }
    );
    // A floor gap of 9 below seq 1: a floor below zero.
    let above = forge_record(&good, 1, 9);
    assert_eq!(
        entry::parse_block(&above).map(|_| ()),
        Err(EntryError::BadFloorGap { seq: 1, gap: 9 })
    );
    assert!(matches!(
        e.install_entries(0, &[good.clone(), forged.clone()].concat()),
        Err(EngineError::Entry(EntryError::BadRequest { .. }))
    ));
    assert_eq!(e.indexed(S0).unwrap(), 0, "nothing installed");

    e.append_backup(0, &[forged, good, above].concat()).unwrap();
    let pool = e.pool().clone();
    drop(e);
    let (e, report) = Engine::open(pool, config()).unwrap();
    assert_eq!(report.skipped_blocks.len(), 2, "{report:?}");
    assert!(report
        .skipped_blocks
        .iter()
        .all(|(_, _, why)| why.contains("bad request record")));
    assert_eq!(
        e.get(S0, b"good").unwrap(),
        Some((b"kept".to_vec(), Version(1)))
    );
    assert_eq!(e.get(S0, b"forged").unwrap(), None);
    assert_eq!(outcome(&e, S0, 1, 1), Done(Version(1)));
    assert_eq!(outcome(&e, S0, 0, 2), Unknown);
}
