//! Connection set-up in one process (`Directory`): a connection that is refused,
//! or that nobody answers, gives its endpoint slot back at once, so a caller that
//! keeps retrying a dead or refusing peer never fills its endpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rowankv_fabric::{Fabric, LoopbackFabric};
use rowankv_rpc::directory::{ConnectError, Directory};
use rowankv_rpc::endpoint::{Endpoint, EndpointConfig};
use rowankv_types::NodeId;

#[test]
fn a_refused_or_unanswered_connect_frees_its_slot() {
    let fabric = LoopbackFabric::new();
    let directory = Directory::new();
    let config = EndpointConfig {
        peers_max: 2,
        ..EndpointConfig::default()
    };
    let mut ep = Endpoint::new(fabric.attach(NodeId(2)).unwrap(), config).unwrap();

    // A worker that refuses every connection.
    let refusing = directory.register(NodeId(1), 0);
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let server = std::thread::spawn(move || {
        while !s2.load(Ordering::Acquire) {
            refusing.serve_pending(|_, _| Err("not now".into()));
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    for attempt in 0..5 {
        let r = directory.connect(&mut ep, NodeId(1), 0, Duration::from_secs(5));
        assert!(
            matches!(&r, Err(ConnectError::Refused(why)) if why == "not now"),
            "attempt {attempt}: {r:?}"
        );
        assert_eq!(ep.open_peers(), 0, "attempt {attempt} kept its slot");
    }
    stop.store(true, Ordering::Release);
    server.join().unwrap();

    // A worker registered and never served: every attempt times out.
    let _silent = directory.register(NodeId(3), 0);
    for attempt in 0..3 {
        let r = directory.connect(&mut ep, NodeId(3), 0, Duration::from_millis(20));
        assert!(matches!(r, Err(ConnectError::Timeout { .. })), "{r:?}");
        assert_eq!(
            ep.open_peers(),
            0,
            "timed-out attempt {attempt} kept its slot"
        );
    }

    // Nobody registered: refused before a slot is taken.
    let r = directory.connect(&mut ep, NodeId(4), 0, Duration::from_millis(20));
    assert!(matches!(r, Err(ConnectError::Unknown { .. })), "{r:?}");
    assert_eq!(ep.open_peers(), 0);

    // The endpoint still has both slots for connections that succeed.
    let accepting = directory.register(NodeId(5), 0);
    let mut far =
        Endpoint::new(fabric.attach(NodeId(5)).unwrap(), EndpointConfig::default()).unwrap();
    let d2 = directory.clone();
    let answer = std::thread::spawn(move || {
        let mut served = 0;
        while served < 2 {
            served += accepting.serve_pending(|from, _| {
                let (peer, qp) = far.open().map_err(|e| e.to_string())?;
                far.connect(peer, from).map_err(|e| e.to_string())?;
                Ok(rowankv_rpc::directory::Accepted {
                    qp,
                    private: Vec::new(),
                })
            });
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(d2);
    });
    for _ in 0..2 {
        directory
            .connect(&mut ep, NodeId(5), 0, Duration::from_secs(5))
            .expect("a connection that is accepted");
    }
    answer.join().unwrap();
    assert_eq!(ep.open_peers(), 2);
}
