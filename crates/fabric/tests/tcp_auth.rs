//! Authentication of tcp fabric connections: a connection is accepted only from a
//! peer that proves the cluster id and the shared secret. A wrong or missing proof
//! is refused, counted and logged, and the engine keeps serving the right peers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rowankv_fabric::conformance::{connect, wait_completions, Endpoint, EndpointConfig};
use rowankv_fabric::tcp::wire::{
    self, client_handshake, Challenge, Credentials, HandshakeError, Hello, Welcome,
};
use rowankv_fabric::tcp::{TEST_CLUSTER_ID, TEST_SECRET};
use rowankv_fabric::{
    Access, DramMemory, Fabric, FabricError, Nic, Op, QpAddr, QueuePair, RegionMemory, TcpConfig,
    TcpFabric, TcpNic, WcStatus, WorkRequest,
};
use rowankv_types::{NodeId, QpNum, SystemClock};

/// Everything logged by this test binary (the engines log on their own threads,
/// so the subscriber is the global one).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .init();
        buf
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Wait until a logged line contains every one of `parts`.
fn wait_logged(parts: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
        if text.lines().any(|l| parts.iter().all(|p| l.contains(p))) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {parts:?}; logged:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_refused(nic: &TcpNic, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while nic.engine_stats().refused < at_least {
        assert!(
            Instant::now() < deadline,
            "refusals: {:?}, expected at least {at_least}",
            nic.engine_stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A test fabric whose nodes are found through `book`, with its own cluster id
/// and secret.
fn fabric(cluster_id: u64, secret: &[u8], book: &rowankv_fabric::AddressBook) -> TcpFabric {
    let mut config = TcpConfig::local_test(SystemClock::new());
    config.cluster_id = cluster_id;
    config.secret = secret.to_vec();
    config.book = book.clone();
    TcpFabric::with_config(config).unwrap()
}

/// The good cluster: node 2 with a queue pair connected to node 1's.
struct Cluster {
    fabric: TcpFabric,
    a: Endpoint<TcpNic>,
    b: Endpoint<TcpNic>,
    qa: rowankv_fabric::TcpQp,
    qb: rowankv_fabric::TcpQp,
}

fn cluster() -> Cluster {
    let fabric = TcpFabric::new();
    let a = Endpoint::new(fabric.attach(NodeId(1)).unwrap(), EndpointConfig::single());
    let b = Endpoint::new(fabric.attach(NodeId(2)).unwrap(), EndpointConfig::single());
    let (qa, qb) = connect(&a, &b, 8);
    Cluster {
        fabric,
        a,
        b,
        qa,
        qb,
    }
}

fn good_write_works(c: &Cluster) {
    let mem: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(64));
    let target = c.b.nic.register(mem, 0, 64, Access::ALL).unwrap();
    c.qa.post_send(&[WorkRequest::new(
        7,
        Op::Write {
            data: b"authentic",
            remote: target.remote().at(0),
            imm: None,
        },
    )])
    .unwrap();
    let wc = wait_completions(&c.a.send_cq, 1, "good write");
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
    let mut got = [0u8; 9];
    target.read(0, &mut got);
    assert_eq!(&got, b"authentic");
}

/// A queue pair of a fabric with other credentials, sharing the good cluster's
/// address book, cannot connect to the good cluster's queue pair.
#[test]
fn wrong_secret_or_cluster_is_refused_and_logged() {
    logs();
    let c = cluster();
    let before = c.b.nic.engine_stats();
    let target = c.qb.addr();

    for (what, cluster_id, secret, node) in [
        (
            "wrong secret",
            TEST_CLUSTER_ID,
            &b"not the secret"[..],
            NodeId(11),
        ),
        (
            "wrong cluster id",
            TEST_CLUSTER_ID + 1,
            TEST_SECRET,
            NodeId(12),
        ),
    ] {
        let intruder = fabric(cluster_id, secret, c.fabric.book());
        let e = Endpoint::new(intruder.attach(node).unwrap(), EndpointConfig::single());
        let q = e.qp(8);
        match q.connect(target) {
            Err(FabricError::Invalid(msg)) => assert!(msg.contains("handshake"), "{what}: {msg}"),
            other => panic!("{what}: connect must be refused, got {other:?}"),
        }
        assert_eq!(q.state(), rowankv_fabric::QpState::Init, "{what}");
    }
    wait_refused(&c.b.nic, before.refused + 2);
    wait_logged(&["connection refused", "authentication failed"]);
    wait_logged(&["connection refused", "cluster id"]);
    assert_eq!(
        c.b.nic.engine_stats().accepted,
        before.accepted,
        "no intruder was accepted"
    );
    good_write_works(&c);
}

/// Raw peers: no proof at all, a proof with a zero MAC, a proof replayed from
/// another connection, a connection meant for another node. The engine refuses
/// each, and an honest handshake still succeeds.
#[test]
fn missing_forged_or_replayed_proof_is_refused() {
    logs();
    let c = cluster();
    let addr: SocketAddr = c.b.nic.listen_addr();
    let before = c.b.nic.engine_stats();
    let cred = Credentials::new(TEST_CLUSTER_ID, TEST_SECRET).unwrap();
    let src = c.qa.addr();
    let dst = c.qb.addr();
    let open = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let challenge = |s: &mut TcpStream| {
        let mut b = [0u8; wire::CHALLENGE_BYTES];
        s.read_exact(&mut b).unwrap();
        Challenge::decode(&b).unwrap()
    };
    let welcome = |s: &mut TcpStream| {
        let mut w = [0u8; wire::WELCOME_BYTES];
        s.read_exact(&mut w).map(|_| w[0])
    };

    // No proof: a hello whose MAC is all zeros.
    let mut s = open();
    let ch = challenge(&mut s);
    assert_eq!(ch.node, NodeId(2));
    let hello = Hello {
        src,
        dst,
        cluster_id: TEST_CLUSTER_ID,
        nonce: [3; 16],
    };
    let mut bytes = hello.encode(&cred, &ch);
    bytes[56..].fill(0);
    s.write_all(&bytes).unwrap();
    assert_eq!(welcome(&mut s).unwrap(), Welcome::Refused as u8, "zero MAC");

    // Replay: a hello valid for one challenge, sent on another connection.
    let mut s1 = open();
    let ch1 = challenge(&mut s1);
    let signed = hello.encode(&cred, &ch1);
    let mut s2 = open();
    let _ch2 = challenge(&mut s2);
    s2.write_all(&signed).unwrap();
    assert_eq!(welcome(&mut s2).unwrap(), Welcome::Refused as u8, "replay");
    drop(s1);

    // A hello meant for another node (a stale address book).
    let mut s = open();
    let ch = challenge(&mut s);
    let misrouted = Hello {
        dst: QpAddr {
            node: NodeId(3),
            qpn: QpNum(1),
        },
        ..hello
    };
    // Signed as if node 3 had sent the challenge.
    let fake = Challenge {
        node: NodeId(3),
        ..ch
    };
    s.write_all(&misrouted.encode(&cred, &fake)).unwrap();
    assert_eq!(
        welcome(&mut s).unwrap(),
        Welcome::Refused as u8,
        "misrouted"
    );

    // Silence: connect and say nothing until the connection is dropped.
    drop(open());

    wait_refused(&c.b.nic, before.refused + 4);
    wait_logged(&["connection refused", "authentication failed"]);

    // The honest client gets in (and proves the target to itself); a client
    // with the wrong secret sees the refusal. (It binds to a queue pair of its
    // own: binding to `qb` as `qa` would supersede `qa`'s connection.)
    let spare = c.b.qp(8);
    let honest_src = QpAddr {
        node: NodeId(1),
        qpn: QpNum(0xABCD),
    };
    let mut s = open();
    client_handshake(&mut s, &cred, honest_src, spare.addr()).expect("honest handshake");
    let mut s = open();
    let wrong = Credentials::new(TEST_CLUSTER_ID, b"guess").unwrap();
    assert!(matches!(
        client_handshake(&mut s, &wrong, src, dst),
        Err(HandshakeError::Refused(Welcome::Refused))
    ));
    assert!(
        Credentials::new(TEST_CLUSTER_ID, b"").is_none(),
        "an empty secret is not a secret"
    );
    good_write_works(&c);
}
