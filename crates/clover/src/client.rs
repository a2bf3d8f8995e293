//! A Clover client: an event-driven state machine, one operation at a time.
//!
//! [`Client::start`] begins a PUT or a GET; [`Client::poll`] polls the client's
//! completion queue and, when the round it waits for is complete, takes the next
//! step, posting at most one round of work requests (to one or to every replica).
//! A driver steps many clients from one thread (the simulator from one seed, the
//! benchmark on the wire model); [`Client::put`] and [`Client::get`] block.
//!
//! **PUT** (out of place, then append):
//! 1. WRITE the new version, persisted, into a slot of the client's chunk on every
//!    replica (one round);
//! 2. CAS the `next` word of the tail it believes (cached, else the MS hint) from
//!    that tail's null sentinel to the new version's link, and FLUSH the primary
//!    (persistence, the whole region: the drain of every write the NIC has landed,
//!    which is what the READ-after-WRITE of today's RNICs does at PCIe level) — one
//!    round, both on the primary's queue pair;
//!    - the CAS failed with a link: walk the chain from there (one READ a step) and
//!      CAS again at the end; failed otherwise (the slot was reused, or the
//!      interposer's [`layout::FAILED`]): start again from the MS hint;
//!    - the CAS succeeded: its old value is the sentinel of the version it was
//!      appended to (the predecessor), even if the interposer redirected it;
//! 3. link the version on every backup (CAS of the predecessor's `next` from its
//!    sentinel, then FLUSH) and mark it durable on the primary (one round);
//!    - if the CAS was redirected (the predecessor is not the version the client
//!      aimed at), the interposer chose the predecessor and may have been wrong
//!      (its own CAS may still fail): first READ the predecessor, again until its
//!      writer has marked it durable and its `next` still names this version
//!      (one more round); if its `next` names another, the version was detached:
//!      resolve it as an unknown outcome. Only then link the backups and mark.
//!      A durable mark therefore means "durably reachable from the head";
//! 4. acknowledge; cache the new tail; report it to the MS (a lazy message).
//!
//! **GET**: READ the whole slot of the tail it believes (one round); if its `next`
//! is a link, follow it (one READ a step); at a null `next`, return the value — at
//! once if the version is marked durable, else after a FLUSH of the primary (so a
//! value is never returned whose link a crash could still lose).
//!
//! **Failures.** An error completion breaks the connection to that node; the client
//! waits (bounded) until the node has a new incarnation, reconnects and resumes: a
//! round of idempotent writes is repeated; a CAS whose outcome is unknown is
//! resolved by walking the chain from the MS head looking for the new version
//! (found: it was appended, flush and go on; not found: it was not, append again).
//! A GET starts again. Every retry is bounded ([`crate::Config`]).
//!
//! Invariants (asserted or checked by the simulator): a PUT is acknowledged only
//! after its version is persisted on every replica, linked on the primary and that
//! link drained, and linked on every backup; a GET returns only a version whose
//! inbound link is durable and whose `next` was null when read.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, Fabric, LocalAddr, MemoryRegion, Nic,
    Op, Placement, QueuePair, WcStatus, WorkRequest,
};

use crate::layout::{self, SlotRef, Word, DURABLE_AT, NEXT_AT};
use crate::memnode::{Connection, MemoryNode};
use crate::ms::{KeyMeta, MetadataServer};
use crate::{CloverError, Config};

/// Send-queue depth of a client's queue pairs (a round posts at most 3 requests
/// on one queue pair).
pub const SEND_DEPTH: usize = 16;
/// Completion queue capacity of a client.
const CQ_CAPACITY: usize = 256;
/// Unmarked reads of a redirected append's predecessor before the client walks
/// from the head instead (its mark may have been lost to a power failure).
pub const CONFIRM_READS_BEFORE_WALK: usize = 8;
/// Bound on the keys whose metadata and tail a client caches.
pub const CACHE_KEYS_MAX: usize = 1 << 20;

/// What a client is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Put { key: Vec<u8>, value: Vec<u8> },
    Get { key: Vec<u8> },
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The PUT is acknowledged; its version is in `slot`.
    Put {
        slot: SlotRef,
    },
    Get {
        value: Option<Vec<u8>>,
    },
}

/// A finished operation and what it cost.
#[derive(Debug)]
pub struct Outcome {
    pub result: Result<Reply, CloverError>,
    /// Network round trips: rounds of one-sided requests plus calls to the MS.
    pub round_trips: u32,
    /// For a failed PUT: whether it may still have taken effect.
    pub maybe_applied: bool,
}

/// Counters of a client (no timing model needed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub puts: u64,
    pub gets: u64,
    pub cas_failed: u64,
    pub walk_steps: u64,
    pub restarts: u64,
    pub read_flushes: u64,
    pub reconnects: u64,
    pub unknown_resolved: u64,
    pub ms_calls: u64,
    pub failed: u64,
}

#[derive(Clone, Debug)]
enum Phase {
    WriteData,
    Cas {
        guess: SlotRef,
    },
    Flush {
        pred: SlotRef,
    },
    Walk {
        at: SlotRef,
    },
    Recover {
        at: SlotRef,
    },
    Link {
        pred: SlotRef,
    },
    /// Redirected appends only: READ the predecessor until it is marked durable.
    Confirm {
        pred: SlotRef,
    },
    /// Mark the new version durable (after a confirmed redirected append).
    Mark,
    Read {
        at: SlotRef,
    },
    ReadFlush {
        at: SlotRef,
        value: Option<Vec<u8>>,
    },
}

#[derive(Clone, Debug)]
enum Resume {
    /// Repeat this phase.
    Again(Phase),
    /// Append from the MS hint.
    AppendFromHint,
    /// Resolve an unknown CAS from the MS head.
    RecoverFromHead,
    /// Read from the MS hint.
    ReadFromHint,
}

struct OpState {
    put: bool,
    meta: KeyMeta,
    slot: Option<SlotRef>,
    version: Vec<u8>,
    phase: Phase,
    waiting: Option<Resume>,
    wait_polls: u64,
    restarts: u32,
    walk_steps: usize,
    round_trips: u32,
    unknown: bool,
    /// The next round is decided and is posted by the next poll.
    pending_post: bool,
    /// The CAS was redirected (appended after a version the client did not
    /// name): the predecessor must be confirmed durably linked before the ack.
    confirm: bool,
    confirm_reads: usize,
    /// The version may have followers hanging off its `next` (an attempt to
    /// append it failed, or its outcome was unknown and it was not found): reset
    /// its `next` to its own sentinel on every replica before the next CAS, or
    /// re-appending it would carry them along (a cycle, if one of them was
    /// re-appended on its own).
    reset_next: bool,
}

struct Round {
    id: u64,
    posted: usize,
    done: usize,
    failed_nodes: Vec<usize>,
}

/// A Clover client. See the module documentation.
pub struct Client<F: Fabric, N: Nic> {
    config: Config,
    nic: N,
    cq: N::Cq,
    local: MemoryRegion,
    nodes: Vec<Arc<MemoryNode<F>>>,
    conns: Vec<Option<Connection<N>>>,
    ms: Arc<MetadataServer<F>>,
    keys: HashMap<Vec<u8>, KeyMeta>,
    tails: HashMap<u64, SlotRef>,
    chunk: VecDeque<SlotRef>,
    op: Option<OpState>,
    round: Round,
    stats: ClientStats,
}

const CAS_OLD_AT: usize = 0;
const READ_AT: usize = 64;

impl<F: Fabric, N: Nic> Client<F, N> {
    /// A client on `nic` of the replica group `nodes` (primary first), whose
    /// metadata server is `ms`.
    pub fn new(
        nic: N,
        nodes: Vec<Arc<MemoryNode<F>>>,
        ms: Arc<MetadataServer<F>>,
    ) -> Result<Self, CloverError> {
        let config = ms.config().clone();
        assert_eq!(nodes.len(), config.replicas);
        let cq = nic.create_cq(CqKind::Bounded {
            capacity: CQ_CAPACITY,
        })?;
        let local_bytes = READ_AT + config.slot_bytes();
        let local = nic.register(
            Arc::new(DramMemory::new(local_bytes)),
            0,
            local_bytes,
            Access::ALL,
        )?;
        let conns = (0..nodes.len()).map(|_| None).collect();
        Ok(Client {
            config,
            nic,
            cq,
            local,
            nodes,
            conns,
            ms,
            keys: HashMap::new(),
            tails: HashMap::new(),
            chunk: VecDeque::new(),
            op: None,
            round: Round {
                id: 0,
                posted: 0,
                done: 0,
                failed_nodes: Vec::new(),
            },
            stats: ClientStats::default(),
        })
    }

    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    pub fn is_idle(&self) -> bool {
        self.op.is_none()
    }

    /// Whether the next poll posts a round without waiting for the fabric (a
    /// driver of modelled time polls again before it moves the clock).
    pub fn posts_on_next_poll(&self) -> bool {
        self.op.as_ref().is_some_and(|o| o.pending_post)
    }

    /// Forget cached tails (what a client that restarted would know).
    pub fn forget_tails(&mut self) {
        self.tails.clear();
    }

    /// Warm the key cache (a client in steady state knows its keys' ids, heads
    /// and hints): one MS lookup per key not cached, outside any operation.
    pub fn prefetch_keys(&mut self, keys: &[Vec<u8>]) {
        for k in keys {
            if self.keys.len() >= CACHE_KEYS_MAX {
                break;
            }
            if !self.keys.contains_key(k) {
                self.stats.ms_calls += 1;
                if let Some(m) = self.ms.lookup(k) {
                    self.keys.insert(k.clone(), m);
                }
            }
        }
    }

    /// A blocking PUT.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<SlotRef, CloverError> {
        match self.run(Request::Put {
            key: key.to_vec(),
            value: value.to_vec(),
        })? {
            Reply::Put { slot } => Ok(slot),
            Reply::Get { .. } => unreachable!("a PUT answers a PUT"),
        }
    }

    /// A blocking GET.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, CloverError> {
        match self.run(Request::Get { key: key.to_vec() })? {
            Reply::Get { value } => Ok(value),
            Reply::Put { .. } => unreachable!("a GET answers a GET"),
        }
    }

    fn run(&mut self, req: Request) -> Result<Reply, CloverError> {
        if let Some(o) = self.start(req) {
            return o.result;
        }
        loop {
            if let Some(o) = self.poll() {
                return o.result;
            }
            std::hint::spin_loop();
        }
    }

    /// Begin an operation. Returns its outcome at once if it needs no round
    /// trip to a memory node (a GET of a key never created, an error).
    pub fn start(&mut self, req: Request) -> Option<Outcome> {
        assert!(self.op.is_none(), "a client runs one operation at a time");
        let (put, key, value) = match req {
            Request::Put { key, value } => (true, key, value),
            Request::Get { key } => (false, key, Vec::new()),
        };
        let mut round_trips = 0;
        let fail = |e, rt| {
            Some(Outcome {
                result: Err(e),
                round_trips: rt,
                maybe_applied: false,
            })
        };
        if key.len() > self.config.key_bytes_max {
            return fail(
                CloverError::TooLong {
                    what: "key",
                    len: key.len(),
                    max: self.config.key_bytes_max,
                },
                0,
            );
        }
        if value.len() > self.config.value_bytes_max {
            return fail(
                CloverError::TooLong {
                    what: "value",
                    len: value.len(),
                    max: self.config.value_bytes_max,
                },
                0,
            );
        }
        let meta = match self.keys.get(&key) {
            Some(m) => *m,
            None => {
                round_trips += 1;
                self.stats.ms_calls += 1;
                let m = if put {
                    match self.ms.lookup_or_create(&key) {
                        Ok(m) => m,
                        Err(e) => return fail(e, round_trips),
                    }
                } else {
                    match self.ms.lookup(&key) {
                        Some(m) => m,
                        None => {
                            self.stats.gets += 1;
                            return Some(Outcome {
                                result: Ok(Reply::Get { value: None }),
                                round_trips,
                                maybe_applied: false,
                            });
                        }
                    }
                };
                if self.keys.len() < CACHE_KEYS_MAX {
                    self.keys.insert(key.clone(), m);
                }
                m
            }
        };
        let (slot, version, phase) = if put {
            if self.chunk.is_empty() {
                round_trips += 1;
                self.stats.ms_calls += 1;
                match self.ms.alloc_chunk() {
                    Ok(c) => self.chunk.extend(c),
                    Err(e) => return fail(e, round_trips),
                }
            }
            let slot = self.chunk.pop_front().expect("a chunk has a slot");
            let version = layout::encode(slot, meta.key_id, false, &value);
            (Some(slot), version, Phase::WriteData)
        } else {
            let at = self.tails.get(&meta.key_id).copied().unwrap_or(meta.hint);
            (None, Vec::new(), Phase::Read { at })
        };
        self.op = Some(OpState {
            put,
            meta,
            slot,
            version,
            phase,
            waiting: None,
            wait_polls: 0,
            restarts: 0,
            walk_steps: 0,
            round_trips,
            unknown: false,
            pending_post: false,
            confirm: false,
            confirm_reads: 0,
            reset_next: false,
        });
        self.post_phase()
    }

    /// Poll for completions and take the next step when the round is complete.
    /// Returns the outcome when the operation finished.
    pub fn poll(&mut self) -> Option<Outcome> {
        self.op.as_ref()?;
        if self.op.as_ref().is_some_and(|o| o.waiting.is_some()) {
            return self.try_resume();
        }
        if self.op().pending_post {
            self.op().pending_post = false;
            return self.do_post();
        }
        let mut out = [Completion::BLANK; 32];
        let n = match self.cq.poll(&mut out) {
            Ok(n) => n,
            Err(e) => return self.finish_err(e.into()),
        };
        for c in &out[..n] {
            if c.wr_id >> 16 != self.round.id {
                continue; // a straggler of an abandoned round
            }
            self.round.done += 1;
            if c.status != WcStatus::Success {
                let node = ((c.wr_id >> 8) & 0xff) as usize;
                if !self.round.failed_nodes.contains(&node) {
                    self.round.failed_nodes.push(node);
                }
            }
        }
        if self.round.done < self.round.posted {
            return None;
        }
        if !self.round.failed_nodes.is_empty() {
            for i in std::mem::take(&mut self.round.failed_nodes) {
                self.conns[i] = None;
            }
            return self.on_round_failed();
        }
        self.on_round_done()
    }

    fn op(&mut self) -> &mut OpState {
        self.op.as_mut().expect("an operation is running")
    }

    fn finish(&mut self, result: Result<Reply, CloverError>) -> Option<Outcome> {
        let op = self.op.take().expect("an operation is running");
        if op.put {
            self.stats.puts += 1;
        } else {
            self.stats.gets += 1;
        }
        if result.is_err() {
            self.stats.failed += 1;
        }
        Some(Outcome {
            maybe_applied: op.put && result.is_err(),
            result,
            round_trips: op.round_trips,
        })
    }

    fn finish_err(&mut self, e: CloverError) -> Option<Outcome> {
        self.finish(Err(e))
    }

    /// A round failed on some node: wait for it, then resume as the phase needs.
    fn on_round_failed(&mut self) -> Option<Outcome> {
        let op = self.op();
        let resume = match op.phase.clone() {
            Phase::WriteData => Resume::Again(Phase::WriteData),
            Phase::Cas { .. } | Phase::Flush { .. } | Phase::Recover { .. } => {
                op.unknown = true;
                Resume::RecoverFromHead
            }
            Phase::Walk { .. } if op.unknown => Resume::RecoverFromHead,
            Phase::Walk { .. } => Resume::AppendFromHint,
            Phase::Link { pred } => Resume::Again(Phase::Link { pred }),
            Phase::Confirm { pred } => Resume::Again(Phase::Confirm { pred }),
            Phase::Mark => Resume::Again(Phase::Mark),
            Phase::Read { .. } | Phase::ReadFlush { .. } => Resume::ReadFromHint,
        };
        op.waiting = Some(resume);
        op.wait_polls = 0;
        self.try_resume()
    }

    fn try_resume(&mut self) -> Option<Outcome> {
        for i in 0..self.nodes.len() {
            let up = self.nodes[i].incarnation();
            let stale = match (&self.conns[i], up) {
                (Some(c), Some(u)) => {
                    c.incarnation != u || c.qp.state() != rowankv_fabric::QpState::Ready
                }
                (None, Some(_)) => true,
                (_, None) => {
                    self.conns[i] = None;
                    false
                }
            };
            if stale {
                match self.nodes[i].connect(&self.nic, &self.cq, SEND_DEPTH) {
                    Ok(c) => {
                        self.conns[i] = Some(c);
                        self.stats.reconnects += 1;
                    }
                    Err(_) => self.conns[i] = None,
                }
            }
        }
        let wait_polls_max = self.config.wait_polls_max;
        let op = self.op();
        if let Some(resume) = op.waiting.clone() {
            let ready = self.conns.iter().all(|c| c.is_some());
            let op = self.op();
            if !ready {
                op.wait_polls += 1;
                if op.wait_polls > wait_polls_max {
                    return self.finish_err(CloverError::GaveUp("a memory node stayed down"));
                }
                return None;
            }
            op.waiting = None;
            let key_id = op.meta.key_id;
            match resume {
                Resume::Again(p) => op.phase = p,
                Resume::AppendFromHint => {
                    let m = self.ms_meta(key_id);
                    self.op().phase = Phase::Cas { guess: m.hint };
                }
                Resume::RecoverFromHead => {
                    let m = self.ms_meta(key_id);
                    self.stats.unknown_resolved += 1;
                    self.op().phase = Phase::Recover { at: m.head };
                }
                Resume::ReadFromHint => {
                    let m = self.ms_meta(key_id);
                    self.op().phase = Phase::Read { at: m.hint };
                }
            }
        }
        self.post_phase()
    }

    fn ms_meta(&mut self, key_id: u64) -> KeyMeta {
        self.stats.ms_calls += 1;
        self.op().round_trips += 1;
        self.ms.meta(key_id)
    }

    /// Start from the MS hint again (bounded).
    fn restart(&mut self) -> Option<Outcome> {
        self.stats.restarts += 1;
        let restarts_max = self.config.restarts_max;
        let op = self.op();
        op.restarts += 1;
        if op.restarts > restarts_max {
            return self.finish_err(CloverError::GaveUp("restarts from the MS hint"));
        }
        let (key_id, put, unknown) = (op.meta.key_id, op.put, op.unknown);
        self.tails.remove(&key_id);
        let m = self.ms_meta(key_id);
        self.op().phase = match (put, unknown) {
            (true, true) => Phase::Recover { at: m.head },
            (true, false) => Phase::Cas { guess: m.hint },
            (false, _) => Phase::Read { at: m.hint },
        };
        self.post_phase()
    }

    fn step_walk(&mut self) -> bool {
        self.stats.walk_steps += 1;
        let max = self.config.walk_steps_max;
        let op = self.op();
        op.walk_steps += 1;
        op.walk_steps <= max
    }

    fn read_version(&self, at: SlotRef) -> Option<layout::Version> {
        let mut buf = vec![0u8; self.config.slot_bytes()];
        self.local.read(READ_AT, &mut buf);
        let v = layout::decode(at.offset, &buf).ok()?;
        let key_id = self.op.as_ref().expect("running").meta.key_id;
        (v.gen == at.gen && v.key_id == key_id).then_some(v)
    }

    fn on_round_done(&mut self) -> Option<Outcome> {
        let phase = self.op().phase.clone();
        if crate::TRACE.load(std::sync::atomic::Ordering::Relaxed) {
            let old = self.local.read_u64(CAS_OLD_AT);
            let op = self.op.as_ref().expect("running");
            let mut buf = vec![0u8; self.config.slot_bytes()];
            self.local.read(READ_AT, &mut buf);
            eprintln!(
                "client {} slot {:?} read {:?} done {:?} cas_old {:?} confirm {}",
                self.nic.node(),
                op.slot,
                layout::decode(0, &buf).map(|v| (v.gen, layout::decode_word(v.next))),
                phase,
                layout::decode_word(old),
                op.confirm
            );
        }
        match phase {
            Phase::WriteData => {
                let op = self.op();
                let key_id = op.meta.key_id;
                let hint = op.meta.hint;
                let mut guess = self.tails.get(&key_id).copied().unwrap_or(hint);
                if Some(guess.offset) == self.op().slot.map(|s| s.offset) {
                    // The cached tail's slot was freed and given to us again.
                    guess = self.ms_meta(key_id).hint;
                }
                self.op().phase = Phase::Cas { guess };
                self.post_phase()
            }
            Phase::Cas { guess } => {
                self.op().reset_next = false;
                let old = self.local.read_u64(CAS_OLD_AT);
                let me = self.op().slot.expect("a PUT has a slot");
                let appended_to = if old == guess.sentinel() {
                    Some(guess)
                } else {
                    match layout::decode_word(old) {
                        // Redirected by the interposer: appended after `s`.
                        Word::Null(s) if s.offset != guess.offset => Some(s),
                        _ => None,
                    }
                };
                if let Some(pred) = appended_to {
                    assert_ne!(
                        pred.offset, me.offset,
                        "a version is never its own predecessor"
                    );
                    // Appended after a version this client did not name: the
                    // interposer chose it, and may have been wrong about it.
                    self.op().confirm = pred != guess;
                    let confirm = self.op().confirm;
                    self.op().phase = match (self.config.flush_with_cas, confirm) {
                        (false, _) => Phase::Flush { pred },
                        (true, true) => Phase::Confirm { pred },
                        (true, false) => Phase::Link { pred },
                    };
                    return self.post_phase();
                }
                self.stats.cas_failed += 1;
                self.op().reset_next = true;
                match layout::decode_word(old) {
                    Word::Link(next) if next == me => {
                        // Only after an unknown outcome: it is appended already.
                        self.op().confirm = false;
                        self.op().phase = Phase::Flush { pred: guess };
                        self.post_phase()
                    }
                    Word::Link(next) if self.read_version(guess).is_some() => {
                        if !self.step_walk() {
                            return self.restart();
                        }
                        self.op().phase = Phase::Walk { at: next };
                        self.post_phase()
                    }
                    _ => self.restart(),
                }
            }
            Phase::Flush { pred } => {
                self.op().phase = if self.op().confirm {
                    Phase::Confirm { pred }
                } else {
                    Phase::Link { pred }
                };
                self.post_phase()
            }
            Phase::Walk { at } | Phase::Recover { at } => {
                let recovering = matches!(phase, Phase::Recover { .. });
                let me = self.op().slot.expect("a PUT has a slot");
                if recovering && at == me {
                    // The MS's head is our version: GC walked the chain to it
                    // (and drained), so it is linked and the backups' chains
                    // start at it too. Only the mark is left.
                    self.op().confirm = false;
                    self.op().phase = Phase::Mark;
                    return self.post_phase();
                }
                let Some(v) = self.read_version(at) else {
                    return self.restart();
                };
                match layout::decode_word(v.next) {
                    Word::Link(next) if next == me => {
                        // Our version is linked (an unknown CAS took effect),
                        // after a version reached from the head.
                        self.op().confirm = false;
                        self.op().phase = Phase::Flush { pred: at };
                        self.post_phase()
                    }
                    Word::Link(next) => {
                        if !self.step_walk() {
                            return self.restart();
                        }
                        self.op().phase = if recovering {
                            Phase::Recover { at: next }
                        } else {
                            Phase::Walk { at: next }
                        };
                        self.post_phase()
                    }
                    Word::Null(s) if s == at => {
                        if recovering {
                            // Not linked; but something may hang off it.
                            self.op().reset_next = true;
                        }
                        self.op().phase = Phase::Cas { guess: at };
                        self.post_phase()
                    }
                    _ => self.restart(),
                }
            }
            Phase::Confirm { pred } => {
                // The predecessor is durably linked once its writer marked it; a
                // slot of another generation was freed by GC, which frees only
                // versions of the chain.
                let mut buf = vec![0u8; self.config.slot_bytes()];
                self.local.read(READ_AT, &mut buf);
                let me = self.op().slot.expect("a PUT has a slot");
                let seen = match layout::decode(pred.offset, &buf) {
                    Ok(v) if v.gen == pred.gen => Some((v.durable, v.next == me.link())),
                    Ok(_) => Some((false, false)),
                    Err(_) => None, // torn: read again
                };
                match seen {
                    Some((true, true)) => {
                        // Now link it on the backups (behind a predecessor known
                        // to be in the chain) and mark it.
                        self.op().confirm = false;
                        self.op().phase = Phase::Link { pred };
                        return self.post_phase();
                    }
                    Some((_, false)) => {
                        // Detached (its predecessor was reset before it was
                        // re-appended) or its predecessor's slot was freed: find
                        // out from the head whether it is linked.
                        let key_id = self.op().meta.key_id;
                        let m = self.ms_meta(key_id);
                        let op = self.op();
                        op.confirm = false;
                        op.unknown = true;
                        op.phase = Phase::Recover { at: m.head };
                        return self.post_phase();
                    }
                    _ => {}
                }
                let max = self.config.walk_steps_max;
                let op = self.op();
                op.confirm_reads += 1;
                if op.confirm_reads > max {
                    return self.finish_err(CloverError::GaveUp(
                        "the predecessor of a redirected append was never linked",
                    ));
                }
                if op.confirm_reads.is_multiple_of(CONFIRM_READS_BEFORE_WALK) {
                    // The mark is a hint a power failure may take: look from
                    // the head instead (found: linked; not found: re-append).
                    let key_id = op.meta.key_id;
                    let m = self.ms_meta(key_id);
                    let op = self.op();
                    op.confirm = false;
                    op.unknown = true;
                    op.phase = Phase::Recover { at: m.head };
                    return self.post_phase();
                }
                op.phase = Phase::Confirm { pred };
                self.post_phase()
            }
            Phase::Link { .. } | Phase::Mark => {
                let op = self.op();
                let (key_id, slot) = (op.meta.key_id, op.slot.expect("a PUT has a slot"));
                if self.tails.len() < CACHE_KEYS_MAX {
                    self.tails.insert(key_id, slot);
                }
                self.ms.report(key_id, slot);
                self.stats.ms_calls += 1;
                self.finish(Ok(Reply::Put { slot }))
            }
            Phase::Read { at } => {
                let Some(v) = self.read_version(at) else {
                    return self.restart();
                };
                match layout::decode_word(v.next) {
                    Word::Link(next) => {
                        if !self.step_walk() {
                            return self.restart();
                        }
                        self.op().phase = Phase::Read { at: next };
                        self.post_phase()
                    }
                    Word::Null(s) if s == at => {
                        let value = (!v.absent).then_some(v.value);
                        if v.durable {
                            self.finish_get(at, value)
                        } else {
                            self.stats.read_flushes += 1;
                            self.op().phase = Phase::ReadFlush { at, value };
                            self.post_phase()
                        }
                    }
                    _ => self.restart(),
                }
            }
            Phase::ReadFlush { at, value } => self.finish_get(at, value),
        }
    }

    fn finish_get(&mut self, at: SlotRef, value: Option<Vec<u8>>) -> Option<Outcome> {
        let key_id = self.op().meta.key_id;
        if self.tails.len() < CACHE_KEYS_MAX {
            self.tails.insert(key_id, at);
        }
        self.finish(Ok(Reply::Get { value }))
    }

    /// The current phase's round is posted by the next poll: a poll consumes a
    /// round's completions or posts a round, never both, so a driver (the
    /// simulator) can act between a request landing and the next one leaving —
    /// the windows a crash must be able to hit.
    fn post_phase(&mut self) -> Option<Outcome> {
        self.op().pending_post = true;
        None
    }

    /// Post the current phase's round.
    fn do_post(&mut self) -> Option<Outcome> {
        if self.conns.iter().any(|c| c.is_none()) {
            let phase = self.op().phase.clone();
            let resume = match phase {
                Phase::Cas { .. }
                | Phase::Walk { .. }
                | Phase::Recover { .. }
                | Phase::Flush { .. }
                    if self.op().unknown =>
                {
                    Resume::RecoverFromHead
                }
                p => Resume::Again(p),
            };
            let op = self.op();
            op.waiting = Some(resume);
            op.wait_polls = 0;
            return self.try_resume();
        }
        self.round.id += 1;
        self.round.posted = 0;
        self.round.done = 0;
        self.round.failed_nodes.clear();
        self.op().round_trips += 1;
        let op = self.op.as_ref().expect("running");
        let slot_bytes = self.config.slot_bytes();
        let region_bytes = self.config.region_bytes();
        let local = &self.local;
        let id = self.round.id;
        fn wr(id: u64, node: usize, k: u64, op: Op<'_>, persist: bool) -> WorkRequest<'_> {
            WorkRequest {
                wr_id: (id << 16) | ((node as u64) << 8) | k,
                op,
                signaled: true,
                persist,
                sender_flush: false,
            }
        }
        let cas_local = LocalAddr {
            mr: local,
            offset: CAS_OLD_AT,
        };
        let read_local = LocalAddr {
            mr: local,
            offset: READ_AT,
        };
        let durable_word;
        let sentinel_word;
        let mut per_node: Vec<Vec<WorkRequest<'_>>> = vec![Vec::new(); self.nodes.len()];
        match &op.phase {
            Phase::WriteData => {
                let slot = op.slot.expect("a PUT has a slot");
                for (i, c) in self.conns.iter().enumerate() {
                    let c = c.as_ref().expect("connected");
                    per_node[i].push(wr(
                        id,
                        i,
                        0,
                        Op::Write {
                            data: &op.version,
                            remote: c.region.at(slot.offset),
                            imm: None,
                        },
                        true,
                    ));
                }
            }
            Phase::Cas { guess } => {
                let slot = op.slot.expect("a PUT has a slot");
                assert_ne!(
                    guess.offset, slot.offset,
                    "a CAS never links a version after itself"
                );
                if op.reset_next {
                    sentinel_word = slot.sentinel().to_le_bytes();
                    for (i, c) in self.conns.iter().enumerate() {
                        let c = c.as_ref().expect("connected");
                        per_node[i].push(wr(
                            id,
                            i,
                            2,
                            Op::Write {
                                data: &sentinel_word,
                                remote: c.region.at(slot.offset + NEXT_AT as u64),
                                imm: None,
                            },
                            true,
                        ));
                    }
                }
                let c = self.conns[0].as_ref().expect("connected");
                per_node[0].push(wr(
                    id,
                    0,
                    0,
                    Op::CompareSwap {
                        remote: c.region.at(guess.offset + NEXT_AT as u64),
                        expect: guess.sentinel(),
                        swap: slot.link(),
                        local: cas_local,
                    },
                    false,
                ));
                if self.config.flush_with_cas {
                    per_node[0].push(wr(id, 0, 1, flush(c, region_bytes), false));
                }
                // The guessed slot as it is after the CAS: a link a failed CAS
                // returns is the chain's only if the slot still holds the
                // guessed generation (else it is a reused slot's new occupant's).
                per_node[0].push(wr(
                    id,
                    0,
                    3,
                    Op::Read {
                        remote: c.region.at(guess.offset),
                        len: slot_bytes,
                        local: read_local,
                    },
                    false,
                ));
            }
            Phase::Flush { .. } | Phase::ReadFlush { .. } => {
                let c = self.conns[0].as_ref().expect("connected");
                per_node[0].push(wr(id, 0, 0, flush(c, region_bytes), false));
            }
            Phase::Walk { at } | Phase::Recover { at } | Phase::Read { at } => {
                let c = self.conns[0].as_ref().expect("connected");
                per_node[0].push(wr(
                    id,
                    0,
                    0,
                    Op::Read {
                        remote: c.region.at(at.offset),
                        len: slot_bytes,
                        local: read_local,
                    },
                    false,
                ));
            }
            Phase::Confirm { pred } => {
                let c = self.conns[0].as_ref().expect("connected");
                per_node[0].push(wr(
                    id,
                    0,
                    0,
                    Op::Read {
                        remote: c.region.at(pred.offset),
                        len: slot_bytes,
                        local: read_local,
                    },
                    false,
                ));
            }
            Phase::Mark => {
                let c = self.conns[0].as_ref().expect("connected");
                let slot = op.slot.expect("a PUT has a slot");
                durable_word = slot.durable_word().to_le_bytes();
                per_node[0].push(wr(
                    id,
                    0,
                    0,
                    Op::Write {
                        data: &durable_word,
                        remote: c.region.at(slot.offset + DURABLE_AT as u64),
                        imm: None,
                    },
                    false,
                ));
            }
            Phase::Link { pred } => {
                let slot = op.slot.expect("a PUT has a slot");
                durable_word = slot.durable_word().to_le_bytes();
                for (i, c) in self.conns.iter().enumerate() {
                    let c = c.as_ref().expect("connected");
                    assert!(
                        !op.confirm,
                        "backups link only behind a confirmed predecessor"
                    );
                    if i == 0 {
                        per_node[0].push(wr(
                            id,
                            0,
                            0,
                            Op::Write {
                                data: &durable_word,
                                remote: c.region.at(slot.offset + DURABLE_AT as u64),
                                imm: None,
                            },
                            false,
                        ));
                    } else {
                        // On a backup the CAS fails harmlessly if a retry linked
                        // it already or the predecessor's slot was reused.
                        per_node[i].push(wr(
                            id,
                            i,
                            0,
                            Op::CompareSwap {
                                remote: c.region.at(pred.offset + NEXT_AT as u64),
                                expect: pred.sentinel(),
                                swap: slot.link(),
                                local: cas_local,
                            },
                            false,
                        ));
                        per_node[i].push(wr(id, i, 1, flush(c, region_bytes), false));
                    }
                }
            }
        }
        let mut failed = Vec::new();
        let mut posted = 0;
        for (i, wrs) in per_node.iter().enumerate() {
            if wrs.is_empty() {
                continue;
            }
            let c = self.conns[i].as_ref().expect("connected");
            match c.qp.post_send(wrs) {
                Ok(()) => posted += wrs.len(),
                Err(_) => failed.push(i),
            }
        }
        self.round.posted = posted;
        self.round.failed_nodes = failed;
        // The completions are taken by the next poll, even where the fabric has
        // them already (loopback without a model): one round per poll, so a
        // driver interleaves clients at round granularity.
        None
    }
}

fn flush<N: Nic>(c: &Connection<N>, region_bytes: usize) -> Op<'static> {
    Op::Flush {
        remote: c.region.at(0),
        len: region_bytes,
        placement: Placement::Persistence,
    }
}
