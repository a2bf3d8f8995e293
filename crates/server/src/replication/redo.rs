//! `drpc`: replication by durable RPC (seed 002 §4, used as its §6 suggests for
//! a replicated store): a primary's worker puts each entry into the backup's redo
//! ring with a WFlush durable RPC — a WRITE of the entry, a FLUSH of it, then an
//! ATOMIC WRITE of its seq word, persisted — and the entry counts as replicated
//! as soon as that last write is durable, before any CPU of the backup has looked
//! at it. The backup's redo role later executes the ring's requests: each appends
//! its blocks to the server's b-log (per-thread b-log 0, which no worker uses
//! under this strategy), where the digest applies them as it does `rpc`'s.
//!
//! | side | what |
//! | --- | --- |
//! | primary | [`DrpcReplicator`]: a [`Sender`] per backup, an entry split at block boundaries into requests of at most one ring chunk, its token acknowledged when the request holding its last block is durable |
//! | backup | [`RedoRings`]: the [`Receiver`] on the engine's reserved area (`EngineConfig::reserved_tail_bytes`), one connection per sending worker, executed by the redo role and drained before any failover walk reads the b-logs |
//!
//! # Why an acknowledged entry is never lost
//! - The ring lives in the engine's pool, so it survives every crash the pool
//!   survives; a restarted server opens it before it serves and its recovery
//!   re-executes every durable request past the connection's `done_seq` into the
//!   b-log ([`RedoRings::open`]). A zeroed header is a ring never formatted (the
//!   engine zeroes the area when it formats the pool); any other header that does
//!   not verify is an error, never formatted over.
//! - An executed request's blocks are in the b-log, persisted, before its
//!   completion mark (`done_seq`) is: a crash in between re-executes it, which
//!   appends the same blocks again — harmless, because a block is a version of a
//!   key and the index keeps the newest (the same duplicate a retried `rpc`
//!   replication makes). This is the one way the operator steps outside the
//!   drpc crate's contract (its effect is not a state write of the apply record):
//!   it is idempotent and durable before `execute` returns, which is what that
//!   contract exists to guarantee.
//! - Promotion, re-replication and cold start read a backup's entries from its
//!   b-logs (`Engine::uncommitted_entries_of`); the control role drains the rings
//!   first ([`RedoRings::drain`]), so an entry acknowledged by the ring is in a
//!   b-log before it is looked for.
//! - A sender that dials again (it restarted, or gave its path up) gets the same
//!   connection back after everything that landed on it is executed
//!   ([`Receiver::release`]); a sender removed from the configuration has its
//!   connections released the same way, so nothing more lands from it.
//! - A request the b-log has no room for is deferred, never dropped or waited
//!   for: it stays in its ring (see [`Appender`]); segments held in reserve
//!   ([`replay_reserve_segments`]) let a restart re-execute all the rings hold,
//!   and a stall past `ServerSettings::redo_stall_limit` stops the server.
//! - A block that does not parse is not appended (a ring entry's CRC-32C makes
//!   this a sender's bug, not a torn write); it is logged and counted.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use rowankv_drpc::layout::{entry_bytes, request_bytes};
use rowankv_drpc::{
    ConnId, DrpcError, Effect, Event, FlowConfig, NotNow, Offer, Operator, Receiver, Request,
    RingGeometry, Sender, StateView, Variant,
};
use rowankv_engine::{entry, BackupLog, Engine, EngineError, Reach};
use rowankv_fabric::{Completion, Nic, QpAddr, RemoteRegion};
use rowankv_pmem::Pool;
use rowankv_types::{NodeId, QpNum, Rkey};
use rowankv_wire::frame::Response;

use super::{Link, LinkKind, Outcomes, ReplCtx, Replicator};
use crate::services::PathKey;

/// The durable RPC the strategy uses: sender-initiated, so the backup's CPU is
/// off the acknowledgement's path, as Rowan's is.
pub const VARIANT: Variant = Variant::WFlush;
/// The one operation: append these blocks to the b-log.
pub const OP_APPEND: u16 = 1;
/// Connections of a server's rings by default (a process): one per sending
/// worker of every other server (a re-dial reuses its worker's). The
/// in-process cluster sizes them to its servers and workers.
pub const CONNECTIONS_DEFAULT: u32 = 128;
/// Chunks (largest entries) per connection's ring: entries share a chunk while
/// they fit, so a ring holds many small entries.
const RING_CHUNKS: usize = 4;
/// The b-log the redo role appends to.
const BLOG_INDEX: usize = 0;

/// The flow bounds of a replication connection.
pub fn flow() -> FlowConfig {
    FlowConfig {
        inflight_max: 32,
        inflight_slowed_max: 8,
        batch_max: 1,
        slow_down_threshold: 24,
        requests_per_poll_max: 64,
        reply_bytes_max: 128,
    }
}

/// `connections` rings of a server whose entries are at most `mtu_bytes`, at
/// `base` of its pool.
pub fn redo_geometry(mtu_bytes: usize, connections: u32, base: usize) -> RingGeometry {
    let chunk_bytes = entry_bytes(request_bytes(mtu_bytes)).div_ceil(64) * 64;
    RingGeometry {
        connections,
        ring_bytes: chunk_bytes * RING_CHUNKS,
        chunk_bytes,
        state_bytes: 64,
        apply_bytes: 64,
        base,
    }
}

/// Bytes `connections` rings need ([`super::Strategy::reserved_pool_bytes`]).
pub fn redo_area_bytes(mtu_bytes: usize, connections: u32) -> usize {
    redo_geometry(mtu_bytes, connections, 0).area_bytes()
}

/// The most connections whose rings fit in `area_bytes` (0: none fit).
pub fn connections_fitting(mtu_bytes: usize, area_bytes: usize) -> u32 {
    let max = rowankv_drpc::layout::CONNECTIONS_MAX;
    (1..=max)
        .rev()
        .find(|&c| redo_area_bytes(mtu_bytes, c) <= area_bytes)
        .unwrap_or(0)
}

/// Bytes of an encoded offer: conn, qp (node, qpn), ring (node, rkey, len),
/// next_seq, tail_abs, head_abs.
pub const OFFER_BYTES: usize = 4 + 8 + 16 + 24;

/// An offer as a service answer's private data (little-endian). The geometry is
/// not sent: both ends compute it from the MTU, and the ring's length checks it.
pub fn encode_offer(o: &Offer) -> Vec<u8> {
    let mut out = Vec::with_capacity(OFFER_BYTES);
    out.extend_from_slice(&o.conn.0.to_le_bytes());
    out.extend_from_slice(&o.qp.node.0.to_le_bytes());
    out.extend_from_slice(&o.qp.qpn.0.to_le_bytes());
    out.extend_from_slice(&o.ring.node.0.to_le_bytes());
    out.extend_from_slice(&o.ring.rkey.0.to_le_bytes());
    out.extend_from_slice(&(o.ring.len_bytes as u64).to_le_bytes());
    out.extend_from_slice(&o.next_seq.to_le_bytes());
    out.extend_from_slice(&o.tail_abs.to_le_bytes());
    out.extend_from_slice(&o.head_abs.to_le_bytes());
    out
}

/// An offer sent by `from` for entries of at most `mtu_bytes`: exactly
/// [`OFFER_BYTES`], its queue pair and ring on `from`, its ring one ring long.
pub fn decode_offer(bytes: &[u8], from: NodeId, mtu_bytes: usize) -> Result<Offer, String> {
    if bytes.len() != OFFER_BYTES {
        return Err(format!(
            "a redo ring offer of {} bytes, not {OFFER_BYTES}",
            bytes.len()
        ));
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    // The connection count is the receiver's business: the sender's side of
    // the geometry is the ring and its chunks.
    let geometry = redo_geometry(mtu_bytes, rowankv_drpc::layout::CONNECTIONS_MAX, 0);
    let offer = Offer {
        conn: ConnId(u32_at(0)),
        variant: VARIANT,
        qp: QpAddr {
            node: NodeId(u32_at(4)),
            qpn: QpNum(u32_at(8)),
        },
        ring: RemoteRegion {
            node: NodeId(u32_at(12)),
            rkey: Rkey(u32_at(16)),
            len_bytes: usize::try_from(u64_at(20)).map_err(|_| "a ring of over 2^64 bytes")?,
        },
        geometry,
        next_seq: u64_at(28),
        tail_abs: u64_at(36),
        head_abs: u64_at(44),
    };
    if offer.qp.node != from || offer.ring.node != from {
        return Err(format!(
            "a redo ring offer naming another node, sent by {from}"
        ));
    }
    if offer.ring.len_bytes != geometry.ring_bytes {
        return Err(format!(
            "a ring of {} bytes, not the {} an MTU of {mtu_bytes} B gives (the servers' MTUs differ?)",
            offer.ring.len_bytes, geometry.ring_bytes
        ));
    }
    if offer.conn.0 >= geometry.connections || offer.next_seq == 0 {
        return Err(format!(
            "a redo ring offer out of range (connection {}, next seq {})",
            offer.conn.0, offer.next_seq
        ));
    }
    if offer.head_abs > offer.tail_abs {
        return Err("a redo ring offer whose head is past its tail".into());
    }
    Ok(offer)
}

/// The pieces of `entry` (whole encoded blocks) as requests of at most `max`
/// bytes, cut at block boundaries.
fn pieces(entry: &[u8], max: usize) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let (mut start, mut at) = (0, 0);
    while at < entry.len() {
        let (h, _) =
            entry::parse_block(&entry[at..]).map_err(|e| format!("block at byte {at}: {e}"))?;
        let len = h.padded_len();
        if len > max {
            return Err(format!("a block of {len} B exceeds a ring chunk's {max} B"));
        }
        if at + len - start > max {
            out.push(&entry[start..at]);
            start = at;
        }
        at += len;
    }
    if at > start {
        out.push(&entry[start..at]);
    }
    Ok(out)
}

/// A request waiting for room in the sender's window.
struct Queued {
    piece: Vec<u8>,
    /// The token it acknowledges once durable (the entry's last piece).
    token: Option<u64>,
    since_ns: u64,
}

/// One backup's connection.
struct Path<N: Nic> {
    sender: Sender<N>,
    /// Requests posted: seq, the token its durability acknowledges, since when.
    posted: VecDeque<(u64, Option<u64>, u64)>,
    queued: VecDeque<Queued>,
}

/// The `drpc` strategy's replicator of one worker.
pub struct DrpcReplicator<N: Nic> {
    paths: HashMap<NodeId, Path<N>>,
    /// The largest request: a ring chunk's payload at this server's MTU.
    payload_max: usize,
    timeout_ns: u64,
    failures: Vec<(u64, String)>,
    events: Vec<Event>,
}

impl<N: Nic> DrpcReplicator<N> {
    /// A replicator for entries of blocks of at most `mtu_bytes`; a hand-over
    /// not durable within `timeout_ns` gives its path up.
    pub fn new(mtu_bytes: usize, timeout_ns: u64) -> Self {
        DrpcReplicator {
            paths: HashMap::new(),
            payload_max: redo_geometry(mtu_bytes, 1, 0).payload_bytes_max(),
            timeout_ns,
            failures: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Give `backup`'s path up: every token it holds fails, and the next entry
    /// for the backup dials anew.
    fn fail_path(&mut self, backup: NodeId, why: &str) {
        let Some(p) = self.paths.remove(&backup) else {
            return;
        };
        p.sender.close();
        let tokens = p
            .posted
            .into_iter()
            .filter_map(|(_, t, _)| t)
            .chain(p.queued.into_iter().filter_map(|q| q.token));
        for t in tokens {
            self.failures
                .push((t, format!("replication to {backup} by durable RPC: {why}")));
        }
        tracing::info!(%backup, why, "a durable-RPC replication path given up: dialling anew");
    }

    /// Post what the window takes; `Err` gives the path up.
    fn post(path: &mut Path<N>) -> Result<bool, DrpcError> {
        let mut did = false;
        while let Some(q) = path.queued.front() {
            match path.sender.call(OP_APPEND, &q.piece) {
                Ok(seq) => {
                    let q = path.queued.pop_front().expect("a front");
                    path.posted.push_back((seq, q.token, q.since_ns));
                    did = true;
                }
                Err(DrpcError::WouldBlock) => break,
                Err(e) => return Err(e),
            }
        }
        match path.sender.flush() {
            Ok(()) | Err(DrpcError::WouldBlock) => Ok(did),
            Err(e) => Err(e),
        }
    }
}

impl<N: Nic> Replicator<N> for DrpcReplicator<N> {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        let Some(path) = self.paths.get_mut(&backup) else {
            self.failures
                .push((token, format!("no durable-RPC connection to {backup}")));
            return;
        };
        let split = match pieces(entry, self.payload_max) {
            Ok(p) => p,
            Err(e) => {
                self.failures.push((token, e));
                return;
            }
        };
        let last = split.len().saturating_sub(1);
        for (i, piece) in split.into_iter().enumerate() {
            let piece_token = (i == last).then_some(token);
            // Straight to the sender while nothing waits before it (the sender
            // copies the piece); queued, copied here, only behind others.
            if path.queued.is_empty() {
                match path.sender.call(OP_APPEND, piece) {
                    Ok(seq) => {
                        path.posted.push_back((seq, piece_token, cx.now_ns));
                        continue;
                    }
                    Err(DrpcError::WouldBlock) => {}
                    Err(e) => {
                        // The entry's token fails with the path.
                        path.queued.push_back(Queued {
                            piece: Vec::new(),
                            token: Some(token),
                            since_ns: cx.now_ns,
                        });
                        self.fail_path(backup, &e.to_string());
                        return;
                    }
                }
            }
            path.queued.push_back(Queued {
                piece: piece.to_vec(),
                token: piece_token,
                since_ns: cx.now_ns,
            });
        }
        if let Err(e) = Self::post(path) {
            self.fail_path(backup, &e.to_string());
        }
    }

    fn on_completion(&mut self, _cx: &mut ReplCtx<'_, N>, _c: &Completion, _out: &mut Outcomes) {
        // A sender's completions go to its own queues, polled in `tick`.
    }

    fn on_response(
        &mut self,
        _cx: &mut ReplCtx<'_, N>,
        _peer: rowankv_rpc::endpoint::PeerId,
        _request_id: u64,
        _response: &Response<'_>,
        _out: &mut Outcomes,
    ) {
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.paths.contains_key(&backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        if let LinkKind::Drpc(sender) = link.0 {
            // The old path's tokens fail: nothing says whether they became durable.
            self.fail_path(backup, "replaced by a new connection");
            self.paths.insert(
                backup,
                Path {
                    sender: *sender,
                    posted: VecDeque::new(),
                    queued: VecDeque::new(),
                },
            );
        }
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.failures.is_empty();
        out.failed.append(&mut self.failures);
        let backups: Vec<NodeId> = self.paths.keys().copied().collect();
        for backup in backups {
            let path = self.paths.get_mut(&backup).expect("listed");
            self.events.clear();
            let polled = path.sender.poll(&mut self.events);
            for ev in self.events.drain(..) {
                match ev {
                    Event::Durable { seq } => {
                        while path.posted.front().is_some_and(|&(s, _, _)| s <= seq) {
                            let (_, token, _) = path.posted.pop_front().expect("a front");
                            out.acked.extend(token);
                            did = true;
                        }
                    }
                    Event::Completed { seq, reply } => {
                        if !reply.is_empty() {
                            tracing::error!(
                                %backup, seq,
                                reply = %String::from_utf8_lossy(&reply),
                                "the backup could not append a replicated entry"
                            );
                        }
                    }
                }
            }
            let posted = polled.and_then(|_| Self::post(path));
            let why = match posted {
                Ok(p) => {
                    did |= p;
                    let oldest = path
                        .posted
                        .front()
                        .map(|p| p.2)
                        .into_iter()
                        .chain(path.queued.front().map(|q| q.since_ns))
                        .min();
                    oldest
                        .filter(|&t| cx.now_ns.saturating_sub(t) >= self.timeout_ns)
                        .map(|_| format!("not durable within {} ms", self.timeout_ns / 1_000_000))
                }
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = why {
                self.fail_path(backup, &why);
                did = true;
            }
        }
        out.failed.append(&mut self.failures);
        did
    }
}

/// What a backup's redo role does with a request: append its blocks to the
/// b-log (module documentation: idempotent, durable before it returns).
///
/// A request the b-log has no room for is deferred ([`NotNow`]), never waited
/// for inside `execute`: it stays durable in its ring, its connection's later
/// requests wait behind it, and the role's other work — the digest, the
/// cleaners, the other connections, whose commit records let the digest
/// commit segments the cleaners then free — goes on. Its sender's window stops
/// opening meanwhile (back-pressure); one that stays shut past the
/// replication timeout fails the sender's path, and the configuration manager
/// takes it from there, as for any backup that stops answering.
pub struct Appender<N: Nic> {
    engine: Arc<Engine>,
    blog: Arc<BackupLog<N>>,
    /// How far into the engine's segment reserve an append reaches: the
    /// reserve's replay part only while the rings are replayed at recovery.
    reach: Reach,
    /// A fault site: answers "no room" as if the b-log were full.
    no_room_fault: Option<Box<dyn FnMut() -> bool + Send>>,
    /// Blocks appended, and requests refused (blocks that did not parse).
    pub appended: u64,
    pub refused: u64,
}

impl<N: Nic> Operator for Appender<N> {
    fn execute(&mut self, _state: &StateView<'_>, request: &Request<'_>) -> Result<Effect, NotNow> {
        let bytes = request.payload;
        if request.op != OP_APPEND {
            self.refused += 1;
            return Ok(refusal(format!("unknown operation {}", request.op)));
        }
        let mut at = 0;
        while at < bytes.len() {
            match entry::parse_block(&bytes[at..]) {
                Ok((h, _)) => at += h.padded_len(),
                Err(e) => {
                    self.refused += 1;
                    tracing::error!(
                        conn = request.conn.0, seq = request.seq, error = %e,
                        "a replicated request whose blocks do not parse: not appended"
                    );
                    return Ok(refusal(format!("block at byte {at}: {e}")));
                }
            }
        }
        if self.reach != Reach::Replay && self.no_room_fault.as_mut().is_some_and(|f| f()) {
            return Err(NotNow(
                "the b-log has no free segment (an injected fault)".into(),
            ));
        }
        match self
            .engine
            .append_backup_reaching(BLOG_INDEX, bytes, self.reach)
        {
            Ok(sealed) => {
                if let Some(seg) = sealed {
                    self.blog.enqueue_used(seg);
                }
                self.appended += 1;
                Ok(Effect::default())
            }
            // The request is durable in the ring and its sender counts it
            // replicated: it waits there (see above), never dropped.
            Err(EngineError::OutOfSpace) => Err(NotNow(format!(
                "the b-log has no free segment ({} free, {} held for the rings' replay)",
                self.engine.free_segments(),
                self.engine.segment_floors()[1]
            ))),
            Err(e) => Err(NotNow(format!("appending to the b-log: {e}"))),
        }
    }
}

fn refusal(why: String) -> Effect {
    let mut reply = why.into_bytes();
    reply.truncate(flow().reply_bytes_max);
    Effect {
        writes: Vec::new(),
        reply,
    }
}

/// A backup's redo rings and who holds each connection.
pub struct RedoRings<N: Nic> {
    receiver: Receiver<N, Appender<N>>,
    /// Connection of each sending worker, and the sender's process.
    conns: HashMap<(NodeId, u16), (ConnId, u64)>,
    free: Vec<ConnId>,
    /// Connections whose release waits for room in the b-log (their sender
    /// left): freed once released.
    releasing: Vec<ConnId>,
    /// Requests deferred so far, as last seen (a change starts or ends a
    /// stall, logged once).
    deferred_seen: u64,
    stalled: bool,
    /// CommitVer records taken ahead of their turn ([`RedoRings::poll`]).
    pub commits_read_ahead: u64,
}

/// Segments that hold whatever `connections` rings of `geometry` can hold,
/// appended request by request to a b-log of `segment_bytes` segments: each
/// segment left is filled past `segment_bytes - mtu_bytes` (an append goes to
/// the next segment only when it does not fit), plus the one being filled.
pub fn replay_reserve_segments(
    geometry: &RingGeometry,
    mtu_bytes: usize,
    segment_bytes: usize,
) -> usize {
    let ring_total = geometry.connections as usize * geometry.ring_bytes;
    let filled_at_least = segment_bytes.saturating_sub(mtu_bytes).max(1);
    ring_total.div_ceil(filled_at_least) + 1
}

impl<N: Nic> RedoRings<N> {
    /// Open the rings in `engine`'s reserved area, formatting a never-formatted
    /// one (a zeroed header), and re-execute what they hold into the b-log.
    /// Returns the rings and how many requests recovery re-executed.
    pub fn open(
        engine: Arc<Engine>,
        blog: Arc<BackupLog<N>>,
        nic: N,
    ) -> Result<(Self, usize), String> {
        let mtu = engine.config().mtu_bytes;
        let pool: Arc<Pool> = engine.pool().clone();
        let (base, len) = engine.reserved_area();
        let connections = connections_fitting(mtu, len);
        if connections == 0 {
            return Err(format!(
                "the pool keeps {len} B after its segments; the drpc strategy's redo rings need \
                 at least {} B (a pool formatted under another strategy: format it again under \
                 drpc)",
                redo_area_bytes(mtu, 1)
            ));
        }
        let geometry = redo_geometry(mtu, connections, base);
        if pool.read_u64(base) == 0 {
            Receiver::<N, Appender<N>>::format(&pool, geometry).map_err(|e| e.to_string())?;
        }
        // Acknowledged entries in the rings must always find room in the
        // b-log: room for all the rings can hold is held back for their replay
        // at recovery, and a quarter as much again (at least two segments) for
        // the redo role and the cleaners when ordinary writes are refused.
        let replay = replay_reserve_segments(&geometry, mtu, engine.config().segment_size_bytes);
        engine
            .set_segment_reserve(replay, replay.div_ceil(4).max(2))
            .map_err(|e| format!("the redo rings' segment reserve: {e}"))?;
        let appender = Appender {
            engine,
            blog,
            reach: Reach::Replay,
            no_room_fault: None,
            appended: 0,
            refused: 0,
        };
        let (mut receiver, report) =
            Receiver::open_at(pool, base, nic, flow(), appender).map_err(|e| match e {
                DrpcError::NotNow { conn, seq, why } => format!(
                    "the redo rings hold acknowledged requests the b-log has no room for \
                     (connection {}, request {seq}: {why}); they stay in the rings: open the \
                     pool again once it has room (a larger pool, larger segments)",
                    conn.0
                ),
                e => format!("the redo rings: {e}"),
            })?;
        receiver.operator_mut().reach = Reach::Maintenance;
        let formatted = receiver.geometry();
        if (formatted.ring_bytes, formatted.chunk_bytes)
            != (geometry.ring_bytes, geometry.chunk_bytes)
        {
            return Err(format!(
                "the redo rings were formatted as {formatted:?}, this server's MTU needs \
                 {geometry:?}"
            ));
        }
        let rings = RedoRings {
            receiver,
            conns: HashMap::new(),
            free: (0..formatted.connections).rev().map(ConnId).collect(),
            releasing: Vec::new(),
            deferred_seen: 0,
            stalled: false,
            commits_read_ahead: 0,
        };
        Ok((
            rings,
            report.reexecuted.len() + usize::from(report.redone.is_some()),
        ))
    }

    /// Accept worker `key.worker` of `from.node` (its sender's queue pair is
    /// `from`): the connection it had, released first, or a free one.
    ///
    /// A dial from another process of the sender (it restarted) first releases
    /// and frees every connection of the process before, so a restarted sender
    /// with fewer workers leaves none taken. (Incarnations are random, so a
    /// late dial of the process before looks the same and takes the slots back;
    /// the live process's next replication fails and dials again.)
    pub fn accept(&mut self, from: QpAddr, key: PathKey) -> Result<Offer, String> {
        let slot = (from.node, key.worker);
        let older: Vec<(NodeId, u16)> = self
            .conns
            .iter()
            .filter(|(&(n, w), &(_, inc))| {
                n == from.node && inc != key.incarnation && w != key.worker
            })
            .map(|(&s, _)| s)
            .collect();
        for s in older {
            let (conn, _) = self.conns.remove(&s).expect("listed");
            self.release_or_defer(conn);
        }
        let conn = match self.conns.get(&slot) {
            Some(&(conn, _)) => {
                // Not released yet (the b-log is out of room): the sender
                // dials again later, and meanwhile keeps its slot.
                self.receiver
                    .release(conn)
                    .map_err(|e| format!("the redo ring's connection is not free yet: {e}"))?;
                conn
            }
            None => self.free.pop().ok_or_else(|| {
                format!(
                    "all {} redo ring connections are taken",
                    self.receiver.geometry().connections
                )
            })?,
        };
        self.conns.insert(slot, (conn, key.incarnation));
        self.receiver
            .accept(conn, VARIANT, from)
            .map_err(|e| format!("the redo ring: {e}"))
    }

    /// Release every connection of `sender` (removed from the configuration):
    /// what landed is executed, nothing more lands. Returns how many.
    pub fn disconnect(&mut self, sender: NodeId) -> usize {
        let theirs: Vec<(NodeId, u16)> = self
            .conns
            .keys()
            .filter(|(n, _)| *n == sender)
            .copied()
            .collect();
        for slot in &theirs {
            let (conn, _) = self.conns.remove(slot).expect("listed");
            self.release_or_defer(conn);
        }
        theirs.len()
    }

    /// Release `conn` and free it, or, while what landed on it waits for room
    /// in the b-log, keep it to finish later ([`RedoRings::poll`]).
    fn release_or_defer(&mut self, conn: ConnId) {
        match self.receiver.release(conn) {
            Ok(_) => self.free.push(conn),
            Err(e) => {
                tracing::warn!(conn = conn.0, error = %e, "a redo ring connection is released later");
                self.releasing.push(conn);
            }
        }
    }

    /// One round of the redo role; requests executed.
    pub fn poll(&mut self) -> usize {
        let mut still = Vec::new();
        for conn in std::mem::take(&mut self.releasing) {
            match self.receiver.release(conn) {
                Ok(_) => self.free.push(conn),
                Err(_) => still.push(conn),
            }
        }
        self.releasing = still;
        let done = self.receiver.poll().unwrap_or_else(|e| {
            tracing::error!(error = %e, "redo rings");
            0
        });
        self.note_stall(done);
        if self.stalled {
            self.read_commits_ahead();
        }
        done
    }

    /// While requests wait for room in the b-log, take the CommitVer records
    /// waiting behind them into the digest's CommitVer now (the records are
    /// executed, and appended, later, in order). Without this the wait could
    /// last for ever: the b-log's segments are freed only once committed, and
    /// the records that commit them may be the very ones waiting. Taking one
    /// early is safe: ⟨shard, V⟩ says every entry of the shard up to V is
    /// durable on every replica, which was true when its primary sent it, and
    /// it only lets b-log segments whose entries are all covered be committed
    /// — entries still in a ring are in no segment. Returns how many.
    fn read_commits_ahead(&mut self) -> usize {
        let mut commits = Vec::new();
        for c in 0..self.receiver.geometry().connections {
            self.receiver.for_each_waiting(ConnId(c), |_, op, payload| {
                if op != OP_APPEND {
                    return;
                }
                let mut at = 0;
                while let Ok((h, _)) = entry::parse_block(&payload[at..]) {
                    if h.kind == entry::Kind::Commit {
                        commits.push((h.shard, h.version.0));
                    }
                    at += h.padded_len();
                    if at >= payload.len() {
                        break;
                    }
                }
            });
        }
        let blog = &self.receiver.operator().blog;
        for &(shard, version) in &commits {
            blog.note_commit_version(shard, version);
        }
        self.commits_read_ahead += commits.len() as u64;
        commits.len()
    }

    /// Install a fault site ([`Appender`]): while it answers `true` the
    /// redo role (never the replay) finds no room in the b-log.
    pub fn set_no_room_fault(&mut self, fault: Box<dyn FnMut() -> bool + Send>) {
        self.receiver.operator_mut().no_room_fault = Some(fault);
    }

    /// Stalled: a round deferred requests and executed none. Logged once
    /// when a stall starts and when it ends.
    fn note_stall(&mut self, done: usize) {
        let deferred = self.receiver.stats().deferred;
        let deferring = deferred > self.deferred_seen;
        self.deferred_seen = deferred;
        if deferring && done == 0 && !self.stalled {
            self.stalled = true;
            tracing::warn!(
                free_segments = self.receiver.operator().engine.free_segments(),
                "the b-log is out of room: acknowledged requests wait in the redo rings"
            );
        } else if self.stalled && done > 0 {
            self.stalled = false;
            tracing::info!("the redo rings execute again");
        }
    }

    /// Execute everything that has landed (before a failover walk). An error
    /// says some of it waits for room in the b-log: the walk must wait too.
    pub fn drain(&mut self) -> Result<usize, String> {
        let drained = self.receiver.drain().map_err(|e| e.to_string());
        self.note_stall(*drained.as_ref().unwrap_or(&0));
        drained
    }

    /// Whether requests wait for room in the b-log, none executed since the
    /// wait began.
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    /// Requests the redo role deferred for want of room in the b-log, since
    /// the rings were opened.
    pub fn deferred(&self) -> u64 {
        self.receiver.stats().deferred
    }

    /// Connections not held by any sending worker.
    pub fn connections_free(&self) -> usize {
        self.free.len()
    }

    /// Requests executed since the rings were opened, and refused.
    pub fn counts(&self) -> (u64, u64) {
        let a = self.receiver.operator();
        (a.appended, a.refused)
    }
}

/// Re-execute what the redo rings in `engine`'s pool hold into its b-log, as a
/// restarted server's [`RedoRings::open`] does, without a server (tests of
/// crash images, tools): on a NIC of a private fabric, which nothing reaches.
/// Returns how many requests were re-executed.
pub fn replay_rings(engine: Arc<Engine>) -> Result<usize, String> {
    use rowankv_fabric::Fabric;
    let fabric = rowankv_fabric::LoopbackFabric::new();
    let nic = fabric.attach(NodeId(u32::MAX)).map_err(|e| e.to_string())?;
    let blog = Arc::new(
        BackupLog::passive(engine.clone(), rowankv_engine::BackupLogConfig::default())
            .map_err(|e| e.to_string())?,
    );
    RedoRings::open(engine, blog, nic).map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_round_trips_and_bad_ones_are_refused() {
        let mtu = 4096;
        let g = redo_geometry(mtu, rowankv_drpc::layout::CONNECTIONS_MAX, 0);
        let o = Offer {
            conn: ConnId(5),
            variant: VARIANT,
            qp: QpAddr {
                node: NodeId(3),
                qpn: QpNum(77),
            },
            ring: RemoteRegion {
                node: NodeId(3),
                rkey: Rkey(9),
                len_bytes: g.ring_bytes,
            },
            geometry: g,
            next_seq: 12,
            tail_abs: 8192,
            head_abs: 4096,
        };
        let b = encode_offer(&o);
        assert_eq!(b.len(), OFFER_BYTES);
        assert_eq!(decode_offer(&b, NodeId(3), mtu), Ok(o));
        let e = decode_offer(&b, NodeId(4), mtu).unwrap_err();
        assert!(e.contains("another node"), "{e}");
        let e = decode_offer(&b, NodeId(3), 8192).unwrap_err();
        assert!(e.contains("MTUs differ"), "{e}");
        let e = decode_offer(&b[..OFFER_BYTES - 1], NodeId(3), mtu).unwrap_err();
        assert!(e.contains("not 52"), "{e}");
        let mut bad = o;
        bad.head_abs = 9000;
        assert!(decode_offer(&encode_offer(&bad), NodeId(3), mtu).is_err());
        bad = o;
        bad.conn = ConnId(rowankv_drpc::layout::CONNECTIONS_MAX);
        assert!(decode_offer(&encode_offer(&bad), NodeId(3), mtu).is_err());
    }

    #[test]
    fn an_entry_is_cut_into_requests_at_block_boundaries() {
        use rowankv_types::{ShardId, Version};
        let mtu = 4096;
        let max = redo_geometry(mtu, 1, 0).payload_bytes_max();
        let mut small = Vec::new();
        entry::encode(
            &mut small,
            entry::Kind::Put,
            ShardId(1),
            Version(3),
            b"k",
            b"v",
            mtu,
        )
        .unwrap();
        assert_eq!(pieces(&small, max).unwrap(), vec![&small[..]]);
        // A large value spans several blocks of at most an MTU each: each request
        // holds whole blocks, in order, and together they are the entry.
        let mut large = Vec::new();
        let blocks = entry::encode(
            &mut large,
            entry::Kind::Put,
            ShardId(1),
            Version(4),
            b"big",
            &vec![7u8; 3 * mtu],
            mtu,
        )
        .unwrap();
        assert!(blocks >= 4, "{blocks} blocks");
        let cut = pieces(&large, max).unwrap();
        assert!(cut.len() >= 3, "{} pieces", cut.len());
        assert!(cut.iter().all(|p| p.len() <= max));
        assert_eq!(cut.concat(), large);
        for p in &cut {
            let (h, _) = entry::parse_block(p).unwrap();
            assert!(h.padded_len() <= p.len(), "a piece starts at a block");
        }
        // Bytes that are not blocks are refused, not sent.
        let e = pieces(&[0xEE; 128], max).unwrap_err();
        assert!(e.contains("block at byte 0"), "{e}");
    }

    #[test]
    fn the_largest_entry_block_fits_a_request_and_the_area_is_small() {
        for mtu in [entry::MTU_BYTES_MIN, 4096, entry::MTU_BYTES_MAX] {
            let g = redo_geometry(mtu, CONNECTIONS_DEFAULT, 0);
            assert!(g.validate().is_ok(), "{mtu}: {:?}", g.validate());
            assert!(g.payload_bytes_max() >= mtu, "{mtu}");
            for c in [1, 7, CONNECTIONS_DEFAULT] {
                assert_eq!(
                    connections_fitting(mtu, redo_area_bytes(mtu, c)),
                    c,
                    "{mtu} {c}"
                );
                assert_eq!(connections_fitting(mtu, redo_area_bytes(mtu, c) - 1), c - 1);
            }
        }
        // 128 connections of 4 chunks at the default MTU: about 2 MiB.
        let bytes = redo_area_bytes(4096, CONNECTIONS_DEFAULT);
        assert!(bytes < 5 << 19, "{bytes}");
    }
}
