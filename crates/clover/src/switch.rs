//! The interposer: the top-of-rack switch of seed 004, as a wrapper around any
//! fabric's NIC, so the fabric crate is untouched.
//!
//! An [`InterposedNic`] wraps a client's NIC; its queue pairs hand every work
//! request to the shared [`Switch`] before the inner queue pair, under the
//! switch's lock, so the switch sees the requests in the order the memory nodes
//! execute them (on `loopback`, which executes a request when it is posted, the
//! order is exact). Its completion queues show the switch every CAS completion
//! (the atomic ACK that passes the switch on its way back).
//!
//! Soft state, all of it bounded:
//! - per client queue pair, its **outstanding write**: the key and the slot of the
//!   last version it WROTE whole (parsed from the payload: `layout::parse_written`);
//! - per key, the **chain tail** (a link word: 16 B an entry with the key id), in a
//!   table of at most `keys_max` keys, optionally only for an admitted set (the
//!   top-N keys);
//! - per CAS in flight, what it was sent with, to judge its ACK.
//!
//! On a CAS whose swap value is the client's outstanding version, for a cached key:
//! if its target is not the tail the switch believes, the switch **rewrites the
//! target address (and the expected sentinel) to the tail's**, then records the
//! client's version as the new tail before the CAS lands (as the paper does). For an
//! admitted key it does not cache, it lets the CAS pass untouched and learns the
//! key's tail from its ACK: if the CAS succeeded and no later CAS on the key
//! passed meanwhile, its version is the tail ("a single successful c&s per key
//! rebuilds its cache", seed 004 §5). It does not take an unconfirmed target as
//! the tail: after a reset that vouched for stale guesses, and each failure's
//! reset led to the next.
//!
//! Correctness never depends on it: a redirected CAS that fails has its result
//! replaced by [`layout::FAILED`] (so the client falls back to the MS hint and the
//! chain walk, never mistaking it for success), and the switch **drops all its
//! state** on any anomaly — a failed CAS it had vouched for, any error completion,
//! a new connection (a restarted memory node, a new client), or [`Switch::reset`]
//! (a lost packet or a restart of the switch, injected by tests). With no state it
//! only forwards. Dropping state is not enough by itself: CASes redirected to a
//! version whose own CAS then fails have landed already, linking their versions
//! behind one that is not in the chain. So the client does not trust a redirection:
//! a writer whose CAS was redirected confirms that its predecessor is durably
//! linked (marked durable by its writer) before it marks its own version durable
//! and acknowledges (`client` module). Only CASes to the configured `targets` (the primaries) are
//! interposed: a backup's chain is linked by its writer in the primary's order.
//!
//! Fit for `tcp`: the wrapper is generic over the fabric, so it runs on `TcpFabric`
//! too, but there it is a client-side proxy per process, not a switch: it sees one
//! process's requests only and cannot order requests of two processes to one
//! target, so it would resolve conflicts between the clients of one process only
//! (and still be safe). A real deployment needs the switch on the path, as in the
//! paper (a P4/DPDK ToR), or a proxy process all clients connect through.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, FabricError, MemoryRegion, Nic, Op, QpAddr,
    QpState, QueuePair, RegionMemory, SrqConfig, WcOpcode, WcStatus, WorkRequest,
};
use rowankv_types::{NodeId, Rkey};

use crate::layout::{self, SlotRef, NEXT_AT};

/// Bound on the client queue pairs whose outstanding write the switch tracks.
pub const OUTSTANDING_MAX: usize = 1 << 16;
/// Bound on CASes in flight the switch tracks.
pub const INFLIGHT_MAX: usize = 1 << 16;
/// Switch memory per cached key (key id + tail link) and per tracked client.
pub const BYTES_PER_KEY: usize = 16;
pub const BYTES_PER_CLIENT: usize = 24;

/// How the switch is set up.
#[derive(Clone, Debug, Default)]
pub struct SwitchConfig {
    /// Bound on the keys whose tail it caches.
    pub keys_max: usize,
    /// `Some(ids)`: cache only these key ids (the top-N keys).
    pub admit: Option<HashSet<u64>>,
    /// `Some(nodes)`: interpose only on CASes to these memory nodes (the
    /// primaries). `None`: on every target.
    pub targets: Option<HashSet<NodeId>>,
}

/// Counters of the switch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SwitchStats {
    pub cas_seen: u64,
    pub cas_redirected: u64,
    pub cas_vouched_failed: u64,
    pub tails_learned: u64,
    pub resets: u64,
}

#[derive(Clone)]
struct Inflight {
    local: MemoryRegion,
    local_offset: usize,
    expect_sent: u64,
    vouched: bool,
    redirected: bool,
    /// An admitted key not cached: its tail is this version if the CAS
    /// succeeds and no later CAS on the key passed since.
    learns: Option<((NodeId, u64), SlotRef)>,
}

#[derive(Default)]
struct State {
    tails: HashMap<(NodeId, u64), SlotRef>,
    outstanding: HashMap<QpAddr, (NodeId, u64, SlotRef)>,
    inflight: HashMap<(QpAddr, u64), Inflight>,
    /// Per admitted key not cached, the last CAS on it that passed (its queue
    /// pair and work request): the one whose successful ACK teaches the tail.
    learning: HashMap<(NodeId, u64), (QpAddr, u64)>,
}

/// The switch. See the module documentation.
pub struct Switch {
    config: SwitchConfig,
    state: Mutex<State>,
    cas_seen: AtomicU64,
    cas_redirected: AtomicU64,
    cas_vouched_failed: AtomicU64,
    tails_learned: AtomicU64,
    resets: AtomicU64,
}

impl Switch {
    pub fn new(config: SwitchConfig) -> Arc<Switch> {
        Arc::new(Switch {
            config,
            state: Mutex::new(State::default()),
            cas_seen: AtomicU64::new(0),
            cas_redirected: AtomicU64::new(0),
            cas_vouched_failed: AtomicU64::new(0),
            tails_learned: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        })
    }

    /// Drop every piece of soft state (a restart, a lost packet).
    pub fn reset(&self) {
        let mut s = self.state.lock();
        self.reset_locked(&mut s);
    }

    fn reset_locked(&self, s: &mut State) {
        *s = State::default();
        self.resets.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> SwitchStats {
        SwitchStats {
            cas_seen: self.cas_seen.load(Ordering::Relaxed),
            cas_redirected: self.cas_redirected.load(Ordering::Relaxed),
            cas_vouched_failed: self.cas_vouched_failed.load(Ordering::Relaxed),
            tails_learned: self.tails_learned.load(Ordering::Relaxed),
            resets: self.resets.load(Ordering::Relaxed),
        }
    }

    /// Keys whose tail is cached now.
    pub fn keys_cached(&self) -> usize {
        self.state.lock().tails.len()
    }

    /// Bytes of the tables now (what a switch's SRAM would hold).
    pub fn memory_bytes(&self) -> usize {
        let s = self.state.lock();
        (s.tails.len() + s.learning.len()) * BYTES_PER_KEY + s.outstanding.len() * BYTES_PER_CLIENT
    }

    fn interposes(&self, target: NodeId) -> bool {
        self.config
            .targets
            .as_ref()
            .is_none_or(|t| t.contains(&target))
    }

    fn admits(&self, s: &State, key_id: u64) -> bool {
        s.tails.len() < self.config.keys_max
            && self
                .config
                .admit
                .as_ref()
                .is_none_or(|a| a.contains(&key_id))
    }

    /// Pass `wrs` of `qp` through the switch and on to `qp`.
    fn forward<Q: QueuePair>(&self, qp: &Q, wrs: &[WorkRequest<'_>]) -> Result<(), FabricError> {
        let mut s = self.state.lock();
        let (me, Some(target)) = (qp.addr(), qp.peer().map(|p| p.node)) else {
            return qp.post_send(wrs);
        };
        if !self.interposes(target) {
            drop(s);
            return qp.post_send(wrs);
        }
        let mut out: Vec<WorkRequest<'_>> = wrs.to_vec();
        let mut tracked = Vec::new();
        for wr in out.iter_mut() {
            match wr.op {
                Op::Write { data, remote, .. } => {
                    if let Some((slot, key_id)) = layout::parse_written(remote.offset, data) {
                        if s.outstanding.len() < OUTSTANDING_MAX || s.outstanding.contains_key(&me)
                        {
                            s.outstanding.insert(me, (target, key_id, slot));
                        }
                    }
                }
                Op::CompareSwap {
                    remote,
                    expect,
                    swap,
                    local,
                } => {
                    self.cas_seen.fetch_add(1, Ordering::Relaxed);
                    let attributed = s
                        .outstanding
                        .get(&me)
                        .copied()
                        .filter(|&(t, _, slot)| t == target && slot.link() == swap);
                    let Some((_, key_id, slot)) =
                        attributed.filter(|_| s.inflight.len() < INFLIGHT_MAX)
                    else {
                        // Not attributable to a key (its WRITE passed before a
                        // reset): it passes untouched. If it changes a cached
                        // key's chain, the next CAS the switch vouches for fails
                        // and the switch resets then. (Resetting here instead
                        // keeps a busy switch from ever relearning: after each
                        // reset some client is between its WRITE and its CAS.)
                        // It may be on a key being learned, so no ACK that is
                        // in flight now may teach a tail.
                        s.learning.clear();
                        continue;
                    };
                    let key = (target, key_id);
                    let mut f = Inflight {
                        local: local.mr.clone(),
                        local_offset: local.offset,
                        expect_sent: expect,
                        vouched: false,
                        redirected: false,
                        learns: None,
                    };
                    match s.tails.get(&key).copied() {
                        Some(tail) if tail.offset == slot.offset => {
                            // The client's own version is the tail already (a
                            // retry): never link a version after itself.
                            s.tails.remove(&key);
                            s.learning.remove(&key);
                            continue;
                        }
                        Some(tail)
                            if tail.offset + NEXT_AT as u64 == remote.offset
                                && tail.sentinel() != expect =>
                        {
                            // Aimed at the tail's slot with another generation: a
                            // rewrite of the expected word alone would leave the
                            // client unable to tell success from failure. Let it
                            // fail natively; forget the key.
                            s.tails.remove(&key);
                            s.learning.remove(&key);
                            continue;
                        }
                        Some(tail) => {
                            let at = tail.offset + NEXT_AT as u64;
                            f.vouched = true;
                            f.redirected = at != remote.offset;
                            f.expect_sent = tail.sentinel();
                            if f.redirected {
                                self.cas_redirected.fetch_add(1, Ordering::Relaxed);
                                let mut r = remote;
                                r.offset = at;
                                wr.op = Op::CompareSwap {
                                    remote: r,
                                    expect: tail.sentinel(),
                                    swap,
                                    local,
                                };
                            }
                            s.tails.insert(key, slot);
                        }
                        None if self.admits(&s, key_id) => {
                            // Learn from a successful CAS ("a single successful
                            // c&s per key rebuilds its cache", seed 004 §5), not
                            // optimistically at posting: the CAS passes as it is
                            // and, if its ACK says it succeeded while no later
                            // CAS on the key passed, its version is the tail.
                            // Taking an unconfirmed target as the tail vouched
                            // for every client's stale guess after a reset, and
                            // the reset its failure caused started the next:
                            // at 64 clients the switch reset more than once per
                            // ten CASes and never recovered.
                            f.learns = Some((key, slot));
                            if s.learning.len() < INFLIGHT_MAX || s.learning.contains_key(&key) {
                                s.learning.insert(key, (me, wr.wr_id));
                            }
                        }
                        None => continue,
                    }
                    tracked.push((wr.wr_id, f));
                }
                _ => {}
            }
        }
        for (wr_id, f) in tracked {
            s.inflight.insert((me, wr_id), f);
        }
        let r = qp.post_send(&out);
        // A request that failed as it was posted (a backend that executes at
        // posting, like loopback, shows it in the queue pair's state at once) may
        // have made the state wrong before its error completion is polled.
        if r.is_err() || qp.state() != QpState::Ready {
            self.reset_locked(&mut s);
        }
        r
    }

    /// The ACKs passing back through the switch.
    fn on_completions(&self, node: NodeId, done: &[Completion]) {
        if done.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        for c in done {
            if c.status != WcStatus::Success {
                // Any error (a crashed node, a flushed queue pair): drop it all.
                self.reset_locked(&mut s);
                continue;
            }
            if c.opcode != WcOpcode::CompareSwap {
                continue;
            }
            let me = QpAddr { node, qpn: c.qpn };
            let Some(f) = s.inflight.remove(&(me, c.wr_id)) else {
                continue;
            };
            let old = f.local.read_u64(f.local_offset);
            let success = old == f.expect_sent;
            if let Some((key, slot)) = f.learns {
                if s.learning.get(&key) == Some(&(me, c.wr_id)) {
                    s.learning.remove(&key);
                    if success && !s.tails.contains_key(&key) && self.admits(&s, key.1) {
                        self.tails_learned.fetch_add(1, Ordering::Relaxed);
                        s.tails.insert(key, slot);
                    }
                }
                continue;
            }
            if f.vouched && !success {
                self.cas_vouched_failed.fetch_add(1, Ordering::Relaxed);
                if f.redirected {
                    // The client must not read a redirected failure as its own
                    // CAS's answer.
                    f.local.write(f.local_offset, &layout::FAILED.to_le_bytes());
                }
                self.reset_locked(&mut s);
                continue;
            }
        }
    }
}

/// A NIC whose queue pairs pass every request through a [`Switch`].
#[derive(Clone)]
pub struct InterposedNic<N: Nic> {
    inner: N,
    switch: Arc<Switch>,
}

impl<N: Nic> InterposedNic<N> {
    pub fn new(inner: N, switch: Arc<Switch>) -> Self {
        InterposedNic { inner, switch }
    }

    pub fn switch(&self) -> &Arc<Switch> {
        &self.switch
    }
}

/// A completion queue whose CAS completions the switch sees first.
pub struct InterposedCq<C: CompletionQueue> {
    inner: C,
    node: NodeId,
    switch: Arc<Switch>,
}

impl<C: CompletionQueue> CompletionQueue for InterposedCq<C> {
    fn poll(&self, out: &mut [Completion]) -> Result<usize, FabricError> {
        let n = self.inner.poll(out)?;
        self.switch.on_completions(self.node, &out[..n]);
        Ok(n)
    }

    fn overwritten(&self) -> u64 {
        self.inner.overwritten()
    }
}

/// A queue pair whose requests pass through the switch.
pub struct InterposedQp<Q: QueuePair> {
    inner: Q,
    switch: Arc<Switch>,
}

impl<Q: QueuePair> QueuePair for InterposedQp<Q> {
    fn addr(&self) -> QpAddr {
        self.inner.addr()
    }
    fn state(&self) -> QpState {
        self.inner.state()
    }
    fn peer(&self) -> Option<QpAddr> {
        self.inner.peer()
    }
    fn connect(&self, remote: QpAddr) -> Result<(), FabricError> {
        // A new connection (a restarted memory node, a new client): what the
        // switch knew may be stale.
        self.switch.reset();
        self.inner.connect(remote)
    }
    fn post_send(&self, wrs: &[WorkRequest<'_>]) -> Result<(), FabricError> {
        self.switch.forward(&self.inner, wrs)
    }
    fn reset(&self) -> Result<(), FabricError> {
        self.switch.reset();
        self.inner.reset()
    }
    fn close(&self) {
        self.inner.close()
    }
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }
}

impl<N: Nic> Nic for InterposedNic<N> {
    type Cq = InterposedCq<N::Cq>;
    type Srq = N::Srq;
    type Qp = InterposedQp<N::Qp>;

    fn node(&self) -> NodeId {
        self.inner.node()
    }
    fn register(
        &self,
        memory: Arc<dyn RegionMemory>,
        offset: usize,
        len_bytes: usize,
        access: Access,
    ) -> Result<MemoryRegion, FabricError> {
        self.inner.register(memory, offset, len_bytes, access)
    }
    fn deregister(&self, rkey: Rkey) -> Result<(), FabricError> {
        self.inner.deregister(rkey)
    }
    fn create_cq(&self, kind: CqKind) -> Result<Self::Cq, FabricError> {
        Ok(InterposedCq {
            inner: self.inner.create_cq(kind)?,
            node: self.inner.node(),
            switch: self.switch.clone(),
        })
    }
    fn create_srq(&self, config: SrqConfig) -> Result<Self::Srq, FabricError> {
        self.inner.create_srq(config)
    }
    fn create_qp(
        &self,
        send_cq: &Self::Cq,
        recv_cq: &Self::Cq,
        srq: Option<&Self::Srq>,
        send_depth: usize,
    ) -> Result<Self::Qp, FabricError> {
        Ok(InterposedQp {
            inner: self
                .inner
                .create_qp(&send_cq.inner, &recv_cq.inner, srq, send_depth)?,
            switch: self.switch.clone(),
        })
    }
}
