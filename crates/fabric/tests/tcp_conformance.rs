//! The fabric conformance suite run against `TcpFabric`: every node of a test is
//! an engine listening on 127.0.0.1, and every operation crosses a real TCP
//! connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_fabric::conformance::Backend;
use rowankv_fabric::{
    Access, CqKind, DramMemory, Fabric, FaultInjector, Nic, QueuePair, RecvBuffer, RegionMemory,
    SharedReceiveQueue, SrqConfig, TcpFabric,
};
use rowankv_types::{Clock, NodeId};

struct TcpBackend;

impl Backend for TcpBackend {
    type F = TcpFabric;

    fn fabric(&self) -> TcpFabric {
        TcpFabric::new()
    }

    fn fabric_with_clock(&self, clock: Arc<dyn Clock>) -> TcpFabric {
        TcpFabric::with_clock(clock)
    }
}

rowankv_fabric::conformance_suite!(TcpBackend);

/// Dropping the fabric and every handle stops the engines and frees the
/// registered memory (their threads exit; a process that builds many fabrics,
/// like a test binary, must not accumulate them).
#[test]
fn dropping_the_fabric_frees_registered_memory() {
    for crash in [
        None,
        Some(&[NodeId(2)][..]),
        Some(&[NodeId(1), NodeId(2)][..]),
    ] {
        let weak = connected_pair_then(|fabric| {
            for n in crash.unwrap_or_default() {
                fabric.crash_node(*n);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while weak.upgrade().is_some() {
            assert!(
                Instant::now() < deadline,
                "the registered memory outlived the fabric (crashed: {crash:?})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn connected_pair_then(then: impl FnOnce(&TcpFabric)) -> std::sync::Weak<dyn RegionMemory> {
    let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(1 << 16));
    let weak = Arc::downgrade(&memory);
    let fabric = TcpFabric::new();
    let a = fabric.attach(NodeId(1)).unwrap();
    let b = fabric.attach(NodeId(2)).unwrap();
    let mr = b.register(memory, 0, 1 << 16, Access::ALL).unwrap();
    let cq_a = a.create_cq(CqKind::Bounded { capacity: 64 }).unwrap();
    let cq_b = b.create_cq(CqKind::Bounded { capacity: 64 }).unwrap();
    let srq = b.create_srq(SrqConfig::single(8)).unwrap();
    srq.post_recv(&[RecvBuffer {
        wr_id: 1,
        mr: mr.clone(),
        offset: 0,
        len_bytes: 4096,
    }])
    .unwrap();
    let qa = a.create_qp(&cq_a, &cq_a, None, 8).unwrap();
    let qb = b.create_qp(&cq_b, &cq_b, Some(&srq), 8).unwrap();
    qa.connect(qb.addr()).unwrap();
    qb.connect(qa.addr()).unwrap();
    then(&fabric);
    weak
}
