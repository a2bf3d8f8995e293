//! Replication strategies: one trait, six implementations, all writing the same
//! log-entry format (seed 000 §6.1 "Comparing targets").
//!
//! | strategy | primary side | backup side |
//! | --- | --- | --- |
//! | `rowan` | a persisted SEND per entry on a queue pair to each backup's Rowan receiver | one b-log per server, landed by the NIC (`BackupLog` with a receiver) |
//! | `rpc` | a `Replicate` RPC to one worker of each backup | that worker appends to its own per-thread b-log, then answers |
//! | `rwrite` | each worker owns a remote log on every other server and appends with persisted WRITEs (FaRM) | segments granted on request; digested once sealed |
//! | `batch` | `rwrite`, entries batched per backup until 256 B or 5 µs | as `rwrite` |
//! | `share` | one remote log per server pair, shared by the server's workers; space reserved with a local atomic | as `rwrite` |
//! | `drpc` | a WFlush durable RPC per entry into the backup's redo ring (seed 002): acknowledged once durable there | the redo role executes the ring into b-log 0, later (`redo.rs`) |
//!
//! Each strategy is described in one place, [`Strategy`]'s methods: its backup
//! side ([`BackupSide`]: what `node::assemble` sets up and which requests a
//! backup's workers take), the path a sender makes to each backup (a service's
//! queue pair, an RPC connection, or both; built by [`link`] for processes and
//! the in-process cluster alike) and its replicator. A new strategy adds its
//! variant, its rows there, and its replicator's module.
//!
//! A [`Replicator`] belongs to one worker. The worker hands it an entry and a
//! token per backup; the replicator reports the token in `acked` once the entry
//! is durable in that backup's log, or in `failed` if it cannot be.

mod dial;
pub mod redo;
mod rowan;
mod rpc;
mod rwrite;
mod segments;
mod share;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use rowankv_fabric::{Completion, Nic};
use rowankv_rpc::endpoint::{Endpoint, PeerId};
use rowankv_types::NodeId;
use rowankv_wire::frame::{Envelope, Response};

use crate::server::ServerSettings;
use crate::services::{DRPC_SERVICE, REMOTE_LOG_SERVICE, ROWAN_SERVICE};

pub(crate) use dial::Dialer;
pub use dial::OnDemand;
pub use dial::{link, PathQp};
pub use dial::{SharedLogSet, SharedLogs};
pub use redo::{DrpcReplicator, RedoRings};
pub use rowan::RowanReplicator;
pub use rpc::RpcReplicator;
pub use rwrite::BatchConfig;
pub use rwrite::{RemoteLogTarget, RwriteReplicator};
pub use share::{ShareReplicator, SharedLog};

/// The `wr_id` tag of replication work requests.
pub(crate) const WR_TAG_REPL: u64 = rowankv_rpc::endpoint::WR_TAG_OWNER_MIN;

/// How a cluster replicates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    Rowan,
    Rpc,
    Rwrite,
    Batch,
    Share,
    Drpc,
}

impl Strategy {
    pub const ALL: [Strategy; 6] = [
        Strategy::Rowan,
        Strategy::Rpc,
        Strategy::Rwrite,
        Strategy::Batch,
        Strategy::Share,
        Strategy::Drpc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Rowan => "rowan",
            Strategy::Rpc => "rpc",
            Strategy::Rwrite => "rwrite",
            Strategy::Batch => "batch",
            Strategy::Share => "share",
            Strategy::Drpc => "drpc",
        }
    }

    /// Whether backups receive one-sided WRITEs into granted segments.
    pub fn uses_remote_logs(self) -> bool {
        self.backup_side() == BackupSide::RemoteLog
    }

    // Both sides of each strategy are described here, and nowhere else: the
    // backup side (how entries reach a backup's log), the connection a sender
    // makes to each backup (`dial.rs` builds it, for processes and the
    // in-process cluster alike), and the replicator a worker runs.

    /// How entries reach a backup's log.
    pub fn backup_side(self) -> BackupSide {
        match self {
            Strategy::Rowan => BackupSide::Receiver,
            Strategy::Rpc => BackupSide::Appender,
            Strategy::Rwrite | Strategy::Batch | Strategy::Share => BackupSide::RemoteLog,
            Strategy::Drpc => BackupSide::RedoRing,
        }
    }

    /// The backup's connection-manager service a sender's queue pair is
    /// connected to (`None`: entries go in RPCs).
    pub fn path_service(self) -> Option<u16> {
        match self.backup_side() {
            BackupSide::Receiver => Some(ROWAN_SERVICE),
            BackupSide::Appender => None,
            BackupSide::RemoteLog => Some(REMOTE_LOG_SERVICE),
            BackupSide::RedoRing => Some(DRPC_SERVICE),
        }
    }

    /// Whether a sender also needs an RPC connection to one of the backup's
    /// workers (the entries themselves, or segment grants).
    pub fn path_needs_rpc(self) -> bool {
        matches!(
            self.backup_side(),
            BackupSide::Appender | BackupSide::RemoteLog
        )
    }

    /// Bytes a server's pool keeps out of its segments for this strategy
    /// (`EngineConfig::reserved_tail_bytes`): `drpc`'s redo rings, for
    /// `connections` sending workers and entries of `mtu_bytes`; 0 for the
    /// others.
    pub fn reserved_pool_bytes(self, mtu_bytes: usize, connections: u32) -> usize {
        match self.backup_side() {
            BackupSide::RedoRing => redo::redo_area_bytes(mtu_bytes, connections),
            _ => 0,
        }
    }

    /// A worker's replicator, with no connection yet: they are made on demand
    /// ([`OnDemand`]) or handed to it with [`Replicator::add`]. (A worker's
    /// remote logs are named by the ids its backups give its paths.)
    pub fn replicator<N: Nic>(
        self,
        settings: &ServerSettings,
        mtu_bytes: usize,
    ) -> Box<dyn Replicator<N>> {
        let timeout = settings.replicate_timeout();
        match self {
            Strategy::Rowan => Box::new(RowanReplicator::new(HashMap::new(), mtu_bytes)),
            Strategy::Rpc => Box::new(RpcReplicator::new(HashMap::new(), timeout)),
            Strategy::Share => Box::new(ShareReplicator::new(HashMap::new(), timeout)),
            Strategy::Batch => Box::new(RwriteReplicator::new(
                HashMap::new(),
                Some(settings.batch),
                timeout,
            )),
            Strategy::Rwrite => Box::new(RwriteReplicator::new(HashMap::new(), None, timeout)),
            Strategy::Drpc => Box::new(DrpcReplicator::new(mtu_bytes, timeout)),
        }
    }
}

/// How entries reach a backup's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupSide {
    /// The NIC lands SENDs in the server's one b-log through its Rowan
    /// receiver's shared receive queue, without the server's CPU (`rowan`).
    Receiver,
    /// A worker appends the entries of a `Replicate` RPC to its own b-log and
    /// answers (`rpc`).
    Appender,
    /// The sender WRITEs into segments the backup grants on request (`GrantSegment`),
    /// through a passive queue pair; sealed segments are digested (`rwrite`,
    /// `batch`, `share`).
    RemoteLog,
    /// The sender puts each entry into the backup's redo ring with a durable
    /// RPC; the backup's redo role appends it to a b-log later (`drpc`).
    RedoRing,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|x| x.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown strategy {s:?} (rowan, rpc, rwrite, batch, share, drpc)")
            })
    }
}

/// What a replicator may use of its worker.
pub struct ReplCtx<'a, N: Nic> {
    pub ep: &'a mut Endpoint<N>,
    /// Cluster id, term and sender for the RPCs it sends (request id is its own).
    pub env: Envelope,
    pub now_ns: u64,
}

/// Replication as one worker does it.
pub trait Replicator<N: Nic>: Send {
    /// Start making `entry` (whole encoded blocks) durable in `backup`'s log.
    fn replicate(&mut self, cx: &mut ReplCtx<'_, N>, backup: NodeId, entry: &[u8], token: u64);
    /// A completion of the worker's completion queue with the replication tag.
    fn on_completion(&mut self, cx: &mut ReplCtx<'_, N>, c: &Completion, out: &mut Outcomes);
    /// A response to one of the replicator's RPCs.
    fn on_response(
        &mut self,
        cx: &mut ReplCtx<'_, N>,
        peer: PeerId,
        request_id: u64,
        response: &Response<'_>,
        out: &mut Outcomes,
    );
    /// A SEND on `peer`'s connection failed: the endpoint reset it, and the
    /// requests outstanding on it will never be answered.
    fn on_send_failed(&mut self, _cx: &mut ReplCtx<'_, N>, _peer: PeerId, _out: &mut Outcomes) {}
    /// Timers and queued work (batch timeouts, entries waiting for a segment or a
    /// credit). Returns whether it did anything.
    fn tick(&mut self, cx: &mut ReplCtx<'_, N>, out: &mut Outcomes) -> bool;
    /// Whether it has a connection to `backup` (entries for a backup it has
    /// none to fail at once).
    fn connected(&self, backup: NodeId) -> bool;
    /// A connection to `backup`, made through the connection manager
    /// ([`OnDemand`]); it replaces any earlier one.
    fn add(&mut self, backup: NodeId, link: Link<N>);
}

/// A connection to one backup, of the kind the strategy uses.
pub struct Link<N: Nic>(pub(crate) LinkKind<N>);

pub(crate) enum LinkKind<N: Nic> {
    /// `rowan`: a queue pair connected to the backup's Rowan receiver.
    Rowan(rowankv_rowan::RowanSender<N::Qp>),
    /// `rpc`: a connection to one of the backup's workers.
    Rpc(PeerId),
    /// `rwrite`, `batch`: the backup's remote log and an RPC peer for grants.
    RemoteLog(RemoteLogTarget<N::Qp>),
    /// `share`: as `RemoteLog`, with the log the sending server's workers share.
    Shared(std::sync::Arc<SharedLog>, RemoteLogTarget<N::Qp>),
    /// `drpc`: a durable-RPC sender connected to the backup's redo ring.
    Drpc(Box<rowankv_drpc::Sender<N>>),
}

/// Whether a backup's connection failed and was reset, and has carried
/// nothing since. A second failure in that state gives the connection up: the
/// backup may have restarted, and its new process knows nothing of it; the
/// next entry for it dials anew ([`OnDemand`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Resets {
    qp: bool,
    rpc: bool,
}

impl Resets {
    /// The queue pair failed: `true` to reset it, `false` to give it up.
    pub fn qp_failed(&mut self) -> bool {
        !std::mem::replace(&mut self.qp, true)
    }
    /// The RPC connection failed (the endpoint reset it): `false` to give it up.
    pub fn rpc_failed(&mut self) -> bool {
        !std::mem::replace(&mut self.rpc, true)
    }
    /// A WRITE on the queue pair completed.
    pub fn qp_carried(&mut self) {
        self.qp = false;
    }
    /// An answer came on the RPC connection.
    pub fn rpc_answered(&mut self) {
        self.rpc = false;
    }
}

/// Tokens whose replication finished.
#[derive(Default)]
pub struct Outcomes {
    pub acked: Vec<u64>,
    pub failed: Vec<(u64, String)>,
}
