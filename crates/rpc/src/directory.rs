//! Connection set-up between endpoints, in process: the stand-in for a connection
//! manager (rdma_cm) that resolves a node's worker and exchanges queue pair
//! addresses.
//!
//! A worker registers an acceptor under (node, worker) and, in its poll loop, takes
//! connection requests from it: it opens a queue pair, connects it to the caller's,
//! and replies with its own address. The caller then connects its queue pair. No
//! worker blocks: the caller waits on the reply (a client at start-up), the worker
//! answers when it next polls.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::RwLock;
use rowankv_fabric::{Nic, QpAddr};
use rowankv_types::NodeId;

use crate::endpoint::{Endpoint, PeerId};

/// A request to connect to a worker.
pub struct ConnectRequest {
    /// The caller's queue pair.
    pub from: QpAddr,
    pub reply: Sender<Result<QpAddr, String>>,
}

/// The worker side: where connection requests arrive.
pub struct Acceptor {
    rx: Receiver<ConnectRequest>,
}

impl Acceptor {
    /// Accept every pending request on `ep`; returns the peers connected.
    pub fn accept_pending<N: Nic>(&self, ep: &mut Endpoint<N>) -> Vec<PeerId> {
        let mut peers = Vec::new();
        while let Ok(req) = self.rx.try_recv() {
            let result = ep.open().and_then(|(peer, addr)| {
                ep.connect(peer, req.from)?;
                Ok((peer, addr))
            });
            match result {
                Ok((peer, addr)) => {
                    peers.push(peer);
                    let _ = req.reply.send(Ok(addr));
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e.to_string()));
                }
            }
        }
        peers
    }
}

/// Errors of connecting.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no worker {worker} on {node} is registered")]
    Unknown { node: NodeId, worker: u16 },
    #[error("worker {worker} on {node} did not answer within {timeout:?}")]
    Timeout {
        node: NodeId,
        worker: u16,
        timeout: Duration,
    },
    #[error("worker refused the connection: {0}")]
    Refused(String),
    #[error("fabric: {0}")]
    Fabric(#[from] rowankv_fabric::FabricError),
}

/// Where to send a connection request for each (node, worker).
type Acceptors = HashMap<(NodeId, u16), Sender<ConnectRequest>>;

/// Registered acceptors by (node, worker). Cheap to clone.
#[derive(Clone, Default)]
pub struct Directory {
    inner: Arc<RwLock<Acceptors>>,
}

impl Directory {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register (or replace, after a restart) the acceptor of a worker.
    pub fn register(&self, node: NodeId, worker: u16) -> Acceptor {
        let (tx, rx) = channel::unbounded();
        self.inner.write().insert((node, worker), tx);
        Acceptor { rx }
    }

    /// Forget every worker of `node` (it crashed or left).
    pub fn unregister_node(&self, node: NodeId) {
        self.inner.write().retain(|(n, _), _| *n != node);
    }

    /// Open a queue pair on `ep`, ask the worker to connect to it, and connect it.
    /// Blocks the caller until the worker answers or `timeout` passes.
    pub fn connect<N: Nic>(
        &self,
        ep: &mut Endpoint<N>,
        node: NodeId,
        worker: u16,
        timeout: Duration,
    ) -> Result<PeerId, ConnectError> {
        let (peer, reply_rx) = self.connect_async(ep, node, worker)?;
        let remote = reply_rx
            .recv_timeout(timeout)
            .map_err(|_| ConnectError::Timeout {
                node,
                worker,
                timeout,
            })?
            .map_err(ConnectError::Refused)?;
        ep.connect(peer, remote)?;
        Ok(peer)
    }

    /// Start connecting without waiting: the worker's answer arrives on the
    /// returned channel; call [`Endpoint::connect`] with it.
    pub fn connect_async<N: Nic>(
        &self,
        ep: &mut Endpoint<N>,
        node: NodeId,
        worker: u16,
    ) -> Result<(PeerId, Receiver<Result<QpAddr, String>>), ConnectError> {
        let tx = self
            .inner
            .read()
            .get(&(node, worker))
            .cloned()
            .ok_or(ConnectError::Unknown { node, worker })?;
        let (peer, addr) = ep.open()?;
        let (reply_tx, reply_rx) = channel::bounded(1);
        tx.send(ConnectRequest {
            from: addr,
            reply: reply_tx,
        })
        .map_err(|_| ConnectError::Unknown { node, worker })?;
        Ok((peer, reply_rx))
    }
}
