//! Failover and recovery support: gathering the entries that may not be on every
//! replica (`uncommitted_entries`), installing them elsewhere (`install_entries`),
//! copying a shard (`for_each_indexed_entry`), the highest version seen, and the
//! segments a restart closed (`RecoveryReport::closed_segments`).

use std::collections::BTreeMap;

use rowankv_engine::entry::{self, Kind};
use rowankv_engine::{Engine, EngineError, InstallReport};
use rowankv_pmem::{Pool, PoolOptions, PowerFailure};
use rowankv_types::{SegmentId, ShardId, Version};

#[allow(dead_code)] // each test file uses part of the helpers
mod common;
use common::{small_config as config, small_pool as pool, MTU, POOL_BYTES, SEGMENT};

fn engine() -> Engine {
    Engine::create(pool(false), config()).unwrap()
}

fn enc(kind: Kind, shard: u16, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    entry::encode(
        &mut out,
        kind,
        ShardId(shard),
        Version(version),
        key,
        value,
        MTU,
    )
    .unwrap();
    out
}

fn put(shard: u16, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    enc(Kind::Put, shard, version, key, value)
}

fn del(shard: u16, version: u64, key: &[u8]) -> Vec<u8> {
    enc(Kind::Del, shard, version, key, b"")
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

/// (kind, shard, version, key, value) of one encoded entry; it must be exactly one
/// entry, exactly as `entry::encode` produces it.
fn decode(bytes: &[u8]) -> (Kind, u16, u64, Vec<u8>, Vec<u8>) {
    let e = entry::parse_entry(bytes).unwrap();
    assert_eq!(e.encoded_len, bytes.len(), "one whole entry");
    let again = enc(e.kind, e.shard.0, e.version.0, e.key, &e.value);
    assert_eq!(again, bytes, "exactly as entry::encode produces it");
    (
        e.kind,
        e.shard.0,
        e.version.0,
        e.key.to_vec(),
        e.value.to_vec(),
    )
}

fn versions(entries: &[Vec<u8>]) -> Vec<u64> {
    entries.iter().map(|b| decode(b).2).collect()
}

fn segment_of(engine: &Engine, addr: u64) -> SegmentId {
    engine.layout().segment_of(addr as usize).unwrap()
}

#[test]
fn backup_entries_are_returned_per_shard_sorted_and_deduplicated() {
    let e = engine();
    let a9 = put(1, 9, b"a", b"nine");
    let b3 = put(1, 3, b"b", b"three");
    let c5 = del(1, 5, b"c");
    let other = put(2, 4, b"a", b"shard two");
    let commit = enc(Kind::Commit, 1, 20, b"", b"");
    assert_eq!(e.append_backup(0, &a9).unwrap(), None);
    // Several entries in one append, a duplicate, another worker's b-log.
    e.append_backup(0, &[b3.clone(), other.clone(), commit].concat())
        .unwrap();
    e.append_backup(1, &[c5.clone(), b3.clone()].concat())
        .unwrap();

    let got = e.uncommitted_entries(ShardId(1), &[]).unwrap();
    assert_eq!(got, vec![b3, c5, a9]);
    assert_eq!(versions(&got), [3, 5, 9]);
    assert_eq!(e.uncommitted_entries(ShardId(2), &[]).unwrap(), vec![other]);
    assert!(e.uncommitted_entries(ShardId(0), &[]).unwrap().is_empty());
    assert!(matches!(
        e.uncommitted_entries(ShardId(9), &[]),
        Err(EngineError::NoSuchShard(_))
    ));
    assert!(e
        .uncommitted_entries(ShardId(1), &[SegmentId(1 << 20)])
        .is_err());
    // Reading them changed nothing: digest has not indexed them.
    assert_eq!(e.get(ShardId(1), b"a").unwrap(), None);
}

#[test]
fn a_full_backup_segment_is_still_uncommitted() {
    let e = engine();
    let mut sealed = Vec::new();
    let mut written = Vec::new();
    for v in 1..=60u64 {
        let bytes = put(0, v, format!("k{v}").as_bytes(), &pattern(600, v));
        if let Some(s) = e.append_backup(0, &bytes).unwrap() {
            sealed.push(s);
        }
        written.push(bytes);
    }
    assert!(sealed.len() >= 2, "60 × 640 B fill more than two segments");
    let got = e.uncommitted_entries(ShardId(0), &[]).unwrap();
    assert_eq!(got, written, "used and using segments are both read");
}

#[test]
fn tlog_entries_are_included_only_when_their_segment_is_named() {
    let e = engine();
    let w = e.put(0, ShardId(1), b"primary", b"written here").unwrap();
    e.append_backup(0, &put(1, 7, b"replicated", b"from elsewhere"))
        .unwrap();
    let got = e.uncommitted_entries(ShardId(1), &[]).unwrap();
    assert_eq!(versions(&got), [7]);
    let tlog = segment_of(&e, w.addr);
    let got = e.uncommitted_entries(ShardId(1), &[tlog, tlog]).unwrap();
    assert_eq!(versions(&got), [w.version.0, 7]);
    assert_eq!(
        decode(&got[0]),
        (
            Kind::Put,
            1,
            w.version.0,
            b"primary".to_vec(),
            b"written here".to_vec()
        )
    );
}

#[test]
fn a_restart_closes_the_tlog_segment_being_filled_and_its_entries_can_be_resent() {
    let pool = pool(true);
    let e = Engine::create(pool.clone(), config()).unwrap();
    let mut put_values: BTreeMap<u64, (u16, Vec<u8>, Vec<u8>)> = BTreeMap::new();
    let mut tlog = Vec::new();
    for i in 0..12u64 {
        let shard = (i % 2) as u16;
        let key = format!("key-{i}").into_bytes();
        // One value larger than an MTU: a multi-block entry.
        let value = pattern(if i == 4 { 3 * MTU } else { 100 }, i);
        let w = e.put(0, ShardId(shard), &key, &value).unwrap();
        tlog.push(segment_of(&e, w.addr));
        if shard == 0 {
            put_values.insert(w.version.0, (shard, key, value));
        }
    }
    tlog.sort();
    tlog.dedup();
    assert_eq!(tlog.len(), 1, "one t-log segment being filled");
    let blog_entry = put(3, 50, b"backup", b"per-thread");
    e.append_backup(1, &blog_entry).unwrap();
    // Whole-cluster power failure: the image the pool holds when power fails.
    let image = pool.crash().unwrap().image(PowerFailure::DropAll);
    drop(e);

    let (e, report) = Engine::open(
        Pool::from_image(&image, PoolOptions::default()).unwrap(),
        config(),
    )
    .unwrap();
    let blog_seg = e
        .uncommitted_entries(ShardId(3), &report.closed_segments)
        .unwrap();
    assert_eq!(blog_seg, vec![blog_entry]);
    assert_eq!(report.closed_segments.len(), 2, "{report:?}");
    assert!(report.closed_segments.contains(&tlog[0]));
    assert!(report.closed_segments.windows(2).all(|w| w[0] < w[1]));
    // Closed segments are committed: not uncommitted unless named.
    assert!(e.uncommitted_entries(ShardId(0), &[]).unwrap().is_empty());
    assert!(e.uncommitted_entries(ShardId(3), &[]).unwrap().is_empty());

    let got = e
        .uncommitted_entries(ShardId(0), &report.closed_segments)
        .unwrap();
    let got: Vec<_> = got.iter().map(|b| decode(b)).collect();
    let expected: Vec<_> = put_values
        .iter()
        .map(|(&v, (s, k, val))| (Kind::Put, *s, v, k.clone(), val.clone()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(e.highest_version(ShardId(0)).unwrap(), 6);
    // Recovery indexed the per-thread b-log's entry too.
    assert_eq!(e.highest_version(ShardId(3)).unwrap(), 50);
    assert_eq!(
        e.get(ShardId(3), b"backup").unwrap(),
        Some((b"per-thread".to_vec(), Version(50)))
    );
}

/// The blocks of a contiguous encoded entry.
fn blocks(encoded: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < encoded.len() {
        let len = entry::parse_block(&encoded[at..]).unwrap().0.padded_len();
        out.push(&encoded[at..at + len]);
        at += len;
    }
    out
}

#[test]
fn a_multi_block_entry_whose_blocks_landed_apart_round_trips() {
    let a = engine();
    let big_value = pattern(5000, 77);
    let big = put(2, 40, b"big", &big_value);
    let parts = blocks(&big);
    assert_eq!(parts.len(), 3);
    // Fillers of exactly one MTU each: 7 of them leave room for one block in the
    // 16 KiB segment, so block 0 ends the segment and blocks 1, 2 start the next,
    // with another shard's entry between them.
    let filler_value = vec![9u8; MTU - entry::HEADER_BYTES - 2];
    for v in 1..=7u64 {
        let f = put(1, v, format!("f{v}").as_bytes(), &filler_value);
        assert_eq!(f.len(), MTU);
        assert_eq!(a.append_backup(0, &f).unwrap(), None);
    }
    assert_eq!(a.append_backup(0, parts[0]).unwrap(), None);
    let sealed = a.append_backup(0, parts[2]).unwrap();
    assert!(sealed.is_some(), "block 2 opens the next segment");
    a.append_backup(0, &put(1, 8, b"between", b"x")).unwrap();
    a.append_backup(0, parts[1]).unwrap();

    let got = a.uncommitted_entries(ShardId(2), &[]).unwrap();
    assert_eq!(got, vec![big.clone()]);
    assert_eq!(a.uncommitted_entries(ShardId(1), &[]).unwrap().len(), 8);

    let b = engine();
    let report = b.install_entries(1, &got.concat()).unwrap();
    assert_eq!(
        report,
        InstallReport {
            entries: 1,
            installed: 1,
            already: 0,
            sealed: vec![],
        }
    );
    assert_eq!(
        b.get(ShardId(2), b"big").unwrap(),
        Some((big_value, Version(40)))
    );
    assert_eq!(b.highest_version(ShardId(2)).unwrap(), 40);
    assert_eq!(b.next_version(ShardId(2)).unwrap(), Version(41));
    // It is now in b's per-thread b-log: uncommitted there too.
    assert_eq!(b.uncommitted_entries(ShardId(2), &[]).unwrap(), vec![big]);
}

#[test]
fn remotely_written_segments_are_parsed_past_holes_and_torn_blocks() {
    let e = engine();
    let (_, offset) = e.alloc_remote_segment().unwrap();
    let base = e.layout().data_offset + offset;
    let e1 = put(0, 1, b"one", b"1");
    let e2 = put(0, 2, b"two", &pattern(300, 2));
    let e3 = put(0, 3, b"three", b"3");
    let e4 = del(0, 4, b"one");
    let pool = e.pool();
    let mut at = base;
    pool.write(at, &e1);
    at += e1.len() + 2 * entry::STRIDE_BYTES; // a hole a WRITE never filled
    pool.write(at, &e2);
    at += e2.len();
    let mut torn = e3.clone();
    torn[26] ^= 0xFF; // a key byte
    pool.write(at, &torn);
    at += torn.len();
    pool.write(at, &e4);
    pool.persist(base, SEGMENT);
    let got = e.uncommitted_entries(ShardId(0), &[]).unwrap();
    assert_eq!(got, vec![e1, e2, e4]);
}

#[test]
fn install_entries_is_version_conditional_and_all_or_nothing() {
    let e = engine();
    let setup = [
        put(0, 10, b"k1", b"k1 at 10"),
        put(0, 3, b"k2", b"k2 at 3"),
        put(0, 2, b"k3", b"k3 at 2"),
    ]
    .concat();
    let r = e.install_entries(0, &setup).unwrap();
    assert_eq!((r.entries, r.installed, r.already), (3, 3, 0));
    assert_eq!(e.highest_version(ShardId(0)).unwrap(), 10);

    let batch = [
        put(0, 5, b"k1", b"k1 at 5 (older)"),
        put(0, 12, b"k2", b"k2 at 12"),
        enc(Kind::Commit, 0, 12, b"", b""),
        del(0, 8, b"k3"),
        put(0, 10, b"k1", b"same version"),
        put(1, 4, b"k1", b"another shard"),
    ]
    .concat();

    // Corrupt buffers are refused and change nothing.
    let mut corrupt = batch.clone();
    // A payload byte of the last entry (one 64 B block).
    let last = corrupt.len() - 64 + 30;
    corrupt[last] ^= 0x55;
    assert!(matches!(
        e.install_entries(0, &corrupt),
        Err(EngineError::Entry(_))
    ));
    let truncated = &batch[..batch.len() - 32];
    assert!(e.install_entries(0, truncated).is_err());
    let foreign = [put(0, 30, b"k9", b"v"), put(7, 1, b"k", b"no such shard")].concat();
    assert!(matches!(
        e.install_entries(0, &foreign),
        Err(EngineError::NoSuchShard(_))
    ));
    assert!(e.install_entries(5, &batch).is_err(), "no worker 5");
    let unchanged = |e: &Engine| {
        assert_eq!(
            e.get(ShardId(0), b"k2").unwrap(),
            Some((b"k2 at 3".to_vec(), Version(3)))
        );
        assert_eq!(e.get(ShardId(0), b"k9").unwrap(), None);
        assert_eq!(e.highest_version(ShardId(0)).unwrap(), 10);
        assert_eq!(e.highest_version(ShardId(1)).unwrap(), 0);
        assert_eq!(e.uncommitted_entries(ShardId(0), &[]).unwrap().len(), 3);
    };
    unchanged(&e);

    let r = e.install_entries(1, &batch).unwrap();
    assert_eq!(
        r,
        InstallReport {
            entries: 5,
            installed: 3,
            already: 2,
            sealed: vec![],
        }
    );
    assert_eq!(
        e.get(ShardId(0), b"k1").unwrap(),
        Some((b"k1 at 10".to_vec(), Version(10)))
    );
    assert_eq!(
        e.get(ShardId(0), b"k2").unwrap(),
        Some((b"k2 at 12".to_vec(), Version(12)))
    );
    assert_eq!(
        e.get(ShardId(0), b"k3").unwrap(),
        None,
        "the tombstone hides"
    );
    assert_eq!(e.indexed(ShardId(0)).unwrap(), 3);
    assert_eq!(e.highest_version(ShardId(0)).unwrap(), 12);
    assert_eq!(e.highest_version(ShardId(1)).unwrap(), 4);
    // New writes take versions above every one seen.
    let w = e.put(0, ShardId(0), b"k4", b"new").unwrap();
    assert_eq!(w.version, Version(13));
    // Installing the same again changes nothing.
    let r = e.install_entries(0, &batch).unwrap();
    assert_eq!((r.installed, r.already), (0, 5));
    assert!(e.install_entries(0, &[]).unwrap() == InstallReport::default());

    // What was installed survives a restart.
    let image = {
        let mut b = vec![0u8; POOL_BYTES];
        e.pool().read(0, &mut b);
        b
    };
    drop(e);
    let (e, _) = Engine::open(
        Pool::from_image(&image, PoolOptions::default()).unwrap(),
        config(),
    )
    .unwrap();
    assert_eq!(
        e.get(ShardId(0), b"k2").unwrap(),
        Some((b"k2 at 12".to_vec(), Version(12)))
    );
    assert_eq!(e.get(ShardId(0), b"k3").unwrap(), None);
    assert_eq!(e.highest_version(ShardId(0)).unwrap(), 13);
}

#[test]
fn install_entries_hands_back_the_segments_it_fills() {
    let e = engine();
    let entries: Vec<Vec<u8>> = (1..=60u64)
        .map(|v| put(3, v, format!("k{v}").as_bytes(), &pattern(900, v)))
        .collect();
    let r = e.install_entries(0, &entries.concat()).unwrap();
    assert_eq!((r.entries, r.installed, r.already), (60, 60, 0));
    assert!(r.sealed.len() >= 3, "{:?}", r.sealed);
    for v in 1..=60u64 {
        assert_eq!(
            e.get(ShardId(3), format!("k{v}").as_bytes()).unwrap(),
            Some((pattern(900, v), Version(v)))
        );
    }
    // Sealed (used) segments and the one being filled are all uncommitted.
    assert_eq!(e.uncommitted_entries(ShardId(3), &[]).unwrap(), entries);
}

/// Every key of every shard read back: (shard, key) → (value, version), None for a
/// deleted key.
type Reads = BTreeMap<(u16, Vec<u8>), Option<(Vec<u8>, Version)>>;

fn read_all(e: &Engine, keys: &[(u16, Vec<u8>)]) -> Reads {
    keys.iter()
        .map(|(s, k)| ((*s, k.clone()), e.get(ShardId(*s), k).unwrap()))
        .collect()
}

#[test]
fn for_each_indexed_entry_copies_a_shard_exactly() {
    let pool = pool(false);
    let a = Engine::create(pool.clone(), config()).unwrap();
    let mut keys = Vec::new();
    for i in 0..150u64 {
        let shard = (i % 3) as u16;
        let key = format!("key-{}", i % 40).into_bytes();
        keys.push((shard, key.clone()));
        if i % 11 == 0 {
            a.delete(0, ShardId(shard), &key).unwrap();
        } else {
            let len = if i % 17 == 0 { 2 * MTU + 100 } else { 50 };
            a.put((i % 2) as usize, ShardId(shard), &key, &pattern(len, i))
                .unwrap();
        }
    }
    // A multi-block entry whose blocks landed apart: recovery assembles it and
    // indexes a contiguous copy.
    let far = put(1, 1000, b"far", &pattern(5000, 5));
    let parts = blocks(&far);
    a.append_backup(1, parts[1]).unwrap();
    a.append_backup(1, &put(2, 1000, b"x", b"y")).unwrap();
    a.append_backup(1, parts[0]).unwrap();
    a.append_backup(1, parts[2]).unwrap();
    keys.push((1, b"far".to_vec()));
    keys.push((2, b"x".to_vec()));
    drop(a);
    let (a, _) = Engine::open(pool, config()).unwrap();
    // Cleaning moves live entries: the index follows.
    let cleaned = a.clean().unwrap();
    assert!(cleaned.entries_moved > 0, "{cleaned:?}");
    keys.sort();
    keys.dedup();
    let expected = read_all(&a, &keys);
    assert_eq!(
        expected[&(1, b"far".to_vec())],
        Some((pattern(5000, 5), Version(1000)))
    );

    let b = engine();
    for shard in 0..4u16 {
        let mut copied = Vec::new();
        let n = a
            .for_each_indexed_entry(ShardId(shard), |bytes| copied.push(bytes.to_vec()))
            .unwrap();
        assert_eq!(n, copied.len());
        assert_eq!(
            n,
            a.indexed(ShardId(shard)).unwrap(),
            "every key, tombstones too"
        );
        let mut seen_keys: Vec<Vec<u8>> = copied.iter().map(|c| decode(c).3).collect();
        seen_keys.sort();
        seen_keys.dedup();
        assert_eq!(seen_keys.len(), n, "each key once");
        let r = b.install_entries(0, &copied.concat()).unwrap();
        assert_eq!((r.entries, r.installed), (n, n));
        assert_eq!(b.indexed(ShardId(shard)).unwrap(), n);
        assert_eq!(
            b.highest_version(ShardId(shard)).unwrap(),
            copied.iter().map(|c| decode(c).2).max().unwrap_or(0)
        );
    }
    assert_eq!(read_all(&b, &keys), expected);
    assert!(matches!(
        a.for_each_indexed_entry(ShardId(4), |_| {}),
        Err(EngineError::NoSuchShard(_))
    ));
}

/// Dynamic resharding: a migration's target drops the entries below the
/// source's next version (left from an earlier time it held the shard) and
/// keeps the rest; the source frees a shard's index with `Version(u64::MAX)`.
/// Other shards are untouched, the dropped bytes are dead, and the request
/// table's outcomes move to another engine and answer retries there.
#[test]
fn forget_below_drops_old_entries_and_outcomes_move_between_engines() {
    use rowankv_engine::RequestOutcome;
    use rowankv_types::{RequestId, RequestRecord};
    let a = engine();
    let s0 = ShardId(0);
    let s1 = ShardId(1);
    for i in 0..40u64 {
        a.put(0, s0, format!("k{i}").as_bytes(), b"old").unwrap();
    }
    a.delete(0, s0, b"k3").unwrap();
    a.put(0, s1, b"other", b"kept").unwrap();
    let floor = a.next_version(s0).unwrap();
    for i in 0..10u64 {
        a.put(0, s0, format!("k{i}").as_bytes(), b"new").unwrap();
    }
    a.put(0, s0, b"fresh", b"new").unwrap();
    assert_eq!(a.indexed(s0).unwrap(), 41);
    let removed = a.forget_below(s0, floor).unwrap();
    assert_eq!(removed, 30, "k10..k39 are older than the floor");
    assert_eq!(a.indexed(s0).unwrap(), 11);
    for i in 0..40u64 {
        let key = format!("k{i}");
        let got = a.get(s0, key.as_bytes()).unwrap();
        if i < 10 {
            assert_eq!(got.map(|(v, _)| v).as_deref(), Some(&b"new"[..]), "{key}");
        } else {
            assert_eq!(got, None, "{key}");
            assert!(!a.is_indexed(s0, key.as_bytes()).unwrap(), "{key}");
        }
    }
    assert!(a.is_indexed(s0, b"fresh").unwrap());
    assert_eq!(
        a.get(s1, b"other").unwrap().map(|(v, _)| v).as_deref(),
        Some(&b"kept"[..])
    );
    // Nothing is left below the floor: a second call removes nothing.
    assert_eq!(a.forget_below(s0, floor).unwrap(), 0);
    assert_eq!(a.forget_below(s0, Version(u64::MAX)).unwrap(), 11);
    assert_eq!(a.indexed(s0).unwrap(), 0);
    assert_eq!(a.indexed(s1).unwrap(), 1);

    // A tombstone is indexed (its key's latest write is known here).
    a.put(0, s1, b"gone", b"x").unwrap();
    a.delete(0, s1, b"gone").unwrap();
    assert_eq!(a.get(s1, b"gone").unwrap(), None);
    assert!(a.is_indexed(s1, b"gone").unwrap());
    assert!(!a.is_indexed(s1, b"never").unwrap());

    // Outcomes: two requests of one client, one of another.
    let rec = |client, seq, first_incomplete| RequestRecord {
        id: RequestId { client, seq },
        first_incomplete,
    };
    let w1 = a
        .put_with_request(0, s1, b"r1", b"v", rec(9, 5, 4))
        .unwrap();
    let w2 = a
        .put_with_request(0, s1, b"r1", b"w", rec(9, 6, 4))
        .unwrap();
    let w3 = a
        .put_with_request(0, s1, b"r2", b"v", rec(11, 1, 1))
        .unwrap();
    let outcomes = a.request_outcomes(s1).unwrap();
    assert_eq!(outcomes.len(), 3);
    let b = engine();
    b.note_outcomes(s1, outcomes).unwrap();
    let at = |client, seq| b.request_outcome(s1, RequestId { client, seq }).unwrap();
    assert_eq!(at(9, 5), RequestOutcome::Done(w1.version));
    assert_eq!(at(9, 6), RequestOutcome::Done(w2.version));
    assert_eq!(at(11, 1), RequestOutcome::Done(w3.version));
    assert_eq!(
        at(9, 3),
        RequestOutcome::Stale,
        "below the floor moved with them"
    );
    assert_eq!(at(9, 7), RequestOutcome::Unknown);
}
