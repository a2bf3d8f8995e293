//! The loopback fabric with its wire model (`rowankv_fabric::timing`): the whole
//! conformance suite still holds (the model moves when things happen, never what
//! happens), and landings and completions come at the model's due times, driven
//! by whoever polls or by the fabric's engine when nobody does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_fabric::conformance::{connected_pair, Backend, EndpointConfig};
use rowankv_fabric::{
    Access, Completion, CompletionQueue, DramMemory, LoopbackFabric, Nic, Op, Placement, QueuePair,
    RegionMemory, SharedReceiveQueue, WireModel, WorkRequest,
};
use rowankv_types::{Clock, ManualClock, NodeId};

/// A model with round numbers: 1 µs one way, 100 ns a message, 1 ns a byte,
/// 500 ns to persist, 7 µs of SFlush lookup.
const MODEL: WireModel = WireModel {
    one_way_ns: 1_000,
    nic_msgs_per_sec: 10_000_000,
    link_bytes_per_sec: 1_000_000_000,
    dma_persist_ns: 500,
    lookup_ns: 7_000,
};

struct ModelledBackend;

impl Backend for ModelledBackend {
    type F = LoopbackFabric;

    fn fabric(&self) -> LoopbackFabric {
        LoopbackFabric::with_model(MODEL).unwrap()
    }

    /// The three cases on a manual clock check the exact deadlines of the
    /// link-delay fault (a request due when the clock has moved by the delay),
    /// which the model extends by its own costs on purpose (a delay adds to
    /// each one-way trip): they run unmodelled here, and the model's own due
    /// times are checked, on a manual clock, by the tests below.
    fn fabric_with_clock(&self, clock: Arc<dyn Clock>) -> LoopbackFabric {
        LoopbackFabric::with_clock(clock)
    }
}

rowankv_fabric::conformance_suite!(ModelledBackend);

struct Setup {
    clock: Arc<ManualClock>,
    _fabric: LoopbackFabric,
    pair: rowankv_fabric::conformance::Pair<rowankv_fabric::LoopbackNic>,
    target: rowankv_fabric::MemoryRegion,
}

/// Two nodes on a modelled fabric measured on a manual clock at 0, and a 64 KiB
/// region at the target.
fn setup() -> Setup {
    let clock = ManualClock::new();
    let fabric = LoopbackFabric::with_clock_and_model(clock.clone(), MODEL).unwrap();
    let pair = connected_pair(
        &fabric,
        (NodeId(1), EndpointConfig::single()),
        (NodeId(2), EndpointConfig::single()),
        64,
    );
    let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(1 << 16));
    let target = pair
        .b
        .nic
        .register(memory, 0, 1 << 16, Access::ALL)
        .unwrap();
    Setup {
        clock,
        _fabric: fabric,
        pair,
        target,
    }
}

/// Move the manual clock forward to `ns`.
fn to_ns(clock: &ManualClock, ns: u64) {
    let now = clock.now_ns();
    assert!(ns >= now, "the clock only moves forward ({now} -> {ns})");
    clock.advance_ns(ns - now);
}

fn poll<Q: CompletionQueue>(cq: &Q) -> Vec<Completion> {
    let mut out = vec![Completion::BLANK; 64];
    let n = cq.poll(&mut out).unwrap();
    out.truncate(n);
    out
}

fn byte(mr: &rowankv_fabric::MemoryRegion, at: usize) -> u8 {
    let mut b = [0u8; 1];
    mr.read(at, &mut b);
    b[0]
}

#[test]
fn a_write_lands_and_completes_at_the_models_due_times_not_before() {
    let s = setup();
    let data = [7u8; 1_000];
    s.pair
        .qa
        .post_send(&[WorkRequest::new(
            1,
            Op::Write {
                data: &data,
                remote: s.target.remote().at(0),
                imm: None,
            },
        )])
        .unwrap();
    // Sent: 100 ns + 1000 ns; wire 1000 ns; target 100 ns: lands at 2200 ns,
    // completes one way later, at 3200 ns.
    to_ns(&s.clock, 2_199);
    assert!(poll(&s.pair.a.send_cq).is_empty());
    assert_eq!(byte(&s.target, 0), 0, "landed before its due time");
    to_ns(&s.clock, 2_200);
    assert!(poll(&s.pair.a.send_cq).is_empty(), "completed on landing");
    assert_eq!(byte(&s.target, 999), 7, "not landed at its due time");
    to_ns(&s.clock, 3_199);
    assert!(poll(&s.pair.a.send_cq).is_empty());
    to_ns(&s.clock, 3_200);
    let c = poll(&s.pair.a.send_cq);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].wr_id, 1);
}

#[test]
fn a_flush_after_a_send_pays_the_lookup_and_the_persist_dma() {
    let s = setup();
    // A SEND needs a receive buffer at the target.
    s.pair
        .b
        .srq
        .post_recv(&[rowankv_fabric::RecvBuffer {
            wr_id: 9,
            mr: s.target.clone(),
            offset: 4096,
            len_bytes: 4096,
        }])
        .unwrap();
    let data = [1u8; 100];
    let flush = |wr_id| {
        WorkRequest::new(
            wr_id,
            Op::Flush {
                remote: s.target.remote().at(4096),
                len: 100,
                placement: Placement::Persistence,
            },
        )
    };
    s.pair
        .qa
        .post_send(&[
            WorkRequest::new(
                1,
                Op::Send {
                    data: &data,
                    imm: None,
                },
            ),
            flush(2),
        ])
        .unwrap();
    // SEND: leaves at 200, lands at 200 + 1000 + 100 = 1300; done at 2300.
    // FLUSH: posted at 0, lookup 7000, leaves at 7100, lands 7100 + 1000 +
    // 100 + 500 (persist) = 8700; done at 9700.
    to_ns(&s.clock, 1_300);
    let got = poll(&s.pair.b.recv_cq);
    assert_eq!(got.len(), 1, "the receiver's poll lands the SEND");
    to_ns(&s.clock, 9_699);
    assert_eq!(poll(&s.pair.a.send_cq).len(), 1, "only the SEND is done");
    to_ns(&s.clock, 9_700);
    assert_eq!(poll(&s.pair.a.send_cq).len(), 1, "the FLUSH is done");
}

/// A SEND persisted by a sender-initiated flush is SFlush in one request:
/// the lookup, then the message, then the persist DMA at the target.
#[test]
fn a_sender_flushed_send_pays_the_lookup_and_the_persist_dma() {
    let s = setup();
    s.pair
        .b
        .srq
        .post_recv(&[rowankv_fabric::RecvBuffer {
            wr_id: 9,
            mr: s.target.clone(),
            offset: 0,
            len_bytes: 4096,
        }])
        .unwrap();
    let data = [2u8; 100];
    s.pair
        .qa
        .post_send(&[WorkRequest::new(
            1,
            Op::Send {
                data: &data,
                imm: None,
            },
        )
        .persisted_by_sender_flush()])
        .unwrap();
    // Lookup 7000, leaves at 7000 + 100 + 100, lands 7200 + 1000 + 100 + 500
    // (persist) = 8800; done at 9800.
    to_ns(&s.clock, 8_799);
    assert!(
        poll(&s.pair.b.recv_cq).is_empty(),
        "landed before the lookup and the DMA"
    );
    to_ns(&s.clock, 8_800);
    assert_eq!(poll(&s.pair.b.recv_cq).len(), 1);
    to_ns(&s.clock, 9_799);
    assert!(poll(&s.pair.a.send_cq).is_empty());
    to_ns(&s.clock, 9_800);
    assert_eq!(poll(&s.pair.a.send_cq).len(), 1);
}

/// A SEND persisted by a READ behind it (Rowan's, seed 000 §2.2) pays the
/// persist DMA but no lookup: nobody needs to learn where it landed.
#[test]
fn a_send_persisted_by_a_read_pays_the_persist_dma_but_no_lookup() {
    let s = setup();
    s.pair
        .b
        .srq
        .post_recv(&[rowankv_fabric::RecvBuffer {
            wr_id: 9,
            mr: s.target.clone(),
            offset: 0,
            len_bytes: 4096,
        }])
        .unwrap();
    let data = [2u8; 100];
    s.pair
        .qa
        .post_send(&[WorkRequest::new(
            1,
            Op::Send {
                data: &data,
                imm: None,
            },
        )
        .persisted()])
        .unwrap();
    // Leaves at 100 + 100, lands 200 + 1000 + 100 + 500 (persist) = 1800;
    // done at 2800.
    to_ns(&s.clock, 1_799);
    assert!(poll(&s.pair.b.recv_cq).is_empty(), "landed before the DMA");
    to_ns(&s.clock, 1_800);
    assert_eq!(poll(&s.pair.b.recv_cq).len(), 1);
    to_ns(&s.clock, 2_799);
    assert!(poll(&s.pair.a.send_cq).is_empty());
    to_ns(&s.clock, 2_800);
    assert_eq!(poll(&s.pair.a.send_cq).len(), 1);
}

#[test]
fn a_nics_message_rate_bounds_many_small_writes() {
    let s = setup();
    let one = [3u8; 8];
    let wrs: Vec<WorkRequest> = (0..50)
        .map(|i| {
            WorkRequest::new(
                i,
                Op::Write {
                    data: &one,
                    remote: s.target.remote().at(i * 8),
                    imm: None,
                },
            )
        })
        .collect();
    s.pair.qa.post_send(&wrs).unwrap();
    // Each takes 108 ns of the sender's NIC: the 50th leaves at 5400 ns and
    // completes at 5400 + 1000 + 100 + 1000 = 7500 ns.
    to_ns(&s.clock, 4_000);
    let early = poll(&s.pair.a.send_cq).len();
    assert!(early > 0 && early < 50, "{early} done at 4 µs");
    to_ns(&s.clock, 7_499);
    assert_eq!(early + poll(&s.pair.a.send_cq).len(), 49);
    to_ns(&s.clock, 7_500);
    assert_eq!(poll(&s.pair.a.send_cq).len(), 1);
}

#[test]
fn the_engine_lands_a_write_that_nobody_polls_for() {
    let fabric = LoopbackFabric::with_model(WireModel::CONNECTX5).unwrap();
    assert_eq!(fabric.model(), Some(WireModel::CONNECTX5));
    let pair = connected_pair(
        &fabric,
        (NodeId(1), EndpointConfig::single()),
        (NodeId(2), EndpointConfig::single()),
        8,
    );
    let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(4096));
    let target = pair.b.nic.register(memory, 0, 4096, Access::ALL).unwrap();
    let data = [5u8; 64];
    pair.qa
        .post_send(&[WorkRequest::new(
            1,
            Op::Write {
                data: &data,
                remote: target.remote().at(0),
                imm: None,
            },
        )])
        .unwrap();
    // Nobody polls: the engine thread carries it out.
    let deadline = Instant::now() + Duration::from_secs(5);
    while byte(&target, 63) != 5 {
        assert!(Instant::now() < deadline, "the write never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_model_with_a_zero_rate_is_refused() {
    let bad = WireModel {
        link_bytes_per_sec: 0,
        ..MODEL
    };
    assert!(LoopbackFabric::with_model(bad).is_err());
}
