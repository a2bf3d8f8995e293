//! `rwrite` and `batch`: each worker owns a remote log on every other server and
//! appends entries to it with persisted one-sided WRITEs (FaRM's replication, the
//! RWrite-KV and Batch-KV of seed 000 §6.1).
//!
//! A remote log is a chain of segments the backup grants on request
//! ([`super::segments`]); the backup digests a sealed segment after a grace period
//! for WRITEs still in flight.
//!
//! Every hand-over gets exactly one outcome, within a bound: a WRITE's completion
//! (a failed one puts the queue pair in the error state; it is reset before the
//! next WRITE, and the chain goes on past the hole the WRITE left), or, for an
//! entry still waiting for a segment when the replication timeout has passed
//! since it was handed over, or when the backup refused the grant it waited
//! for, a failure.
//!
//! A path that fails again after its reset, before carrying anything — its
//! queue pair before a WRITE, or its RPC connection on a grant request — is
//! given up ([`super::Resets`]): the backup may have restarted and know nothing
//! of it. Its chain is dropped (what waits fails; WRITEs under way complete as
//! flushed when the queue pair is closed), and the next entry dials anew; the
//! backup seals the segments of the old path when the new one arrives.
//!
//! `batch` adds sender-side batching per backup: entries wait until 256 B are
//! pending or 5 µs have passed since the first, then go in one WRITE.

use std::collections::{HashMap, VecDeque};

use rowankv_fabric::{
    Completion, Nic, Op, QpState, QueuePair, RemoteRegion, WcStatus, WorkRequest,
};
use rowankv_rpc::endpoint::{wr_id, PeerId, WR_TAG_SHIFT};
use rowankv_types::NodeId;
use rowankv_wire::frame::{ErrorCode, Response};

use super::segments::{refusal_pause_ns, Answer, Reserve, SegmentChain, SentGrants};
use super::{Link, LinkKind, Outcomes, ReplCtx, Replicator, Resets, WR_TAG_REPL};

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
/// queue), the backup's registered data area, an RPC peer for grants, and the
/// id of the log the backup gave the path (named in every grant request).
pub struct RemoteLogTarget<Q> {
    pub qp: Q,
    pub region: RemoteRegion,
    pub peer: PeerId,
    pub log: u32,
}

/// Whether a refused grant request ends the path: the backup ended the log
/// (`UnknownLog`: another path of this server arrived there), or the log
/// holds as many unsealed segments as it may (`Busy`: segments whose grants
/// were lost with their answers). A path dialled anew gets a new log, and the
/// backup seals the old one's segments.
pub(crate) fn ends_path(response: &Response<'_>) -> bool {
    matches!(
        response,
        Response::Error {
            code: ErrorCode::UnknownLog | ErrorCode::Busy,
            ..
        }
    )
}

impl<Q: QueuePair> RemoteLogTarget<Q> {
    /// Before a WRITE: a queue pair in the error state (a WRITE failed, and
    /// every later one on it was flushed) is reset so that the next ones are
    /// carried out. `false`: it failed again since its last reset, or cannot be
    /// reset — the path is to be given up.
    pub(crate) fn ready(&self, resets: &mut Resets, backup: NodeId) -> bool {
        if self.qp.state() != QpState::Error {
            return true;
        }
        if !resets.qp_failed() {
            return false;
        }
        match self.qp.reset() {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(%backup, error = %e, "resetting a WRITE queue pair");
                false
            }
        }
    }

    /// Close the path for good: the queue pair (WRITEs under way complete as
    /// flushed) and the RPC connection.
    pub(crate) fn close<N: Nic<Qp = Q>>(&self, cx: &mut ReplCtx<'_, N>) {
        self.qp.close();
        cx.ep.close(self.peer);
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
    /// Which of the replicator's logs to this backup it is: a WRITE of an
    /// earlier one, given up on, no longer counts in this one's chain.
    gen: u64,
    resets: Resets,
    chain: SegmentChain,
    /// Entries waiting for a segment, in order.
    waiting: VecDeque<Waiting>,
    /// `batch`: bytes and tokens not yet written, and when the first arrived.
    batch: Vec<u8>,
    batch_tokens: Vec<u64>,
    batch_since_ns: u64,
}

impl<Q> RemoteLog<Q> {
    fn new(target: RemoteLogTarget<Q>, gen: u64) -> Self {
        RemoteLog {
            target,
            gen,
            resets: Resets::default(),
            chain: SegmentChain::default(),
            waiting: VecDeque::new(),
            batch: Vec::new(),
            batch_tokens: Vec::new(),
            batch_since_ns: 0,
        }
    }
}

/// A WRITE posted: its backup and log, the segment it went to, what it
/// acknowledges.
struct InFlight {
    backup: NodeId,
    gen: u64,
    segment: u32,
    tokens: Tokens,
}

/// The `rwrite` (and `batch`) strategy's replicator of one worker: persisted
/// WRITEs to the worker's own remote log on each backup.
pub struct RwriteReplicator<N: Nic> {
    backups: Vec<NodeId>,
    logs: HashMap<NodeId, RemoteLog<N::Qp>>,
    batch: Option<BatchConfig>,
    /// How long an entry may wait for a segment, and a grant request for its
    /// answer.
    timeout_ns: u64,
    /// The generation of the next log made.
    next_gen: u64,
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
        targets: HashMap<NodeId, RemoteLogTarget<N::Qp>>,
        batch: Option<BatchConfig>,
        timeout_ns: u64,
    ) -> Self {
        let mut backups: Vec<NodeId> = targets.keys().copied().collect();
        backups.sort_unstable();
        RwriteReplicator {
            backups,
            logs: targets
                .into_iter()
                .map(|(node, target)| (node, RemoteLog::new(target, 0)))
                .collect(),
            batch,
            timeout_ns,
            next_gen: 1,
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
        let (peer, id) = (log.target.peer, log.target.log);
        self.grants.send(&mut log.chain, cx, peer, id, backup)
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
        if !self.ready(cx, backup) {
            let why = format!("the path to {backup} failed again: connecting anew");
            tokens.for_each(|t| self.failed.push((t, why.clone())));
            return;
        }
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
                gen: log.gen,
                segment,
                tokens,
            },
        );
        Ok(None)
    }

    /// Whether `backup`'s path may take a WRITE now (see
    /// [`RemoteLogTarget::ready`]); if not, it is given up.
    fn ready(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) -> bool {
        let Some(log) = self.logs.get_mut(&backup) else {
            return true;
        };
        if log.target.ready(&mut log.resets, backup) {
            return true;
        }
        self.give_up(cx, backup);
        false
    }

    /// Give up the path to `backup` (it failed again after a reset, or the
    /// backup ended its log: [`ends_path`]): close it,
    /// fail what waits for it, forget its chain and grant requests. WRITEs
    /// under way complete as flushed, each failing its tokens. The next entry
    /// for `backup` dials anew; the backup seals this chain's segments when
    /// the new path arrives.
    fn give_up(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        let Some(log) = self.logs.remove(&backup) else {
            return;
        };
        tracing::info!(%backup, "a remote-log path failed again after a reset: dialling anew");
        self.backups.retain(|&b| b != backup);
        cx.ep.close(log.target.peer);
        self.retire(backup, log, "failed again: connecting anew");
    }

    /// The end of a log to `backup`: its queue pair closed, what waits for it
    /// failed (`why`), its grant requests forgotten.
    fn retire(&mut self, backup: NodeId, log: RemoteLog<N::Qp>, why: &str) {
        log.target.qp.close();
        self.grants.forget(backup, |_| {});
        let why = || format!("the path to {backup} {why}");
        for w in log.waiting {
            w.tokens.for_each(|t| self.failed.push((t, why())));
        }
        for t in log.batch_tokens {
            self.failed.push((t, why()));
        }
    }

    /// Post what waits for `backup`'s log, in order, while its chain has room.
    fn drain_waiting(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        if !self.ready(cx, backup) {
            return;
        }
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
        if let Some(log) = self.logs.get_mut(&w.backup).filter(|l| l.gen == w.gen) {
            log.chain.write_done(w.segment);
            if c.status == WcStatus::Success {
                log.resets.qp_carried();
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
        let Some((&backup, log)) = self.logs.iter_mut().find(|(_, l)| l.target.peer == peer) else {
            tracing::warn!(?peer, request_id, "a response from no backup's connection");
            return;
        };
        log.resets.rpc_answered();
        self.grants.answered(backup, request_id);
        let pause = refusal_pause_ns(self.timeout_ns);
        match log.chain.on_answer(request_id, response, cx.now_ns, pause) {
            Answer::Granted => self.drain_waiting(cx, backup),
            Answer::Refused(why) if ends_path(response) => {
                tracing::info!(%backup, why, "segment request refused: dialling anew");
                self.give_up(cx, backup);
            }
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
        // The endpoint reset the connection; a second failure gives it up.
        let again = self
            .logs
            .iter_mut()
            .find(|(_, l)| l.target.peer == peer)
            .and_then(|(&b, l)| (!l.resets.rpc_failed()).then_some(b));
        if let Some(backup) = again {
            self.give_up(cx, backup);
        }
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.logs.contains_key(&backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        if let LinkKind::RemoteLog(target) = link.0 {
            let gen = self.next_gen;
            self.next_gen += 1;
            // A path is added only where there is none (`OnDemand`, the
            // in-process cluster); one replaced all the same ends its chain
            // (the backup sealed it when the new path arrived).
            if let Some(old) = self.logs.insert(backup, RemoteLog::new(target, gen)) {
                self.retire(backup, old, "was replaced");
            }
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
        // A path given up in the loop leaves `backups`: walk by index.
        let mut i = 0;
        while let Some(&backup) = self.backups.get(i) {
            i += 1;
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
