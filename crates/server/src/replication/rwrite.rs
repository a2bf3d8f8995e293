//! `rwrite` and `batch`: each worker owns a remote log on every other server and
//! appends entries to it with persisted one-sided WRITEs (FaRM's replication, the
//! RWrite-KV and Batch-KV of seed 000 §6.1).
//!
//! A remote log is a chain of segments the backup grants on request
//! (`GrantSegment`). The sender holds the segment it fills and one standby; when an
//! entry does not fit in what is left, it seals the segment (the request for the
//! next standby names it) and moves to the standby. Entries never straddle
//! segments; the tail left is zeros, which ends the segment's log for digest. The
//! backup digests a sealed segment after a grace period for WRITEs still in flight.
//!
//! `batch` adds sender-side batching per backup: entries wait until 256 B are
//! pending or 5 µs have passed since the first, then go in one WRITE.

use std::collections::{HashMap, VecDeque};

use rowankv_fabric::{Completion, Nic, Op, QueuePair, RemoteRegion, WcStatus, WorkRequest};
use rowankv_types::NodeId;
use rowankv_wire::endpoint::{wr_id, PeerId, SendError, WR_TAG_SHIFT};
use rowankv_wire::frame::{Body, Envelope, Response};

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

/// A granted segment as the sender sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Granted {
    pub segment: u32,
    /// Offset of the segment in the backup's registered data area.
    pub offset: u64,
    pub len_bytes: u64,
}

/// How to reach a backup: a queue pair for WRITEs (on the worker's completion
/// queue), the backup's registered data area, and an RPC peer for grants.
pub(crate) struct RemoteLogTarget<Q> {
    pub qp: Q,
    pub region: RemoteRegion,
    pub peer: PeerId,
}

struct RemoteLog<Q> {
    target: RemoteLogTarget<Q>,
    current: Option<Granted>,
    cursor: u64,
    standby: Option<Granted>,
    /// Grant requests sent and not answered.
    requested: usize,
    /// A seal to send with the next grant request (when the first try was busy).
    seal_pending: Option<u32>,
    /// Entries waiting for a segment: (bytes, tokens).
    waiting: VecDeque<(Vec<u8>, Vec<u64>)>,
    /// `batch`: bytes and tokens not yet written, and when the first arrived.
    batch: Vec<u8>,
    batch_tokens: Vec<u64>,
    batch_since_ns: u64,
}

pub(crate) struct RwriteReplicator<N: Nic> {
    /// This worker's log id at every backup.
    log_id: u32,
    logs: HashMap<NodeId, RemoteLog<N::Qp>>,
    batch: Option<BatchConfig>,
    next_wr: u64,
    /// WRITE sequence → (backup, tokens).
    inflight: HashMap<u64, Vec<u64>>,
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
        RwriteReplicator {
            log_id,
            logs: targets
                .into_iter()
                .map(|(node, target)| {
                    (
                        node,
                        RemoteLog {
                            target,
                            current: None,
                            cursor: 0,
                            standby: None,
                            requested: 0,
                            seal_pending: None,
                            waiting: VecDeque::new(),
                            batch: Vec::new(),
                            batch_tokens: Vec::new(),
                            batch_since_ns: 0,
                        },
                    )
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

    /// Ask `backup` for segments until it has (or will have) a current one and a
    /// standby; a pending seal rides on the first request.
    fn request_grants(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        let log_id = self.log_id;
        let Some(log) = self.logs.get_mut(&backup) else {
            return;
        };
        let have = log.current.is_some() as usize + log.standby.is_some() as usize;
        let mut want = 2usize.saturating_sub(have + log.requested);
        if log.seal_pending.is_some() && want == 0 && log.requested == 0 {
            want = 1;
        }
        for _ in 0..want {
            let request_id = self.next_request;
            let env = Envelope {
                request_id,
                ..cx.env
            };
            let body = Body::GrantSegment {
                log: log_id,
                sealed: log.seal_pending,
            };
            match cx.ep.request(log.target.peer, &env, &body) {
                Ok(()) => {
                    self.next_request += 1;
                    log.requested += 1;
                    log.seal_pending = None;
                    self.grant_requests.insert(request_id, backup);
                }
                Err(SendError::Busy(..)) => break,
                Err(e) => {
                    tracing::warn!(%backup, error = %e, "segment request failed");
                    break;
                }
            }
        }
    }

    /// Write `bytes` (whole entries) for `tokens`, or queue them until a segment
    /// is there. Returns whether it was written.
    fn write_or_wait(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        bytes: Vec<u8>,
        tokens: Vec<u64>,
    ) {
        let Some(log) = self.logs.get_mut(&backup) else {
            for t in tokens {
                self.failed.push((t, format!("no remote log at {backup}")));
            }
            return;
        };
        if !log.waiting.is_empty() {
            log.waiting.push_back((bytes, tokens));
            return;
        }
        match Self::try_write(log, &mut self.next_wr, &mut self.inflight, &bytes, &tokens) {
            Ok(true) => {}
            Ok(false) => {
                log.waiting.push_back((bytes, tokens));
                self.request_grants(cx, backup);
            }
            Err(why) => {
                for t in tokens {
                    self.failed.push((t, why.clone()));
                }
            }
        }
    }

    /// Post one WRITE if the current segment (or the standby, after sealing the
    /// current one) has room. `Ok(false)`: no segment yet.
    fn try_write(
        log: &mut RemoteLog<N::Qp>,
        next_wr: &mut u64,
        inflight: &mut HashMap<u64, Vec<u64>>,
        bytes: &[u8],
        tokens: &[u64],
    ) -> Result<bool, String> {
        let len = bytes.len() as u64;
        loop {
            let Some(cur) = log.current else {
                match log.standby.take() {
                    Some(s) => {
                        log.current = Some(s);
                        log.cursor = 0;
                        continue;
                    }
                    None => return Ok(false),
                }
            };
            if len > cur.len_bytes {
                return Err(format!("{len} B entry larger than a segment"));
            }
            if log.cursor + len > cur.len_bytes {
                // Seal: the next grant request carries it.
                log.seal_pending = Some(cur.segment);
                log.current = None;
                continue;
            }
            let seq = *next_wr;
            *next_wr += 1;
            let remote = log.target.region.at(cur.offset + log.cursor);
            let wr = WorkRequest::new(
                wr_id(WR_TAG_REPL, seq),
                Op::Write {
                    data: bytes,
                    remote,
                    imm: None,
                },
            )
            .persisted();
            log.target
                .qp
                .post_send(&[wr])
                .map_err(|e| format!("posting a WRITE: {e}"))?;
            log.cursor += len;
            inflight.insert(seq, tokens.to_vec());
            return Ok(true);
        }
    }

    fn flush_batch(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        let Some(log) = self.logs.get_mut(&backup) else {
            return;
        };
        if log.batch.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut log.batch);
        let tokens = std::mem::take(&mut log.batch_tokens);
        self.write_or_wait(cx, backup, bytes, tokens);
    }
}

impl<N: Nic> Replicator<N> for RwriteReplicator<N> {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        match self.batch {
            None => self.write_or_wait(cx, backup, entry.to_vec(), vec![token]),
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
            out.acked.extend(tokens);
        } else {
            for t in tokens {
                out.failed
                    .push((t, format!("remote-log WRITE: {:?}", c.status)));
            }
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
        // A grant counts only from the connection its request went on.
        let Some(&backup) = self.grant_requests.get(&request_id) else {
            return;
        };
        let Some(log) = self.logs.get_mut(&backup) else {
            return;
        };
        if log.target.peer != peer {
            tracing::warn!(
                ?peer,
                request_id,
                "a grant from another connection, ignored"
            );
            return;
        }
        self.grant_requests.remove(&request_id);
        log.requested = log.requested.saturating_sub(1);
        match *response {
            Response::Segment {
                segment,
                offset,
                len_bytes,
            } => {
                let g = Granted {
                    segment,
                    offset,
                    len_bytes,
                };
                if log.current.is_none() {
                    log.current = Some(g);
                    log.cursor = 0;
                } else if log.standby.is_none() {
                    log.standby = Some(g);
                } else {
                    tracing::warn!(%backup, segment, "a segment granted beyond need");
                }
            }
            ref other => {
                tracing::warn!(%backup, response = ?other, "segment request refused");
            }
        }
        // Entries waiting for space go now, in order.
        while let Some((bytes, tokens)) = log.waiting.pop_front() {
            match Self::try_write(log, &mut self.next_wr, &mut self.inflight, &bytes, &tokens) {
                Ok(true) => {}
                Ok(false) => {
                    log.waiting.push_front((bytes, tokens));
                    break;
                }
                Err(why) => {
                    for t in tokens {
                        out.failed.push((t, why.clone()));
                    }
                }
            }
        }
        self.request_grants(cx, backup);
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.failed.is_empty();
        out.failed.append(&mut self.failed);
        let backups: Vec<NodeId> = self.logs.keys().copied().collect();
        for backup in backups {
            if let Some(b) = self.batch {
                let due = self.logs.get(&backup).is_some_and(|l| {
                    !l.batch.is_empty() && cx.now_ns >= l.batch_since_ns + b.timeout_ns
                });
                if due {
                    self.flush_batch(cx, backup);
                    did = true;
                }
            }
            let needs = self.logs.get(&backup).is_some_and(|l| {
                (l.current.is_none() || l.standby.is_none() || l.seal_pending.is_some())
                    && l.requested == 0
            });
            if needs {
                self.request_grants(cx, backup);
            }
        }
        did
    }
}
