//! Malformed and hostile input at a tcp fabric engine: garbage before and after the
//! handshake, truncated and oversized frames, unknown opcodes, bad flags, requests
//! out of sequence, wrong keys and out-of-bounds addresses. Each is an error on its
//! own connection (closed, or answered with an error status); the engine survives,
//! writes nothing outside a registered region, and keeps serving a good peer.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_fabric::conformance::{connect, wait_completions, Endpoint, EndpointConfig};
use rowankv_fabric::tcp::wire::{
    self, client_handshake, Credentials, Opcode, RequestHeader, Status, MAX_PAYLOAD,
};
use rowankv_fabric::tcp::{TEST_CLUSTER_ID, TEST_SECRET};
use rowankv_fabric::{
    Access, DramMemory, Fabric, LocalAddr, MemoryRegion, Nic, Op, QpAddr, QueuePair, RecvBuffer,
    RegionMemory, SharedReceiveQueue, TcpFabric, TcpNic, WcStatus, WorkRequest,
};
use rowankv_types::NodeId;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const C: NodeId = NodeId(3);

/// The memory behind B's target region: the region is [512, 1536) of 2048 bytes,
/// so a write outside the region would show in [0, 512) or [1536, 2048).
const MEMORY_BYTES: usize = 2048;
const REGION_BASE: usize = 512;
const REGION_BYTES: usize = 1024;

fn fill(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn memory_image(m: &DramMemory) -> Vec<u8> {
    let mut out = vec![0u8; MEMORY_BYTES];
    m.read(0, &mut out);
    out
}

struct Rig {
    _fabric: TcpFabric,
    a: Endpoint<TcpNic>,
    b: Endpoint<TcpNic>,
    _c: Endpoint<TcpNic>,
    qa: rowankv_fabric::TcpQp,
    qb: rowankv_fabric::TcpQp,
    /// The address the raw client claims: a real queue pair on C that B's
    /// `qbc` is connected to.
    raw_src: QpAddr,
    qbc: rowankv_fabric::TcpQp,
    /// C's side of `qbc`, left idle: the raw client claims its address.
    _qc: rowankv_fabric::TcpQp,
    memory: Arc<DramMemory>,
    target: MemoryRegion,
}

fn rig() -> Rig {
    let fabric = TcpFabric::new();
    let a = Endpoint::new(fabric.attach(A).unwrap(), EndpointConfig::single());
    let b = Endpoint::new(fabric.attach(B).unwrap(), EndpointConfig::single());
    let c = Endpoint::new(fabric.attach(C).unwrap(), EndpointConfig::single());
    let (qa, qb) = connect(&a, &b, 16);
    let (qc, qbc) = connect(&c, &b, 16);
    let memory = Arc::new(DramMemory::new(MEMORY_BYTES));
    memory.write(0, &fill(MEMORY_BYTES, 7));
    let m: Arc<dyn RegionMemory> = memory.clone();
    let target = b
        .nic
        .register(m, REGION_BASE, REGION_BYTES, Access::ALL)
        .unwrap();
    let raw_src = qc.addr();
    Rig {
        _fabric: fabric,
        a,
        b,
        _c: c,
        qa,
        qb,
        raw_src,
        qbc,
        _qc: qc,
        memory,
        target,
    }
}

fn cred() -> Credentials {
    Credentials::new(TEST_CLUSTER_ID, TEST_SECRET).unwrap()
}

/// A raw connection to B's engine, authenticated and bound to `qbc`.
fn raw(rig: &Rig) -> TcpStream {
    let mut s = TcpStream::connect(rig.b.nic.listen_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    client_handshake(&mut s, &cred(), rig.raw_src, rig.qbc.addr()).expect("handshake");
    s
}

/// The engine must close the connection without answering.
fn expect_closed(mut s: TcpStream, what: &str) {
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => panic!("{what}: the engine answered {n} bytes instead of closing"),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                assert!(Instant::now() < deadline, "{what}: connection not closed");
            }
            Err(_) => return, // reset: closed too
        }
    }
}

fn request(opcode: Opcode, req_id: u64, rkey: u32, offset: u64) -> RequestHeader {
    let mut h = RequestHeader::new(opcode, req_id);
    h.rkey = rkey;
    h.offset = offset;
    h
}

fn send_frame(s: &mut TcpStream, h: &RequestHeader, payload: &[u8]) {
    let mut buf = Vec::new();
    wire::encode_request(&mut buf, h, payload);
    s.write_all(&buf).unwrap();
}

fn response(s: &mut TcpStream) -> (wire::ResponseHeader, Vec<u8>) {
    let mut payload = Vec::new();
    let h = wire::read_response(s, &mut payload).expect("a response");
    (h, payload)
}

/// The good peer still gets a WRITE, a READ and a SEND through.
fn good_peer_works(rig: &Rig, round: u64) {
    let data = fill(16, round as u8);
    let local_mem: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(64));
    let local = rig.a.nic.register(local_mem, 0, 64, Access::NONE).unwrap();
    let rbuf_mem: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(64));
    let rbuf = rig.b.nic.register(rbuf_mem, 0, 64, Access::NONE).unwrap();
    rig.b
        .srq
        .post_recv(&[RecvBuffer {
            wr_id: round,
            mr: rbuf.clone(),
            offset: 0,
            len_bytes: 64,
        }])
        .unwrap();
    rig.qa
        .post_send(&[
            WorkRequest::new(
                1,
                Op::Write {
                    data: &data,
                    remote: rig.target.remote().at(0),
                    imm: None,
                },
            ),
            WorkRequest::new(
                2,
                Op::Read {
                    remote: rig.target.remote().at(0),
                    len: 16,
                    local: LocalAddr {
                        mr: &local,
                        offset: 8,
                    },
                },
            ),
            WorkRequest::new(
                3,
                Op::Send {
                    data: b"still here",
                    imm: None,
                },
            ),
        ])
        .unwrap();
    let cs = wait_completions(&rig.a.send_cq, 3, "good peer");
    assert!(
        cs.iter().all(|c| c.status == WcStatus::Success),
        "good peer after round {round}: {cs:?}"
    );
    let mut got = [0u8; 16];
    local.read(8, &mut got);
    assert_eq!(got.to_vec(), data, "READ by the good peer");
    let rc = wait_completions(&rig.b.recv_cq, 1, "good peer's SEND");
    assert_eq!((rc[0].wr_id, rc[0].status), (round, WcStatus::Success));
    assert_eq!(rig.qb.state(), rowankv_fabric::QpState::Ready);
}

#[test]
fn engine_survives_hostile_input_and_serves_a_good_peer() {
    let rig = rig();
    let rkey = rig.target.rkey.0;
    good_peer_works(&rig, 1);
    let before_stats = rig.b.nic.engine_stats();
    // What the region holds after the good peer's write, and the rest of memory.
    let image = memory_image(&rig.memory);
    let mut protocol_errors = 0;
    let mut refused = 0;

    // --- Before the handshake ---------------------------------------------
    // Connect and leave at once.
    drop(TcpStream::connect(rig.b.nic.listen_addr()).unwrap());
    refused += 1;
    // Garbage instead of a hello.
    {
        let mut s = TcpStream::connect(rig.b.nic.listen_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut challenge = [0u8; wire::CHALLENGE_BYTES];
        s.read_exact(&mut challenge).unwrap();
        s.write_all(&[0xAB; wire::HELLO_BYTES]).unwrap();
        let mut welcome = [0u8; wire::WELCOME_BYTES];
        s.read_exact(&mut welcome).unwrap();
        assert_eq!(welcome[0], 1, "garbage hello is refused");
        expect_closed(s, "garbage hello");
        refused += 1;
    }
    // A truncated hello, then the write side closed.
    {
        let mut s = TcpStream::connect(rig.b.nic.listen_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut challenge = [0u8; wire::CHALLENGE_BYTES];
        s.read_exact(&mut challenge).unwrap();
        s.write_all(&[1; 20]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        expect_closed(s, "truncated hello");
        refused += 1;
    }
    // An HTTP request, as a confused client would send.
    {
        let mut s = TcpStream::connect(rig.b.nic.listen_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let _ = s.shutdown(Shutdown::Write);
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        assert!(
            all.len() <= wire::CHALLENGE_BYTES,
            "only the challenge comes back, got {} bytes",
            all.len()
        );
        refused += 1;
    }

    // --- After the handshake: frames the decoder must refuse ---------------
    let bad_frames: Vec<(&str, Vec<u8>)> = {
        let mut v: Vec<(&str, Vec<u8>)> = Vec::new();
        v.push(("length u32::MAX", u32::MAX.to_le_bytes().to_vec()));
        v.push((
            "length just over the cap",
            ((wire::REQUEST_HEADER_BYTES + MAX_PAYLOAD + 1) as u32)
                .to_le_bytes()
                .to_vec(),
        ));
        v.push(("length shorter than a header", 3u32.to_le_bytes().to_vec()));
        let mut f = Vec::new();
        wire::encode_request(&mut f, &request(Opcode::Write, 0, rkey, 0), &[9; 8]);
        let mut unknown = f.clone();
        unknown[4] = 0x7F;
        v.push(("unknown opcode", unknown));
        let mut zero_op = f.clone();
        zero_op[4] = 0;
        v.push(("opcode 0", zero_op));
        let mut flags = f.clone();
        flags[5] = 0x80;
        v.push(("unknown flag", flags));
        let mut reserved = f.clone();
        reserved[6] = 1;
        v.push(("reserved byte set", reserved));
        let mut seq = Vec::new();
        wire::encode_request(&mut seq, &request(Opcode::Write, 5, rkey, 0), &[9; 8]);
        v.push(("request id out of sequence", seq));
        let mut read_payload = Vec::new();
        wire::encode_request(
            &mut read_payload,
            &request(Opcode::Read, 0, rkey, 0),
            &[1, 2, 3],
        );
        v.push(("READ with a payload", read_payload));
        let mut huge_read = request(Opcode::Read, 0, rkey, 0);
        huge_read.arg0 = MAX_PAYLOAD as u64 + 1;
        let mut hr = Vec::new();
        wire::encode_request(&mut hr, &huge_read, &[]);
        v.push(("READ over the cap", hr));
        let mut bad_placement = request(Opcode::Flush, 0, rkey, 0);
        bad_placement.arg0 = 8;
        bad_placement.arg1 = 3;
        let mut bp = Vec::new();
        wire::encode_request(&mut bp, &bad_placement, &[]);
        v.push(("FLUSH of an unknown placement", bp));
        let mut flush_payload = request(Opcode::Flush, 0, rkey, 0);
        flush_payload.arg1 = wire::PLACEMENT_PERSISTENT;
        let mut fp = Vec::new();
        wire::encode_request(&mut fp, &flush_payload, &[7; 8]);
        v.push(("FLUSH with a payload", fp));
        let mut atomic_write_imm = Vec::new();
        wire::encode_request(
            &mut atomic_write_imm,
            &request(Opcode::AtomicWrite, 0, rkey, 8),
            &[],
        );
        atomic_write_imm[5] = 1;
        v.push(("immediate flag on an ATOMIC WRITE", atomic_write_imm));
        let mut persist_read = Vec::new();
        wire::encode_request(&mut persist_read, &request(Opcode::Read, 0, rkey, 0), &[]);
        persist_read[5] = 2;
        v.push(("persist flag on a READ", persist_read));
        let mut truncated = f.clone();
        truncated.truncate(f.len() - 3);
        v.push(("truncated frame", truncated));
        let mut header_only = Vec::new();
        header_only.extend_from_slice(&((wire::REQUEST_HEADER_BYTES + 100) as u32).to_le_bytes());
        header_only.extend_from_slice(&f[4..4 + wire::REQUEST_HEADER_BYTES]);
        header_only.extend_from_slice(&[0xEE; 50]);
        v.push(("payload shorter than its length", header_only));
        v
    };
    for (what, bytes) in &bad_frames {
        let mut s = raw(&rig);
        s.write_all(bytes).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        expect_closed(s, what);
        // Truncated frames end in EOF (not counted as a protocol error).
        if !what.starts_with("truncated") && !what.starts_with("payload shorter") {
            protocol_errors += 1;
        }
        assert_eq!(memory_image(&rig.memory), image, "{what}: memory changed");
    }

    // --- After the handshake: well-formed but refused requests -------------
    let refusals: Vec<(&str, RequestHeader, Vec<u8>)> = {
        let w = |offset: u64| request(Opcode::Write, 0, rkey, offset);
        let mut read_oob = request(Opcode::Read, 0, rkey, 1000);
        read_oob.arg0 = 25;
        let mut read_wrap = request(Opcode::Read, 0, rkey, u64::MAX);
        read_wrap.arg0 = 2;
        let mut cas_end = request(Opcode::CompareSwap, 0, rkey, REGION_BYTES as u64);
        cas_end.arg1 = u64::MAX;
        let mut faa_misaligned = request(Opcode::FetchAdd, 0, rkey, 4);
        faa_misaligned.arg0 = 1;
        let mut flush_oob = request(Opcode::Flush, 0, rkey, 8);
        flush_oob.arg0 = REGION_BYTES as u64;
        flush_oob.arg1 = wire::PLACEMENT_PERSISTENT;
        let mut flush_huge = request(Opcode::Flush, 0, rkey, 0);
        flush_huge.arg0 = u64::MAX;
        flush_huge.arg1 = wire::PLACEMENT_GLOBAL;
        let mut atomic_write_misaligned = request(Opcode::AtomicWrite, 0, rkey, 12);
        atomic_write_misaligned.arg0 = u64::MAX;
        let mut atomic_write_end = request(Opcode::AtomicWrite, 0, rkey, REGION_BYTES as u64 - 4);
        atomic_write_end.arg0 = u64::MAX;
        vec![
            ("WRITE past the end", w(REGION_BYTES as u64 - 4), vec![1; 8]),
            ("WRITE at the end", w(REGION_BYTES as u64), vec![1; 1]),
            ("WRITE offset wraps", w(u64::MAX - 3), vec![1; 8]),
            ("WRITE offset u64::MAX", w(u64::MAX), vec![1; 8]),
            (
                "WRITE wrong rkey",
                request(Opcode::Write, 0, rkey ^ 0x8000_0000, 0),
                vec![1; 8],
            ),
            ("READ past the end", read_oob, vec![]),
            ("READ offset wraps", read_wrap, vec![]),
            ("CAS at the end", cas_end, vec![]),
            ("FAA misaligned", faa_misaligned, vec![]),
            ("FLUSH past the end", flush_oob, vec![]),
            ("FLUSH of u64::MAX bytes", flush_huge, vec![]),
            ("ATOMIC WRITE misaligned", atomic_write_misaligned, vec![]),
            ("ATOMIC WRITE past the end", atomic_write_end, vec![]),
        ]
    };
    for (what, h, payload) in &refusals {
        let mut s = raw(&rig);
        send_frame(&mut s, h, payload);
        let (r, data) = response(&mut s);
        assert_eq!(
            (r.status, r.req_id, data.len()),
            (Status::RemoteAccessError, 0, 0),
            "{what}"
        );
        // Nothing more executes on this connection (RC error state).
        send_frame(&mut s, &request(Opcode::Write, 1, rkey, 0), &[0x55; 8]);
        let (r, _) = response(&mut s);
        assert_eq!(r.status, Status::Flushed, "{what}: request after the error");
        assert_eq!(memory_image(&rig.memory), image, "{what}: memory changed");
    }

    // --- A well-formed request on a raw connection does execute -----------
    {
        let mut s = raw(&rig);
        send_frame(&mut s, &request(Opcode::Write, 0, rkey, 100), &[0x42; 8]);
        let (r, _) = response(&mut s);
        assert_eq!(r.status, Status::Success, "a good raw WRITE");
        let mut read = request(Opcode::Read, 1, rkey, 96);
        read.arg0 = 16;
        send_frame(&mut s, &read, &[]);
        let (r, data) = response(&mut s);
        assert_eq!(r.status, Status::Success);
        assert_eq!(&data[4..12], &[0x42; 8], "READ sees the WRITE");
    }
    let mut image = image;
    image[REGION_BASE + 100..REGION_BASE + 108].copy_from_slice(&[0x42; 8]);
    assert_eq!(memory_image(&rig.memory), image);

    // --- Random garbage after the handshake --------------------------------
    let mut x = 0x1234_5678_9ABC_DEF0u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..50 {
        let mut s = raw(&rig);
        let len = (next() % 200) as usize;
        let mut junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 2 == 0 && junk.len() >= 4 {
            // A plausible length field, so the decoder goes on to the header.
            let l = (next() % 300) as u32;
            junk[..4].copy_from_slice(&l.to_le_bytes());
        }
        let _ = s.write_all(&junk);
        let _ = s.shutdown(Shutdown::Write);
        // Whatever the engine made of it, it must close; any answer must parse.
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        let mut r = &all[..];
        let mut payload = Vec::new();
        while !r.is_empty() {
            let h = wire::read_response(&mut r, &mut payload)
                .unwrap_or_else(|e| panic!("round {round}: unparsable answer: {e}"));
            assert_ne!(h.status, Status::Success, "round {round}: garbage executed");
        }
        assert_eq!(
            memory_image(&rig.memory),
            image,
            "round {round}: memory changed"
        );
    }

    // --- The engine still serves the good peer -----------------------------
    good_peer_works(&rig, 2);
    // The engine counts asynchronously (a refused peer may be gone first).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = rig.b.nic.engine_stats();
        if stats.refused >= before_stats.refused + refused
            && stats.protocol_errors >= before_stats.protocol_errors + protocol_errors
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refusals ({refused}) and protocol errors ({protocol_errors}) counted: {before_stats:?} -> {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Outside the region nothing ever changed.
    let now = memory_image(&rig.memory);
    assert_eq!(now[..REGION_BASE], image[..REGION_BASE]);
    assert_eq!(
        now[REGION_BASE + REGION_BYTES..],
        image[REGION_BASE + REGION_BYTES..]
    );
}

/// A raw connection that claims to be a queue pair B's queue pair is not
/// connected to is bound (the peer may still connect), but nothing it sends is
/// executed.
#[test]
fn requests_from_an_unconnected_queue_pair_are_not_executed() {
    let rig = rig();
    let image = memory_image(&rig.memory);
    let mut s = TcpStream::connect(rig.b.nic.listen_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let stranger = QpAddr {
        node: NodeId(9),
        qpn: rowankv_types::QpNum(1),
    };
    // `qbc` is connected to C's queue pair, not to the stranger: refused at bind.
    let e = client_handshake(&mut s, &cred(), stranger, rig.qbc.addr());
    assert!(e.is_err(), "bound to a queue pair connected elsewhere");
    // An unknown queue pair number is refused too.
    let mut s = TcpStream::connect(rig.b.nic.listen_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let nowhere = QpAddr {
        node: B,
        qpn: rowankv_types::QpNum(0xFFFF_0000),
    };
    assert!(client_handshake(&mut s, &cred(), stranger, nowhere).is_err());
    assert_eq!(memory_image(&rig.memory), image);
    good_peer_works(&rig, 3);
}
