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
