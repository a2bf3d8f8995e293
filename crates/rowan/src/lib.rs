//! Rowan: one sequential persistent-memory log fed by many remote senders, landed by
//! the receiver's NIC without the receiver's CPU (seed 000 §3).
//!
//! This crate owns the two halves of the abstraction:
//! - [`RowanReceiver`], the receiver's control path: it posts PM buffers (segments of
//!   the backup log) into a multi-packet shared receive queue in increasing address
//!   order and in batches, gives every sender a queue pair on that SRQ whose receive
//!   completions go to a ring CQ nobody has to poll, and finds consumed buffers by
//!   their first 64 bits (seed 000 §4.3). It is a state machine driven by `tick`, so
//!   a thread, a cooperative runtime or the simulator can run it.
//! - [`RowanSender`], the sender's "write this entry; complete when it is durable at
//!   the receiver": a SEND with the persistence option, padded to the 64 B stride.
//!
//! It depends on the fabric interface only (never on a backend, never on pmem): the
//! buffers it posts are windows of a registered region whatever memory backs it.
//!
//! Invariants:
//! - buffers are handed to the NIC in the order `post` receives them, each batch
//!   sorted by address, and each buffer's first 8 bytes are zeroed and persisted
//!   before it is posted, so a non-zero first word proves the NIC has started it;
//! - a buffer is reported *used* only once a later buffer has been started and a
//!   grace period (for DMA still in flight into it) has passed;
//! - every write is a multiple of the 64 B stride long, so writes from different
//!   senders pack into the same 256 B media lines.
//!
//! Writes larger than the MTU: on real RNICs a SEND of several packets may land its
//! packets non-contiguously (seed 000 §3.2). The sender API therefore refuses writes
//! larger than `mtu_bytes`; a caller with a larger entry splits it into MTU blocks
//! that each carry enough metadata to be checked alone (the engine's block format)
//! and sends them with [`RowanSender::write_blocks`]. The blocks of one call land in
//! order, but blocks of other senders may land between them.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use rowankv_types::NodeId;

use rowankv_fabric::{
    CompletionQueue, CqKind, FabricError, MemoryRegion, Nic, Op, QpAddr, QueuePair, RecvBuffer,
    SharedReceiveQueue, SrqConfig, WorkRequest,
};

/// The stride every Rowan write is padded to.
pub const STRIDE_BYTES: usize = SrqConfig::ROWAN_STRIDE_BYTES;

/// Receiver configuration. Names and defaults after seed 000 §4.3, scaled.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// Size of one receive buffer (one b-log segment).
    pub buffer_bytes: usize,
    /// Bound on buffers posted and not yet reported used (the paper posts 512).
    pub posted_max: usize,
    /// Time a consumed buffer waits for in-flight DMA before it is reported used
    /// (the paper's 2 ms; senders retry writes that take longer than half of it).
    pub grace_ns: u64,
    /// Entries of the ring CQ the NIC overwrites.
    pub ring_cq_entries: usize,
    /// Bound on the send queue of each receiver-side queue pair (they never send).
    pub qp_send_depth: usize,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            buffer_bytes: 4 << 20,
            posted_max: 512,
            grace_ns: 2_000_000,
            ring_cq_entries: 4096,
            qp_send_depth: 16,
        }
    }
}

/// Errors of the Rowan layer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RowanError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("write of {len_bytes} B exceeds the MTU of {mtu_bytes} B; split it into blocks")]
    TooLarge { len_bytes: usize, mtu_bytes: usize },
    #[error("buffer at offset {offset} of {len_bytes} B is not a stride-aligned window of the log region")]
    BadBuffer { offset: usize, len_bytes: usize },
    #[error("{posted} buffers posted; posting {more} more exceeds the bound of {posted_max}")]
    TooManyPosted {
        posted: usize,
        more: usize,
        posted_max: usize,
    },
    #[error("empty write")]
    Empty,
}

struct Posted {
    offset: usize,
    /// When the NIC was first seen to have moved past this buffer.
    consumed_seen_ns: Option<u64>,
}

/// The receiver side of one Rowan instance.
pub struct RowanReceiver<N: Nic> {
    nic: N,
    log: MemoryRegion,
    config: ReceiverConfig,
    srq: N::Srq,
    ring_cq: N::Cq,
    /// Accepted queue pairs, with the key their sender gave (see
    /// [`Self::accept_as`]).
    qps: Vec<(Option<u16>, N::Qp)>,
    posted: VecDeque<Posted>,
    next_wr_id: u64,
}

impl<N: Nic> RowanReceiver<N> {
    /// A receiver landing writes into windows of `log` (a registered PM region).
    pub fn new(nic: N, log: MemoryRegion, config: ReceiverConfig) -> Result<Self, RowanError> {
        assert!(config.buffer_bytes.is_multiple_of(STRIDE_BYTES) && config.buffer_bytes > 0);
        assert!(config.posted_max > 0);
        let srq = nic.create_srq(SrqConfig::multi_packet(config.posted_max))?;
        let ring_cq = nic.create_cq(CqKind::Ring {
            capacity: config.ring_cq_entries,
        })?;
        Ok(RowanReceiver {
            nic,
            log,
            config,
            srq,
            ring_cq,
            qps: Vec::new(),
            posted: VecDeque::new(),
            next_wr_id: 0,
        })
    }

    pub fn config(&self) -> &ReceiverConfig {
        &self.config
    }

    /// The region the log lives in.
    pub fn log(&self) -> &MemoryRegion {
        &self.log
    }

    /// Accept a sender: create a queue pair on the shared SRQ and the ring CQ,
    /// connected to `sender`. Returns the address the sender connects to.
    pub fn accept(&mut self, sender: QpAddr) -> Result<QpAddr, RowanError> {
        self.accept_keyed(sender, None)
    }

    /// As [`Self::accept`], for the sender known on its node as `key` (a
    /// worker): a queue pair accepted earlier for the same node and key — a
    /// connection the sender gave up and dialled again, or one of a sender
    /// that restarted — is closed first, so a sender holds one at a time.
    pub fn accept_as(&mut self, sender: QpAddr, key: u16) -> Result<QpAddr, RowanError> {
        self.accept_keyed(sender, Some(key))
    }

    fn accept_keyed(&mut self, sender: QpAddr, key: Option<u16>) -> Result<QpAddr, RowanError> {
        if key.is_some() {
            self.qps.retain(|(k, qp)| {
                let same = *k == key && qp.peer().is_some_and(|p| p.node == sender.node);
                if same {
                    qp.close();
                }
                !same
            });
        }
        let qp = self.nic.create_qp(
            &self.ring_cq,
            &self.ring_cq,
            Some(&self.srq),
            self.config.qp_send_depth,
        )?;
        qp.connect(sender)?;
        let addr = qp.addr();
        self.qps.push((key, qp));
        Ok(addr)
    }

    /// Destroy the queue pairs of every sender on `node` (a server removed from
    /// the configuration): from now on its writes fail at its NIC and never land
    /// here. Returns how many were closed.
    pub fn disconnect(&mut self, node: NodeId) -> usize {
        let before = self.qps.len();
        self.qps.retain(|(_, qp)| {
            let from_node = qp.peer().is_some_and(|p| p.node == node);
            if from_node {
                qp.close();
            }
            !from_node
        });
        before - self.qps.len()
    }

    /// Post buffers (offsets of `buffer_bytes` windows of the log region) in one
    /// batch, in increasing address order. Each buffer's first word is zeroed and
    /// persisted first so that consumption can be detected.
    pub fn post(&mut self, offsets: &[usize]) -> Result<(), RowanError> {
        if self.posted.len() + offsets.len() > self.config.posted_max {
            return Err(RowanError::TooManyPosted {
                posted: self.posted.len(),
                more: offsets.len(),
                posted_max: self.config.posted_max,
            });
        }
        let mut sorted = offsets.to_vec();
        sorted.sort_unstable();
        let size = self.config.buffer_bytes;
        // Check the whole batch before touching any buffer, so that a refused batch
        // changes nothing (not even the first word of its good buffers).
        if let Some(&offset) = sorted
            .iter()
            .find(|&&o| !o.is_multiple_of(STRIDE_BYTES) || !self.log.contains(o as u64, size))
        {
            return Err(RowanError::BadBuffer {
                offset,
                len_bytes: size,
            });
        }
        let mut batch = Vec::with_capacity(sorted.len());
        for &offset in &sorted {
            self.log.write(offset, &[0u8; 8]);
            self.log.persist(offset, 8);
            batch.push(RecvBuffer {
                wr_id: self.next_wr_id,
                mr: self.log.clone(),
                offset,
                len_bytes: size,
            });
            self.next_wr_id += 1;
        }
        self.srq.post_recv(&batch)?;
        self.posted.extend(sorted.into_iter().map(|offset| Posted {
            offset,
            consumed_seen_ns: None,
        }));
        Ok(())
    }

    /// One step of the control loop at time `now_ns`: find buffers the NIC has moved
    /// past and return, in order, those whose grace period has passed (now *used*).
    /// Never polls the ring CQ.
    pub fn tick(&mut self, now_ns: u64) -> Vec<usize> {
        // The newest started buffer: every buffer before it is consumed.
        let started = self
            .posted
            .iter()
            .rposition(|p| self.log.read_u64(p.offset) != 0);
        if let Some(k) = started {
            for p in self.posted.iter_mut().take(k) {
                p.consumed_seen_ns.get_or_insert(now_ns);
            }
        }
        let mut used = Vec::new();
        while let Some(p) = self.posted.front() {
            match p.consumed_seen_ns {
                Some(seen) if now_ns.saturating_sub(seen) >= self.config.grace_ns => {
                    used.push(p.offset);
                    self.posted.pop_front();
                }
                _ => break,
            }
        }
        used
    }

    /// Buffers posted and not yet reported used, oldest first (the one the NIC is
    /// filling, and those after it, are *using*).
    pub fn posted(&self) -> impl Iterator<Item = usize> + '_ {
        self.posted.iter().map(|p| p.offset)
    }

    pub fn posted_count(&self) -> usize {
        self.posted.len()
    }

    /// Receive completions overwritten in the ring (diagnostics only).
    pub fn ring_overwritten(&self) -> u64 {
        self.ring_cq.overwritten()
    }
}

/// Round `len` up to the stride.
pub fn padded_len(len: usize) -> usize {
    len.div_ceil(STRIDE_BYTES) * STRIDE_BYTES
}

/// The sender side: a queue pair connected to a receiver's Rowan queue pair.
pub struct RowanSender<Q: QueuePair> {
    qp: Q,
    mtu_bytes: usize,
    scratch: Vec<u8>,
}

impl<Q: QueuePair> RowanSender<Q> {
    /// `qp` must be connected to the address `RowanReceiver::accept` returned.
    pub fn new(qp: Q, mtu_bytes: usize) -> Self {
        assert!(mtu_bytes >= STRIDE_BYTES && mtu_bytes.is_multiple_of(STRIDE_BYTES));
        RowanSender {
            qp,
            mtu_bytes,
            scratch: Vec::with_capacity(mtu_bytes),
        }
    }

    pub fn qp(&self) -> &Q {
        &self.qp
    }

    pub fn mtu_bytes(&self) -> usize {
        self.mtu_bytes
    }

    /// Write `entry` (at most one MTU); its completion (`wr_id`, on the queue pair's
    /// send CQ) means the padded entry is durable in the receiver's log.
    pub fn write(&mut self, wr_id: u64, entry: &[u8]) -> Result<(), RowanError> {
        self.check_block(entry)?;
        let data: &[u8] = if entry.len().is_multiple_of(STRIDE_BYTES) {
            entry
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(entry);
            self.scratch.resize(padded_len(entry.len()), 0);
            &self.scratch
        };
        let wr = WorkRequest::new(wr_id, Op::Send { data, imm: None }).persisted();
        self.qp.post_send(&[wr])?;
        Ok(())
    }

    fn check_block(&self, block: &[u8]) -> Result<(), RowanError> {
        if block.is_empty() {
            return Err(RowanError::Empty);
        }
        if block.len() > self.mtu_bytes {
            return Err(RowanError::TooLarge {
                len_bytes: block.len(),
                mtu_bytes: self.mtu_bytes,
            });
        }
        Ok(())
    }

    /// Write several blocks, each at most one MTU, each landed separately (possibly
    /// apart from the others). Only the last is signaled: by per-queue-pair ordering
    /// its completion means all of them are durable.
    pub fn write_blocks(&mut self, wr_id: u64, blocks: &[&[u8]]) -> Result<(), RowanError> {
        if blocks.is_empty() {
            return Err(RowanError::Empty);
        }
        let mut padded: Vec<Vec<u8>> = Vec::with_capacity(blocks.len());
        for b in blocks {
            self.check_block(b)?;
            if b.len().is_multiple_of(STRIDE_BYTES) {
                padded.push(Vec::new());
            } else {
                let mut p = b.to_vec();
                p.resize(padded_len(b.len()), 0);
                padded.push(p);
            }
        }
        let last = blocks.len() - 1;
        let wrs: Vec<WorkRequest<'_>> = blocks
            .iter()
            .zip(&padded)
            .enumerate()
            .map(|(i, (b, p))| {
                let data: &[u8] = if p.is_empty() { b } else { p };
                let wr = WorkRequest::new(wr_id, Op::Send { data, imm: None }).persisted();
                if i == last {
                    wr
                } else {
                    wr.unsignaled()
                }
            })
            .collect();
        self.qp.post_send(&wrs)?;
        Ok(())
    }
}
