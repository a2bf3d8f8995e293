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
