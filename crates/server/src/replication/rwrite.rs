//! `rwrite` and `batch`: each worker owns a remote log on every other server and
//! appends entries to it with persisted one-sided WRITEs (FaRM's replication, the
//! RWrite-KV and Batch-KV of seed 000 §6.1).
//!
//! A remote log is a chain of segments the backup grants on request
//! ([`super::segments`]); the backup digests a sealed segment after a grace period
//! for WRITEs still in flight.
//!
//! Every hand-over gets exactly one outcome, within a bound: a WRITE's completion
//! (a failed one puts the queue pair in the error state; it is reset, and the
//! chain goes on past the hole the WRITE left), or, for an entry still waiting
//! for a segment when the replication timeout has passed since it was handed
//! over, or when the backup refused the grant it waited for, a failure.
//!
//! `batch` adds sender-side batching per backup: entries wait until 256 B are
//! pending or 5 µs have passed since the first, then go in one WRITE.

use std::collections::{HashMap, VecDeque};

use rowankv_fabric::{
    Completion, Nic, Op, QpState, QueuePair, RemoteRegion, WcStatus, WorkRequest,
};
use rowankv_rpc::endpoint::{wr_id, PeerId, WR_TAG_SHIFT};
use rowankv_types::NodeId;
use rowankv_wire::frame::Response;

use super::segments::{refusal_pause_ns, Answer, Reserve, SegmentChain, SentGrants};
use super::{Link, LinkKind, Outcomes, ReplCtx, Replicator, WR_TAG_REPL};

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
pub struct RemoteLogTarget<Q> {
    pub qp: Q,
    pub region: RemoteRegion,
    pub peer: PeerId,
}

impl<Q: QueuePair> RemoteLogTarget<Q> {
    /// After a failed WRITE: the queue pair is in the error state (every later
    /// WRITE on it flushed); bring it back so that the next ones are carried
    /// out. A queue pair the backup destroyed (this server was removed) comes
    /// back too, but its WRITEs keep failing there.
    pub fn recover(&self, backup: NodeId) {
        if self.qp.state() == QpState::Error {
            if let Err(e) = self.qp.reset() {
                tracing::debug!(%backup, error = %e, "resetting a WRITE queue pair");
            }
        }
    }
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

/// Bytes waiting for a segment, the tokens they carry, and when the oldest of
/// them was handed over.
struct Waiting {
    bytes: Vec<u8>,
    tokens: Tokens,
    since_ns: u64,
}

struct RemoteLog<Q> {
    target: RemoteLogTarget<Q>,
    chain: SegmentChain,
    /// Entries waiting for a segment, in order.
    waiting: VecDeque<Waiting>,
    /// `batch`: bytes and tokens not yet written, and when the first arrived.
    batch: Vec<u8>,
    batch_tokens: Vec<u64>,
    batch_since_ns: u64,
}

impl<Q> RemoteLog<Q> {
    fn new(target: RemoteLogTarget<Q>) -> Self {
        RemoteLog {
            target,
            chain: SegmentChain::default(),
            waiting: VecDeque::new(),
            batch: Vec::new(),
            batch_tokens: Vec::new(),
            batch_since_ns: 0,
        }
    }
}

/// A WRITE posted: its backup, the segment it went to, what it acknowledges.
struct InFlight {
    backup: NodeId,
    segment: u32,
    tokens: Tokens,
}

/// The `rwrite` (and `batch`) strategy's replicator of one worker: persisted
/// WRITEs to the worker's own remote log on each backup.
pub struct RwriteReplicator<N: Nic> {
    /// This worker's log id at every backup.
    log_id: u32,
    backups: Vec<NodeId>,
    logs: HashMap<NodeId, RemoteLog<N::Qp>>,
    batch: Option<BatchConfig>,
    /// How long an entry may wait for a segment, and a grant request for its
    /// answer.
    timeout_ns: u64,
    next_wr: u64,
    /// WRITE sequence → what it is.
    inflight: HashMap<u64, InFlight>,
    grants: SentGrants,
    failed: Vec<(u64, String)>,
}

impl<N: Nic> RwriteReplicator<N> {
    /// `timeout_ns`: how long an entry may wait for a segment (and a grant
    /// request for its answer) before it fails.
    pub fn new(
        log_id: u32,
        targets: HashMap<NodeId, RemoteLogTarget<N::Qp>>,
        batch: Option<BatchConfig>,
        timeout_ns: u64,
    ) -> Self {
        let mut backups: Vec<NodeId> = targets.keys().copied().collect();
        backups.sort_unstable();
        RwriteReplicator {
            log_id,
            backups,
            logs: targets
                .into_iter()
                .map(|(node, target)| (node, RemoteLog::new(target)))
                .collect(),
            batch,
            timeout_ns,
            next_wr: 1,
            inflight: HashMap::new(),
            grants: SentGrants::default(),
            failed: Vec::new(),
        }
    }

    /// Ask `backup` for a segment if its chain needs one.
    fn request_grant(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) -> bool {
        let Some(log) = self.logs.get_mut(&backup) else {
            return false;
        };
        if !log.chain.needs_grant(cx.now_ns) {
            return false;
        }
        let peer = log.target.peer;
        self.grants
            .send(&mut log.chain, cx, peer, self.log_id, backup)
    }

    /// Write `bytes` (whole entries) for `tokens`, or queue them until a segment
    /// is there.
    fn write_or_wait(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        bytes: &[u8],
        tokens: Tokens,
        since_ns: u64,
    ) {
        let Some(log) = self.logs.get_mut(&backup) else {
            tokens.for_each(|t| self.failed.push((t, format!("no remote log at {backup}"))));
            return;
        };
        if !log.waiting.is_empty() {
            log.waiting.push_back(Waiting {
                bytes: bytes.to_vec(),
                tokens,
                since_ns,
            });
            return;
        }
        match Self::try_write(
            backup,
            log,
            &mut self.next_wr,
            &mut self.inflight,
            bytes,
            tokens,
        ) {
            Ok(None) => {}
            Ok(Some(tokens)) => {
                log.waiting.push_back(Waiting {
                    bytes: bytes.to_vec(),
                    tokens,
                    since_ns,
                });
                self.request_grant(cx, backup);
            }
            Err((why, tokens)) => tokens.for_each(|t| self.failed.push((t, why.clone()))),
        }
    }

    /// Post one WRITE if the chain has room. `Ok(Some(tokens))`: no segment yet,
    /// the tokens handed back.
    #[allow(clippy::type_complexity)]
    fn try_write(
        backup: NodeId,
        log: &mut RemoteLog<N::Qp>,
        next_wr: &mut u64,
        inflight: &mut HashMap<u64, InFlight>,
        bytes: &[u8],
        tokens: Tokens,
    ) -> Result<Option<Tokens>, (String, Tokens)> {
        let (at, segment) = match log.chain.reserve(bytes.len() as u64) {
            Ok(Reserve::At { offset, segment }) => (offset, segment),
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
            // Nothing lands there: a hole the segment's digest walks past.
            log.chain.write_done(segment);
            return Err((format!("posting a WRITE: {e}"), tokens));
        }
        inflight.insert(
            seq,
            InFlight {
                backup,
                segment,
                tokens,
            },
        );
        Ok(None)
    }

    /// Post what waits for `backup`'s log, in order, while its chain has room.
    fn drain_waiting(&mut self, backup: NodeId) {
        let Some(log) = self.logs.get_mut(&backup) else {
            return;
        };
        while let Some(w) = log.waiting.pop_front() {
            let Waiting {
                bytes,
                tokens,
                since_ns,
            } = w;
            match Self::try_write(
                backup,
                log,
                &mut self.next_wr,
                &mut self.inflight,
                &bytes,
                tokens,
            ) {
                Ok(None) => {}
                Ok(Some(tokens)) => {
                    log.waiting.push_front(Waiting {
                        bytes,
                        tokens,
                        since_ns,
                    });
                    break;
                }
                Err((why, tokens)) => tokens.for_each(|t| self.failed.push((t, why.clone()))),
            }
        }
    }

    /// Fail what waits for `backup`'s log (handed over before `cutoff_ns`, or
    /// all), with `why`.
    fn fail_waiting(
        &mut self,
        backup: NodeId,
        cutoff_ns: Option<u64>,
        why: impl Fn() -> String,
    ) -> bool {
        let Some(log) = self.logs.get_mut(&backup) else {
            return false;
        };
        let mut did = false;
        while log
            .waiting
            .front()
            .is_some_and(|w| cutoff_ns.is_none_or(|c| w.since_ns <= c))
        {
            let w = log.waiting.pop_front().expect("checked");
            w.tokens.for_each(|t| self.failed.push((t, why())));
            did = true;
        }
        did
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
        let since = log.batch_since_ns;
        self.write_or_wait(cx, backup, &bytes, tokens, since);
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
            None => self.write_or_wait(cx, backup, entry, Tokens::One(token), cx.now_ns),
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
        let Some(w) = self.inflight.remove(&seq) else {
            return;
        };
        if let Some(log) = self.logs.get_mut(&w.backup) {
            log.chain.write_done(w.segment);
            if c.status != WcStatus::Success {
                log.target.recover(w.backup);
            }
        }
        if c.status == WcStatus::Success {
            w.tokens.for_each(|t| out.acked.push(t));
        } else {
            let why = format!("remote-log WRITE to {}: {:?}", w.backup, c.status);
            w.tokens.for_each(|t| out.failed.push((t, why.clone())));
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
        let Some(backup) = self
            .backups
            .iter()
            .copied()
            .find(|b| self.logs[b].target.peer == peer)
        else {
            tracing::warn!(?peer, request_id, "a response from no backup's connection");
            return;
        };
        self.grants.answered(backup, request_id);
        let pause = refusal_pause_ns(self.timeout_ns);
        let log = self.logs.get_mut(&backup).expect("found above");
        match log.chain.on_answer(request_id, response, cx.now_ns, pause) {
            Answer::Granted => self.drain_waiting(backup),
            Answer::Refused(why) => {
                tracing::debug!(%backup, why, "segment request refused");
                self.fail_waiting(backup, None, || {
                    format!("{backup} refused a segment: {why}")
                });
            }
            Answer::Late => {}
            Answer::Unknown => {
                tracing::warn!(%backup, request_id, "an answer to no segment request, ignored");
            }
        }
        self.request_grant(cx, backup);
        out.failed.append(&mut self.failed);
    }

    fn on_send_failed(&mut self, cx: &mut ReplCtx<'_, N>, peer: PeerId, _out: &mut Outcomes) {
        // Not asked again before the pause: the link may still be down.
        let quiet_until = cx.now_ns + refusal_pause_ns(self.timeout_ns);
        let logs = &mut self.logs;
        self.grants.connection_failed(peer, |backup, id| {
            if let Some(log) = logs.get_mut(&backup) {
                log.chain.give_up(id, quiet_until);
            }
        });
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.logs.contains_key(&backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        if let LinkKind::RemoteLog(target) = link.0 {
            self.logs.insert(backup, RemoteLog::new(target));
            if !self.backups.contains(&backup) {
                self.backups.push(backup);
                self.backups.sort_unstable();
            }
        }
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let logs = &mut self.logs;
        let mut did = self.grants.expire(cx, self.timeout_ns, |backup, id| {
            if let Some(log) = logs.get_mut(&backup) {
                log.chain.give_up(id, 0);
            }
        });
        let cutoff = cx.now_ns.checked_sub(self.timeout_ns);
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
            if let Some(cutoff) = cutoff {
                let ms = self.timeout_ns / 1_000_000;
                did |= self.fail_waiting(backup, Some(cutoff), || {
                    format!("no segment from {backup} within {ms} ms")
                });
            }
            did |= self.request_grant(cx, backup);
        }
        did |= !self.failed.is_empty();
        out.failed.append(&mut self.failed);
        did
    }
}
