//! Failover on the threaded in-process cluster: a server killed under a client's
//! writes is replaced (new configuration, promotion, re-replication to a new
//! backup), the active CM killed before it is replaced by the standby, and every
//! acknowledged write survives. (The simulator covers the fault schedules; this
//! checks the same protocol with real threads and real time.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rowankv_client::{Client, ClientConfig, ClientError, Output};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_fabric::LoopbackNic;
use rowankv_server::{EventKind, FailoverSettings, ServerSettings, Strategy};
use rowankv_types::NodeId;

#[allow(dead_code)] // this file uses only the leases
mod common;

const SERVERS: usize = 4;
const SHARDS_PER_SERVER: u16 = 2;
const KEYS: usize = 300;
const WAIT: Duration = Duration::from_secs(60);

fn wait_for(cluster: &Cluster, what: &str, done: impl Fn(&[rowankv_server::Event]) -> bool) {
    let start = Instant::now();
    loop {
        if done(&cluster.events().snapshot()) {
            return;
        }
        assert!(
            start.elapsed() < WAIT,
            "{what} did not happen within {WAIT:?}: {:#?}",
            cluster.events().snapshot()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A Rowan cluster of `servers` (RF 3, two workers each) with `failover` leases.
fn start(servers: usize, failover: FailoverSettings) -> Cluster {
    Cluster::start(ClusterConfig {
        servers,
        shards_per_server: SHARDS_PER_SERVER,
        replication_factor: 3,
        strategy: Strategy::Rowan,
        pool_bytes: 64 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 1024,
        settings: ServerSettings {
            workers: 2,
            failover,
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster")
}

/// A client of `cluster` whose operations give up after `timeout`.
fn connect(cluster: &mut Cluster, timeout: Duration) -> Result<Client<LoopbackNic>, ClientError> {
    common::client_of(
        cluster,
        ClientConfig {
            timeout,
            ..ClientConfig::default()
        },
    )
}

#[test]
fn a_killed_server_and_a_killed_cm_are_replaced_and_no_acknowledged_write_is_lost() {
    let mut cluster = start(
        SERVERS,
        // Long enough that a loaded test machine does not evict live servers.
        FailoverSettings {
            lease_ns: 400_000_000,
            renew_ns: 20_000_000,
            cm_lease_ns: 1_600_000_000,
            ..FailoverSettings::default()
        },
    );
    let mut c = connect(&mut cluster, Duration::from_secs(20)).unwrap();
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..KEYS {
        let key = format!("key-{i}");
        let v = c.put(key.as_bytes(), format!("v1-{i}").as_bytes()).unwrap();
        acked.insert(key, v);
    }

    // The active CM dies; the standby takes over.
    let first_cm = cluster
        .events()
        .snapshot()
        .iter()
        .find_map(|e| match e.kind {
            EventKind::CmActive { cm, .. } => Some(cm),
            _ => None,
        })
        .expect("a CM became active at start");
    let j = (first_cm.0 - rowankv_deploy::CM_NODE_BASE) as usize;
    cluster.kill_cm(j);
    wait_for(&cluster, "standby CM takeover", |ev| {
        ev.iter()
            .any(|e| matches!(e.kind, EventKind::CmActive { cm, .. } if cm != first_cm))
    });

    // Server 1 dies with writes going on.
    let victim = NodeId(1);
    let before = cluster.cm().current();
    let led: Vec<_> = before.primary_shards(victim).map(|s| s.shard).collect();
    assert_eq!(led.len(), SHARDS_PER_SERVER as usize);
    cluster.kill_server(victim.0 as usize);
    for i in 0..KEYS {
        let key = format!("key-{i}");
        // A write whose outcome is unknown (cut off by the kill) is not counted.
        if let Ok(v) = c.put(key.as_bytes(), format!("v2-{i}").as_bytes()) {
            acked.insert(key, v);
        }
    }
    wait_for(&cluster, "promotion of the victim's shards", |ev| {
        led.iter().all(|s| {
            ev.iter()
                .any(|e| matches!(e.kind, EventKind::ShardServed { shard, .. } if shard == *s))
        })
    });
    let after = cluster.cm().current();
    assert!(after.term > before.term);
    assert!(after.member(victim).is_none(), "{victim} removed");
    for s in &led {
        let a = after.shard(*s).unwrap();
        assert_ne!(a.primary, victim);
        assert!(
            before.shard(*s).unwrap().backups.contains(&a.primary),
            "a backup promoted"
        );
    }

    // Every acknowledged write reads back at its version or later.
    for (key, v) in &acked {
        match c.execute(rowankv_client::Op::Get {
            key: key.clone().into_bytes(),
        }) {
            Ok(Output::Value { version, .. }) => {
                assert!(version >= *v, "{key}: version {version} < acknowledged {v}")
            }
            other => panic!("{key}: {other:?} after failover (acknowledged v{v})"),
        }
    }

    // Re-replication makes the fourth server a full backup again.
    wait_for(&cluster, "re-replication", |_| {
        cluster
            .cm()
            .current()
            .shards
            .iter()
            .all(|s| s.joining.is_empty() && s.backups.len() == 2)
    });
    // Backups index what they hold when digest reaches it; make it reach
    // everything (nothing is in flight now), then look at every backup's index.
    cluster.digest_everything().unwrap();
    let last = cluster.cm().current();
    let servers = cluster.servers();
    for (key, v) in &acked {
        let s = last.shard_for_key(key.as_bytes());
        for b in &s.backups {
            let server = servers.iter().find(|x| x.node == *b).unwrap();
            let got = server.engine.get(s.shard, key.as_bytes()).unwrap();
            assert!(
                got.as_ref().is_some_and(|(_, version)| version.0 >= *v),
                "{key} on backup {b} of {}: {got:?}, acknowledged v{v}; indexed there: {:?}; events:\n{}",
                s.shard,
                server.engine.indexed(s.shard),
                cluster
                    .events()
                    .snapshot()
                    .iter()
                    .map(|e| format!("{} {:?}", e.at_ns, e.kind))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

/// A client started while a server is down and still in the configuration (its
/// lease has not run out) connects to the others and reads every key whose
/// primary is alive (a write needs every replica, so it waits for the
/// failover); an operation routed to the dead server is retried until its
/// deadline and then fails as not sent, leaving the client usable.
#[test]
fn a_client_starts_while_a_listed_server_is_down() {
    // No failover within the test: the dead server stays listed.
    let mut cluster = start(3, common::steady_leases());
    let keys: Vec<String> = (0..60).map(|i| format!("key-{i}")).collect();
    let mut writer = connect(&mut cluster, Duration::from_secs(20)).expect("a client");
    for key in &keys {
        writer.put(key.as_bytes(), key.as_bytes()).unwrap();
    }
    drop(writer);

    let dead = NodeId(2);
    cluster.kill_server(dead.0 as usize);
    let mut c = connect(&mut cluster, Duration::from_millis(300))
        .expect("a client connects while one server is down");
    let config = c.cluster_config().clone();
    assert!(config.member(dead).is_some(), "{dead} is still listed");
    let (mut alive, mut routed_to_dead) = (0, 0);
    for key in &keys {
        let primary = config.shard_for_key(key.as_bytes()).primary;
        let got = c.get(key.as_bytes());
        if primary == dead {
            routed_to_dead += 1;
            assert!(
                matches!(got, Err(ClientError::Connect(_))),
                "{key} (primary {dead}, down): {got:?}"
            );
        } else {
            alive += 1;
            assert_eq!(
                got.as_deref(),
                Ok(key.as_bytes()),
                "{key} (primary {primary})"
            );
        }
    }
    assert!(
        alive > 0 && routed_to_dead > 0,
        "{alive} keys on live primaries, {routed_to_dead} on {dead}"
    );
    cluster.shutdown();
}

/// Leases for the probe tests: long enough that a loaded test machine does not
/// evict a live server by itself.
fn probe_leases() -> FailoverSettings {
    FailoverSettings {
        lease_ns: 400_000_000,
        renew_ns: 20_000_000,
        cm_lease_ns: 1_600_000_000,
        ..FailoverSettings::default()
    }
}

fn evicted(cluster: &Cluster, node: NodeId) -> bool {
    cluster
        .events()
        .snapshot()
        .iter()
        .any(|e| e.kind == EventKind::ServerFailed { node })
}

/// A server whose lease role stalls for longer than its lease, while its other
/// roles run (a thread not scheduled on a loaded machine), is probed by the CM
/// when its lease expires, answers, and stays a member: once its lease role
/// runs again it renews and serves. Without the probe the CM would evict it
/// and the cluster would lose a replica for good.
#[test]
fn a_server_whose_lease_role_stalls_is_probed_and_kept() {
    let failover = probe_leases();
    let lease = Duration::from_nanos(failover.lease_ns);
    let mut cluster = start(3, failover);
    let mut c = connect(&mut cluster, Duration::from_secs(20)).unwrap();
    let stalled = NodeId(1);
    let keys: Vec<String> = (0..40).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        c.put(key.as_bytes(), b"before").unwrap();
    }
    let term = cluster.cm().current().term;

    // One and a half leases without a renewal, then the role runs again.
    let now = cluster.clock().now_ns();
    let pause = lease * 3 / 2;
    cluster.servers()[stalled.0 as usize].pause_lease_role(now + pause.as_nanos() as u64);
    std::thread::sleep(pause + 2 * lease);

    assert!(
        !evicted(&cluster, stalled),
        "{stalled} was evicted: {:#?}",
        cluster.events().snapshot()
    );
    assert_eq!(cluster.cm().current().term, term, "no reconfiguration");
    let server = &cluster.servers()[stalled.0 as usize];
    assert!(!server.evicted());
    assert!(
        server.lease_until_ns() > now + pause.as_nanos() as u64,
        "{stalled} renewed its lease after the stall"
    );
    // It serves its shards again: every key is written and read back.
    let mut on_stalled = 0;
    for key in &keys {
        if c.cluster_config().shard_for_key(key.as_bytes()).primary == stalled {
            on_stalled += 1;
        }
        c.put(key.as_bytes(), b"after").unwrap();
        assert_eq!(c.get(key.as_bytes()).unwrap(), b"after");
    }
    assert!(on_stalled > 0, "no key on {stalled}");
    cluster.shutdown();
}

/// The probe's reprieve is one lease: a server whose lease role stays stalled
/// (it answers the probe, but never renews) is evicted, and its shards are
/// served by the others.
#[test]
fn a_server_whose_lease_role_stays_stalled_is_evicted_after_one_reprieve() {
    let cluster = start(3, probe_leases());
    let stalled = NodeId(2);
    let led: Vec<_> = cluster
        .cm()
        .current()
        .primary_shards(stalled)
        .map(|s| s.shard)
        .collect();
    let now = cluster.clock().now_ns();
    cluster.servers()[stalled.0 as usize].pause_lease_role(now + 3_600 * 1_000_000_000);
    wait_for(&cluster, "eviction of the stalled server", |_| {
        evicted(&cluster, stalled)
    });
    wait_for(&cluster, "promotion of the stalled server's shards", |ev| {
        led.iter().all(|s| {
            ev.iter().any(|e| {
                matches!(e.kind, EventKind::ShardServed { shard, node, .. }
                    if shard == *s && node != stalled)
            })
        })
    });
    assert!(cluster.cm().current().member(stalled).is_none());
    cluster.shutdown();
}
