//! What a server does with configurations it cannot serve.

use std::sync::Arc;

use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_server::{ServerSettings, Strategy};
use rowankv_wire::config::Config;

#[allow(dead_code)] // this file uses only the leases
mod common;

#[test]
fn a_configuration_with_more_shards_than_the_engine_is_refused_and_changes_nothing() {
    let cluster = Cluster::start(ClusterConfig {
        servers: 3,
        shards_per_server: 2,
        replication_factor: 3,
        strategy: Strategy::Rowan,
        pool_bytes: 16 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 64,
        settings: ServerSettings {
            workers: 1,
            failover: common::steady_leases(),
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster");
    let current = cluster.cm().current();
    // An operator's configuration with twice the shards, one term on.
    let mut bigger = Config::initial(current.cluster_id, &current.members, 4, 3).unwrap();
    bigger.term = rowankv_types::Term(current.term.0 + 1);
    let server = &cluster.servers()[0];
    let adopted = server.adopt(Arc::new(bigger));
    assert!(
        !adopted,
        "a configuration of 12 shards adopted by a 6-shard engine"
    );
    assert_eq!(
        server.term(),
        current.term,
        "the server keeps its configuration"
    );
    // A configuration the engine can serve is still adopted.
    let mut next = (*current).clone();
    next.term = rowankv_types::Term(current.term.0 + 1);
    assert!(server.adopt(Arc::new(next)));
    assert_eq!(server.term().0, current.term.0 + 1);
}
