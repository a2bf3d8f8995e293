//! A memory node: a registered persistent-memory pool served by its NIC alone.
//!
//! No application thread of a memory node touches data: it registers its pool
//! once per incarnation and accepts connections (the control path that `rdma_cm`
//! and the NIC's firmware do on hardware). Every read, write, CAS and flush of a
//! version is a one-sided operation of a client or of the metadata server.
//!
//! A crash is the fabric's (`FaultInjector::power_fail` on `loopback`, which hands
//! the pool to its crash simulator); [`MemoryNode::mark_crashed`] records it and
//! [`MemoryNode::restart`] re-attaches the node and registers the same pool again,
//! under a new incarnation: peers see their queue pairs fail and reconnect.

use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{
    Access, CqKind, Fabric, MemoryRegion, Nic, QueuePair, RegionMemory, RemoteRegion,
};
use rowankv_types::NodeId;

use crate::CloverError;

/// Bound on the connections one incarnation of a memory node accepts.
pub const ACCEPTED_MAX: usize = 4096;
/// Bound on a memory node's completion queue (its queue pairs post nothing).
const MN_CQ_CAPACITY: usize = 64;

/// A client's (or the metadata server's) connection to one memory node.
pub struct Connection<N: Nic> {
    pub qp: N::Qp,
    pub region: RemoteRegion,
    pub incarnation: u64,
}

struct Incarnation<F: Fabric> {
    nic: F::Nic,
    cq: <F::Nic as Nic>::Cq,
    region: MemoryRegion,
    accepted: Vec<<F::Nic as Nic>::Qp>,
}

/// One memory node. See the module documentation.
pub struct MemoryNode<F: Fabric> {
    id: NodeId,
    fabric: F,
    memory: Arc<dyn RegionMemory>,
    state: Mutex<(u64, Option<Incarnation<F>>)>,
}

impl<F: Fabric> MemoryNode<F> {
    /// Attach node `id` and register all of `memory` for remote read, write,
    /// atomics and persistent flush.
    pub fn start(
        fabric: F,
        id: NodeId,
        memory: Arc<dyn RegionMemory>,
    ) -> Result<Arc<Self>, CloverError> {
        let node = Arc::new(MemoryNode {
            id,
            fabric,
            memory,
            state: Mutex::new((0, None)),
        });
        node.restart()?;
        Ok(node)
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn memory(&self) -> &Arc<dyn RegionMemory> {
        &self.memory
    }

    /// The current incarnation, or `None` while the node is down.
    pub fn incarnation(&self) -> Option<u64> {
        let s = self.state.lock();
        s.1.as_ref().map(|_| s.0)
    }

    /// The fabric crashed the node: forget the incarnation (its regions and
    /// queue pairs died with it).
    pub fn mark_crashed(&self) {
        self.state.lock().1 = None;
    }

    /// Attach again and register the same memory: a new incarnation. A no-op
    /// if the node is up.
    pub fn restart(&self) -> Result<(), CloverError> {
        let mut s = self.state.lock();
        if s.1.is_some() {
            return Ok(());
        }
        let nic = self.fabric.attach(self.id)?;
        let region = nic.register(self.memory.clone(), 0, self.memory.len_bytes(), Access::ALL)?;
        let cq = nic.create_cq(CqKind::Bounded {
            capacity: MN_CQ_CAPACITY,
        })?;
        s.0 += 1;
        s.1 = Some(Incarnation {
            nic,
            cq,
            region,
            accepted: Vec::new(),
        });
        Ok(())
    }

    /// Accept a connection from `nic`: a queue pair on each side, connected.
    pub fn connect<N: Nic>(
        &self,
        nic: &N,
        cq: &N::Cq,
        send_depth: usize,
    ) -> Result<Connection<N>, CloverError> {
        let mut s = self.state.lock();
        let incarnation = s.0;
        let Some(inc) = s.1.as_mut() else {
            return Err(CloverError::NodeDown(self.id));
        };
        if inc.accepted.len() >= ACCEPTED_MAX {
            return Err(CloverError::Limit("connections accepted by a memory node"));
        }
        let qp = nic.create_qp(cq, cq, None, send_depth)?;
        let mine = inc.nic.create_qp(&inc.cq, &inc.cq, None, send_depth)?;
        mine.connect(qp.addr())?;
        qp.connect(mine.addr())?;
        inc.accepted.push(mine);
        Ok(Connection {
            qp,
            region: inc.region.remote(),
            incarnation,
        })
    }
}
