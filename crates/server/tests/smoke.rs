use rowankv_client::{Client, ClientConfig, ClientError};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_server::{ServerSettings, Strategy};

#[test]
fn put_get_delete_every_strategy() {
    for strategy in Strategy::ALL {
        let mut cluster = Cluster::start(ClusterConfig {
            strategy,
            shards_per_server: 4,
            pool_bytes: 64 << 20,
            segment_bytes: 1 << 20,
            settings: ServerSettings {
                workers: 2,
                ..ServerSettings::default()
            },
            ..ClusterConfig::default()
        })
        .unwrap();
        let nic = cluster.attach_client().unwrap();
        let mut c = Client::connect(
            nic,
            cluster.directory().clone(),
            cluster.config_source(),
            ClientConfig::default(),
        )
        .unwrap();
        for i in 0..200u32 {
            c.put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
                .unwrap();
        }
        for i in 0..200u32 {
            assert_eq!(
                c.get(format!("k{i}").as_bytes()).unwrap(),
                format!("v{i}").as_bytes(),
                "{strategy}"
            );
        }
        c.delete(b"k3").unwrap();
        assert_eq!(c.get(b"k3"), Err(ClientError::NotFound));
        cluster.shutdown();
    }
}

/// On modelled time (the CPU model, `docs/cpu-model.md`) every strategy
/// serves as on real time: one thread steps every role on a manual clock it
/// moves, and the fabric's wire model lands what is due.
#[test]
fn put_get_delete_every_strategy_on_modelled_time() {
    use rowankv_server::{CpuModel, Placement};
    for strategy in Strategy::ALL {
        let mut cluster = Cluster::start(ClusterConfig {
            strategy,
            shards_per_server: 4,
            pool_bytes: 64 << 20,
            segment_bytes: 1 << 20,
            settings: ServerSettings {
                workers: 2,
                ..ServerSettings::default()
            },
            placement: Placement::Modelled(CpuModel::default()),
            ..ClusterConfig::default()
        })
        .unwrap();
        let clock = cluster.clock().clone();
        let started = clock.now_ns();
        let nic = cluster.attach_client().unwrap();
        let mut c = Client::connect(
            nic,
            cluster.directory().clone(),
            cluster.config_source(),
            ClientConfig {
                clock: clock.clone(),
                ..ClientConfig::default()
            },
        )
        .unwrap();
        // Each operation's modelled time: the driven fabric must not land a
        // request, nor complete its answer, before the wire model's due
        // times, so none takes less than a round trip (1 µs each way).
        let mut fastest = u64::MAX;
        for i in 0..100u32 {
            let t = clock.now_ns();
            c.put(format!("k{i}").as_bytes(), format!("v{i}").as_bytes())
                .unwrap();
            fastest = fastest.min(clock.now_ns() - t);
        }
        for i in 0..100u32 {
            let t = clock.now_ns();
            assert_eq!(
                c.get(format!("k{i}").as_bytes()).unwrap(),
                format!("v{i}").as_bytes(),
                "{strategy}"
            );
            fastest = fastest.min(clock.now_ns() - t);
        }
        c.delete(b"k3").unwrap();
        assert_eq!(c.get(b"k3"), Err(ClientError::NotFound));
        assert!(
            fastest >= 2 * rowankv_fabric::WireModel::CONNECTX5.one_way_ns,
            "{strategy}: an operation took {fastest} ns of modelled time"
        );
        assert!(clock.now_ns() > started);
        cluster.shutdown();
    }
}
