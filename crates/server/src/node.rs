//! One server, assembled on its NIC: the pieces the in-process cluster builds for
//! each of its servers and a `rowankv server` process builds for itself.
//!
//! [`assemble`] makes the server's shared state (backup log, configuration,
//! replication services registered with the directory); [`roles`] makes its roles
//! (workers, control, lease, digest, clean) as tasks. Replicators come either
//! connected (the in-process cluster wires every path before the roles run) or
//! empty; both are wrapped in [`OnDemand`], which connects through the
//! directory to any backup they have no connection to.

use std::sync::Arc;

use parking_lot::Mutex;

use rowankv_engine::{register_data_area, BackupLog, Engine};
use rowankv_fabric::{CqKind, Nic};
use rowankv_rpc::directory::Directory;
use rowankv_rpc::endpoint::Endpoint;
use rowankv_types::{Clock, NodeId, SegmentId};
use rowankv_wire::config::{Config, ConfigSource};

use crate::background::{CleanTask, DigestTask, RedoTask};
use crate::control::{ControlTask, CONTROL_PORT};
use crate::events::EventLog;
use crate::lease::LeaseTask;
use crate::replication::{
    BackupSide, Dialer, OnDemand, RedoRings, Replicator, SharedLogs, Strategy,
};
use crate::runtime::Task;
use crate::server::{ServerSettings, ServerShared};
use crate::services::{
    RemoteLog, ReplicationServices, DRPC_SERVICE, REMOTE_LOG_SERVICE, ROWAN_SERVICE,
};
use crate::worker::Worker;

/// Errors of building a cluster.
#[derive(Debug, thiserror::Error)]
#[error("starting the cluster: {0}")]
pub struct ClusterError(pub String);

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> ClusterError + '_ {
    move |e| ClusterError(format!("{what}: {e}"))
}

/// What makes one server.
pub struct ServerSpec<N: Nic> {
    pub node: NodeId,
    pub nic: N,
    pub engine: Arc<Engine>,
    pub strategy: Strategy,
    pub settings: ServerSettings,
    /// The configuration the server starts with.
    pub config: Arc<Config>,
    pub source: Arc<dyn ConfigSource>,
    /// The segments recovery closed, for a server recovered from its pool.
    pub recovered: Option<Vec<SegmentId>>,
    pub events: Arc<EventLog>,
    pub clock: Arc<dyn Clock>,
}

/// A server before its roles run.
pub struct Assembled<N: Nic> {
    pub shared: Arc<ServerShared<N>>,
    pub nic: N,
    pub services: ReplicationServices<N>,
}

/// A server's shared state, and its replication services registered with
/// `directory` (the Rowan receiver, or the remote log of the WRITE strategies).
pub fn assemble<N: Nic>(
    spec: ServerSpec<N>,
    directory: &Directory,
) -> Result<Assembled<N>, ClusterError> {
    let s = &spec.settings;
    let side = spec.strategy.backup_side();
    let blog = Arc::new(
        if side == BackupSide::Receiver {
            BackupLog::start(spec.engine.clone(), spec.nic.clone(), s.blog.clone())
        } else {
            BackupLog::passive(spec.engine.clone(), s.blog.clone())
        }
        .map_err(err("backup log"))?,
    );
    // The backups' ends of remote-log connections complete on their own queue
    // (WRITE strategies).
    let remote = if side == BackupSide::RemoteLog {
        let mr = register_data_area(&spec.engine, &spec.nic).map_err(err("remote logs"))?;
        let cq = spec
            .nic
            .create_cq(CqKind::Ring { capacity: 1024 })
            .map_err(err("passive CQ"))?;
        Some((mr.remote(), cq))
    } else {
        None
    };
    let shared = Arc::new(ServerShared::new(
        spec.node,
        spec.engine,
        blog,
        spec.strategy,
        spec.settings.clone(),
        spec.config,
        spec.source,
        spec.recovered,
        spec.events,
        spec.clock,
    ));
    let rowan =
        (side == BackupSide::Receiver).then(|| directory.register(spec.node, ROWAN_SERVICE));
    let remote_log = remote.map(|(region, cq)| {
        (
            directory.register(spec.node, REMOTE_LOG_SERVICE),
            RemoteLog { cq, region },
        )
    });
    let mut services =
        ReplicationServices::new(shared.clone(), spec.nic.clone(), rowan, remote_log);
    if side == BackupSide::RedoRing {
        // Before the server serves: recovery re-executes what the rings hold.
        let (mut rings, reexecuted) =
            RedoRings::open(shared.engine.clone(), shared.blog.clone(), spec.nic.clone())
                .map_err(|e| ClusterError(format!("redo rings: {e}")))?;
        // A fault site (the simulator): the b-log has no room for a request
        // now, so the deferral path runs in every drpc seed that turns it on.
        let weak = Arc::downgrade(&shared);
        rings.set_no_room_fault(Box::new(move || {
            weak.upgrade().is_some_and(|s| s.buggify("redo.no-room"))
        }));
        if reexecuted > 0 {
            tracing::info!(node = %spec.node, reexecuted, "redo rings recovered into the b-log");
        }
        if shared.redo.set(Mutex::new(rings)).is_err() {
            unreachable!("a new server's redo rings are set once");
        }
        services = services.with_redo(directory.register(spec.node, DRPC_SERVICE));
    }
    Ok(Assembled {
        shared,
        nic: spec.nic,
        services,
    })
}

/// Depth of a replication queue pair.
pub fn replication_qp_depth(settings: &ServerSettings) -> usize {
    4 * settings.inflight_max + 64
}

/// Wrap a worker's replicator so that it connects to backups it has no
/// connection to.
pub fn on_demand<N: Nic>(
    shared: &Arc<ServerShared<N>>,
    directory: &Directory,
    worker: usize,
    shared_logs: &SharedLogs,
    inner: Box<dyn Replicator<N>>,
) -> Box<dyn Replicator<N>> {
    let server = Arc::downgrade(shared);
    let workers_of = Arc::new(move |node: NodeId| {
        let s = server.upgrade()?;
        let c = s.config();
        c.members.iter().find(|m| m.node == node).map(|m| m.workers)
    });
    let dialer = Dialer::new(
        directory.clone(),
        shared.strategy,
        worker,
        shared.incarnation,
        shared.engine.config().mtu_bytes,
        replication_qp_depth(&shared.settings),
        shared_logs.clone(),
        workers_of,
    );
    Box::new(OnDemand::new(inner, dialer))
}

/// A server's roles as tasks: its workers (one per replicator and endpoint,
/// each registered in the directory under its index), the control role (which
/// serves `services`), the lease role, the digest and clean roles. `cms`: the
/// CMs' nodes as the directory reaches them.
pub fn roles<N: Nic>(
    shared: &Arc<ServerShared<N>>,
    nic: &N,
    directory: &Directory,
    cms: &[NodeId],
    services: ReplicationServices<N>,
    workers: Vec<(Endpoint<N>, Box<dyn Replicator<N>>)>,
) -> Result<Vec<Box<dyn Task>>, ClusterError> {
    let node = shared.node;
    let s = &shared.settings;
    let mut tasks: Vec<Box<dyn Task>> = Vec::new();
    for (w, (ep, repl)) in workers.into_iter().enumerate() {
        let acceptor = directory.register(node, w as u16);
        tasks.push(Box::new(Worker::new(shared.clone(), w, ep, acceptor, repl)));
    }
    let ep = Endpoint::new(nic.clone(), s.endpoint.clone()).map_err(err("endpoint"))?;
    let acceptor = directory.register(node, CONTROL_PORT);
    tasks.push(Box::new(ControlTask::new(
        shared.clone(),
        ep,
        acceptor,
        directory.clone(),
        cms.to_vec(),
        services,
    )));
    let ep = Endpoint::new(nic.clone(), s.endpoint.clone()).map_err(err("endpoint"))?;
    tasks.push(Box::new(LeaseTask::new(
        shared.clone(),
        ep,
        directory.clone(),
        cms.to_vec(),
    )));
    for d in 0..s.blog.digest_count {
        tasks.push(Box::new(DigestTask::new(shared.clone(), d)));
    }
    for c in 0..s.cleaners {
        tasks.push(Box::new(CleanTask::new(shared.clone(), c)));
    }
    if shared.redo.get().is_some() {
        tasks.push(Box::new(RedoTask::new(shared.clone())));
    }
    Ok(tasks)
}

/// The roles of a server whose replication connections are all made on
/// demand (a process).
pub fn roles_on_demand<N: Nic>(
    assembled: Assembled<N>,
    directory: &Directory,
    cms: &[NodeId],
) -> Result<Vec<Box<dyn Task>>, ClusterError> {
    let shared = assembled.shared;
    let s = &shared.settings;
    let shared_logs = SharedLogs::default();
    let mtu = shared.engine.config().mtu_bytes;
    let mut workers = Vec::new();
    for w in 0..s.workers {
        let ep =
            Endpoint::new(assembled.nic.clone(), s.endpoint.clone()).map_err(err("endpoint"))?;
        let inner = shared.strategy.replicator(s, mtu);
        workers.push((ep, on_demand(&shared, directory, w, &shared_logs, inner)));
    }
    roles(
        &shared,
        &assembled.nic,
        directory,
        cms,
        assembled.services,
        workers,
    )
}
