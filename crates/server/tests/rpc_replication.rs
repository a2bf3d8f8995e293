//! The `rpc` replication strategy when a backup joins or dies, on the threaded
//! in-process cluster:
//!
//! - a *joining* backup (being filled by re-replication) takes every new write
//!   of its shard, so it accepts the primary's `Replicate` RPCs;
//! - a `Replicate` RPC to a backup that died fails the write it carries (the
//!   client is told the outcome is unknown) instead of leaving it waiting for an
//!   answer that never comes: at once when the send fails, and after the
//!   replication timeout when the request went out and is never answered;
//! - an answer that arrives after its request timed out is ignored: it neither
//!   acknowledges nor fails another write.

use std::time::{Duration, Instant};

use rowankv_client::{Client, ClientConfig, ClientError};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_fabric::{FaultInjector, LoopbackNic};
use rowankv_server::{FailoverSettings, ServerSettings, ServerStats, Strategy};
use rowankv_types::{NodeId, ShardId};
use rowankv_wire::config::{Config, ShardAssignment};
use rowankv_wire::frame::ErrorCode;

#[allow(dead_code)] // this file uses only the leases
mod common;

const SHARDS_PER_SERVER: u16 = 2;
/// Bound on anything the cluster is waited for.
const WAIT: Duration = Duration::from_secs(60);

/// An `rpc` cluster of `servers` (RF 3, two workers each).
fn start(servers: usize, failover: FailoverSettings, replicate_timeout: Duration) -> Cluster {
    Cluster::start(ClusterConfig {
        servers,
        shards_per_server: SHARDS_PER_SERVER,
        replication_factor: 3,
        strategy: Strategy::Rpc,
        pool_bytes: 64 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 1024,
        settings: ServerSettings {
            workers: 2,
            failover,
            replicate_timeout_ns: Some(replicate_timeout.as_nanos() as u64),
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster")
}

/// A client of `cluster` whose operations give up after `timeout`.
fn connect(cluster: &mut Cluster, timeout: Duration) -> Client<LoopbackNic> {
    common::client_of(
        cluster,
        ClientConfig {
            timeout,
            // These tests watch the server's own answer to a write whose
            // replication failed; the library would otherwise ask again.
            retry_unknown: false,
            ..ClientConfig::default()
        },
    )
    .expect("a client")
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < WAIT,
            "{what} did not happen within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A key of `shard`.
fn key_of(config: &Config, shard: ShardId, prefix: &str) -> Vec<u8> {
    (0u32..)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .find(|k| config.shard_for_key(k).shard == shard)
        .expect("every shard owns keys")
}

/// A shard of which `backup` is a backup (not the primary).
fn backed_up_by(config: &Config, backup: NodeId) -> ShardAssignment {
    config
        .shards
        .iter()
        .find(|s| s.backups.contains(&backup))
        .expect("every server backs up some shard")
        .clone()
}

/// The cluster's failover timeline, for failure messages.
fn timeline(cluster: &Cluster) -> String {
    cluster
        .events()
        .snapshot()
        .iter()
        .map(|e| format!("{} {:?}", e.at_ns, e.kind))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Leases short enough for a failover within the test, long enough that a
/// loaded test machine does not evict a live server by itself.
fn failover_leases() -> FailoverSettings {
    FailoverSettings {
        lease_ns: 400_000_000,
        renew_ns: 20_000_000,
        cm_lease_ns: 1_600_000_000,
        ..FailoverSettings::default()
    }
}

/// The write failed with an unknown outcome because its replication failed.
fn assert_replication_failed(got: &Result<u64, ClientError>, why: &str, what: &str) {
    match got {
        Err(ClientError::Server {
            code: ErrorCode::Internal,
            detail,
        }) if detail.contains("replication failed") && detail.contains(why) => {}
        other => panic!("{what}: expected a replication failure ({why}), got {other:?}"),
    }
}

/// A backup that joins a shard by re-replication takes every write of the shard
/// from then on: a PUT while it is joining succeeds, and the backup holds it.
#[test]
fn a_joining_backup_accepts_replicated_writes_by_rpc() {
    // Four servers, RF 3: when `victim` dies, the one server that does not hold
    // shard `s` joins it. No replication here may time out.
    let mut cluster = start(4, failover_leases(), WAIT);
    let mut c = connect(&mut cluster, WAIT);
    let before = cluster.cm().current();
    let victim = NodeId(3);
    let s = backed_up_by(&before, victim);
    let primary = s.primary;
    let joiner = before
        .members
        .iter()
        .map(|m| m.node)
        .find(|n| !s.is_replica(*n))
        .expect("a server outside the shard");
    let key = key_of(&before, s.shard, "joining");
    // A key in every shard: copying a shard is then an `Install` round trip.
    for a in &before.shards {
        let k = key_of(&before, a.shard, "joining");
        c.put(&k, b"before").expect("a PUT before the failure");
    }

    // Every message between two servers takes DELAY, the copies that make
    // joining backups full ones included: no copy finishes, and so no new term
    // (which would make the PUT's term stale) comes, sooner than two DELAYs
    // after the joining term is committed, while the PUT sent right then
    // reaches the joiner one DELAY later.
    const DELAY: Duration = Duration::from_secs(2);
    let servers: Vec<NodeId> = before.members.iter().map(|m| m.node).collect();
    let set_delays = |delay: Duration| {
        for a in &servers {
            for b in servers.iter().filter(|b| *b > a) {
                cluster
                    .fabric()
                    .set_delay_ns(*a, *b, delay.as_nanos() as u64);
            }
        }
    };
    set_delays(DELAY);
    cluster.kill_server(victim.0 as usize);
    let p = cluster.servers()[primary.0 as usize].clone();
    wait_until(
        "the primary serving the term in which the backup joins",
        || {
            let config = p.config();
            config.term > before.term
                && p.committed_term() >= config.term
                && config.shard(s.shard).unwrap().joining == vec![joiner]
        },
    );
    let joining_term = p.config().term;
    let sent = Instant::now();
    let got = c.put(&key, b"while joining");
    assert!(
        sent.elapsed() >= DELAY,
        "the PUT was answered in {:?}: it did not wait for the joiner",
        sent.elapsed()
    );
    let version = got.unwrap_or_else(|e| {
        panic!(
            "a PUT of {} while {joiner} joins it (term {:?}): {e}; events:\n{}",
            s.shard,
            joining_term,
            timeline(&cluster)
        )
    });
    assert_eq!(c.get(&key).as_deref(), Ok(&b"while joining"[..]));

    // The joiner finishes joining and holds the write.
    set_delays(Duration::ZERO);
    wait_until("re-replication", || {
        cluster
            .cm()
            .current()
            .shard(s.shard)
            .is_some_and(|a| a.joining.is_empty() && a.backups.contains(&joiner))
    });
    cluster.digest_everything().unwrap();
    let j = &cluster.servers()[joiner.0 as usize];
    let held = j.engine.get(s.shard, &key).unwrap();
    assert!(
        held.as_ref()
            .is_some_and(|(v, ver)| v == b"while joining" && ver.0 == version),
        "{joiner} holds {held:?} of the write acknowledged at version {version}"
    );
    cluster.shutdown();
}

/// A backup that died fails the SENDs of the primary's `Replicate` RPCs: the
/// writes they carry fail at once, whatever the replication timeout.
#[test]
fn an_rpc_replication_to_a_dead_backup_fails_the_write_instead_of_hanging() {
    // No failover within the test (the dead server stays listed) and no
    // replication timeout within it: only the failed sends can end the writes.
    let mut cluster = start(3, common::steady_leases(), WAIT);
    const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
    let mut c = connect(&mut cluster, CLIENT_TIMEOUT);
    let config = cluster.cm().current();
    let dead = NodeId(2);
    // Every shard has all three servers; take those the survivors lead.
    let keys: Vec<Vec<u8>> = config
        .shards
        .iter()
        .filter(|s| s.primary != dead)
        .map(|s| key_of(&config, s.shard, "dead-backup"))
        .collect();
    assert!(keys.len() >= 2);
    for k in &keys {
        c.put(k, b"before").expect("a PUT before the failure");
    }
    cluster.kill_server(dead.0 as usize);
    for k in &keys {
        let sent = Instant::now();
        let got = c.put(k, b"after");
        assert_replication_failed(&got, "", &format!("a PUT of {k:?} with {dead} dead"));
        assert!(
            sent.elapsed() < CLIENT_TIMEOUT / 2,
            "the failure took {:?}",
            sent.elapsed()
        );
    }
    cluster.shutdown();
}

/// A `Replicate` RPC that goes out and is never answered in time (the backup's
/// link is slow, as a hung or dying backup is) fails its write after the
/// replication timeout; the answer that comes later is ignored, and a later
/// write on the same connection is acknowledged by its own answer.
#[test]
fn an_unanswered_rpc_replication_times_out_and_its_late_answer_is_ignored() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    // Each way: the answer would come after two.
    const DELAY: Duration = Duration::from_millis(1500);
    let mut cluster = start(3, common::steady_leases(), TIMEOUT);
    let mut c = connect(&mut cluster, WAIT);
    let config = cluster.cm().current();
    let slow = NodeId(2);
    let s = backed_up_by(&config, slow);
    let key = key_of(&config, s.shard, "slow-backup");
    c.put(&key, b"before").expect("a PUT before the delay");
    let p = cluster.servers()[s.primary.0 as usize].clone();
    let failures_before = ServerStats::get(&p.stats.replication_failures);

    cluster
        .fabric()
        .set_delay_ns(s.primary, slow, DELAY.as_nanos() as u64);
    let sent = Instant::now();
    let got = c.put(&key, b"timed out");
    let took = sent.elapsed();
    assert_replication_failed(&got, "not answered", "a PUT whose backup does not answer");
    assert!(
        took >= TIMEOUT,
        "the write failed after {took:?}, before its timeout of {TIMEOUT:?}"
    );
    assert!(ServerStats::get(&p.stats.replication_failures) > failures_before);

    // New messages no longer wait, but they queue behind those sent before on
    // the same connection, and so do their answers: a write acknowledged now
    // was acknowledged after the late answer reached the primary. Until the
    // queue drains, a write may still time out.
    cluster.fabric().set_delay_ns(s.primary, slow, 0);
    let version = (0..)
        .find_map(|i| {
            assert!(
                sent.elapsed() < WAIT,
                "no write acknowledged within {WAIT:?}"
            );
            match c.put(&key, b"after the late answer") {
                Ok(v) => Some(v),
                Err(e) => {
                    assert_replication_failed(&Err(e), "", &format!("PUT {i} after the delay"));
                    None
                }
            }
        })
        .unwrap();
    assert_eq!(c.get(&key).as_deref(), Ok(&b"after the late answer"[..]));
    let last = c.put(&key, b"last").expect("a PUT after all that");
    assert!(last > version);
    assert_eq!(c.get(&key).as_deref(), Ok(&b"last"[..]));
    cluster.shutdown();
}
