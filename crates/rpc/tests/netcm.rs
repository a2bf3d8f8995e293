//! The network connection manager: two directories, as two processes would hold,
//! exchange queue pair addresses over TCP; a request is then carried over the
//! fabric. Peers that cannot prove the cluster id and secret are refused, and
//! hostile bytes on the listener's socket harm nothing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use rowankv_fabric::{Fabric, LoopbackFabric, QpAddr};
use rowankv_rpc::directory::{Accepted, ConnectError, Directory, PRIVATE_BYTES_MAX};
use rowankv_rpc::endpoint::{Endpoint, EndpointConfig, Event};
use rowankv_types::{NodeId, QpNum, Term};
use rowankv_wire::frame::{self, Body, Envelope, Response};

const CLUSTER: u64 = 0xC0FF_EE00;
const SECRET: &[u8] = b"a secret of the test cluster";
const WAIT: Duration = Duration::from_secs(5);

fn directory(cluster: u64, secret: &[u8]) -> Directory {
    Directory::network(cluster, secret, "127.0.0.1:0".parse().unwrap(), None).unwrap()
}

fn env(sender: NodeId) -> Envelope {
    Envelope {
        cluster_id: CLUSTER,
        term: Term(1),
        request_id: 7,
        sender,
    }
}

/// Node 2's endpoint behind directory `b` as service 0, accepting (on a thread of
/// its own) until one peer is connected, then answering one Ping.
fn serve_one(
    fabric: &LoopbackFabric,
    b: &Directory,
) -> std::thread::JoinHandle<Result<(), String>> {
    let nic = fabric.attach(NodeId(2)).unwrap();
    let mut ep = Endpoint::new(nic, EndpointConfig::default()).unwrap();
    let acceptor = b.register(NodeId(2), 0);
    std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        let mut peers = Vec::new();
        while peers.is_empty() {
            if Instant::now() > deadline {
                return Err("nobody connected".into());
            }
            peers = acceptor.accept_pending(&mut ep);
            std::thread::sleep(Duration::from_millis(1));
        }
        let (mut events, mut data) = (Vec::new(), Vec::new());
        while Instant::now() < deadline {
            ep.poll(&mut events, &mut data).map_err(|e| e.to_string())?;
            for e in &events {
                if let Event::Message { peer, start, len } = *e {
                    let f = frame::decode(&data[start..start + len]).map_err(|e| e.to_string())?;
                    if !matches!(f.body, Body::Ping) {
                        return Err(format!("expected a Ping, got {:?}", f.body));
                    }
                    ep.respond(
                        peer,
                        &env(NodeId(2)),
                        &Body::Response(Response::Ok { version: 42 }),
                    )
                    .map_err(|e| e.to_string())?;
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err("no request arrived".into())
    })
}

/// From node 1 through directory `a`: connect to node 2's service 0, send a Ping
/// over the fabric and wait for its answer.
fn ping_node_2(fabric: &LoopbackFabric, a: &Directory) {
    let mut ep =
        Endpoint::new(fabric.attach(NodeId(1)).unwrap(), EndpointConfig::default()).unwrap();
    let peer = a.connect(&mut ep, NodeId(2), 0, WAIT).unwrap();
    ep.request(peer, &env(NodeId(1)), &Body::Ping).unwrap();
    let (mut events, mut data) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        ep.poll(&mut events, &mut data).unwrap();
        for e in &events {
            if let Event::Message { start, len, .. } = *e {
                let f = frame::decode(&data[start..start + len]).unwrap();
                assert!(
                    matches!(f.body, Body::Response(Response::Ok { version: 42 })),
                    "got {:?}",
                    f.body
                );
                return;
            }
        }
    }
    panic!("no answer over the connected queue pair");
}

#[test]
fn a_queue_pair_connected_through_the_network_carries_requests() {
    let fabric = LoopbackFabric::new();
    let a = directory(CLUSTER, SECRET);
    let b = directory(CLUSTER, SECRET);
    a.set_address(NodeId(2), b.local_address().unwrap().to_string());
    let server = serve_one(&fabric, &b);
    ping_node_2(&fabric, &a);
    server.join().unwrap().unwrap();
}

/// The error of connecting to node 2's service 0 from a directory with `cluster`
/// and `secret`, node 2 being served by a directory of the test cluster.
fn refused(cluster: u64, secret: &[u8], service: u16) -> String {
    let fabric = LoopbackFabric::new();
    let a = directory(cluster, secret);
    let b = directory(CLUSTER, SECRET);
    a.set_address(NodeId(2), b.local_address().unwrap().to_string());
    let _acceptor = b.register(NodeId(2), 0);
    let mut ep =
        Endpoint::new(fabric.attach(NodeId(1)).unwrap(), EndpointConfig::default()).unwrap();
    match a.connect(&mut ep, NodeId(2), service, WAIT) {
        Err(ConnectError::Refused(why)) => why,
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_peer_without_the_secret_or_of_another_cluster_is_refused() {
    let why = refused(CLUSTER, b"not the secret of this cluster", 0);
    assert!(why.contains("secret was not proven"), "{why}");
    let why = refused(CLUSTER, b"", 0);
    assert!(why.contains("secret was not proven"), "{why}");
    let why = refused(CLUSTER + 1, SECRET, 0);
    assert!(why.contains("cluster"), "{why}");
    let why = refused(CLUSTER, SECRET, 9);
    assert!(why.contains("no service 9"), "{why}");
}

#[test]
fn a_node_with_no_known_address_is_unknown() {
    let fabric = LoopbackFabric::new();
    let a = directory(CLUSTER, SECRET);
    let mut ep =
        Endpoint::new(fabric.attach(NodeId(1)).unwrap(), EndpointConfig::default()).unwrap();
    assert!(matches!(
        a.connect(&mut ep, NodeId(3), 0, WAIT),
        Err(ConnectError::Unknown { .. })
    ));
    // An address where nobody listens: refused with the reason, in time.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = nobody.local_addr().unwrap().to_string();
    drop(nobody);
    a.set_address(NodeId(3), address);
    match a.connect(&mut ep, NodeId(3), 0, WAIT) {
        Err(ConnectError::Refused(why)) => assert!(why.contains("connecting"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

/// Read the listener's hello, send `bytes`, and read what comes back (if anything)
/// until the listener closes the connection.
fn throw(address: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut hello = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut hello).unwrap();
    let _ = s.write_all(bytes);
    // End of input: the listener sees the frame end here, not after its timeout.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

#[test]
fn hostile_bytes_on_the_listener_are_refused_and_it_goes_on_serving() {
    let fabric = LoopbackFabric::new();
    let b = directory(CLUSTER, SECRET);
    let address = b.local_address().unwrap().to_string();
    let oversized = (1u32 << 30).to_le_bytes().to_vec();
    let mut junk = 12u32.to_le_bytes().to_vec();
    junk.extend_from_slice(b"not json at ");
    let mut wrong_shape = 2u32.to_le_bytes().to_vec();
    wrong_shape.extend_from_slice(b"{}");
    for (what, bytes) in [
        ("an oversized length", oversized),
        ("junk", junk),
        ("a frame of the wrong shape", wrong_shape),
        ("a truncated frame", vec![200, 0, 0, 0, b'{']),
        ("nothing", vec![]),
    ] {
        let back = throw(&address, &bytes);
        if !back.is_empty() {
            let text = String::from_utf8_lossy(&back[4..]).to_string();
            assert!(text.contains("\"error\""), "{what}: answered {text}");
            assert!(!text.contains("\"qp\":["), "{what}: connected: {text}");
        }
    }
    // Still serving a good peer.
    let a = directory(CLUSTER, SECRET);
    a.set_address(NodeId(2), address);
    let server = serve_one(&fabric, &b);
    ping_node_2(&fabric, &a);
    server.join().unwrap().unwrap();
}

/// A service that is not an RPC endpoint — a replication path's receiver —
/// gets the caller's queue pair and private data through another process's
/// listener and answers with its own queue pair and private data (a remote
/// log's region descriptor travels this way).
#[test]
fn a_raw_queue_pair_service_exchanges_private_data_both_ways() {
    let (a, b) = (directory(CLUSTER, SECRET), directory(CLUSTER, SECRET));
    a.set_address(NodeId(2), b.local_address().unwrap().to_string());
    let acceptor = b.register(NodeId(2), 9);
    let server = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        let mut seen = None;
        while seen.is_none() && Instant::now() < deadline {
            acceptor.serve_pending(|from, private| {
                seen = Some((from, private.to_vec()));
                Ok(Accepted {
                    qp: QpAddr {
                        node: NodeId(2),
                        qpn: QpNum(77),
                    },
                    private: b"where to write".to_vec(),
                })
            });
            std::thread::sleep(Duration::from_millis(1));
        }
        seen
    });
    let from = QpAddr {
        node: NodeId(1),
        qpn: QpNum(5),
    };
    let reply = a
        .request(NodeId(2), 9, from, b"hello".to_vec())
        .expect("the request sent");
    let accepted = reply
        .recv_timeout(WAIT)
        .expect("an answer")
        .expect("accepted");
    assert_eq!(
        accepted,
        Accepted {
            qp: QpAddr {
                node: NodeId(2),
                qpn: QpNum(77)
            },
            private: b"where to write".to_vec(),
        }
    );
    assert_eq!(
        server.join().unwrap(),
        Some((from, b"hello".to_vec())),
        "the service saw the caller's queue pair and private data"
    );
}

/// Private data beyond `PRIVATE_BYTES_MAX` is refused: a caller's before
/// anything is sent, a service's answer as a refusal the caller sees.
#[test]
fn private_data_over_its_bound_is_refused_on_either_side() {
    let (a, b) = (directory(CLUSTER, SECRET), directory(CLUSTER, SECRET));
    a.set_address(NodeId(2), b.local_address().unwrap().to_string());
    let from = QpAddr {
        node: NodeId(1),
        qpn: QpNum(5),
    };
    let e = a
        .request(NodeId(2), 9, from, vec![0; PRIVATE_BYTES_MAX + 1])
        .expect_err("too much private data refused");
    assert!(e.to_string().contains("private data"), "{e}");

    let acceptor = b.register(NodeId(2), 9);
    let server = std::thread::spawn(move || {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            let n = acceptor.serve_pending(|_, _| {
                Ok(Accepted {
                    qp: QpAddr {
                        node: NodeId(2),
                        qpn: QpNum(1),
                    },
                    private: vec![1; PRIVATE_BYTES_MAX + 1],
                })
            });
            assert_eq!(n, 0, "an answer over the bound is not an acceptance");
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    let reply = a
        .request(NodeId(2), 9, from, b"hello".to_vec())
        .expect("the request sent");
    let why = reply
        .recv_timeout(WAIT)
        .expect("an answer")
        .expect_err("the oversized answer refused");
    assert!(why.contains("private data"), "{why}");
    server.join().unwrap();
}

/// Two processes on the `tcp` fabric, each knowing only the other's
/// connection-manager address: the exchange tells each side where the other's
/// fabric engine listens, so the queue pairs it connects reach each other; a
/// caller that knows only a process's address (an alias, as for a CM) reaches
/// whichever node there offers the service and learns its real node.
#[test]
fn an_exchange_carries_fabric_addresses_and_an_alias_reaches_the_node_behind_it() {
    use rowankv_fabric::tcp::{AddressBook, TcpConfig, TcpFabric};
    use rowankv_rpc::netcm::FabricPeers;

    fn process(node: u32) -> (Directory, rowankv_fabric::tcp::TcpNic) {
        // Separate books: neither process knows the other's engine beforehand.
        let book = AddressBook::new();
        let fabric = TcpFabric::with_config(TcpConfig::new(
            CLUSTER,
            SECRET,
            "127.0.0.1:0".parse().unwrap(),
            book.clone(),
        ))
        .unwrap();
        let nic = fabric.attach(NodeId(node)).unwrap();
        let peers = FabricPeers {
            own: nic.listen_addr(),
            book,
        };
        let d = Directory::network(CLUSTER, SECRET, "127.0.0.1:0".parse().unwrap(), Some(peers))
            .unwrap();
        (d, nic)
    }
    let (a, nic_a) = process(1);
    let (b, nic_b) = process(77);
    // `a` knows node 77 only as "the process at this address", under another name.
    a.set_alias(NodeId(900), b.local_address().unwrap().to_string());
    let mut ep_b = Endpoint::new(nic_b, EndpointConfig::default()).unwrap();
    let acceptor = b.register(NodeId(77), 5);
    let mut ep_a = Endpoint::new(nic_a, EndpointConfig::default()).unwrap();
    let (peer, reply) = a.connect_async(&mut ep_a, NodeId(900), 5).unwrap();
    let deadline = Instant::now() + WAIT;
    let accepted = loop {
        acceptor.accept_pending(&mut ep_b);
        if let Ok(r) = reply.try_recv() {
            break r.unwrap();
        }
        assert!(Instant::now() < deadline, "no answer");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        accepted.qp.node,
        NodeId(77),
        "the answer names the real node"
    );
    ep_a.connect(peer, accepted.qp).unwrap();
    ep_a.request(peer, &env(NodeId(1)), &Body::Ping).unwrap();
    let (mut events, mut data) = (Vec::new(), Vec::new());
    // b answers over the fabric: it must have learnt a's engine address.
    let served = loop {
        ep_b.poll(&mut events, &mut data).unwrap();
        if let Some(&Event::Message { peer, .. }) = events.first() {
            break peer;
        }
        assert!(Instant::now() < deadline, "the Ping never arrived over tcp");
        std::thread::sleep(Duration::from_millis(1));
    };
    ep_b.respond(
        served,
        &env(NodeId(77)),
        &Body::Response(Response::Ok { version: 9 }),
    )
    .unwrap();
    loop {
        ep_a.poll(&mut events, &mut data).unwrap();
        if let Some(&Event::Message { start, len, .. }) = events.first() {
            let f = frame::decode(&data[start..start + len]).unwrap();
            assert!(matches!(
                f.body,
                Body::Response(Response::Ok { version: 9 })
            ));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the answer never came back over tcp"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // An alias to a process with no such service is refused with the reason.
    match a.connect(&mut ep_a, NodeId(900), 6, WAIT) {
        Err(ConnectError::Refused(why)) => assert!(why.contains("no service 6"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}
