//! `rowan`: every entry is a persisted SEND to each backup's Rowan receiver, which
//! lands it in the backup's one b-log without the backup's CPU (seed 000 §3, §4.1).

use std::collections::{HashMap, HashSet};

use rowankv_fabric::{Completion, Nic, QpState, QueuePair, WcStatus};
use rowankv_rowan::RowanSender;
use rowankv_rpc::endpoint::{wr_id, PeerId, WR_TAG_SHIFT};
use rowankv_types::NodeId;
use rowankv_wire::frame::Response;

use super::{Link, LinkKind, Outcomes, ReplCtx, Replicator, WR_TAG_REPL};

/// The `rowan` strategy's replicator of one worker: a persisted SEND per entry
/// to each backup's Rowan receiver.
pub struct RowanReplicator<N: Nic> {
    senders: HashMap<NodeId, RowanSender<N::Qp>>,
    /// Backups whose connection was reset and has not carried an entry since.
    reset: HashSet<NodeId>,
    mtu_bytes: usize,
    failed_posts: Vec<(u64, String)>,
}

impl<N: Nic> RowanReplicator<N> {
    /// `senders`: one per backup server, connected to its receiver, on the
    /// worker's completion queue.
    pub fn new(senders: HashMap<NodeId, RowanSender<N::Qp>>, mtu_bytes: usize) -> Self {
        RowanReplicator {
            senders,
            reset: HashSet::new(),
            mtu_bytes,
            failed_posts: Vec::new(),
        }
    }
}

impl<N: Nic> Replicator<N> for RowanReplicator<N> {
    fn replicate(&mut self, _cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        let Some(sender) = self.senders.get_mut(&backup) else {
            self.failed_posts
                .push((token, format!("no Rowan connection to {backup}")));
            return;
        };
        // A connection that failed (a cut link, a backup that was down) is reset
        // and tried again: if the fault is gone the write goes through. If it
        // fails again before carrying anything, the connection is given up:
        // the backup may have restarted (its receiver no longer knows the queue
        // pair), and a new one is dialled through the connection manager
        // (`OnDemand`) when the write is replicated again.
        if sender.qp().state() == QpState::Error {
            if !self.reset.insert(backup) {
                let sender = self.senders.remove(&backup).expect("looked up");
                sender.qp().close();
                self.reset.remove(&backup);
                tracing::info!(%backup, "a Rowan connection failed again after a reset: dialling anew");
                self.failed_posts.push((
                    token,
                    format!("the connection to {backup} failed again: connecting anew"),
                ));
                return;
            }
            if let Err(e) = sender.qp().reset() {
                self.failed_posts
                    .push((token, format!("resetting the connection to {backup}: {e}")));
                return;
            }
        }
        let id = wr_id(WR_TAG_REPL, token);
        // An entry larger than the MTU is sent block by block (each block at most
        // one MTU, whole blocks only); the blocks may land apart (§4.2.2).
        let r = if entry.len() <= self.mtu_bytes {
            sender.write(id, entry)
        } else {
            let blocks: Vec<&[u8]> = entry.chunks(self.mtu_bytes).collect();
            sender.write_blocks(id, &blocks)
        };
        if let Err(e) = r {
            // Reported through a failed completion-like path on the next tick.
            tracing::warn!(%backup, error = %e, "rowan replication could not be posted");
            self.failed_posts.push((token, e.to_string()));
        }
    }

    fn on_completion(&mut self, _cx: &mut ReplCtx<'_, N>, c: &Completion, out: &mut Outcomes) {
        let token = c.wr_id & ((1 << WR_TAG_SHIFT) - 1);
        if c.status == WcStatus::Success {
            if !self.reset.is_empty() {
                let senders = &self.senders;
                self.reset
                    .retain(|b| senders.get(b).is_none_or(|s| s.qp().addr().qpn != c.qpn));
            }
            out.acked.push(token);
        } else {
            out.failed
                .push((token, format!("rowan write: {:?}", c.status)));
        }
    }

    fn on_response(
        &mut self,
        _cx: &mut ReplCtx<'_, N>,
        _peer: PeerId,
        _request_id: u64,
        _response: &Response<'_>,
        _out: &mut Outcomes,
    ) {
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.senders.contains_key(&backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        if let LinkKind::Rowan(sender) = link.0 {
            self.reset.remove(&backup);
            if let Some(old) = self.senders.insert(backup, sender) {
                old.qp().close();
            }
        }
    }

    fn tick(&mut self, _cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let any = !self.failed_posts.is_empty();
        out.failed.append(&mut self.failed_posts);
        any
    }
}
