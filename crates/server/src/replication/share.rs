//! `share`: one remote log per pair of servers, shared by all the sending server's
//! workers (Share-KV of seed 000 §6.1). A worker reserves space in the shared log
//! in a short local critical section (the paper's local atomic increment; the
//! segment switch needs the lock anyway), then posts its WRITE on its own queue
//! pair. Reservation order and landing order can differ: workers on different
//! threads post in whatever order they get to it — the effect the paper measures.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{Completion, Nic, Op, QueuePair, WcStatus, WorkRequest};
use rowankv_types::NodeId;
use rowankv_wire::endpoint::{wr_id, PeerId, WR_TAG_SHIFT};
use rowankv_wire::frame::Response;

use super::segments::{grant_for, Reserve, SegmentChain};
use super::{Outcomes, RemoteLogTarget, ReplCtx, Replicator, SHARED_LOG_ID, WR_TAG_REPL};
use crate::runtime::Periodic;

/// One shared remote log (one per backup server), shared by the sending
/// server's workers.
#[derive(Default)]
pub(crate) struct SharedLog {
    chain: Mutex<SegmentChain>,
}

impl SharedLog {
    pub fn new() -> Arc<SharedLog> {
        Arc::new(SharedLog::default())
    }
}

pub(crate) struct ShareReplicator<N: Nic> {
    backups: Vec<NodeId>,
    logs: HashMap<NodeId, (Arc<SharedLog>, RemoteLogTarget<N::Qp>)>,
    waiting: VecDeque<(NodeId, Vec<u8>, u64)>,
    next_wr: u64,
    inflight: HashMap<u64, u64>,
    next_request: u64,
    grant_requests: HashMap<u64, NodeId>,
    failed: Vec<(u64, String)>,
    /// When to look at the shared chains again (they take a lock).
    check: Periodic,
}

/// How often a worker checks whether a shared chain needs a grant or a seal sent
/// (the worker that finds no space asks at once).
const CHECK_INTERVAL_NS: u64 = 100_000;

impl<N: Nic> ShareReplicator<N> {
    pub fn new(logs: HashMap<NodeId, (Arc<SharedLog>, RemoteLogTarget<N::Qp>)>) -> Self {
        let mut backups: Vec<NodeId> = logs.keys().copied().collect();
        backups.sort_unstable();
        ShareReplicator {
            backups,
            logs,
            waiting: VecDeque::new(),
            next_wr: 1,
            inflight: HashMap::new(),
            next_request: 1,
            grant_requests: HashMap::new(),
            failed: Vec::new(),
            check: Periodic::new(CHECK_INTERVAL_NS),
        }
    }

    fn request_grants(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        if let Some((shared, target)) = self.logs.get(&backup) {
            shared.chain.lock().request_grants(
                cx,
                target.peer,
                SHARED_LOG_ID,
                backup,
                &mut self.next_request,
                &mut self.grant_requests,
            );
        }
    }

    /// Reserve and post; `false` if there is no space yet.
    fn try_write(&mut self, backup: NodeId, bytes: &[u8], token: u64) -> bool {
        let Some((shared, target)) = self.logs.get(&backup) else {
            self.failed
                .push((token, format!("no shared log at {backup}")));
            return true;
        };
        // The reservation is the only shared step; the WRITE is posted after.
        let reserved = shared.chain.lock().reserve(bytes.len() as u64);
        match reserved {
            Ok(Reserve::At(offset)) => {
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
                        self.inflight.insert(seq, token);
                    }
                    Err(e) => self.failed.push((token, format!("posting a WRITE: {e}"))),
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
}

impl<N: Nic> Replicator<N> for ShareReplicator<N> {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        if self.waiting.is_empty() && self.try_write(backup, entry, token) {
            return;
        }
        self.waiting.push_back((backup, entry.to_vec(), token));
        self.request_grants(cx, backup);
    }

    fn on_completion(&mut self, _cx: &mut ReplCtx<'_, N>, c: &Completion, out: &mut Outcomes) {
        let seq = c.wr_id & ((1 << WR_TAG_SHIFT) - 1);
        let Some(token) = self.inflight.remove(&seq) else {
            return;
        };
        if c.status == WcStatus::Success {
            out.acked.push(token);
        } else {
            out.failed
                .push((token, format!("shared-log WRITE: {:?}", c.status)));
        }
    }

    fn on_response(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        request_id: u64,
        response: &Response<'_>,
        _out: &mut Outcomes,
    ) {
        let logs = &self.logs;
        let Some(backup) = grant_for(&mut self.grant_requests, request_id, peer, |b| {
            logs.get(&b).map(|(_, t)| t.peer)
        }) else {
            return;
        };
        if let Some((shared, _)) = self.logs.get(&backup) {
            shared.chain.lock().on_grant(backup, response);
        }
        self.request_grants(cx, backup);
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.failed.is_empty();
        let mut n = self.waiting.len();
        while n > 0 {
            n -= 1;
            let Some((backup, bytes, token)) = self.waiting.pop_front() else {
                break;
            };
            if self.try_write(backup, &bytes, token) {
                did = true;
            } else {
                self.waiting.push_front((backup, bytes, token));
                self.request_grants(cx, backup);
                break;
            }
        }
        if !self.check.due(cx.now_ns) {
            out.failed.append(&mut self.failed);
            return did;
        }
        for i in 0..self.backups.len() {
            let backup = self.backups[i];
            let needs = self
                .logs
                .get(&backup)
                .is_some_and(|(shared, _)| shared.chain.lock().needs_grant());
            if needs {
                self.request_grants(cx, backup);
            }
        }
        out.failed.append(&mut self.failed);
        did
    }
}
