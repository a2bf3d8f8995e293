//! `share`: one remote log per pair of servers, shared by all the sending server's
//! workers (Share-KV of seed 000 §6.1). A worker reserves space in the shared log
//! in a short local critical section (the paper's local atomic increment; the
//! segment switch needs the lock anyway), then posts its WRITE on its own queue
//! pair. Reservation order and landing order can differ: workers on different
//! threads post in whatever order they get to it — the effect the paper measures.
//!
//! A reservation whose WRITE never lands (it failed, or its worker died between
//! reserving and posting) is a hole in the segment; digest and gather walk past
//! it. A segment is sealed only once every WRITE reserved in it has completed
//! ([`super::segments`]). Outcomes are bounded as in `rwrite`: an entry waiting
//! for a segment fails after the replication timeout.
//!
//! A worker gives up its path to a backup as in `rwrite` (failed again after a
//! reset) and dials anew; the shared log goes on, its other workers still
//! writing, unless the backup answers the new path with another epoch (it
//! restarted, or sealed the log's segments: [`super::dial::link`]): then the
//! server's workers move to a new shared log, each when its old path fails.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{Completion, Nic, Op, QueuePair, WcStatus, WorkRequest};
use rowankv_rpc::endpoint::{wr_id, PeerId, WR_TAG_SHIFT};
use rowankv_types::NodeId;
use rowankv_wire::frame::Response;

use super::rwrite::ends_path;
use super::segments::{refusal_pause_ns, Answer, Reserve, SegmentChain, SentGrants};
use super::{Link, LinkKind, Outcomes, RemoteLogTarget, ReplCtx, Replicator, Resets, WR_TAG_REPL};
use crate::runtime::Periodic;

/// One shared remote log (one per backup server), shared by the sending
/// server's workers.
#[derive(Default)]
pub struct SharedLog {
    chain: Mutex<SegmentChain>,
}

impl SharedLog {
    /// A shared log with no segment yet.
    pub fn new() -> Arc<SharedLog> {
        Arc::new(SharedLog::default())
    }

    /// Retired segments its workers may seal now, for tests.
    #[cfg(test)]
    pub(crate) fn sealable(&self) -> Vec<u32> {
        self.chain.lock().sealable()
    }
}

/// An entry waiting for space in a shared log.
struct Waiting {
    backup: NodeId,
    bytes: Vec<u8>,
    token: u64,
    since_ns: u64,
}

/// A WRITE posted: its backup, the log and segment it went to, its token.
struct InFlight {
    backup: NodeId,
    log: Arc<SharedLog>,
    segment: u32,
    token: u64,
    /// Posted on a path since given up: its completion does not count in the
    /// chain, whose segment stays unsealed (see [`ShareReplicator::give_up`]).
    withheld: bool,
}

/// A worker's path to one backup's shared log.
struct Path<Q> {
    log: Arc<SharedLog>,
    target: RemoteLogTarget<Q>,
    resets: Resets,
}

/// The `share` strategy's replicator of one worker: persisted WRITEs to the
/// remote log its server shares with the other workers on each backup.
pub struct ShareReplicator<N: Nic> {
    backups: Vec<NodeId>,
    logs: HashMap<NodeId, Path<N::Qp>>,
    waiting: VecDeque<Waiting>,
    /// How long an entry may wait for space, and a grant request for its answer.
    timeout_ns: u64,
    next_wr: u64,
    inflight: HashMap<u64, InFlight>,
    /// Grant requests this worker sent.
    grants: SentGrants,
    failed: Vec<(u64, String)>,
    /// When to look at the shared chains again (they take a lock).
    check: Periodic,
}

/// How often a worker checks whether a shared chain needs a grant or a seal sent
/// (the worker that finds no space asks at once).
const CHECK_INTERVAL_NS: u64 = 100_000;

impl<N: Nic> ShareReplicator<N> {
    /// `timeout_ns`: how long an entry may wait for space (and a grant request
    /// for its answer) before it fails.
    pub fn new(
        logs: HashMap<NodeId, (Arc<SharedLog>, RemoteLogTarget<N::Qp>)>,
        timeout_ns: u64,
    ) -> Self {
        let mut backups: Vec<NodeId> = logs.keys().copied().collect();
        backups.sort_unstable();
        ShareReplicator {
            backups,
            logs: logs
                .into_iter()
                .map(|(b, (log, target))| {
                    let resets = Resets::default();
                    (
                        b,
                        Path {
                            log,
                            target,
                            resets,
                        },
                    )
                })
                .collect(),
            waiting: VecDeque::new(),
            timeout_ns,
            next_wr: 1,
            inflight: HashMap::new(),
            grants: SentGrants::default(),
            failed: Vec::new(),
            check: Periodic::new(CHECK_INTERVAL_NS),
        }
    }

    /// Ask `backup` for a segment if the shared chain needs one and no other
    /// worker's request is out.
    fn request_grant(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) -> bool {
        let Some(path) = self.logs.get(&backup) else {
            return false;
        };
        let mut chain = path.log.chain.lock();
        if !chain.needs_grant(cx.now_ns) {
            return false;
        }
        let (peer, log) = (path.target.peer, path.target.log);
        self.grants.send(&mut chain, cx, peer, log, backup)
    }

    /// Whether the path to `backup` may take a WRITE now (see
    /// [`RemoteLogTarget::ready`]); if not, it is given up.
    fn ready(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) -> bool {
        let Some(path) = self.logs.get_mut(&backup) else {
            return true;
        };
        if path.target.ready(&mut path.resets, backup) {
            return true;
        }
        self.give_up(cx, backup);
        false
    }

    /// Give up this worker's path to `backup` (it failed again after a
    /// reset, or the backup ended the log: [`ends_path`]): close it, fail what
    /// waits for it, and give up its grant requests in the shared chain so
    /// that another worker asks.
    ///
    /// Its WRITEs under way complete as flushed, but one may still land at the
    /// backup — its frame left before the close, and the backup's end of the
    /// path is open until this worker dials again. So they are *withheld*: not
    /// reported done in the chain, whose segments they went to are then never
    /// sealed through it (another worker's seal would let the backup digest
    /// and reuse a segment a late WRITE then lands in). The backup seals them
    /// itself when this worker's new path arrives, after closing every path
    /// of this server, and answers with a new log, which its workers move to.
    fn give_up(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        let Some(path) = self.logs.remove(&backup) else {
            return;
        };
        tracing::info!(%backup, "a shared-log path given up: dialling anew");
        self.backups.retain(|&b| b != backup);
        path.target.close(cx);
        self.end_path(backup, path);
        self.fail_waiting(backup, None, || {
            format!("the path to {backup} was given up: connecting anew")
        });
    }

    /// The end of this worker's path to `backup`: its grant requests given
    /// up in the chain, its WRITEs under way withheld.
    fn end_path(&mut self, backup: NodeId, path: Path<N::Qp>) {
        self.grants
            .forget(backup, |id| path.log.chain.lock().give_up(id, 0));
        for w in self.inflight.values_mut() {
            if w.backup == backup && Arc::ptr_eq(&w.log, &path.log) {
                w.withheld = true;
            }
        }
    }

    /// Reserve and post; `false` if there is no space yet.
    fn try_write(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        bytes: &[u8],
        token: u64,
    ) -> bool {
        if !self.ready(cx, backup) {
            let why = format!("the path to {backup} failed again: connecting anew");
            self.failed.push((token, why));
            return true;
        }
        let Some(Path {
            log: shared,
            target,
            ..
        }) = self.logs.get(&backup)
        else {
            self.failed
                .push((token, format!("no shared log at {backup}")));
            return true;
        };
        // The reservation is the only shared step; the WRITE is posted after.
        let reserved = shared.chain.lock().reserve(bytes.len() as u64);
        match reserved {
            Ok(Reserve::At { offset, segment }) => {
                let seq = self.next_wr;
                self.next_wr += 1;
                let wr = WorkRequest::new(
                    wr_id(WR_TAG_REPL, seq),
                    Op::Write {
                        data: bytes,
                        remote: target.region.at(offset),
                        imm: None,
                    },
                )
                .persisted();
                match target.qp.post_send(&[wr]) {
                    Ok(()) => {
                        self.inflight.insert(
                            seq,
                            InFlight {
                                backup,
                                log: shared.clone(),
                                segment,
                                token,
                                withheld: false,
                            },
                        );
                    }
                    Err(e) => {
                        // A hole the segment's digest walks past.
                        shared.chain.lock().write_done(segment);
                        self.failed.push((token, format!("posting a WRITE: {e}")));
                    }
                }
                true
            }
            Ok(Reserve::NoSpace) => false,
            Err(why) => {
                self.failed.push((token, why));
                true
            }
        }
    }

    /// Post what waits, in order, while there is space.
    fn drain_waiting(&mut self, cx: &mut ReplCtx<'_, N>) -> bool {
        let mut did = false;
        while let Some(w) = self.waiting.pop_front() {
            if self.try_write(cx, w.backup, &w.bytes, w.token) {
                did = true;
            } else {
                let backup = w.backup;
                self.waiting.push_front(w);
                self.request_grant(cx, backup);
                break;
            }
        }
        did
    }

    /// Fail what waits for `backup` (handed over at or before `cutoff_ns`, or
    /// all) with `why`.
    fn fail_waiting(
        &mut self,
        backup: NodeId,
        cutoff_ns: Option<u64>,
        why: impl Fn() -> String,
    ) -> bool {
        let before = self.waiting.len();
        let failed = &mut self.failed;
        self.waiting.retain(|w| {
            let fail = w.backup == backup && cutoff_ns.is_none_or(|c| w.since_ns <= c);
            if fail {
                failed.push((w.token, why()));
            }
            !fail
        });
        self.waiting.len() != before
    }
}

impl<N: Nic> Replicator<N> for ShareReplicator<N> {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        if self.waiting.is_empty() && self.try_write(cx, backup, entry, token) {
            return;
        }
        self.waiting.push_back(Waiting {
            backup,
            bytes: entry.to_vec(),
            token,
            since_ns: cx.now_ns,
        });
        self.request_grant(cx, backup);
    }

    fn on_completion(&mut self, _cx: &mut ReplCtx<'_, N>, c: &Completion, out: &mut Outcomes) {
        let seq = c.wr_id & ((1 << WR_TAG_SHIFT) - 1);
        let Some(w) = self.inflight.remove(&seq) else {
            return;
        };
        if !w.withheld {
            w.log.chain.lock().write_done(w.segment);
        }
        if c.status == WcStatus::Success {
            if let Some(path) = self.logs.get_mut(&w.backup) {
                path.resets.qp_carried();
            }
            out.acked.push(w.token);
        } else {
            out.failed.push((
                w.token,
                format!("shared-log WRITE to {}: {:?}", w.backup, c.status),
            ));
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
        let Some((&backup, path)) = self.logs.iter_mut().find(|(_, p)| p.target.peer == peer)
        else {
            tracing::warn!(?peer, request_id, "a response from no backup's connection");
            return;
        };
        path.resets.rpc_answered();
        self.grants.answered(backup, request_id);
        let pause = refusal_pause_ns(self.timeout_ns);
        let answer = path
            .log
            .chain
            .lock()
            .on_answer(request_id, response, cx.now_ns, pause);
        match answer {
            Answer::Granted => {
                self.drain_waiting(cx);
            }
            Answer::Refused(why) if ends_path(response) => {
                tracing::info!(%backup, why, "segment request refused: dialling anew");
                self.give_up(cx, backup);
                out.failed.append(&mut self.failed);
                return;
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
        let logs = &self.logs;
        self.grants.connection_failed(peer, |backup, id| {
            if let Some(path) = logs.get(&backup) {
                path.log.chain.lock().give_up(id, quiet_until);
            }
        });
        // The endpoint reset the connection; a second failure gives it up.
        let again = self
            .logs
            .iter_mut()
            .find(|(_, p)| p.target.peer == peer)
            .and_then(|(&b, p)| (!p.resets.rpc_failed()).then_some(b));
        if let Some(backup) = again {
            self.give_up(cx, backup);
        }
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.logs.contains_key(&backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        if let LinkKind::Shared(log, target) = link.0 {
            let resets = Resets::default();
            // A path is added only where there is none (`OnDemand`, the
            // in-process cluster); one replaced all the same is closed.
            if let Some(old) = self.logs.insert(
                backup,
                Path {
                    log,
                    target,
                    resets,
                },
            ) {
                old.target.qp.close();
                self.end_path(backup, old);
            }
            if !self.backups.contains(&backup) {
                self.backups.push(backup);
                self.backups.sort_unstable();
            }
        }
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let logs = &self.logs;
        let mut did = self.grants.expire(cx, self.timeout_ns, |backup, id| {
            if let Some(path) = logs.get(&backup) {
                path.log.chain.lock().give_up(id, 0);
            }
        });
        // Space another worker's grant made.
        did |= self.drain_waiting(cx);
        if let Some(cutoff) = cx.now_ns.checked_sub(self.timeout_ns) {
            for i in 0..self.backups.len() {
                let backup = self.backups[i];
                let ms = self.timeout_ns / 1_000_000;
                did |= self.fail_waiting(backup, Some(cutoff), || {
                    format!("no shared-log space at {backup} within {ms} ms")
                });
            }
        }
        if self.check.due(cx.now_ns) {
            for i in 0..self.backups.len() {
                let backup = self.backups[i];
                did |= self.request_grant(cx, backup);
            }
        }
        did |= !self.failed.is_empty();
        out.failed.append(&mut self.failed);
        did
    }
}
