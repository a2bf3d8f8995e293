//! The receiver: the redo rings in its pool, the processing of their requests, and
//! recovery after a crash.
//!
//! It owns, per connection, a ring and a header in PM (`head_abs`: ring bytes before
//! it are free; `done_seq`: every request up to it has taken effect), and, shared by
//! all connections, one apply record (the redo log of the request being executed).
//! It is a state machine driven by [`Receiver::poll`]; it starts no thread.
//!
//! # Processing one request (`complete_next`)
//! 1. the operator executes it and returns its state writes and reply — or defers it
//!    ([`crate::NotNow`]): nothing of it takes effect, it stays in the ring, and the
//!    connection's later requests wait behind it until a later poll;
//! 2. if it writes: the apply record `(conn, seq, writes)` is written and persisted —
//!    the commit point — then the writes are stored and persisted;
//! 3. `done_seq` (and `head_abs`, when the request was the last of its entry) are
//!    stored in the connection's header line and persisted together;
//! 4. the reply goes to the sender.
//!
//! A request with no state writes skips step 2: re-executing it changes nothing.
//!
//! # Invariants
//! - Entries of a connection are processed in seq order, one request at a time.
//!   SFlush and WFlush never make the receiver's CPU persist an entry: it may execute
//!   one whose flush is still in flight (the SEND landed, or WFlush's seq word landed,
//!   before the NIC's persist completed). Exactly-once does not need the entry: an
//!   executed request is covered by `done_seq` or the apply record; and no later
//!   entry can have been acknowledged before this one's flush completed (one queue
//!   pair executes in order), so recovery's chain is never broken before an
//!   acknowledged entry. For RFlush the receiver persists each entry it finds before
//!   it notifies the sender (the emulated RFlush), in ring order.
//! - The apply record is overwritten only after the previous request's `done_seq` is
//!   durable, so a whole apply record whose `seq` is `done_seq + 1` of its connection
//!   is the one request that may have taken effect without its completion mark.
//! - `done_seq` and `head_abs` only grow.
//! - For the SEND variants the posted receive buffers are exactly the ring chunks of
//!   `[chunk_start(head_abs), chunk_start(head_abs) + ring_bytes)`, in ring order.

use std::collections::VecDeque;
use std::sync::Arc;

use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, MemoryRegion, Nic, Op, QpAddr, QueuePair,
    RecvBuffer, RegionMemory, RemoteRegion, SharedReceiveQueue, SrqConfig, WcStatus, WorkRequest,
};
use rowankv_pmem::Pool;

use crate::layout::{
    self, apply_record_bytes, encode_apply_record, encode_reply, read_apply_record, read_entry,
    ApplyRecord, Entry, Reply, ReplyKind, RingGeometry, CONN_HEADER_BYTES, ENTRY_ALIGN_BYTES,
    POOL_HEADER_BYTES,
};
use crate::{ConnId, DrpcError, FlowConfig, NotNow, Operator, Request, StateView, Variant};

/// Completions moved per poll call.
const POLL_BATCH: usize = 32;
/// Polls of the send CQ while waiting for a send-queue slot for a reply. The sender
/// bounds replies in flight, so this waits only for the fabric's acknowledgements.
const REPLY_SLOT_POLLS_MAX: usize = 10_000_000;

/// What a sender needs to use a connection (exchanged out of band).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub conn: ConnId,
    pub variant: Variant,
    /// The receiver's queue pair of this connection.
    pub qp: QpAddr,
    /// The connection's ring.
    pub ring: RemoteRegion,
    pub geometry: RingGeometry,
    /// The seq the sender's next request must carry. After a restart every request
    /// below it is in the ring and has been re-executed: the sender resends only
    /// requests from `next_seq` on, none of which it saw acknowledged as durable.
    pub next_seq: u64,
    /// Where the sender's next entry goes.
    pub tail_abs: u64,
    /// The receiver's truncation point.
    pub head_abs: u64,
}

/// What recovery found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The request whose logged effect was redone from the apply record.
    pub redone: Option<(ConnId, u64)>,
    /// Requests re-executed from the rings, in execution order.
    pub reexecuted: Vec<(ConnId, u64)>,
    /// Per connection, the seq its sender continues with.
    pub next_seq: Vec<u64>,
}

/// Counters of a receiver since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    pub entries_found: u64,
    pub requests_completed: u64,
    /// RFlush: entries persisted by the receiver's CPU and notified.
    pub durable_notices: u64,
    pub replies_sent: u64,
    pub slow_down_replies: u64,
    /// CPU persists of the ring, the apply record, the state and the headers.
    pub persists: u64,
    /// Requests the operator answered [`NotNow`] (each offered again later).
    pub deferred: u64,
}

struct Found {
    abs: u64,
    entry: Entry,
}

/// The volatile mirror of a connection's ring.
struct ConnLog {
    head_abs: u64,
    done_seq: u64,
    /// Where the next entry is looked for, and its seq.
    scan_abs: u64,
    expect_seq: u64,
    /// Entries found and not fully completed, in seq order.
    backlog: VecDeque<Found>,
    /// A release closed the connection but could not yet execute all that had
    /// landed (the operator answered [`NotNow`]): the variant it had, until a
    /// later [`Receiver::release`] finishes.
    releasing: Option<Variant>,
}

impl ConnLog {
    /// Requests found and not yet completed.
    fn backlog_requests(&self) -> u64 {
        self.backlog
            .back()
            .map_or(0, |f| f.entry.end_seq() - 1 - self.done_seq)
    }
}

struct Conn<N: Nic> {
    variant: Variant,
    qp: N::Qp,
    send_cq: N::Cq,
    recv_cq: N::Cq,
    srq: Option<N::Srq>,
    ring_mr: MemoryRegion,
    send_depth: usize,
    /// SEND variants: end of the last ring chunk posted as a receive buffer.
    posted_through_abs: u64,
    /// A reply failed: the sender is gone. Requests are still processed.
    broken: bool,
}

/// The receiving end of durable RPCs. See the module documentation.
pub struct Receiver<N: Nic, O: Operator> {
    pool: Arc<Pool>,
    nic: N,
    geometry: RingGeometry,
    flow: FlowConfig,
    operator: O,
    logs: Vec<ConnLog>,
    conns: Vec<Option<Conn<N>>>,
    next_conn: usize,
    /// Per connection: its next request was deferred in this `poll` (kept
    /// here so that a poll allocates nothing).
    deferred_in_poll: Vec<bool>,
    stats: ReceiverStats,
}

impl<N: Nic, O: Operator> Receiver<N, O> {
    /// Lays out an empty ring set of `geometry` in `pool` (its previous contents are
    /// lost). The pool header is written last, so a crash while formatting leaves a
    /// pool that does not open.
    pub fn format(pool: &Pool, geometry: RingGeometry) -> Result<(), DrpcError> {
        geometry.validate().map_err(DrpcError::Config)?;
        if pool.len_bytes() < geometry.pool_bytes() {
            return Err(DrpcError::Pool(format!(
                "pool of {} bytes is smaller than the {} bytes the geometry needs",
                pool.len_bytes(),
                geometry.pool_bytes()
            )));
        }
        let base = geometry.base;
        let headers = geometry.apply_offset() + geometry.apply_bytes - base;
        pool.write(base, &vec![0u8; headers]);
        let rings = geometry.ring_offset(ConnId(0));
        let rest = geometry.pool_bytes() - rings;
        pool.write(rings, &vec![0u8; rest]);
        pool.persist(base, geometry.area_bytes());
        pool.write(base, &geometry.encode_pool_header());
        pool.persist(base, POOL_HEADER_BYTES);
        Ok(())
    }

    /// Opens the area of a pool of its own (at offset 0): [`Receiver::open_at`].
    pub fn open(
        pool: Arc<Pool>,
        nic: N,
        flow: FlowConfig,
        operator: O,
    ) -> Result<(Self, RecoveryReport), DrpcError> {
        Self::open_at(pool, 0, nic, flow, operator)
    }

    /// Opens a formatted pool and recovers it: redoes the logged effect of a request
    /// that had committed but not completed, then re-executes, in seq order, every
    /// durable request of every ring past its connection's `done_seq`. Afterwards
    /// every ring is empty and each connection resumes at a fresh chunk.
    ///
    /// `base`: where the area starts in `pool` (the geometry's `base`).
    pub fn open_at(
        pool: Arc<Pool>,
        base: usize,
        nic: N,
        flow: FlowConfig,
        operator: O,
    ) -> Result<(Self, RecoveryReport), DrpcError> {
        flow.validate().map_err(DrpcError::Config)?;
        let mut h = [0u8; POOL_HEADER_BYTES];
        if pool.len_bytes() < base.saturating_add(POOL_HEADER_BYTES) {
            return Err(DrpcError::Pool("pool smaller than its header".into()));
        }
        pool.read(base, &mut h);
        let mut geometry = RingGeometry::decode_pool_header(&h).map_err(DrpcError::Pool)?;
        geometry.base = base;
        geometry.validate().map_err(DrpcError::Pool)?;
        if pool.len_bytes() < geometry.pool_bytes() {
            return Err(DrpcError::Pool(format!(
                "pool of {} bytes, its header needs {}",
                pool.len_bytes(),
                geometry.pool_bytes()
            )));
        }
        let mut logs = Vec::with_capacity(geometry.connections as usize);
        for c in 0..geometry.connections {
            let off = geometry.conn_header_offset(ConnId(c));
            let head_abs = pool.read_u64(off);
            let done_seq = pool.read_u64(off + 8);
            if head_abs > layout::ABS_MAX || done_seq >= layout::SEQ_MAX {
                return Err(DrpcError::Pool(format!(
                    "connection {c}: header out of range (head_abs {head_abs}, done_seq {done_seq})"
                )));
            }
            logs.push(ConnLog {
                head_abs,
                done_seq,
                scan_abs: head_abs,
                expect_seq: done_seq + 1,
                backlog: VecDeque::new(),
                releasing: None,
            });
        }
        let mut r = Receiver {
            pool,
            nic,
            geometry,
            flow,
            operator,
            logs,
            conns: (0..geometry.connections).map(|_| None).collect(),
            next_conn: 0,
            deferred_in_poll: vec![false; geometry.connections as usize],
            stats: ReceiverStats::default(),
        };
        let report = r.recover()?;
        Ok((r, report))
    }

    /// Recovery. An operator answering [`NotNow`] here is an error: the server
    /// cannot serve before its rings are executed. What was executed before it
    /// stays executed (each completion is durable), so opening again later
    /// (with room made) goes on from that request.
    fn recover(&mut self) -> Result<RecoveryReport, DrpcError> {
        let g = self.geometry;
        let mut report = RecoveryReport::default();
        // The apply record: a committed effect whose completion mark may be missing.
        if let Some(rec) = read_apply_record(&self.pool, &g) {
            if rec.conn.0 < g.connections && rec.seq == self.logs[rec.conn.0 as usize].done_seq + 1
            {
                self.apply_writes(&rec);
                let log = &mut self.logs[rec.conn.0 as usize];
                log.done_seq = rec.seq;
                let off = g.conn_header_offset(rec.conn);
                self.pool.write_u64(off + 8, rec.seq);
                self.persist(off, CONN_HEADER_BYTES);
                report.redone = Some((rec.conn, rec.seq));
            }
        }
        for c in 0..g.connections {
            let conn = ConnId(c);
            // The chain starts at head_abs with the entry holding done_seq + 1, or
            // ending just before it (its completion mark was persisted, its
            // truncation was not). See docs/drpc.md, "Finding the chain".
            let want = self.logs[c as usize].done_seq + 1;
            let mut at = self.logs[c as usize].head_abs;
            let mut first = true;
            let mut expect = want;
            loop {
                let accept = |e: &Entry| {
                    if first {
                        e.seq <= want && want <= e.end_seq()
                    } else {
                        e.seq == expect
                    }
                };
                let Some((abs, entry)) = self.find(conn, at, accept) else {
                    break;
                };
                first = false;
                expect = entry.end_seq();
                at = abs + entry.len_bytes as u64;
                self.logs[c as usize]
                    .backlog
                    .push_back(Found { abs, entry });
                while self.logs[c as usize].backlog.front().is_some() {
                    if self.front_is_done(conn) {
                        self.retire_front(conn);
                        continue;
                    }
                    let (seq, _) = self.complete_next(conn)?;
                    report.reexecuted.push((conn, seq));
                }
            }
            // Resume at a fresh chunk: a SEND variant's receive buffers start at one.
            let log = &mut self.logs[c as usize];
            let resume = layout::align_up(at.max(log.head_abs) as usize, g.chunk_bytes) as u64;
            if resume != log.head_abs {
                log.head_abs = resume;
                let off = g.conn_header_offset(conn);
                self.pool.write_u64(off, resume);
                self.persist(off, CONN_HEADER_BYTES);
            }
            let log = &mut self.logs[c as usize];
            log.scan_abs = resume;
            log.expect_seq = log.done_seq + 1;
            report.next_seq.push(log.expect_seq);
        }
        Ok(report)
    }

    /// The entry at `abs`, or at the next chunk's start if `abs` is inside a chunk,
    /// that `accept` takes.
    fn find(
        &self,
        conn: ConnId,
        abs: u64,
        accept: impl Fn(&Entry) -> bool,
    ) -> Option<(u64, Entry)> {
        let g = &self.geometry;
        let ring = g.ring_offset(conn);
        let chunk = g.chunk_bytes as u64;
        let try_at = |a: u64| {
            let room = (chunk - a % chunk) as usize;
            read_entry(&self.pool, ring, g.ring_pos(a), room).filter(&accept)
        };
        if let Some(e) = try_at(abs) {
            return Some((abs, e));
        }
        if !abs.is_multiple_of(chunk) {
            let next = g.chunk_start(abs) + chunk;
            return try_at(next).map(|e| (next, e));
        }
        None
    }

    /// Accepts `conn` from the sender's queue pair `peer`: registers its ring, makes
    /// and connects a queue pair, posts the ring's chunks for the SEND variants.
    pub fn accept(
        &mut self,
        conn: ConnId,
        variant: Variant,
        peer: QpAddr,
    ) -> Result<Offer, DrpcError> {
        let g = self.geometry;
        if conn.0 >= g.connections
            || self.conns[conn.0 as usize].is_some()
            || self.logs[conn.0 as usize].releasing.is_some()
        {
            return Err(DrpcError::BadConnection(conn));
        }
        let access = if variant.uses_send() {
            Access::NONE
        } else {
            Access::REMOTE_WRITE | Access::FLUSH_PERSISTENT
        };
        let memory: Arc<dyn RegionMemory> = self.pool.clone();
        let ring_mr = self
            .nic
            .register(memory, g.ring_offset(conn), g.ring_bytes, access)?;
        let send_depth = self.flow.replies_max() + 4;
        let send_cq = self.nic.create_cq(CqKind::Bounded {
            capacity: send_depth,
        })?;
        // SEND variants: a receive completion per landed entry, at most one per 64 B.
        let recv_cq = self.nic.create_cq(CqKind::Bounded {
            capacity: g.ring_bytes / ENTRY_ALIGN_BYTES + 1,
        })?;
        let srq = if variant.uses_send() {
            Some(self.nic.create_srq(SrqConfig::multi_packet(g.chunks()))?)
        } else {
            None
        };
        let qp = self
            .nic
            .create_qp(&send_cq, &recv_cq, srq.as_ref(), send_depth)?;
        qp.connect(peer)?;
        let log = &self.logs[conn.0 as usize];
        assert!(
            log.backlog.is_empty(),
            "a connection is accepted with an empty backlog"
        );
        let tail_abs = log.scan_abs;
        let head_abs = log.head_abs;
        let next_seq = log.expect_seq;
        let mut c: Conn<N> = Conn {
            variant,
            qp,
            send_cq,
            recv_cq,
            srq,
            ring_mr,
            send_depth,
            posted_through_abs: g.chunk_start(tail_abs),
            broken: false,
        };
        let qp_addr = c.qp.addr();
        let ring = c.ring_mr.remote();
        Self::post_chunks(&g, &mut c, tail_abs)?;
        self.conns[conn.0 as usize] = Some(c);
        Ok(Offer {
            conn,
            variant,
            qp: qp_addr,
            ring,
            geometry: g,
            next_seq,
            tail_abs,
            head_abs,
        })
    }

    /// SEND variants: post the ring chunks up to one ring ahead of `head_abs`'s chunk.
    fn post_chunks(g: &RingGeometry, c: &mut Conn<N>, head_abs: u64) -> Result<(), DrpcError> {
        let Some(srq) = &c.srq else {
            return Ok(());
        };
        let until = g.chunk_start(head_abs) + g.ring_bytes as u64;
        let mut buffers = Vec::new();
        while c.posted_through_abs < until {
            buffers.push(RecvBuffer {
                wr_id: c.posted_through_abs,
                mr: c.ring_mr.clone(),
                offset: g.ring_pos(c.posted_through_abs),
                len_bytes: g.chunk_bytes,
            });
            c.posted_through_abs += g.chunk_bytes as u64;
        }
        if !buffers.is_empty() {
            srq.post_recv(&buffers)?;
        }
        Ok(())
    }

    /// One round of work: take completions, find newly landed entries (persisting and
    /// notifying them for RFlush), and complete up to `requests_per_poll_max`
    /// requests, FIFO per connection, round robin over connections. Returns how many
    /// requests completed.
    pub fn poll(&mut self) -> Result<usize, DrpcError> {
        let n = self.geometry.connections as usize;
        for c in 0..n {
            self.drain_cqs(ConnId(c as u32));
            self.discover(ConnId(c as u32));
        }
        let mut done = 0;
        let mut idle = 0;
        // Connections whose next request the operator deferred: left for a
        // later poll (their order is kept: nothing after it runs first).
        self.deferred_in_poll.fill(false);
        while done < self.flow.requests_per_poll_max && idle < n {
            let c = ConnId(self.next_conn as u32);
            self.next_conn = (self.next_conn + 1) % n;
            if self.deferred_in_poll[c.0 as usize] || self.logs[c.0 as usize].backlog.is_empty() {
                idle += 1;
                continue;
            }
            idle = 0;
            let Ok((seq, reply)) = self.complete_next(c) else {
                self.deferred_in_poll[c.0 as usize] = true;
                idle += 1;
                continue;
            };
            done += 1;
            self.reply(c, ReplyKind::Completed, seq, reply);
            if let Some(conn) = self.conns[c.0 as usize].as_mut() {
                let head = self.logs[c.0 as usize].head_abs;
                Self::post_chunks(&self.geometry, conn, head)?;
            }
        }
        Ok(done)
    }

    fn drain_cqs(&mut self, conn: ConnId) {
        let Some(c) = self.conns[conn.0 as usize].as_mut() else {
            return;
        };
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        for cq in [&c.send_cq, &c.recv_cq] {
            loop {
                match cq.poll(&mut wcs) {
                    Ok(0) => break,
                    Ok(k) => {
                        // The ring, not the receive completions, says what landed
                        // (the same code then serves every variant and recovery).
                        if wcs[..k].iter().any(|w| w.status != WcStatus::Success) {
                            c.broken = true;
                        }
                    }
                    Err(_) => {
                        c.broken = true;
                        break;
                    }
                }
            }
        }
    }

    /// Closes `conn`, so that it can be accepted again (its sender dialled anew,
    /// restarted or left). Every request that landed on it is executed first — its
    /// sender may have seen it durable — then its queue pair is closed and its ring
    /// deregistered (nothing more lands), the ring is scanned once more for what
    /// landed meanwhile, and the connection resumes at a fresh chunk, as after
    /// recovery, with its seqs moved one window on (`done_seq` grows by
    /// `inflight_max`: no request of the old sender can be taken for one of the
    /// next). Requests executed here get no reply. Returns how many.
    ///
    /// If the operator defers a request ([`DrpcError::NotNow`]), the release is
    /// not finished: call it again later (the connection cannot be accepted
    /// meanwhile; if it was closed already, [`Receiver::poll`] goes on executing
    /// what had landed).
    pub fn release(&mut self, conn: ConnId) -> Result<usize, DrpcError> {
        if conn.0 >= self.geometry.connections {
            return Err(DrpcError::BadConnection(conn));
        }
        let open = self.conns[conn.0 as usize].as_ref().map(|c| c.variant);
        let Some(variant) = open.or(self.logs[conn.0 as usize].releasing) else {
            return Ok(0);
        };
        let mut done = 0;
        if open.is_some() {
            done += self.execute_landed(conn, variant)?;
            if let Some(c) = self.conns[conn.0 as usize].take() {
                c.qp.close();
                // The region goes with the connection: a WRITE still on its way fails.
                let _ = self.nic.deregister(c.ring_mr.remote().rkey);
            }
            self.logs[conn.0 as usize].releasing = Some(variant);
        }
        done += self.execute_landed(conn, variant)?;
        let g = self.geometry;
        let log = &mut self.logs[conn.0 as usize];
        let resume =
            layout::align_up(log.scan_abs.max(log.head_abs) as usize, g.chunk_bytes) as u64;
        log.head_abs = resume;
        // The seqs the old sender may still have on their way (its window
        // reaches at most `inflight_max` past `done_seq`) are skipped: a late
        // WRITE of one that lands after all is never taken for the new
        // sender's next request.
        log.done_seq += self.flow.inflight_max as u64;
        let off = g.conn_header_offset(conn);
        self.pool.write_u64(off, resume);
        self.pool.write_u64(off + 8, log.done_seq);
        self.persist(off, CONN_HEADER_BYTES);
        let log = &mut self.logs[conn.0 as usize];
        log.scan_abs = resume;
        log.expect_seq = log.done_seq + 1;
        log.releasing = None;
        Ok(done)
    }

    /// Executes every request that has landed on `conn`, in order.
    fn execute_landed(&mut self, conn: ConnId, variant: Variant) -> Result<usize, DrpcError> {
        let mut done = 0;
        loop {
            self.discover_as(conn, variant);
            if self.logs[conn.0 as usize].backlog.is_empty() {
                return Ok(done);
            }
            while !self.logs[conn.0 as usize].backlog.is_empty() {
                if self.front_is_done(conn) {
                    self.retire_front(conn);
                    continue;
                }
                self.complete_next(conn)?;
                done += 1;
            }
        }
    }

    /// Executes every request that had landed on any connection when it was
    /// called (each replied to as [`Receiver::poll`] does), and no more: one
    /// discovery per connection finds them all (a sender has at most a window of
    /// requests not completed), so a drain under steady traffic ends. Returns how
    /// many.
    ///
    /// A request the operator defers ([`DrpcError::NotNow`], the first such)
    /// leaves its connection's rest waiting; the others are drained all the
    /// same, and the error says the drain is not complete.
    pub fn drain(&mut self) -> Result<usize, DrpcError> {
        let n = self.geometry.connections as usize;
        for c in 0..n {
            self.drain_cqs(ConnId(c as u32));
            self.discover(ConnId(c as u32));
        }
        let mut done = 0;
        let mut deferred = None;
        for c in (0..n).map(|c| ConnId(c as u32)) {
            while !self.logs[c.0 as usize].backlog.is_empty() {
                if self.front_is_done(c) {
                    self.retire_front(c);
                    continue;
                }
                match self.complete_next(c) {
                    Ok((seq, reply)) => {
                        self.reply(c, ReplyKind::Completed, seq, reply);
                        done += 1;
                    }
                    Err(e) => {
                        deferred.get_or_insert(e);
                        break;
                    }
                }
            }
            if let Some(conn) = self.conns[c.0 as usize].as_mut() {
                let head = self.logs[c.0 as usize].head_abs;
                Self::post_chunks(&self.geometry, conn, head)?;
            }
        }
        deferred.map_or(Ok(done), Err)
    }

    /// Finds the entries that have landed on an accepted connection, in order, up to
    /// one in-flight window of them.
    fn discover(&mut self, conn: ConnId) {
        let Some(variant) = self.conns[conn.0 as usize].as_ref().map(|c| c.variant) else {
            return;
        };
        self.discover_as(conn, variant);
    }

    fn discover_as(&mut self, conn: ConnId, variant: Variant) {
        let ring = self.geometry.ring_offset(conn);
        for _ in 0..self.flow.inflight_max {
            let log = &self.logs[conn.0 as usize];
            let expect = log.expect_seq;
            let Some((abs, entry)) = self.find(conn, log.scan_abs, |e| e.seq == expect) else {
                break;
            };
            if variant.receiver_initiated() {
                // The emulated RFlush: the receiver's CPU persists what the NIC
                // landed, before it tells the sender.
                self.persist(ring + self.geometry.ring_pos(abs), entry.len_bytes);
            }
            let last = entry.end_seq() - 1;
            let log = &mut self.logs[conn.0 as usize];
            log.scan_abs = abs + entry.len_bytes as u64;
            log.expect_seq = entry.end_seq();
            log.backlog.push_back(Found { abs, entry });
            self.stats.entries_found += 1;
            if variant.receiver_initiated() {
                self.stats.durable_notices += 1;
                self.reply(conn, ReplyKind::Durable, last, Vec::new());
            }
        }
    }

    fn front_is_done(&self, conn: ConnId) -> bool {
        let log = &self.logs[conn.0 as usize];
        log.backlog
            .front()
            .is_some_and(|f| f.entry.end_seq() <= log.done_seq + 1)
    }

    /// Truncates the ring past the front entry, whose requests are all done.
    fn retire_front(&mut self, conn: ConnId) {
        let log = &mut self.logs[conn.0 as usize];
        let f = log.backlog.pop_front().expect("a front entry");
        let head = f.abs + f.entry.len_bytes as u64;
        log.head_abs = head;
        let off = self.geometry.conn_header_offset(conn);
        self.pool.write_u64(off, head);
        self.persist(off, CONN_HEADER_BYTES);
    }

    /// Executes the next request of `conn` and makes its effect and its completion
    /// durable (see the module documentation). Returns its seq and reply, or
    /// [`DrpcError::NotNow`] with nothing changed if the operator deferred it.
    fn complete_next(&mut self, conn: ConnId) -> Result<(u64, Vec<u8>), DrpcError> {
        let g = self.geometry;
        let log = &self.logs[conn.0 as usize];
        let seq = log.done_seq + 1;
        let front = log.backlog.front().expect("a request to complete");
        assert!(
            front.entry.seq <= seq && seq < front.entry.end_seq(),
            "request {seq} is not in the front entry {}..{}",
            front.entry.seq,
            front.entry.end_seq()
        );
        let last_in_entry = seq + 1 == front.entry.end_seq();
        let entry_end = front.abs + front.entry.len_bytes as u64;
        let wire = &front.entry.requests[(seq - front.entry.seq) as usize];
        let view = StateView {
            pool: &self.pool,
            offset: g.state_offset(),
            len_bytes: g.state_bytes,
        };
        let effect = match self.operator.execute(
            &view,
            &Request {
                conn,
                seq,
                op: wire.op,
                payload: &wire.payload,
            },
        ) {
            Ok(effect) => effect,
            Err(NotNow(why)) => {
                self.stats.deferred += 1;
                return Err(DrpcError::NotNow { conn, seq, why });
            }
        };
        assert!(
            effect.reply.len() <= self.flow.reply_bytes_max,
            "reply of {} bytes exceeds reply_bytes_max {}",
            effect.reply.len(),
            self.flow.reply_bytes_max
        );
        if !effect.writes.is_empty() {
            for w in &effect.writes {
                assert!(
                    w.offset
                        .checked_add(w.bytes.len())
                        .is_some_and(|e| e <= g.state_bytes),
                    "operator write outside the state area"
                );
            }
            assert!(
                apply_record_bytes(&effect.writes) <= g.apply_bytes,
                "operator writes exceed the apply record area"
            );
            let rec = ApplyRecord {
                conn,
                seq,
                writes: effect.writes,
            };
            let bytes = encode_apply_record(&rec);
            self.pool.write(g.apply_offset(), &bytes);
            self.persist(g.apply_offset(), bytes.len());
            self.apply_writes(&rec);
        }
        let off = g.conn_header_offset(conn);
        self.pool.write_u64(off + 8, seq);
        let log = &mut self.logs[conn.0 as usize];
        log.done_seq = seq;
        if last_in_entry {
            log.backlog.pop_front();
            log.head_abs = entry_end;
            self.pool.write_u64(off, entry_end);
        }
        self.persist(off, CONN_HEADER_BYTES);
        self.stats.requests_completed += 1;
        Ok((seq, effect.reply))
    }

    fn apply_writes(&mut self, rec: &ApplyRecord) {
        let base = self.geometry.state_offset();
        for w in &rec.writes {
            self.pool.write(base + w.offset, &w.bytes);
            self.persist(base + w.offset, w.bytes.len());
        }
    }

    fn persist(&mut self, offset: usize, len: usize) {
        self.stats.persists += 1;
        self.pool.persist(offset, len);
    }

    fn reply(&mut self, conn: ConnId, kind: ReplyKind, seq: u64, bytes: Vec<u8>) {
        let log = &self.logs[conn.0 as usize];
        let slow_down = log.backlog_requests() > self.flow.slow_down_threshold as u64;
        let head_abs = log.head_abs;
        let Some(c) = self.conns[conn.0 as usize].as_mut() else {
            return;
        };
        if c.broken {
            return;
        }
        let msg = encode_reply(&Reply {
            kind,
            slow_down,
            seq,
            head_abs,
            bytes,
        });
        // Wait for a send-queue slot: replies in flight are bounded by the sender's
        // window, so only the fabric's acknowledgements are awaited here.
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        let mut polls = 0;
        while c.qp.outstanding() >= c.send_depth {
            match c.send_cq.poll(&mut wcs) {
                Ok(k) if wcs[..k].iter().all(|w| w.status == WcStatus::Success) => {}
                _ => {
                    c.broken = true;
                    return;
                }
            }
            polls += 1;
            if polls >= REPLY_SLOT_POLLS_MAX {
                c.broken = true;
                return;
            }
            std::thread::yield_now();
        }
        let wr = WorkRequest::new(
            seq,
            Op::Send {
                data: &msg,
                imm: None,
            },
        );
        if c.qp.post_send(&[wr]).is_err() {
            c.broken = true;
            return;
        }
        self.stats.replies_sent += 1;
        if slow_down {
            self.stats.slow_down_replies += 1;
        }
    }

    pub fn geometry(&self) -> RingGeometry {
        self.geometry
    }

    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn operator(&self) -> &O {
        &self.operator
    }

    pub fn operator_mut(&mut self) -> &mut O {
        &mut self.operator
    }

    /// Every request of `conn` up to this seq has taken effect.
    pub fn done_seq(&self, conn: ConnId) -> u64 {
        self.logs[conn.0 as usize].done_seq
    }

    /// The truncation point of `conn`'s ring.
    pub fn head_abs(&self, conn: ConnId) -> u64 {
        self.logs[conn.0 as usize].head_abs
    }

    /// Calls `f(seq, op, payload)` for each request of `conn` that has been
    /// found and not completed, in seq order, without executing any (a reader
    /// of what waits behind a deferred request; see [`crate::NotNow`]).
    pub fn for_each_waiting(&self, conn: ConnId, mut f: impl FnMut(u64, u16, &[u8])) {
        let log = &self.logs[conn.0 as usize];
        for found in &log.backlog {
            for (i, r) in found.entry.requests.iter().enumerate() {
                let seq = found.entry.seq + i as u64;
                if seq > log.done_seq {
                    f(seq, r.op, &r.payload);
                }
            }
        }
    }

    /// Requests of `conn` found and not yet completed.
    pub fn backlog(&self, conn: ConnId) -> u64 {
        self.logs[conn.0 as usize].backlog_requests()
    }

    /// A reply could not be sent on `conn` (its sender is gone).
    pub fn is_broken(&self, conn: ConnId) -> bool {
        self.conns[conn.0 as usize]
            .as_ref()
            .is_some_and(|c| c.broken)
    }

    /// Reads the state area (for the operator's owner and tests).
    pub fn read_state(&self, offset: usize, out: &mut [u8]) {
        StateView {
            pool: &self.pool,
            offset: self.geometry.state_offset(),
            len_bytes: self.geometry.state_bytes,
        }
        .read(offset, out)
    }
}

/// Reads a connection's persisted header: `(head_abs, done_seq)`.
pub fn persisted_header(pool: &Pool, g: &RingGeometry, conn: ConnId) -> (u64, u64) {
    let off = g.conn_header_offset(conn);
    (pool.read_u64(off), pool.read_u64(off + 8))
}
