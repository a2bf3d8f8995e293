//! The configuration as a CM serves it over the fabric (`rowankv_client::cm_source`):
//! what a client or server in another process, which cannot read the CM's
//! coordination store, reads — page by page, from whichever CM answers.

use std::time::{Duration, Instant};

use rowankv_client::cm_source::CmSource;
use rowankv_deploy::{Cluster, ClusterConfig, CM_NODE_BASE};
use rowankv_server::control::CM_PORT;
use rowankv_server::ServerSettings;
use rowankv_types::NodeId;
use rowankv_wire::config::{ConfigError, ConfigSource};

const TIMEOUT: Duration = Duration::from_secs(10);

fn cluster() -> Cluster {
    Cluster::start(ClusterConfig {
        servers: 3,
        // 144 shards: the configuration's JSON takes several 4 KiB frames.
        shards_per_server: 48,
        settings: ServerSettings {
            workers: 1,
            ..ServerSettings::default()
        },
        pool_bytes: 32 << 20,
        segment_bytes: 1 << 20,
        ..ClusterConfig::default()
    })
    .expect("a cluster")
}

fn cms(c: &Cluster) -> Vec<(NodeId, u16)> {
    (0..c.config().cms as u32)
        .map(|j| (NodeId(CM_NODE_BASE + j), CM_PORT))
        .collect()
}

#[test]
fn a_cm_serves_the_stored_configuration_page_by_page_and_its_changes() {
    let mut c = cluster();
    let nic = c.attach_client().expect("a NIC");
    let source = CmSource::new(
        nic,
        c.directory().clone(),
        c.config().cluster_id,
        cms(&c),
        TIMEOUT,
    )
    .expect("a source");
    let stored = c.cm().reload().expect("the stored configuration");
    let bytes = stored.to_json().len();
    assert!(
        bytes > 2 * 4096,
        "the test wants a configuration of several frames, not {bytes} bytes"
    );
    let served = source.fetch().expect("the configuration from a CM");
    assert_eq!(*served, *stored, "what the CM serves is what it stores");

    // A failover: the source follows the term.
    c.kill_server(2);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = source.fetch().expect("the configuration after the kill");
        if now.term > stored.term {
            assert!(!now.members.iter().any(|m| m.node == NodeId(2)));
            assert_eq!(*now, *c.cm().reload().expect("stored"));
            break;
        }
        assert!(Instant::now() < deadline, "the term never moved");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.shutdown();
}

#[test]
fn another_clusters_source_and_an_unknown_cm_get_a_clear_error() {
    let mut c = cluster();
    let nic = c.attach_client().expect("a NIC");
    let wrong = CmSource::new(
        nic,
        c.directory().clone(),
        c.config().cluster_id ^ 1,
        cms(&c),
        TIMEOUT,
    )
    .expect("a source");
    match wrong.fetch() {
        Err(ConfigError::Unavailable(why)) => assert!(why.contains("WrongCluster"), "{why}"),
        other => panic!("another cluster's source got {other:?}"),
    }
    let nic = c.attach_client().expect("a NIC");
    let nobody = CmSource::new(
        nic,
        c.directory().clone(),
        c.config().cluster_id,
        vec![(NodeId(CM_NODE_BASE + 77), CM_PORT)],
        TIMEOUT,
    )
    .expect("a source");
    match nobody.fetch() {
        Err(ConfigError::Unavailable(why)) => assert!(why.contains("connecting"), "{why}"),
        other => panic!("a source of an unknown CM got {other:?}"),
    }
    c.shutdown();
}
