//! `TcpFabric`: nodes in separate processes or hosts, connected by TCP.
//!
//! Each attached node runs a **NIC engine** on threads of its own, never the
//! application's: a listener thread accepts connections on the node's TCP address,
//! and one engine thread per inbound connection carries out the operations that
//! arrive on it — WRITE, WRITE-with-immediate, READ, compare-and-swap and
//! fetch-and-add on the node's registered memory, and SENDs landed into its
//! (multi-packet) shared receive queues — exactly as an RNIC's DMA engine would: no
//! application thread takes part. The initiating side of each queue pair has a
//! sender thread (holding requests back for an injected link delay, then writing
//! them to the connection, pipelined) and a response reader thread per connection
//! (completing requests in posting order). The wire format is
//! `docs/format/tcp-fabric.md` ([`wire`]).
//!
//! **Connections.** A queue pair's `connect(remote)` opens one TCP connection from
//! this queue pair to the remote node's engine and binds it to the remote queue
//! pair; that connection carries this queue pair's requests and their responses,
//! nothing else. A connected pair of queue pairs therefore uses two connections,
//! one per direction (each end's requests travel on its own connection). This is
//! the simplest arrangement that keeps RC semantics per queue pair (ordering,
//! error state, reset) with no multiplexing state to get wrong; its cost is a
//! socket and two threads per queue pair, which is fine for RowanKV's queue pair
//! counts (workers × peers).
//!
//! **RC semantics.** Requests of a queue pair are written to its connection in
//! posting order and executed by one engine thread in that order. A completion is
//! generated only when the target's response arrives, i.e. once the operation is
//! done at the target; with the persistence flag, the target persists the landed
//! range through the region's memory (`RegionMemory::dma_persist`) before it
//! answers. A remote error (wrong rkey, out of bounds, missing right, misaligned
//! atomic, no receive buffer, message too large) changes nothing at the target,
//! which answers with the error and executes nothing more from that connection;
//! the initiator completes the request with the error, moves the queue pair to the
//! error state, flushes everything behind it and drops the connection. `reset`
//! returns to ready; the next request opens a fresh connection. A broken
//! connection (peer process killed, socket reset, listener gone) fails the
//! outstanding requests the way loopback's crash does: the oldest unanswered one
//! with `RetryExceeded`, the rest flushed; with nothing outstanding the queue pair
//! stays ready and its next request fails with `RetryExceeded` if the peer cannot
//! be reached again. A peer that hangs without closing its sockets (stopped,
//! partitioned) fails the connection once a response is overdue by
//! `TcpConfig::response_timeout`; an idle connection may stay silent.
//!
//! **Handles.** As in loopback, a queue pair whose handle is dropped (without
//! `close`) still receives until its node goes down; its outbound connection and
//! threads go once its last request has completed. When the last handle of a node
//! (its NIC and queue pairs) is dropped, the engine stops as if crashed and its
//! threads exit.
//!
//! **Authentication.** A connection is accepted only from a peer that proves the
//! cluster id and the shared secret of the configuration: the target sends a
//! random challenge, the initiator answers with an HMAC-SHA256 over the challenge,
//! its own nonce, both queue pair addresses and the cluster id, keyed with the
//! secret; the target checks it in constant time and proves itself back the same
//! way. A wrong or missing proof is refused and logged (`tracing`, warn). The
//! handshake authenticates the peer; it does not encrypt or sign the frames after
//! it (run the fabric on a private network, or under a VPN, where that matters).
//!
//! **Faults.** `FaultInjector` works through the fabric's own table, which every
//! engine of this process consults: a cut link fails requests both where they are
//! issued and where they arrive; a delay holds a request in its sender thread
//! until the injected clock has passed its deadline (requests behind it wait, as
//! in loopback); `crash_node` closes the node's listener and every connection it
//! has, so its peers see their requests fail; `power_fail` also hands each
//! registered memory to its crash model once. In a deployment the table only
//! covers the nodes of this process.
//!
//! Where it differs from loopback (whose semantics it otherwise keeps, case for
//! case, through the conformance suite):
//! - a frame carries at most [`wire::MAX_PAYLOAD`] bytes: a SEND or WRITE with more
//!   data, or a READ of more, is refused by `post_send` with `Invalid`;
//! - an error in the handshake of `connect` (wrong secret, wrong cluster) is
//!   reported as `FabricError::Invalid` (the verbs error type has no variant for
//!   authentication);
//! - a restarted *process* numbers its keys and queue pairs from a random start
//!   (`TcpConfig::randomize_names`), so a stale peer's key or queue pair address is
//!   very unlikely, though not certain, to name something of the new incarnation;
//!   in one process (`TcpFabric::new`) numbering continues across re-attaches, as
//!   in loopback.

pub mod wire;

mod engine;
mod qp;
mod queues;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rowankv_types::{Clock, NodeId, QpNum, Rkey, SystemClock};

use crate::memory::{PowerFailure, RegionMemory};
use crate::verbs::*;

pub use qp::TcpQp;
pub use queues::{TcpCq, TcpSrq};
pub use wire::Credentials;

use qp::QpInner;
use queues::{CqInner, SrqInner};

/// The cluster id of [`TcpFabric::new`]'s test fabrics.
pub const TEST_CLUSTER_ID: u64 = 0x7E57_C1A5_7E12_0001;
/// The shared secret of [`TcpFabric::new`]'s test fabrics. Never use it in a
/// deployment.
pub const TEST_SECRET: &[u8] = b"rowankv tcp fabric test secret, never deploy";

/// Where each node's engine listens: a table filled by `attach` (for the nodes of
/// this process) and by whoever knows the cluster (the configuration, the CM),
/// with an optional resolver asked for nodes the table does not hold. Cheap to
/// clone; clones share the table.
#[derive(Clone, Default)]
pub struct AddressBook {
    table: Arc<RwLock<HashMap<NodeId, SocketAddr>>>,
    resolver: Option<Arc<Resolver>>,
}

type Resolver = dyn Fn(NodeId) -> Option<SocketAddr> + Send + Sync;

impl std::fmt::Debug for AddressBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressBook")
            .field("table", &*self.table.read())
            .field("resolver", &self.resolver.is_some())
            .finish()
    }
}

impl AddressBook {
    pub fn new() -> Self {
        Self::default()
    }

    /// A book that asks `resolve` for nodes its table does not hold.
    pub fn with_resolver(
        resolve: impl Fn(NodeId) -> Option<SocketAddr> + Send + Sync + 'static,
    ) -> Self {
        AddressBook {
            table: Arc::default(),
            resolver: Some(Arc::new(resolve)),
        }
    }

    pub fn insert(&self, node: NodeId, addr: SocketAddr) {
        self.table.write().insert(node, addr);
    }

    pub fn remove(&self, node: NodeId) {
        self.table.write().remove(&node);
    }

    pub fn get(&self, node: NodeId) -> Option<SocketAddr> {
        if let Some(a) = self.table.read().get(&node) {
            return Some(*a);
        }
        self.resolver.as_ref().and_then(|r| r(node))
    }
}

/// Configuration of a [`TcpFabric`].
#[derive(Clone)]
pub struct TcpConfig {
    /// Proved by every connection's handshake, with the secret.
    pub cluster_id: u64,
    /// The shared secret (non-empty; 32 random bytes are plenty).
    pub secret: Vec<u8>,
    /// Where `attach` binds a node's engine; port 0 picks a free port. The bound
    /// address is recorded in the book (an unspecified IP as 127.0.0.1: a process
    /// that binds 0.0.0.0 publishes its own reachable address through the book).
    pub listen: SocketAddr,
    pub book: AddressBook,
    /// Link delays are measured on this clock.
    pub clock: Arc<dyn Clock>,
    /// Bound on opening a TCP connection.
    pub connect_timeout: Duration,
    /// Bound on each read and write of the handshake.
    pub handshake_timeout: Duration,
    /// Bound on writing requests and responses once connected (a peer that stops
    /// reading fails the connection after it).
    pub write_timeout: Duration,
    /// Bound on waiting for a response: a connection that owes one and stays
    /// silent this long fails (its oldest request completes with
    /// `RetryExceeded`), as an RC queue pair's transport retries run out. An
    /// idle connection may stay silent for ever.
    pub response_timeout: Duration,
    /// Start key and queue pair numbering at a random point (processes).
    pub randomize_names: bool,
}

impl std::fmt::Debug for TcpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConfig")
            .field("cluster_id", &self.cluster_id)
            .field("secret", &"<redacted>")
            .field("listen", &self.listen)
            .field("book", &self.book)
            .field("connect_timeout", &self.connect_timeout)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("write_timeout", &self.write_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("randomize_names", &self.randomize_names)
            .finish()
    }
}

impl TcpConfig {
    /// A process's configuration: engines bind `listen`, peers are found in `book`.
    pub fn new(cluster_id: u64, secret: &[u8], listen: SocketAddr, book: AddressBook) -> Self {
        TcpConfig {
            cluster_id,
            secret: secret.to_vec(),
            listen,
            book,
            clock: SystemClock::new(),
            connect_timeout: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(30),
            response_timeout: Duration::from_secs(10),
            randomize_names: true,
        }
    }

    /// The configuration of the in-process test fabric: loopback addresses, the
    /// test cluster id and secret, numbering continued across re-attaches.
    pub fn local_test(clock: Arc<dyn Clock>) -> Self {
        TcpConfig {
            clock,
            randomize_names: false,
            ..Self::new(
                TEST_CLUSTER_ID,
                TEST_SECRET,
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                AddressBook::new(),
            )
        }
    }
}

// ---------------------------------------------------------------------------
// The fabric and its fault table

/// The tcp fabric. Cheap to clone; clones share the nodes, the book and the
/// fault table.
#[derive(Clone)]
pub struct TcpFabric {
    shared: Arc<FabricShared>,
}

struct FabricShared {
    env: Arc<Env>,
    randomize_names: bool,
    nodes: Mutex<HashMap<NodeId, NodeSlot>>,
}

/// A node of this process: its engine (if running) and its numbering, which a
/// re-attached incarnation continues.
struct NodeSlot {
    core: Weak<NodeCore>,
    next_rkey: Arc<AtomicU32>,
    next_qpn: Arc<AtomicU32>,
}

/// What every engine of the fabric shares.
pub(crate) struct Env {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) book: AddressBook,
    pub(crate) cred: Credentials,
    listen: SocketAddr,
    pub(crate) connect_timeout: Duration,
    pub(crate) handshake_timeout: Duration,
    pub(crate) write_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) faults: Faults,
}

#[derive(Clone, Copy, Debug, Default)]
struct Link {
    cut: bool,
    delay_ns: u64,
}

fn link_key(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// The fault table: cut links and delays between pairs of nodes.
#[derive(Default)]
pub(crate) struct Faults {
    links: RwLock<HashMap<(NodeId, NodeId), Link>>,
    /// Set once any link was cut or delayed, so the common path skips the map.
    touched: AtomicBool,
}

impl Faults {
    fn link(&self, a: NodeId, b: NodeId) -> Link {
        if !self.touched.load(Ordering::Acquire) {
            return Link::default();
        }
        self.links
            .read()
            .get(&link_key(a, b))
            .copied()
            .unwrap_or_default()
    }

    pub(crate) fn cut(&self, a: NodeId, b: NodeId) -> bool {
        self.link(a, b).cut
    }

    pub(crate) fn delay_ns(&self, a: NodeId, b: NodeId) -> u64 {
        self.link(a, b).delay_ns
    }

    fn update(&self, a: NodeId, b: NodeId, f: impl FnOnce(&mut Link)) {
        let mut links = self.links.write();
        f(links.entry(link_key(a, b)).or_default());
        self.touched.store(true, Ordering::Release);
    }
}

impl Default for TcpFabric {
    fn default() -> Self {
        Self::new()
    }
}

impl TcpFabric {
    /// An in-process fabric for tests: every `attach` binds 127.0.0.1:0 and
    /// records its address in the fabric's book; the test cluster id and secret.
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }

    /// As [`TcpFabric::new`], with link delays measured on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::with_config(TcpConfig::local_test(clock)).expect("the test configuration is valid")
    }

    /// A fabric from a process's configuration.
    pub fn with_config(config: TcpConfig) -> Result<Self, FabricError> {
        let cred = Credentials::new(config.cluster_id, &config.secret)
            .ok_or_else(|| FabricError::Invalid("tcp fabric: empty shared secret".into()))?;
        Ok(TcpFabric {
            shared: Arc::new(FabricShared {
                env: Arc::new(Env {
                    clock: config.clock,
                    book: config.book,
                    cred,
                    listen: config.listen,
                    connect_timeout: config.connect_timeout,
                    handshake_timeout: config.handshake_timeout,
                    write_timeout: config.write_timeout,
                    response_timeout: config.response_timeout,
                    faults: Faults::default(),
                }),
                randomize_names: config.randomize_names,
                nodes: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The book peers are looked up in.
    pub fn book(&self) -> &AddressBook {
        &self.shared.env.book
    }

    /// The clock link delays are measured on.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.shared.env.clock.clone()
    }

    fn core(&self, node: NodeId) -> Option<Arc<NodeCore>> {
        self.shared
            .nodes
            .lock()
            .get(&node)
            .and_then(|s| s.core.upgrade())
    }
}

impl Fabric for TcpFabric {
    type Nic = TcpNic;

    fn attach(&self, node: NodeId) -> Result<TcpNic, FabricError> {
        let mut nodes = self.shared.nodes.lock();
        let (next_rkey, next_qpn) = match nodes.get(&node) {
            Some(slot) => {
                if slot
                    .core
                    .upgrade()
                    .is_some_and(|c| c.alive.load(Ordering::Acquire))
                {
                    return Err(FabricError::Invalid(format!(
                        "node {node} is already attached"
                    )));
                }
                (slot.next_rkey.clone(), slot.next_qpn.clone())
            }
            None => {
                let (r, q) = if self.shared.randomize_names {
                    (rand::random::<u32>(), rand::random::<u32>())
                } else {
                    (1, 1)
                };
                (Arc::new(AtomicU32::new(r)), Arc::new(AtomicU32::new(q)))
            }
        };
        let env = self.shared.env.clone();
        let listener = TcpListener::bind(env.listen).map_err(|e| {
            FabricError::Invalid(format!("tcp fabric: bind {} for {node}: {e}", env.listen))
        })?;
        let mut addr = listener
            .local_addr()
            .map_err(|e| FabricError::Invalid(format!("tcp fabric: local address: {e}")))?;
        if addr.ip().is_unspecified() {
            addr.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        let core = Arc::new(NodeCore {
            id: node,
            env: env.clone(),
            alive: AtomicBool::new(true),
            mrs: RwLock::new(HashMap::new()),
            qps: RwLock::new(HashMap::new()),
            next_rkey: next_rkey.clone(),
            next_qpn: next_qpn.clone(),
            listen_addr: addr,
            sockets: Mutex::new(SocketSet::default()),
            listener_thread: Mutex::new(None),
            handshaking: AtomicUsize::new(0),
            stats: Stats::default(),
        });
        let handle = engine::spawn_listener(core.clone(), listener).map_err(|e| {
            FabricError::Invalid(format!("tcp fabric: spawn listener of {node}: {e}"))
        })?;
        *core.listener_thread.lock() = Some(handle);
        env.book.insert(node, addr);
        nodes.insert(
            node,
            NodeSlot {
                core: Arc::downgrade(&core),
                next_rkey,
                next_qpn,
            },
        );
        tracing::debug!(%node, %addr, "tcp fabric: node attached");
        Ok(TcpNic {
            life: Arc::new(NodeLife { core }),
        })
    }
}

impl FaultInjector for TcpFabric {
    fn cut_link(&self, a: NodeId, b: NodeId) {
        self.shared.env.faults.update(a, b, |l| l.cut = true);
    }

    fn heal_link(&self, a: NodeId, b: NodeId) {
        self.shared.env.faults.update(a, b, |l| l.cut = false);
    }

    fn set_delay_ns(&self, a: NodeId, b: NodeId, delay_ns: u64) {
        self.shared
            .env
            .faults
            .update(a, b, |l| l.delay_ns = delay_ns);
    }

    fn crash_node(&self, node: NodeId) {
        if let Some(core) = self.core(node) {
            core.shutdown("crashed");
        }
    }

    fn power_fail(&self, node: NodeId, policy: PowerFailure) {
        let Some(core) = self.core(node) else { return };
        // Each distinct memory once, however many regions cover it.
        let mut memories: Vec<Arc<dyn RegionMemory>> = Vec::new();
        for mr in core.mrs.read().values() {
            if !memories.iter().any(|m| Arc::ptr_eq(m, mr.memory())) {
                memories.push(mr.memory().clone());
            }
        }
        core.shutdown("lost power");
        for m in memories {
            m.power_fail(policy);
        }
    }
}

// ---------------------------------------------------------------------------
// Nodes

/// Counters of a node's engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Connections that completed the handshake.
    pub accepted: u64,
    /// Connections refused in the handshake (bad proof, wrong cluster, malformed or
    /// incomplete handshake, unknown queue pair).
    pub refused: u64,
    /// Connections closed for a malformed frame after the handshake.
    pub protocol_errors: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) accepted: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
}

/// Every socket a node has open (inbound and outbound), so that a crash closes
/// them all.
#[derive(Default)]
pub(crate) struct SocketSet {
    closed: bool,
    next: u64,
    streams: HashMap<u64, TcpStream>,
}

/// One node's engine state, shared by its threads and its handles.
pub(crate) struct NodeCore {
    pub(crate) id: NodeId,
    pub(crate) env: Arc<Env>,
    pub(crate) alive: AtomicBool,
    pub(crate) mrs: RwLock<HashMap<Rkey, MemoryRegion>>,
    pub(crate) qps: RwLock<HashMap<QpNum, Arc<QpInner>>>,
    next_rkey: Arc<AtomicU32>,
    next_qpn: Arc<AtomicU32>,
    pub(crate) listen_addr: SocketAddr,
    sockets: Mutex<SocketSet>,
    listener_thread: Mutex<Option<JoinHandle<()>>>,
    /// Inbound connections not yet through the handshake (bounded, so that
    /// unauthenticated peers cannot pile up engine threads).
    pub(crate) handshaking: AtomicUsize,
    pub(crate) stats: Stats,
}

impl NodeCore {
    /// Track `stream` (a clone of it); `None` once the node is shut down.
    pub(crate) fn register_socket(&self, stream: &TcpStream) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let mut s = self.sockets.lock();
        if s.closed {
            return None;
        }
        let id = s.next;
        s.next += 1;
        s.streams.insert(id, clone);
        Some(id)
    }

    /// Shut a tracked socket down (both directions) and forget it.
    pub(crate) fn close_socket(&self, id: u64) {
        if let Some(s) = self.sockets.lock().streams.remove(&id) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Crash or teardown: refuse everything from now on, wait for operations in
    /// progress, drop regions and queue pairs, close the listener and every
    /// socket. Idempotent.
    pub(crate) fn shutdown(&self, why: &str) {
        if !self.alive.swap(false, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(node = %self.id, why, "tcp fabric: node engine stops");
        let qps: Vec<_> = self.qps.write().drain().map(|(_, q)| q).collect();
        for qp in qps {
            qp.kill();
        }
        self.mrs.write().clear();
        let streams: Vec<TcpStream> = {
            let mut s = self.sockets.lock();
            s.closed = true;
            s.streams.drain().map(|(_, t)| t).collect()
        };
        for s in streams {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // Wake the listener so that it sees the node is down and closes its
        // socket; wait for that, so that peers are refused once this returns.
        let woken = TcpStream::connect_timeout(&self.listen_addr, Duration::from_secs(1));
        let handle = self.listener_thread.lock().take();
        match (woken, handle) {
            (Ok(_), Some(h)) if h.thread().id() != std::thread::current().id() => {
                let _ = h.join();
            }
            (Err(e), _) => {
                tracing::warn!(node = %self.id, error = %e, "tcp fabric: cannot wake the listener; it closes at its next connection");
            }
            _ => {}
        }
    }

    fn check_alive(&self) -> Result<(), FabricError> {
        if self.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(FabricError::NodeDown(self.id))
        }
    }
}

/// Held by a node's handles (its NIC and queue pairs): when the last goes, the
/// engine stops and its threads exit.
pub(crate) struct NodeLife {
    pub(crate) core: Arc<NodeCore>,
}

impl Drop for NodeLife {
    fn drop(&mut self) {
        self.core.shutdown("dropped");
    }
}

/// A node's NIC on the tcp fabric.
#[derive(Clone)]
pub struct TcpNic {
    life: Arc<NodeLife>,
}

impl TcpNic {
    /// The address this node's engine listens on.
    pub fn listen_addr(&self) -> SocketAddr {
        self.life.core.listen_addr
    }

    /// Counters of this node's engine.
    pub fn engine_stats(&self) -> EngineStats {
        let s = &self.life.core.stats;
        EngineStats {
            accepted: s.accepted.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            protocol_errors: s.protocol_errors.load(Ordering::Relaxed),
        }
    }
}

/// Scramble a counter so that keys are not small consecutive numbers: a wrong key
/// is then wrong, not merely someone else's region.
fn scramble_rkey(n: u32) -> Rkey {
    Rkey(n.wrapping_mul(0x9E37_79B1) | 1)
}

impl Nic for TcpNic {
    type Cq = TcpCq;
    type Srq = TcpSrq;
    type Qp = TcpQp;

    fn node(&self) -> NodeId {
        self.life.core.id
    }

    fn register(
        &self,
        memory: Arc<dyn RegionMemory>,
        offset: usize,
        len_bytes: usize,
        access: Access,
    ) -> Result<MemoryRegion, FabricError> {
        let core = &self.life.core;
        core.check_alive()?;
        if offset
            .checked_add(len_bytes)
            .is_none_or(|end| end > memory.len_bytes())
        {
            return Err(FabricError::Invalid(format!(
                "region [{offset}, +{len_bytes}) exceeds memory of {} bytes",
                memory.len_bytes()
            )));
        }
        let mut mrs = core.mrs.write();
        // Skip a key still registered (a random start may wrap onto one).
        let rkey = loop {
            let k = scramble_rkey(core.next_rkey.fetch_add(1, Ordering::Relaxed));
            if !mrs.contains_key(&k) {
                break k;
            }
        };
        let mr = MemoryRegion::new(core.id, rkey, access, memory, offset, len_bytes);
        mrs.insert(rkey, mr.clone());
        Ok(mr)
    }

    fn deregister(&self, rkey: Rkey) -> Result<(), FabricError> {
        let core = &self.life.core;
        core.check_alive()?;
        match core.mrs.write().remove(&rkey) {
            Some(_) => Ok(()),
            None => Err(FabricError::Invalid(format!("{rkey} is not registered"))),
        }
    }

    fn create_cq(&self, kind: CqKind) -> Result<TcpCq, FabricError> {
        self.life.core.check_alive()?;
        Ok(TcpCq {
            inner: Arc::new(CqInner::new(kind)?),
        })
    }

    fn create_srq(&self, config: SrqConfig) -> Result<TcpSrq, FabricError> {
        self.life.core.check_alive()?;
        Ok(TcpSrq {
            inner: Arc::new(SrqInner::new(config)?),
        })
    }

    fn create_qp(
        &self,
        send_cq: &TcpCq,
        recv_cq: &TcpCq,
        srq: Option<&TcpSrq>,
        send_depth: usize,
    ) -> Result<TcpQp, FabricError> {
        let core = &self.life.core;
        core.check_alive()?;
        if send_depth == 0 {
            return Err(FabricError::Invalid("send_depth 0".into()));
        }
        let qpn = {
            let qps = core.qps.read();
            loop {
                let n = QpNum(core.next_qpn.fetch_add(1, Ordering::Relaxed));
                if !qps.contains_key(&n) {
                    break n;
                }
            }
        };
        let qp = TcpQp::create(
            self.life.clone(),
            qpn,
            send_cq.inner.clone(),
            recv_cq.inner.clone(),
            srq.map(|s| s.inner.clone()),
            send_depth,
        )?;
        let mut qps = core.qps.write();
        // A crash between the check above and here must not leave the queue pair
        // in a table nobody drains.
        core.check_alive()?;
        qps.insert(qpn, qp.inner().clone());
        Ok(qp)
    }
}
