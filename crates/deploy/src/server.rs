//! A server's process (`rowankv server --config FILE`).
//!
//! 1. Open the pool file (create it at `pool.bytes` when absent) and read the
//!    node identity it records (`rowankv_engine::identity`); a pool of another
//!    cluster is refused.
//! 2. Join through a CM ([`crate::join`]) under that identity, or get one; a new
//!    identity is recorded in the pool at once. The answer also gives the
//!    cluster's lease and replication strategy.
//! 3. Attach to the `tcp` fabric under the identity and start the connection
//!    manager on `listen`; read the configuration from the CMs
//!    (`rowankv_client::cm_source::CmSource`), waiting until this server is a
//!    member (the CM commits the first configuration once enough servers have
//!    joined).
//! 4. The engine: a pool that recorded an identity and whose server is still a
//!    member is recovered (`Engine::open_replica`; the server then serves as
//!    after a cold start, §4.7: each primary makes its shards' replicas agree
//!    first); a new pool, or the pool of a server the CM removed while it was
//!    down (its data is stale: it comes back as a joining backup, filled by the
//!    shards' primaries), is formatted for the configuration's shards.
//! 5. Run the server's roles (`rowankv_server::node`), replication paths
//!    connected on demand, until stopped (SIGTERM): then every role stops and
//!    the pool is closed.
//!
//! With `[metrics] listen`, the process serves its metrics from the start
//! (`crate::metrics`): `rowankv_server_up 0` until the server runs its roles.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use rowankv_client::cm_source::CmSource;
use rowankv_engine::{read_identity, write_identity, Engine, EngineConfig, Identity};
use rowankv_fabric::tcp::TcpNic;
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_rpc::directory::Directory;
use rowankv_server::control::CM_PORT;
use rowankv_server::deploy::ServerDeployment;
use rowankv_server::node::{assemble, roles_on_demand, ServerSpec};
use rowankv_server::{EventLog, Executor, Placement, ServerSettings, ServerShared, Strategy};
use rowankv_types::{Clock, NodeId, SystemClock};
use rowankv_wire::config::{Config, ConfigSource};

use crate::cm::failover_settings;
use crate::join::{join, refused_as_left, JoinRequest};
use crate::metrics::ServerMetrics;
use crate::{alias_cms, any_port, attach, host_of, perr, ProcessError};

/// How long a server waits for a CM to answer its join.
pub const JOIN_PATIENCE: Duration = Duration::from_secs(120);

/// Open the pool at `path`, creating it when absent; whether it was created.
fn open_pool(dep: &ServerDeployment) -> Result<(Arc<Pool>, bool), ProcessError> {
    let mut opts = PoolOptions::new(dep.medium, dep.pool_bytes as usize);
    // Emulated PM counts what Optane would write (DLWA, in `rowankv status`):
    // bytes only, never a delay.
    if dep.medium == rowankv_pmem::Medium::Emulated {
        opts.media_model = Some(rowankv_pmem::MediaModelConfig::default());
    }
    let path: &Path = &dep.pool_path;
    if path.exists() {
        let pool = Pool::open(path, opts).map_err(perr(&format!("opening {}", path.display())))?;
        Ok((pool, false))
    } else {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(perr(&format!("creating {}", dir.display())))?;
        }
        let pool =
            Pool::create(path, opts).map_err(perr(&format!("creating {}", path.display())))?;
        Ok((pool, true))
    }
}

/// How an incarnation of the server ended.
enum Ended {
    Stopped,
    /// The CM removed it (its lease lapsed: it was stopped, partitioned or too
    /// slow): it joins again, as a new backup.
    Evicted,
}

/// Run a server until `stop` is set. A server the CM removes while it runs
/// joins again under its identity and is filled again as a joining backup.
/// A server removed on purpose (`rowankv leave`) is refused when it joins
/// again, and ends without an error.
pub fn run(dep: &ServerDeployment, stop: Arc<AtomicBool>) -> Result<(), ProcessError> {
    // One endpoint for the process: it shows each incarnation's server.
    let metrics = ServerMetrics::<TcpNic>::new(dep.pool_path.display().to_string());
    let _endpoint = dep
        .metrics
        .map(|listen| crate::metrics::start(listen, metrics.registry(), "server"))
        .transpose()?;
    let mut evicted = false;
    loop {
        match run_once(dep, &stop, &metrics) {
            Ok(Ended::Stopped) => return Ok(()),
            Ok(Ended::Evicted) => {
                tracing::warn!("removed from the configuration by the CM: joining again");
                evicted = true;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) if evicted && refused_as_left(&e) => {
                tracing::info!("this server left the cluster: stopping");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}

fn run_once(
    dep: &ServerDeployment,
    stop: &Arc<AtomicBool>,
    metrics: &ServerMetrics<TcpNic>,
) -> Result<Ended, ProcessError> {
    let clock: Arc<dyn Clock> = SystemClock::new();
    let (pool, created) = open_pool(dep)?;
    let recorded = if created {
        None
    } else {
        read_identity(&pool).map_err(perr(&format!("{}", dep.pool_path.display())))?
    };
    if let Some(id) = recorded {
        if id.cluster_id != dep.cluster_id {
            return Err(ProcessError(format!(
                "{} belongs to cluster {:#x}, not {:#x}: refusing to serve it",
                dep.pool_path.display(),
                id.cluster_id,
                dep.cluster_id
            )));
        }
    }

    // Join, from a connection manager of its own (no node yet, no fabric).
    let joining = Directory::network(dep.cluster_id, &dep.secret, any_port(dep.listen), None)
        .map_err(perr("the connection manager for the join"))?;
    let cm_aliases = alias_cms(&joining, &dep.cms);
    let request = JoinRequest {
        node: recorded.map(|id| id.node.0),
        address: dep.advertise.clone(),
        workers: dep.workers,
        resp: dep.resp.as_ref().map(|r| r.advertise.clone()),
    };
    let stopping = || stop.load(Ordering::Acquire);
    let answer = join(&joining, &cm_aliases, &request, JOIN_PATIENCE, &stopping)?;
    drop(joining);
    let node = NodeId(answer.node);
    if let Some(id) = recorded {
        if id.node != node {
            return Err(ProcessError(format!(
                "the CM answered {node} to a pool recorded as {}",
                id.node
            )));
        }
    }
    let identity = Identity {
        cluster_id: dep.cluster_id,
        node,
    };
    write_identity(&pool, identity).map_err(perr("recording the node identity"))?;
    let strategy: Strategy = answer
        .strategy
        .parse()
        .map_err(|e: String| ProcessError(format!("the CM's strategy: {e}")))?;
    tracing::info!(%node, lease_ms = answer.lease_ms, %strategy, "joined");

    let net = attach(
        dep.cluster_id,
        &dep.secret,
        node,
        dep.listen,
        dep.fabric_listen.unwrap_or_else(|| any_port(dep.listen)),
        host_of(&dep.advertise),
    )?;
    let cms = alias_cms(&net.directory, &dep.cms);
    // Peers are reached at the addresses of the configuration this server
    // holds (before it has one: the last one read).
    let server: Arc<OnceLock<Weak<ServerShared<TcpNic>>>> = Arc::default();
    let latest: Arc<parking_lot::RwLock<Option<Arc<Config>>>> = Arc::default();
    let (s2, l2) = (server.clone(), latest.clone());
    net.directory.set_resolver(Arc::new(move |n| {
        let config = match s2.get().and_then(Weak::upgrade) {
            Some(s) => s.config(),
            None => l2.read().clone()?,
        };
        let m = config.members.iter().find(|m| m.node == n)?;
        m.address.clone()
    }));
    let source = Arc::new(
        CmSource::new(
            net.nic.clone(),
            net.directory.clone(),
            dep.cluster_id,
            cms.iter().map(|&c| (c, CM_PORT)).collect(),
            Duration::from_secs(2),
        )
        .map_err(perr("a configuration source"))?,
    );
    // Whether the first configuration read holds this server: if its pool
    // recorded an identity and it does not, the CM removed it while it was
    // down, and its pool's data is stale (it comes back as a new backup).
    let mut first_read: Option<bool> = None;
    let mut polls = 0u32;
    let config = loop {
        polls += 1;
        let say = polls % 50 == 1;
        if stopping() {
            return Ok(Ended::Stopped);
        }
        match source.fetch() {
            Ok(c) => {
                *latest.write() = Some(c.clone());
                let member = c.members.iter().any(|m| m.node == node);
                first_read.get_or_insert(member);
                if member {
                    break c;
                }
                if say {
                    tracing::info!(term = %c.term, "not a member of the configuration yet; waiting");
                }
            }
            Err(e) if say => tracing::info!(error = %e, "waiting for the configuration"),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    };

    let settings = ServerSettings {
        workers: dep.workers as usize,
        failover: failover_settings(answer.lease_ms),
        ..ServerSettings::default()
    };
    let engine_config = EngineConfig {
        segment_size_bytes: dep.segment_bytes as usize,
        shard_count: config.shard_count(),
        workers: settings.workers,
        cleaners: settings.cleaners,
        clock: clock.clone(),
        clean_grace: Duration::from_nanos(settings.clean_grace_ns),
        ..EngineConfig::default()
    };
    let removed = recorded.is_some() && first_read == Some(false);
    if removed {
        tracing::info!(
            %node,
            "the CM removed this server while it was down: its pool is formatted and it is \
             filled again as a joining backup"
        );
    }
    let (engine, recovered) = if recorded.is_some() && !removed {
        let (engine, report) = Engine::open_replica(pool, engine_config)
            .map_err(perr(&format!("recovering {}", dep.pool_path.display())))?;
        tracing::info!(
            entries = report.entries_indexed,
            segments = report.segments_scanned,
            "pool recovered; serving after the shards' replicas agree"
        );
        (engine, Some(report.closed_segments))
    } else {
        let engine = Engine::create(pool, engine_config).map_err(perr("formatting the pool"))?;
        // Formatting cleared the record.
        write_identity(engine.pool(), identity).map_err(perr("recording the node identity"))?;
        (engine, None)
    };
    let assembled = assemble(
        ServerSpec {
            node,
            nic: net.nic.clone(),
            engine: Arc::new(engine),
            strategy,
            settings: settings.clone(),
            config,
            source: source.clone(),
            recovered,
            events: Arc::new(EventLog::new()),
            clock: clock.clone(),
        },
        &net.directory,
    )
    .map_err(perr("assembling the server"))?;
    let shared = assembled.shared.clone();
    let _ = server.set(Arc::downgrade(&shared));
    metrics.show(&shared);
    let tasks =
        roles_on_demand(assembled, &net.directory, &cms).map_err(perr("the server's roles"))?;
    // No lease until the CM grants one: the server serves nothing before.
    let mut executor = Executor::new(
        Placement::Shared {
            threads: (dep.workers as usize).clamp(1, 2),
        },
        clock.clone(),
    );
    for t in tasks {
        executor.spawn(t);
    }
    tracing::info!(%node, listen = %dep.listen, fabric = %net.fabric_address, "serving");
    let weak = Arc::downgrade(&shared);
    let front = dep
        .resp
        .as_ref()
        .map(|r| {
            crate::resp::start(
                r,
                crate::resp::FrontParts {
                    nic: net.nic.clone(),
                    directory: net.directory.clone(),
                    source: source.clone(),
                    config: Arc::new(move || weak.upgrade().map(|s| s.config())),
                    node: node.to_string(),
                    me: node,
                    strategy: strategy.to_string(),
                },
            )
        })
        .transpose()?;
    while !stopping() && !shared.evicted() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = if shared.evicted() {
        Ended::Evicted
    } else {
        Ended::Stopped
    };
    tracing::info!(%node, "stopping");
    drop(front);
    shared.stop();
    executor.stop();
    drop(net);
    Ok(ended)
}
