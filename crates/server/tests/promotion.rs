//! Promotion on the threaded in-process cluster: a new primary serves a shard
//! only once the gathered union is installed in its own engine.

use std::time::{Duration, Instant};

use rowankv_client::{ClientConfig, Output};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_server::{EventKind, FailoverSettings, ServerSettings, Strategy};
use rowankv_types::NodeId;

#[allow(dead_code)] // this file uses only the client helper
mod common;

const WAIT: Duration = Duration::from_secs(60);
const INSTALL_FAILURES: u32 = 3;

#[test]
fn a_new_primary_serves_only_once_installing_the_gathered_union_succeeded() {
    let mut cluster = Cluster::start(ClusterConfig {
        servers: 4,
        shards_per_server: 2,
        replication_factor: 3,
        strategy: Strategy::Rowan,
        pool_bytes: 64 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 1024,
        settings: ServerSettings {
            workers: 2,
            failover: FailoverSettings {
                lease_ns: 400_000_000,
                renew_ns: 20_000_000,
                cm_lease_ns: 1_600_000_000,
                // Installs are tried again after this pause.
                retry_ns: 20_000_000,
                ..FailoverSettings::default()
            },
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster");
    let mut c = common::client_of(
        &mut cluster,
        ClientConfig {
            timeout: Duration::from_secs(20),
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let mut acked = Vec::new();
    for i in 0..200 {
        let key = format!("key-{i}");
        let v = c.put(key.as_bytes(), format!("v-{i}").as_bytes()).unwrap();
        acked.push((key, v));
    }
    // Server 1 dies; installing the union fails on every server a few times first.
    let victim = NodeId(1);
    let before = cluster.cm().current();
    let led: Vec<_> = before.primary_shards(victim).map(|s| s.shard).collect();
    for s in cluster.servers() {
        if s.node != victim {
            s.buggify.force("control.install-fails", INSTALL_FAILURES);
        }
    }
    cluster.kill_server(victim.0 as usize);
    let start = Instant::now();
    let served = loop {
        let ev = cluster.events().snapshot();
        let served: Vec<(NodeId, _)> = ev
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::ShardServed { node, shard, .. } if led.contains(&shard) => {
                    Some((node, shard))
                }
                _ => None,
            })
            .collect();
        if served.len() >= led.len() {
            break served;
        }
        assert!(start.elapsed() < WAIT, "promotion did not finish: {ev:#?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    // Every new primary tried to install, failed every forced time, and served
    // only after that: a failed install is never served over.
    for (node, shard) in &served {
        let s = cluster.servers().iter().find(|s| s.node == *node).unwrap();
        assert_eq!(
            s.buggify.forced_left("control.install-fails"),
            0,
            "{node} served {shard} with forced install failures left: it served over a failed install"
        );
    }
    for (key, v) in &acked {
        match c.execute(rowankv_client::Op::Get {
            key: key.clone().into_bytes(),
        }) {
            Ok(Output::Value { version, .. }) => assert!(version >= *v, "{key}"),
            other => panic!("{key}: {other:?} after failover (acknowledged v{v})"),
        }
    }
}
