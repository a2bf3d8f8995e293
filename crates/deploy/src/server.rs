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
//!    joined). A join answered is not a join carried out (the CM that answered
//!    may die before it stores the configuration that adds the server): a
//!    server still not a member after [`rejoin_after`] asks the CMs again.
//! 4. The engine: a pool that recorded an identity is recovered
//!    (`Engine::open_replica`; the server then serves as after a cold start,
//!    §4.7: each primary makes its shards' replicas agree first), unless it is
//!    marked stale and the configuration counts the server as a full replica
//!    of no shard. The mark (`rowankv_engine::mark_stale`, persisted at once)
//!    is set as soon as the server learns the CM removed it while it was down:
//!    the join answer says the CM adds it, or a configuration read lacks it —
//!    believed only from a configuration newer than the pool's member term
//!    (the newest it came up as a member of, recorded before it serves). A
//!    membership added after that term (`Member::added`) makes the pool stale
//!    whatever news came. A new pool, or a stale one, is formatted for the configuration's shards,
//!    and the server comes back as a joining backup filled by the primaries.
//!    A server's calendar clock may be stepped while it runs
//!    (`crate::admin`, `rowankv clock-step`).
//! 5. Run the server's roles (`rowankv_server::node`), replication paths
//!    connected on demand, until stopped (SIGTERM): then every role stops and
//!    the pool is closed.
//!
//! With `[metrics] listen`, the process serves its metrics from the start
//! (`crate::metrics`): `rowankv_server_up 0` until the server runs its roles.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use rowankv_client::cm_source::CmSource;
use rowankv_engine::{read_identity, write_identity, Engine, EngineConfig, Identity};
use rowankv_fabric::tcp::TcpNic;
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_rpc::directory::Directory;
use rowankv_server::control::CM_PORT;
use rowankv_server::deploy::ServerDeployment;
use rowankv_server::node::{assemble, roles_on_demand, ServerSpec};
use rowankv_server::{EventLog, Executor, Placement, ServerSettings, ServerShared, Strategy};
use rowankv_types::{Clock, NodeId, SteppedClock, SystemClock, Term};
use rowankv_wire::config::{Config, ConfigSource};

use crate::cm::failover_settings;
use crate::join::{
    join, refused_as_left, Awaited, Decision, JoinRequest, MembershipWait, PoolRecord, Restart,
    Sign,
};
use crate::metrics::ServerMetrics;
use crate::{alias_cms, any_port, attach, host_of, perr, ProcessError};

/// How long a server waits for a CM to answer its join.
pub const JOIN_PATIENCE: Duration = Duration::from_secs(120);

/// How long a server that joined waits to be a member of the configuration
/// before it asks the CMs again: four leases (the active CM's own lease in the
/// store, after which a standby has taken over), at least two seconds.
pub fn rejoin_after(lease_ms: u64) -> Duration {
    Duration::from_millis((4 * lease_ms).max(2_000))
}

/// Read the configuration (`fetch`) until it holds `node`, and return it with
/// whether it counts the server as a full replica of some shard
/// (`Awaited::Member`; `None` if `stopping` first).
///
/// A join answered is not yet a join carried out: the CM that answered may
/// die, or lose its activity, before it stores the configuration that adds
/// this server, or may have answered from a configuration older than the one
/// that removed it (a server restarted as its lease ran out: the CM's join
/// desk still saw it a member). While configurations that do not hold `node`
/// are read for `rejoin_after`, the server asks the CMs again (`rejoin`, which
/// answers the identity given); a final refusal ends the wait with its error.
pub fn await_membership(
    node: NodeId,
    rejoin_after: Duration,
    not_before: Term,
    mut fetch: impl FnMut() -> Result<Arc<Config>, String>,
    mut rejoin: impl FnMut() -> Result<u32, ProcessError>,
    stopping: &dyn Fn() -> bool,
) -> Result<Option<(Arc<Config>, bool)>, ProcessError> {
    let start = Instant::now();
    let now_ns = || start.elapsed().as_nanos() as u64;
    let mut wait = MembershipWait::new(node, rejoin_after, now_ns()).not_before(not_before);
    let mut polls = 0u32;
    loop {
        polls += 1;
        let say = polls % 50 == 1;
        if stopping() {
            return Ok(None);
        }
        match fetch() {
            Ok(c) => match wait.read(&c, now_ns()) {
                Awaited::Member { full_replica } => return Ok(Some((c, full_replica))),
                Awaited::Wait => {
                    if say {
                        tracing::info!(term = %c.term, "not a member of the configuration yet; waiting");
                    }
                }
                Awaited::AskAgain => {
                    tracing::info!(term = %c.term, "still not a member: asking the CMs again");
                    match rejoin() {
                        Ok(n) if n != node.0 => {
                            return Err(ProcessError(format!(
                                "the CM answered n{n} to a server that joined as {node}"
                            )))
                        }
                        Ok(_) => {}
                        Err(e) if e.0.contains("refused: join") => return Err(e),
                        Err(e) => tracing::info!(error = %e, "asking again: no answer"),
                    }
                    wait.asked(now_ns());
                }
            },
            Err(e) if say => tracing::info!(error = %e, "waiting for the configuration"),
            Err(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

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
    // The process's clock, across its incarnations: its calendar time may be
    // stepped (`rowankv clock-step`, crate::admin), and stays stepped when the
    // server joins again.
    let stepped = SteppedClock::new(SystemClock::new());
    let _endpoint = dep
        .metrics
        .map(|listen| crate::metrics::start(listen, metrics.registry(), "server"))
        .transpose()?;
    let mut evicted = false;
    loop {
        match run_once(dep, &stop, &metrics, &stepped) {
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
    stepped: &Arc<SteppedClock>,
) -> Result<Ended, ProcessError> {
    let clock: Arc<dyn Clock> = stepped.clone();
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
    // A new identity is recorded at once; a recorded one is kept as it is
    // (writing it again would clear a stale mark, below).
    if recorded.is_none() {
        write_identity(&pool, identity).map_err(perr("recording the node identity"))?;
    }
    let strategy: Strategy = answer
        .strategy
        .parse()
        .map_err(|e: String| ProcessError(format!("the CM's strategy: {e}")))?;
    tracing::info!(%node, lease_ms = answer.lease_ms, %strategy, added = answer.added, "joined");

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
    // A pool that recorded an identity is marked stale (persisted at once, so
    // that a server killed on its way back still knows it) as soon as this
    // server sees that the CM removed it while it was down: the CM answers
    // that it adds it, or a configuration read does not hold it — unless
    // that answer or configuration is no newer than the newest configuration
    // this server was a member of when it last came up on the pool (a
    // lagging CM's view: `removal_is_news`).
    let record = match recorded {
        Some(_) => Some(PoolRecord {
            marked: rowankv_engine::marked_stale(&pool)
                .map_err(perr("reading the pool's identity"))?,
            member_term: rowankv_engine::member_term(&pool)
                .map_err(perr("reading the pool's identity"))?,
        }),
        None => None,
    };
    let member_term = record.map_or(0, |r| r.member_term);
    // What the signs of a removal mean, and what becomes of the pool, is
    // decided with no I/O (`crate::join::Restart`, as the simulator takes
    // it); the marks it asks for are persisted here, at once.
    let restart = std::cell::RefCell::new(Restart::new(record));
    let mark = |why: &str| -> Result<(), ProcessError> {
        rowankv_engine::mark_stale(&pool).map_err(perr("marking the pool stale"))?;
        tracing::info!(%node, why, "the pool is marked stale: the CM removed this server while it was down");
        Ok(())
    };
    let sign = restart.borrow_mut().answered(answer.added, answer.term);
    match sign {
        Sign::News { mark: true } => mark("the CM adds this server to the configuration")?,
        Sign::Lagging => tracing::info!(
            %node, answer_term = answer.term, member_term,
            "the CM answered from a configuration older than one this server was a member of: \
             not news of a removal"
        ),
        Sign::News { mark: false } | Sign::None => {}
    }
    let floor = restart.borrow().not_before();
    let marked = std::cell::Cell::new(None::<String>);
    let rejoin = JoinRequest {
        node: Some(node.0),
        ..request
    };
    let waited = await_membership(
        node,
        rejoin_after(answer.lease_ms),
        floor,
        || {
            let c = source.fetch().map_err(|e| e.to_string())?;
            *latest.write() = Some(c.clone());
            let sign = restart
                .borrow_mut()
                .read(c.term.0, c.member(node).is_some());
            if sign == (Sign::News { mark: true }) {
                if let Err(e) = mark(&format!("the configuration of {} does not hold it", c.term)) {
                    marked.set(Some(e.0));
                }
            }
            Ok(c)
        },
        || {
            join(
                &joining,
                &cm_aliases,
                &rejoin,
                rejoin_after(answer.lease_ms),
                &stopping,
            )
            .map(|a| a.node)
        },
        &stopping,
    )?;
    if let Some(e) = marked.take() {
        return Err(ProcessError(e));
    }
    let Some((config, full_replica)) = waited else {
        return Ok(Ended::Stopped);
    };

    let mut settings = ServerSettings {
        workers: dep.workers as usize,
        failover: failover_settings(answer.lease_ms),
        ..ServerSettings::default()
    };
    settings.test_hold_redo_role = dep.test_hold_redo_role;
    if dep.unsafe_serve_without_lease {
        tracing::warn!(
            "unsafe_serve_without_lease: this server is deliberately broken (it answers \
             without a valid lease) and may serve stale data"
        );
        settings.failover.unsafe_serve_without_lease = true;
    }
    let engine_config = EngineConfig {
        segment_size_bytes: dep.segment_bytes as usize,
        shard_count: config.shard_count(),
        workers: settings.workers,
        cleaners: settings.cleaners,
        clock: clock.clone(),
        clean_grace: Duration::from_nanos(settings.clean_grace_ns),
        reserved_tail_bytes: strategy.reserved_pool_bytes(
            EngineConfig::default().mtu_bytes,
            rowankv_server::replication::redo::CONNECTIONS_DEFAULT,
        ),
        ..EngineConfig::default()
    };
    drop(joining);
    // A pool marked stale is formatted, unless the configuration counts this
    // server as a full replica of some shard (then its pool holds data no
    // other replica may hold, whatever a stale view made it think): it comes
    // back as a joining backup, filled by the primaries. A membership added
    // again after this pool last came up as a member (the CM removed and
    // re-added it while it was down) makes the pool stale, whatever news of
    // it reached this server (a lagging CM's join answer may have been
    // disbelieved, or no configuration without it was read). An unmarked
    // pool (a member all along) is recovered (`restart_decision`).
    let added = config.member(node).map_or(0, |m| m.added);
    let decision = restart.borrow().decide(full_replica, added);
    match decision {
        Decision::Format { marked, readded } => {
            if readded && !marked {
                tracing::info!(
                    %node, added, member_term,
                    "added again (term {added}) since this pool last came up as a member (term \
                     {member_term}): the pool is stale"
                );
            }
            tracing::info!(
                %node, term = %config.term,
                "the CM removed this server while it was down: its pool is formatted and it is \
                 filled again as a joining backup"
            );
        }
        Decision::Recover { clear_mark: true } => {
            tracing::warn!(
                %node, term = %config.term,
                "the pool is marked stale, but the configuration counts this server as a full \
                 replica: it is recovered, and the mark cleared"
            );
            write_identity(&pool, identity).map_err(perr("clearing the stale mark"))?;
        }
        Decision::Recover { clear_mark: false } | Decision::New => {}
    }
    let (engine, recovered) = if decision.recovers() {
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
    // This server comes up as a member of `config`: recorded, so that news
    // of a removal from a configuration no newer (a lagging CM's view) is
    // known for what it is on a later start.
    rowankv_engine::record_member_term(engine.pool(), config.term.0)
        .map_err(perr("recording the member term"))?;
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
                    cms: source.clone(),
                    config: Arc::new(move || weak.upgrade().map(|s| s.config())),
                    node: node.to_string(),
                    me: node,
                    strategy: strategy.to_string(),
                },
            )
        })
        .transpose()?;
    let clock_desk = net.directory.register(node, crate::admin::CLOCK_SERVICE);
    while !stopping() && !shared.evicted() && !shared.stopped() {
        crate::admin::serve_clock(&clock_desk, stepped, node);
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
    if let Some(why) = shared.fail_stopped() {
        return Err(ProcessError(format!("this server stopped itself: {why}")));
    }
    Ok(ended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::join::{readded_since, removal_is_news};
    use rowankv_wire::config::Member;
    use std::cell::Cell;

    fn config(nodes: &[u32]) -> Arc<Config> {
        let members: Vec<Member> = nodes
            .iter()
            .map(|&n| Member {
                added: 0,
                node: NodeId(n),
                workers: 1,
                address: Some(format!("h:{n}")),
                resp: None,
            })
            .collect();
        Arc::new(Config::initial(7, &members, 2, 2).unwrap())
    }

    fn at_term(c: &Config, term: u64) -> Config {
        let mut c = c.clone();
        c.term = Term(term);
        c
    }

    /// A restarted server's pool records that it was a member at term 5 (a
    /// joining backup whose fill may have completed): a lagging CM's join
    /// answer, or configuration, from term 4 or 5 that lacks it is no news of
    /// a removal, and must not mark its pool stale; one from term 6 is; one
    /// of unknown term (a CM of the previous version) is believed. And a
    /// configuration older than the member term that holds it is not taken
    /// for its membership either.
    #[test]
    fn news_of_a_removal_counts_only_from_a_configuration_newer_than_the_pools_membership() {
        assert!(!removal_is_news(4, 5), "a lagging view");
        assert!(!removal_is_news(5, 5), "the term it was a member of");
        assert!(removal_is_news(6, 5), "removed after it came up");
        assert!(removal_is_news(0, 5), "unknown term: believed");
        assert!(removal_is_news(1, 0), "no member term recorded: believed");

        let holding = config(&[1, 2, 3]);
        let mut wait =
            MembershipWait::new(NodeId(3), Duration::from_secs(60), 0).not_before(Term(5));
        assert_eq!(
            wait.read(&at_term(&holding, 4), 1),
            Awaited::Wait,
            "a configuration older than the pool's membership is ignored"
        );
        assert!(matches!(
            wait.read(&at_term(&holding, 5), 2),
            Awaited::Member { .. }
        ));
    }

    /// A lagging CM's join answer was disbelieved (its term older than the
    /// pool's member term), yet the CM had removed the server and adds it
    /// again: the membership it finds says so (`added` newer than the member
    /// term), and the pool is taken for stale. A membership added before the
    /// pool last came up is the pool's own.
    #[test]
    fn a_membership_added_after_the_pool_last_came_up_makes_the_pool_stale() {
        assert!(readded_since(9, 5), "removed and added again at 9");
        assert!(!readded_since(5, 5), "added at the term it came up in");
        assert!(!readded_since(3, 5), "added earlier, came up later");
        assert!(!readded_since(0, 5), "an initial member");
        assert!(
            !readded_since(9, 0),
            "no member term recorded: the marks decide"
        );
    }

    /// Stops the wait after `limit` (a wait that never ends fails the test
    /// instead of hanging it).
    fn stop_after(limit: Duration) -> impl Fn() -> bool {
        let start = Instant::now();
        move || start.elapsed() > limit
    }

    /// A configuration of members `nodes` (RF 2), with `joining` a joining
    /// backup of every shard and a full replica of none.
    fn config_joining(nodes: &[u32], joining: u32) -> Arc<Config> {
        let mut c = (*config(
            &nodes
                .iter()
                .copied()
                .filter(|&n| n != joining)
                .collect::<Vec<_>>(),
        ))
        .clone();
        c.term = rowankv_types::Term(c.term.0 + 1);
        c.members.push(Member {
            added: 0,
            node: NodeId(joining),
            workers: 1,
            address: Some(format!("h:{joining}")),
            resp: None,
        });
        for s in &mut c.shards {
            s.joining.push(NodeId(joining));
        }
        Arc::new(c)
    }

    #[test]
    fn a_join_answered_but_never_carried_out_is_asked_again() {
        // The CM answered the join and then lost it (it died before storing
        // the configuration that adds n3, or answered from a stale view): n3
        // is a member only once it asks again.
        let asked = Cell::new(0u32);
        let waited = await_membership(
            NodeId(3),
            Duration::from_millis(60),
            Term(0),
            || {
                Ok(if asked.get() == 0 {
                    config(&[1, 2])
                } else {
                    config_joining(&[1, 2, 3], 3)
                })
            },
            || {
                asked.set(asked.get() + 1);
                Ok(3)
            },
            &stop_after(Duration::from_secs(10)),
        )
        .unwrap();
        let (c, full) = waited.expect("n3 became a member once it asked again");
        assert!(c.member(NodeId(3)).is_some());
        assert!(!full, "a joining backup is no full replica");
        assert_eq!(asked.get(), 1);
    }

    #[test]
    fn a_member_is_reported_a_full_replica_only_as_a_primary_or_a_backup_of_a_current_configuration(
    ) {
        let never = || -> Result<u32, ProcessError> { panic!("a member asked again") };
        let wait = |configs: Vec<Arc<Config>>| {
            let next = Cell::new(0usize);
            await_membership(
                NodeId(3),
                Duration::from_secs(60),
                Term(0),
                || {
                    let i = next.get().min(configs.len() - 1);
                    next.set(i + 1);
                    Ok(configs[i].clone())
                },
                never,
                &stop_after(Duration::from_secs(10)),
            )
            .unwrap()
            .unwrap()
        };
        // A primary and backup: a full replica (a stale-marked pool is kept).
        let full = config(&[1, 2, 3]);
        assert!(crate::join::full_replica(&full, NodeId(3)));
        assert!(wait(vec![full.clone()]).1);
        // Added again while it was down (its first read already holds it):
        // a joining backup everywhere (a stale-marked pool is formatted).
        assert!(!wait(vec![config_joining(&[1, 2, 3], 3)]).1);
        // A first read that lacked it, then a configuration counting it a
        // full replica (filled by an earlier life of this process).
        assert!(wait(vec![config(&[1, 2]), full.clone()]).1);
        // A configuration older than one already read is not adopted: here
        // an old one holding n3 as a joining backup, read after a newer one
        // without it (a CM serving its cache).
        let with_term = |c: Arc<Config>, t: u64| {
            let mut c = (*c).clone();
            c.term = rowankv_types::Term(t);
            Arc::new(c)
        };
        let (c, keep) = wait(vec![
            with_term(config(&[1, 2]), 5),
            with_term(config_joining(&[1, 2, 3], 3), 2),
            with_term(full, 6),
        ]);
        assert_eq!(c.term, rowankv_types::Term(6));
        assert!(keep);
    }

    #[test]
    fn a_member_is_not_asked_again_and_a_refusal_or_another_identity_ends_the_wait() {
        let refused = await_membership(
            NodeId(3),
            Duration::ZERO,
            Term(0),
            || Ok(config(&[1, 2])),
            || {
                Err(ProcessError(
                    "the CM refused the join: refused: join: left: n3".into(),
                ))
            },
            &stop_after(Duration::from_secs(10)),
        )
        .unwrap_err();
        assert!(refused_as_left(&refused), "{refused}");

        let other = await_membership(
            NodeId(3),
            Duration::ZERO,
            Term(0),
            || Ok(config(&[1, 2])),
            || Ok(4),
            &stop_after(Duration::from_secs(10)),
        )
        .unwrap_err();
        assert!(other.0.contains("n4"), "{other}");

        // No CM answering is not final: the wait goes on until stopped.
        let calls = Cell::new(0u32);
        let stopped = await_membership(
            NodeId(3),
            Duration::ZERO,
            Term(0),
            || Ok(config(&[1, 2])),
            || {
                calls.set(calls.get() + 1);
                Err(ProcessError("no CM answered the join".into()))
            },
            &stop_after(Duration::from_millis(200)),
        )
        .unwrap();
        assert!(stopped.is_none());
        assert!(calls.get() >= 2, "asked {} times", calls.get());
    }
}
