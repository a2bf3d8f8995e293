//! The sender of every design: posts a request in its design's pattern and polls
//! for its reply, with at most `inflight_max` requests outstanding.
//!
//! A client is a state machine like the server: `post` never waits, `poll` does
//! one round of checking (its completion queues and, for the WRITE designs, the
//! reply slots in its memory) and returns the oldest request's reply once it is
//! there; `call` is `post` then `poll` until the reply, bounded by
//! `reply_timeout_ns` on the client's clock. Replies come back in request order
//! because the server serves a connection's requests in order.
//!
//! Invariants: a request's slot `(seq - 1) % W` is written only when the request
//! `W` before it has its reply (the window), so the server never reads a slot being
//! reused and the client never overwrites an unread reply; every receive buffer
//! consumed by a reply is posted again before the next request is sent.

use std::collections::VecDeque;
use std::sync::Arc;

use rowankv_fabric::{
    Completion, CompletionQueue, MemoryRegion, Nic, Op, QueuePair, RecvBuffer, RemoteRegion,
    SharedReceiveQueue, WcOpcode, WorkRequest,
};
use rowankv_types::Clock;

use crate::layout::{Header, Kind, Layout, HEADER_BYTES};
use crate::{
    ClientStats, Design, RpcError, ServerConfig, IDLE_SPINS_BEFORE_YIELD, RFP_FETCH_BYTES,
    SCALERPC_PROCESS_PER_WARMUP,
};

/// A reply: the request's sequence number (from 1, per client) and the payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub seq: u64,
    pub data: Vec<u8>,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    seq: u64,
    warmup: bool,
}

/// RFP: the READ of a result in flight, and whether its completion was polled.
#[derive(Clone, Copy, Debug)]
struct Fetch {
    wr_id: u64,
    /// Offset within the result slot the READ starts at, and its length.
    from: usize,
    len: usize,
    done: bool,
}

/// Completions taken per poll of a completion queue.
const POLL_BATCH: usize = 16;

/// The parts of a connection the server's `connect` hands to the client.
pub(crate) struct ClientParts<N: Nic> {
    pub design: Design,
    pub config: ServerConfig,
    pub index: u32,
    pub nic: N,
    pub qp: N::Qp,
    pub send_cq: N::Cq,
    pub recv_cq: N::Cq,
    pub srq: N::Srq,
    pub region: MemoryRegion,
    pub server: RemoteRegion,
    pub clock: Arc<dyn Clock>,
}

/// One client's connection to a server, in one design.
pub struct Client<N: Nic> {
    design: Design,
    config: ServerConfig,
    layout: Layout,
    index: u32,
    _nic: N,
    qp: N::Qp,
    send_cq: N::Cq,
    recv_cq: N::Cq,
    srq: N::Srq,
    region: MemoryRegion,
    server: RemoteRegion,
    clock: Arc<dyn Clock>,
    next_seq: u64,
    /// Requests posted so far (ScaleRPC's phase counter).
    posted: u64,
    pending: VecDeque<Pending>,
    /// SEND designs and Octopus: replies that arrived, oldest first.
    arrived: VecDeque<(u64, Result<Vec<u8>, RpcError>)>,
    fetch: Option<Fetch>,
    /// RFP: READs of the call at the front that found its result (1 or 2).
    fetch_reads: u64,
    /// RFP: READs (and their bytes) done for the result now being fetched, not
    /// yet known to have found it.
    fetched: (u64, u64),
    next_wr_id: u64,
    message: Vec<u8>,
    stats: ClientStats,
}

impl<N: Nic> Client<N> {
    /// Takes a connected queue pair and posts the client's receive buffers.
    pub(crate) fn new(parts: ClientParts<N>) -> Result<Client<N>, RpcError> {
        let layout = Layout::new(&parts.config);
        let client = Client {
            design: parts.design,
            config: parts.config,
            layout,
            index: parts.index,
            _nic: parts.nic,
            qp: parts.qp,
            send_cq: parts.send_cq,
            recv_cq: parts.recv_cq,
            srq: parts.srq,
            region: parts.region,
            server: parts.server,
            clock: parts.clock,
            next_seq: 1,
            posted: 0,
            pending: VecDeque::with_capacity(parts.config.inflight_max),
            arrived: VecDeque::with_capacity(parts.config.inflight_max),
            fetch: None,
            fetch_reads: 0,
            fetched: (0, 0),
            next_wr_id: 1,
            message: Vec::new(),
            stats: ClientStats::default(),
        };
        if client.takes_receives() {
            let buffers: Vec<RecvBuffer> = (0..layout.slots())
                .map(|slot| client.reply_buffer(slot))
                .collect();
            client.srq.post_recv(&buffers)?;
        }
        Ok(client)
    }

    pub fn design(&self) -> Design {
        self.design
    }

    /// This client's index at the server.
    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Requests posted and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.pending.len()
    }

    /// Whether replies reach this client through its receive queue.
    fn takes_receives(&self) -> bool {
        matches!(self.design, Design::DaRpc | Design::Fasst | Design::Octopus)
    }

    /// A reply slot as a receive buffer (`wr_id` = the slot). Octopus's WRITE with
    /// immediate lands no bytes in it; it only consumes it.
    fn reply_buffer(&self, slot: usize) -> RecvBuffer {
        RecvBuffer {
            wr_id: slot as u64,
            mr: self.region.clone(),
            offset: self.layout.reply_slot(slot),
            len_bytes: self.layout.reply_slot_bytes(),
        }
    }

    fn wr_id(&mut self) -> u64 {
        self.next_wr_id += 1;
        self.next_wr_id
    }

    /// Send `request` in the design's pattern; returns its sequence number. Never
    /// waits. Refuses a request larger than the design carries, and a request
    /// beyond the window.
    pub fn post(&mut self, request: &[u8]) -> Result<u64, RpcError> {
        let limit_bytes = self.design.request_bytes_limit(&self.config);
        if request.len() > limit_bytes {
            self.stats.refused += 1;
            return Err(RpcError::TooLarge {
                design: self.design,
                bytes: request.len(),
                limit_bytes,
            });
        }
        if self.pending.len() >= self.config.inflight_max {
            return Err(RpcError::WindowFull {
                inflight_max: self.config.inflight_max,
            });
        }
        // Retire finished work requests first, so the send queue has room.
        self.drain_send_cq()?;
        let seq = self.next_seq;
        let slot = self.layout.slot_of(seq);
        let ring = self
            .server
            .at(self.layout.ring_slot(self.index as usize, slot) as u64);
        let warmup = self.design == Design::ScaleRpc
            && self.posted.is_multiple_of(1 + SCALERPC_PROCESS_PER_WARMUP);
        let kind = if warmup {
            Kind::Descriptor
        } else {
            Kind::Inline
        };
        let staging = self.layout.staging_slot(slot);
        let header = Header::new(seq, kind, self.index, staging as u64, request);
        self.message.clear();
        self.message.extend_from_slice(&header.encode());
        let (id1, id2) = (self.wr_id(), self.wr_id());
        match self.design {
            Design::DaRpc | Design::Fasst => {
                self.message.extend_from_slice(request);
                let op = Op::Send {
                    data: &self.message,
                    imm: None,
                };
                self.qp.post_send(&[WorkRequest::new(id1, op)])?;
                self.stats.verbs.send += 1;
                self.stats.bytes_to_server += self.message.len() as u64;
            }
            Design::Farm | Design::Rfp | Design::Octopus => {
                self.message.extend_from_slice(request);
                let imm = (self.design == Design::Octopus).then_some(seq as u32);
                let op = Op::Write {
                    data: &self.message,
                    remote: ring,
                    imm,
                };
                self.qp.post_send(&[WorkRequest::new(id1, op)])?;
                if imm.is_some() {
                    self.stats.verbs.write_imm += 1;
                } else {
                    self.stats.verbs.write += 1;
                }
                self.stats.bytes_to_server += self.message.len() as u64;
            }
            Design::L5 => {
                // The data, then its flag (the header) in a second WRITE: RC lands a
                // queue pair's WRITEs in order, so a flag seen means data landed.
                let data = Op::Write {
                    data: request,
                    remote: self.server.at(ring.offset + HEADER_BYTES as u64),
                    imm: None,
                };
                let flag = Op::Write {
                    data: &self.message,
                    remote: ring,
                    imm: None,
                };
                self.qp
                    .post_send(&[WorkRequest::new(id1, data), WorkRequest::new(id2, flag)])?;
                self.stats.verbs.write += 2;
                self.stats.bytes_to_server += (request.len() + HEADER_BYTES) as u64;
            }
            Design::ScaleRpc if warmup => {
                // Warm-up: the data stays here; only its address travels.
                self.region.write(staging, request);
                let op = Op::Write {
                    data: &self.message,
                    remote: ring,
                    imm: None,
                };
                self.qp.post_send(&[WorkRequest::new(id1, op)])?;
                self.stats.verbs.write += 1;
                self.stats.bytes_to_server += HEADER_BYTES as u64;
            }
            Design::ScaleRpc => {
                self.message.extend_from_slice(request);
                let op = Op::Write {
                    data: &self.message,
                    remote: ring,
                    imm: None,
                };
                self.qp.post_send(&[WorkRequest::new(id1, op)])?;
                self.stats.verbs.write += 1;
                self.stats.bytes_to_server += self.message.len() as u64;
            }
        }
        self.next_seq += 1;
        self.posted += 1;
        self.pending.push_back(Pending { seq, warmup });
        Ok(seq)
    }

    /// One round of checking for the oldest request's reply. `Ok(None)`: not yet
    /// (or nothing outstanding). An error reply (`ReplyTooLarge`) answers its
    /// request as an `Err`.
    pub fn poll(&mut self) -> Result<Option<Reply>, RpcError> {
        self.drain_send_cq()?;
        let Some(front) = self.pending.front().copied() else {
            return Ok(None);
        };
        let outcome = match self.design {
            Design::DaRpc | Design::Fasst | Design::Octopus => {
                self.drain_recv_cq()?;
                match self.arrived.front() {
                    Some((seq, _)) if *seq == front.seq => {
                        self.arrived.pop_front().map(|(_, outcome)| outcome)
                    }
                    Some((seq, _)) => {
                        return Err(RpcError::Protocol(format!(
                            "reply {seq} arrived while waiting for {}",
                            front.seq
                        )))
                    }
                    None => None,
                }
            }
            Design::Farm | Design::L5 | Design::ScaleRpc => {
                let at = self.layout.reply_slot(self.layout.slot_of(front.seq));
                self.read_reply(at, front.seq)?
            }
            Design::Rfp => self.fetch_result(front.seq)?,
        };
        let Some(outcome) = outcome else {
            return Ok(None);
        };
        self.pending.pop_front();
        self.stats.calls += 1;
        self.stats.round_trips += match self.design {
            Design::Rfp => 1 + std::mem::take(&mut self.fetch_reads),
            Design::ScaleRpc if front.warmup => 2,
            _ => 1,
        };
        if front.warmup {
            self.stats.warmup_calls += 1;
        }
        outcome.map(|data| {
            Some(Reply {
                seq: front.seq,
                data,
            })
        })
    }

    /// `post` then `poll` until the reply, spinning (and yielding the core now and
    /// then); at most `reply_timeout_ns` on the client's clock.
    pub fn call(&mut self, request: &[u8]) -> Result<Vec<u8>, RpcError> {
        if !self.pending.is_empty() {
            return Err(RpcError::Outstanding {
                outstanding: self.pending.len(),
            });
        }
        let seq = self.post(request)?;
        let deadline_ns = self
            .clock
            .now_ns()
            .saturating_add(self.config.reply_timeout_ns);
        let mut idle = 0u32;
        loop {
            if let Some(reply) = self.poll()? {
                assert_eq!(reply.seq, seq, "the only request outstanding");
                return Ok(reply.data);
            }
            if self.clock.now_ns() > deadline_ns {
                return Err(RpcError::Timeout {
                    timeout_ns: self.config.reply_timeout_ns,
                });
            }
            idle += 1;
            if idle.is_multiple_of(IDLE_SPINS_BEFORE_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn drain_send_cq(&mut self) -> Result<(), RpcError> {
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        loop {
            let n = self.send_cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                crate::succeeded(wc)?;
                if let Some(f) = self.fetch.as_mut() {
                    if f.wr_id == wc.wr_id {
                        f.done = true;
                    }
                }
            }
            if n < wcs.len() {
                return Ok(());
            }
        }
    }

    /// SEND designs and Octopus: take the replies that arrived and give their
    /// buffers back to the receive queue.
    fn drain_recv_cq(&mut self) -> Result<(), RpcError> {
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        loop {
            let n = self.recv_cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                crate::succeeded(wc)?;
                let buffer = usize::try_from(wc.wr_id)
                    .ok()
                    .filter(|&b| b < self.layout.slots())
                    .ok_or_else(|| RpcError::Protocol(format!("unknown buffer {}", wc.wr_id)))?;
                let (seq, at) = match (self.design, wc.opcode, wc.imm) {
                    (Design::Octopus, WcOpcode::RecvWriteImm, Some(imm)) => {
                        // The immediate names the request; its reply is in the slot
                        // the WRITE landed in, whichever buffer it consumed.
                        let seq = self.seq_of_imm(imm)?;
                        (seq, self.layout.reply_slot(self.layout.slot_of(seq)))
                    }
                    (Design::DaRpc | Design::Fasst, WcOpcode::Recv, None) => {
                        let at = self.layout.reply_slot(buffer);
                        let header = self.header_at(at)?;
                        (header.seq, at)
                    }
                    (_, opcode, imm) => {
                        return Err(RpcError::Protocol(format!(
                            "unexpected receive {opcode:?} (imm {imm:?}) for {}",
                            self.design
                        )))
                    }
                };
                let outcome = self
                    .read_reply(at, seq)?
                    .ok_or_else(|| RpcError::Protocol(format!("reply {seq} landed torn")))?;
                self.srq.post_recv(&[self.reply_buffer(buffer)])?;
                self.arrived.push_back((seq, outcome));
            }
            if n < wcs.len() {
                return Ok(());
            }
        }
    }

    /// The full sequence number of an outstanding request from its low 32 bits.
    fn seq_of_imm(&self, imm: u32) -> Result<u64, RpcError> {
        self.pending
            .iter()
            .map(|p| p.seq)
            .find(|&s| s as u32 == imm)
            .ok_or_else(|| RpcError::Protocol(format!("immediate {imm} names no request")))
    }

    fn header_at(&self, at: usize) -> Result<Header, RpcError> {
        let mut b = [0u8; HEADER_BYTES];
        self.region.read(at, &mut b);
        Header::decode(&b).ok_or_else(|| RpcError::Protocol("a reply without a header".into()))
    }

    /// The reply to `seq` at `at` in this client's memory: `None` if it is not
    /// (wholly) there yet.
    fn read_reply(
        &self,
        at: usize,
        seq: u64,
    ) -> Result<Option<Result<Vec<u8>, RpcError>>, RpcError> {
        let mut b = [0u8; HEADER_BYTES];
        self.region.read(at, &mut b);
        let Some(header) = Header::decode(&b).filter(|h| h.seq == seq) else {
            return Ok(None);
        };
        let limit_bytes = self.design.reply_bytes_limit(&self.config);
        if header.len as usize > limit_bytes {
            return Err(RpcError::Protocol(format!(
                "reply of {} B over the {limit_bytes} B limit",
                header.len
            )));
        }
        let mut payload = vec![0u8; header.len as usize];
        self.region.read(at + HEADER_BYTES, &mut payload);
        if !header.matches(&payload) {
            return Ok(None);
        }
        Ok(Some(match header.kind {
            Kind::Inline => Ok(payload),
            Kind::ReplyTooLarge => Err(RpcError::ReplyTooLarge {
                bytes: header.aux,
                limit_bytes,
            }),
            Kind::Descriptor => {
                return Err(RpcError::Protocol("a descriptor as a reply".into()));
            }
        }))
    }

    /// RFP: READ the result slot at the server until it holds `seq`'s result,
    /// with a second READ for the rest of a result longer than the first fetch.
    fn fetch_result(&mut self, seq: u64) -> Result<Option<Result<Vec<u8>, RpcError>>, RpcError> {
        let slot = self.layout.slot_of(seq);
        let local = self.layout.reply_slot(slot);
        let remote = self.layout.result_slot(self.index as usize, slot);
        let first_len = RFP_FETCH_BYTES.min(self.layout.reply_slot_bytes());
        let Some(fetch) = self.fetch else {
            self.post_fetch(local, remote, 0, first_len)?;
            return Ok(None);
        };
        if !fetch.done {
            return Ok(None);
        }
        self.fetch = None;
        self.fetched.0 += 1;
        self.fetched.1 += fetch.len as u64;
        let mut b = [0u8; HEADER_BYTES];
        self.region.read(local, &mut b);
        let header = Header::decode(&b).filter(|h| h.seq == seq);
        let whole = header.map(|h| HEADER_BYTES + h.len as usize);
        match whole {
            Some(whole) if fetch.from == 0 && whole > fetch.len => {
                // The header is there, the rest is longer than the first fetch.
                let rest = whole.min(self.layout.reply_slot_bytes()) - fetch.len;
                self.post_fetch(local, remote, fetch.len, rest)?;
                Ok(None)
            }
            Some(_) => match self.read_reply(local, seq)? {
                Some(outcome) => {
                    self.settle_fetches(true);
                    Ok(Some(outcome))
                }
                None => {
                    // Read while the server was writing it: fetch it whole again.
                    self.settle_fetches(false);
                    self.post_fetch(local, remote, 0, first_len)?;
                    Ok(None)
                }
            },
            None => {
                self.settle_fetches(false);
                self.post_fetch(local, remote, 0, first_len)?;
                Ok(None)
            }
        }
    }

    fn post_fetch(
        &mut self,
        local: usize,
        remote: usize,
        from: usize,
        len: usize,
    ) -> Result<(), RpcError> {
        let wr_id = self.wr_id();
        let op = Op::Read {
            remote: self.server.at((remote + from) as u64),
            len,
            local: rowankv_fabric::LocalAddr {
                mr: &self.region,
                offset: local + from,
            },
        };
        self.qp.post_send(&[WorkRequest::new(wr_id, op)])?;
        self.fetch = Some(Fetch {
            wr_id,
            from,
            len,
            done: false,
        });
        Ok(())
    }

    /// RFP's READs are counted once their outcome is known: the READs that
    /// fetched the result are verbs and round trips of the call; those that found
    /// it absent or half written are empty fetches, counted apart because how many
    /// there are depends on timing.
    fn settle_fetches(&mut self, found: bool) {
        let (reads, bytes) = std::mem::take(&mut self.fetched);
        if found {
            self.stats.verbs.read += reads;
            self.stats.bytes_to_client += bytes;
            self.fetch_reads = reads;
        } else {
            self.stats.empty_fetches += reads;
            self.stats.empty_fetch_bytes += bytes;
        }
    }
}
