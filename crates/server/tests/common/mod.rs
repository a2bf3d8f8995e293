//! Helpers shared by the cluster tests.

use rowankv_engine::Engine;
use rowankv_fabric::LoopbackNic;
use rowankv_pmem::{Medium, Pool, PoolOptions, PowerFailure};
use std::sync::Arc;

use rowankv_server::replication::redo::replay_rings;
use rowankv_server::{ServerShared, Strategy};

/// The image a power failure of `server` would leave now, recovered by a fresh
/// engine with the server's own engine configuration — under `drpc`, as a
/// restarted server recovers it: its redo rings re-executed into the b-log
/// first (then the pool recovered again, so the b-log's entries are indexed).
pub fn recover_power_failure_image(server: &ServerShared<LoopbackNic>) -> Engine {
    let image = server
        .engine
        .pool()
        .crash()
        .expect("the cluster runs with the crash simulator")
        .image(PowerFailure::DropAll);
    let pool = Pool::from_image(&image, PoolOptions::new(Medium::Emulated, image.len()))
        .expect("a pool from the image");
    let config = server.engine.config().clone();
    if server.strategy == Strategy::Drpc {
        let (engine, _report) = Engine::open_replica(pool.clone(), config.clone())
            .unwrap_or_else(|e| panic!("recovering {}'s image: {e}", server.node));
        replay_rings(Arc::new(engine))
            .unwrap_or_else(|e| panic!("{}'s image: the redo rings: {e}", server.node));
    }
    let (engine, _report) = Engine::open_replica(pool, config)
        .unwrap_or_else(|e| panic!("recovering {}'s image: {e}", server.node));
    engine
}

/// Leases for tests that are not about failover: many test clusters share two
/// cores with image recoveries, and a role can miss its turn for seconds; a
/// short lease would evict live servers mid-test. (Failover has its own tests,
/// in simulated time.)
pub fn steady_leases() -> rowankv_server::FailoverSettings {
    rowankv_server::FailoverSettings {
        lease_ns: 30_000_000_000,
        renew_ns: 100_000_000,
        cm_lease_ns: 120_000_000_000,
        ..rowankv_server::FailoverSettings::default()
    }
}

/// A client of `cluster` on a new NIC, with `config`.
pub fn client_of(
    cluster: &mut rowankv_deploy::Cluster,
    config: rowankv_client::ClientConfig,
) -> Result<rowankv_client::Client<LoopbackNic>, rowankv_client::ClientError> {
    let nic = cluster.attach_client().expect("a client NIC");
    rowankv_client::Client::connect(
        nic,
        cluster.directory().clone(),
        cluster.config_source(),
        config,
    )
}
