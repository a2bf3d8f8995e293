//! `LoopbackFabric`: many nodes in one process.
//!
//! A one-sided operation is carried out by the thread that posts it, directly on the
//! target's registered memory, as an RNIC's DMA engine would: the target's threads
//! do no work for it. A SEND lands in the target queue pair's shared receive queue in
//! the same way. This makes the backend the vehicle for deterministic tests, fault
//! injection and like-for-like comparisons.
//!
//! Where it differs from hardware (all documented in `docs/fabric.md`):
//! - operations execute synchronously at `post_send` unless the link has a delay or
//!   the fabric has a wire model; a delayed operation executes when its deadline has
//!   passed and the initiator next posts to that queue pair or polls its send
//!   completion queue (the initiator's threads stand in for the NIC's engine);
//! - with a wire model ([`crate::WireModel`], `crate::timing`) every request lands
//!   and completes at the due times the model gives it, driven also by the polls of
//!   the target's receive queue and by one engine thread per fabric that sleeps until
//!   the next due time;
//! - a SEND that finds no receive buffer fails at once with `RnrRetryExceeded`
//!   (RC with `rnr_retry = 0`);
//! - remote keys are offsets-based: `RemoteAddr::offset` counts from the start of the
//!   registered region, not a virtual address.
//!
//! Lock order: a queue pair's `core` → the target node's tables → the target SRQ →
//! completion queues. A message is claimed and copied under the SRQ lock, so the
//! messages of one receive queue land whole and in the order they were claimed
//! (as a NIC lands them), even when a posting thread is preempted mid-copy; a
//! queue pair entering the error state takes that lock once, so nothing lands
//! through it after it is closed.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use std::cell::RefCell;

use parking_lot::{Condvar, Mutex, ReentrantMutex, RwLock};
use rowankv_types::{cpu_model, Clock, NodeId, QpNum, Rkey, SystemClock};

use crate::memory::{PowerFailure, RegionMemory};
use crate::srq::{claim, post, LandError, Landing, SrqState};
use crate::timing::{Due, Shape, WireModel};
use crate::verbs::*;

/// The in-process fabric. Cheap to clone; clones share the same network.
#[derive(Clone)]
pub struct LoopbackFabric {
    inner: Arc<FabricInner>,
}

struct FabricInner {
    clock: Arc<dyn Clock>,
    nodes: RwLock<HashMap<NodeId, Arc<NodeInner>>>,
    links: RwLock<HashMap<(NodeId, NodeId), Link>>,
    /// Set while any link is cut or delayed, so the common path skips the map.
    links_touched: AtomicBool,
    /// The wire and NIC timing model, if the fabric has one.
    model: Option<WireModel>,
    /// The engine that carries out modelled requests when they are due (with
    /// `model`).
    engine: Option<Arc<Engine>>,
}

/// The fabric's engine thread's shared state: the queue pairs with modelled
/// work, and when the thread plans to wake next.
struct Engine {
    qps: Mutex<Vec<Weak<QpInner>>>,
    wake: Condvar,
    /// The fabric-clock time the engine sleeps until (`u64::MAX`: until told).
    planned_ns: AtomicU64,
}

/// How long the engine sleeps at most while it has work (it re-reads the
/// clock: a manual clock moves without telling it), and while it has none
/// (it checks whether the fabric is gone).
const ENGINE_BUSY_NAP: std::time::Duration = std::time::Duration::from_millis(1);
const ENGINE_IDLE_NAP: std::time::Duration = std::time::Duration::from_millis(100);

impl Engine {
    /// Register `q` (whose work is due at `due_ns`) and wake the engine if it
    /// would sleep past that.
    fn enlist(&self, q: &Arc<QpInner>, due_ns: u64) {
        let mut qps = self.qps.lock();
        if !qps.iter().any(|w| w.as_ptr() == Arc::as_ptr(q)) {
            qps.push(Arc::downgrade(q));
        }
        if due_ns < self.planned_ns.load(Ordering::Acquire) {
            self.planned_ns.store(due_ns, Ordering::Release);
            self.wake.notify_one();
        }
    }

    /// The engine thread: carry out what is due, sleep until the next due
    /// time; end when the fabric is gone.
    fn run(fabric: Weak<FabricInner>, engine: Arc<Engine>) {
        loop {
            let Some(f) = fabric.upgrade() else { return };
            let qps: Vec<Arc<QpInner>> =
                engine.qps.lock().iter().filter_map(Weak::upgrade).collect();
            let mut next = u64::MAX;
            for q in &qps {
                q.progress();
                if let Some(d) = q.next_due() {
                    next = next.min(d);
                }
            }
            let now = f.clock.now_ns();
            drop(f);
            drop(qps);
            let mut g = engine.qps.lock();
            g.retain(|w| {
                w.upgrade()
                    .is_some_and(|q| q.pending_len.load(Ordering::Acquire) > 0)
            });
            let nap = if g.is_empty() {
                engine.planned_ns.store(u64::MAX, Ordering::Release);
                ENGINE_IDLE_NAP
            } else {
                engine.planned_ns.store(next, Ordering::Release);
                std::time::Duration::from_nanos(next.saturating_sub(now)).min(ENGINE_BUSY_NAP)
            };
            if !nap.is_zero() {
                engine.wake.wait_for(&mut g, nap);
            }
        }
    }
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

struct NodeInner {
    id: NodeId,
    alive: AtomicBool,
    mrs: RwLock<HashMap<Rkey, MemoryRegion>>,
    qps: RwLock<HashMap<QpNum, Arc<QpInner>>>,
    next_rkey: AtomicU32,
    next_qpn: AtomicU32,
    /// The wire model's reservations of this NIC's message slots: when its
    /// transmit and its receive side are next free (fabric clock, ns).
    tx_free_ns: AtomicU64,
    rx_free_ns: AtomicU64,
    /// With a wire model: this node's requests are carried out when posted,
    /// untimed ([`LoopbackFabric::set_untimed`]).
    untimed: AtomicBool,
}

impl Default for LoopbackFabric {
    fn default() -> Self {
        Self::new()
    }
}

impl LoopbackFabric {
    pub fn new() -> Self {
        Self::with_clock(SystemClock::new())
    }

    /// A fabric whose delays are measured on `clock` (a simulator's clock).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self::build(clock, None)
    }

    /// A fabric whose requests take the times `model` gives them (on the
    /// system clock), carried out by an engine thread of the fabric when no
    /// poller does it first. Refuses a model with a zero rate.
    pub fn with_model(model: WireModel) -> Result<Self, FabricError> {
        Self::with_clock_and_model(SystemClock::new(), model)
    }

    /// [`LoopbackFabric::with_model`] on `clock`.
    pub fn with_clock_and_model(
        clock: Arc<dyn Clock>,
        model: WireModel,
    ) -> Result<Self, FabricError> {
        let fabric = Self::driven(clock, model)?;
        let engine = fabric.inner.engine.clone().expect("built with a model");
        let weak = Arc::downgrade(&fabric.inner);
        std::thread::Builder::new()
            .name("loopback-nic-engine".into())
            .spawn(move || Engine::run(weak, engine))
            .map_err(|e| FabricError::Invalid(format!("starting the NIC engine thread: {e}")))?;
        Ok(fabric)
    }

    /// A fabric with `model` on `clock` and no engine thread: its owner
    /// drives it, calling [`LoopbackFabric::progress_due`] as its clock
    /// moves (a cluster on modelled time, whose one thread steps every role:
    /// no other thread then touches the fabric). Refuses a model with a zero
    /// rate.
    pub fn driven(clock: Arc<dyn Clock>, model: WireModel) -> Result<Self, FabricError> {
        model.check().map_err(FabricError::Invalid)?;
        Ok(Self::build(clock, Some(model)))
    }

    fn build(clock: Arc<dyn Clock>, model: Option<WireModel>) -> Self {
        LoopbackFabric {
            inner: Arc::new(FabricInner {
                clock,
                nodes: RwLock::new(HashMap::new()),
                links: RwLock::new(HashMap::new()),
                links_touched: AtomicBool::new(false),
                model,
                engine: model.map(|_| {
                    Arc::new(Engine {
                        qps: Mutex::new(Vec::new()),
                        wake: Condvar::new(),
                        planned_ns: AtomicU64::new(u64::MAX),
                    })
                }),
            }),
        }
    }

    /// The fabric's wire model, if it has one (to label results).
    pub fn model(&self) -> Option<WireModel> {
        self.inner.model
    }

    /// The clock this fabric measures delays on.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// With a wire model: the requests that `node` posts from now on skip the
    /// model and are carried out when posted, as on a fabric without one
    /// (what reaches `node` is still timed). For a benchmark on modelled time
    /// whose background machine (Clover's metadata server) waits for its own
    /// rounds in a blocking loop that a manual clock would never end; every
    /// result measured so must say so. Unknown nodes are ignored.
    pub fn set_untimed(&self, node: NodeId, untimed: bool) {
        if let Some(n) = self.node(node) {
            n.untimed.store(untimed, Ordering::Release);
        }
    }

    /// With a wire model: carry out every modelled landing and completion due
    /// by the clock's now, as the engine thread does, and return when the next
    /// one is due (`None`: nothing queued). A driver of modelled time (a
    /// benchmark on a [`rowankv_types::ManualClock`]) calls it when its
    /// pollers have done what they can at this instant and moves the clock to
    /// the time it returns: then requests land exactly at their due times, in
    /// the order of those times, and a target's landings in the order its
    /// receive slots were reserved, which is posting order (what a FIFO
    /// switch port in front of the target gives). Without a model: `None`.
    pub fn progress_due(&self) -> Option<u64> {
        let engine = self.inner.engine.as_ref()?;
        let qps: Vec<Arc<QpInner>> = engine.qps.lock().iter().filter_map(Weak::upgrade).collect();
        let mut next: Option<u64> = None;
        for q in &qps {
            q.progress();
            if let Some(d) = q.next_due() {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        drop(qps);
        // Forget the queue pairs with nothing queued, as the engine thread
        // does (a driven fabric has none to do it).
        engine.qps.lock().retain(|w| {
            w.upgrade()
                .is_some_and(|q| q.pending_len.load(Ordering::Acquire) > 0)
        });
        next
    }

    fn node(&self, id: NodeId) -> Option<Arc<NodeInner>> {
        self.inner.nodes.read().get(&id).cloned()
    }

    fn update_link(&self, a: NodeId, b: NodeId, f: impl FnOnce(&mut Link)) {
        let mut links = self.inner.links.write();
        f(links.entry(link_key(a, b)).or_default());
        self.inner.links_touched.store(true, Ordering::Release);
    }
}

/// A node's queue pairs point back at their node (`QpInner::node`) and connected
/// queue pairs at each other, so they keep each other alive: when the fabric
/// goes, break the cycles, or every registered memory (a whole pool) would
/// outlive it.
impl Drop for FabricInner {
    fn drop(&mut self) {
        for node in self.nodes.get_mut().values() {
            for (_, qp) in node.qps.write().drain() {
                // Connected queue pairs also hold each other.
                qp.core.lock().peer = None;
            }
            node.mrs.write().clear();
        }
    }
}

impl FabricInner {
    fn link(&self, a: NodeId, b: NodeId) -> Link {
        if !self.links_touched.load(Ordering::Acquire) {
            return Link::default();
        }
        self.links
            .read()
            .get(&link_key(a, b))
            .copied()
            .unwrap_or_default()
    }
}

impl Fabric for LoopbackFabric {
    type Nic = LoopbackNic;

    fn attach(&self, node: NodeId) -> Result<LoopbackNic, FabricError> {
        let mut nodes = self.inner.nodes.write();
        // A re-attached node continues its predecessor's key and QP numbering, so
        // that a peer's stale rkey or QP address never names the new incarnation's
        // region or queue pair.
        let (mut next_rkey, mut next_qpn) = (1, 1);
        if let Some(old) = nodes.get(&node) {
            if old.alive.load(Ordering::Acquire) {
                return Err(FabricError::Invalid(format!(
                    "node {node} is already attached"
                )));
            }
            next_rkey = old.next_rkey.load(Ordering::Relaxed);
            next_qpn = old.next_qpn.load(Ordering::Relaxed);
        }
        let inner = Arc::new(NodeInner {
            id: node,
            alive: AtomicBool::new(true),
            mrs: RwLock::new(HashMap::new()),
            qps: RwLock::new(HashMap::new()),
            next_rkey: AtomicU32::new(next_rkey),
            next_qpn: AtomicU32::new(next_qpn),
            tx_free_ns: AtomicU64::new(0),
            rx_free_ns: AtomicU64::new(0),
            untimed: AtomicBool::new(false),
        });
        nodes.insert(node, inner.clone());
        Ok(LoopbackNic {
            node: inner,
            fabric: self.inner.clone(),
        })
    }
}

impl FaultInjector for LoopbackFabric {
    fn cut_link(&self, a: NodeId, b: NodeId) {
        self.update_link(a, b, |l| l.cut = true);
    }

    fn heal_link(&self, a: NodeId, b: NodeId) {
        self.update_link(a, b, |l| l.cut = false);
    }

    fn set_delay_ns(&self, a: NodeId, b: NodeId, delay_ns: u64) {
        self.update_link(a, b, |l| l.delay_ns = delay_ns);
    }

    fn crash_node(&self, node: NodeId) {
        let Some(n) = self.node(node) else { return };
        n.alive.store(false, Ordering::Release);
        n.mrs.write().clear();
        let qps: Vec<_> = n.qps.write().drain().map(|(_, q)| q).collect();
        for qp in qps {
            let mut core = qp.core.lock();
            qp.enter_error(&mut core);
            // A dead queue pair never reaches its peer again. Dropping the link
            // breaks the cycle of two that both crashed (a power failure of
            // every node), which would keep both nodes' receive queues, regions
            // and memory alive after the fabric is gone.
            core.peer = None;
        }
    }

    fn power_fail(&self, node: NodeId, policy: PowerFailure) {
        let Some(n) = self.node(node) else { return };
        // Each distinct memory once, however many regions cover it.
        let mut memories: Vec<Arc<dyn RegionMemory>> = Vec::new();
        for mr in n.mrs.read().values() {
            if !memories.iter().any(|m| Arc::ptr_eq(m, mr.memory())) {
                memories.push(mr.memory().clone());
            }
        }
        self.crash_node(node);
        for m in memories {
            m.power_fail(policy);
        }
    }
}

/// A node's NIC on the loopback fabric.
#[derive(Clone)]
pub struct LoopbackNic {
    node: Arc<NodeInner>,
    fabric: Arc<FabricInner>,
}

impl LoopbackNic {
    fn check_alive(&self) -> Result<(), FabricError> {
        if self.node.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(FabricError::NodeDown(self.node.id))
        }
    }
}

/// Scramble a counter so that keys are not small consecutive numbers: a wrong key
/// is then wrong, not merely someone else's region.
fn scramble_rkey(n: u32) -> Rkey {
    Rkey(n.wrapping_mul(0x9E37_79B1) | 1)
}

impl Nic for LoopbackNic {
    type Cq = LoopbackCq;
    type Srq = LoopbackSrq;
    type Qp = LoopbackQp;

    fn node(&self) -> NodeId {
        self.node.id
    }

    fn register(
        &self,
        memory: Arc<dyn RegionMemory>,
        offset: usize,
        len_bytes: usize,
        access: Access,
    ) -> Result<MemoryRegion, FabricError> {
        self.check_alive()?;
        if offset
            .checked_add(len_bytes)
            .is_none_or(|end| end > memory.len_bytes())
        {
            return Err(FabricError::Invalid(format!(
                "region [{offset}, +{len_bytes}) exceeds memory of {} bytes",
                memory.len_bytes()
            )));
        }
        let rkey = scramble_rkey(self.node.next_rkey.fetch_add(1, Ordering::Relaxed));
        let mr = MemoryRegion::new(self.node.id, rkey, access, memory, offset, len_bytes);
        self.node.mrs.write().insert(rkey, mr.clone());
        Ok(mr)
    }

    fn deregister(&self, rkey: Rkey) -> Result<(), FabricError> {
        self.check_alive()?;
        match self.node.mrs.write().remove(&rkey) {
            Some(_) => Ok(()),
            None => Err(FabricError::Invalid(format!("{rkey} is not registered"))),
        }
    }

    fn create_cq(&self, kind: CqKind) -> Result<LoopbackCq, FabricError> {
        self.check_alive()?;
        let capacity = match kind {
            CqKind::Bounded { capacity } | CqKind::Ring { capacity } => capacity,
        };
        if capacity == 0 {
            return Err(FabricError::Invalid("completion queue capacity 0".into()));
        }
        Ok(LoopbackCq {
            inner: Arc::new(CqInner {
                kind,
                state: Mutex::new(CqState {
                    entries: VecDeque::with_capacity(capacity.min(1 << 16)),
                    overflowed: false,
                    overwritten: 0,
                }),
                delayed_qps: Mutex::new(Vec::new()),
                delayed_any: AtomicBool::new(false),
            }),
        })
    }

    fn create_srq(&self, config: SrqConfig) -> Result<LoopbackSrq, FabricError> {
        self.check_alive()?;
        if config.buffers_max == 0 || config.stride_bytes == Some(0) {
            return Err(FabricError::Invalid(format!("bad SRQ config {config:?}")));
        }
        Ok(LoopbackSrq {
            inner: Arc::new(SrqInner {
                config,
                state: ReentrantMutex::new(RefCell::new(SrqState::new())),
            }),
        })
    }

    fn create_qp(
        &self,
        send_cq: &LoopbackCq,
        recv_cq: &LoopbackCq,
        srq: Option<&LoopbackSrq>,
        send_depth: usize,
    ) -> Result<LoopbackQp, FabricError> {
        self.check_alive()?;
        if send_depth == 0 {
            return Err(FabricError::Invalid("send_depth 0".into()));
        }
        let qpn = QpNum(self.node.next_qpn.fetch_add(1, Ordering::Relaxed));
        let inner = Arc::new(QpInner {
            addr: QpAddr {
                node: self.node.id,
                qpn,
            },
            node: self.node.clone(),
            fabric: Arc::downgrade(&self.fabric),
            send_cq: send_cq.inner.clone(),
            recv_cq: recv_cq.inner.clone(),
            srq: srq.map(|s| s.inner.clone()),
            send_depth,
            state: AtomicU8::new(STATE_INIT),
            peer_addr: RwLock::new(None),
            core: Mutex::new(QpCore {
                peer: None,
                pending: VecDeque::new(),
                posted: 0,
                held: VecDeque::new(),
                hold_until: None,
                last_due: Due {
                    land: 0,
                    complete: 0,
                },
                last_was_send: false,
            }),
            retired: Arc::new(AtomicU64::new(0)),
            posted: AtomicU64::new(0),
            pending_len: AtomicUsize::new(0),
        });
        self.node.qps.write().insert(qpn, inner.clone());
        Ok(LoopbackQp { inner })
    }
}

// ---------------------------------------------------------------------------
// Completion queues

struct CqEntry {
    wc: Completion,
    /// For send completions: the queue pair's retired counter and the request's
    /// sequence number; polling the entry retires every slot up to it.
    retire: Option<(Arc<AtomicU64>, u64)>,
}

struct CqState {
    entries: VecDeque<CqEntry>,
    overflowed: bool,
    overwritten: u64,
}

struct CqInner {
    kind: CqKind,
    state: Mutex<CqState>,
    /// Queue pairs with delayed work that completes into this CQ; polling drives them.
    delayed_qps: Mutex<Vec<Weak<QpInner>>>,
    /// Whether `delayed_qps` may hold a queue pair with queued work; written only
    /// under its lock, read without it so that a poll with nothing delayed takes
    /// no lock and allocates nothing.
    delayed_any: AtomicBool,
}

/// Outcome of pushing a completion.
enum Pushed {
    Ok,
    /// A bounded CQ overflowed: the queue pair that pushed enters the error state.
    Overflow,
}

impl CqInner {
    fn push(&self, entry: CqEntry) -> Pushed {
        let mut s = self.state.lock();
        match self.kind {
            CqKind::Bounded { capacity } => {
                if s.overflowed || s.entries.len() >= capacity {
                    s.overflowed = true;
                    return Pushed::Overflow;
                }
                s.entries.push_back(entry);
            }
            CqKind::Ring { capacity } => {
                if s.entries.len() >= capacity {
                    // The NIC overwrites the oldest entry of the ring.
                    s.entries.pop_front();
                    s.overwritten += 1;
                }
                s.entries.push_back(entry);
            }
        }
        Pushed::Ok
    }

    /// Drive `q`'s delayed work whenever this queue is polled.
    fn enlist(&self, q: &Arc<QpInner>) {
        let mut d = self.delayed_qps.lock();
        if !d.iter().any(|w| w.as_ptr() == Arc::as_ptr(q)) {
            d.push(Arc::downgrade(q));
        }
        self.delayed_any.store(true, Ordering::Release);
    }

    fn drive_delayed(&self) {
        if !self.delayed_any.load(Ordering::Acquire) {
            return;
        }
        let qps: Vec<Arc<QpInner>> = self
            .delayed_qps
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for qp in &qps {
            qp.progress();
        }
        // Forget queue pairs whose queue drained. A queue pair raises its
        // `pending_len` before it registers, so one that queues work after this
        // check registers itself again.
        let mut d = self.delayed_qps.lock();
        d.retain(|w| {
            w.upgrade()
                .is_some_and(|q| q.pending_len.load(Ordering::Acquire) > 0)
        });
        if d.is_empty() {
            self.delayed_any.store(false, Ordering::Release);
        }
    }
}

/// A completion queue on the loopback fabric.
#[derive(Clone)]
pub struct LoopbackCq {
    inner: Arc<CqInner>,
}

impl CompletionQueue for LoopbackCq {
    fn poll(&self, out: &mut [Completion]) -> Result<usize, FabricError> {
        let _call = cpu_model::FabricCall::enter(cpu_model::CallKind::Poll);
        self.inner.drive_delayed();
        let mut s = self.inner.state.lock();
        if s.overflowed {
            if let CqKind::Bounded { capacity } = self.inner.kind {
                return Err(FabricError::CqOverflow { capacity });
            }
        }
        let n = out.len().min(s.entries.len());
        for slot in out.iter_mut().take(n) {
            let e = s.entries.pop_front().expect("counted above");
            if let Some((retired, seq)) = e.retire {
                retired.fetch_max(seq + 1, Ordering::AcqRel);
            }
            *slot = e.wc;
        }
        Ok(n)
    }

    fn overwritten(&self) -> u64 {
        self.inner.state.lock().overwritten
    }
}

// ---------------------------------------------------------------------------
// Shared receive queues

struct SrqInner {
    config: SrqConfig,
    /// Held while a message lands (see [`SrqInner::claim_and_land`]).
    /// Reentrant: a landing's memory may, in tests, run another sender's
    /// write on the same thread (a hook that lands it "between" two blocks);
    /// other threads wait.
    state: ReentrantMutex<RefCell<SrqState>>,
}

impl SrqInner {
    /// Claim the place of a `len`-byte message and run `land` on it before any
    /// later message can claim one: a NIC lands the messages of a receive
    /// queue in the order it takes them, so once a later message has started a
    /// buffer, every earlier message is whole in memory. (Copying after the
    /// lock is released would let a preempted sender thread leave a hole that
    /// a later one has already passed, which no NIC does.)
    ///
    /// `open` is asked under the lock: a receiving queue pair that moved to the
    /// error state takes the lock once after it did
    /// ([`QpInner::enter_error`]), so when its close returns nothing more
    /// lands through it.
    fn claim_and_land(
        &self,
        len: usize,
        open: impl FnOnce() -> bool,
        land: impl FnOnce(&Landing),
    ) -> Result<Landing, LandError> {
        let guard = self.state.lock();
        if !open() {
            return Err(LandError::Closed);
        }
        let landing = claim(&mut guard.borrow_mut(), &self.config, len)?;
        land(&landing);
        Ok(landing)
    }
}

/// A shared receive queue on the loopback fabric.
#[derive(Clone)]
pub struct LoopbackSrq {
    inner: Arc<SrqInner>,
}

impl SharedReceiveQueue for LoopbackSrq {
    fn post_recv(&self, buffers: &[RecvBuffer]) -> Result<(), FabricError> {
        let _call = cpu_model::FabricCall::enter(cpu_model::CallKind::Post);
        let guard = self.inner.state.lock();
        let mut s = guard.borrow_mut();
        post(&mut s, &self.inner.config, buffers)
    }

    fn posted(&self) -> usize {
        self.inner.state.lock().borrow().buffers.len()
    }
}

// ---------------------------------------------------------------------------
// Queue pairs

const STATE_INIT: u8 = 0;
const STATE_READY: u8 = 1;
const STATE_ERROR: u8 = 2;

/// An operation whose bytes were copied at post time, waiting for a link delay.
enum OwnedOp {
    Send {
        data: Vec<u8>,
        imm: Option<u32>,
    },
    Write {
        data: Vec<u8>,
        remote: RemoteAddr,
        imm: Option<u32>,
    },
    Read {
        remote: RemoteAddr,
        len: usize,
        local: (MemoryRegion, usize),
    },
    CompareSwap {
        remote: RemoteAddr,
        expect: u64,
        swap: u64,
        local: (MemoryRegion, usize),
    },
    FetchAdd {
        remote: RemoteAddr,
        add: u64,
        local: (MemoryRegion, usize),
    },
    Flush {
        remote: RemoteAddr,
        len: usize,
        placement: Placement,
    },
    AtomicWrite {
        remote: RemoteAddr,
        value: u64,
    },
}

impl OwnedOp {
    fn from_op(op: &Op<'_>) -> OwnedOp {
        match *op {
            Op::Send { data, imm } => OwnedOp::Send {
                data: data.to_vec(),
                imm,
            },
            Op::Write { data, remote, imm } => OwnedOp::Write {
                data: data.to_vec(),
                remote,
                imm,
            },
            Op::Read { remote, len, local } => OwnedOp::Read {
                remote,
                len,
                local: (local.mr.clone(), local.offset),
            },
            Op::CompareSwap {
                remote,
                expect,
                swap,
                local,
            } => OwnedOp::CompareSwap {
                remote,
                expect,
                swap,
                local: (local.mr.clone(), local.offset),
            },
            Op::FetchAdd { remote, add, local } => OwnedOp::FetchAdd {
                remote,
                add,
                local: (local.mr.clone(), local.offset),
            },
            Op::Flush {
                remote,
                len,
                placement,
            } => OwnedOp::Flush {
                remote,
                len,
                placement,
            },
            Op::AtomicWrite { remote, value } => OwnedOp::AtomicWrite { remote, value },
        }
    }

    fn as_op(&self) -> Op<'_> {
        match self {
            OwnedOp::Send { data, imm } => Op::Send { data, imm: *imm },
            OwnedOp::Write { data, remote, imm } => Op::Write {
                data,
                remote: *remote,
                imm: *imm,
            },
            OwnedOp::Read { remote, len, local } => Op::Read {
                remote: *remote,
                len: *len,
                local: LocalAddr {
                    mr: &local.0,
                    offset: local.1,
                },
            },
            OwnedOp::CompareSwap {
                remote,
                expect,
                swap,
                local,
            } => Op::CompareSwap {
                remote: *remote,
                expect: *expect,
                swap: *swap,
                local: LocalAddr {
                    mr: &local.0,
                    offset: local.1,
                },
            },
            OwnedOp::FetchAdd { remote, add, local } => Op::FetchAdd {
                remote: *remote,
                add: *add,
                local: LocalAddr {
                    mr: &local.0,
                    offset: local.1,
                },
            },
            OwnedOp::Flush {
                remote,
                len,
                placement,
            } => Op::Flush {
                remote: *remote,
                len: *len,
                placement: *placement,
            },
            OwnedOp::AtomicWrite { remote, value } => Op::AtomicWrite {
                remote: *remote,
                value: *value,
            },
        }
    }
}

struct PendingWr {
    /// When it lands (executes at the target).
    deadline_ns: u64,
    /// When its completion is delivered (the wire model's acknowledgement;
    /// `deadline_ns` without a model).
    complete_ns: u64,
    seq: u64,
    wr_id: u64,
    signaled: bool,
    persist: bool,
    op: OwnedOp,
}

struct QpCore {
    peer: Option<Arc<QpInner>>,
    pending: VecDeque<PendingWr>,
    /// Sequence number of the next posted request.
    posted: u64,
    /// Send completions of landed requests, held until their due time (wire
    /// model), in posting order.
    held: VecDeque<(u64, CqEntry)>,
    /// While a modelled request executes: when its completions are due.
    hold_until: Option<u64>,
    /// The wire model's due times of the last request posted (the next lands
    /// and completes no earlier: one queue pair keeps posting order).
    last_due: Due,
    /// Whether the last request posted was a SEND (a FLUSH after it needs
    /// the SFlush lookup).
    last_was_send: bool,
}

struct QpInner {
    addr: QpAddr,
    node: Arc<NodeInner>,
    fabric: Weak<FabricInner>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    srq: Option<Arc<SrqInner>>,
    send_depth: usize,
    state: AtomicU8,
    /// The connected peer's address, readable without the core lock (a sender
    /// checks that the target is connected back to it).
    peer_addr: RwLock<Option<QpAddr>>,
    core: Mutex<QpCore>,
    retired: Arc<AtomicU64>,
    posted: AtomicU64,
    /// `core.pending.len()`, readable without the core lock (see `drive_delayed`).
    pending_len: AtomicUsize,
}

fn opcode_of(op: &Op<'_>) -> WcOpcode {
    match op {
        Op::Send { .. } => WcOpcode::Send,
        Op::Write { .. } => WcOpcode::Write,
        Op::Read { .. } => WcOpcode::Read,
        Op::CompareSwap { .. } => WcOpcode::CompareSwap,
        Op::FetchAdd { .. } => WcOpcode::FetchAdd,
        Op::Flush { .. } => WcOpcode::Flush,
        Op::AtomicWrite { .. } => WcOpcode::AtomicWrite,
    }
}

impl QpInner {
    fn completion(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            qpn: self.addr.qpn,
            byte_len: 0,
            offset: 0,
            imm: None,
            src: None,
        }
    }

    fn push_send_completion(&self, core: &mut QpCore, wc: Completion, seq: u64) {
        let entry = CqEntry {
            wc,
            retire: Some((self.retired.clone(), seq)),
        };
        if let Some(due) = core.hold_until {
            core.held.push_back((due, entry));
            return;
        }
        if let Pushed::Overflow = self.send_cq.push(entry) {
            self.enter_error(core);
        }
    }

    /// Move to the error state and flush what is queued.
    fn enter_error(&self, core: &mut QpCore) {
        self.state.store(STATE_ERROR, Ordering::Release);
        // Completions held for their due time go first (posting order), now.
        core.hold_until = None;
        while let Some((_, entry)) = core.held.pop_front() {
            let _ = self.send_cq.push(entry);
        }
        // A landing that saw the ready state holds the receive queue's lock
        // until it is whole: wait for it, so that none lands after this.
        if let Some(srq) = &self.srq {
            drop(srq.state.lock());
        }
        while let Some(p) = core.pending.pop_front() {
            let wc = self.completion(p.wr_id, WcStatus::WrFlushError, opcode_of(&p.op.as_op()));
            // A flush into an overflowed CQ has nowhere to go; the CQ already
            // reports the overflow.
            let _ = self.send_cq.push(CqEntry {
                wc,
                retire: Some((self.retired.clone(), p.seq)),
            });
        }
        self.pending_len.store(0, Ordering::Release);
    }

    /// Execute delayed requests whose deadline has passed, in order.
    fn progress(&self) {
        let Some(fabric) = self.fabric.upgrade() else {
            return;
        };
        let mut core = self.core.lock();
        let now = fabric.clock.now_ns();
        while core.pending.front().is_some_and(|p| p.deadline_ns <= now) {
            let p = core.pending.pop_front().expect("checked");
            if fabric.model.is_some() {
                core.hold_until = Some(p.complete_ns);
            }
            if self.state.load(Ordering::Acquire) == STATE_ERROR {
                let wc = self.completion(p.wr_id, WcStatus::WrFlushError, opcode_of(&p.op.as_op()));
                self.push_send_completion(&mut core, wc, p.seq);
                core.hold_until = None;
                continue;
            }
            let op = p.op.as_op();
            self.execute(
                &fabric, &mut core, p.seq, p.wr_id, &op, p.signaled, p.persist,
            );
            core.hold_until = None;
        }
        while core.held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, entry) = core.held.pop_front().expect("checked");
            if let Pushed::Overflow = self.send_cq.push(entry) {
                self.enter_error(&mut core);
            }
        }
        self.pending_len
            .store(core.pending.len() + core.held.len(), Ordering::Release);
    }

    /// When the next queued landing or held completion is due.
    fn next_due(&self) -> Option<u64> {
        let core = self.core.lock();
        let land = core.pending.front().map(|p| p.deadline_ns);
        let complete = core.held.front().map(|(due, _)| *due);
        match (land, complete) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Carry out one request against the peer, as the NIC would, and complete it.
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        fabric: &FabricInner,
        core: &mut QpCore,
        seq: u64,
        wr_id: u64,
        op: &Op<'_>,
        signaled: bool,
        persist: bool,
    ) {
        let opcode = opcode_of(op);
        let status = match core.peer.clone() {
            None => WcStatus::RetryExceeded,
            Some(peer) => self.execute_on(fabric, &peer, op, persist),
        };
        if status != WcStatus::Success {
            let wc = self.completion(wr_id, status, opcode);
            self.push_send_completion(core, wc, seq);
            self.enter_error(core);
            return;
        }
        if signaled {
            let wc = self.completion(wr_id, WcStatus::Success, opcode);
            self.push_send_completion(core, wc, seq);
        }
    }

    fn execute_on(
        &self,
        fabric: &FabricInner,
        peer: &Arc<QpInner>,
        op: &Op<'_>,
        persist: bool,
    ) -> WcStatus {
        let target = &peer.node;
        if !target.alive.load(Ordering::Acquire)
            || fabric.link(self.addr.node, target.id).cut
            || peer.state.load(Ordering::Acquire) != STATE_READY
            || *peer.peer_addr.read() != Some(self.addr)
        {
            return WcStatus::RetryExceeded;
        }
        match *op {
            Op::Send { data, imm } => self.land_message(peer, data, imm, persist, None),
            Op::Write { data, remote, imm } => {
                let Some((mr, at)) =
                    check_remote(target, remote, data.len(), Access::REMOTE_WRITE, false)
                else {
                    return WcStatus::RemoteAccessError;
                };
                if imm.is_some() {
                    // WRITE-with-immediate needs a receive at the target; check
                    // first so that a refused request changes nothing.
                    return self.land_message(peer, &[], imm, persist, Some((&mr, at, data)));
                }
                mr.memory().dma_write(at, data);
                if persist {
                    mr.memory().dma_persist(at, data.len());
                }
                WcStatus::Success
            }
            Op::Read { remote, len, local } => {
                if !local.mr.contains(local.offset as u64, len) {
                    return WcStatus::RemoteAccessError;
                }
                let Some((mr, at)) = check_remote(target, remote, len, Access::REMOTE_READ, false)
                else {
                    return WcStatus::RemoteAccessError;
                };
                let mut buf = vec![0u8; len];
                mr.memory().dma_read(at, &mut buf);
                local.mr.write(local.offset, &buf);
                WcStatus::Success
            }
            Op::CompareSwap {
                remote,
                expect,
                swap,
                local,
            } => {
                let Some((mr, at)) = check_remote(target, remote, 8, Access::REMOTE_ATOMIC, true)
                else {
                    return WcStatus::RemoteAccessError;
                };
                if !local.mr.contains(local.offset as u64, 8) {
                    return WcStatus::RemoteAccessError;
                }
                let old = mr.memory().dma_compare_swap(at, expect, swap);
                local.mr.write(local.offset, &old.to_le_bytes());
                WcStatus::Success
            }
            Op::FetchAdd { remote, add, local } => {
                let Some((mr, at)) = check_remote(target, remote, 8, Access::REMOTE_ATOMIC, true)
                else {
                    return WcStatus::RemoteAccessError;
                };
                if !local.mr.contains(local.offset as u64, 8) {
                    return WcStatus::RemoteAccessError;
                }
                let old = mr.memory().dma_fetch_add(at, add);
                local.mr.write(local.offset, &old.to_le_bytes());
                WcStatus::Success
            }
            Op::Flush {
                remote,
                len,
                placement,
            } => {
                // Requests of a queue pair execute in posting order here, so
                // every earlier WRITE has landed; the FLUSH makes them reach
                // the placement.
                let Some((mr, at)) = check_remote(target, remote, len, placement.right(), false)
                else {
                    return WcStatus::RemoteAccessError;
                };
                if placement == Placement::Persistence && len > 0 {
                    mr.memory().dma_persist(at, len);
                }
                WcStatus::Success
            }
            Op::AtomicWrite { remote, value } => {
                let Some((mr, at)) = check_remote(target, remote, 8, Access::REMOTE_WRITE, true)
                else {
                    return WcStatus::RemoteAccessError;
                };
                mr.memory().dma_atomic_write(at, value);
                if persist {
                    mr.memory().dma_persist(at, 8);
                }
                WcStatus::Success
            }
        }
    }

    /// Land a message (or a WRITE-with-immediate's notification) in the peer's SRQ.
    fn land_message(
        &self,
        peer: &Arc<QpInner>,
        data: &[u8],
        imm: Option<u32>,
        persist: bool,
        write: Option<(&MemoryRegion, usize, &[u8])>,
    ) -> WcStatus {
        let Some(srq) = peer.srq.as_ref() else {
            return WcStatus::RnrRetryExceeded;
        };
        // A message lands in the receive buffer while the place is claimed; a
        // WRITE-with-immediate's data goes to its own region, below.
        let into_buffer = |landing: &Landing| {
            if write.is_none() {
                let mem = landing.mr.memory();
                let at = landing.mr.base() + landing.offset_in_region;
                mem.dma_write(at, data);
                if persist {
                    mem.dma_persist(at, data.len());
                }
            }
        };
        let open = || peer.state.load(Ordering::Acquire) == STATE_READY;
        let landing = match srq.claim_and_land(data.len(), open, into_buffer) {
            Ok(l) => l,
            Err(LandError::Closed) => return WcStatus::RetryExceeded,
            Err(LandError::NoBuffer) => return WcStatus::RnrRetryExceeded,
            Err(LandError::TooLarge { wr_id }) => {
                let mut wc = peer.completion(wr_id, WcStatus::LocalLengthError, WcOpcode::Recv);
                wc.byte_len = data.len() as u32;
                wc.src = Some(self.addr);
                let _ = peer.recv_cq.push(CqEntry { wc, retire: None });
                return WcStatus::RemoteInvalidRequest;
            }
        };
        let opcode = match write {
            Some((mr, at, bytes)) => {
                mr.memory().dma_write(at, bytes);
                if persist {
                    mr.memory().dma_persist(at, bytes.len());
                }
                WcOpcode::RecvWriteImm
            }
            None => WcOpcode::Recv,
        };
        let wc = Completion {
            wr_id: landing.wr_id,
            status: WcStatus::Success,
            opcode,
            qpn: peer.addr.qpn,
            // WRITE-with-immediate: the length written, as `ibv_wc.byte_len`.
            byte_len: write.map_or(data.len(), |(_, _, bytes)| bytes.len()) as u32,
            offset: landing.offset_in_buffer as u64,
            imm,
            src: Some(self.addr),
        };
        // A receive completion that overflows a bounded CQ puts the receiving queue
        // pair in the error state; the sender's request has already landed.
        if let Pushed::Overflow = peer.recv_cq.push(CqEntry { wc, retire: None }) {
            peer.state.store(STATE_ERROR, Ordering::Release);
        }
        WcStatus::Success
    }
}

/// What the wire model needs of a request: bytes each way, whether the target
/// persists before it acknowledges, whether the sender must first look up
/// where a SEND lands before it can be flushed (SFlush: a SEND posted with
/// `persist`, or a FLUSH right after a SEND).
fn shape_of(op: &Op<'_>, persist: bool, sender_flush: bool, after_send: bool) -> Shape {
    let (out_bytes, back_bytes) = match op {
        Op::Send { data, .. } | Op::Write { data, .. } => (data.len(), 0),
        Op::Read { len, .. } => (0, *len),
        Op::CompareSwap { .. } => (16, 8),
        Op::FetchAdd { .. } => (8, 8),
        Op::AtomicWrite { .. } => (8, 0),
        Op::Flush { .. } => (0, 0),
    };
    let flush_persists = matches!(
        op,
        Op::Flush {
            placement: Placement::Persistence,
            len,
            ..
        } if *len > 0
    );
    Shape {
        out_bytes,
        back_bytes,
        persist: persist || flush_persists,
        // The sender's NIC must learn where a SEND landed before it can
        // flush it (SFlush, or a FLUSH right after a SEND); a SEND made
        // durable by a READ behind it (Rowan's, seed 000 §2.2) need not.
        lookup: (after_send && matches!(op, Op::Flush { .. }))
            || (persist && sender_flush && matches!(op, Op::Send { .. })),
    }
}

/// Look up a remote region and check key, right, bounds and (for atomics)
/// alignment. Returns the region and the absolute offset in its memory.
fn check_remote(
    target: &NodeInner,
    remote: RemoteAddr,
    len: usize,
    right: Access,
    atomic: bool,
) -> Option<(MemoryRegion, usize)> {
    let mrs = target.mrs.read();
    let mr = mrs.get(&remote.rkey)?;
    if !mr.access.contains(right) || !mr.contains(remote.offset, len) {
        return None;
    }
    let at = mr.base() + remote.offset as usize;
    if atomic && !at.is_multiple_of(8) {
        return None;
    }
    Some((mr.clone(), at))
}

/// A reliable connected queue pair on the loopback fabric.
pub struct LoopbackQp {
    inner: Arc<QpInner>,
}

impl QueuePair for LoopbackQp {
    fn addr(&self) -> QpAddr {
        self.inner.addr
    }

    fn state(&self) -> QpState {
        match self.inner.state.load(Ordering::Acquire) {
            STATE_INIT => QpState::Init,
            STATE_READY => QpState::Ready,
            _ => QpState::Error,
        }
    }

    fn peer(&self) -> Option<QpAddr> {
        *self.inner.peer_addr.read()
    }

    fn connect(&self, remote: QpAddr) -> Result<(), FabricError> {
        let fabric = self
            .inner
            .fabric
            .upgrade()
            .ok_or(FabricError::NodeDown(self.inner.addr.node))?;
        if !self.inner.node.alive.load(Ordering::Acquire) {
            return Err(FabricError::NodeDown(self.inner.addr.node));
        }
        let node = fabric
            .nodes
            .read()
            .get(&remote.node)
            .cloned()
            .ok_or(FabricError::UnknownNode(remote.node))?;
        let peer = node
            .qps
            .read()
            .get(&remote.qpn)
            .cloned()
            .ok_or(FabricError::UnknownQp(remote))?;
        let mut core = self.inner.core.lock();
        core.peer = Some(peer);
        *self.inner.peer_addr.write() = Some(remote);
        self.inner.state.store(STATE_READY, Ordering::Release);
        Ok(())
    }

    fn post_send(&self, wrs: &[WorkRequest<'_>]) -> Result<(), FabricError> {
        // A modelled-time cluster charges a step for its time outside the
        // fabric: what follows is the NIC's work (`docs/cpu-model.md`).
        let posted_at = cpu_model::step_offset_ns();
        let _call = cpu_model::FabricCall::enter(cpu_model::CallKind::Post);
        let q = &self.inner;
        if !q.node.alive.load(Ordering::Acquire) {
            return Err(FabricError::NodeDown(q.addr.node));
        }
        let fabric = q
            .fabric
            .upgrade()
            .ok_or(FabricError::NodeDown(q.addr.node))?;
        let mut core = q.core.lock();
        let state = q.state.load(Ordering::Acquire);
        if state == STATE_INIT {
            return Err(FabricError::NotConnected);
        }
        let outstanding = (core.posted - q.retired.load(Ordering::Acquire)) as usize;
        if outstanding + wrs.len() > q.send_depth {
            return Err(FabricError::SendQueueFull {
                outstanding,
                depth: q.send_depth,
            });
        }
        let peer_node = core.peer.as_ref().map(|p| p.node.id).unwrap_or(q.addr.node);
        let delay_ns = fabric.link(q.addr.node, peer_node).delay_ns;
        // The target's NIC, for the model's reservations only (no reference
        // count touched on the unmodelled path).
        let target = fabric.model.map(|_| {
            core.peer
                .as_ref()
                .map_or(q.node.clone(), |p| p.node.clone())
        });
        let mut first_due = u64::MAX;
        for wr in wrs {
            let seq = core.posted;
            core.posted += 1;
            q.posted.store(core.posted, Ordering::Release);
            if q.state.load(Ordering::Acquire) == STATE_ERROR {
                // Moved to the error state without flushing (a receive
                // completion that overflowed): what is queued or held goes
                // first, in order.
                if !core.pending.is_empty() || !core.held.is_empty() {
                    q.enter_error(&mut core);
                }
                let wc = q.completion(wr.wr_id, WcStatus::WrFlushError, opcode_of(&wr.op));
                q.push_send_completion(&mut core, wc, seq);
                continue;
            }
            let model = fabric
                .model
                .filter(|_| !q.node.untimed.load(Ordering::Acquire));
            if let Some(model) = model {
                let shape = shape_of(&wr.op, wr.persist, wr.sender_flush, core.last_was_send);
                core.last_was_send = matches!(wr.op, Op::Send { .. });
                let due = model.schedule(
                    fabric.clock.now_ns() + posted_at,
                    shape,
                    &q.node.tx_free_ns,
                    &target.as_ref().expect("set with the model").rx_free_ns,
                    delay_ns,
                );
                let due = Due {
                    land: due.land.max(core.last_due.land),
                    complete: due.complete.max(core.last_due.complete),
                };
                core.last_due = due;
                first_due = first_due.min(due.land);
                core.pending.push_back(PendingWr {
                    deadline_ns: due.land,
                    complete_ns: due.complete,
                    seq,
                    wr_id: wr.wr_id,
                    signaled: wr.signaled,
                    persist: wr.persist,
                    op: OwnedOp::from_op(&wr.op),
                });
            } else if delay_ns == 0 && core.pending.is_empty() {
                q.execute(
                    &fabric,
                    &mut core,
                    seq,
                    wr.wr_id,
                    &wr.op,
                    wr.signaled,
                    wr.persist,
                );
            } else {
                let deadline_ns = fabric.clock.now_ns() + posted_at + delay_ns;
                core.pending.push_back(PendingWr {
                    deadline_ns,
                    complete_ns: deadline_ns,
                    seq,
                    wr_id: wr.wr_id,
                    signaled: wr.signaled,
                    persist: wr.persist,
                    op: OwnedOp::from_op(&wr.op),
                });
            }
        }
        // Drive delayed work whenever some is queued, also after the delay was
        // removed (the module doc promises progress on every post).
        let delayed = !core.pending.is_empty() || !core.held.is_empty();
        q.pending_len
            .store(core.pending.len() + core.held.len(), Ordering::Release);
        // With a model, the target's pollers drive the landings too.
        let peer_recv_cq = match fabric.model {
            Some(_) => core.peer.as_ref().map(|p| p.recv_cq.clone()),
            None => None,
        };
        drop(core);
        if delayed {
            // Register with the send CQ (after raising `pending_len`) so that
            // polling it drives this queue pair.
            q.send_cq.enlist(q);
            if let Some(cq) = peer_recv_cq {
                cq.enlist(q);
            }
            if let Some(engine) = &fabric.engine {
                engine.enlist(q, first_due);
            }
            q.progress();
        }
        Ok(())
    }

    fn reset(&self) -> Result<(), FabricError> {
        let q = &self.inner;
        if !q.node.alive.load(Ordering::Acquire) {
            return Err(FabricError::NodeDown(q.addr.node));
        }
        let mut core = q.core.lock();
        if core.peer.is_none() {
            return Err(FabricError::NotConnected);
        }
        q.enter_error(&mut core);
        // Slots of flushed requests are retired by the reset itself.
        q.retired.store(core.posted, Ordering::Release);
        q.state.store(STATE_READY, Ordering::Release);
        Ok(())
    }

    fn close(&self) {
        let q = &self.inner;
        let mut core = q.core.lock();
        q.enter_error(&mut core);
        core.peer = None;
        *q.peer_addr.write() = None;
    }

    fn outstanding(&self) -> usize {
        let posted = self.inner.posted.load(Ordering::Acquire);
        (posted - self.inner.retired.load(Ordering::Acquire).min(posted)) as usize
    }
}
