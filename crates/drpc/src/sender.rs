//! The sender: puts requests into the receiver's ring with one of the four message
//! patterns and reports when each is durable and when it is completed.
//!
//! It owns the connection's tail (where the next entry goes, by the same placement
//! rule as the receiver's multi-packet receive queue), the seqs (consecutive from the
//! receiver's `next_seq`), the batch being filled, the in-flight window and the
//! receive buffers for replies. It is driven by [`Sender::call`], [`Sender::flush`]
//! and [`Sender::poll`]; it starts no thread.
//!
//! # Invariants
//! - An entry is posted only where the receiver has room: its end is at most one ring
//!   past the chunk of the last truncation point the receiver reported, so it never
//!   overwrites an entry not yet completed and, for SEND, always finds its chunk
//!   posted.
//! - Requests sent and not completed never exceed the window (`inflight_max`, or
//!   `inflight_slowed_max` after a slow-down signal until a reply without it), so
//!   replies never outnumber the posted reply buffers.
//! - `Event::Durable` is reported once per request, in seq order, and before its
//!   `Event::Completed`.

use std::sync::Arc;

use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, MemoryRegion, Nic, Op, Placement,
    QpAddr, QueuePair, RecvBuffer, RegionMemory, RemoteRegion, SharedReceiveQueue, SrqConfig,
    WcOpcode, WcStatus, WorkRequest,
};

use crate::layout::{
    self, decode_reply, encode_entry, entry_bytes, request_bytes, ReplyKind, RingGeometry,
    ENTRY_HEADER_BYTES, REPLY_HEADER_BYTES,
};
use crate::{DrpcError, FlowConfig, Offer, Variant};

/// Completions moved per poll call.
const POLL_BATCH: usize = 32;
/// Work requests per entry, at most (WFlush: WRITE, FLUSH, ATOMIC WRITE).
const WRS_PER_ENTRY_MAX: usize = 3;
/// WFlush writes an entry's first 8 bytes (its seq word) last, by ATOMIC WRITE.
const SEQ_WORD_BYTES: usize = 8;
const _: () = assert!(ENTRY_HEADER_BYTES >= SEQ_WORD_BYTES);

/// What the sender learns about its requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The request is in the receiver's PM: it will take effect even if the receiver
    /// crashes, and the sender must not send it again.
    Durable { seq: u64 },
    /// The request took effect; the operator's reply.
    Completed { seq: u64, reply: Vec<u8> },
}

/// Counters of a sender since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    pub requests_sent: u64,
    pub entries_posted: u64,
    pub work_requests_posted: u64,
    pub bytes_posted: u64,
    pub slow_down_signals: u64,
}

struct Link {
    ring: RemoteRegion,
    geometry: RingGeometry,
    tail_abs: u64,
    next_seq: u64,
    /// The receiver's truncation point, as last reported.
    head_abs: u64,
}

/// The sending end of one durable RPC connection. See the module documentation.
pub struct Sender<N: Nic> {
    variant: Variant,
    flow: FlowConfig,
    send_cq: N::Cq,
    recv_cq: N::Cq,
    srq: N::Srq,
    qp: N::Qp,
    send_depth: usize,
    reply_mr: MemoryRegion,
    reply_buffer_bytes: usize,
    link: Option<Link>,
    /// Requests accepted and not yet posted, with the seq of the first.
    batch: Vec<(u16, Vec<u8>)>,
    batch_seq: u64,
    /// Requests accepted (batched or posted) and not completed.
    inflight: usize,
    durable_through: u64,
    slowed: bool,
    broken: Option<WcStatus>,
    stats: SenderStats,
}

impl<N: Nic> Sender<N> {
    /// A sender on `nic` with its queue pair (not yet connected) and reply buffers.
    pub fn new(nic: &N, variant: Variant, flow: FlowConfig) -> Result<Self, DrpcError> {
        flow.validate().map_err(DrpcError::Config)?;
        let send_depth = WRS_PER_ENTRY_MAX * (flow.inflight_max + 1);
        let buffers = flow.replies_max() + 2;
        let send_cq = nic.create_cq(CqKind::Bounded {
            capacity: send_depth,
        })?;
        let recv_cq = nic.create_cq(CqKind::Bounded { capacity: buffers })?;
        let srq = nic.create_srq(SrqConfig::single(buffers))?;
        let qp = nic.create_qp(&send_cq, &recv_cq, Some(&srq), send_depth)?;
        let reply_buffer_bytes = layout::align_up(REPLY_HEADER_BYTES + flow.reply_bytes_max, 64);
        let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(buffers * reply_buffer_bytes));
        let reply_mr = nic.register(memory, 0, buffers * reply_buffer_bytes, Access::NONE)?;
        let posted: Vec<RecvBuffer> = (0..buffers)
            .map(|i| RecvBuffer {
                wr_id: i as u64,
                mr: reply_mr.clone(),
                offset: i * reply_buffer_bytes,
                len_bytes: reply_buffer_bytes,
            })
            .collect();
        srq.post_recv(&posted)?;
        Ok(Sender {
            variant,
            flow,
            send_cq,
            recv_cq,
            srq,
            qp,
            send_depth,
            reply_mr,
            reply_buffer_bytes,
            link: None,
            batch: Vec::new(),
            batch_seq: 0,
            inflight: 0,
            durable_through: 0,
            slowed: false,
            broken: None,
            stats: SenderStats::default(),
        })
    }

    /// This sender's queue pair, for the receiver's `accept`.
    pub fn qp_addr(&self) -> QpAddr {
        self.qp.addr()
    }

    /// Connects to the receiver's offer; the next request gets `offer.next_seq`.
    pub fn connect(&mut self, offer: &Offer) -> Result<(), DrpcError> {
        if offer.variant != self.variant {
            return Err(DrpcError::Config(format!(
                "the receiver offers {}, this sender is {}",
                offer.variant.name(),
                self.variant.name()
            )));
        }
        self.qp.connect(offer.qp)?;
        self.link = Some(Link {
            ring: offer.ring,
            geometry: offer.geometry,
            tail_abs: offer.tail_abs,
            next_seq: offer.next_seq,
            head_abs: offer.head_abs,
        });
        self.durable_through = offer.next_seq - 1;
        Ok(())
    }

    /// The seq the next accepted request gets.
    pub fn next_seq(&self) -> Option<u64> {
        self.link.as_ref().map(|l| l.next_seq)
    }

    fn window(&self) -> usize {
        if self.slowed {
            self.flow.inflight_slowed_max
        } else {
            self.flow.inflight_max
        }
    }

    /// Accepts a request and returns its seq. It is posted when the batch is full (at
    /// once without batching), when the window is reached, or at [`Sender::flush`].
    /// `WouldBlock`: the window or the ring is full — poll, then retry.
    pub fn call(&mut self, op: u16, payload: &[u8]) -> Result<u64, DrpcError> {
        if let Some(status) = self.broken {
            return Err(DrpcError::Connection(status));
        }
        let Some(link) = &self.link else {
            return Err(DrpcError::NotConnected);
        };
        let max = link.geometry.payload_bytes_max();
        if payload.len() > max {
            return Err(DrpcError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        let chunk = link.geometry.chunk_bytes;
        if self.inflight >= self.window() {
            return Err(DrpcError::WouldBlock);
        }
        let body: usize = self
            .batch
            .iter()
            .map(|(_, p)| request_bytes(p.len()))
            .sum::<usize>()
            + request_bytes(payload.len());
        if !self.batch.is_empty() && entry_bytes(body) > chunk {
            // The batch is as large as an entry gets: it goes first.
            self.flush()?;
        }
        let link = self.link.as_mut().expect("connected");
        let seq = link.next_seq;
        link.next_seq += 1;
        if self.batch.is_empty() {
            self.batch_seq = seq;
        }
        self.batch.push((op, payload.to_vec()));
        self.inflight += 1;
        if self.batch.len() >= self.flow.batch_max || self.inflight >= self.window() {
            match self.flush() {
                Ok(()) | Err(DrpcError::WouldBlock) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(seq)
    }

    /// Posts the batch being filled, if any, as one entry with one flush.
    /// `WouldBlock`: the ring has no room yet (the batch stays; poll, then retry).
    pub fn flush(&mut self) -> Result<(), DrpcError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        if let Some(status) = self.broken {
            return Err(DrpcError::Connection(status));
        }
        let link = self.link.as_ref().ok_or(DrpcError::NotConnected)?;
        let g = link.geometry;
        let reqs: Vec<(u16, &[u8])> = self.batch.iter().map(|(o, p)| (*o, &p[..])).collect();
        let entry = encode_entry(self.batch_seq, &reqs);
        let abs = g.place(link.tail_abs, entry.len());
        if abs + entry.len() as u64 > g.chunk_start(link.head_abs) + g.ring_bytes as u64 {
            return Err(DrpcError::WouldBlock);
        }
        if self.qp.outstanding() + WRS_PER_ENTRY_MAX > self.send_depth {
            return Err(DrpcError::WouldBlock);
        }
        let last = self.batch_seq + reqs.len() as u64 - 1;
        let pos = g.ring_pos(abs) as u64;
        let at = |o: u64| link.ring.at(pos + o);
        let send = Op::Send {
            data: &entry,
            imm: None,
        };
        let wrs: Vec<WorkRequest<'_>> = match self.variant {
            // SFlush: the NIC lands the SEND in the posted chunk and flushes it there;
            // the completion is the durable acknowledgement.
            Variant::SFlush => vec![WorkRequest::new(last, send).persisted_by_sender_flush()],
            Variant::SRFlush => vec![WorkRequest::new(last, send)],
            Variant::WRFlush => vec![WorkRequest::new(
                last,
                Op::Write {
                    data: &entry,
                    remote: at(0),
                    imm: None,
                },
            )],
            // WFlush: body, FLUSH of the body, then the seq word by ATOMIC WRITE,
            // persisted — data before operator, in one round trip of pipelined verbs.
            Variant::WFlush => {
                let hdr = SEQ_WORD_BYTES;
                vec![
                    WorkRequest::new(
                        last,
                        Op::Write {
                            data: &entry[hdr..],
                            remote: at(hdr as u64),
                            imm: None,
                        },
                    )
                    .unsignaled(),
                    WorkRequest::new(
                        last,
                        Op::Flush {
                            remote: at(hdr as u64),
                            len: entry.len() - hdr,
                            placement: Placement::Persistence,
                        },
                    )
                    .unsignaled(),
                    WorkRequest::new(
                        last,
                        Op::AtomicWrite {
                            remote: at(0),
                            value: self.batch_seq,
                        },
                    )
                    .persisted(),
                ]
            }
        };
        self.qp.post_send(&wrs)?;
        self.stats.entries_posted += 1;
        self.stats.requests_sent += reqs.len() as u64;
        self.stats.work_requests_posted += wrs.len() as u64;
        self.stats.bytes_posted += entry.len() as u64;
        let link = self.link.as_mut().expect("connected");
        link.tail_abs = abs + entry.len() as u64;
        self.batch.clear();
        Ok(())
    }

    /// Takes completions and replies; appends what they report to `events` and
    /// returns how many were appended. Then posts a waiting batch if there is room.
    pub fn poll(&mut self, events: &mut Vec<Event>) -> Result<usize, DrpcError> {
        if let Some(status) = self.broken {
            return Err(DrpcError::Connection(status));
        }
        let before = events.len();
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        loop {
            let k = self.send_cq.poll(&mut wcs)?;
            for wc in &wcs[..k] {
                if wc.status != WcStatus::Success {
                    self.broken = Some(wc.status);
                    return Err(DrpcError::Connection(wc.status));
                }
                // SFlush and WFlush: the completion of the persisted SEND or ATOMIC
                // WRITE means the entry ending at wr_id is durable.
                let flushed = matches!(wc.opcode, WcOpcode::Send | WcOpcode::AtomicWrite)
                    && !self.variant.receiver_initiated();
                if flushed {
                    self.advance_durable(wc.wr_id, events);
                }
            }
            if k < wcs.len() {
                break;
            }
        }
        loop {
            let k = self.recv_cq.poll(&mut wcs)?;
            for wc in &wcs[..k] {
                if wc.status != WcStatus::Success {
                    self.broken = Some(wc.status);
                    return Err(DrpcError::Connection(wc.status));
                }
                let at = wc.wr_id as usize * self.reply_buffer_bytes;
                let len = (wc.byte_len as usize).min(self.reply_buffer_bytes);
                let mut msg = vec![0u8; len];
                self.reply_mr.read(at + wc.offset as usize, &mut msg);
                self.srq.post_recv(&[RecvBuffer {
                    wr_id: wc.wr_id,
                    mr: self.reply_mr.clone(),
                    offset: at,
                    len_bytes: self.reply_buffer_bytes,
                }])?;
                let reply = decode_reply(&msg).map_err(DrpcError::BadReply)?;
                if reply.slow_down && !self.slowed {
                    self.stats.slow_down_signals += 1;
                }
                self.slowed = reply.slow_down;
                let link = self.link.as_mut().ok_or(DrpcError::NotConnected)?;
                link.head_abs = link.head_abs.max(reply.head_abs);
                match reply.kind {
                    ReplyKind::Durable => self.advance_durable(reply.seq, events),
                    ReplyKind::Completed => {
                        // The receiver executes only durable requests.
                        self.advance_durable(reply.seq, events);
                        self.inflight = self
                            .inflight
                            .checked_sub(1)
                            .ok_or(DrpcError::BadReply("completion of a request not in flight"))?;
                        events.push(Event::Completed {
                            seq: reply.seq,
                            reply: reply.bytes,
                        });
                    }
                }
            }
            if k < wcs.len() {
                break;
            }
        }
        match self.flush() {
            Ok(()) | Err(DrpcError::WouldBlock) => {}
            Err(e) => return Err(e),
        }
        Ok(events.len() - before)
    }

    fn advance_durable(&mut self, through: u64, events: &mut Vec<Event>) {
        while self.durable_through < through {
            self.durable_through += 1;
            events.push(Event::Durable {
                seq: self.durable_through,
            });
        }
    }

    /// Requests accepted and not yet completed.
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// The receiver's last reply asked to slow down.
    pub fn is_slowed(&self) -> bool {
        self.slowed
    }

    /// Every request up to this seq is durable at the receiver.
    pub fn durable_through(&self) -> u64 {
        self.durable_through
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Tears the connection down for good (its queue pair destroyed): the
    /// receiver's replies fail from now on, and nothing more is posted.
    pub fn close(&self) {
        self.qp.close();
    }

    pub fn stats(&self) -> SenderStats {
        self.stats
    }
}
