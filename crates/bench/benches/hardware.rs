//! Micro-benchmarks of the hardware layer, side by side in one run:
//! - the loopback fabric's verbs at 64 B (WRITE, SEND into a multi-packet SRQ, READ,
//!   compare-and-swap), with 1 and 2 threads (each thread its own queue pair);
//! - a persisted 64 B loopback WRITE into an `emulated` PM pool next to the plain
//!   64 B memcpy + clwb + sfence it stands for (`raw_store_persist`), whose ratio is
//!   the fabric's overhead over the bare persist.
//!
//! Pool append costs (write + persist at 64 B and 256 B) are in
//! `crates/pmem/benches/persist.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, Fabric, LocalAddr, LoopbackCq,
    LoopbackFabric, LoopbackNic, LoopbackQp, LoopbackSrq, MemoryRegion, Nic, Op, QueuePair,
    RecvBuffer, RegionMemory, RemoteRegion, SharedReceiveQueue, SrqConfig, WcStatus, WorkRequest,
};
use rowankv_pmem::{raw_store_persist, Medium, Pool, PoolOptions};
use rowankv_types::NodeId;

const REGION_BYTES: usize = 16 << 20;
const MP_BUFFER_BYTES: usize = 1 << 20;
const MP_BUFFERS: usize = 8;

/// One initiator queue pair and what it needs.
struct Lane {
    qp: LoopbackQp,
    cq: LoopbackCq,
    local: MemoryRegion,
    /// For SEND lanes: the receiver's SRQ and the buffer region it recycles.
    srq: Option<(LoopbackSrq, MemoryRegion)>,
    next_buffer: usize,
}

struct Rig {
    _fabric: LoopbackFabric,
    _targets: Vec<LoopbackQp>,
    remote: RemoteRegion,
    lanes: Vec<Lane>,
}

fn rig(lanes: usize, target_memory: Arc<dyn RegionMemory>) -> Rig {
    let fabric = LoopbackFabric::new();
    let a: LoopbackNic = fabric.attach(NodeId(1)).unwrap();
    let b: LoopbackNic = fabric.attach(NodeId(2)).unwrap();
    let remote_mr = b
        .register(target_memory, 0, REGION_BYTES, Access::ALL)
        .unwrap();
    let mut targets = Vec::new();
    let mut out = Vec::new();
    for _ in 0..lanes {
        let cq = a.create_cq(CqKind::Bounded { capacity: 256 }).unwrap();
        let qp = a.create_qp(&cq, &cq, None, 64).unwrap();
        let tcq = b.create_cq(CqKind::Ring { capacity: 64 }).unwrap();
        let srq = b.create_srq(SrqConfig::multi_packet(MP_BUFFERS)).unwrap();
        let bufmem: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(MP_BUFFER_BYTES * MP_BUFFERS));
        let bufs = b
            .register(bufmem, 0, MP_BUFFER_BYTES * MP_BUFFERS, Access::NONE)
            .unwrap();
        let target = b.create_qp(&tcq, &tcq, Some(&srq), 16).unwrap();
        target.connect(qp.addr()).unwrap();
        qp.connect(target.addr()).unwrap();
        let local_mem: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(4096));
        let local = a.register(local_mem, 0, 4096, Access::NONE).unwrap();
        targets.push(target);
        out.push(Lane {
            qp,
            cq,
            local,
            srq: Some((srq, bufs)),
            next_buffer: 0,
        });
    }
    Rig {
        _fabric: fabric,
        _targets: targets,
        remote: remote_mr.remote(),
        lanes: out,
    }
}

#[derive(Clone, Copy)]
enum Verb {
    Write { persist: bool },
    Send,
    Read,
    Cas,
}

/// Issue `iters` operations of `verb` on one lane, each signaled and polled.
fn run_lane(lane: &mut Lane, remote: RemoteRegion, lane_index: usize, verb: Verb, iters: u64) {
    let payload = [0x5Au8; 64];
    let mut wc = [Completion::BLANK];
    let base = (lane_index * (REGION_BYTES / 4)) as u64;
    for i in 0..iters {
        let at = base + (i * 64) % (REGION_BYTES as u64 / 4);
        let op = match verb {
            Verb::Write { .. } => Op::Write {
                data: &payload,
                remote: remote.at(at),
                imm: None,
            },
            Verb::Send => {
                let (srq, bufs) = lane.srq.as_ref().unwrap();
                if srq.posted() < 2 {
                    let offset = (lane.next_buffer % MP_BUFFERS) * MP_BUFFER_BYTES;
                    lane.next_buffer += 1;
                    srq.post_recv(&[RecvBuffer {
                        wr_id: lane.next_buffer as u64,
                        mr: bufs.clone(),
                        offset,
                        len_bytes: MP_BUFFER_BYTES,
                    }])
                    .unwrap();
                }
                Op::Send {
                    data: &payload,
                    imm: None,
                }
            }
            Verb::Read => Op::Read {
                remote: remote.at(at),
                len: 64,
                local: LocalAddr {
                    mr: &lane.local,
                    offset: 0,
                },
            },
            Verb::Cas => Op::CompareSwap {
                remote: remote.at(base),
                expect: i,
                swap: i + 1,
                local: LocalAddr {
                    mr: &lane.local,
                    offset: 0,
                },
            },
        };
        let mut wr = WorkRequest::new(i, op);
        wr.persist = matches!(verb, Verb::Write { persist: true });
        lane.qp.post_send(&[wr]).unwrap();
        loop {
            if lane.cq.poll(&mut wc).unwrap() == 1 {
                assert_eq!(wc[0].status, WcStatus::Success);
                break;
            }
        }
    }
}

/// Time `iters` operations spread over the lanes, one OS thread per lane.
fn timed(rig: &mut Rig, verb: Verb, iters: u64) -> Duration {
    let lanes = rig.lanes.len() as u64;
    let remote = rig.remote;
    let start = Instant::now();
    std::thread::scope(|s| {
        for (i, lane) in rig.lanes.iter_mut().enumerate() {
            s.spawn(move || run_lane(lane, remote, i, verb, iters.div_ceil(lanes)));
        }
    });
    start.elapsed()
}

fn fabric_verbs(c: &mut Criterion) {
    let mut g = c.benchmark_group("loopback_64B");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for threads in [1usize, 2] {
        for (name, verb) in [
            ("write", Verb::Write { persist: false }),
            ("send_mp_srq", Verb::Send),
            ("read", Verb::Read),
            ("cas", Verb::Cas),
        ] {
            let mut r = rig(threads, Arc::new(DramMemory::new(REGION_BYTES)));
            g.bench_function(BenchmarkId::new(name, format!("{threads}thr")), |b| {
                b.iter_custom(|iters| timed(&mut r, verb, iters))
            });
        }
    }
    g.finish();
}

fn persisted_write_vs_bare_persist(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(rowankv_bench::dlwa::default_pool_dir()).unwrap();
    let pool = Pool::create(
        &dir.path().join("bench.pool"),
        PoolOptions::new(Medium::Emulated, REGION_BYTES),
    )
    .unwrap();
    let mut g = c.benchmark_group("persist_64B");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    let mut r = rig(1, pool.clone());
    g.bench_function("loopback_write_persisted", |b| {
        b.iter_custom(|iters| timed(&mut r, Verb::Write { persist: true }, iters))
    });
    let payload = [0x5Au8; 64];
    g.bench_function("memcpy_clwb_sfence", |b| {
        let mut at = 0usize;
        b.iter(|| {
            raw_store_persist(&pool, at, &payload);
            at = (at + 64) % REGION_BYTES;
        })
    });
    g.finish();
}

criterion_group!(benches, fabric_verbs, persisted_write_vs_bare_persist);
criterion_main!(benches);
