//! Dynamic resharding (seed 000 §4.6), as far as it is built: every server
//! reports its per-shard load each statistics window, and the active CM finds
//! an overloaded server and the move its plan would make (docs/resharding.md).

#[allow(dead_code)] // this file uses the client and lease helpers only
mod common;

use std::time::{Duration, Instant};

use rowankv_client::ClientConfig;
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_server::events::EventKind;
use rowankv_server::{ServerSettings, Strategy};
use rowankv_types::NodeId;

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
