//! The CM's process (`rowankv cm --config FILE`).
//!
//! It opens the coordination store of its file, takes a node identity for
//! itself from it, attaches to the `tcp` fabric and starts its connection
//! manager on `listen`. Then, every few milliseconds until it is stopped:
//!
//! 1. it answers joins ([`crate::join`]): a new server gets an identity
//!    (`rowankv_cm::allocate_node`), a known one is recognised (its record's
//!    address updated if it moved), an identity this cluster never handed out
//!    is refused;
//! 2. while the store holds no configuration, it counts the servers that
//!    joined (through any CM: their records are in the store) and, once
//!    `bootstrap.servers` have, commits term 1 with them (their addresses in
//!    the configuration); a server that joined and died before that is in it
//!    too, and is failed over like any other;
//! 3. once a configuration is stored, it runs the CM's role
//!    (`rowankv_cm::role::CmTask`: leases, failover, re-replication,
//!    the configuration served to processes), on a thread of its own.
//!
//! Two CMs on one etcd: both answer joins before the first configuration and
//! a member's return (identities come from one counter in the store, so they
//! never collide); whichever stores the first configuration first wins the
//! bootstrap (the other finds it stored); one is active, the other stands by
//! and takes over when the active one's lease in the store runs out. A join
//! into a running cluster changes the configuration, so only the active CM
//! takes it: the standby answers [`STANDBY`] and the server asks the next CM
//! (a join kept in a standby's memory was never carried out).
//!
//! A server that joins a running cluster (a new server, or one restarted after
//! the CM removed it) is handed to the CM's role, which adds it as a member
//! and a joining backup of the shards short of replicas (`plan_join`); once
//! the primaries copied them to it, it is a full backup.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use rowankv_cm::role::{CmStats, CmTask, Joins, Leaves};
use rowankv_cm::{
    allocate_node, node_record, update_node_record, CmError, ConfigManager, CoordStore,
    EmbeddedStore, EtcdConfig, EtcdStore, NodeRecord,
};
use rowankv_fabric::QpAddr;
use rowankv_rpc::directory::{Accepted, Acceptor};
use rowankv_rpc::endpoint::Endpoint;
use rowankv_server::control::CM_PORT;
use rowankv_server::deploy::{CmDeployment, StoreFile};
use rowankv_server::{EventLog, Executor, FailoverSettings, Placement, ServerSettings};
use rowankv_types::{Clock, NodeId, QpNum, SystemClock};
use rowankv_wire::config::{Config, Member};

use crate::join::{JoinAnswer, JoinRequest, LeaveRequest, JOIN_SERVICE, LEAVE_SERVICE, LEFT};
use crate::metrics::CmMetrics;
use crate::{any_port, attach, host_of, perr, ProcessError};

/// The failover settings of a cluster whose server lease is `lease_ms`: renewed
/// ten times a lease, the CM's own lease in the store four server leases, and
/// servers given ten leases (at least 2 s) to start before a CM that becomes
/// active counts their leases.
pub fn failover_settings(lease_ms: u64) -> FailoverSettings {
    let lease_ns = lease_ms * 1_000_000;
    FailoverSettings {
        lease_ns,
        renew_ns: lease_ns / 10,
        cm_lease_ns: 4 * lease_ns,
        retry_ns: (lease_ns / 40).max(1_000_000),
        startup_grace_ns: (10 * lease_ns).max(2_000_000_000),
        ..FailoverSettings::default()
    }
}

/// Open the coordination store a CM file names.
pub fn open_store(
    store: &StoreFile,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn CoordStore>, ProcessError> {
    if let StoreFile::Embedded { path } = store {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(perr(&format!("creating {}", dir.display())))?;
        }
    }
    Ok(match store {
        StoreFile::Embedded { path } => Arc::new(
            EmbeddedStore::open(path, clock)
                .map_err(perr(&format!("the embedded store {}", path.display())))?,
        ),
        StoreFile::Etcd { endpoints, prefix } => Arc::new(
            EtcdStore::new(EtcdConfig::new(endpoints.clone(), prefix.clone()))
                .map_err(perr("etcd"))?,
        ),
    })
}

/// Servers that joined before the first configuration.
type Joined = BTreeMap<NodeId, Member>;

/// Answers joins.
struct JoinDesk {
    store: Arc<dyn CoordStore>,
    me: NodeId,
    answer: JoinAnswer,
    /// Servers to add to a running cluster (the CM's role takes them).
    joins: Joins,
    /// Servers to remove on purpose (the CM's role takes them).
    leaves: Leaves,
    /// Whether this CM is the active one (`CmStats::active`, kept by its role).
    stats: Arc<CmStats>,
}

/// How a standby CM's answer to a join into a running cluster begins: the
/// server asks the next CM (only the active one adds servers to the
/// configuration; a join the standby kept would never be carried out).
pub const STANDBY: &str = "standby: join: ";

/// How a CM's answer to a join begins when its coordination store failed: not
/// final either (the server asks the next CM, and again).
pub const UNAVAILABLE: &str = "unavailable: join: ";

fn store_error(e: CmError) -> String {
    format!("{UNAVAILABLE}the coordination store: {e}")
}

/// Whether a join of `node` (`None`: a new server) into the configuration a
/// join desk holds (`None`: none stored yet) is one the active CM's role must
/// carry out (hand it [`Joins`]): a running cluster's configuration that does
/// not hold it. The desk's configuration may be older than the role's (it is
/// read every 50 ms): a server removed a moment ago is answered as a member
/// that rejoined, and finds itself outside the configuration it then reads;
/// it asks again (`crate::join::MembershipWait`).
pub fn adds_a_member(config: Option<&Config>, node: Option<NodeId>) -> bool {
    match config {
        None => false,
        Some(c) => node.is_none_or(|n| c.member(n).is_none()),
    }
}

impl JoinDesk {
    fn serve(&mut self, acceptor: &Acceptor, config: Option<&Config>) {
        acceptor.serve_pending(|_from, private| {
            let request: JoinRequest = serde_json::from_slice(private)
                .map_err(|e| format!("refused: join: a malformed request: {e}"))?;
            let node = self.admit(&request, config).map_err(|e| {
                if e.starts_with(STANDBY) || e.starts_with(UNAVAILABLE) {
                    e
                } else {
                    format!("refused: join: {e}")
                }
            })?;
            let answer = JoinAnswer {
                node: node.0,
                added: adds_a_member(config, Some(node)),
                term: config.map_or(0, |c| c.term.0),
                ..self.answer.clone()
            };
            Ok(Accepted {
                qp: QpAddr {
                    node: self.me,
                    qpn: QpNum(0),
                },
                private: serde_json::to_vec(&answer).expect("an answer serializes"),
            })
        });
    }

    fn admit(&mut self, r: &JoinRequest, config: Option<&Config>) -> Result<NodeId, String> {
        rowankv_wire::config::check_host_port(&r.address)?;
        if r.workers == 0 {
            return Err("a server has at least one worker".into());
        }
        if let Some(resp) = &r.resp {
            rowankv_wire::config::check_host_port(resp)?;
        }
        // Joining a running cluster changes its configuration, which only the
        // active CM does; a member coming back (its identity still in the
        // configuration) and a join before the first configuration need no
        // change and are answered by either CM.
        if let Some(c) = config {
            let adds = adds_a_member(Some(c), r.node.map(NodeId));
            if adds && self.stats.active.load(Ordering::Relaxed) == 0 {
                return Err(format!(
                    "{STANDBY}this CM stands by; the active CM adds servers to the configuration of {}",
                    c.term
                ));
            }
        }
        let record = NodeRecord {
            kind: "server".into(),
            address: r.address.clone(),
            workers: r.workers,
            resp: r.resp.clone(),
            left: false,
        };
        let store = self.store.as_ref();
        let node = match r.node {
            Some(n) => {
                let node = NodeId(n);
                match node_record(store, node).map_err(store_error)? {
                    None => {
                        return Err(format!(
                            "{node} was never handed out by this cluster's CMs \
                             (a pool of another cluster, or a store that was reset)"
                        ))
                    }
                    Some(old) if old.left => {
                        return Err(format!(
                            "{LEFT}{node} left the cluster (rowankv leave); its pool may not \
                             serve again: remove the pool file to join as a new server"
                        ))
                    }
                    Some(old) if old.address != r.address || old.resp != r.resp => {
                        update_node_record(store, node, &record).map_err(store_error)?;
                    }
                    Some(_) => {}
                }
                node
            }
            None => {
                let above = config
                    .map(|c| c.members.iter().map(|m| m.node.0 + 1).max().unwrap_or(0))
                    .unwrap_or(0);
                allocate_node(store, &record, above).map_err(store_error)?
            }
        };
        match config {
            // Its record, in the store, counts it for the first configuration.
            None => tracing::info!(%node, address = %r.address, "a server joined"),
            Some(c) if !adds_a_member(config, Some(node)) => {
                tracing::info!(%node, term = %c.term, "a member rejoined");
            }
            Some(c) => {
                tracing::info!(%node, term = %c.term, "a server joined a running cluster");
                let mut joins = self.joins.lock();
                joins.retain(|m| m.node != node);
                joins.push(Member {
                    added: 0,
                    node,
                    workers: r.workers,
                    address: Some(r.address.clone()),
                    resp: r.resp.clone(),
                });
            }
        }
        Ok(node)
    }

    /// Answer `rowankv leave`: the server's record says it left (it may never
    /// join again), and the CM's role removes it.
    fn serve_leaves(&mut self, acceptor: &Acceptor, config: Option<&Config>) {
        acceptor.serve_pending(|_from, private| {
            let request: LeaveRequest = serde_json::from_slice(private)
                .map_err(|e| format!("refused: leave: a malformed request: {e}"))?;
            let node = NodeId(request.node);
            // Recorded only if it can be carried out now: a server marked as
            // having left never joins again, so a removal that cannot happen
            // (the last server, the only full copy of a shard) must not mark it.
            let config = config.ok_or("refused: leave: the cluster has no configuration yet")?;
            if config.member(node).is_none() {
                return Err(format!(
                    "refused: leave: {node} is not a member of the configuration of {}",
                    config.term
                ));
            }
            if config.members.len() == 1 {
                return Err(format!("refused: leave: {node} is the last server"));
            }
            rowankv_cm::plan_failover(config, &[node])
                .map_err(|e| format!("refused: leave: without {node}: {e}"))?;
            let store = self.store.as_ref();
            let mut record = match node_record(store, node).map_err(|e| e.to_string())? {
                Some(r) if r.kind == "server" => r,
                Some(r) => {
                    return Err(format!(
                        "refused: leave: {node} is a {}, not a server",
                        r.kind
                    ))
                }
                None => return Err(format!("refused: leave: {node} was never handed out")),
            };
            if !record.left {
                record.left = true;
                update_node_record(store, node, &record).map_err(|e| e.to_string())?;
            }
            tracing::info!(%node, "a server leaves on request");
            let mut leaves = self.leaves.lock();
            leaves.retain(|&n| n != node);
            leaves.push(node);
            Ok(Accepted {
                qp: QpAddr {
                    node: self.me,
                    qpn: QpNum(0),
                },
                private: private.to_vec(),
            })
        });
    }
}

/// Run a CM until `stop` is set.
pub fn run(dep: &CmDeployment, stop: Arc<AtomicBool>) -> Result<(), ProcessError> {
    let clock: Arc<dyn Clock> = SystemClock::new();
    let stats = Arc::new(CmStats::default());
    let _endpoint = dep
        .metrics
        .map(|listen| crate::metrics::start(listen, CmMetrics::registry(stats.clone()), "cm"))
        .transpose()?;
    let store = open_store(&dep.store, clock.clone())?;
    // The store may come up after the CM (etcd started alongside): wait for it.
    let record = NodeRecord {
        kind: "cm".into(),
        address: dep.advertise.clone(),
        workers: 0,
        resp: None,
        left: false,
    };
    let mut attempts = 0u32;
    let me = loop {
        match allocate_node(store.as_ref(), &record, 0) {
            Ok(me) => break me,
            Err(CmError::Store(e)) if !stop.load(Ordering::Acquire) => {
                if attempts.is_multiple_of(10) {
                    tracing::warn!(error = %e, "waiting for the coordination store");
                }
                attempts += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(ProcessError(format!("a node identity for this CM: {e}"))),
        }
    };
    let net = attach(
        dep.cluster_id,
        &dep.secret,
        me,
        dep.listen,
        dep.fabric_listen.unwrap_or_else(|| any_port(dep.listen)),
        host_of(&dep.advertise),
    )?;
    tracing::info!(
        %me, listen = %dep.listen, fabric = %net.fabric_address,
        "CM started"
    );
    // Servers are reached at the addresses their configuration gives.
    let members: Arc<RwLock<HashMap<NodeId, String>>> = Arc::default();
    let book = members.clone();
    net.directory
        .set_resolver(Arc::new(move |n| book.read().get(&n).cloned()));
    let joins = net.directory.register(me, JOIN_SERVICE);
    let mut desk = JoinDesk {
        store: store.clone(),
        me,
        answer: JoinAnswer {
            node: 0,
            lease_ms: dep.lease_ms,
            strategy: dep.strategy.name().to_string(),
            added: false,
            term: 0,
        },
        joins: Joins::default(),
        leaves: Leaves::default(),
        stats: stats.clone(),
    };
    let leaves = net.directory.register(me, LEAVE_SERVICE);
    let settings = ServerSettings {
        failover: FailoverSettings {
            reshard_auto: dep.reshard.auto,
            reshard_overload: dep.reshard.overload,
            reshard_within: dep.reshard.within,
            ..failover_settings(dep.lease_ms)
        },
        ..ServerSettings::default()
    };
    let crashed = Arc::new(AtomicBool::new(false));
    let mut executor: Option<Executor> = None;
    let mut view: Option<Arc<ConfigManager>> = None;
    let mut next_read = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let config = view.as_ref().map(|v| v.current());
        desk.serve(&joins, config.as_deref());
        desk.serve_leaves(&leaves, config.as_deref());
        if Instant::now() >= next_read {
            next_read = Instant::now() + Duration::from_millis(50);
            match &view {
                Some(v) => {
                    if let Ok(c) = v.reload() {
                        remember(&members, &c);
                    }
                }
                None => match ConfigManager::open(store.clone()) {
                    Ok(m) => {
                        let c = m.current();
                        tracing::info!(term = %c.term, members = c.members.len(), "configuration found");
                        remember(&members, &c);
                        view = Some(Arc::new(m));
                    }
                    Err(CmError::NoConfig) => {
                        // Every server that joined, through this CM or another.
                        let joined = joined_servers(store.as_ref()).unwrap_or_default();
                        if joined.len() >= dep.bootstrap.servers {
                            bootstrap(dep, &store, &joined)?;
                            next_read = Instant::now();
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "reading the configuration"),
                },
            }
        }
        if executor.is_none() && view.is_some() {
            let manager =
                Arc::new(ConfigManager::open(store.clone()).map_err(perr("the CM's role"))?);
            let ep = Endpoint::new(net.nic.clone(), settings.endpoint.clone())
                .map_err(perr("an endpoint"))?;
            let task = CmTask::new(
                me,
                manager,
                settings.failover.clone(),
                ep,
                net.directory.register(me, CM_PORT),
                net.directory.clone(),
                Arc::new(EventLog::new()),
                crashed.clone(),
                clock.clone(),
            )
            .with_joins(desk.joins.clone())
            .with_leaves(desk.leaves.clone())
            .with_stats(stats.clone());
            let mut ex = Executor::new(Placement::Dedicated, clock.clone());
            ex.spawn(Box::new(task));
            executor = Some(ex);
            tracing::info!("the CM's role runs");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    tracing::info!("CM stopping");
    crashed.store(true, Ordering::Release);
    if let Some(ex) = executor {
        ex.stop();
    }
    drop(net);
    Ok(())
}

fn remember(members: &RwLock<HashMap<NodeId, String>>, c: &Config) {
    let mut m = members.write();
    for member in &c.members {
        if let Some(a) = &member.address {
            m.insert(member.node, a.clone());
        }
    }
}

/// The servers that joined (their records in the store).
fn joined_servers(store: &dyn CoordStore) -> Result<Joined, CmError> {
    Ok(rowankv_cm::node_records(store)?
        .into_iter()
        .filter(|(_, r)| r.kind == "server" && r.workers > 0 && !r.left)
        .map(|(node, r)| {
            let member = Member {
                added: 0,
                node,
                workers: r.workers,
                address: Some(r.address),
                resp: r.resp,
            };
            (node, member)
        })
        .collect())
}

/// Commit term 1 with the servers that joined.
fn bootstrap(
    dep: &CmDeployment,
    store: &Arc<dyn CoordStore>,
    joined: &Joined,
) -> Result<(), ProcessError> {
    let members: Vec<Member> = joined.values().cloned().collect();
    let initial = Config::initial(
        dep.cluster_id,
        &members,
        dep.bootstrap.shards_per_server,
        dep.bootstrap.replication_factor,
    )
    .map_err(perr("the first configuration"))?;
    match ConfigManager::bootstrap(store.clone(), initial) {
        Ok(m) => {
            let c = m.current();
            tracing::info!(
                term = %c.term, servers = members.len(), shards = c.shards.len(),
                "first configuration committed"
            );
            Ok(())
        }
        // Another CM stored one first: use that.
        Err(CmError::Conflict(why)) => {
            tracing::info!(why, "another CM bootstrapped the cluster");
            Ok(())
        }
        Err(e) => Err(ProcessError(format!("bootstrapping: {e}"))),
    }
}
