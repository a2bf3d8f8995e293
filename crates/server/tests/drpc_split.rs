//! `drpc`: an entry larger than a ring chunk travels as two requests, which the
//! backup's redo role appends to its b-log one after the other; here they
//! straddle two b-log segments, and a CommitVer covering every complete entry of
//! the first lands before the second piece. Through the real path — a durable-RPC
//! sender into the backup's `RedoRings`, executed by its `Appender` — the first
//! segment must stay uncommitted while the entry is incomplete, so that a
//! promotion's walk of the backup's b-logs assembles it. Found by review: before
//! the digest kept such segments uncommitted, the first one committed and the
//! promoted backup served the old value (v1) of the key.

use std::sync::Arc;

use rowankv_drpc::{Event, Sender};
use rowankv_engine::entry::{self, Kind};
use rowankv_engine::{BackupLog, BackupLogConfig, Engine, EngineConfig};
use rowankv_fabric::{Fabric, LoopbackFabric};
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_server::replication::redo::{self, RedoRings};
use rowankv_server::services::PathKey;
use rowankv_server::Strategy;
use rowankv_types::{NodeId, ShardId, Version};

const MTU: usize = 2048;
const SEG: usize = 16 << 10;

fn enc(kind: Kind, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    entry::encode(
        &mut out,
        kind,
        ShardId(1),
        Version(version),
        key,
        value,
        MTU,
    )
    .unwrap();
    out
}

type Backup = (
    Arc<Engine>,
    Arc<BackupLog<rowankv_fabric::LoopbackNic>>,
    LoopbackFabric,
    RedoRings<rowankv_fabric::LoopbackNic>,
);

/// A backup (node 1 of a new fabric): its engine on 16 KiB segments with rings
/// for `connections` senders, its b-log, its rings opened.
fn backup(connections: u32) -> Backup {
    let pool = Pool::anonymous(2 << 20, PoolOptions::default()).unwrap();
    let config = EngineConfig {
        segment_size_bytes: SEG,
        mtu_bytes: MTU,
        shard_count: 4,
        workers: 2,
        keys_per_shard_expected: 256,
        clean_grace: std::time::Duration::ZERO,
        reserved_tail_bytes: Strategy::Drpc.reserved_pool_bytes(MTU, connections),
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::create(pool, config).unwrap());
    let fabric = LoopbackFabric::new();
    let nic_b = fabric.attach(NodeId(1)).unwrap();
    let blog = Arc::new(BackupLog::passive(engine.clone(), BackupLogConfig::default()).unwrap());
    let (rings, _) = RedoRings::open(engine.clone(), blog.clone(), nic_b).unwrap();
    (engine, blog, fabric, rings)
}

#[test]
fn a_two_piece_entry_straddling_two_segments_is_found_by_a_promotion_walk() {
    let (engine, blog, fabric, mut rings) = backup(4);
    let nic_p = fabric.attach(NodeId(0)).unwrap();
    let mut sender = Sender::new(&nic_p, redo::VARIANT, redo::flow()).unwrap();
    let offer = rings
        .accept(
            sender.qp_addr(),
            PathKey {
                worker: 0,
                incarnation: 1,
            },
        )
        .unwrap();
    sender.connect(&offer).unwrap();
    let mut events = Vec::new();
    let mut durable = 0u64;
    let mut send = |sender: &mut Sender<_>, rings: &mut RedoRings<_>, payload: &[u8]| -> u64 {
        let seq = loop {
            match sender.call(redo::OP_APPEND, payload) {
                Ok(s) => break s,
                Err(rowankv_drpc::DrpcError::WouldBlock) => {
                    rings.poll();
                    sender.poll(&mut events).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        };
        for _ in 0..1000 {
            sender.poll(&mut events).unwrap();
            rings.poll();
            for e in events.drain(..) {
                if let Event::Durable { seq } = e {
                    durable = durable.max(seq);
                }
            }
            if durable >= seq {
                break;
            }
        }
        assert!(durable >= seq, "request {seq} durable (acknowledged)");
        seq
    };
    // Fill b-log 0's first segment: an old version of the key, fillers, a
    // CommitVer covering them, so that the big entry's first block fits and
    // its second does not.
    let v_new = enc(Kind::Put, 1_000, b"big", &[7u8; 3000]);
    let mut blocks = Vec::new();
    let mut at = 0;
    while at < v_new.len() {
        let (h, _) = entry::parse_block(&v_new[at..]).unwrap();
        blocks.push(v_new[at..at + h.padded_len()].to_vec());
        at += h.padded_len();
    }
    assert_eq!(blocks.len(), 2);
    let payload_max = redo::redo_geometry(MTU, 1, 0).payload_bytes_max();
    assert!(v_new.len() > payload_max, "drpc sends it as two requests");
    let filler = |v: u64| enc(Kind::Put, v, format!("k{v:05}").as_bytes(), &[1u8; 90]);
    let f = filler(2).len();
    let c = enc(Kind::Commit, 0, b"", b"").len();
    let n = (SEG - c - blocks[0].len()) / f;
    send(
        &mut sender,
        &mut rings,
        &enc(Kind::Put, 1, b"big", &[1u8; 90]),
    );
    for v in 2..=n as u64 {
        send(&mut sender, &mut rings, &filler(v));
    }
    send(
        &mut sender,
        &mut rings,
        &enc(Kind::Commit, n as u64, b"", b""),
    );
    for b in &blocks {
        send(&mut sender, &mut rings, b);
    }
    // Every request durable in the ring (the primary counts v1000 replicated)
    // and executed into the b-log by the real Appender.
    rings.drain().unwrap();
    assert_eq!(rings.counts(), (n as u64 + 3, 0));
    // The digest and commit of the backup log, as the roles run them.
    for d in 0..BackupLogConfig::default().digest_count {
        blog.digest_step(d).unwrap();
    }
    assert_eq!(
        blog.try_commit(),
        0,
        "the first b-log segment holds part of an incomplete entry: not committed"
    );
    // Promotion of this backup: drain (done), walk own b-logs, install.
    let found = engine.uncommitted_entries_of(&[ShardId(1)], &[]).unwrap();
    let list = found.get(&ShardId(1)).cloned().unwrap_or_default();
    for e in &list {
        engine.install_entries(0, e).unwrap();
    }
    let got = engine.get(ShardId(1), b"big").unwrap();
    assert_eq!(
        got.map(|(v, ver)| (v.len(), ver)),
        Some((3000, Version(1_000))),
        "the promoted backup serves the acknowledged v1000 of the key"
    );
}

/// A restarted sender (another incarnation) that dials with fewer workers
/// frees the connections its previous process held; a worker dialling again
/// from the same process keeps its one connection.
#[test]
fn a_restarted_sender_frees_the_connections_of_its_previous_process() {
    let (_engine, _blog, fabric, mut rings) = backup(8);
    let nic_p = fabric.attach(NodeId(0)).unwrap();
    let all = rings.connections_free();
    assert!(all >= 8, "{all}");
    let dial = |rings: &mut RedoRings<_>, worker: u16, incarnation: u64| {
        let s = Sender::new(&nic_p, redo::VARIANT, redo::flow()).unwrap();
        rings
            .accept(
                s.qp_addr(),
                PathKey {
                    worker,
                    incarnation,
                },
            )
            .unwrap()
            .conn
    };
    let w0 = dial(&mut rings, 0, 7);
    let w1 = dial(&mut rings, 1, 7);
    let w2 = dial(&mut rings, 2, 7);
    assert_eq!(rings.connections_free(), all - 3);
    assert_eq!(dial(&mut rings, 1, 7), w1, "the same worker dialling again");
    assert_eq!(rings.connections_free(), all - 3);
    // The sender restarts with one worker: its old process's others are freed.
    assert_eq!(dial(&mut rings, 0, 8), w0);
    assert_eq!(rings.connections_free(), all - 1);
    let _ = w2;
}
