//! `rpc`: an entry travels in a `Replicate` RPC to one worker of each backup, which
//! appends it to its own per-thread b-log and answers (RPC-KV of seed 000 §6.1).
//! The backup's CPU is on the critical path: the request waits for that worker to
//! be scheduled, and its handling takes the worker's time from client requests.

use std::collections::{HashMap, VecDeque};

use rowankv_fabric::{Completion, Nic};
use rowankv_types::NodeId;
use rowankv_wire::endpoint::{PeerId, SendError};
use rowankv_wire::frame::{Body, Envelope, Response};

use super::{Outcomes, ReplCtx, Replicator};

pub(crate) struct RpcReplicator {
    peers: HashMap<NodeId, PeerId>,
    next_request: u64,
    /// Request id → (the peer it went to, token). A response counts only from
    /// the connection its request went on.
    pending: HashMap<u64, (PeerId, u64)>,
    /// Entries waiting for a credit: (backup, entry, token).
    queued: VecDeque<(NodeId, Vec<u8>, u64)>,
    queued_failures: Vec<(u64, String)>,
}

impl RpcReplicator {
    /// `peers`: the endpoint peer of one worker of each backup server.
    pub fn new(peers: HashMap<NodeId, PeerId>) -> Self {
        RpcReplicator {
            peers,
            next_request: 1,
            pending: HashMap::new(),
            queued: VecDeque::new(),
            queued_failures: Vec::new(),
        }
    }

    /// Send now; `false` if the peer has no credit left.
    fn send<N: Nic>(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        entry: &[u8],
        token: u64,
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
                self.pending.insert(request_id, (peer, token));
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
        let mut out = Outcomes::default();
        if !self.queued.is_empty() || !self.send(cx, backup, entry, token, &mut out) {
            self.queued.push_back((backup, entry.to_vec(), token));
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
        if self
            .pending
            .get(&request_id)
            .is_none_or(|&(p, _)| p != peer)
        {
            tracing::warn!(
                ?peer,
                request_id,
                "a response to no request of this peer, ignored"
            );
            return;
        }
        let (_, token) = self.pending.remove(&request_id).expect("checked");
        match response {
            Response::Ok { .. } => out.acked.push(token),
            other => out
                .failed
                .push((token, format!("replicate RPC answered {other:?}"))),
        }
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.queued_failures.is_empty();
        out.failed.append(&mut self.queued_failures);
        while let Some((backup, entry, token)) = self.queued.pop_front() {
            if !self.send(cx, backup, &entry, token, out) {
                self.queued.push_front((backup, entry, token));
                break;
            }
            did = true;
        }
        did
    }
}
