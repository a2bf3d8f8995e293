//! The backup log end to end on the loopback fabric: two primaries replicate entries
//! (some larger than the MTU, whose blocks land apart) into one server's b-log through
//! Rowan; the control role finds used segments, two digest roles index them, commit
//! records move them to committed; then the server loses power and recovers them.

use std::collections::BTreeMap;
use std::sync::Arc;

use rowankv_engine::entry::{self, Kind};
use rowankv_engine::{BackupLog, BackupLogConfig, Engine, EngineConfig};
use rowankv_fabric::{
    Completion, CompletionQueue, CqKind, Fabric, FaultInjector, LoopbackCq, LoopbackFabric,
    LoopbackQp, Nic, PowerFailure, QueuePair, WcStatus,
};
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_rowan::RowanSender;
use rowankv_types::{NodeId, ShardId, Version};

const MTU: usize = 2048;
const SEGMENT: usize = 16 << 10;
const GRACE_NS: u64 = 1_000;

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

struct Primary {
    sender: RowanSender<LoopbackQp>,
    cq: LoopbackCq,
    buf: Vec<u8>,
}

impl Primary {
    fn send(&mut self, kind: Kind, shard: u16, version: u64, key: &[u8], value: &[u8]) {
        entry::encode(
            &mut self.buf,
            kind,
            ShardId(shard),
            Version(version),
            key,
            value,
            MTU,
        )
        .unwrap();
        let blocks: Vec<&[u8]> = self.buf.chunks(MTU).collect();
        self.sender.write_blocks(version, &blocks).unwrap();
        let mut wc = [Completion::BLANK];
        loop {
            if self.cq.poll(&mut wc).unwrap() == 1 {
                assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
                return;
            }
        }
    }
}

#[test]
fn replicated_entries_are_digested_committed_and_survive_power_failure() {
    let fabric = LoopbackFabric::new();
    let backup_nic = fabric.attach(NodeId(0)).unwrap();
    let pool = Pool::anonymous(
        2 << 20,
        PoolOptions {
            crash_sim: true,
            ..PoolOptions::default()
        },
    )
    .unwrap();
    let engine = Arc::new(Engine::create(pool.clone(), config()).unwrap());
    let blog = BackupLog::start(
        engine.clone(),
        backup_nic,
        BackupLogConfig {
            posted_segments: 8,
            grace_ns: GRACE_NS,
            digest_count: 2,
            ring_cq_entries: 256,
        },
    )
    .unwrap();
    let mut primaries: Vec<Primary> = (1..=2)
        .map(|n| {
            let nic = fabric.attach(NodeId(n)).unwrap();
            let cq = nic.create_cq(CqKind::Bounded { capacity: 64 }).unwrap();
            let qp = nic.create_qp(&cq, &cq, None, 64).unwrap();
            let addr = blog.accept(qp.addr()).unwrap();
            qp.connect(addr).unwrap();
            Primary {
                sender: RowanSender::new(qp, MTU),
                cq,
                buf: Vec::new(),
            }
        })
        .collect();

    // Primary p owns shards p and p + 2; versions per shard from 1.
    let mut expected: BTreeMap<(u16, Vec<u8>), Vec<u8>> = BTreeMap::new();
    let mut versions = [0u64; 4];
    // The control role runs alongside, as on its own thread: time moves one grace
    // period per step, so consumed segments become used and fresh ones are posted.
    let mut now = 0;
    let mut used = 0;
    for i in 0..300u32 {
        if i % 10 == 0 {
            now += GRACE_NS;
            used += blog.control_step(now).unwrap().segments_used;
        }
        for (p, primary) in primaries.iter_mut().enumerate() {
            let shard = (p + 2 * (i as usize % 2)) as u16;
            versions[shard as usize] += 1;
            let key = format!("key-{}", i % 120).into_bytes();
            // Every 25th entry is larger than the MTU: its blocks interleave with
            // the other primary's writes in the b-log.
            let len = if i % 25 == 0 {
                5000
            } else {
                40 + (i as usize % 90)
            };
            let value: Vec<u8> = (0..len).map(|j| (i as usize + j + p) as u8).collect();
            primary.send(Kind::Put, shard, versions[shard as usize], &key, &value);
            expected.insert((shard, key), value);
        }
    }
    now += GRACE_NS;
    used += blog.control_step(now).unwrap().segments_used;
    assert!(used >= 4, "only {used} segments used");
    for d in 0..2 {
        blog.digest_step(d).unwrap();
    }
    assert_eq!(
        blog.try_commit(),
        0,
        "no CommitVer seen yet: nothing may be committed"
    );

    // CommitVer records, then padding so that they land in a used segment too.
    for (p, primary) in primaries.iter_mut().enumerate() {
        for shard in [p as u16, p as u16 + 2] {
            primary.send(Kind::Commit, shard, versions[shard as usize], &[], &[]);
        }
    }
    for i in 0..(2 * SEGMENT / 128) as u64 {
        primaries[0].send(Kind::Put, 0, versions[0] + 1 + i, b"padding", &[7u8; 80]);
        if i % 32 == 0 {
            now += GRACE_NS;
            blog.control_step(now).unwrap();
        }
    }
    now += GRACE_NS;
    blog.control_step(now).unwrap();
    now += GRACE_NS;
    blog.control_step(now).unwrap();
    for d in 0..2 {
        blog.digest_step(d).unwrap();
    }
    let committed = blog.try_commit();
    assert!(
        committed >= used,
        "{committed} committed of {used} used before the commit records"
    );
    for shard in 0..4u16 {
        assert_eq!(
            blog.commit_version(ShardId(shard)),
            versions[shard as usize]
        );
    }

    // Every replicated entry (all in used segments now) is indexed with its value.
    for ((shard, key), value) in &expected {
        let got = engine.get(ShardId(*shard), key).unwrap().map(|(v, _)| v);
        assert_eq!(
            got.as_ref(),
            Some(value),
            "shard {shard} {:?}",
            String::from_utf8_lossy(key)
        );
    }

    // Digested versions count as seen: promoted, this backup would hand out
    // versions above every one it indexed, never one again.
    for shard in 0..4u16 {
        let seen = engine.highest_version(ShardId(shard)).unwrap();
        assert!(
            seen >= versions[shard as usize],
            "shard {shard}: highest version {seen}, indexed {}",
            versions[shard as usize]
        );
    }

    // Power failure of the backup right after the acknowledgements.
    fabric.power_fail(NodeId(0), PowerFailure::DropAll);
    drop(blog);
    drop(engine);
    let (recovered, report) = Engine::open(pool.clone(), config()).unwrap();
    assert!(report.corrupt_segments.is_empty());
    for ((shard, key), value) in &expected {
        let got = recovered.get(ShardId(*shard), key).unwrap().map(|(v, _)| v);
        assert_eq!(
            got.as_ref(),
            Some(value),
            "after power failure: shard {shard}"
        );
    }
}

// ---------------------------------------------------------------------------------
// Segment reuse: a b-log segment that held other entries before must commit once
// its new entries are committed. Its previous occupant's entries past the new data
// are not landed data: counted into MaxVer (for shards this server leads, whose
// CommitVer never moves here) they would pin the segment forever.

/// The shard this server leads in the reuse tests: no CommitVer ever reaches it.
const LED_SHARD: u16 = 0;
/// The shard this server backs in the reuse tests.
const BACKED_SHARD: u16 = 1;
/// Pool of the reuse tests: a few dozen 16 KiB segments, all soon reused.
const REUSE_POOL_BYTES: usize = 512 << 10;
/// Padded size of every entry the reuse tests replicate (a single block).
const BIG_ENTRY: usize = 1536;

fn reuse_config() -> EngineConfig {
    EngineConfig {
        clean_grace: std::time::Duration::ZERO,
        ..config()
    }
}

/// An engine whose every free segment has held a full t-log segment of 64 B
/// entries of `LED_SHARD` (written here as its primary, then cleaned): whatever
/// it allocates next is a reused segment with an intact entry at every stride.
fn engine_with_only_reused_free_segments() -> (Arc<Pool>, Arc<Engine>) {
    let pool = Pool::anonymous(REUSE_POOL_BYTES, PoolOptions::default()).unwrap();
    let engine = Arc::new(Engine::create(pool.clone(), reuse_config()).unwrap());
    let layout = *engine.layout();
    let all_free_reused = || {
        (0..layout.segment_count).all(|i| {
            let meta = pool.read_u64(rowankv_engine::segment::META_OFFSET + 8 * i);
            let state = rowankv_engine::segment::SegmentMeta::decode(meta)
                .unwrap()
                .state;
            let last_stride = layout.data_offset + (i + 1) * SEGMENT - 64;
            state != rowankv_engine::SegmentState::Free || pool.read_u64(last_stride) != 0
        })
    };
    let mut i = 0u64;
    while !all_free_reused() {
        for _ in 0..256 {
            // 24 B header + 5 B key + 20 B value: one 64 B stride per entry.
            let key = format!("key-{}", i % 8).into_bytes();
            engine
                .put(0, ShardId(LED_SHARD), &key, &[i as u8; 20])
                .unwrap();
            i += 1;
            if engine.free_segments() < 4 {
                engine.clean().unwrap();
            }
        }
        assert!(i < 1 << 20, "segments never all reused");
    }
    (pool, engine)
}

fn big_value(key: &[u8]) -> Vec<u8> {
    vec![0x5A; BIG_ENTRY - entry::HEADER_BYTES - key.len()]
}

fn encoded(kind: Kind, shard: u16, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
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

#[test]
fn a_reused_blog_segment_commits_once_its_new_entries_are_committed() {
    let (_pool, engine) = engine_with_only_reused_free_segments();
    let fabric = LoopbackFabric::new();
    let blog = BackupLog::start(
        engine.clone(),
        fabric.attach(NodeId(0)).unwrap(),
        BackupLogConfig {
            posted_segments: 2,
            grace_ns: GRACE_NS,
            digest_count: 2,
            ring_cq_entries: 256,
        },
    )
    .unwrap();
    let nic = fabric.attach(NodeId(1)).unwrap();
    let cq = nic.create_cq(CqKind::Bounded { capacity: 64 }).unwrap();
    let qp = nic.create_qp(&cq, &cq, None, 64).unwrap();
    qp.connect(blog.accept(qp.addr()).unwrap()).unwrap();
    let mut primary = Primary {
        sender: RowanSender::new(qp, MTU),
        cq,
        buf: Vec::new(),
    };
    let mut now = 0;
    let mut step = |blog: &BackupLog<_>| {
        now += GRACE_NS;
        blog.control_step(now).unwrap().segments_used
    };
    let per_segment = SEGMENT / BIG_ENTRY; // 10 entries, then 1 KiB of old tail
    let put = |primary: &mut Primary, version: u64| {
        let key = format!("backed-{version}").into_bytes();
        primary.send(Kind::Put, BACKED_SHARD, version, &key, &big_value(&key));
    };

    // Segment A: versions 1..=10; version 11 does not fit and starts segment B.
    for v in 1..=per_segment as u64 + 1 {
        put(&mut primary, v);
    }
    let used: usize = (0..2).map(|_| step(&blog)).sum();
    assert_eq!(used, 1, "segment A is used once B has started");
    let a = blog.pending_segments()[0];
    for d in 0..2 {
        blog.digest_step(d).unwrap();
    }
    assert_eq!(blog.try_commit(), 0, "no CommitVer yet: A must wait");

    // CommitVer of the backed shard covers A's entries; it lands in B, which then
    // fills with newer entries (not covered) and is used in turn.
    primary.send(Kind::Commit, BACKED_SHARD, per_segment as u64, &[], &[]);
    for v in per_segment as u64 + 2..=2 * per_segment as u64 + 1 {
        put(&mut primary, v);
    }
    let used: usize = (0..2).map(|_| step(&blog)).sum();
    assert_eq!(used, 1, "segment B is used once C has started");
    for d in 0..2 {
        blog.digest_step(d).unwrap();
    }
    assert_eq!(
        blog.commit_version(ShardId(BACKED_SHARD)),
        per_segment as u64
    );
    let committed = blog.try_commit();
    let pending = blog.pending_segments();
    assert!(
        committed == 1 && !pending.contains(&a),
        "reused segment {a:?} is still pending after CommitVer covered its entries \
         ({committed} committed, pending {pending:?})"
    );
    assert_eq!(
        pending.len(),
        1,
        "B waits for its own CommitVer: {pending:?}"
    );
    // Every entry of A and B is indexed (the last one is in C, not digested yet).
    for v in 1..=2 * per_segment as u64 {
        let key = format!("backed-{v}").into_bytes();
        let got = engine.get(ShardId(BACKED_SHARD), &key).unwrap();
        assert_eq!(got.map(|(_, version)| version), Some(Version(v)));
    }
}

#[test]
fn a_reused_per_thread_blog_segment_commits_once_its_new_entries_are_committed() {
    let (_pool, engine) = engine_with_only_reused_free_segments();
    let blog = BackupLog::<rowankv_fabric::LoopbackNic>::passive(
        engine.clone(),
        BackupLogConfig {
            digest_count: 2,
            ..BackupLogConfig::default()
        },
    )
    .unwrap();
    let per_segment = SEGMENT / BIG_ENTRY; // 10 entries and a CommitVer, then old tail
    let mut sealed = Vec::new();
    for v in 1..=per_segment as u64 + 1 {
        let key = format!("backed-{v}").into_bytes();
        let put = encoded(Kind::Put, BACKED_SHARD, v, &key, &big_value(&key));
        sealed.extend(engine.append_backup(0, &put).unwrap());
        if v == per_segment as u64 {
            let commit = encoded(Kind::Commit, BACKED_SHARD, v, &[], &[]);
            sealed.extend(engine.append_backup(0, &commit).unwrap());
        }
    }
    assert_eq!(sealed.len(), 1, "the 11th entry seals the first segment");
    blog.enqueue_used(sealed[0]);
    for d in 0..2 {
        blog.digest_step(d).unwrap();
    }
    assert_eq!(
        blog.commit_version(ShardId(BACKED_SHARD)),
        per_segment as u64
    );
    let committed = blog.try_commit();
    assert_eq!(
        committed, 1,
        "reused segment {:?} is still pending after CommitVer covered its entries",
        sealed[0]
    );
    assert!(blog.pending_segments().is_empty());
}

/// Regression (found by review of the `drpc` strategy, whose backups append an
/// entry larger than a ring chunk in pieces): the blocks of one entry straddle
/// two b-log segments, and a CommitVer covering every *complete* entry of the
/// first lands before the second piece. The first segment must not commit while
/// the entry is incomplete: committed, it would leave the walk a promotion takes
/// (`uncommitted_entries_of`: using and used segments only), which then holds
/// only the second piece and cannot assemble the acknowledged entry — the new
/// primary served the old value. Rowan's b-log, whose blocks land apart, had the
/// same exposure. Before the fix `try_commit` committed the first segment and the
/// key read v1.
#[test]
fn a_segment_holding_part_of_an_incomplete_entry_is_not_committed_until_it_completes() {
    let pool = Pool::anonymous(1 << 20, PoolOptions::default()).unwrap();
    let engine = Arc::new(Engine::create(pool, config()).unwrap());
    let blog = BackupLog::<rowankv_fabric::LoopbackNic>::passive(
        engine.clone(),
        BackupLogConfig::default(),
    )
    .unwrap();
    let shard = 1u16;
    let big = vec![7u8; 3000];
    let whole = encoded(Kind::Put, shard, 1_000, b"big", &big);
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < whole.len() {
        let (h, _) = entry::parse_block(&whole[at..]).unwrap();
        pieces.push(whole[at..at + h.padded_len()].to_vec());
        at += h.padded_len();
    }
    assert_eq!(pieces.len(), 2, "two blocks at an MTU of {MTU}");
    let filler = |v: u64| {
        encoded(
            Kind::Put,
            shard,
            v,
            format!("k{v:05}").as_bytes(),
            &[1u8; 90],
        )
    };
    let commit = |v: u64| encoded(Kind::Commit, shard, v, b"", b"");
    // Fill the first segment so that the first piece fits and the second does not.
    let n = (SEGMENT - commit(0).len() - pieces[0].len()) / filler(2).len();
    let mut sealed = Vec::new();
    sealed.extend(
        engine
            .append_backup(0, &encoded(Kind::Put, shard, 1, b"big", &[1u8; 90]))
            .unwrap(),
    );
    for v in 2..=n as u64 {
        sealed.extend(engine.append_backup(0, &filler(v)).unwrap());
    }
    sealed.extend(engine.append_backup(0, &commit(n as u64)).unwrap());
    for p in &pieces {
        sealed.extend(engine.append_backup(0, p).unwrap());
    }
    assert_eq!(
        sealed.len(),
        1,
        "the first segment sealed by the second piece"
    );
    blog.enqueue_used(sealed[0]);
    let digest_all = || {
        for d in 0..BackupLogConfig::default().digest_count {
            blog.digest_step(d).unwrap();
        }
    };
    digest_all();
    assert_eq!(
        blog.try_commit(),
        0,
        "the first segment holds part of an incomplete entry: not committed"
    );
    // A promotion now: its walk assembles the entry from both segments.
    let found = engine
        .uncommitted_entries_of(&[ShardId(shard)], &[])
        .unwrap();
    let list = found.get(&ShardId(shard)).cloned().unwrap_or_default();
    assert!(
        list.iter()
            .any(|e| entry::parse_entry(e).unwrap().version == Version(1_000)),
        "the acknowledged entry is missing from the promotion's walk"
    );
    // The second segment fills and is digested: the entry completes, and the
    // first segment commits once a CommitVer covers it.
    let mut more = Vec::new();
    let mut v = 1_001;
    while more.is_empty() {
        more.extend(engine.append_backup(0, &filler(v)).unwrap());
        v += 1;
    }
    more.extend(engine.append_backup(0, &commit(v)).unwrap());
    for seg in more {
        blog.enqueue_used(seg);
    }
    digest_all();
    assert_eq!(
        engine.get(ShardId(shard), b"big").unwrap().map(|(v, _)| v),
        Some(big),
        "the digest assembled the entry"
    );
    assert!(blog.try_commit() >= 1, "the first segment commits at last");
}
