//! `rpc`: an entry travels in a `Replicate` RPC to one worker of each backup, which
//! appends it to its own per-thread b-log and answers (RPC-KV of seed 000 §6.1).
//! The backup's CPU is on the critical path: the request waits for that worker to
//! be scheduled, and its handling takes the worker's time from client requests.
//!
//! Every hand-over gets exactly one outcome, within a bound: a request whose SEND
//! failed (the backup died, the link was cut: the endpoint reports it and resets
//! the connection) fails at once, and one not answered within the replication
//! timeout (`ServerSettings::replicate_timeout`, counted from the hand-over, a
//! wait for a credit included) fails then, its credit given back. Request ids are
//! never reused, so an answer that comes after its request failed names no
//! pending request and is ignored.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use rowankv_fabric::{Completion, Nic};
use rowankv_rpc::endpoint::{PeerId, SendError};
use rowankv_types::NodeId;
use rowankv_wire::frame::{Body, Envelope, Response};

use super::{Link, LinkKind, Outcomes, ReplCtx, Replicator};

/// A request sent and not answered yet.
struct Pending {
    /// The connection it went on: a response counts only from there.
    peer: PeerId,
    backup: NodeId,
    token: u64,
    /// When the entry was handed over.
    since_ns: u64,
}

/// An entry waiting for a credit.
struct Queued {
    backup: NodeId,
    entry: Vec<u8>,
    token: u64,
    since_ns: u64,
}

/// The `rpc` strategy's replicator of one worker: a `Replicate` RPC per entry
/// to one worker of each backup.
pub struct RpcReplicator {
    peers: HashMap<NodeId, PeerId>,
    /// Backups whose connection failed and has not been answered on since: a
    /// second failure gives the connection up (see `on_send_failed`).
    reset: HashSet<NodeId>,
    /// How long a hand-over may go unanswered.
    timeout_ns: u64,
    next_request: u64,
    /// By request id. Entries are sent in the order they were handed over, so
    /// ids grow with `since_ns`: the oldest come first.
    pending: BTreeMap<u64, Pending>,
    queued: VecDeque<Queued>,
    queued_failures: Vec<(u64, String)>,
}

impl RpcReplicator {
    /// `peers`: the endpoint peer of one worker of each backup server;
    /// `timeout_ns`: how long a hand-over may go unanswered before it fails.
    pub fn new(peers: HashMap<NodeId, PeerId>, timeout_ns: u64) -> Self {
        RpcReplicator {
            peers,
            reset: HashSet::new(),
            timeout_ns,
            next_request: 1,
            pending: BTreeMap::new(),
            queued: VecDeque::new(),
            queued_failures: Vec::new(),
        }
    }

    fn unanswered(&self, backup: NodeId) -> String {
        format!(
            "replicate RPC to {backup} not answered within {} ms",
            self.timeout_ns / 1_000_000
        )
    }

    /// Fail what was handed over `timeout_ns` ago or longer and has no answer:
    /// requests (their credits given back; an answer that still comes is
    /// ignored) and entries still waiting for a credit.
    fn expire<N: Nic>(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let Some(cutoff) = cx.now_ns.checked_sub(self.timeout_ns) else {
            return false;
        };
        let mut did = false;
        while let Some(oldest) = self.pending.first_entry() {
            if oldest.get().since_ns > cutoff {
                break;
            }
            let p = oldest.remove();
            cx.ep.forget(p.peer);
            out.failed.push((p.token, self.unanswered(p.backup)));
            did = true;
        }
        while self.queued.front().is_some_and(|q| q.since_ns <= cutoff) {
            let q = self.queued.pop_front().expect("checked");
            let why = format!("{} (never sent: no credit)", self.unanswered(q.backup));
            out.failed.push((q.token, why));
            did = true;
        }
        did
    }

    /// Send now; `false` if the peer has no credit left.
    fn send<N: Nic>(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        entry: &[u8],
        token: u64,
        since_ns: u64,
        out: &mut Outcomes,
    ) -> bool {
        let Some(&peer) = self.peers.get(&backup) else {
            out.failed
                .push((token, format!("no RPC connection to {backup}")));
            return true;
        };
        let request_id = self.next_request;
        let env = Envelope {
            request_id,
            ..cx.env
        };
        match cx
            .ep
            .request(peer, &env, &Body::Replicate { entries: entry })
        {
            Ok(()) => {
                self.next_request += 1;
                self.pending.insert(
                    request_id,
                    Pending {
                        peer,
                        backup,
                        token,
                        since_ns,
                    },
                );
                true
            }
            Err(SendError::Busy(..)) => false,
            Err(e) => {
                out.failed
                    .push((token, format!("replicate RPC to {backup}: {e}")));
                true
            }
        }
    }
}

impl<N: Nic> Replicator<N> for RpcReplicator {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        let since_ns = cx.now_ns;
        let mut out = Outcomes::default();
        if !self.queued.is_empty() || !self.send(cx, backup, entry, token, since_ns, &mut out) {
            self.queued.push_back(Queued {
                backup,
                entry: entry.to_vec(),
                token,
                since_ns,
            });
        }
        // Failures are reported at the next tick.
        self.queued_failures.append(&mut out.failed);
    }

    fn on_completion(&mut self, _cx: &mut ReplCtx<'_, N>, _c: &Completion, _out: &mut Outcomes) {}

    fn on_response(
        &mut self,
        _cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        request_id: u64,
        response: &Response<'_>,
        out: &mut Outcomes,
    ) {
        if self.pending.get(&request_id).is_none_or(|p| p.peer != peer) {
            // Also the late answer to a request that already failed.
            tracing::warn!(
                ?peer,
                request_id,
                "a response to no pending request of this peer, ignored"
            );
            return;
        }
        let Pending { token, backup, .. } = self.pending.remove(&request_id).expect("checked");
        match response {
            Response::Ok { .. } => {
                self.reset.remove(&backup);
                out.acked.push(token)
            }
            other => out
                .failed
                .push((token, format!("replicate RPC answered {other:?}"))),
        }
    }

    fn on_send_failed(&mut self, cx: &mut ReplCtx<'_, N>, peer: PeerId, out: &mut Outcomes) {
        // The endpoint gave the connection's credits back when it reset it.
        let lost: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.peer == peer)
            .map(|(&id, _)| id)
            .collect();
        for id in lost {
            let p = self.pending.remove(&id).expect("listed");
            let why = format!("replicate RPC to {}: the connection failed", p.backup);
            out.failed.push((p.token, why));
        }
        // The endpoint reset the connection, which is enough after a cut link.
        // A second failure before any answer gives it up: the backup may have
        // restarted, and its new process knows nothing of this connection. A
        // new one is dialled (`OnDemand`) when the write is replicated again.
        let Some(backup) = self.peers.iter().find(|(_, &p)| p == peer).map(|(&b, _)| b) else {
            return;
        };
        if !self.reset.insert(backup) {
            self.reset.remove(&backup);
            self.peers.remove(&backup);
            cx.ep.close(peer);
            tracing::info!(%backup, "a replication connection failed again: dialling anew");
        }
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.peers.contains_key(&backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        if let LinkKind::Rpc(peer) = link.0 {
            self.reset.remove(&backup);
            self.peers.insert(backup, peer);
        }
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.queued_failures.is_empty();
        out.failed.append(&mut self.queued_failures);
        did |= self.expire(cx, out);
        while let Some(q) = self.queued.pop_front() {
            if !self.send(cx, q.backup, &q.entry, q.token, q.since_ns, out) {
                self.queued.push_front(q);
                break;
            }
            did = true;
        }
        did
    }
}
