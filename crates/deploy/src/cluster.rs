//! The in-process cluster: servers, the configuration manager and the wiring
//! between them on one `LoopbackFabric`, run by one executor. This is the embedded
//! default (`rowankv demo`), the vehicle of the end-to-end tests, and the
//! like-for-like setting of `rowankv bench ycsb`.
//!
//! Wiring that a deployment does through a connection manager is done here
//! directly, once, before the roles start: every worker's replication queue pairs
//! to every other server (Rowan: to the backup's receiver; WRITE strategies: to a
//! passive queue pair on the backup, plus an RPC connection for segment grants;
//! `rpc`: an RPC connection to the backup's worker of the same index modulo its
//! worker count). Clients connect at run time through the [`Directory`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rowankv_cm::role::{CmStats, CmTask, Joins};
use rowankv_cm::{ConfigManager, CoordStore, EmbeddedStore, StoreSource};
use rowankv_engine::{Engine, EngineConfig};
use rowankv_fabric::{Fabric, FaultInjector, LoopbackFabric, LoopbackNic, QpAddr, WireModel};
use rowankv_pmem::{MediaModelConfig, MediaStats, Medium, Pool, PoolOptions};
use rowankv_rpc::directory::{Accepted, Directory};
use rowankv_rpc::endpoint::{connect_pair, Endpoint};
use rowankv_server::control::CM_PORT;
use rowankv_server::events::EventLog;
use rowankv_server::node::{assemble, on_demand, replication_qp_depth, roles, ServerSpec};
use rowankv_server::replication::{link, PathQp, Replicator, SharedLogs, Strategy};
use rowankv_server::runtime::{Executor, Placement, Task};
use rowankv_server::server::{ServerSettings, ServerShared};
use rowankv_server::services::{encode_path_request, PathKey, ReplicationServices};
use rowankv_types::{Clock, ManualClock, NodeId, SegmentId, SystemClock};
use rowankv_wire::config::{Config, ConfigSource, Member};

/// Clients attach to the fabric as nodes from this id on.
pub const CLIENT_NODE_BASE: u32 = 1000;

/// Everything that shapes an in-process cluster.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub cluster_id: u64,
    pub servers: usize,
    pub shards_per_server: u16,
    pub replication_factor: u8,
    pub strategy: Strategy,
    pub settings: ServerSettings,
    /// Pool size per server.
    pub pool_bytes: usize,
    pub segment_bytes: usize,
    pub media_model: Option<MediaModelConfig>,
    /// Track unpersisted lines (for power-failure tests).
    pub crash_sim: bool,
    /// Pools as files here (medium `emulated`); `None`: anonymous pools.
    pub dir: Option<PathBuf>,
    pub placement: Placement,
    pub keys_per_shard_expected: usize,
    /// Configuration managers: one active, the others standing by.
    pub cms: usize,
    /// The loopback fabric's wire and NIC timing model (`docs/wire-model.md`);
    /// `None`: requests are carried out when posted.
    pub wire_model: Option<WireModel>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            cluster_id: 0x526f_7761_6e4b_5601,
            servers: 3,
            shards_per_server: 48,
            replication_factor: 3,
            strategy: Strategy::Rowan,
            settings: ServerSettings::default(),
            pool_bytes: 512 << 20,
            segment_bytes: 4 << 20,
            media_model: None,
            crash_sim: false,
            dir: None,
            placement: Placement::Shared { threads: 2 },
            keys_per_shard_expected: 4096,
            cms: 2,
            wire_model: None,
        }
    }
}

/// Errors of building a cluster (defined with the server's assembly, which
/// returns them too).
pub use rowankv_server::node::ClusterError;

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> ClusterError + '_ {
    move |e| ClusterError(format!("{what}: {e}"))
}

/// The cluster's fabric, with its wire model if it has one.
fn loopback(
    config: &ClusterConfig,
    clock: &Arc<dyn Clock>,
) -> Result<LoopbackFabric, ClusterError> {
    match config.wire_model {
        Some(m) => {
            LoopbackFabric::with_clock_and_model(clock.clone(), m).map_err(err("wire model"))
        }
        None => Ok(LoopbackFabric::with_clock(clock.clone())),
    }
}

/// The CMs' nodes on the fabric: `CM_NODE_BASE + j`.
pub const CM_NODE_BASE: u32 = 900;

/// Who runs a task: the simulator pauses, crashes and restarts by owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    Server(NodeId),
    Cm(NodeId),
}

/// A recovered server for a cold start: its engine (from `Engine::open`) and the
/// segments recovery closed.
pub struct Recovered {
    pub node: NodeId,
    pub engine: Arc<Engine>,
    pub closed_segments: Vec<SegmentId>,
}

/// A cluster's parts, wired, before its roles run: what [`Cluster::start`] hands
/// to an executor and what the simulator steps itself.
pub struct Parts {
    pub fabric: LoopbackFabric,
    pub store: Arc<dyn CoordStore>,
    pub source: Arc<dyn ConfigSource>,
    pub directory: Directory,
    pub servers: Vec<Arc<ServerShared<LoopbackNic>>>,
    pub nics: Vec<LoopbackNic>,
    pub tasks: Vec<(Owner, Box<dyn Task>)>,
    /// Per CM: set to crash it.
    pub cm_crash: Vec<(NodeId, Arc<AtomicBool>)>,
    /// Per CM, in the order of `cm_crash`: what a CM process's join desk
    /// shares with its role (the simulator's join desk fills `joins`).
    pub cm_desks: Vec<CmDesk>,
    pub events: Arc<EventLog>,
}

/// What a CM's role shares with the join desk beside it in a CM process
/// (`crate::cm`): the servers to add ([`CmTask::with_joins`]: the active CM's
/// role adds them) and the counters that say whether the CM is the active one
/// ([`CmTask::with_stats`]). In process nothing fills `joins` but the
/// simulator's join desk. A CM restarted after a crash gets new ones: a join
/// queued to the crashed one is lost, as with a CM process.
#[derive(Clone, Default)]
pub struct CmDesk {
    pub joins: Joins,
    pub stats: Arc<CmStats>,
}

/// A running in-process cluster.
pub struct Cluster {
    config: ClusterConfig,
    clock: Arc<dyn Clock>,
    parts: Parts,
    view: Arc<ConfigManager>,
    executor: Option<Executor>,
    next_client: u32,
}

impl Cluster {
    /// Build and start a cluster.
    pub fn start(config: ClusterConfig) -> Result<Cluster, ClusterError> {
        if let Placement::Modelled(m) = config.placement {
            m.check().map_err(ClusterError)?;
        }
        // On modelled time the executor moves a manual clock and drives the
        // fabric itself (`docs/cpu-model.md`).
        let manual = matches!(config.placement, Placement::Modelled(_)).then(ManualClock::new);
        let clock: Arc<dyn Clock> = match &manual {
            Some(m) => m.clone(),
            None => SystemClock::new(),
        };
        let store: Arc<dyn CoordStore> = match &config.dir {
            Some(d) => Arc::new(
                EmbeddedStore::open(d.join("coordination.json"), clock.clone())
                    .map_err(err("coordination store"))?,
            ),
            None => Arc::new(EmbeddedStore::in_memory(clock.clone())),
        };
        let fabric = match &manual {
            Some(_) => LoopbackFabric::driven(
                clock.clone(),
                config.wire_model.unwrap_or(WireModel::CONNECTX5),
            )
            .map_err(err("wire model"))?,
            None => loopback(&config, &clock)?,
        };
        let parts = build(&config, fabric, store, None, Arc::new(EventLog::new()))?;
        Self::run(config, clock, manual, parts)
    }

    /// Start a cluster from recovered servers (cold start after a power failure
    /// of every server, §4.7): the configuration comes from `store`, every
    /// primary makes its shards' replicas agree before serving them.
    pub fn recover(
        config: ClusterConfig,
        store: Arc<dyn CoordStore>,
        recovered: Vec<Recovered>,
    ) -> Result<Cluster, ClusterError> {
        let clock: Arc<dyn Clock> = SystemClock::new();
        let fabric = loopback(&config, &clock)?;
        let events = Arc::new(EventLog::new());
        let parts = build(&config, fabric, store, Some(recovered), events)?;
        Self::run(config, clock, None, parts)
    }

    fn run(
        config: ClusterConfig,
        clock: Arc<dyn Clock>,
        manual: Option<Arc<ManualClock>>,
        mut parts: Parts,
    ) -> Result<Cluster, ClusterError> {
        let view = Arc::new(ConfigManager::open(parts.store.clone()).map_err(err("CM"))?);
        let now = clock.now_ns();
        for s in &parts.servers {
            s.extend_lease(now + s.settings.failover.lease_ns);
        }
        let mut executor = match (config.placement, manual) {
            (Placement::Modelled(model), Some(manual)) => {
                let fabric = parts.fabric.clone();
                Executor::modelled(model, manual, Box::new(move || fabric.progress_due()))
            }
            (Placement::Modelled(_), None) => {
                return Err(ClusterError(
                    "a cold start on modelled time is not supported: recover on real time".into(),
                ))
            }
            (placement, _) => Executor::new(placement, clock.clone()),
        };
        for (_, t) in parts.tasks.drain(..) {
            executor.spawn(t);
        }
        Ok(Cluster {
            config,
            clock,
            parts,
            view,
            executor: Some(executor),
            next_client: 0,
        })
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn fabric(&self) -> &LoopbackFabric {
        &self.parts.fabric
    }

    pub fn directory(&self) -> &Directory {
        &self.parts.directory
    }

    /// A configuration manager on the cluster's coordination store, reloaded:
    /// the configuration it holds is the latest stored one.
    pub fn cm(&self) -> &Arc<ConfigManager> {
        let _ = self.view.reload();
        &self.view
    }

    /// The coordination store.
    pub fn store(&self) -> &Arc<dyn CoordStore> {
        &self.parts.store
    }

    /// What clients consult: the configuration as the store holds it.
    pub fn config_source(&self) -> Arc<dyn ConfigSource> {
        self.parts.source.clone()
    }

    pub fn servers(&self) -> &[Arc<ServerShared<LoopbackNic>>] {
        &self.parts.servers
    }

    /// The failover timeline.
    pub fn events(&self) -> &Arc<EventLog> {
        &self.parts.events
    }

    /// A NIC for a new client node.
    pub fn attach_client(&mut self) -> Result<LoopbackNic, ClusterError> {
        let id = NodeId(CLIENT_NODE_BASE + self.next_client);
        self.next_client += 1;
        self.parts
            .fabric
            .attach(id)
            .map_err(err("attaching a client"))
    }

    /// Server `i`'s NIC: another process on that server's machine (tests use it to
    /// talk to peers over a connection that really comes from that server).
    pub fn server_nic(&self, i: usize) -> LoopbackNic {
        self.parts.nics[i].clone()
    }

    /// Run another task (a load generator) on the cluster's executor.
    pub fn spawn(&mut self, task: Box<dyn Task>) {
        if let Some(ex) = &mut self.executor {
            ex.spawn(task);
        }
    }

    /// Kill server `i` as a machine dies: its NIC leaves the fabric (peers'
    /// operations on it fail), nobody can connect to it, its roles stop.
    pub fn kill_server(&self, i: usize) {
        let s = &self.parts.servers[i];
        self.parts.fabric.crash_node(s.node);
        self.parts.directory.unregister_node(s.node);
        s.stop();
    }

    /// Crash CM `j` (its lease in the store runs out; a standby takes over).
    pub fn kill_cm(&self, j: usize) {
        if let Some((node, crashed)) = self.parts.cm_crash.get(j) {
            crashed.store(true, Ordering::Release);
            self.parts.fabric.crash_node(*node);
            self.parts.directory.unregister_node(*node);
        }
    }

    /// Media counters of every server's pool (`None` without a media model).
    pub fn media_stats(&self) -> Vec<Option<MediaStats>> {
        self.parts
            .servers
            .iter()
            .map(|s| s.engine.pool().media().map(|m| m.stats()))
            .collect()
    }

    /// Write back every write-combining buffer (end of a measurement).
    pub fn flush_media(&self) {
        for s in &self.parts.servers {
            if let Some(m) = s.engine.pool().media() {
                m.flush_buffers();
            }
        }
    }

    /// Digest everything every backup holds, used or still being filled, for
    /// every shard: what a quiescent cluster's backups' indexes then hold is
    /// everything replicated to them. Call with no writes in flight.
    pub fn digest_everything(&self) -> Result<usize, ClusterError> {
        let mut segments = 0;
        for s in &self.parts.servers {
            if s.stopped() {
                continue;
            }
            // `drpc`: what the redo rings hold goes to the b-log first.
            s.drain_redo().map_err(err("draining the redo rings"))?;
            for d in 0..s.settings.blog.digest_count {
                while s.blog.digest_step(d).map_err(err("digest"))? > 0 {}
            }
            let mut todo: Vec<SegmentId> = s.blog.pending_segments();
            todo.extend(s.blog.sealed_segments());
            todo.extend(s.blog.receiver_heads());
            todo.extend(s.granted_segments().into_iter().map(SegmentId));
            todo.extend(s.engine.backup_log_heads());
            for seg in todo {
                s.blog.digest_now(seg).map_err(err("digest"))?;
                segments += 1;
            }
        }
        Ok(segments)
    }

    /// Stop every role and wait for the executor's threads.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        for s in &self.parts.servers {
            s.stop();
        }
        for (_, c) in &self.parts.cm_crash {
            c.store(true, Ordering::Release);
        }
        if let Some(ex) = self.executor.take() {
            ex.stop();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Build a cluster's parts on `fabric` and `store`: pools and engines (or the
/// `recovered` ones), the configuration (bootstrapped, or the stored one for a
/// cold start), the wiring between servers, and every role as a task.
pub fn build(
    config: &ClusterConfig,
    fabric: LoopbackFabric,
    store: Arc<dyn CoordStore>,
    recovered: Option<Vec<Recovered>>,
    events: Arc<EventLog>,
) -> Result<Parts, ClusterError> {
    let s = &config.settings;
    if config.servers == 0 || s.workers == 0 {
        return Err(ClusterError("servers and workers must be positive".into()));
    }
    let cluster_config = match &recovered {
        None => {
            let members: Vec<Member> = (0..config.servers)
                .map(|i| Member {
                    added: 0,
                    node: NodeId(i as u32),
                    workers: s.workers as u16,
                    address: None,
                    resp: None,
                })
                .collect();
            let initial = Config::initial(
                config.cluster_id,
                &members,
                config.shards_per_server,
                config.replication_factor,
            )
            .map_err(err("configuration"))?;
            ConfigManager::bootstrap(store.clone(), initial)
                .map_err(err("CM"))?
                .current()
        }
        Some(_) => ConfigManager::open(store.clone())
            .map_err(err("reading the stored configuration"))?
            .current(),
    };
    let source: Arc<dyn ConfigSource> = Arc::new(StoreSource::new(store.clone()));
    let nodes: Vec<NodeId> = cluster_config.members.iter().map(|m| m.node).collect();
    let n = nodes.len();
    let mut recovered: Option<BTreeMap<NodeId, Recovered>> =
        recovered.map(|v| v.into_iter().map(|r| (r.node, r)).collect());

    let directory = Directory::new();
    let mut nics = Vec::new();
    let mut servers = Vec::new();
    let mut services = Vec::new();
    for &node in &nodes {
        let nic = fabric.attach(node).map_err(err("attaching a server"))?;
        let (engine, open) = match &mut recovered {
            Some(r) => {
                let r = r
                    .remove(&node)
                    .ok_or_else(|| ClusterError(format!("no recovered pool for member {node}")))?;
                (r.engine, Some(r.closed_segments))
            }
            None => {
                let mut opts = PoolOptions::new(Medium::Emulated, config.pool_bytes);
                opts.media_model = config.media_model.clone();
                opts.crash_sim = config.crash_sim;
                let pool = match &config.dir {
                    Some(d) => Pool::create(&d.join(format!("server-{}.pool", node.0)), opts),
                    None => Pool::anonymous(config.pool_bytes, opts),
                }
                .map_err(err("pool"))?;
                let engine = Engine::create(
                    pool,
                    EngineConfig {
                        segment_size_bytes: config.segment_bytes,
                        shard_count: cluster_config.shard_count(),
                        workers: s.workers,
                        cleaners: s.cleaners,
                        keys_per_shard_expected: config.keys_per_shard_expected,
                        clock: fabric.clock(),
                        clean_grace: std::time::Duration::from_nanos(s.clean_grace_ns),
                        reuse_newest_first: s.reuse_newest_first,
                        unsafe_commit_unsettled_tlog_segments: s
                            .unsafe_commit_unsettled_tlog_segments,
                        // `drpc`: a ring per sending worker of every other
                        // server, and spares (a removed server's rings are
                        // freed, a re-dial takes its worker's again).
                        reserved_tail_bytes: config.strategy.reserved_pool_bytes(
                            EngineConfig::default().mtu_bytes,
                            (config.servers * s.workers + 4).min(256) as u32,
                        ),
                        ..EngineConfig::default()
                    },
                )
                .map_err(err("engine"))?;
                (Arc::new(engine), None)
            }
        };
        // Every server's replication paths' receiving side is registered with
        // the directory: senders connect through it as another process would.
        let a = assemble(
            ServerSpec {
                node,
                nic,
                engine,
                strategy: config.strategy,
                settings: s.clone(),
                config: cluster_config.clone(),
                source: source.clone(),
                recovered: open,
                events: events.clone(),
                clock: fabric.clock(),
            },
            &directory,
        )?;
        servers.push(a.shared);
        nics.push(a.nic);
        services.push(a.services);
    }

    let mut eps: Vec<Vec<Option<Endpoint<LoopbackNic>>>> = Vec::new();
    for nic in &nics {
        let mut row = Vec::new();
        for _ in 0..s.workers {
            row.push(Some(
                Endpoint::new(nic.clone(), s.endpoint.clone()).map_err(err("endpoint"))?,
            ));
        }
        eps.push(row);
    }
    // The `share` strategy's remote logs of each server, by backup.
    let shared_logs: Vec<SharedLogs> = (0..n).map(|_| SharedLogs::default()).collect();
    let qp_depth = replication_qp_depth(s);
    let strategy = config.strategy;
    let mut repls: Vec<Vec<Box<dyn Replicator<LoopbackNic>>>> = Vec::new();
    for a in 0..n {
        let mut row: Vec<Box<dyn Replicator<LoopbackNic>>> = Vec::new();
        let mtu = servers[a].engine.config().mtu_bytes;
        for w in 0..s.workers {
            // Every path of this worker to every other server, as the dialer of
            // a process sets it up (`rowankv_server::replication::link`), the
            // receiving servers answering at once.
            let mut repl = strategy.replicator::<LoopbackNic>(s, mtu);
            for b in (0..n).filter(|&b| b != a) {
                let rpc = if strategy.path_needs_rpc() {
                    let bw = w % s.workers;
                    let mut ea = eps[a][w].take().expect("endpoint");
                    let mut eb = eps[b][bw].take().expect("endpoint");
                    let (pa, _) =
                        connect_pair(&mut ea, &mut eb).map_err(err("connecting workers"))?;
                    eps[a][w] = Some(ea);
                    eps[b][bw] = Some(eb);
                    Some(pa)
                } else {
                    None
                };
                let qp = match strategy.path_service() {
                    Some(service) => {
                        let ep = eps[a][w].as_ref().expect("endpoint");
                        let qp = PathQp::new(strategy, &nics[a], ep.cq(), qp_depth)
                            .map_err(err("a replication queue pair"))?;
                        let accepted = connect_path(
                            &directory,
                            &mut services[b],
                            nodes[b],
                            service,
                            qp.addr(),
                            PathKey {
                                worker: w as u16,
                                incarnation: servers[a].incarnation,
                            },
                        )?;
                        Some((qp, accepted))
                    }
                    None => None,
                };
                let l = link(strategy, nodes[b], qp, rpc, mtu, &shared_logs[a])
                    .map_err(|e| ClusterError(format!("a path to {}: {e}", nodes[b])))?;
                repl.add(nodes[b], l);
            }
            row.push(repl);
        }
        repls.push(row);
    }

    let cm_nodes: Vec<NodeId> = (0..config.cms.max(1))
        .map(|j| NodeId(CM_NODE_BASE + j as u32))
        .collect();
    let mut tasks: Vec<(Owner, Box<dyn Task>)> = Vec::new();
    for ((a, row), services) in repls.into_iter().enumerate().zip(services) {
        let shared_logs = &shared_logs[a];
        let workers = row
            .into_iter()
            .enumerate()
            .map(|(w, repl)| {
                let ep = eps[a][w].take().expect("endpoint");
                (ep, on_demand(&servers[a], &directory, w, shared_logs, repl))
            })
            .collect();
        for t in roles(
            &servers[a],
            &nics[a],
            &directory,
            &cm_nodes,
            services,
            workers,
        )? {
            tasks.push((Owner::Server(nodes[a]), t));
        }
    }
    let mut cm_crash = Vec::new();
    let mut cm_desks = Vec::new();
    for &cm in &cm_nodes {
        let nic = fabric.attach(cm).map_err(err("attaching a CM"))?;
        let clock = s.role_clock.clone().unwrap_or_else(|| fabric.clock());
        let desk = CmDesk::default();
        let (task, crashed) = new_cm(cm, nic, &directory, &store, &events, s, clock, &desk)?;
        cm_crash.push((cm, crashed));
        cm_desks.push(desk);
        tasks.push((Owner::Cm(cm), task));
    }
    Ok(Parts {
        fabric,
        store,
        source,
        directory,
        servers,
        nics,
        tasks,
        cm_crash,
        cm_desks,
        events,
    })
}

/// Connect a sender's queue pair `from` to `service` on `node` through the
/// directory, the receiving server answering at once (no role runs yet).
fn connect_path(
    directory: &Directory,
    receiver: &mut ReplicationServices<LoopbackNic>,
    node: NodeId,
    service: u16,
    from: QpAddr,
    key: PathKey,
) -> Result<Accepted, ClusterError> {
    let reply = directory
        .request(node, service, from, encode_path_request(key))
        .map_err(|e| ClusterError(format!("connecting to service {service} of {node}: {e}")))?;
    receiver.serve();
    reply
        .try_recv()
        .map_err(|_| ClusterError(format!("service {service} of {node} did not answer")))?
        .map_err(|e| ClusterError(format!("service {service} of {node} refused: {e}")))
}

/// A CM's role on `nic` (a new CM, or one restarting after a crash: it starts
/// as a standby), sharing `desk` (its joins to add, its counters) with a join
/// desk. Returns the task and the flag that crashes it.
pub fn cm_task(
    node: NodeId,
    nic: LoopbackNic,
    parts: &Parts,
    settings: &ServerSettings,
    desk: &CmDesk,
) -> Result<(Box<dyn Task>, Arc<AtomicBool>), ClusterError> {
    new_cm(
        node,
        nic,
        &parts.directory,
        &parts.store,
        &parts.events,
        settings,
        settings
            .role_clock
            .clone()
            .unwrap_or_else(|| parts.fabric.clock()),
        desk,
    )
}

#[allow(clippy::too_many_arguments)]
fn new_cm(
    node: NodeId,
    nic: LoopbackNic,
    directory: &Directory,
    store: &Arc<dyn CoordStore>,
    events: &Arc<EventLog>,
    settings: &ServerSettings,
    clock: Arc<dyn Clock>,
    desk: &CmDesk,
) -> Result<(Box<dyn Task>, Arc<AtomicBool>), ClusterError> {
    let ep = Endpoint::new(nic, settings.endpoint.clone()).map_err(err("endpoint"))?;
    let acceptor = directory.register(node, CM_PORT);
    let manager = Arc::new(ConfigManager::open(store.clone()).map_err(err("CM"))?);
    let crashed = Arc::new(AtomicBool::new(false));
    let task = CmTask::new(
        node,
        manager,
        settings.failover.clone(),
        ep,
        acceptor,
        directory.clone(),
        events.clone(),
        crashed.clone(),
        clock,
    )
    .with_joins(desk.joins.clone())
    .with_stats(desk.stats.clone());
    Ok((Box::new(task), crashed))
}
