//! Queue pairs of the tcp backend: the initiating side (a sender thread per queue
//! pair, a response reader per connection) and the state the engine checks when
//! requests arrive for a queue pair (`gate`, `inbound_gen`, state, peer).
//!
//! Completion order. Every request posted goes through the sender thread in
//! posting order and becomes an *in-flight* entry, in that order: either sent
//! (awaiting its response) or decided locally (flushed, local address invalid,
//! link cut, peer unreachable). Entries complete strictly from the front, and only
//! once decided, so completions follow posting order whatever decides them.
//!
//! Lock order: a queue pair's `core` → its `gate` (write, in `enter_error`) → CQ
//! locks. The engine takes a queue pair's `gate` (read) → the SRQ lock → CQ locks,
//! and never a `core`. No lock is held across network I/O.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender, TryRecvError};
use parking_lot::{Mutex, RwLock};
use rowankv_types::QpNum;

use super::queues::{CqEntry, CqInner, Pushed, SrqInner};
use super::wire::{self, HandshakeError, Opcode, RequestHeader, ResponseHeader, Status, Welcome};
use super::{NodeCore, NodeLife};
use crate::verbs::*;

pub(crate) const STATE_INIT: u8 = 0;
pub(crate) const STATE_READY: u8 = 1;
pub(crate) const STATE_ERROR: u8 = 2;

/// Bytes of requests gathered before they are written to the socket.
const BATCH_BYTES: usize = 256 * 1024;
/// Longest sleep of a sender thread waiting for a delayed request's deadline (the
/// injected clock may be a manual one that nobody announces moving).
const DELAY_POLL: Duration = Duration::from_micros(200);

/// An operation whose bytes were copied at post time.
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

    fn opcode(&self) -> WcOpcode {
        match self {
            OwnedOp::Send { .. } => WcOpcode::Send,
            OwnedOp::Write { .. } => WcOpcode::Write,
            OwnedOp::Read { .. } => WcOpcode::Read,
            OwnedOp::CompareSwap { .. } => WcOpcode::CompareSwap,
            OwnedOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            OwnedOp::Flush { .. } => WcOpcode::Flush,
            OwnedOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
        }
    }

    /// Where the result goes locally: (region, offset, length).
    fn local(&self) -> Option<(MemoryRegion, usize, usize)> {
        match self {
            OwnedOp::Read { len, local, .. } => Some((local.0.clone(), local.1, *len)),
            OwnedOp::CompareSwap { local, .. } | OwnedOp::FetchAdd { local, .. } => {
                Some((local.0.clone(), local.1, 8))
            }
            _ => None,
        }
    }

    /// The request frame's header (with `req_id`) and payload.
    fn header(&self, req_id: u64, persist: bool) -> (RequestHeader, &[u8]) {
        match self {
            OwnedOp::Send { data, imm } => {
                let mut h = RequestHeader::new(Opcode::Send, req_id);
                h.imm = *imm;
                h.persist = persist;
                (h, data)
            }
            OwnedOp::Write { data, remote, imm } => {
                let mut h = RequestHeader::new(Opcode::Write, req_id);
                h.imm = *imm;
                h.persist = persist;
                h.rkey = remote.rkey.0;
                h.offset = remote.offset;
                (h, data)
            }
            OwnedOp::Read { remote, len, .. } => {
                let mut h = RequestHeader::new(Opcode::Read, req_id);
                h.rkey = remote.rkey.0;
                h.offset = remote.offset;
                h.arg0 = *len as u64;
                (h, &[])
            }
            OwnedOp::CompareSwap {
                remote,
                expect,
                swap,
                ..
            } => {
                let mut h = RequestHeader::new(Opcode::CompareSwap, req_id);
                h.rkey = remote.rkey.0;
                h.offset = remote.offset;
                h.arg0 = *expect;
                h.arg1 = *swap;
                (h, &[])
            }
            OwnedOp::FetchAdd { remote, add, .. } => {
                let mut h = RequestHeader::new(Opcode::FetchAdd, req_id);
                h.rkey = remote.rkey.0;
                h.offset = remote.offset;
                h.arg0 = *add;
                (h, &[])
            }
            OwnedOp::Flush {
                remote,
                len,
                placement,
            } => {
                let mut h = RequestHeader::new(Opcode::Flush, req_id);
                h.rkey = remote.rkey.0;
                h.offset = remote.offset;
                h.arg0 = *len as u64;
                h.arg1 = match placement {
                    Placement::GlobalVisibility => wire::PLACEMENT_GLOBAL,
                    Placement::Persistence => wire::PLACEMENT_PERSISTENT,
                };
                (h, &[])
            }
            OwnedOp::AtomicWrite { remote, value } => {
                let mut h = RequestHeader::new(Opcode::AtomicWrite, req_id);
                h.persist = persist;
                h.rkey = remote.rkey.0;
                h.offset = remote.offset;
                h.arg0 = *value;
                (h, &[])
            }
        }
    }
}

/// A posted request on its way to the sender thread.
struct PendingWr {
    seq: u64,
    /// The queue pair's epoch when posted: a request of an older epoch (posted
    /// before an error or a reset) is flushed.
    epoch: u64,
    deadline_ns: u64,
    wr_id: u64,
    signaled: bool,
    persist: bool,
    op: OwnedOp,
}

/// How an in-flight request was decided.
enum Outcome {
    /// The target answered.
    Response {
        status: Status,
        value: u64,
        data: Vec<u8>,
    },
    /// Decided without the target.
    Local(WcStatus),
}

struct InFlight {
    seq: u64,
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    /// Sent with this request id on the current connection.
    req_id: Option<u64>,
    /// When it was sent.
    sent_at: Option<Instant>,
    local: Option<(MemoryRegion, usize, usize)>,
    result: Option<Outcome>,
}

/// A connection from this queue pair to its peer's engine (the writing half;
/// the reader thread holds a clone).
struct Conn {
    gen: u64,
    stream: TcpStream,
    sock_id: u64,
}

struct QpCore {
    /// Sequence number of the next posted request.
    posted: u64,
    conn: Option<Arc<Conn>>,
    next_req: u64,
    inflight: VecDeque<InFlight>,
    /// The handle is gone and its last request was issued: the outbound
    /// connection closes once nothing is in flight. (The queue pair still
    /// receives, as in loopback, until the node goes down.)
    retired_handle: bool,
}

pub(crate) struct QpInner {
    pub(crate) addr: QpAddr,
    pub(crate) node: Arc<NodeCore>,
    send_cq: Arc<CqInner>,
    pub(crate) recv_cq: Arc<CqInner>,
    pub(crate) srq: Option<Arc<SrqInner>>,
    send_depth: usize,
    pub(crate) state: AtomicU8,
    epoch: AtomicU64,
    /// Destroyed (`close`, or the node went down): binds no connection again.
    pub(crate) closed: AtomicBool,
    pub(crate) peer_addr: RwLock<Option<QpAddr>>,
    core: Mutex<QpCore>,
    /// Held (read) by the engine while it executes a request arriving for this
    /// queue pair; taken (write) after leaving the ready state, so that nothing
    /// lands through the queue pair afterwards.
    pub(crate) gate: RwLock<()>,
    /// Generation of the inbound connection bound last; requests from older ones
    /// are refused.
    pub(crate) inbound_gen: AtomicU64,
    /// Sockets of inbound connections bound to this queue pair.
    pub(crate) inbound_socks: Mutex<Vec<u64>>,
    next_conn_gen: AtomicU64,
    retired: Arc<AtomicU64>,
    posted: AtomicU64,
}

/// A reliable connected queue pair on the tcp fabric.
pub struct TcpQp {
    inner: Arc<QpInner>,
    tx: Sender<PendingWr>,
    _life: Arc<NodeLife>,
}

impl TcpQp {
    pub(crate) fn create(
        life: Arc<NodeLife>,
        qpn: QpNum,
        send_cq: Arc<CqInner>,
        recv_cq: Arc<CqInner>,
        srq: Option<Arc<SrqInner>>,
        send_depth: usize,
    ) -> Result<TcpQp, FabricError> {
        let node = life.core.clone();
        let inner = Arc::new(QpInner {
            addr: QpAddr { node: node.id, qpn },
            node,
            send_cq,
            recv_cq,
            srq,
            send_depth,
            state: AtomicU8::new(STATE_INIT),
            epoch: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            peer_addr: RwLock::new(None),
            core: Mutex::new(QpCore {
                posted: 0,
                conn: None,
                next_req: 0,
                inflight: VecDeque::new(),
                retired_handle: false,
            }),
            gate: RwLock::new(()),
            inbound_gen: AtomicU64::new(0),
            inbound_socks: Mutex::new(Vec::new()),
            next_conn_gen: AtomicU64::new(1),
            retired: Arc::new(AtomicU64::new(0)),
            posted: AtomicU64::new(0),
        });
        let (tx, rx) = channel::unbounded();
        let q = inner.clone();
        std::thread::Builder::new()
            .name(format!("rkv-tcp-{}-qp{}-tx", inner.addr.node, qpn.0))
            .spawn(move || q.sender_loop(rx))
            .map_err(|e| FabricError::Invalid(format!("spawn sender thread: {e}")))?;
        Ok(TcpQp {
            inner,
            tx,
            _life: life,
        })
    }

    pub(crate) fn inner(&self) -> &Arc<QpInner> {
        &self.inner
    }
}

/// Why opening a connection failed.
enum OpenError {
    UnknownNode,
    Unreachable(std::io::Error),
    NoSuchQp,
    Handshake(HandshakeError),
    NodeDown,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::UnknownNode => write!(f, "node not in the address book"),
            OpenError::Unreachable(e) => write!(f, "unreachable: {e}"),
            OpenError::NoSuchQp => write!(f, "no such queue pair"),
            OpenError::Handshake(e) => write!(f, "handshake: {e}"),
            OpenError::NodeDown => write!(f, "local node is down"),
        }
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

    pub(crate) fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == STATE_READY
    }

    fn stale(&self, epoch: u64) -> bool {
        !self.is_ready() || self.epoch.load(Ordering::Acquire) != epoch
    }

    fn push_send_completion(&self, core: &mut QpCore, wc: Completion, seq: u64) {
        let entry = CqEntry {
            wc,
            retire: Some((self.retired.clone(), seq)),
        };
        if let Pushed::Overflow = self.send_cq.push(entry) {
            self.enter_error(core);
        }
    }

    /// Move to the error state: flush what is in flight, drop the connection, and
    /// wait until no request arriving for this queue pair is being executed.
    fn enter_error(&self, core: &mut QpCore) {
        self.state.store(STATE_ERROR, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        drop(self.gate.write());
        if let Some(c) = core.conn.take() {
            self.node.close_socket(c.sock_id);
        }
        for e in core.inflight.drain(..) {
            // A flush into an overflowed CQ has nowhere to go; the CQ already
            // reports the overflow.
            let _ = self.send_cq.push(CqEntry {
                wc: self.completion(e.wr_id, WcStatus::WrFlushError, e.opcode),
                retire: Some((self.retired.clone(), e.seq)),
            });
        }
    }

    /// The node went down: error state, no peer, no connections.
    pub(crate) fn kill(&self) {
        let mut core = self.core.lock();
        self.closed.store(true, Ordering::Release);
        self.enter_error(&mut core);
        self.close_inbound();
    }

    /// Refuse and close the inbound connections bound to this queue pair.
    fn close_inbound(&self) {
        {
            let _g = self.gate.write();
            self.inbound_gen.fetch_add(1, Ordering::AcqRel);
        }
        let socks: Vec<u64> = std::mem::take(&mut *self.inbound_socks.lock());
        for s in socks {
            self.node.close_socket(s);
        }
    }

    /// Accept an inbound connection from `src` (handshake done): returns its
    /// generation, or `None` if this queue pair takes no connection from `src`.
    pub(crate) fn bind_inbound(&self, src: QpAddr, sock_id: u64) -> Option<u64> {
        let _g = self.gate.write();
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        if self.peer_addr.read().is_some_and(|p| p != src) {
            return None;
        }
        let gen = self.inbound_gen.fetch_add(1, Ordering::AcqRel) + 1;
        self.inbound_socks.lock().push(sock_id);
        Some(gen)
    }

    /// An inbound connection ended: forget its socket.
    pub(crate) fn unbind_inbound(&self, sock_id: u64) {
        self.inbound_socks.lock().retain(|s| *s != sock_id);
    }

    /// Complete decided entries from the front, in order.
    fn drain(&self, core: &mut QpCore) {
        while core.inflight.front().is_some_and(|e| e.result.is_some()) {
            let e = core.inflight.pop_front().expect("checked");
            // (status, whether it moves the queue pair to the error state)
            let (status, fails) = match e.result.expect("checked") {
                Outcome::Response {
                    status: Status::Success,
                    value,
                    data,
                } => {
                    if let Some((mr, offset, _)) = &e.local {
                        match e.opcode {
                            WcOpcode::Read => mr.write(*offset, &data),
                            _ => mr.write(*offset, &value.to_le_bytes()),
                        }
                    }
                    (WcStatus::Success, false)
                }
                Outcome::Response { status, .. } => (status.to_wc(), true),
                // Flushed because of an earlier error, or posted before a reset.
                Outcome::Local(WcStatus::WrFlushError) => (WcStatus::WrFlushError, false),
                Outcome::Local(s) => (s, true),
            };
            if status == WcStatus::Success && !e.signaled {
                continue;
            }
            let wc = self.completion(e.wr_id, status, e.opcode);
            self.push_send_completion(core, wc, e.seq);
            if fails {
                self.enter_error(core);
            }
        }
        self.close_idle_conn(core);
    }

    /// Decide `e` locally and complete what can be.
    fn decide_locally(&self, core: &mut QpCore, mut e: InFlight, status: WcStatus) {
        e.result = Some(Outcome::Local(status));
        core.inflight.push_back(e);
        self.drain(core);
    }

    // -----------------------------------------------------------------------
    // Sender thread

    fn sender_loop(self: Arc<Self>, rx: Receiver<PendingWr>) {
        let mut batch: Vec<u8> = Vec::new();
        let mut batch_conn: Option<Arc<Conn>> = None;
        loop {
            let wr = match rx.try_recv() {
                Ok(wr) => wr,
                Err(TryRecvError::Empty) => {
                    self.flush_batch(&mut batch, &mut batch_conn);
                    match rx.recv() {
                        Ok(wr) => wr,
                        Err(_) => break,
                    }
                }
                Err(TryRecvError::Disconnected) => break,
            };
            if !self.due(&wr) {
                self.flush_batch(&mut batch, &mut batch_conn);
                self.wait_due(&wr);
            }
            self.issue(wr, &mut batch, &mut batch_conn);
            if batch.len() >= BATCH_BYTES {
                self.flush_batch(&mut batch, &mut batch_conn);
            }
        }
        self.flush_batch(&mut batch, &mut batch_conn);
        let mut core = self.core.lock();
        core.retired_handle = true;
        self.close_idle_conn(&mut core);
    }

    /// A queue pair whose handle is gone keeps no idle outbound connection.
    fn close_idle_conn(&self, core: &mut QpCore) {
        if core.retired_handle && core.inflight.is_empty() {
            if let Some(c) = core.conn.take() {
                self.node.close_socket(c.sock_id);
            }
        }
    }

    fn due(&self, wr: &PendingWr) -> bool {
        wr.deadline_ns <= self.node.env.clock.now_ns()
    }

    /// Hold `wr` back until the clock passes its deadline (or it is to be flushed).
    fn wait_due(&self, wr: &PendingWr) {
        loop {
            if self.stale(wr.epoch) {
                return;
            }
            let now = self.node.env.clock.now_ns();
            if now >= wr.deadline_ns {
                return;
            }
            std::thread::sleep(Duration::from_nanos(wr.deadline_ns - now).min(DELAY_POLL));
        }
    }

    fn flush_batch(&self, batch: &mut Vec<u8>, batch_conn: &mut Option<Arc<Conn>>) {
        if let Some(conn) = batch_conn.take() {
            if !batch.is_empty() {
                if let Err(e) = (&conn.stream).write_all(batch) {
                    tracing::debug!(qp = ?self.addr, error = %e, "tcp fabric: write failed");
                    self.conn_failed(conn.gen);
                }
            }
        }
        batch.clear();
    }

    /// Decide or send one request.
    fn issue(
        self: &Arc<Self>,
        wr: PendingWr,
        batch: &mut Vec<u8>,
        batch_conn: &mut Option<Arc<Conn>>,
    ) {
        let entry = InFlight {
            seq: wr.seq,
            wr_id: wr.wr_id,
            opcode: wr.op.opcode(),
            signaled: wr.signaled,
            req_id: None,
            sent_at: None,
            local: wr.op.local(),
            result: None,
        };
        let mut core = self.core.lock();
        if self.stale(wr.epoch) {
            return self.decide_locally(&mut core, entry, WcStatus::WrFlushError);
        }
        if let Some((mr, offset, len)) = &entry.local {
            if !mr.contains(*offset as u64, *len) {
                return self.decide_locally(&mut core, entry, WcStatus::RemoteAccessError);
            }
        }
        let Some(peer) = *self.peer_addr.read() else {
            return self.decide_locally(&mut core, entry, WcStatus::RetryExceeded);
        };
        if !self.node.alive.load(Ordering::Acquire)
            || self.node.env.faults.cut(self.addr.node, peer.node)
        {
            return self.decide_locally(&mut core, entry, WcStatus::RetryExceeded);
        }
        let conn = match &core.conn {
            Some(c) => c.clone(),
            None => {
                drop(core);
                self.flush_batch(batch, batch_conn);
                let opened = self.open_conn(peer);
                core = self.core.lock();
                let still = !self.stale(wr.epoch) && *self.peer_addr.read() == Some(peer);
                match opened {
                    Ok((conn, read_half)) if still && core.conn.is_none() => {
                        core.conn = Some(conn.clone());
                        core.next_req = 0;
                        self.spawn_reader(conn.gen, read_half);
                        conn
                    }
                    Ok((conn, _)) => {
                        self.node.close_socket(conn.sock_id);
                        let status = if still {
                            // Someone (connect) installed another connection.
                            match &core.conn {
                                Some(c) => {
                                    let c = c.clone();
                                    return self.send_on(core, c, entry, &wr, batch, batch_conn);
                                }
                                None => WcStatus::RetryExceeded,
                            }
                        } else {
                            WcStatus::WrFlushError
                        };
                        return self.decide_locally(&mut core, entry, status);
                    }
                    Err(e) => {
                        tracing::debug!(qp = ?self.addr, ?peer, error = %e, "tcp fabric: cannot reach peer");
                        let status = if still {
                            WcStatus::RetryExceeded
                        } else {
                            WcStatus::WrFlushError
                        };
                        return self.decide_locally(&mut core, entry, status);
                    }
                }
            }
        };
        self.send_on(core, conn, entry, &wr, batch, batch_conn)
    }

    fn send_on(
        &self,
        mut core: parking_lot::MutexGuard<'_, QpCore>,
        conn: Arc<Conn>,
        mut entry: InFlight,
        wr: &PendingWr,
        batch: &mut Vec<u8>,
        batch_conn: &mut Option<Arc<Conn>>,
    ) {
        let req_id = core.next_req;
        core.next_req += 1;
        entry.req_id = Some(req_id);
        entry.sent_at = Some(Instant::now());
        core.inflight.push_back(entry);
        drop(core);
        if batch_conn.as_ref().is_some_and(|c| c.gen != conn.gen) {
            self.flush_batch(batch, batch_conn);
        }
        *batch_conn = Some(conn);
        let (h, payload) = wr.op.header(req_id, wr.persist);
        wire::encode_request(batch, &h, payload);
    }

    /// Open and authenticate a connection to `peer`'s engine, bound to `peer`.
    fn open_conn(&self, peer: QpAddr) -> Result<(Arc<Conn>, TcpStream), OpenError> {
        let env = &self.node.env;
        let addr = env.book.get(peer.node).ok_or(OpenError::UnknownNode)?;
        let mut stream = TcpStream::connect_timeout(&addr, env.connect_timeout)
            .map_err(OpenError::Unreachable)?;
        let setup = |s: &TcpStream, t: Option<Duration>| -> std::io::Result<()> {
            s.set_nodelay(true)?;
            s.set_read_timeout(t)?;
            s.set_write_timeout(t.or(Some(env.write_timeout)))
        };
        setup(&stream, Some(env.handshake_timeout)).map_err(OpenError::Unreachable)?;
        match wire::client_handshake(&mut stream, &env.cred, self.addr, peer) {
            Ok(()) => {}
            Err(HandshakeError::Refused(Welcome::NoSuchQp)) => return Err(OpenError::NoSuchQp),
            Err(HandshakeError::Wire(wire::WireError::Io(e))) => {
                return Err(OpenError::Unreachable(e))
            }
            Err(e) => return Err(OpenError::Handshake(e)),
        }
        setup(&stream, None).map_err(OpenError::Unreachable)?;
        let read_half = stream.try_clone().map_err(OpenError::Unreachable)?;
        let sock_id = self
            .node
            .register_socket(&stream)
            .ok_or(OpenError::NodeDown)?;
        let gen = self.next_conn_gen.fetch_add(1, Ordering::Relaxed);
        Ok((
            Arc::new(Conn {
                gen,
                stream,
                sock_id,
            }),
            read_half,
        ))
    }

    fn spawn_reader(self: &Arc<Self>, gen: u64, stream: TcpStream) {
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!(
                "rkv-tcp-{}-qp{}-rx",
                self.addr.node, self.addr.qpn.0
            ))
            .spawn(move || me.reader_loop(gen, stream));
        if let Err(e) = spawned {
            tracing::warn!(qp = ?self.addr, error = %e, "tcp fabric: cannot spawn reader");
            // Without a reader the connection is useless.
            let mut core = self.core.lock();
            if core.conn.as_ref().is_some_and(|c| c.gen == gen) {
                let c = core.conn.take().expect("checked");
                self.node.close_socket(c.sock_id);
            }
        }
    }

    // -----------------------------------------------------------------------
    // Response reader

    fn reader_loop(self: Arc<Self>, gen: u64, stream: TcpStream) {
        let timeout = self.node.env.response_timeout;
        // Look at the oldest unanswered request a few times per timeout.
        let tick = (timeout / 4).max(Duration::from_millis(1));
        if stream.set_read_timeout(Some(tick)).is_err() {
            self.conn_failed(gen);
            return;
        }
        let mut r = BufReader::with_capacity(64 * 1024, stream);
        let mut payload = Vec::new();
        loop {
            // Wait for the next frame at a frame boundary, where a timeout loses
            // nothing: an idle connection may stay silent, one that owes a
            // response may not.
            if r.buffer().is_empty() {
                match r.fill_buf() {
                    Ok([]) => {
                        self.conn_failed(gen);
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        match self.oldest_unanswered(gen) {
                            None => return, // not this queue pair's connection any more
                            Some(sent) if sent.is_none_or(|t| t.elapsed() < timeout) => continue,
                            Some(_) => {
                                tracing::warn!(qp = ?self.addr, ?timeout, "tcp fabric: no response from the peer; connection failed");
                                self.conn_failed(gen);
                                return;
                            }
                        }
                    }
                    Err(_) => {
                        self.conn_failed(gen);
                        return;
                    }
                }
            }
            match wire::read_response(&mut r, &mut payload) {
                Ok(h) => {
                    if !self.on_response(gen, h, &mut payload) {
                        return;
                    }
                }
                Err(e) => {
                    if !matches!(e, wire::WireError::Io(_)) {
                        tracing::warn!(qp = ?self.addr, error = %e, "tcp fabric: malformed response");
                    }
                    self.conn_failed(gen);
                    return;
                }
            }
        }
    }

    /// When the oldest request the connection of generation `gen` owes a
    /// response to was sent (`Some(None)`: it owes none); `None` if it is no
    /// longer this queue pair's connection.
    fn oldest_unanswered(&self, gen: u64) -> Option<Option<Instant>> {
        let core = self.core.lock();
        if core.conn.as_ref().map(|c| c.gen) != Some(gen) {
            return None;
        }
        Some(
            core.inflight
                .iter()
                .find(|e| e.req_id.is_some() && e.result.is_none())
                .and_then(|e| e.sent_at),
        )
    }

    /// Record a response; `false` when the connection is no longer this queue
    /// pair's (or misbehaved) and the reader should stop.
    fn on_response(&self, gen: u64, h: ResponseHeader, payload: &mut Vec<u8>) -> bool {
        let mut core = self.core.lock();
        if core.conn.as_ref().map(|c| c.gen) != Some(gen) {
            return false;
        }
        let Some(e) = core
            .inflight
            .iter_mut()
            .find(|e| e.req_id.is_some() && e.result.is_none())
        else {
            drop(core);
            tracing::warn!(qp = ?self.addr, req_id = h.req_id, "tcp fabric: response to no request");
            self.conn_failed(gen);
            return false;
        };
        let expected_len = match (&e.local, h.status, e.opcode) {
            (Some((_, _, len)), Status::Success, WcOpcode::Read) => *len,
            _ => 0,
        };
        if e.req_id != Some(h.req_id) || payload.len() != expected_len {
            let want = e.req_id;
            drop(core);
            tracing::warn!(qp = ?self.addr, req_id = h.req_id, expected = ?want, len = payload.len(), "tcp fabric: response does not match its request");
            self.conn_failed(gen);
            return false;
        }
        e.result = Some(Outcome::Response {
            status: h.status,
            value: h.value,
            data: std::mem::take(payload),
        });
        self.drain(&mut core);
        true
    }

    /// The connection of generation `gen` broke: the oldest unanswered request
    /// fails with `RetryExceeded` (and the queue pair enters the error state);
    /// with nothing unanswered the queue pair just forgets the connection.
    fn conn_failed(&self, gen: u64) {
        let mut core = self.core.lock();
        if core.conn.as_ref().map(|c| c.gen) != Some(gen) {
            return;
        }
        if let Some(e) = core
            .inflight
            .iter_mut()
            .find(|e| e.req_id.is_some() && e.result.is_none())
        {
            e.result = Some(Outcome::Local(WcStatus::RetryExceeded));
            self.drain(&mut core);
        }
        if let Some(c) = core.conn.take_if(|c| c.gen == gen) {
            self.node.close_socket(c.sock_id);
        }
    }
}

impl QueuePair for TcpQp {
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
        let q = &self.inner;
        q.node.check_alive()?;
        if q.closed.load(Ordering::Acquire) {
            return Err(FabricError::Invalid("queue pair was closed".into()));
        }
        let (conn, read_half) = q.open_conn(remote).map_err(|e| match e {
            OpenError::UnknownNode => FabricError::UnknownNode(remote.node),
            OpenError::Unreachable(_) => FabricError::NodeDown(remote.node),
            OpenError::NoSuchQp => FabricError::UnknownQp(remote),
            OpenError::NodeDown => FabricError::NodeDown(q.addr.node),
            OpenError::Handshake(e) => {
                FabricError::Invalid(format!("tcp fabric: handshake with {remote:?}: {e}"))
            }
        })?;
        let mut core = q.core.lock();
        if let Some(old) = core.conn.take() {
            q.node.close_socket(old.sock_id);
            for e in core.inflight.drain(..) {
                let wc = q.completion(e.wr_id, WcStatus::WrFlushError, e.opcode);
                let _ = q.send_cq.push(CqEntry {
                    wc,
                    retire: Some((q.retired.clone(), e.seq)),
                });
            }
        }
        core.conn = Some(conn.clone());
        core.next_req = 0;
        // Requests posted before a re-connect are flushed, not sent to the new peer.
        q.epoch.fetch_add(1, Ordering::AcqRel);
        *q.peer_addr.write() = Some(remote);
        q.state.store(STATE_READY, Ordering::Release);
        drop(core);
        q.spawn_reader(conn.gen, read_half);
        Ok(())
    }

    fn post_send(&self, wrs: &[WorkRequest<'_>]) -> Result<(), FabricError> {
        let q = &self.inner;
        q.node.check_alive()?;
        for wr in wrs {
            let len = match wr.op {
                Op::Send { data, .. } | Op::Write { data, .. } => data.len(),
                Op::Read { len, .. } => len,
                _ => 0,
            };
            if len > wire::MAX_PAYLOAD {
                return Err(FabricError::Invalid(format!(
                    "a request of {len} bytes exceeds the tcp fabric's {} byte frame cap",
                    wire::MAX_PAYLOAD
                )));
            }
        }
        let mut core = q.core.lock();
        if q.state.load(Ordering::Acquire) == STATE_INIT {
            return Err(FabricError::NotConnected);
        }
        let outstanding =
            (core.posted - q.retired.load(Ordering::Acquire).min(core.posted)) as usize;
        if outstanding + wrs.len() > q.send_depth {
            return Err(FabricError::SendQueueFull {
                outstanding,
                depth: q.send_depth,
            });
        }
        let env = &q.node.env;
        let peer_node = q.peer_addr.read().map_or(q.addr.node, |p| p.node);
        let deadline_ns = env.clock.now_ns() + env.faults.delay_ns(q.addr.node, peer_node);
        let epoch = q.epoch.load(Ordering::Acquire);
        for wr in wrs {
            let seq = core.posted;
            core.posted += 1;
            q.posted.store(core.posted, Ordering::Release);
            let pending = PendingWr {
                seq,
                epoch,
                deadline_ns,
                wr_id: wr.wr_id,
                signaled: wr.signaled,
                persist: wr.persist
                    && matches!(
                        wr.op,
                        Op::Send { .. } | Op::Write { .. } | Op::AtomicWrite { .. }
                    ),
                op: OwnedOp::from_op(&wr.op),
            };
            // The sender thread lives as long as `self.tx`.
            self.tx.send(pending).map_err(|_| {
                FabricError::Invalid("tcp fabric: the queue pair's sender thread is gone".into())
            })?;
        }
        Ok(())
    }

    fn reset(&self) -> Result<(), FabricError> {
        let q = &self.inner;
        q.node.check_alive()?;
        let mut core = q.core.lock();
        if q.peer_addr.read().is_none() {
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
        q.closed.store(true, Ordering::Release);
        q.enter_error(&mut core);
        *q.peer_addr.write() = None;
        drop(core);
        q.close_inbound();
    }

    fn outstanding(&self) -> usize {
        let posted = self.inner.posted.load(Ordering::Acquire);
        (posted - self.inner.retired.load(Ordering::Acquire).min(posted)) as usize
    }
}
