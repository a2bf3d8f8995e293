//! Dynamic resharding (seed 000 §4.6): every server reports its per-shard
//! load each statistics window, and the active CM finds an overloaded server
//! and the move its plan would make; a shard's primary moves to another
//! server (the migration: hand-over, GETs sent back to the source, the copy,
//! the finish), and a migration whose target fails midway rolls back without
//! losing an acknowledged write (docs/resharding.md).

#[allow(dead_code)] // this file uses the client and lease helpers only
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rowankv_client::cm_source::CmSource;
use rowankv_client::{Client, ClientConfig, ClientError, Expect};
use rowankv_deploy::{Cluster, ClusterConfig, CM_NODE_BASE};
use rowankv_fabric::LoopbackNic;
use rowankv_server::control::CM_PORT;
use rowankv_server::events::EventKind;
use rowankv_server::{FailoverSettings, ServerSettings, Strategy};
use rowankv_types::{NodeId, ShardId};
use rowankv_wire::config::Config;

const SERVERS: usize = 5;
const WINDOW_NS: u64 = 100_000_000;
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// Figure 15's hotspot: reads and some writes go to one shard of one server.
/// The CM records that server overloaded, and a plan that moves that shard to
/// a server holding none of its replicas.
#[test]
fn the_cm_finds_the_server_whose_shard_is_hot() {
    let mut cluster = Cluster::start(ClusterConfig {
        strategy: Strategy::Rowan,
        servers: SERVERS,
        shards_per_server: 2,
        replication_factor: 3,
        settings: ServerSettings {
            workers: 2,
            load_window_ns: WINDOW_NS,
            failover: common::steady_leases(),
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster");
    let config = cluster.cm().current();
    let hot_node = NodeId(1);
    let hot = config
        .primary_shards(hot_node)
        .next()
        .expect("a shard")
        .shard;
    let warm = config
        .primary_shards(hot_node)
        .nth(1)
        .expect("a second shard")
        .shard;
    // 80 % of the requests to `hot`, 20 % to the server's other shard.
    let keys_of = |shard, n| -> Vec<Vec<u8>> {
        (0u32..)
            .map(|i| format!("key-{i}").into_bytes())
            .filter(|k| config.shard_for_key(k).shard == shard)
            .take(n)
            .collect()
    };
    let mut keys = keys_of(hot, 16);
    keys.extend(keys_of(warm, 4));
    let mut c = common::client_of(&mut cluster, ClientConfig::default()).expect("a client");
    for k in &keys {
        c.put(k, b"a value read many times").expect("PUT");
    }
    let deadline = Instant::now() + PHASE_TIMEOUT;
    let found = 'run: loop {
        for (i, k) in keys.iter().enumerate() {
            if i % 10 == 0 {
                c.put(k, b"written again").expect("PUT");
            } else {
                c.get(k).expect("GET");
            }
        }
        for e in cluster.events().snapshot() {
            if let EventKind::Overloaded {
                node, shard, to, ..
            } = e.kind
            {
                break 'run (node, shard, to);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no overload found in {PHASE_TIMEOUT:?} of requests to {hot} alone"
        );
    };
    let (node, shard, to) = found;
    assert_eq!((node, shard), (hot_node, hot), "{found:?}");
    let assignment = config.shard(hot).expect("the shard");
    assert!(
        !assignment.is_replica(to) && config.member(to).is_some(),
        "{to} is no member or holds a replica of {hot} already: {assignment:?}"
    );
    cluster.shutdown();
}

/// What a single client wrote last, per key (`None`: deleted): every GET of
/// one sequential client must read exactly this.
type Model = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

fn migrating_cluster(servers: usize, failover: FailoverSettings) -> Cluster {
    Cluster::start(migrating_config(servers, failover)).expect("a cluster")
}

fn migrating_config(servers: usize, failover: FailoverSettings) -> ClusterConfig {
    ClusterConfig {
        strategy: Strategy::Rowan,
        servers,
        shards_per_server: 2,
        replication_factor: 3,
        pool_bytes: 64 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 1024,
        settings: ServerSettings {
            workers: 2,
            failover,
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    }
}

/// Keys of `shard` (`n` of them) under `config`.
fn keys_of(config: &Config, shard: ShardId, n: usize) -> Vec<Vec<u8>> {
    (0u32..)
        .map(|i| format!("user:{i}").into_bytes())
        .filter(|k| config.shard_for_key(k).shard == shard)
        .take(n)
        .collect()
}

/// The shard to move (server 0's first) and a server holding none of it.
fn move_of(config: &Config) -> (ShardId, NodeId, NodeId) {
    let s = config.primary_shards(NodeId(0)).next().expect("a shard");
    let to = config
        .members
        .iter()
        .map(|m| m.node)
        .find(|n| !s.is_replica(*n))
        .expect("a server that holds no replica of it");
    (s.shard, s.primary, to)
}

fn reshard(
    cluster: &mut Cluster,
    shard: ShardId,
    to: NodeId,
) -> Result<rowankv_types::Term, String> {
    let nic = cluster.attach_client().expect("a NIC");
    let cms = (0..cluster.config().cms as u32)
        .map(|j| (NodeId(CM_NODE_BASE + j), CM_PORT))
        .collect();
    let source = CmSource::new(
        nic,
        cluster.directory().clone(),
        cluster.config().cluster_id,
        cms,
        Duration::from_secs(10),
    )
    .expect("a CM source");
    source.reshard(shard, to).map_err(|e| e.to_string())
}

fn check_all(c: &mut Client<LoopbackNic>, model: &Model, when: &str) {
    for (k, want) in model {
        let got = match c.get(k) {
            Ok(v) => Some(v),
            Err(ClientError::NotFound) => None,
            Err(e) => panic!("{when}: GET {}: {e}", String::from_utf8_lossy(k)),
        };
        assert_eq!(
            got.as_deref(),
            want.as_deref(),
            "{when}: key {}",
            String::from_utf8_lossy(k)
        );
    }
}

fn wait_for(cluster: &Cluster, what: &str, done: impl Fn(&[rowankv_server::Event]) -> bool) {
    let start = Instant::now();
    loop {
        if done(&cluster.events().snapshot()) {
            return;
        }
        assert!(
            start.elapsed() < PHASE_TIMEOUT,
            "{what} did not happen within {PHASE_TIMEOUT:?}: {:#?}",
            cluster.events().snapshot()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An operator's move of a shard's primary, with a client reading and
/// writing it throughout: while the copy is held back, the target serves the
/// shard with none of the old entries — its GETs of keys it does not hold go
/// back to the source, its own PUTs and DELs win, a conditional write on a
/// key not copied yet waits — then the copy completes, the CM strikes the
/// task, the source frees the shard's index, and every key reads as last
/// written, from the target alone.
#[test]
fn an_operator_moves_a_shard_and_every_key_reads_as_last_written_throughout() {
    let mut cluster = migrating_cluster(4, common::steady_leases());
    let config = cluster.cm().current();
    let (shard, from, to) = move_of(&config);
    let keys = keys_of(&config, shard, 200);
    let mut c = common::client_of(&mut cluster, ClientConfig::default()).expect("a client");
    let mut model = Model::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v1-{i}").into_bytes();
        c.put(k, &v).expect("PUT");
        model.insert(k.clone(), Some(v));
    }
    for k in keys.iter().step_by(10) {
        c.delete(k).expect("DEL");
        model.insert(k.clone(), None);
    }
    let source = std::sync::Arc::clone(&cluster.servers()[from.0 as usize]);
    source.hold_migration_copy(true);

    let term = reshard(&mut cluster, shard, to).expect("the move is planned");
    assert!(term > config.term);
    // Refused with why: one reconfiguration at a time, and not to a replica.
    let other = config
        .primary_shards(NodeId(1))
        .next()
        .expect("a shard")
        .shard;
    let again = reshard(&mut cluster, other, from).unwrap_err();
    assert!(again.contains("under way"), "{again}");
    wait_for(&cluster, "the target serving the shard", |ev| {
        ev.iter().any(|e| {
            matches!(e.kind, EventKind::MigrationServed { shard: s, from: f, to: t }
                if s == shard && f == from && t == to)
        })
    });
    let target = std::sync::Arc::clone(&cluster.servers()[to.0 as usize]);
    assert_eq!(
        target.engine.indexed(shard).unwrap(),
        0,
        "nothing copied while held"
    );
    // Every key reads as written, from the source through the target.
    check_all(&mut c, &model, "handed over, nothing copied");
    let sent_back = source.stats.migration_reads.load(Ordering::Relaxed);
    assert!(
        sent_back >= keys.len() as u64 * 8 / 10,
        "only {sent_back} GETs went back to the source"
    );
    // Writes at the target: they win over the copy to come.
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let v = format!("v2-{i}").into_bytes();
        c.put(k, &v).expect("PUT at the target");
        model.insert(k.clone(), Some(v));
    }
    for k in keys.iter().skip(1).step_by(7) {
        c.delete(k).expect("DEL at the target");
        model.insert(k.clone(), None);
    }
    check_all(&mut c, &model, "written at the target, nothing copied");
    assert_eq!(
        source.engine.indexed(shard).unwrap(),
        keys.len(),
        "the source took none of the target's writes"
    );
    // A condition on a key the target does not hold yet cannot be checked
    // there: the client is refused (Blocked) until its deadline.
    let uncopied = keys
        .iter()
        .enumerate()
        .find(|(i, k)| i % 3 != 0 && i % 7 != 1 && model[*k].is_some())
        .map(|(_, k)| k.clone())
        .expect("an uncopied key");
    let mut short = common::client_of(
        &mut cluster,
        ClientConfig {
            timeout: Duration::from_millis(300),
            ..ClientConfig::default()
        },
    )
    .expect("a client");
    let refused = short.put_if(&uncopied, b"never", Expect::Absent);
    assert!(refused.is_err(), "{refused:?}");
    check_all(&mut c, &model, "after the refused condition");

    // The copy goes on: the CM strikes the task; the source frees the index.
    source.hold_migration_copy(false);
    wait_for(&cluster, "the migration's end", |ev| {
        ev.iter()
            .any(|e| matches!(e.kind, EventKind::MigrationFinished { shard: s, .. } if s == shard))
    });
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while source.engine.indexed(shard).unwrap() > 0 {
        assert!(
            Instant::now() < deadline,
            "the source never freed the shard's index"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let now = cluster.cm().current();
    assert!(now.migrations.is_empty());
    assert_eq!(now.shard(shard).unwrap().primary, to);
    assert_eq!(
        now.shard(shard).unwrap().backups,
        config.shard(shard).unwrap().backups,
        "the backups stay"
    );
    let before = source.stats.migration_reads.load(Ordering::Relaxed);
    check_all(&mut c, &model, "after the migration");
    // The conditional write the target refused works now.
    c.put_if(&uncopied, b"set", Expect::Version(0))
        .expect_err("the key has a value: the condition fails");
    assert_eq!(
        source.stats.migration_reads.load(Ordering::Relaxed),
        before,
        "no GET goes to the source after the migration"
    );
    assert_eq!(target.engine.indexed(shard).unwrap(), keys.len());
    cluster.shutdown();
}

/// The target of a migration dies midway — after it acknowledged writes of
/// its own and before the copy ended: the failover promotes the shard's
/// first backup (which holds every write of both ends) and every key reads
/// as last acknowledged; the source, no replica any more, frees its index.
#[test]
fn a_migration_whose_target_dies_rolls_back_and_loses_no_acknowledged_write() {
    let mut cluster = migrating_cluster(
        5,
        FailoverSettings {
            lease_ns: 400_000_000,
            renew_ns: 20_000_000,
            cm_lease_ns: 1_600_000_000,
            ..FailoverSettings::default()
        },
    );
    let config = cluster.cm().current();
    let (shard, from, to) = move_of(&config);
    let first_backup = config.shard(shard).unwrap().backups[0];
    let keys = keys_of(&config, shard, 120);
    let mut c = common::client_of(
        &mut cluster,
        ClientConfig {
            timeout: Duration::from_secs(20),
            ..ClientConfig::default()
        },
    )
    .expect("a client");
    let mut model = Model::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v1-{i}").into_bytes();
        c.put(k, &v).expect("PUT");
        model.insert(k.clone(), Some(v));
    }
    cluster.servers()[from.0 as usize].hold_migration_copy(true);
    reshard(&mut cluster, shard, to).expect("the move is planned");
    wait_for(&cluster, "the target serving the shard", |ev| {
        ev.iter()
            .any(|e| matches!(e.kind, EventKind::MigrationServed { shard: s, .. } if s == shard))
    });
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        let v = format!("v2-{i}").into_bytes();
        c.put(k, &v).expect("PUT at the target");
        model.insert(k.clone(), Some(v));
    }
    for k in keys.iter().skip(1).step_by(9) {
        c.delete(k).expect("DEL at the target");
        model.insert(k.clone(), None);
    }
    // Enough at the target to fill the backups' b-log segments, so they are
    // committed before the kill: a promotion's gather (which reads segments
    // not yet committed) cannot bring the target's writes back by itself.
    let filler = vec![b'f'; 3000];
    for k in keys_of(&config, shard, 520).iter().skip(keys.len()) {
        c.put(k, &filler).expect("PUT at the target");
        model.insert(k.clone(), Some(filler.clone()));
    }
    std::thread::sleep(Duration::from_millis(300));
    let killed_at = cluster.clock().now_ns();
    cluster.kill_server(to.0 as usize);
    wait_for(&cluster, "the failover's promotion", |ev| {
        ev.iter().any(|e| {
            e.at_ns > killed_at
                && matches!(e.kind, EventKind::ShardServed { shard: s, .. } if s == shard)
        })
    });
    check_all(&mut c, &model, "after the rollback");
    let now = cluster.cm().current();
    assert!(now.migrations.is_empty(), "{:?}", now.migrations);
    let s = now.shard(shard).unwrap();
    assert_eq!(s.primary, first_backup);
    assert!(!s.is_replica(to));
    let source = &cluster.servers()[from.0 as usize];
    if !s.is_replica(from) {
        let deadline = Instant::now() + PHASE_TIMEOUT;
        while source.engine.indexed(shard).unwrap() > 0 {
            assert!(
                Instant::now() < deadline,
                "the source never freed the shard's index"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    cluster.shutdown();
}

/// A power failure of every server midway through a migration — the target
/// serving the shard and taking writes, the copy held back at the source —
/// then a cold start: the stored configuration still lists the migration,
/// the recovered cluster ends it (the copy resumed and finished, or rolled
/// back, §4.6), the shard has one primary, and every acknowledged write, of
/// the source's time and of the target's, reads back.
#[test]
fn a_power_failure_of_every_server_midway_through_a_migration_loses_no_acknowledged_write() {
    // The recovered cluster's CM takes over once the stored CM lease of the
    // one that lost power has run out: a CM lease of seconds, not the
    // minutes of `steady_leases`.
    let config = ClusterConfig {
        crash_sim: true,
        ..migrating_config(
            4,
            FailoverSettings {
                lease_ns: 400_000_000,
                renew_ns: 20_000_000,
                cm_lease_ns: 1_600_000_000,
                ..FailoverSettings::default()
            },
        )
    };
    let mut cluster = Cluster::start(config.clone()).expect("a cluster");
    let before = cluster.cm().current();
    let (shard, from, to) = move_of(&before);
    let keys = keys_of(&before, shard, 80);
    let mut c = common::client_of(&mut cluster, ClientConfig::default()).expect("a client");
    let mut model = Model::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("v1-{i}").into_bytes();
        c.put(k, &v).expect("PUT at the source");
        model.insert(k.clone(), Some(v));
    }
    cluster.servers()[from.0 as usize].hold_migration_copy(true);
    reshard(&mut cluster, shard, to).expect("the move is planned");
    wait_for(&cluster, "the target serving the shard", |ev| {
        ev.iter()
            .any(|e| matches!(e.kind, EventKind::MigrationServed { shard: s, .. } if s == shard))
    });
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let v = format!("v2-{i}").into_bytes();
        c.put(k, &v).expect("PUT at the target");
        model.insert(k.clone(), Some(v));
    }
    for k in keys.iter().skip(1).step_by(7) {
        c.delete(k).expect("DEL at the target");
        model.insert(k.clone(), None);
    }
    let listed = cluster.cm().current();
    assert!(
        listed.migrations.iter().any(|m| m.shard == shard),
        "the migration is listed when the power fails: {:?}",
        listed.migrations
    );
    drop(c);

    // Every server loses power at once: each pool keeps what was persisted.
    let images: Vec<(NodeId, Vec<u8>, rowankv_engine::EngineConfig)> = cluster
        .servers()
        .iter()
        .map(|s| {
            let image = s
                .engine
                .pool()
                .crash()
                .expect("the cluster runs with the crash simulator")
                .image(rowankv_pmem::PowerFailure::DropAll);
            (s.node, image, s.engine.config().clone())
        })
        .collect();
    let store = cluster.store().clone();
    cluster.shutdown();
    let recovered = images
        .into_iter()
        .map(|(node, image, engine_config)| {
            let mut popts =
                rowankv_pmem::PoolOptions::new(rowankv_pmem::Medium::Emulated, image.len());
            popts.crash_sim = true;
            let pool =
                rowankv_pmem::Pool::from_image(&image, popts).expect("a pool from the image");
            let (engine, report) = rowankv_engine::Engine::open_replica(pool, engine_config)
                .unwrap_or_else(|e| panic!("recovering {node}: {e}"));
            rowankv_deploy::Recovered {
                node,
                engine: std::sync::Arc::new(engine),
                closed_segments: report.closed_segments,
            }
        })
        .collect();
    let mut cluster = Cluster::recover(config, store, recovered).expect("the cold start");
    let deadline = Instant::now() + PHASE_TIMEOUT;
    let after = loop {
        let now = cluster.cm().current();
        if now.migrations.is_empty() {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "the listed migration never ended after the cold start: {:?}; events: {:#?}",
            now.migrations,
            cluster
                .events()
                .snapshot()
                .iter()
                .map(|e| format!("{} ms {:?}", e.at_ns / 1_000_000, e.kind))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let s = after.shard(shard).unwrap();
    assert!(
        s.primary == to || s.primary == from,
        "the shard's primary after the cold start is {}, neither the source {from} nor the target {to}",
        s.primary
    );
    let mut c = common::client_of(
        &mut cluster,
        ClientConfig {
            timeout: Duration::from_secs(20),
            ..ClientConfig::default()
        },
    )
    .expect("a client after the cold start");
    check_all(&mut c, &model, "after the cold start");
    cluster.shutdown();
}
