//! The RPC endpoint: SEND/RECV over reliable-connected queue pairs (seed 000 §5.2).
//!
//! One endpoint per worker (and per client): one completion queue, one shared
//! receive queue of single-message buffers of `frame_bytes_max` each in DRAM, and
//! one queue pair per connected peer, all sharing the completion queue. The owner
//! creates its other queue pairs (replication) on the same completion queue, so that
//! one poll tells it of new messages and of replication ACKs alike (§5.2); the
//! endpoint hands back every completion whose `wr_id` tag is not its own.
//!
//! Flow control is by credits, so that a receive buffer is always posted when a
//! message arrives (the fabric's RC has no receiver-not-ready retry): each peer may
//! have at most `credits` requests outstanding towards this endpoint, and this
//! endpoint at most `credits` towards each peer; the endpoint posts `2 * credits`
//! receive buffers per peer it opens (requests in, responses to its own requests).
//! A request beyond the credit is refused locally with [`SendError::Busy`].
//!
//! The paper's RPC runs on unreliable datagram queue pairs; the fabric offers RC only,
//! which gives the same per-message semantics here (one message per receive buffer,
//! at most one MTU), with ordering per peer as a bonus nobody relies on.

use std::collections::HashMap;
use std::sync::Arc;

use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, FabricError, MemoryRegion, Nic, Op,
    QpAddr, QpState, QueuePair, RecvBuffer, SharedReceiveQueue, SrqConfig, WcOpcode, WcStatus,
    WorkRequest,
};
use rowankv_types::QpNum;

use rowankv_wire::frame::{self, Body, Envelope, FrameError};

/// `wr_id`s carry their owner in the top byte.
pub const WR_TAG_SHIFT: u32 = 56;
/// Tag of the endpoint's own SENDs.
pub const WR_TAG_RPC_SEND: u64 = 1;
/// Tag of the endpoint's receive buffers.
pub const WR_TAG_RPC_RECV: u64 = 2;
/// First tag free for the endpoint's owner (replication and the like).
pub const WR_TAG_OWNER_MIN: u64 = 16;

/// The tag of a `wr_id`.
pub fn wr_tag(wr_id: u64) -> u64 {
    wr_id >> WR_TAG_SHIFT
}

/// A `wr_id` with `tag` and a 56-bit `value`.
pub fn wr_id(tag: u64, value: u64) -> u64 {
    debug_assert!(value < 1 << WR_TAG_SHIFT);
    (tag << WR_TAG_SHIFT) | value
}

/// Sizes of an endpoint.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Largest message (the RPC MTU).
    pub frame_bytes_max: usize,
    /// Requests outstanding per peer, each way.
    pub credits: usize,
    /// Bound on outstanding SENDs per queue pair.
    pub send_depth: usize,
    /// Completion queue capacity (bounded: an overflow is an error).
    pub cq_entries: usize,
    /// Bound on peers.
    pub peers_max: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            frame_bytes_max: frame::FRAME_BYTES_MAX_DEFAULT,
            credits: 8,
            send_depth: 256,
            cq_entries: 16384,
            peers_max: 256,
        }
    }
}

/// A connected (or connecting) peer of an endpoint: a slot (low 16 bits) and
/// the slot's generation (high 16 bits), so that an identifier of a peer whose
/// slot was taken over ([`Endpoint::open`] at its bound) names nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

impl PeerId {
    fn new(slot: usize, generation: u16) -> PeerId {
        PeerId(((generation as u32) << 16) | slot as u32)
    }

    fn slot(self) -> usize {
        (self.0 & 0xffff) as usize
    }

    fn generation(self) -> u16 {
        (self.0 >> 16) as u16
    }
}

/// Most peers an endpoint may have (a peer's slot is 16 bits).
pub const PEERS_MAX: usize = 1 << 16;

/// Errors of sending.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("peer {0:?} has {1} requests outstanding, its credit")]
    Busy(PeerId, usize),
    #[error("no peer {0:?}")]
    UnknownPeer(PeerId),
    #[error("peer {0:?} is disconnected")]
    Disconnected(PeerId),
    #[error("encoding: {0}")]
    Frame(#[from] FrameError),
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
}

/// What a poll found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message from `peer`: `data[start..start + len]` of the poll's data buffer.
    Message {
        peer: PeerId,
        start: usize,
        len: usize,
    },
    /// A SEND to `peer` failed (peer crashed, link cut); the queue pair was reset.
    /// Requests outstanding to it will never be answered.
    SendFailed { peer: PeerId, status: WcStatus },
    /// A completion of one of the owner's queue pairs (tag ≥ `WR_TAG_OWNER_MIN`).
    Owner(Completion),
}

struct Peer<Q> {
    qp: Q,
    remote: Option<QpAddr>,
    /// Our requests it has not answered.
    outstanding: usize,
    sends: u64,
    generation: u16,
    /// When it last sent or was sent a message (the endpoint's message count).
    last_used: u64,
}

/// One RPC endpoint.
pub struct Endpoint<N: Nic> {
    nic: N,
    config: EndpointConfig,
    cq: Arc<N::Cq>,
    srq: Arc<N::Srq>,
    /// Receive buffers: one region per peer opened, `2 * credits` buffers each.
    regions: Vec<MemoryRegion>,
    peers: Vec<Peer<N::Qp>>,
    by_qpn: HashMap<QpNum, PeerId>,
    send_buf: Vec<u8>,
    polled: Vec<Completion>,
    /// Messages sent and received: the clock of `Peer::last_used`.
    messages: u64,
    /// Slots of closed peers.
    free: Vec<usize>,
}

/// Signal one SEND in this many, so that unsignaled ones retire.
const SIGNAL_EVERY: u64 = 32;

impl<N: Nic> Endpoint<N> {
    pub fn new(nic: N, config: EndpointConfig) -> Result<Self, FabricError> {
        if config.frame_bytes_max < frame::HEADER_BYTES
            || config.credits == 0
            || config.peers_max == 0
            || config.peers_max > PEERS_MAX
        {
            return Err(FabricError::Invalid(format!(
                "endpoint: frame_bytes_max {} credits {} peers_max {}",
                config.frame_bytes_max, config.credits, config.peers_max
            )));
        }
        let cq = Arc::new(nic.create_cq(CqKind::Bounded {
            capacity: config.cq_entries,
        })?);
        let srq =
            Arc::new(nic.create_srq(SrqConfig::single(config.peers_max * 2 * config.credits))?);
        Ok(Endpoint {
            nic,
            cq,
            srq,
            regions: Vec::new(),
            peers: Vec::new(),
            by_qpn: HashMap::new(),
            send_buf: Vec::with_capacity(config.frame_bytes_max),
            polled: vec![Completion::BLANK; 64],
            messages: 0,
            free: Vec::new(),
            config,
        })
    }

    fn peer_mut(&mut self, peer: PeerId) -> Option<&mut Peer<N::Qp>> {
        self.peers
            .get_mut(peer.slot())
            .filter(|p| p.generation == peer.generation())
    }

    fn peer_ref(&self, peer: PeerId) -> Option<&Peer<N::Qp>> {
        self.peers
            .get(peer.slot())
            .filter(|p| p.generation == peer.generation())
    }

    /// At the bound: take over the slot of the peer that has been quiet
    /// longest with none of our requests outstanding (a client that went away
    /// without a word, as processes do). Its queue pair is closed; its
    /// identifier names nothing from now on; a message it sends later finds
    /// no queue pair (the sender sees an error and connects again).
    fn take_over_quietest(&mut self) -> Result<(PeerId, QpAddr), FabricError> {
        let victim = self
            .peers
            .iter()
            .enumerate()
            .filter(|(i, p)| p.outstanding == 0 && !self.free.contains(i))
            .min_by_key(|(_, p)| p.last_used)
            .map(|(i, _)| i)
            .ok_or_else(|| {
                FabricError::Invalid(format!(
                    "endpoint has {} peers, its bound, each with requests outstanding",
                    self.peers.len()
                ))
            })?;
        tracing::debug!(
            slot = victim,
            "endpoint at its bound: the quietest peer's slot taken over"
        );
        self.retire(victim);
        self.reuse(victim)
    }

    /// Close a slot's queue pair; its identifier names nothing from now on.
    fn retire(&mut self, slot: usize) {
        let p = &mut self.peers[slot];
        self.by_qpn.remove(&p.qp.addr().qpn);
        p.qp.close();
        p.remote = None;
        p.outstanding = 0;
        p.sends = 0;
        p.generation = p.generation.wrapping_add(1);
    }

    /// A retired slot with a new queue pair (its receive buffers stay posted).
    fn reuse(&mut self, slot: usize) -> Result<(PeerId, QpAddr), FabricError> {
        let qp = self
            .nic
            .create_qp(&self.cq, &self.cq, Some(&self.srq), self.config.send_depth)?;
        let addr = qp.addr();
        let p = &mut self.peers[slot];
        p.qp = qp;
        p.last_used = self.messages;
        let id = PeerId::new(slot, p.generation);
        self.by_qpn.insert(addr.qpn, id);
        Ok((id, addr))
    }

    /// Close `peer`: its queue pair is destroyed, its identifier names nothing
    /// from now on, and its slot is free for the next [`Endpoint::open`]. For
    /// a connection that failed or is no longer wanted.
    pub fn close(&mut self, peer: PeerId) {
        if self.peer_ref(peer).is_some() {
            self.retire(peer.slot());
            self.free.push(peer.slot());
        }
    }

    pub fn nic(&self) -> &N {
        &self.nic
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// The completion queue the owner's other queue pairs should share.
    pub fn cq(&self) -> &N::Cq {
        &self.cq
    }

    /// Peers open now (opened and not closed).
    pub fn open_peers(&self) -> usize {
        self.peers.len() - self.free.len()
    }

    /// A new queue pair for a peer, not yet connected, and its address.
    ///
    /// At the bound ([`EndpointConfig::peers_max`]), the slot of the peer quiet
    /// longest is taken over (see `take_over_quietest`).
    pub fn open(&mut self) -> Result<(PeerId, QpAddr), FabricError> {
        if let Some(slot) = self.free.pop() {
            return self.reuse(slot);
        }
        if self.peers.len() >= self.config.peers_max {
            return self.take_over_quietest();
        }
        let per_peer = 2 * self.config.credits;
        let frame = self.config.frame_bytes_max;
        let memory = Arc::new(DramMemory::new(per_peer * frame));
        let mr = self
            .nic
            .register(memory, 0, per_peer * frame, Access::NONE)?;
        let region_index = self.regions.len() as u64;
        let buffers: Vec<RecvBuffer> = (0..per_peer)
            .map(|i| RecvBuffer {
                wr_id: wr_id(WR_TAG_RPC_RECV, (region_index << 24) | i as u64),
                mr: mr.clone(),
                offset: i * frame,
                len_bytes: frame,
            })
            .collect();
        self.srq.post_recv(&buffers)?;
        self.regions.push(mr);
        let qp = self
            .nic
            .create_qp(&self.cq, &self.cq, Some(&self.srq), self.config.send_depth)?;
        let addr = qp.addr();
        let id = PeerId::new(self.peers.len(), 0);
        self.by_qpn.insert(addr.qpn, id);
        self.peers.push(Peer {
            qp,
            remote: None,
            outstanding: 0,
            sends: 0,
            generation: 0,
            last_used: self.messages,
        });
        Ok((id, addr))
    }

    /// Connect `peer`'s queue pair to the remote one.
    pub fn connect(&mut self, peer: PeerId, remote: QpAddr) -> Result<(), FabricError> {
        let p = self
            .peer_mut(peer)
            .ok_or(FabricError::Invalid(format!("no peer {peer:?}")))?;
        p.qp.connect(remote)?;
        p.remote = Some(remote);
        Ok(())
    }

    /// The remote address `peer` is connected to.
    pub fn remote(&self, peer: PeerId) -> Option<QpAddr> {
        self.peer_ref(peer).and_then(|p| p.remote)
    }

    /// Our requests `peer` has not answered yet.
    pub fn outstanding(&self, peer: PeerId) -> usize {
        self.peer_ref(peer).map_or(0, |p| p.outstanding)
    }

    /// Send a request: takes one of `peer`'s credits until its response arrives
    /// (or [`Endpoint::forget`] is called on a timeout).
    pub fn request(
        &mut self,
        peer: PeerId,
        env: &Envelope,
        body: &Body<'_>,
    ) -> Result<(), SendError> {
        let credits = self.config.credits;
        let p = self.peer_ref(peer).ok_or(SendError::UnknownPeer(peer))?;
        if p.outstanding >= credits {
            return Err(SendError::Busy(peer, p.outstanding));
        }
        self.send(peer, env, body)?;
        if let Some(p) = self.peer_mut(peer) {
            p.outstanding += 1;
        }
        Ok(())
    }

    /// Give back the credit of a request that will not be answered (timed out).
    pub fn forget(&mut self, peer: PeerId) {
        if let Some(p) = self.peer_mut(peer) {
            p.outstanding = p.outstanding.saturating_sub(1);
        }
    }

    /// Send a message that takes no credit: a response, or a frame answering a
    /// malformed request.
    pub fn respond(
        &mut self,
        peer: PeerId,
        env: &Envelope,
        body: &Body<'_>,
    ) -> Result<(), SendError> {
        self.send(peer, env, body)
    }

    fn send(&mut self, peer: PeerId, env: &Envelope, body: &Body<'_>) -> Result<(), SendError> {
        frame::encode(&mut self.send_buf, env, body, self.config.frame_bytes_max)?;
        self.send_raw(peer)
    }

    /// Send bytes as they are (tests of malformed frames use this).
    pub fn send_bytes(&mut self, peer: PeerId, bytes: &[u8]) -> Result<(), SendError> {
        self.send_buf.clear();
        self.send_buf.extend_from_slice(bytes);
        self.send_raw(peer)
    }

    fn send_raw(&mut self, peer: PeerId) -> Result<(), SendError> {
        self.messages += 1;
        let now = self.messages;
        let p = self
            .peers
            .get_mut(peer.slot())
            .filter(|p| p.generation == peer.generation())
            .ok_or(SendError::UnknownPeer(peer))?;
        p.last_used = now;
        if p.remote.is_none() {
            return Err(SendError::Disconnected(peer));
        }
        if p.qp.state() == QpState::Error {
            p.qp.reset()?;
        }
        p.sends += 1;
        let mut wr = WorkRequest::new(
            wr_id(WR_TAG_RPC_SEND, peer.0 as u64),
            Op::Send {
                data: &self.send_buf,
                imm: None,
            },
        );
        // Keep send-queue slots retiring: signal periodically and when filling up.
        if !p.sends.is_multiple_of(SIGNAL_EVERY)
            && p.qp.outstanding() + 1 < self.config.send_depth / 2
        {
            wr = wr.unsignaled();
        }
        p.qp.post_send(&[wr])?;
        Ok(())
    }

    /// Poll the completion queue: messages are copied into `data` (cleared first)
    /// and their receive buffers posted again; every event goes to `out` (cleared).
    /// Returns the number of events.
    pub fn poll(&mut self, out: &mut Vec<Event>, data: &mut Vec<u8>) -> Result<usize, FabricError> {
        out.clear();
        data.clear();
        let n = self.cq.poll(&mut self.polled)?;
        for i in 0..n {
            let c = self.polled[i];
            match wr_tag(c.wr_id) {
                WR_TAG_RPC_RECV => self.on_recv(c, out, data)?,
                WR_TAG_RPC_SEND => {
                    if c.status != WcStatus::Success {
                        let peer = PeerId((c.wr_id & ((1 << WR_TAG_SHIFT) - 1)) as u32);
                        if let Some(p) = self.peer_mut(peer) {
                            let _ = p.qp.reset();
                            p.outstanding = 0;
                        }
                        out.push(Event::SendFailed {
                            peer,
                            status: c.status,
                        });
                    }
                }
                _ => out.push(Event::Owner(c)),
            }
        }
        Ok(out.len())
    }

    fn on_recv(
        &mut self,
        c: Completion,
        out: &mut Vec<Event>,
        data: &mut Vec<u8>,
    ) -> Result<(), FabricError> {
        let value = c.wr_id & ((1 << WR_TAG_SHIFT) - 1);
        let region = (value >> 24) as usize;
        let index = (value & 0xff_ffff) as usize;
        let frame = self.config.frame_bytes_max;
        let Some(mr) = self.regions.get(region).cloned() else {
            return Ok(());
        };
        let buffer = RecvBuffer {
            wr_id: c.wr_id,
            mr,
            offset: index * frame,
            len_bytes: frame,
        };
        let peer = c.qpn;
        if c.status == WcStatus::Success && c.opcode == WcOpcode::Recv {
            let len = (c.byte_len as usize).min(frame);
            let start = data.len();
            data.resize(start + len, 0);
            buffer.mr.read(buffer.offset, &mut data[start..]);
            if let Some(&peer) = self.by_qpn.get(&peer) {
                self.messages += 1;
                let now = self.messages;
                let response = frame::decode_header(&data[start..])
                    .is_ok_and(|h| h.msg_type == frame::MsgType::Response as u8);
                if let Some(p) = self.peer_mut(peer) {
                    p.last_used = now;
                    // A response gives back the credit of the request it answers.
                    if response {
                        p.outstanding = p.outstanding.saturating_sub(1);
                    }
                }
                out.push(Event::Message { peer, start, len });
            } else {
                // From a queue pair whose slot was taken over: dropped.
                data.truncate(start);
            }
        }
        self.srq.post_recv(&[buffer])?;
        Ok(())
    }
}

/// Connect two endpoints to each other (in-process wiring: the addresses are
/// exchanged directly instead of through a connection manager).
pub fn connect_pair<A: Nic, B: Nic>(
    a: &mut Endpoint<A>,
    b: &mut Endpoint<B>,
) -> Result<(PeerId, PeerId), FabricError> {
    let (pa, aa) = a.open()?;
    let (pb, ab) = b.open()?;
    a.connect(pa, ab)?;
    b.connect(pb, aa)?;
    Ok((pa, pb))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_fabric::{Fabric, LoopbackFabric};
    use rowankv_types::{NodeId, Term};

    fn env() -> Envelope {
        Envelope {
            cluster_id: 1,
            term: Term(1),
            request_id: 1,
            sender: NodeId(1),
        }
    }

    /// Poll until a message arrives; its peer.
    fn next_message<N: Nic>(ep: &mut Endpoint<N>) -> PeerId {
        let (mut out, mut data) = (Vec::new(), Vec::new());
        for _ in 0..100_000 {
            ep.poll(&mut out, &mut data).unwrap();
            if let Some(Event::Message { peer, .. }) = out.first() {
                return *peer;
            }
        }
        panic!("no message");
    }

    #[test]
    fn at_its_bound_an_endpoint_takes_over_the_quietest_peer_and_its_old_id_names_nothing() {
        let fabric = LoopbackFabric::new();
        let config = EndpointConfig {
            peers_max: 2,
            ..EndpointConfig::default()
        };
        let mut server = Endpoint::new(fabric.attach(NodeId(1)).unwrap(), config.clone()).unwrap();
        let mut clients: Vec<Endpoint<_>> = (0..3)
            .map(|i| Endpoint::new(fabric.attach(NodeId(10 + i)).unwrap(), config.clone()).unwrap())
            .collect();
        let (a, _) = connect_pair(&mut clients[0], &mut server).unwrap();
        let (b, _) = connect_pair(&mut clients[1], &mut server).unwrap();
        // Client 1 speaks last: client 0's slot is the quietest.
        clients[0].request(a, &env(), &Body::Ping).unwrap();
        let first = next_message(&mut server);
        clients[1].request(b, &env(), &Body::Ping).unwrap();
        let second = next_message(&mut server);
        assert_ne!(first, second);
        let (c, third) = connect_pair(&mut clients[2], &mut server).unwrap();
        assert_eq!(third.slot(), first.slot(), "the quietest slot is reused");
        assert_ne!(third, first, "under a new generation");
        assert!(matches!(
            server.respond(first, &env(), &Body::Ping),
            Err(SendError::UnknownPeer(_))
        ));
        // The newcomer and the other peer are served.
        clients[2].request(c, &env(), &Body::Ping).unwrap();
        assert_eq!(next_message(&mut server), third);
        server.respond(second, &env(), &Body::Ping).unwrap();
        assert_eq!(next_message(&mut clients[1]), b);
        // A peer with our requests outstanding is never taken over.
        let mut busy = Endpoint::new(fabric.attach(NodeId(20)).unwrap(), config.clone()).unwrap();
        let mut far: Vec<Endpoint<_>> = (0..2)
            .map(|i| Endpoint::new(fabric.attach(NodeId(30 + i)).unwrap(), config.clone()).unwrap())
            .collect();
        for f in &mut far {
            let (p, _) = connect_pair(&mut busy, f).unwrap();
            busy.request(p, &env(), &Body::Ping).unwrap();
        }
        let e = busy.open().unwrap_err();
        assert!(e.to_string().contains("outstanding"), "{e}");
    }
}
