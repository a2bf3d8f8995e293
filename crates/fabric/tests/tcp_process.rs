//! The tcp fabric between two processes: node B runs in a child process (this test
//! binary run again, see [`child_node_b_process`]), node A here. A killed process's
//! peer sees its outstanding and later operations fail, as with loopback's crash.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{self, Receiver};

use rowankv_fabric::conformance::{wait_completions, Endpoint, EndpointConfig};
use rowankv_fabric::tcp::{TEST_CLUSTER_ID, TEST_SECRET};
use rowankv_fabric::{
    Access, AddressBook, CqKind, DramMemory, Fabric, LocalAddr, Nic, Op, QpAddr, QpState,
    QueuePair, RegionMemory, RemoteAddr, TcpConfig, TcpFabric, WcStatus, WorkRequest,
};
use rowankv_types::{NodeId, QpNum, Rkey};

const CHILD_ENV: &str = "ROWANKV_TCP_FABRIC_CHILD";
const TAG: &str = "TCPCHILD";
const REGION_BYTES: usize = 1 << 16;

fn config(book: &AddressBook) -> TcpConfig {
    TcpConfig::new(
        TEST_CLUSTER_ID,
        TEST_SECRET,
        "127.0.0.1:0".parse().unwrap(),
        book.clone(),
    )
}

/// A line to the parent. Written to the stdout handle itself: the test harness
/// captures `println!`, not that.
fn say(what: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{TAG} {what}").unwrap();
    out.flush().unwrap();
}

/// Node B, when this binary runs as the child: attach, register a region, create
/// a queue pair, tell the parent, connect back when told, then wait to be killed.
/// In a normal test run it does nothing.
#[test]
fn child_node_b_process() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let book = AddressBook::new();
    let fabric = TcpFabric::with_config(config(&book)).unwrap();
    let b = Endpoint::new(fabric.attach(NodeId(2)).unwrap(), EndpointConfig::single());
    let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(REGION_BYTES));
    let mr = b
        .nic
        .register(memory, 0, REGION_BYTES, Access::ALL)
        .unwrap();
    let qb = b.qp(64);
    say(&format!(
        "READY {} {} {}",
        b.nic.listen_addr(),
        qb.addr().qpn.0,
        mr.rkey.0
    ));
    let mut lines = BufReader::new(std::io::stdin()).lines();
    let line = lines.next().unwrap().unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f[0], "PEER");
    let addr: SocketAddr = f[1].parse().unwrap();
    let qa = QpAddr {
        node: NodeId(f[2].parse().unwrap()),
        qpn: QpNum(f[3].parse().unwrap()),
    };
    book.insert(qa.node, addr);
    qb.connect(qa).unwrap();
    say("CONNECTED");
    // Serve until killed (or until the parent closes our stdin).
    for _ in lines {}
}

struct ChildB {
    child: Child,
    addr: SocketAddr,
    qpn: QpNum,
    rkey: Rkey,
    /// The child's tagged lines, read by a thread of their own.
    said: Receiver<String>,
}

impl Drop for ChildB {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_child() -> ChildB {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_node_b_process", "--exact", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child process");
    let stdout = child.stdout.take().unwrap();
    let (tx, said) = channel::unbounded();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            // The harness may have printed "test ... " on the same line.
            if let Some(at) = line.find(TAG) {
                let _ = tx.send(line[at + TAG.len()..].trim().to_string());
            }
        }
    });
    let ready = next_said(&said);
    let f: Vec<&str> = ready.split_whitespace().collect();
    assert_eq!(f[0], "READY", "{ready}");
    ChildB {
        addr: f[1].parse().unwrap(),
        qpn: QpNum(f[2].parse().unwrap()),
        rkey: Rkey(f[3].parse().unwrap()),
        child,
        said,
    }
}

fn next_said(said: &Receiver<String>) -> String {
    said.recv_timeout(Duration::from_secs(30))
        .expect("a line from the child within 30 s")
}

/// Node A here, connected to node B in a child process.
struct Parent {
    b: ChildB,
    _fabric: TcpFabric,
    a: Endpoint<rowankv_fabric::TcpNic>,
    qa: rowankv_fabric::TcpQp,
}

fn parent(depth: usize, response_timeout: Option<Duration>) -> Parent {
    let mut b = spawn_child();
    let book = AddressBook::new();
    book.insert(NodeId(2), b.addr);
    let mut config = config(&book);
    if let Some(t) = response_timeout {
        config.response_timeout = t;
    }
    let fabric = TcpFabric::with_config(config).unwrap();
    let a = Endpoint::new(
        fabric.attach(NodeId(1)).unwrap(),
        EndpointConfig {
            send_cq: CqKind::Bounded { capacity: 4096 },
            ..EndpointConfig::single()
        },
    );
    let qa = a.qp(depth);
    let qb = QpAddr {
        node: NodeId(2),
        qpn: b.qpn,
    };
    qa.connect(qb).unwrap();
    let stdin = b.child.stdin.as_mut().unwrap();
    writeln!(
        stdin,
        "PEER {} {} {}",
        a.nic.listen_addr(),
        qa.addr().node.0,
        qa.addr().qpn.0
    )
    .unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_said(&b.said), "CONNECTED");
    Parent {
        b,
        _fabric: fabric,
        a,
        qa,
    }
}

#[test]
fn killed_peer_process_fails_outstanding_and_later_requests() {
    const DEPTH: usize = 2048;
    let Parent {
        mut b,
        _fabric,
        a,
        qa,
    } = parent(DEPTH, None);

    // Across processes: WRITE, then READ it back.
    let remote = |offset| RemoteAddr {
        rkey: b.rkey,
        offset,
    };
    let local_mem: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(64));
    let local = a.nic.register(local_mem, 0, 64, Access::NONE).unwrap();
    qa.post_send(&[
        WorkRequest::new(
            1,
            Op::Write {
                data: b"across processes",
                remote: remote(128),
                imm: None,
            },
        ),
        WorkRequest::new(
            2,
            Op::Read {
                remote: remote(128),
                len: 16,
                local: LocalAddr {
                    mr: &local,
                    offset: 0,
                },
            },
        ),
    ])
    .unwrap();
    let cs = wait_completions(&a.send_cq, 2, "write and read across processes");
    assert!(cs.iter().all(|c| c.status == WcStatus::Success), "{cs:?}");
    let mut got = [0u8; 16];
    local.read(0, &mut got);
    assert_eq!(&got, b"across processes");

    // Kill B with requests outstanding.
    let data = [0x5Au8; 1024];
    let wrs: Vec<_> = (0..DEPTH as u64)
        .map(|i| {
            WorkRequest::new(
                100 + i,
                Op::Write {
                    data: &data,
                    remote: remote((i % 64) * 1024),
                    imm: None,
                },
            )
        })
        .collect();
    qa.post_send(&wrs).unwrap();
    // Kill once the first has completed, so that the kill lands mid-stream.
    let mut cs = wait_completions(&a.send_cq, 1, "the first of the batch");
    b.child.kill().expect("kill -9 the child");
    b.child.wait().unwrap();
    cs.extend(wait_completions(
        &a.send_cq,
        DEPTH - 1,
        "requests outstanding at the kill",
    ));
    // In posting order: successes, then (if any request was still unanswered)
    // one RetryExceeded and flushes.
    let ids: Vec<u64> = cs.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (100..100 + DEPTH as u64).collect::<Vec<_>>(), "order");
    let ok = cs
        .iter()
        .take_while(|c| c.status == WcStatus::Success)
        .count();
    if ok < DEPTH {
        assert_eq!(cs[ok].status, WcStatus::RetryExceeded, "{:?}", cs[ok]);
        assert!(
            cs[ok + 1..]
                .iter()
                .all(|c| c.status == WcStatus::WrFlushError),
            "after the failure everything is flushed"
        );
        assert_eq!(qa.state(), QpState::Error);
        qa.reset().unwrap();
    }
    eprintln!("{ok} of {DEPTH} requests completed before the kill");

    // Later requests fail too: the peer is gone.
    qa.post_send(&[WorkRequest::new(
        9,
        Op::Write {
            data: b"late",
            remote: remote(0),
            imm: None,
        },
    )])
    .unwrap();
    let c = wait_completions(&a.send_cq, 1, "a request after the kill")[0];
    assert_eq!((c.wr_id, c.status), (9, WcStatus::RetryExceeded), "{c:?}");
    assert_eq!(qa.state(), QpState::Error);
}

/// A peer that hangs without closing its sockets (stopped, partitioned) fails
/// the requests it owes once the response timeout has passed.
#[test]
fn stopped_peer_process_times_out() {
    let timeout = Duration::from_millis(300);
    let Parent { b, _fabric, a, qa } = parent(8, Some(timeout));
    let remote = RemoteAddr {
        rkey: b.rkey,
        offset: 0,
    };
    let write = |wr_id| {
        WorkRequest::new(
            wr_id,
            Op::Write {
                data: b"hello",
                remote,
                imm: None,
            },
        )
    };
    qa.post_send(&[write(1)]).unwrap();
    let c = wait_completions(&a.send_cq, 1, "before the stop")[0];
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    // Idle for longer than the timeout: an idle connection is not a failure.
    std::thread::sleep(timeout * 2);
    qa.post_send(&[write(2)]).unwrap();
    let c = wait_completions(&a.send_cq, 1, "idle, then a request")[0];
    assert_eq!(c.status, WcStatus::Success, "{c:?}");

    let pid = b.child.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("run kill");
        assert!(ok.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    // The signal is asynchronous: wait until the child is stopped.
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                let after = s.rsplit_once(')')?.1.trim_start().chars().next()?;
                Some(after == 'T' || after == 't')
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !stopped() {
        assert!(
            std::time::Instant::now() < deadline,
            "the child did not stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let start = std::time::Instant::now();
    qa.post_send(&[write(3)]).unwrap();
    let c = wait_completions(&a.send_cq, 1, "a request to a stopped peer")[0];
    let waited = start.elapsed();
    signal("-CONT");
    assert_eq!((c.wr_id, c.status), (3, WcStatus::RetryExceeded), "{c:?}");
    assert!(
        waited >= timeout,
        "failed after {waited:?}, before the timeout"
    );
    assert_eq!(qa.state(), QpState::Error);
}
