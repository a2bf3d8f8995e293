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

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use rowankv_cm::{ConfigManager, CoordStore, EmbeddedStore};
use rowankv_engine::{register_data_area, BackupLog, Engine, EngineConfig};
use rowankv_fabric::{CqKind, Fabric, LoopbackFabric, LoopbackNic, Nic, QueuePair};
use rowankv_pmem::{MediaModelConfig, MediaStats, Medium, Pool, PoolOptions};
use rowankv_rowan::RowanSender;
use rowankv_types::{Clock, NodeId, SegmentId, SystemClock};
use rowankv_wire::config::{Config, ConfigSource, Member};
use rowankv_wire::directory::Directory;
use rowankv_wire::endpoint::{connect_pair, Endpoint, PeerId};

use crate::background::{CleanTask, ControlTask, DigestTask};
use crate::replication::{
    RemoteLogTarget, Replicator, RowanReplicator, RpcReplicator, RwriteReplicator, ShareReplicator,
    SharedLog, Strategy,
};
use crate::runtime::{Executor, Placement, Task};
use crate::server::{ServerSettings, ServerShared};
use crate::worker::Worker;

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
        }
    }
}

/// Errors of building a cluster.
#[derive(Debug, thiserror::Error)]
#[error("starting the cluster: {0}")]
pub struct ClusterError(pub String);

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> ClusterError + '_ {
    move |e| ClusterError(format!("{what}: {e}"))
}

/// A running in-process cluster.
pub struct Cluster {
    config: ClusterConfig,
    fabric: LoopbackFabric,
    cm: Arc<ConfigManager>,
    directory: Directory,
    servers: Vec<Arc<ServerShared<LoopbackNic>>>,
    executor: Option<Executor>,
    next_client: u32,
    nics: Vec<LoopbackNic>,
    /// The backups' ends of remote-log connections, and their completion queues.
    _passive: (
        Vec<<LoopbackNic as Nic>::Qp>,
        Vec<Option<<LoopbackNic as Nic>::Cq>>,
    ),
}

impl Cluster {
    /// Build and start a cluster.
    pub fn start(config: ClusterConfig) -> Result<Cluster, ClusterError> {
        let clock: Arc<dyn Clock> = SystemClock::new();
        let fabric = LoopbackFabric::new();
        let s = &config.settings;
        let n = config.servers;
        if n == 0 || s.workers == 0 {
            return Err(ClusterError("servers and workers must be positive".into()));
        }
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                node: NodeId(i as u32),
                workers: s.workers as u16,
            })
            .collect();
        let initial = Config::initial(
            config.cluster_id,
            &members,
            config.shards_per_server,
            config.replication_factor,
        )
        .map_err(err("configuration"))?;
        let store: Arc<dyn CoordStore> = match &config.dir {
            Some(d) => Arc::new(
                EmbeddedStore::open(d.join("coordination.json"), clock.clone())
                    .map_err(err("coordination store"))?,
            ),
            None => Arc::new(EmbeddedStore::in_memory(clock.clone())),
        };
        let cm = Arc::new(ConfigManager::bootstrap(store, initial).map_err(err("CM"))?);
        let cluster_config = cm.current();
        let cm_source: Arc<dyn ConfigSource> = cm.clone();

        let mut nics = Vec::new();
        let mut servers = Vec::new();
        let mut regions = Vec::new();
        let mut passive_cqs = Vec::new();
        for i in 0..n {
            let node = NodeId(i as u32);
            let nic = fabric.attach(node).map_err(err("attaching a server"))?;
            let mut opts = PoolOptions::new(Medium::Emulated, config.pool_bytes);
            opts.media_model = config.media_model.clone();
            opts.crash_sim = config.crash_sim;
            let pool = match &config.dir {
                Some(d) => Pool::create(&d.join(format!("server-{i}.pool")), opts),
                None => Pool::anonymous(config.pool_bytes, opts),
            }
            .map_err(err("pool"))?;
            let engine = Arc::new(
                Engine::create(
                    pool,
                    EngineConfig {
                        segment_size_bytes: config.segment_bytes,
                        shard_count: cluster_config.shard_count(),
                        workers: s.workers,
                        cleaners: s.cleaners,
                        keys_per_shard_expected: config.keys_per_shard_expected,
                        ..EngineConfig::default()
                    },
                )
                .map_err(err("engine"))?,
            );
            let blog = Arc::new(
                if config.strategy == Strategy::Rowan {
                    BackupLog::start(engine.clone(), nic.clone(), s.blog.clone())
                } else {
                    BackupLog::passive(engine.clone(), s.blog.clone())
                }
                .map_err(err("backup log"))?,
            );
            if config.strategy.uses_remote_logs() {
                let mr = register_data_area(&engine, &nic).map_err(err("remote logs"))?;
                regions.push(Some(mr.remote()));
                passive_cqs.push(Some(
                    nic.create_cq(CqKind::Ring { capacity: 1024 })
                        .map_err(err("passive CQ"))?,
                ));
            } else {
                regions.push(None);
                passive_cqs.push(None);
            }
            servers.push(Arc::new(ServerShared::new(
                node,
                engine,
                blog,
                config.strategy,
                s.clone(),
                cluster_config.clone(),
                cm_source.clone(),
            )));
            nics.push(nic);
        }

        let directory = Directory::new();
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
        let shared_logs: Vec<HashMap<NodeId, Arc<SharedLog>>> = (0..n)
            .map(|a| {
                (0..n)
                    .filter(|&b| b != a)
                    .map(|b| (NodeId(b as u32), SharedLog::new()))
                    .collect()
            })
            .collect();
        let qp_depth = 4 * s.inflight_max + 64;
        let mut passive_qps = Vec::new();
        let mut repls: Vec<Vec<Box<dyn Replicator<LoopbackNic>>>> = Vec::new();
        for a in 0..n {
            let mut row: Vec<Box<dyn Replicator<LoopbackNic>>> = Vec::new();
            for w in 0..s.workers {
                // RPC peers of this worker at every other server.
                let mut peers: HashMap<NodeId, PeerId> = HashMap::new();
                if config.strategy != Strategy::Rowan {
                    for b in (0..n).filter(|&b| b != a) {
                        let bw = w % s.workers;
                        let mut ea = eps[a][w].take().expect("endpoint");
                        let mut eb = eps[b][bw].take().expect("endpoint");
                        let (pa, _) =
                            connect_pair(&mut ea, &mut eb).map_err(err("connecting workers"))?;
                        eps[a][w] = Some(ea);
                        eps[b][bw] = Some(eb);
                        peers.insert(NodeId(b as u32), pa);
                    }
                }
                let ep = eps[a][w].as_ref().expect("endpoint");
                let repl: Box<dyn Replicator<LoopbackNic>> = match config.strategy {
                    Strategy::Rowan => {
                        let mut senders = HashMap::new();
                        for b in (0..n).filter(|&b| b != a) {
                            let qp = nics[a]
                                .create_qp(ep.cq(), ep.cq(), None, qp_depth)
                                .map_err(err("Rowan QP"))?;
                            let remote = servers[b]
                                .blog
                                .accept(qp.addr())
                                .map_err(err("Rowan accept"))?;
                            qp.connect(remote).map_err(err("Rowan connect"))?;
                            let mtu = servers[a].engine.config().mtu_bytes;
                            senders.insert(NodeId(b as u32), RowanSender::new(qp, mtu));
                        }
                        let mtu = servers[a].engine.config().mtu_bytes;
                        Box::new(RowanReplicator::new(senders, mtu))
                    }
                    Strategy::Rpc => Box::new(RpcReplicator::new(peers)),
                    Strategy::Rwrite | Strategy::Batch | Strategy::Share => {
                        let mut targets = HashMap::new();
                        for b in (0..n).filter(|&b| b != a) {
                            let qp = nics[a]
                                .create_qp(ep.cq(), ep.cq(), None, qp_depth)
                                .map_err(err("WRITE QP"))?;
                            let cq = passive_cqs[b].as_ref().expect("passive CQ");
                            let target = nics[b]
                                .create_qp(cq, cq, None, 16)
                                .map_err(err("passive QP"))?;
                            qp.connect(target.addr()).map_err(err("connect"))?;
                            target.connect(qp.addr()).map_err(err("connect"))?;
                            // The backup's end lives as long as the cluster.
                            passive_qps.push(target);
                            let node = NodeId(b as u32);
                            targets.insert(
                                node,
                                RemoteLogTarget {
                                    qp,
                                    region: regions[b].expect("registered"),
                                    peer: peers[&node],
                                },
                            );
                        }
                        match config.strategy {
                            Strategy::Share => {
                                let logs = targets
                                    .into_iter()
                                    .map(|(node, t)| (node, (shared_logs[a][&node].clone(), t)))
                                    .collect();
                                Box::new(ShareReplicator::new(logs))
                            }
                            Strategy::Batch => {
                                Box::new(RwriteReplicator::new(w as u32, targets, Some(s.batch)))
                            }
                            _ => Box::new(RwriteReplicator::new(w as u32, targets, None)),
                        }
                    }
                };
                row.push(repl);
            }
            repls.push(row);
        }

        let mut executor = Executor::new(config.placement, clock.clone());
        for (a, row) in repls.into_iter().enumerate() {
            for (w, repl) in row.into_iter().enumerate() {
                let ep = eps[a][w].take().expect("endpoint");
                let acceptor = directory.register(NodeId(a as u32), w as u16);
                let worker = Worker::new(servers[a].clone(), w, ep, acceptor, repl);
                executor.spawn(Box::new(worker));
            }
            executor.spawn(Box::new(ControlTask::new(servers[a].clone())));
            for d in 0..s.blog.digest_count {
                executor.spawn(Box::new(DigestTask::new(servers[a].clone(), d)));
            }
            for c in 0..s.cleaners {
                executor.spawn(Box::new(CleanTask::new(servers[a].clone(), c)));
            }
        }
        Ok(Cluster {
            nics,
            _passive: (passive_qps, passive_cqs),
            config,
            fabric,
            cm,
            directory,
            servers,
            executor: Some(executor),
            next_client: 0,
        })
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    pub fn fabric(&self) -> &LoopbackFabric {
        &self.fabric
    }

    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    pub fn cm(&self) -> &Arc<ConfigManager> {
        &self.cm
    }

    pub fn config_source(&self) -> Arc<dyn ConfigSource> {
        self.cm.clone()
    }

    pub fn servers(&self) -> &[Arc<ServerShared<LoopbackNic>>] {
        &self.servers
    }

    /// A NIC for a new client node.
    pub fn attach_client(&mut self) -> Result<LoopbackNic, ClusterError> {
        let id = NodeId(CLIENT_NODE_BASE + self.next_client);
        self.next_client += 1;
        self.fabric.attach(id).map_err(err("attaching a client"))
    }

    /// Server `i`'s NIC: another process on that server's machine (tests use it to
    /// talk to peers over a connection that really comes from that server).
    pub fn server_nic(&self, i: usize) -> LoopbackNic {
        self.nics[i].clone()
    }

    /// Run another task (a load generator) on the cluster's executor.
    pub fn spawn(&mut self, task: Box<dyn Task>) {
        if let Some(ex) = &mut self.executor {
            ex.spawn(task);
        }
    }

    /// Media counters of every server's pool (`None` without a media model).
    pub fn media_stats(&self) -> Vec<Option<MediaStats>> {
        self.servers
            .iter()
            .map(|s| s.engine.pool().media().map(|m| m.stats()))
            .collect()
    }

    /// Write back every write-combining buffer (end of a measurement).
    pub fn flush_media(&self) {
        for s in &self.servers {
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
        for s in &self.servers {
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
        for s in &self.servers {
            s.stop();
        }
        if let Some(ex) = self.executor.take() {
            ex.stop();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &self.servers {
            s.stop();
        }
        if let Some(ex) = self.executor.take() {
            ex.stop();
        }
    }
}
