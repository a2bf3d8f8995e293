//! `rwrite` and `batch`: each worker owns a remote log on every other server and
//! appends entries to it with persisted one-sided WRITEs (FaRM's replication, the
//! RWrite-KV and Batch-KV of seed 000 §6.1).
//!
//! A remote log is a chain of segments the backup grants on request
//! ([`super::segments`]); the backup digests a sealed segment after a grace period
//! for WRITEs still in flight.
//!
//! `batch` adds sender-side batching per backup: entries wait until 256 B are
//! pending or 5 µs have passed since the first, then go in one WRITE.

use std::collections::{HashMap, VecDeque};

use rowankv_fabric::{Completion, Nic, Op, QueuePair, RemoteRegion, WcStatus, WorkRequest};
use rowankv_types::NodeId;
use rowankv_wire::endpoint::{wr_id, PeerId, WR_TAG_SHIFT};
use rowankv_wire::frame::Response;

use super::segments::{grant_for, Reserve, SegmentChain};
use super::{Outcomes, ReplCtx, Replicator, WR_TAG_REPL};

/// Sender-side batching (`batch`).
#[derive(Clone, Copy, Debug)]
pub struct BatchConfig {
    pub bytes: usize,
    pub timeout_ns: u64,
}

impl Default for BatchConfig {
    /// The paper's: flush at one XPLine (256 B) or after 5 µs.
    fn default() -> Self {
        BatchConfig {
            bytes: 256,
            timeout_ns: 5_000,
        }
    }
}

/// How to reach a backup: a queue pair for WRITEs (on the worker's completion
/// queue), the backup's registered data area, and an RPC peer for grants.
pub(crate) struct RemoteLogTarget<Q> {
    pub qp: Q,
    pub region: RemoteRegion,
    pub peer: PeerId,
}

/// The tokens one WRITE acknowledges: one entry, or a batch.
enum Tokens {
    One(u64),
    Many(Vec<u64>),
}

impl Tokens {
    fn for_each(self, mut f: impl FnMut(u64)) {
        match self {
            Tokens::One(t) => f(t),
            Tokens::Many(ts) => ts.into_iter().for_each(f),
        }
    }
}

struct RemoteLog<Q> {
    target: RemoteLogTarget<Q>,
    chain: SegmentChain,
    /// Entries waiting for a segment, in order.
    waiting: VecDeque<(Vec<u8>, Tokens)>,
    /// `batch`: bytes and tokens not yet written, and when the first arrived.
    batch: Vec<u8>,
    batch_tokens: Vec<u64>,
    batch_since_ns: u64,
}

pub(crate) struct RwriteReplicator<N: Nic> {
    /// This worker's log id at every backup.
    log_id: u32,
    backups: Vec<NodeId>,
    logs: HashMap<NodeId, RemoteLog<N::Qp>>,
    batch: Option<BatchConfig>,
    next_wr: u64,
    /// WRITE sequence → the tokens it acknowledges.
    inflight: HashMap<u64, Tokens>,
    next_request: u64,
    /// Grant request id → backup.
    grant_requests: HashMap<u64, NodeId>,
    failed: Vec<(u64, String)>,
}

impl<N: Nic> RwriteReplicator<N> {
    pub fn new(
        log_id: u32,
        targets: HashMap<NodeId, RemoteLogTarget<N::Qp>>,
        batch: Option<BatchConfig>,
    ) -> Self {
        let mut backups: Vec<NodeId> = targets.keys().copied().collect();
        backups.sort_unstable();
        RwriteReplicator {
            log_id,
            backups,
            logs: targets
                .into_iter()
                .map(|(node, target)| {
                    let log = RemoteLog {
                        target,
                        chain: SegmentChain::default(),
                        waiting: VecDeque::new(),
                        batch: Vec::new(),
                        batch_tokens: Vec::new(),
                        batch_since_ns: 0,
                    };
                    (node, log)
                })
                .collect(),
            batch,
            next_wr: 1,
            inflight: HashMap::new(),
            next_request: 1,
            grant_requests: HashMap::new(),
            failed: Vec::new(),
        }
    }

    fn request_grants(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        if let Some(log) = self.logs.get_mut(&backup) {
            let peer = log.target.peer;
            log.chain.request_grants(
                cx,
                peer,
                self.log_id,
                backup,
                &mut self.next_request,
                &mut self.grant_requests,
            );
        }
    }

    /// Write `bytes` (whole entries) for `tokens`, or queue them until a segment
    /// is there.
    fn write_or_wait(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        bytes: &[u8],
        tokens: Tokens,
    ) {
        let Some(log) = self.logs.get_mut(&backup) else {
            tokens.for_each(|t| self.failed.push((t, format!("no remote log at {backup}"))));
            return;
        };
        if !log.waiting.is_empty() {
            log.waiting.push_back((bytes.to_vec(), tokens));
            return;
        }
        match Self::try_write(log, &mut self.next_wr, &mut self.inflight, bytes, tokens) {
            Ok(None) => {}
            Ok(Some(tokens)) => {
                log.waiting.push_back((bytes.to_vec(), tokens));
                self.request_grants(cx, backup);
            }
            Err((why, tokens)) => tokens.for_each(|t| self.failed.push((t, why.clone()))),
        }
    }

    /// Post one WRITE if the chain has room. `Ok(Some(tokens))`: no segment yet,
    /// the tokens handed back.
    #[allow(clippy::type_complexity)]
    fn try_write(
        log: &mut RemoteLog<N::Qp>,
        next_wr: &mut u64,
        inflight: &mut HashMap<u64, Tokens>,
        bytes: &[u8],
        tokens: Tokens,
    ) -> Result<Option<Tokens>, (String, Tokens)> {
        let at = match log.chain.reserve(bytes.len() as u64) {
            Ok(Reserve::At(at)) => at,
            Ok(Reserve::NoSpace) => return Ok(Some(tokens)),
            Err(why) => return Err((why, tokens)),
        };
        let seq = *next_wr;
        *next_wr += 1;
        let wr = WorkRequest::new(
            wr_id(WR_TAG_REPL, seq),
            Op::Write {
                data: bytes,
                remote: log.target.region.at(at),
                imm: None,
            },
        )
        .persisted();
        if let Err(e) = log.target.qp.post_send(&[wr]) {
            return Err((format!("posting a WRITE: {e}"), tokens));
        }
        inflight.insert(seq, tokens);
        Ok(None)
    }

    fn flush_batch(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        let Some(log) = self.logs.get_mut(&backup) else {
            return;
        };
        if log.batch.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut log.batch);
        let tokens = Tokens::Many(std::mem::take(&mut log.batch_tokens));
        self.write_or_wait(cx, backup, &bytes, tokens);
        // Keep the buffer's capacity for the next batch.
        if let Some(log) = self.logs.get_mut(&backup) {
            if log.batch.is_empty() {
                log.batch = bytes;
                log.batch.clear();
            }
        }
    }
}

impl<N: Nic> Replicator<N> for RwriteReplicator<N> {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        match self.batch {
            None => self.write_or_wait(cx, backup, entry, Tokens::One(token)),
            Some(b) => {
                let Some(log) = self.logs.get_mut(&backup) else {
                    self.failed
                        .push((token, format!("no remote log at {backup}")));
                    return;
                };
                if log.batch.is_empty() {
                    log.batch_since_ns = cx.now_ns;
                }
                log.batch.extend_from_slice(entry);
                log.batch_tokens.push(token);
                if log.batch.len() >= b.bytes {
                    self.flush_batch(cx, backup);
                }
            }
        }
    }

    fn on_completion(&mut self, _cx: &mut ReplCtx<'_, N>, c: &Completion, out: &mut Outcomes) {
        let seq = c.wr_id & ((1 << WR_TAG_SHIFT) - 1);
        let Some(tokens) = self.inflight.remove(&seq) else {
            return;
        };
        if c.status == WcStatus::Success {
            tokens.for_each(|t| out.acked.push(t));
        } else {
            let why = format!("remote-log WRITE: {:?}", c.status);
            tokens.for_each(|t| out.failed.push((t, why.clone())));
        }
    }

    fn on_response(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        request_id: u64,
        response: &Response<'_>,
        out: &mut Outcomes,
    ) {
        let logs = &self.logs;
        let Some(backup) = grant_for(&mut self.grant_requests, request_id, peer, |b| {
            logs.get(&b).map(|l| l.target.peer)
        }) else {
            return;
        };
        let Some(log) = self.logs.get_mut(&backup) else {
            return;
        };
        log.chain.on_grant(backup, response);
        // Entries waiting for space go now, in order.
        while let Some((bytes, tokens)) = log.waiting.pop_front() {
            match Self::try_write(log, &mut self.next_wr, &mut self.inflight, &bytes, tokens) {
                Ok(None) => {}
                Ok(Some(tokens)) => {
                    log.waiting.push_front((bytes, tokens));
                    break;
                }
                Err((why, tokens)) => tokens.for_each(|t| out.failed.push((t, why.clone()))),
            }
        }
        self.request_grants(cx, backup);
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.failed.is_empty();
        out.failed.append(&mut self.failed);
        for i in 0..self.backups.len() {
            let backup = self.backups[i];
            if let Some(b) = self.batch {
                let due = self.logs.get(&backup).is_some_and(|l| {
                    !l.batch.is_empty() && cx.now_ns >= l.batch_since_ns + b.timeout_ns
                });
                if due {
                    self.flush_batch(cx, backup);
                    did = true;
                }
            }
            if self
                .logs
                .get(&backup)
                .is_some_and(|l| l.chain.needs_grant())
            {
                self.request_grants(cx, backup);
            }
        }
        did
    }
}
