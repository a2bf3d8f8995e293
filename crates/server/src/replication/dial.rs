//! Replication connections made on demand, through the connection manager, as a
//! process deployment needs them: a server learns its backups from the
//! configuration, and a backup that joins later (a restarted server rejoining)
//! is connected to when the first entry is routed to it.
//!
//! [`OnDemand`] wraps a worker's replicator. An entry for a backup the
//! replicator has no connection to fails at once ("connecting"), which the
//! worker treats as any failed replication: it replicates the write again after
//! its back-off, by which time the connection is usually there. Meanwhile the
//! [`Dialer`] sets the connection up without blocking the worker: it asks the
//! backup's service through the directory ([`Directory::request`]) and, when the
//! answer arrives on a later tick, connects its queue pair and hands the link to
//! the replicator. What each strategy needs comes from its description
//! ([`Strategy::path_service`], [`Strategy::path_needs_rpc`]); the link is made
//! from the answers by [`link`]:
//!
//! | strategy | connection |
//! | --- | --- |
//! | `rowan` | a queue pair to the backup's Rowan receiver (`ROWAN_SERVICE`) |
//! | `rpc` | an RPC connection to the backup's worker `w mod workers` |
//! | `rwrite`, `batch` | a queue pair to the backup's remote log (`REMOTE_LOG_SERVICE`, whose answer carries the region) and an RPC connection for grants |
//! | `share` | as `rwrite`, and the remote log the server's workers share |
//! | `drpc` | a durable-RPC sender's queue pair to the backup's redo rings (`DRPC_SERVICE`, whose answer is the ring's offer) |
//!
//! A dial that gets no answer within [`DIAL_TIMEOUT_NS`], or is refused, is
//! dropped and tried again on a later entry, no sooner than [`REDIAL_NS`] after.
//! A replicator gives up a connection that failed again after a reset, before
//! carrying anything (a backup that restarted knows nothing of it); the next
//! entry for that backup dials anew. A request names the dialling worker and
//! process ([`PathKey`]): the backup replaces that worker's earlier path, and
//! a remote log's backup seals what was written through it
//! ([`crate::services`]). A `share` sender's workers keep sharing one log at
//! a backup only while it answers them with the same [`LogEpoch`]; an answer
//! with an epoch they moved on from is refused ([`SharedLogSet`]).
//!
//! The in-process cluster connects every path before its roles start, with the
//! same [`link`] from what its servers answered, and hands the replicators
//! their links; its dialer then has work only after such a give-up.

use std::collections::HashMap;
use std::sync::Arc;

use crossbeam::channel::Receiver;
use parking_lot::Mutex;
use rowankv_fabric::{Completion, Nic, QueuePair};
use rowankv_rowan::RowanSender;
use rowankv_rpc::directory::{Accepted, Directory};
use rowankv_rpc::endpoint::PeerId;
use rowankv_types::NodeId;
use rowankv_wire::frame::Response;

use super::{
    BackupSide, Link, LinkKind, Outcomes, RemoteLogTarget, ReplCtx, Replicator, SharedLog, Strategy,
};
use crate::services::{decode_log_answer, encode_path_request, LogEpoch, PathKey};

/// How long a dial may wait for the backup's answers.
pub const DIAL_TIMEOUT_NS: u64 = 2_000_000_000;
/// How soon after a failed dial the next may start.
pub const REDIAL_NS: u64 = 50_000_000;

/// The `share` strategy's remote logs of one server, by backup: every
/// worker's dialer takes the same one while the backup answers with the same
/// epoch, and a new one after (the backup restarted, or ended the old log).
pub type SharedLogs = Arc<Mutex<SharedLogSet>>;

/// How many ended epochs per backup [`SharedLogSet`] remembers.
const ENDED_EPOCHS_MAX: usize = 16;

/// The shared logs of one server ([`SharedLogs`]).
#[derive(Default)]
pub struct SharedLogSet {
    current: HashMap<NodeId, (LogEpoch, Arc<SharedLog>)>,
    /// Epochs replaced by a newer one, newest last: an answer with one of
    /// them, handled late, is refused rather than made current again (its log
    /// is ended at the backup).
    ended: HashMap<NodeId, Vec<LogEpoch>>,
}

impl SharedLogSet {
    /// The shared log to `backup` for a path answered with `epoch`: the
    /// current one if the epoch is the same, a new one if it is another, and
    /// an error if it is one this server already moved on from.
    pub fn log_for(&mut self, backup: NodeId, epoch: LogEpoch) -> Result<Arc<SharedLog>, String> {
        if self.ended.get(&backup).is_some_and(|e| e.contains(&epoch)) {
            return Err(format!(
                "a stale answer: log {} at {backup} has ended",
                epoch.log
            ));
        }
        match self.current.get(&backup) {
            Some((e, log)) if *e == epoch => Ok(log.clone()),
            current => {
                if let Some((old, _)) = current {
                    let ended = self.ended.entry(backup).or_default();
                    if ended.len() == ENDED_EPOCHS_MAX {
                        ended.remove(0);
                    }
                    ended.push(*old);
                }
                let log = SharedLog::new();
                self.current.insert(backup, (epoch, log.clone()));
                Ok(log)
            }
        }
    }
}

type Answer = Receiver<Result<Accepted, String>>;

/// The sender's end of a path to a backup's service: a raw queue pair (on the
/// worker's completion queue), or a durable-RPC sender with its own queues
/// (`drpc`).
pub enum PathQp<N: Nic> {
    Raw(N::Qp),
    Drpc(Box<rowankv_drpc::Sender<N>>),
}

impl<N: Nic> PathQp<N> {
    /// The end `strategy`'s path needs, on `nic`; raw queue pairs complete on
    /// `cq` and take `depth` work requests.
    pub fn new(strategy: Strategy, nic: &N, cq: &N::Cq, depth: usize) -> Result<Self, String> {
        if strategy.backup_side() == BackupSide::RedoRing {
            let s = rowankv_drpc::Sender::new(nic, super::redo::VARIANT, super::redo::flow())
                .map_err(|e| format!("a durable-RPC sender: {e}"))?;
            Ok(PathQp::Drpc(Box::new(s)))
        } else {
            let qp = nic
                .create_qp(cq, cq, None, depth)
                .map_err(|e| format!("a queue pair: {e}"))?;
            Ok(PathQp::Raw(qp))
        }
    }

    pub fn addr(&self) -> rowankv_fabric::QpAddr {
        match self {
            PathQp::Raw(q) => q.addr(),
            PathQp::Drpc(s) => s.qp_addr(),
        }
    }

    fn close(&self) {
        match self {
            PathQp::Raw(q) => q.close(),
            PathQp::Drpc(s) => s.close(),
        }
    }

    fn raw(self) -> Result<N::Qp, String> {
        match self {
            PathQp::Raw(q) => Ok(q),
            PathQp::Drpc(_) => Err("a durable-RPC sender where a queue pair was needed".into()),
        }
    }
}

/// One dial in progress: the parts the strategy needs, each asked for, then
/// answered.
struct Dial<N: Nic> {
    started_ns: u64,
    /// The path's queue pair and the answer of the service it asked.
    qp: Option<(PathQp<N>, Answer)>,
    qp_done: Option<(PathQp<N>, Accepted)>,
    /// An RPC connection and its answer.
    rpc: Option<(PeerId, Answer)>,
    rpc_done: Option<PeerId>,
}

/// Sets up one worker's replication connections.
pub(crate) struct Dialer<N: Nic> {
    directory: Directory,
    strategy: Strategy,
    worker: usize,
    /// This server process ([`PathKey::incarnation`]).
    incarnation: u64,
    mtu_bytes: usize,
    qp_depth: usize,
    shared_logs: SharedLogs,
    /// Workers of each backup (for `rpc`'s choice of worker); `None`: 1.
    workers_of: Arc<dyn Fn(NodeId) -> Option<u16> + Send + Sync>,
    dials: HashMap<NodeId, Dial<N>>,
    not_before_ns: HashMap<NodeId, u64>,
}

impl<N: Nic> Dialer<N> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        directory: Directory,
        strategy: Strategy,
        worker: usize,
        incarnation: u64,
        mtu_bytes: usize,
        qp_depth: usize,
        shared_logs: SharedLogs,
        workers_of: Arc<dyn Fn(NodeId) -> Option<u16> + Send + Sync>,
    ) -> Self {
        Dialer {
            directory,
            strategy,
            worker,
            incarnation,
            mtu_bytes,
            qp_depth,
            shared_logs,
            workers_of,
            dials: HashMap::new(),
            not_before_ns: HashMap::new(),
        }
    }

    /// Start connecting to `backup` unless a dial is under way or failed too
    /// recently. Returns why the entry cannot go now.
    fn start(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) -> String {
        if self.dials.contains_key(&backup) {
            return format!("connecting to {backup}");
        }
        if self
            .not_before_ns
            .get(&backup)
            .is_some_and(|&t| cx.now_ns < t)
        {
            return format!("no connection to {backup} (the last attempt failed)");
        }
        match self.ask(cx, backup) {
            Ok(dial) => {
                tracing::debug!(%backup, strategy = %self.strategy, "connecting a replication path");
                self.dials.insert(backup, dial);
                format!("connecting to {backup}")
            }
            Err(why) => {
                self.not_before_ns.insert(backup, cx.now_ns + REDIAL_NS);
                format!("connecting to {backup}: {why}")
            }
        }
    }

    /// Send the requests the strategy needs.
    fn ask(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId) -> Result<Dial<N>, String> {
        let mut dial = Dial {
            started_ns: cx.now_ns,
            qp: None,
            qp_done: None,
            rpc: None,
            rpc_done: None,
        };
        if let Some(service) = self.strategy.path_service() {
            let qp = PathQp::new(self.strategy, cx.ep.nic(), cx.ep.cq(), self.qp_depth)?;
            let answer = self
                .directory
                .request(
                    backup,
                    service,
                    qp.addr(),
                    encode_path_request(PathKey {
                        worker: self.worker as u16,
                        incarnation: self.incarnation,
                    }),
                )
                .map_err(|e| e.to_string())?;
            dial.qp = Some((qp, answer));
        }
        if self.strategy.path_needs_rpc() {
            let workers = (self.workers_of)(backup).unwrap_or(1).max(1);
            let worker = (self.worker % workers as usize) as u16;
            let (peer, answer) = self
                .directory
                .connect_async(cx.ep, backup, worker)
                .map_err(|e| e.to_string())?;
            dial.rpc = Some((peer, answer));
        }
        Ok(dial)
    }

    /// Collect answers; returns the links completed and the dials that failed.
    fn poll(&mut self, cx: &mut ReplCtx<'_, N>) -> Vec<(NodeId, Result<Link<N>, String>)> {
        let mut out = Vec::new();
        let now = cx.now_ns;
        let mut finished = Vec::new();
        for (&backup, dial) in &mut self.dials {
            let mut failure = None;
            if let Some((qp, answer)) = dial.qp.take() {
                match answer.try_recv() {
                    Ok(Ok(a)) => dial.qp_done = Some((qp, a)),
                    Ok(Err(why)) => failure = Some(why),
                    Err(_) => dial.qp = Some((qp, answer)),
                }
            }
            if let Some((peer, answer)) = dial.rpc.take() {
                match answer.try_recv() {
                    Ok(Ok(a)) => match cx.ep.connect(peer, a.qp) {
                        Ok(()) => dial.rpc_done = Some(peer),
                        Err(e) => failure = Some(e.to_string()),
                    },
                    Ok(Err(why)) => failure = Some(why),
                    Err(_) => dial.rpc = Some((peer, answer)),
                }
            }
            if failure.is_none() && now.saturating_sub(dial.started_ns) > DIAL_TIMEOUT_NS {
                failure = Some("no answer in time".into());
            }
            if let Some(why) = failure {
                finished.push(backup);
                out.push((backup, Err(why)));
            } else if dial.qp.is_none() && dial.rpc.is_none() {
                finished.push(backup);
            }
        }
        for backup in finished {
            let dial = self.dials.remove(&backup).expect("a dial");
            if out.iter().any(|(b, r)| *b == backup && r.is_err()) {
                self.not_before_ns.insert(backup, now + REDIAL_NS);
                abandon(cx, dial);
                continue;
            }
            out.push((backup, self.link(cx, backup, dial)));
        }
        out
    }

    /// The link of a dial whose every answer arrived.
    fn link(
        &self,
        cx: &mut ReplCtx<'_, N>,
        backup: NodeId,
        dial: Dial<N>,
    ) -> Result<Link<N>, String> {
        let rpc = dial.rpc_done;
        let link = self.make_link(backup, dial);
        if link.is_err() {
            if let Some(peer) = rpc {
                cx.ep.close(peer);
            }
        }
        link
    }

    fn make_link(&self, backup: NodeId, dial: Dial<N>) -> Result<Link<N>, String> {
        link(
            self.strategy,
            backup,
            dial.qp_done,
            dial.rpc_done,
            self.mtu_bytes,
            &self.shared_logs,
        )
    }
}

/// The link of `strategy` to `backup` from the parts set up for it: the
/// sender's queue pair and the service's answer (connected here), if the
/// strategy's path has one ([`Strategy::path_service`]), and the RPC peer, if
/// it needs one ([`Strategy::path_needs_rpc`]). The dialer makes it from what a
/// backup's process answered; the in-process cluster from what its servers
/// answered while it was built.
pub fn link<N: Nic>(
    strategy: Strategy,
    backup: NodeId,
    qp: Option<(PathQp<N>, Accepted)>,
    rpc: Option<PeerId>,
    mtu_bytes: usize,
    shared_logs: &SharedLogs,
) -> Result<Link<N>, String> {
    let kind = match strategy.backup_side() {
        BackupSide::RedoRing => {
            let (end, a) = qp.ok_or("no redo ring answered")?;
            let PathQp::Drpc(mut sender) = end else {
                return Err("a raw queue pair where a durable-RPC sender was needed".into());
            };
            let offer = super::redo::decode_offer(&a.private, backup, mtu_bytes)?;
            sender.connect(&offer).map_err(|e| e.to_string())?;
            LinkKind::Drpc(sender)
        }
        BackupSide::Receiver => {
            let (qp, a) = qp.ok_or("no Rowan receiver answered")?;
            let qp = qp.raw()?;
            qp.connect(a.qp).map_err(|e| e.to_string())?;
            LinkKind::Rowan(RowanSender::new(qp, mtu_bytes))
        }
        BackupSide::Appender => LinkKind::Rpc(rpc.ok_or("no worker answered")?),
        BackupSide::RemoteLog => {
            let (qp, a) = qp.ok_or("no remote log answered")?;
            let qp = qp.raw()?;
            let (region, epoch) = decode_log_answer(&a.private, backup)?;
            let peer = rpc.ok_or("no worker answered")?;
            // Checked before the queue pair is connected: a stale answer's
            // path writes nothing.
            let shared = if strategy == Strategy::Share {
                Some(shared_logs.lock().log_for(backup, epoch)?)
            } else {
                None
            };
            qp.connect(a.qp).map_err(|e| e.to_string())?;
            let target = RemoteLogTarget {
                qp,
                region,
                peer,
                log: epoch.log,
            };
            match shared {
                Some(log) => LinkKind::Shared(log, target),
                None => LinkKind::RemoteLog(target),
            }
        }
    };
    Ok(Link(kind))
}

/// Give back what a failed dial holds: its queue pair, its RPC peer's slot.
fn abandon<N: Nic>(cx: &mut ReplCtx<'_, N>, dial: Dial<N>) {
    for qp in dial
        .qp
        .map(|(q, _)| q)
        .into_iter()
        .chain(dial.qp_done.map(|(q, _)| q))
    {
        qp.close();
    }
    for peer in dial.rpc.map(|(p, _)| p).into_iter().chain(dial.rpc_done) {
        cx.ep.close(peer);
    }
}

/// A worker's replicator with connections made on demand ([`Dialer`]).
pub struct OnDemand<N: Nic> {
    inner: Box<dyn Replicator<N>>,
    dialer: Dialer<N>,
    /// Entries that found no connection: failed on the next tick.
    refused: Vec<(u64, String)>,
}

impl<N: Nic> OnDemand<N> {
    pub(crate) fn new(inner: Box<dyn Replicator<N>>, dialer: Dialer<N>) -> Self {
        OnDemand {
            inner,
            dialer,
            refused: Vec::new(),
        }
    }
}

impl<N: Nic> Replicator<N> for OnDemand<N> {
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64) {
        if self.inner.connected(backup) {
            self.inner.replicate(cx, backup, entry, token);
        } else {
            let why = self.dialer.start(cx, backup);
            self.refused.push((token, why));
        }
    }

    fn on_completion(&mut self, cx: &mut ReplCtx<'_, N>, c: &Completion, out: &mut Outcomes) {
        self.inner.on_completion(cx, c, out);
    }

    fn on_response(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        request_id: u64,
        response: &Response<'_>,
        out: &mut Outcomes,
    ) {
        self.inner.on_response(cx, peer, request_id, response, out);
    }

    fn on_send_failed(&mut self, cx: &mut ReplCtx<'_, N>, peer: PeerId, out: &mut Outcomes) {
        self.inner.on_send_failed(cx, peer, out);
    }

    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool {
        let mut did = !self.refused.is_empty();
        out.failed.append(&mut self.refused);
        if !self.dialer.dials.is_empty() {
            for (backup, link) in self.dialer.poll(cx) {
                did = true;
                match link {
                    Ok(link) => {
                        tracing::info!(%backup, "replication path connected");
                        self.inner.add(backup, link);
                    }
                    Err(why) => {
                        tracing::warn!(%backup, why, "replication path not connected")
                    }
                }
            }
        }
        self.inner.tick(cx, out) | did
    }

    fn connected(&self, backup: NodeId) -> bool {
        self.inner.connected(backup)
    }

    fn add(&mut self, backup: NodeId, link: Link<N>) {
        self.inner.add(backup, link);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two shared logs never write under one epoch: the workers of a server
    /// share the log of the epoch the backup answers with, move to a new one
    /// when it answers with another, and refuse an answer of an epoch they
    /// moved on from (a dial answered before the backup ended that log, but
    /// handled late), which would otherwise make the ended log current again.
    #[test]
    fn a_shared_log_is_taken_per_epoch_and_an_ended_epoch_is_refused() {
        let b = NodeId(2);
        let (e1, e2) = (
            LogEpoch { backup: 9, log: 1 },
            LogEpoch { backup: 9, log: 2 },
        );
        let mut set = SharedLogSet::default();
        let first = set.log_for(b, e1).unwrap();
        assert!(Arc::ptr_eq(&first, &set.log_for(b, e1).unwrap()));
        let second = set.log_for(b, e2).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        let Err(e) = set.log_for(b, e1) else {
            panic!("an ended epoch's log made current again")
        };
        assert!(e.contains("log 1 at n2 has ended"), "{e}");
        assert!(Arc::ptr_eq(&second, &set.log_for(b, e2).unwrap()));
        // Another backup's logs are its own.
        assert!(set.log_for(NodeId(3), e1).is_ok());
    }
}
