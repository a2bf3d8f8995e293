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
use rowankv_wire::endpoint::{wr_id, PeerId, SendError, WR_TAG_SHIFT};
use rowankv_wire::frame::{Body, Envelope, Response};

use super::rwrite::Granted;
use super::{Outcomes, RemoteLogTarget, ReplCtx, Replicator, SHARED_LOG_ID, WR_TAG_REPL};

#[derive(Default)]
struct SharedInner {
    current: Option<Granted>,
    cursor: u64,
    standby: Option<Granted>,
    requested: usize,
    seal_pending: Option<u32>,
}

/// The state of one shared remote log (one per backup server), shared by the
/// sending server's workers.
#[derive(Default)]
pub(crate) struct SharedLog {
    inner: Mutex<SharedInner>,
}

enum Reserve {
    At(u64),
    NoSpace,
}

impl SharedLog {
    pub fn new() -> Arc<SharedLog> {
        Arc::new(SharedLog::default())
    }

    fn reserve(&self, len: u64) -> Result<Reserve, String> {
        let mut s = self.inner.lock();
        loop {
            let Some(cur) = s.current else {
                match s.standby.take() {
                    Some(g) => {
                        s.current = Some(g);
                        s.cursor = 0;
                        continue;
                    }
                    None => return Ok(Reserve::NoSpace),
                }
            };
            if len > cur.len_bytes {
                return Err(format!("{len} B entry larger than a segment"));
            }
            if s.cursor + len > cur.len_bytes {
                s.seal_pending = Some(cur.segment);
                s.current = None;
                continue;
            }
            let at = cur.offset + s.cursor;
            s.cursor += len;
            return Ok(Reserve::At(at));
        }
    }
}

pub(crate) struct ShareReplicator<N: Nic> {
    logs: HashMap<NodeId, (Arc<SharedLog>, RemoteLogTarget<N::Qp>)>,
    waiting: VecDeque<(NodeId, Vec<u8>, u64)>,
    next_wr: u64,
    inflight: HashMap<u64, u64>,
    next_request: u64,
    grant_requests: HashMap<u64, NodeId>,
    failed: Vec<(u64, String)>,
}

impl<N: Nic> ShareReplicator<N> {
    pub fn new(logs: HashMap<NodeId, (Arc<SharedLog>, RemoteLogTarget<N::Qp>)>) -> Self {
        ShareReplicator {
            logs,
            waiting: VecDeque::new(),
            next_wr: 1,
            inflight: HashMap::new(),
            next_request: 1,
            grant_requests: HashMap::new(),
            failed: Vec::new(),
        }
    }

    fn request_grants(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) {
        let Some((shared, target)) = self.logs.get(&backup) else {
            return;
        };
        let mut s = shared.inner.lock();
        let have = s.current.is_some() as usize + s.standby.is_some() as usize;
        let mut want = 2usize.saturating_sub(have + s.requested);
        if s.seal_pending.is_some() && want == 0 && s.requested == 0 {
            want = 1;
        }
        for _ in 0..want {
            let request_id = self.next_request;
            let env = Envelope {
                request_id,
                ..cx.env
            };
            let body = Body::GrantSegment {
                log: SHARED_LOG_ID,
                sealed: s.seal_pending,
            };
            match cx.ep.request(target.peer, &env, &body) {
                Ok(()) => {
                    self.next_request += 1;
                    s.requested += 1;
                    s.seal_pending = None;
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

    /// Reserve and post; `false` if there is no space yet.
    fn try_write(&mut self, backup: NodeId, bytes: &[u8], token: u64) -> bool {
        let Some((shared, target)) = self.logs.get(&backup) else {
            self.failed
                .push((token, format!("no shared log at {backup}")));
            return true;
        };
        match shared.reserve(bytes.len() as u64) {
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
        // A grant counts only from the connection its request went on.
        let Some(&backup) = self.grant_requests.get(&request_id) else {
            return;
        };
        if self.logs.get(&backup).is_none_or(|(_, t)| t.peer != peer) {
            tracing::warn!(
                ?peer,
                request_id,
                "a grant from another connection, ignored"
            );
            return;
        }
        self.grant_requests.remove(&request_id);
        if let Some((shared, _)) = self.logs.get(&backup) {
            let mut s = shared.inner.lock();
            s.requested = s.requested.saturating_sub(1);
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
                    if s.current.is_none() {
                        s.current = Some(g);
                        s.cursor = 0;
                    } else if s.standby.is_none() {
                        s.standby = Some(g);
                    } else {
                        tracing::warn!(%backup, segment, "a segment granted beyond need");
                    }
                }
                ref other => {
                    tracing::warn!(%backup, response = ?other, "segment request refused");
                }
            }
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
        let backups: Vec<NodeId> = self.logs.keys().copied().collect();
        for backup in backups {
            let needs = self.logs.get(&backup).is_some_and(|(shared, _)| {
                let s = shared.inner.lock();
                (s.current.is_none() || s.standby.is_none() || s.seal_pending.is_some())
                    && s.requested == 0
            });
            if needs {
                self.request_grants(cx, backup);
            }
        }
        out.failed.append(&mut self.failed);
        did
    }
}
