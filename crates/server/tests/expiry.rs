//! Expiry times through the cluster: a PUT's expiry travels in its request and
//! in its log entry, so every replica holds it; the key's primary answers a
//! value past it as absent (a condition "absent" then holds), a GET answers the
//! time with the value, and a promoted backup answers the same time after a
//! failover. Every replication strategy carries it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rowankv_client::{ClientConfig, ClientError, Expect};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_server::{EventKind, FailoverSettings, ServerSettings, Strategy};

#[allow(dead_code)] // this file uses only the client helper
mod common;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn start(strategy: Strategy, servers: usize, failover: FailoverSettings) -> Cluster {
    Cluster::start(ClusterConfig {
        servers,
        strategy,
        shards_per_server: 2,
        replication_factor: 3,
        pool_bytes: 32 << 20,
        segment_bytes: 1 << 20,
        settings: ServerSettings {
            workers: 2,
            failover,
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster")
}

#[test]
fn every_strategy_stores_expiry_times_and_the_primary_answers_expired_keys_as_absent() {
    for strategy in Strategy::ALL {
        let mut cluster = start(strategy, 3, common::steady_leases());
        let mut c = common::client_of(&mut cluster, ClientConfig::default()).unwrap();
        let later = unix_ms() + 3_600_000;
        let v = c
            .put_with(b"later", b"soon gone", None, Some(later))
            .unwrap();
        let got = c.get_stored(b"later").unwrap().expect("live");
        assert_eq!(
            (got.value.as_slice(), got.version, got.expires_at_ms),
            (&b"soon gone"[..], v, Some(later)),
            "{strategy}"
        );
        // A time already past: written, and absent at once.
        c.put_with(b"past", b"never seen", None, Some(unix_ms() - 1))
            .unwrap();
        assert_eq!(c.get(b"past"), Err(ClientError::NotFound), "{strategy}");
        assert_eq!(c.get_stored(b"past").unwrap(), None, "{strategy}");
        // An expired key is absent to a condition too.
        c.put_with(b"past", b"claimed", Some(Expect::Absent), None)
            .unwrap();
        assert_eq!(c.get(b"past").unwrap(), b"claimed", "{strategy}");
        // A live key with an expiry ahead is not absent.
        assert!(
            matches!(
                c.put_with(b"later", b"x", Some(Expect::Absent), None),
                Err(ClientError::Server { .. })
            ),
            "{strategy}"
        );
        // Rewriting without a time removes it (PERSIST), with one keeps it.
        c.put_with(b"later", b"kept", Some(Expect::Version(v)), None)
            .unwrap();
        assert_eq!(
            c.get_stored(b"later").unwrap().unwrap().expires_at_ms,
            None,
            "{strategy}"
        );
        // A short time: live now, absent once it passes.
        let short = unix_ms() + 300;
        c.put_with(b"short", b"blink", None, Some(short)).unwrap();
        assert_eq!(c.get(b"short").unwrap(), b"blink", "{strategy}");
        while unix_ms() <= short + 1 {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(c.get(b"short"), Err(ClientError::NotFound), "{strategy}");
        cluster.shutdown();
    }
}

#[test]
fn a_promoted_backup_answers_the_expiry_time_the_old_primary_stored() {
    let mut cluster = start(
        Strategy::Rowan,
        4,
        FailoverSettings {
            lease_ns: 400_000_000,
            renew_ns: 20_000_000,
            cm_lease_ns: 1_600_000_000,
            ..FailoverSettings::default()
        },
    );
    let mut c = common::client_of(
        &mut cluster,
        ClientConfig {
            timeout: Duration::from_secs(20),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let later = unix_ms() + 3_600_000;
    let config = cluster.cm().current();
    let victim = config.members[0].node;
    let led: Vec<_> = config.primary_shards(victim).map(|s| s.shard).collect();
    // Keys until one of each shard the victim leads has an expiring value.
    let mut keys = Vec::new();
    for i in 0..400 {
        let key = format!("ttl-{i}");
        let shard = config.shard_for_key(key.as_bytes()).shard;
        if led.contains(&shard) {
            c.put_with(key.as_bytes(), b"v", None, Some(later + i))
                .unwrap();
            keys.push((key, later + i));
        }
    }
    assert!(!keys.is_empty());
    cluster.kill_server(victim.0 as usize);
    let start = Instant::now();
    loop {
        let served = cluster.events().snapshot().iter().any(
            |e| matches!(e.kind, EventKind::ShardServed { shard, .. } if led.contains(&shard)),
        );
        let promoted = cluster.cm().current().member(victim).is_none();
        if served && promoted {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no failover");
        std::thread::sleep(Duration::from_millis(10));
    }
    for (key, at) in &keys {
        let got = c.get_stored(key.as_bytes()).unwrap().expect(key);
        assert_eq!(got.expires_at_ms, Some(*at), "{key} after failover");
    }
    cluster.shutdown();
}
