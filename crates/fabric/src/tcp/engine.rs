//! The NIC engine: the listener and the inbound connections of one node. Each
//! inbound connection is served by a thread of its own, which authenticates the
//! peer, binds the connection to one of the node's queue pairs and then carries
//! out the requests arriving on it, in order, on the node's registered memory and
//! receive queues — the work an RNIC does without the host CPU.

use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rowankv_types::Rkey;

use super::qp::QpInner;
use super::queues::{CqEntry, LandError, Landing, Pushed};
use super::wire::{
    self, Challenge, Hello, Opcode, RequestHeader, ResponseHeader, Status, Welcome, WireError,
};
use super::NodeCore;
use crate::verbs::*;

/// Bound on inbound connections of one node still in the handshake; more are
/// closed at once (each holds an engine thread for up to the handshake timeout).
const MAX_HANDSHAKING: usize = 64;

/// Start the listener thread of `core`.
pub(crate) fn spawn_listener(
    core: Arc<NodeCore>,
    listener: TcpListener,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("rkv-tcp-{}-listen", core.id))
        .spawn(move || listen(core, listener))
}

fn listen(core: Arc<NodeCore>, listener: TcpListener) {
    for stream in listener.incoming() {
        if !core.alive.load(Ordering::Acquire) {
            break;
        }
        match stream {
            Ok(stream) => {
                if core.handshaking.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKING {
                    core.handshaking.fetch_sub(1, Ordering::AcqRel);
                    core.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %core.id, peer = ?stream.peer_addr().ok(), "tcp fabric: connection refused: too many connections in the handshake");
                    continue;
                }
                let c = core.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("rkv-tcp-{}-in", core.id))
                    .spawn(move || serve(c, stream));
                if let Err(e) = spawned {
                    core.handshaking.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(node = %core.id, error = %e, "tcp fabric: cannot spawn an engine thread; connection dropped");
                }
            }
            Err(e) => {
                tracing::warn!(node = %core.id, error = %e, "tcp fabric: accept failed");
                // Out of descriptors and the like: do not spin.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    tracing::debug!(node = %core.id, "tcp fabric: listener closed");
}

/// Closes the socket and forgets the binding when an inbound connection ends.
struct InboundGuard<'a> {
    core: &'a NodeCore,
    sock_id: u64,
    qp: Option<Arc<QpInner>>,
}

impl Drop for InboundGuard<'_> {
    fn drop(&mut self) {
        if let Some(qp) = &self.qp {
            qp.unbind_inbound(self.sock_id);
        }
        self.core.close_socket(self.sock_id);
    }
}

/// Serve one inbound connection until it closes, the peer misbehaves or the node
/// goes down.
fn serve(core: Arc<NodeCore>, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let registered = core.register_socket(&stream);
    let bound = registered.and_then(|sock_id| handshake(&core, &stream, &peer, sock_id));
    core.handshaking.fetch_sub(1, Ordering::AcqRel);
    let Some(sock_id) = registered else {
        return; // the node is down
    };
    let mut guard = InboundGuard {
        core: &core,
        sock_id,
        qp: None,
    };
    let Some((qp, src, gen)) = bound else {
        return;
    };
    guard.qp = Some(qp.clone());
    let (Ok(()), Ok(()), Ok(read_half)) = (
        stream.set_read_timeout(None),
        stream.set_write_timeout(Some(core.env.write_timeout)),
        stream.try_clone(),
    ) else {
        return;
    };
    tracing::debug!(node = %core.id, %peer, ?src, dst = ?qp.addr, "tcp fabric: connection bound");
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut writer = BufWriter::with_capacity(64 * 1024, stream);
    let mut payload = Vec::new();
    let mut read_buf = Vec::new();
    let mut out = Vec::with_capacity(wire::RESPONSE_HEADER_BYTES + 8);
    let mut next_req = 0u64;
    let mut failed = false;
    loop {
        // Answer in batches: flush only when no further request is buffered.
        if reader.buffer().is_empty() && writer.flush().is_err() {
            break;
        }
        let h = match wire::read_request(&mut reader, next_req, &mut payload) {
            Ok(h) => h,
            Err(WireError::Io(e)) => {
                if !matches!(
                    e.kind(),
                    ErrorKind::UnexpectedEof
                        | ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                ) && core.alive.load(Ordering::Acquire)
                {
                    tracing::debug!(node = %core.id, %peer, error = %e, "tcp fabric: connection failed");
                }
                break;
            }
            Err(e) => {
                core.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = %core.id, %peer, ?src, error = %e, "tcp fabric: malformed request; connection closed");
                break;
            }
        };
        next_req += 1;
        // After an error, nothing more from this connection is executed (RC: the
        // initiator's queue pair is in the error state and drops the connection).
        let (status, value) = if failed {
            (Status::Flushed, 0)
        } else {
            execute(&core, &qp, src, gen, &h, &payload, &mut read_buf)
        };
        failed |= status != Status::Success;
        let data: &[u8] = if status == Status::Success && h.opcode == Opcode::Read {
            &read_buf
        } else {
            &[]
        };
        out.clear();
        wire::encode_response_header(
            &mut out,
            &ResponseHeader {
                status,
                req_id: h.req_id,
                value,
            },
            data.len(),
        );
        if writer.write_all(&out).is_err() || writer.write_all(data).is_err() {
            break;
        }
    }
    drop(guard);
}

/// The target's side of the handshake. Returns the bound queue pair, the
/// initiator and the connection's generation; `None` after refusing (logged).
fn handshake(
    core: &NodeCore,
    stream: &TcpStream,
    peer: &str,
    sock_id: u64,
) -> Option<(Arc<QpInner>, QpAddr, u64)> {
    let env = &core.env;
    let refuse = |why: &dyn std::fmt::Display| {
        core.stats.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(node = %core.id, %peer, reason = %why, "tcp fabric: connection refused");
    };
    let t = Some(env.handshake_timeout);
    if let Err(e) = stream
        .set_nodelay(true)
        .and_then(|_| stream.set_read_timeout(t))
        .and_then(|_| stream.set_write_timeout(t))
    {
        refuse(&e);
        return None;
    }
    let mut s = stream;
    let challenge = Challenge {
        node: core.id,
        nonce: rand::random(),
    };
    if let Err(e) = s.write_all(&challenge.encode()) {
        refuse(&format_args!("sending the challenge: {e}"));
        return None;
    }
    let mut b = [0u8; wire::HELLO_BYTES];
    if let Err(e) = s.read_exact(&mut b) {
        if core.alive.load(Ordering::Acquire) {
            refuse(&format_args!("incomplete hello: {e}"));
        }
        return None;
    }
    let hello = match Hello::verify(&b, &env.cred, &challenge) {
        Ok(h) => h,
        Err(e) => {
            refuse(&e);
            let _ = s.write_all(&Welcome::Refused.encode(&env.cred, None, &challenge));
            return None;
        }
    };
    let bound = core
        .qps
        .read()
        .get(&hello.dst.qpn)
        .cloned()
        .and_then(|qp| qp.bind_inbound(hello.src, sock_id).map(|gen| (qp, gen)));
    let Some((qp, gen)) = bound else {
        refuse(&format_args!(
            "no queue pair {:?} for {:?}",
            hello.dst, hello.src
        ));
        let _ = s.write_all(&Welcome::NoSuchQp.encode(&env.cred, Some(&hello), &challenge));
        return None;
    };
    // Counted before the answer, so that a peer that got in sees itself counted.
    core.stats.accepted.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = s.write_all(&Welcome::Accepted.encode(&env.cred, Some(&hello), &challenge)) {
        tracing::debug!(node = %core.id, %peer, error = %e, "tcp fabric: handshake broke");
        qp.unbind_inbound(sock_id);
        return None;
    }
    Some((qp, hello.src, gen))
}

/// Look up a remote region and check key, right, bounds and (for atomics)
/// alignment. Returns the region and the absolute offset in its memory.
fn check_remote(
    core: &NodeCore,
    rkey: u32,
    offset: u64,
    len: usize,
    right: Access,
    atomic: bool,
) -> Option<(MemoryRegion, usize)> {
    let mrs = core.mrs.read();
    let mr = mrs.get(&Rkey(rkey))?;
    if !mr.access.contains(right) || !mr.contains(offset, len) {
        return None;
    }
    let at = mr.base() + offset as usize;
    if atomic && !at.is_multiple_of(8) {
        return None;
    }
    Some((mr.clone(), at))
}

/// Carry out one request for `qp` from `src`. Returns the status and, for
/// atomics, the old value; a READ's bytes go to `read_buf`.
fn execute(
    core: &NodeCore,
    qp: &Arc<QpInner>,
    src: QpAddr,
    gen: u64,
    h: &RequestHeader,
    payload: &[u8],
    read_buf: &mut Vec<u8>,
) -> (Status, u64) {
    let _gate = qp.gate.read();
    if !core.alive.load(Ordering::Acquire)
        || core.env.faults.cut(src.node, core.id)
        || !qp.is_ready()
        || *qp.peer_addr.read() != Some(src)
        || qp.inbound_gen.load(Ordering::Acquire) != gen
    {
        return (Status::NotConnected, 0);
    }
    match h.opcode {
        Opcode::Send => (land_message(qp, src, payload, h.imm, h.persist, None), 0),
        Opcode::Write => {
            let Some((mr, at)) = check_remote(
                core,
                h.rkey,
                h.offset,
                payload.len(),
                Access::REMOTE_WRITE,
                false,
            ) else {
                return (Status::RemoteAccessError, 0);
            };
            if h.imm.is_some() {
                // WRITE-with-immediate needs a receive at the target; it is
                // claimed first so that a refused request changes nothing.
                return (
                    land_message(qp, src, &[], h.imm, h.persist, Some((&mr, at, payload))),
                    0,
                );
            }
            mr.memory().dma_write(at, payload);
            if h.persist {
                mr.memory().dma_persist(at, payload.len());
            }
            (Status::Success, 0)
        }
        Opcode::Read => {
            // The length was checked against the frame cap when decoded.
            let len = h.arg0 as usize;
            let Some((mr, at)) =
                check_remote(core, h.rkey, h.offset, len, Access::REMOTE_READ, false)
            else {
                return (Status::RemoteAccessError, 0);
            };
            read_buf.clear();
            read_buf.resize(len, 0);
            mr.memory().dma_read(at, read_buf);
            (Status::Success, 0)
        }
        Opcode::CompareSwap => {
            let Some((mr, at)) =
                check_remote(core, h.rkey, h.offset, 8, Access::REMOTE_ATOMIC, true)
            else {
                return (Status::RemoteAccessError, 0);
            };
            (
                Status::Success,
                mr.memory().dma_compare_swap(at, h.arg0, h.arg1),
            )
        }
        Opcode::FetchAdd => {
            let Some((mr, at)) =
                check_remote(core, h.rkey, h.offset, 8, Access::REMOTE_ATOMIC, true)
            else {
                return (Status::RemoteAccessError, 0);
            };
            (Status::Success, mr.memory().dma_fetch_add(at, h.arg0))
        }
        Opcode::Flush => {
            // This connection's requests execute one after another in order, so
            // every WRITE the initiator posted before the FLUSH has landed.
            let placement = if h.arg1 == wire::PLACEMENT_PERSISTENT {
                Placement::Persistence
            } else {
                Placement::GlobalVisibility
            };
            // A length past any region is refused by the bounds check below.
            let len = usize::try_from(h.arg0).unwrap_or(usize::MAX);
            let Some((mr, at)) =
                check_remote(core, h.rkey, h.offset, len, placement.right(), false)
            else {
                return (Status::RemoteAccessError, 0);
            };
            if placement == Placement::Persistence && len > 0 {
                mr.memory().dma_persist(at, len);
            }
            (Status::Success, 0)
        }
        Opcode::AtomicWrite => {
            let Some((mr, at)) =
                check_remote(core, h.rkey, h.offset, 8, Access::REMOTE_WRITE, true)
            else {
                return (Status::RemoteAccessError, 0);
            };
            mr.memory().dma_atomic_write(at, h.arg0);
            if h.persist {
                mr.memory().dma_persist(at, 8);
            }
            (Status::Success, 0)
        }
    }
}

/// Land a message (or a WRITE-with-immediate's notification) in `qp`'s SRQ.
fn land_message(
    qp: &QpInner,
    src: QpAddr,
    data: &[u8],
    imm: Option<u32>,
    persist: bool,
    write: Option<(&MemoryRegion, usize, &[u8])>,
) -> Status {
    let Some(srq) = qp.srq.as_ref() else {
        return Status::RnrRetryExceeded;
    };
    // A message lands in the receive buffer while its place is claimed; a
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
    let landing = match srq.claim_and_land(data.len(), || qp.is_ready(), into_buffer) {
        Ok(l) => l,
        Err(LandError::Closed) => return Status::NotConnected,
        Err(LandError::NoBuffer) => return Status::RnrRetryExceeded,
        Err(LandError::TooLarge { wr_id }) => {
            let wc = Completion {
                wr_id,
                status: WcStatus::LocalLengthError,
                opcode: WcOpcode::Recv,
                qpn: qp.addr.qpn,
                byte_len: data.len() as u32,
                offset: 0,
                imm: None,
                src: Some(src),
            };
            let _ = qp.recv_cq.push(CqEntry { wc, retire: None });
            return Status::RemoteInvalidRequest;
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
        qpn: qp.addr.qpn,
        // WRITE-with-immediate: the length written, as `ibv_wc.byte_len`.
        byte_len: write.map_or(data.len(), |(_, _, bytes)| bytes.len()) as u32,
        offset: landing.offset_in_buffer as u64,
        imm,
        src: Some(src),
    };
    // A receive completion that overflows a bounded CQ puts the receiving queue
    // pair in the error state; the sender's request has already landed.
    if let Pushed::Overflow = qp.recv_cq.push(CqEntry { wc, retire: None }) {
        qp.state.store(super::qp::STATE_ERROR, Ordering::Release);
    }
    Status::Success
}
