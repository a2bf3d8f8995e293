//! Connection set-up between endpoints: the connection manager (after rdma_cm)
//! that resolves a node's service (a worker, a role) and exchanges queue pair
//! addresses. In one process ([`Directory::new`]) requests travel on channels; a
//! process deployment ([`Directory::network`]) also listens on a TCP address and
//! reaches services of other processes through theirs (`crate::netcm`): the same
//! acceptors serve both, so no role knows which it runs on.
//!
//! A worker registers an acceptor under (node, worker) and, in its poll loop, takes
//! connection requests from it: it opens a queue pair, connects it to the caller's,
//! and replies with its own address. The caller then connects its queue pair. No
//! worker blocks: the caller waits on the reply (a client at start-up), the worker
//! answers when it next polls.
//!
//! Not every service is an RPC endpoint: a replication path connects a sender's
//! queue pair to a receiver's (a Rowan receiver's SRQ, a backup's passive log).
//! Those exchange raw queue pairs ([`Directory::request`], [`Acceptor::serve_pending`]),
//! with up to [`PRIVATE_BYTES_MAX`] bytes of private data each way, as `rdma_cm`
//! carries a connection's private data: a remote log's region descriptor travels
//! in the answer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::RwLock;
use rowankv_fabric::{Nic, QpAddr};
use rowankv_types::NodeId;

use crate::endpoint::{Endpoint, PeerId};
use crate::netcm::{FabricPeers, Network, Resolver, Route};

/// Largest private data a request or an answer carries.
pub const PRIVATE_BYTES_MAX: usize = 256;

/// A request to connect to a service.
pub struct ConnectRequest {
    /// The caller's queue pair.
    pub from: QpAddr,
    /// What the caller tells the service (at most [`PRIVATE_BYTES_MAX`] bytes).
    pub private: Vec<u8>,
    pub reply: Sender<Result<Accepted, String>>,
}

/// A service's answer: its queue pair, connected to the caller's, and what it
/// tells the caller (at most [`PRIVATE_BYTES_MAX`] bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub qp: QpAddr,
    pub private: Vec<u8>,
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
                if let Err(e) = ep.connect(peer, req.from) {
                    ep.close(peer);
                    return Err(e);
                }
                Ok((peer, addr))
            });
            match result {
                Ok((peer, addr)) => {
                    peers.push(peer);
                    let _ = req.reply.send(Ok(Accepted {
                        qp: addr,
                        private: Vec::new(),
                    }));
                }
                Err(e) => {
                    let _ = req.reply.send(Err(e.to_string()));
                }
            }
        }
        peers
    }

    /// Answer every pending request with `accept` (the caller's queue pair
    /// and private data → this side's, or why not); returns how many were
    /// accepted. An answer with too much private data is a refusal.
    pub fn serve_pending(
        &self,
        mut accept: impl FnMut(QpAddr, &[u8]) -> Result<Accepted, String>,
    ) -> usize {
        let mut accepted = 0;
        while let Ok(req) = self.rx.try_recv() {
            let answer = check_private(&req.private)
                .and_then(|()| accept(req.from, &req.private))
                .and_then(|a| check_private(&a.private).map(|()| a));
            accepted += usize::from(answer.is_ok());
            let _ = req.reply.send(answer);
        }
        accepted
    }
}

/// Private data within its bound.
pub(crate) fn check_private(private: &[u8]) -> Result<(), String> {
    if private.len() > PRIVATE_BYTES_MAX {
        return Err(format!(
            "{} bytes of private data, more than {PRIVATE_BYTES_MAX}",
            private.len()
        ));
    }
    Ok(())
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

/// Registered acceptors by (node, worker), and in a process deployment the
/// network side. Cheap to clone.
#[derive(Clone, Default)]
pub struct Directory {
    inner: Arc<RwLock<Acceptors>>,
    network: Option<Arc<Network>>,
}

impl Directory {
    /// Connection set-up inside one process.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connection set-up for a process: this process's services are also offered
    /// on `listen` (TCP) to peers that prove `cluster_id` and `secret`, and
    /// services of other nodes are reached at the addresses given to
    /// [`Directory::set_address`].
    ///
    /// `fabric`: on the `tcp` fabric, where this process's engine listens and the
    /// book its engines find peers in; every exchange then tells the other side
    /// where this process's engine is, and records where the other's is, before
    /// either connects a queue pair.
    pub fn network(
        cluster_id: u64,
        secret: &[u8],
        listen: SocketAddr,
        fabric: Option<FabricPeers>,
    ) -> std::io::Result<Self> {
        let inner: Arc<RwLock<Acceptors>> = Arc::default();
        let routes = inner.clone();
        let route: Route = Arc::new(move |node, service| {
            let routes = routes.read();
            match node {
                Some(node) => routes.get(&(node, service)).cloned(),
                // Whichever node of this process offers it (a CM's role).
                None => routes
                    .iter()
                    .filter(|((_, s), _)| *s == service)
                    .min_by_key(|((n, _), _)| *n)
                    .map(|(_, tx)| tx.clone()),
            }
        });
        let network = Network::start(cluster_id, secret.to_vec(), listen, route, fabric)?;
        Ok(Directory {
            inner,
            network: Some(Arc::new(network)),
        })
    }

    /// Where this process listens for connection requests (network only).
    pub fn local_address(&self) -> Option<SocketAddr> {
        self.network.as_ref().map(|n| n.local_address())
    }

    /// Where `node`'s process takes connection requests (`host:port`), for a
    /// network directory; ignored in one process.
    pub fn set_address(&self, node: NodeId, address: impl Into<String>) {
        if let Some(n) = &self.network {
            n.set_address(node, address.into(), false);
        }
    }

    /// Name the process at `address` `node` here, whatever node it really is:
    /// requests to `node` reach whichever node of that process offers the
    /// service, and the answer's queue pair names the real node. How a process
    /// that knows only the CMs' addresses reaches them. Network only.
    pub fn set_alias(&self, node: NodeId, address: impl Into<String>) {
        if let Some(n) = &self.network {
            n.set_address(node, address.into(), true);
        }
    }

    /// Whether `node` is a real node found behind an alias
    /// ([`Directory::set_alias`]): it answered a request sent to one (a
    /// CM that this process reached by address).
    pub fn is_behind_alias(&self, node: NodeId) -> bool {
        self.network
            .as_ref()
            .is_some_and(|n| n.is_behind_alias(node))
    }

    /// Where to find the connection-manager address of a node that
    /// [`Directory::set_address`] was not told (a server: the addresses of the
    /// members of its current configuration). Network only.
    pub fn set_resolver(&self, resolver: Resolver) {
        if let Some(n) = &self.network {
            n.set_resolver(resolver);
        }
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
        let result = reply_rx
            .recv_timeout(timeout)
            .map_err(|_| ConnectError::Timeout {
                node,
                worker,
                timeout,
            })
            .and_then(|r| r.map_err(ConnectError::Refused))
            .and_then(|remote| Ok(ep.connect(peer, remote.qp)?));
        if result.is_err() {
            ep.close(peer);
        }
        result.map(|()| peer)
    }

    /// Start connecting without waiting: the worker's answer arrives on the
    /// returned channel; call [`Endpoint::connect`] with its queue pair.
    pub fn connect_async<N: Nic>(
        &self,
        ep: &mut Endpoint<N>,
        node: NodeId,
        worker: u16,
    ) -> Result<(PeerId, Receiver<Result<Accepted, String>>), ConnectError> {
        if !self.reaches(node, worker) {
            return Err(ConnectError::Unknown { node, worker });
        }
        let (peer, addr) = ep.open()?;
        match self.request(node, worker, addr, Vec::new()) {
            Ok(reply) => Ok((peer, reply)),
            Err(e) => {
                ep.close(peer);
                Err(e)
            }
        }
    }

    /// Whether a request to `service` on `node` can be sent: it is registered
    /// here, or `node`'s process has an address.
    fn reaches(&self, node: NodeId, service: u16) -> bool {
        self.inner.read().contains_key(&(node, service))
            || self
                .network
                .as_ref()
                .is_some_and(|n| n.address(node).is_some())
    }

    /// Ask `service` on `node` to connect a queue pair of its own to `from`,
    /// telling it `private`; the answer (its queue pair and private data, or
    /// why not) arrives on the returned channel. The caller connects `from`
    /// to the answer's queue pair.
    pub fn request(
        &self,
        node: NodeId,
        service: u16,
        from: QpAddr,
        private: Vec<u8>,
    ) -> Result<Receiver<Result<Accepted, String>>, ConnectError> {
        check_private(&private).map_err(ConnectError::Refused)?;
        let local = self.inner.read().get(&(node, service)).cloned();
        let Some(tx) = local else {
            // Another process's service, through its listener.
            return self
                .network
                .as_ref()
                .and_then(|n| n.request(node, service, from, private))
                .ok_or(ConnectError::Unknown {
                    node,
                    worker: service,
                });
        };
        let (reply_tx, reply_rx) = channel::bounded(1);
        tx.send(ConnectRequest {
            from,
            private,
            reply: reply_tx,
        })
        .map_err(|_| ConnectError::Unknown {
            node,
            worker: service,
        })?;
        Ok(reply_rx)
    }
}
