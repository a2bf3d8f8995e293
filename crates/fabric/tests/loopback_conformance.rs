//! The fabric conformance suite run against `LoopbackFabric`.

use std::sync::Arc;

use rowankv_fabric::conformance::Backend;
use rowankv_fabric::{
    Access, CqKind, DramMemory, Fabric, FaultInjector, LoopbackFabric, Nic, QueuePair, RecvBuffer,
    RegionMemory, SharedReceiveQueue, SrqConfig,
};
use rowankv_types::{Clock, NodeId};

struct LoopbackBackend;

impl Backend for LoopbackBackend {
    type F = LoopbackFabric;

    fn fabric(&self) -> LoopbackFabric {
        LoopbackFabric::new()
    }

    fn fabric_with_clock(&self, clock: Arc<dyn Clock>) -> LoopbackFabric {
        LoopbackFabric::with_clock(clock)
    }
}

rowankv_fabric::conformance_suite!(LoopbackBackend);

/// Connected queue pairs, an SRQ holding posted buffers and registered regions
/// reference each other inside the fabric; dropping the fabric and every handle
/// must free the registered memory (a whole pool in a server), or a process
/// that builds many clusters (the simulator) runs out of memory.
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
        assert!(
            weak.upgrade().is_none(),
            "the registered memory outlived the fabric (crashed: {crash:?})"
        );
    }
}

/// Two connected nodes, node 2 with an SRQ holding a buffer of a registered
/// region; `then` runs on the fabric before everything is dropped. Returns a weak
/// handle to the region's memory.
fn connected_pair_then(then: impl FnOnce(&LoopbackFabric)) -> std::sync::Weak<dyn RegionMemory> {
    let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(1 << 16));
    let weak = Arc::downgrade(&memory);
    let fabric = LoopbackFabric::new();
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
