//! The fabric conformance suite: what every backend must do, written only against the
//! traits of `verbs`, so that the loopback, tcp and real-RDMA backends all run the
//! same cases.
//!
//! A backend runs the suite by implementing [`Backend`] and invoking
//! [`conformance_suite!`](crate::conformance_suite) in an integration test:
//!
//! ```text
//! struct LoopbackBackend;
//! impl rowankv_fabric::conformance::Backend for LoopbackBackend { ... }
//! rowankv_fabric::conformance_suite!(LoopbackBackend);
//! ```
//!
//! The module is compiled always (not only under `cfg(test)`) so that other crates'
//! tests and a hardware test binary can call it. Each case is one `pub fn` that
//! panics with a message naming the case on the first departure from the contract.
//!
//! Cases never assume that a backend executes synchronously: a completion is awaited
//! by polling with a wall-clock bound ([`WAIT_MS`]), and "nothing happened" is only
//! asserted after a later request of the same queue pair has completed (a fence), or
//! while a manual clock holds a delayed request back.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rowankv_types::{Clock, ManualClock, NodeId, QpNum, Rkey};

use crate::memory::{DramMemory, PowerFailure, RegionMemory};
use crate::verbs::*;

/// A backend under test.
pub trait Backend {
    type F: Fabric + FaultInjector;
    /// A fresh network with no nodes attached, measuring delays on a real clock.
    fn fabric(&self) -> Self::F;
    /// A fresh network whose link delays are measured on `clock`, so that a test can
    /// hold a delayed request back deterministically.
    fn fabric_with_clock(&self, clock: Arc<dyn Clock>) -> Self::F;
}

/// Runs every conformance case as a `#[test]` against `$backend` (an expression of a
/// type implementing [`conformance::Backend`](crate::conformance::Backend)).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::conformance_suite!(@cases $backend;
            send_lands_in_single_srq,
            send_with_imm_carries_imm,
            write_lands_without_target_cpu,
            write_with_imm_lands_and_notifies,
            read_fetches_remote_bytes,
            compare_swap_swaps_only_on_match,
            fetch_add_returns_old_value,
            wrong_rkey_is_remote_access_error,
            out_of_bounds_is_remote_access_error,
            missing_right_is_remote_access_error,
            misaligned_atomic_is_remote_access_error,
            deregistered_rkey_is_remote_access_error,
            writes_to_one_address_last_wins,
            read_after_write_on_one_qp_sees_the_write,
            sends_land_in_posting_order,
            only_signaled_success_completes,
            send_queue_bound,
            bounded_cq_overflow_is_an_error,
            ring_cq_overwrites_oldest,
            mp_srq_lands_stride_aligned,
            mp_srq_buffer_shared_by_two_qps,
            mp_srq_spills_to_next_buffer,
            mp_srq_consumes_in_posting_order,
            mp_srq_message_larger_than_buffer,
            single_srq_message_larger_than_buffer,
            srq_without_buffer_is_rnr,
            srq_buffers_max_bound,
            persist_write_persists_landed_bytes,
            persist_send_persists_landed_bytes,
            flush_persists_earlier_writes_of_its_qp,
            flush_global_visibility_moves_no_byte,
            flush_needs_its_placement_right,
            atomic_write_stores_eight_bytes_whole,
            cut_link_fails_only_that_link,
            heal_link_then_reset_recovers,
            delay_holds_request_until_deadline,
            delay_keeps_qp_order,
            closed_peer_fails_held_writes,
            crash_node_fails_peers_and_self,
            reattached_node_has_fresh_rkeys,
            power_fail_hands_each_memory_once,
            concurrent_sends_into_one_mp_srq,
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::$case(&$backend)
            }
        )*
    };
}

// ---------------------------------------------------------------------------
// Bounds and fixtures

/// Bound on waiting for a completion or a state change (wall clock).
pub const WAIT_MS: u64 = 10_000;
/// Polls made while asserting that a held-back request has not completed.
pub const ABSENCE_POLLS: usize = 64;
/// Completions moved per poll call.
const POLL_BATCH: usize = 64;

const A: NodeId = NodeId(1);
const B: NodeId = NodeId(2);
const C: NodeId = NodeId(3);
const STRIDE: usize = SrqConfig::ROWAN_STRIDE_BYTES;

const BLANK: Completion = Completion::BLANK;

type NicOf<B> = <<B as Backend>::F as Fabric>::Nic;

/// The queues of one side of a connection: CQs and an SRQ that its queue pairs share.
#[derive(Clone, Copy, Debug)]
pub struct EndpointConfig {
    pub send_cq: CqKind,
    pub recv_cq: CqKind,
    pub srq: SrqConfig,
}

impl EndpointConfig {
    /// Bounded CQs of 256 entries and a one-message-per-buffer SRQ of 64 buffers.
    pub fn single() -> Self {
        EndpointConfig {
            send_cq: CqKind::Bounded { capacity: 256 },
            recv_cq: CqKind::Bounded { capacity: 256 },
            srq: SrqConfig::single(64),
        }
    }

    /// As `single`, with a multi-packet SRQ of 64 B stride.
    pub fn multi_packet() -> Self {
        EndpointConfig {
            srq: SrqConfig::multi_packet(64),
            ..Self::single()
        }
    }
}

/// A NIC with a send CQ, a receive CQ and an SRQ for the queue pairs made on it.
pub struct Endpoint<N: Nic> {
    pub nic: N,
    pub send_cq: N::Cq,
    pub recv_cq: N::Cq,
    pub srq: N::Srq,
}

impl<N: Nic> Endpoint<N> {
    pub fn new(nic: N, config: EndpointConfig) -> Self {
        let send_cq = nic.create_cq(config.send_cq).expect("create send CQ");
        let recv_cq = nic.create_cq(config.recv_cq).expect("create receive CQ");
        let srq = nic.create_srq(config.srq).expect("create SRQ");
        Endpoint {
            nic,
            send_cq,
            recv_cq,
            srq,
        }
    }

    pub fn qp(&self, send_depth: usize) -> N::Qp {
        self.nic
            .create_qp(&self.send_cq, &self.recv_cq, Some(&self.srq), send_depth)
            .expect("create QP")
    }
}

/// Create a queue pair on each endpoint and connect them to each other.
pub fn connect<N: Nic>(a: &Endpoint<N>, b: &Endpoint<N>, send_depth: usize) -> (N::Qp, N::Qp) {
    let qa = a.qp(send_depth);
    let qb = b.qp(send_depth);
    qa.connect(qb.addr()).expect("connect a to b");
    qb.connect(qa.addr()).expect("connect b to a");
    assert_eq!(qa.state(), QpState::Ready, "connected QP must be Ready");
    assert_eq!(qb.state(), QpState::Ready, "connected QP must be Ready");
    (qa, qb)
}

/// Two nodes, one endpoint each, and a connected queue pair between them.
pub struct Pair<N: Nic> {
    pub a: Endpoint<N>,
    pub b: Endpoint<N>,
    pub qa: N::Qp,
    pub qb: N::Qp,
}

/// Attach nodes `a` and `b` to `fabric` and connect a queue pair between them.
pub fn connected_pair<F: Fabric>(
    fabric: &F,
    (a, config_a): (NodeId, EndpointConfig),
    (b, config_b): (NodeId, EndpointConfig),
    send_depth: usize,
) -> Pair<F::Nic> {
    let a = Endpoint::new(fabric.attach(a).expect("attach a"), config_a);
    let b = Endpoint::new(fabric.attach(b).expect("attach b"), config_b);
    let (qa, qb) = connect(&a, &b, send_depth);
    Pair { a, b, qa, qb }
}

fn pair<F: Fabric>(fabric: &F, config_b: EndpointConfig, send_depth: usize) -> Pair<F::Nic> {
    connected_pair(
        fabric,
        (A, EndpointConfig::single()),
        (B, config_b),
        send_depth,
    )
}

/// Deterministic bytes (SplitMix64), so every failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.next() as u8).collect()
}

/// A DRAM region of `len` bytes filled with `pattern(fill_seed)`.
fn region<N: Nic>(nic: &N, len: usize, access: Access, fill_seed: u64) -> MemoryRegion {
    let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(len));
    let mr = nic.register(memory, 0, len, access).expect("register");
    mr.write(0, &pattern(fill_seed, len));
    mr
}

fn snapshot(mr: &MemoryRegion) -> Vec<u8> {
    bytes(mr, 0, mr.len_bytes())
}

fn bytes(mr: &MemoryRegion, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    mr.read(offset, &mut out);
    out
}

fn overlay(image: &[u8], offset: usize, data: &[u8]) -> Vec<u8> {
    let mut v = image.to_vec();
    v[offset..offset + data.len()].copy_from_slice(data);
    v
}

fn post<Q: QueuePair>(qp: &Q, wrs: &[WorkRequest<'_>]) {
    qp.post_send(wrs)
        .unwrap_or_else(|e| panic!("post_send of {} requests: {e}", wrs.len()));
}

fn post_recv<S: SharedReceiveQueue>(srq: &S, buffers: &[RecvBuffer]) {
    srq.post_recv(buffers)
        .unwrap_or_else(|e| panic!("post_recv of {} buffers: {e}", buffers.len()));
}

fn recv_buffer(wr_id: u64, mr: &MemoryRegion, offset: usize, len_bytes: usize) -> RecvBuffer {
    RecvBuffer {
        wr_id,
        mr: mr.clone(),
        offset,
        len_bytes,
    }
}

fn send(wr_id: u64, data: &[u8]) -> WorkRequest<'_> {
    WorkRequest::new(wr_id, Op::Send { data, imm: None })
}

fn write(wr_id: u64, remote: RemoteAddr, data: &[u8]) -> WorkRequest<'_> {
    WorkRequest::new(
        wr_id,
        Op::Write {
            data,
            remote,
            imm: None,
        },
    )
}

fn read(
    wr_id: u64,
    remote: RemoteAddr,
    len: usize,
    mr: &MemoryRegion,
    offset: usize,
) -> WorkRequest<'_> {
    WorkRequest::new(
        wr_id,
        Op::Read {
            remote,
            len,
            local: LocalAddr { mr, offset },
        },
    )
}

/// Poll once.
fn poll_now<Q: CompletionQueue>(cq: &Q) -> Vec<Completion> {
    let mut out = [BLANK; POLL_BATCH];
    let n = cq.poll(&mut out).unwrap_or_else(|e| panic!("poll: {e}"));
    out[..n].to_vec()
}

/// Poll until exactly `n` completions have been taken; never takes more than `n`.
pub fn wait_completions<Q: CompletionQueue>(cq: &Q, n: usize, what: &str) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    let mut got = Vec::with_capacity(n);
    let mut out = [BLANK; POLL_BATCH];
    while got.len() < n {
        let want = (n - got.len()).min(POLL_BATCH);
        let k = cq
            .poll(&mut out[..want])
            .unwrap_or_else(|e| panic!("{what}: poll: {e}"));
        got.extend_from_slice(&out[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "{what}: {} of {n} completions after {WAIT_MS} ms: {got:?}",
                got.len()
            );
            std::thread::yield_now();
        }
    }
    got
}

fn wait_one<Q: CompletionQueue>(cq: &Q, what: &str) -> Completion {
    wait_completions(cq, 1, what)[0]
}

/// Wait until `cond` holds, without polling any CQ.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not after {WAIT_MS} ms");
        std::thread::yield_now();
    }
}

fn assert_empty<Q: CompletionQueue>(cq: &Q, what: &str) {
    let got = poll_now(cq);
    assert!(got.is_empty(), "{what}: unexpected completions {got:?}");
}

/// The fields every send-queue completion has: (wr_id, status, opcode, qpn).
fn send_wc_key(c: &Completion) -> (u64, WcStatus, WcOpcode, QpNum) {
    (c.wr_id, c.status, c.opcode, c.qpn)
}

fn expect_send_wc<Q: CompletionQueue>(
    cq: &Q,
    qp: &impl QueuePair,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    what: &str,
) {
    let c = wait_one(cq, what);
    assert_eq!(
        send_wc_key(&c),
        (wr_id, status, opcode, qp.addr().qpn),
        "{what}: {c:?}"
    );
}

/// Merge ranges into sorted disjoint ranges.
fn union(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.retain(|r| !r.is_empty());
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// A RegionMemory that records what the NIC did to it

/// DRAM that records, for the persistence and power-failure cases, which bytes were
/// written and not yet persisted, every persist call, and every power failure.
pub struct RecordingMemory {
    inner: DramMemory,
    log: Mutex<Recording>,
}

struct Recording {
    dirty: Vec<bool>,
    persists: Vec<Range<usize>>,
    power_failures: Vec<PowerFailure>,
}

impl RecordingMemory {
    pub fn new(len_bytes: usize) -> Self {
        RecordingMemory {
            inner: DramMemory::new(len_bytes),
            log: Mutex::new(Recording {
                dirty: vec![false; len_bytes],
                persists: Vec::new(),
                power_failures: Vec::new(),
            }),
        }
    }

    /// Forget everything recorded so far (bytes become clean).
    pub fn clear(&self) {
        let mut log = self.log.lock();
        log.dirty.iter_mut().for_each(|d| *d = false);
        log.persists.clear();
        log.power_failures.clear();
    }

    /// Bytes written and not covered by a later persist, as sorted disjoint ranges.
    pub fn dirty(&self) -> Vec<Range<usize>> {
        let log = self.log.lock();
        let mut out: Vec<Range<usize>> = Vec::new();
        for (i, _) in log.dirty.iter().enumerate().filter(|(_, d)| **d) {
            match out.last_mut() {
                Some(last) if last.end == i => last.end = i + 1,
                _ => out.push(i..i + 1),
            }
        }
        out
    }

    /// The ranges of every persist call, in call order.
    pub fn persists(&self) -> Vec<Range<usize>> {
        self.log.lock().persists.clone()
    }

    pub fn power_failures(&self) -> Vec<PowerFailure> {
        self.log.lock().power_failures.clone()
    }

    fn mark_dirty(&self, offset: usize, len: usize) {
        self.log.lock().dirty[offset..offset + len]
            .iter_mut()
            .for_each(|d| *d = true);
    }
}

impl RegionMemory for RecordingMemory {
    fn len_bytes(&self) -> usize {
        self.inner.len_bytes()
    }

    fn dma_write(&self, offset: usize, data: &[u8]) {
        self.inner.dma_write(offset, data);
        self.mark_dirty(offset, data.len());
    }

    fn dma_read(&self, offset: usize, out: &mut [u8]) {
        self.inner.dma_read(offset, out)
    }

    fn dma_persist(&self, offset: usize, len: usize) {
        self.inner.dma_persist(offset, len);
        let mut log = self.log.lock();
        log.dirty[offset..offset + len]
            .iter_mut()
            .for_each(|d| *d = false);
        log.persists.push(offset..offset + len);
    }

    fn dma_compare_swap(&self, offset: usize, expect: u64, swap: u64) -> u64 {
        let old = self.inner.dma_compare_swap(offset, expect, swap);
        self.mark_dirty(offset, 8);
        old
    }

    fn dma_fetch_add(&self, offset: usize, add: u64) -> u64 {
        let old = self.inner.dma_fetch_add(offset, add);
        self.mark_dirty(offset, 8);
        old
    }

    fn power_fail(&self, policy: PowerFailure) {
        self.log.lock().power_failures.push(policy);
        self.inner.power_fail(policy);
    }
}

// ---------------------------------------------------------------------------
// Every operation succeeds and does what it says

pub fn send_lands_in_single_srq<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let buf = region(&p.b.nic, 1024, Access::NONE, 1);
    let before = snapshot(&buf);
    post_recv(&p.b.srq, &[recv_buffer(77, &buf, 128, 256)]);
    assert_eq!(p.b.srq.posted(), 1, "one buffer posted");

    let msg = pattern(2, 100);
    post(&p.qa, &[send(5, &msg)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        5,
        WcStatus::Success,
        WcOpcode::Send,
        "SEND",
    );
    let rc = wait_one(&p.b.recv_cq, "receive completion of SEND");
    assert_eq!(
        rc,
        Completion {
            wr_id: 77,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qpn: p.qb.addr().qpn,
            byte_len: 100,
            offset: 0,
            imm: None,
            src: Some(p.qa.addr()),
        }
    );
    assert_eq!(
        snapshot(&buf),
        overlay(&before, 128, &msg),
        "SEND must land exactly at the buffer start"
    );
    assert_eq!(
        p.b.srq.posted(),
        0,
        "a single-message buffer is consumed by one message"
    );
}

pub fn send_with_imm_carries_imm<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let buf = region(&p.b.nic, 512, Access::NONE, 3);
    let before = snapshot(&buf);
    post_recv(
        &p.b.srq,
        &[recv_buffer(1, &buf, 0, 256), recv_buffer(2, &buf, 256, 256)],
    );

    let msg = pattern(4, 40);
    post(
        &p.qa,
        &[
            WorkRequest::new(
                10,
                Op::Send {
                    data: &msg,
                    imm: Some(0xDEAD_BEEF),
                },
            ),
            WorkRequest::new(
                11,
                Op::Send {
                    data: &[],
                    imm: Some(7),
                },
            ),
        ],
    );
    let sc = wait_completions(&p.a.send_cq, 2, "SEND with imm");
    assert_eq!(
        send_wc_key(&sc[0]),
        (10, WcStatus::Success, WcOpcode::Send, p.qa.addr().qpn)
    );
    assert_eq!(
        send_wc_key(&sc[1]),
        (11, WcStatus::Success, WcOpcode::Send, p.qa.addr().qpn)
    );
    let rc = wait_completions(&p.b.recv_cq, 2, "receive of SEND with imm");
    let expect = |wr_id, byte_len, imm| Completion {
        wr_id,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        qpn: p.qb.addr().qpn,
        byte_len,
        offset: 0,
        imm: Some(imm),
        src: Some(p.qa.addr()),
    };
    assert_eq!(rc[0], expect(1, 40, 0xDEAD_BEEF));
    assert_eq!(
        rc[1],
        expect(2, 0, 7),
        "a zero-length SEND carries only its imm"
    );
    assert_eq!(snapshot(&buf), overlay(&before, 0, &msg));
}

pub fn write_lands_without_target_cpu<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 512, Access::ALL, 5);
    let before = snapshot(&target);
    let buf = region(&p.b.nic, 64, Access::NONE, 6);
    post_recv(&p.b.srq, &[recv_buffer(9, &buf, 0, 64)]);

    let data = pattern(7, 37);
    post(&p.qa, &[write(3, target.remote().at(100), &data)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        3,
        WcStatus::Success,
        WcOpcode::Write,
        "WRITE",
    );
    assert_eq!(
        snapshot(&target),
        overlay(&before, 100, &data),
        "WRITE lands exactly at its offset"
    );
    assert_eq!(p.b.srq.posted(), 1, "a WRITE consumes no receive buffer");

    // Fence: a later SEND of the same QP must be the target's first completion, so
    // the WRITE produced none.
    post(&p.qa, &[send(4, b"fence").unsignaled()]);
    let rc = wait_one(&p.b.recv_cq, "fence SEND");
    assert_eq!(
        (rc.wr_id, rc.opcode, rc.byte_len),
        (9, WcOpcode::Recv, 5),
        "{rc:?}"
    );
    assert_empty(&p.b.recv_cq, "target CQ after WRITE and fence");
}

pub fn write_with_imm_lands_and_notifies<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 512, Access::ALL, 8);
    let before = snapshot(&target);
    let buf = region(&p.b.nic, 128, Access::NONE, 9);
    let buf_before = snapshot(&buf);
    post_recv(&p.b.srq, &[recv_buffer(21, &buf, 0, 128)]);

    let data = pattern(10, 50);
    post(
        &p.qa,
        &[WorkRequest::new(
            6,
            Op::Write {
                data: &data,
                remote: target.remote().at(64),
                imm: Some(0x1234),
            },
        )],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        6,
        WcStatus::Success,
        WcOpcode::Write,
        "WRITE with imm",
    );
    let rc = wait_one(&p.b.recv_cq, "RecvWriteImm");
    assert_eq!(
        rc,
        Completion {
            wr_id: 21,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvWriteImm,
            qpn: p.qb.addr().qpn,
            byte_len: 50,
            offset: 0,
            imm: Some(0x1234),
            src: Some(p.qa.addr()),
        },
        "byte_len of a WRITE-with-imm completion is the length written (ibv_wc)"
    );
    assert_eq!(snapshot(&target), overlay(&before, 64, &data));
    assert_eq!(
        snapshot(&buf),
        buf_before,
        "the receive buffer gets no bytes"
    );
    assert_eq!(p.b.srq.posted(), 0, "WRITE-with-imm consumes a receive");
}

pub fn read_fetches_remote_bytes<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 512, Access::REMOTE_READ, 11);
    let target_before = snapshot(&target);
    let local = region(&p.a.nic, 128, Access::NONE, 12);
    let local_before = snapshot(&local);

    post(&p.qa, &[read(8, target.remote().at(200), 48, &local, 16)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        8,
        WcStatus::Success,
        WcOpcode::Read,
        "READ",
    );
    assert_eq!(
        snapshot(&local),
        overlay(&local_before, 16, &target_before[200..248]),
        "READ lands exactly at the local offset"
    );
    assert_eq!(
        snapshot(&target),
        target_before,
        "READ changes nothing at the target"
    );
}

pub fn compare_swap_swaps_only_on_match<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 64, Access::REMOTE_ATOMIC, 13);
    target.write(8, &0x1111u64.to_le_bytes());
    let before = snapshot(&target);
    let local = region(&p.a.nic, 32, Access::NONE, 14);
    let local_before = snapshot(&local);
    let cas = |wr_id, expect, swap, offset| {
        WorkRequest::new(
            wr_id,
            Op::CompareSwap {
                remote: target.remote().at(8),
                expect,
                swap,
                local: LocalAddr { mr: &local, offset },
            },
        )
    };

    post(&p.qa, &[cas(1, 0x1111, 0x2222, 0)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::Success,
        WcOpcode::CompareSwap,
        "CAS match",
    );
    assert_eq!(local.read_u64(0), 0x1111, "CAS returns the old value");
    assert_eq!(
        snapshot(&target),
        overlay(&before, 8, &0x2222u64.to_le_bytes())
    );

    post(&p.qa, &[cas(2, 0x1111, 0x3333, 8)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        2,
        WcStatus::Success,
        WcOpcode::CompareSwap,
        "CAS mismatch",
    );
    assert_eq!(
        local.read_u64(8),
        0x2222,
        "a failed CAS returns the current value"
    );
    assert_eq!(
        snapshot(&target),
        overlay(&before, 8, &0x2222u64.to_le_bytes()),
        "a failed CAS changes nothing"
    );
    let expect_local = overlay(
        &overlay(&local_before, 0, &0x1111u64.to_le_bytes()),
        8,
        &0x2222u64.to_le_bytes(),
    );
    assert_eq!(
        snapshot(&local),
        expect_local,
        "CAS writes only its 8 local bytes"
    );
}

pub fn fetch_add_returns_old_value<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 64, Access::REMOTE_ATOMIC, 15);
    target.write(16, &40u64.to_le_bytes());
    let before = snapshot(&target);
    let local = region(&p.a.nic, 16, Access::NONE, 16);
    let faa = |wr_id, add, offset| {
        WorkRequest::new(
            wr_id,
            Op::FetchAdd {
                remote: target.remote().at(16),
                add,
                local: LocalAddr { mr: &local, offset },
            },
        )
    };
    post(&p.qa, &[faa(1, 2, 0)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::Success,
        WcOpcode::FetchAdd,
        "FAA +2",
    );
    assert_eq!(local.read_u64(0), 40);
    assert_eq!(
        snapshot(&target),
        overlay(&before, 16, &42u64.to_le_bytes())
    );
    post(&p.qa, &[faa(2, u64::MAX, 8)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        2,
        WcStatus::Success,
        WcOpcode::FetchAdd,
        "FAA -1",
    );
    assert_eq!(local.read_u64(8), 42);
    assert_eq!(
        snapshot(&target),
        overlay(&before, 16, &41u64.to_le_bytes()),
        "FAA wraps"
    );
}

// ---------------------------------------------------------------------------
// Remote access errors

/// A pair, a local region on A, a scratch region on B for recovery checks, and one
/// receive buffer posted at B so that a refused WRITE-with-imm can be seen not to
/// consume it.
struct Refusals<N: Nic> {
    p: Pair<N>,
    local: MemoryRegion,
    scratch: MemoryRegion,
    next_wr_id: std::cell::Cell<u64>,
}

impl<N: Nic> Refusals<N> {
    fn new<F: Fabric<Nic = N>>(fabric: &F) -> Self {
        let p = pair(fabric, EndpointConfig::single(), 8);
        let local = region(&p.a.nic, 64, Access::NONE, 20);
        let scratch = region(&p.b.nic, 64, Access::ALL, 21);
        let buf = region(&p.b.nic, 64, Access::NONE, 22);
        post_recv(&p.b.srq, &[recv_buffer(99, &buf, 0, 64)]);
        Refusals {
            p,
            local,
            scratch,
            next_wr_id: std::cell::Cell::new(1000),
        }
    }

    fn imm_write<'a>(remote: RemoteAddr, data: &'a [u8]) -> Op<'a> {
        Op::Write {
            data,
            remote,
            imm: Some(1),
        }
    }

    fn cas(&self, remote: RemoteAddr) -> Op<'_> {
        Op::CompareSwap {
            remote,
            expect: 0,
            swap: u64::MAX,
            local: LocalAddr {
                mr: &self.local,
                offset: 8,
            },
        }
    }

    fn faa(&self, remote: RemoteAddr) -> Op<'_> {
        Op::FetchAdd {
            remote,
            add: 1,
            local: LocalAddr {
                mr: &self.local,
                offset: 8,
            },
        }
    }

    fn read(&self, remote: RemoteAddr, len: usize) -> Op<'_> {
        Op::Read {
            remote,
            len,
            local: LocalAddr {
                mr: &self.local,
                offset: 0,
            },
        }
    }

    /// Post `op` unsignaled and check the whole error model: RemoteAccessError,
    /// nothing changed at either end, QP in Error, the next request flushed, and
    /// `reset` restoring service.
    fn expect_refused(&self, target: &MemoryRegion, what: &str, op: Op<'_>) {
        let opcode = match op {
            Op::Send { .. } => WcOpcode::Send,
            Op::Write { .. } => WcOpcode::Write,
            Op::Read { .. } => WcOpcode::Read,
            Op::CompareSwap { .. } => WcOpcode::CompareSwap,
            Op::FetchAdd { .. } => WcOpcode::FetchAdd,
            Op::Flush { .. } => WcOpcode::Flush,
            Op::AtomicWrite { .. } => WcOpcode::AtomicWrite,
        };
        let target_before = snapshot(target);
        let local_before = snapshot(&self.local);
        let scratch_before = snapshot(&self.scratch);
        let wr_id = self.next_wr_id.get();
        self.next_wr_id.set(wr_id + 2);
        let (qa, send_cq) = (&self.p.qa, &self.p.a.send_cq);

        post(qa, &[WorkRequest::new(wr_id, op).unsignaled()]);
        let c = wait_one(send_cq, what);
        assert_eq!(
            send_wc_key(&c),
            (wr_id, WcStatus::RemoteAccessError, opcode, qa.addr().qpn),
            "{what}: an error completes even unsignaled: {c:?}"
        );
        assert_eq!(
            snapshot(target),
            target_before,
            "{what}: target bytes changed"
        );
        assert_eq!(
            snapshot(&self.local),
            local_before,
            "{what}: local bytes changed"
        );
        assert_eq!(qa.state(), QpState::Error, "{what}: QP must enter Error");
        assert_eq!(
            self.p.b.srq.posted(),
            1,
            "{what}: a refused request consumed a receive"
        );

        let probe = pattern(wr_id, 16);
        post(qa, &[write(wr_id + 1, self.scratch.remote().at(0), &probe)]);
        expect_send_wc(
            send_cq,
            qa,
            wr_id + 1,
            WcStatus::WrFlushError,
            WcOpcode::Write,
            what,
        );
        assert_eq!(
            snapshot(&self.scratch),
            scratch_before,
            "{what}: a flushed WRITE landed"
        );

        qa.reset().unwrap_or_else(|e| panic!("{what}: reset: {e}"));
        assert_eq!(
            qa.state(),
            QpState::Ready,
            "{what}: reset must return to Ready"
        );
        post(qa, &[write(wr_id + 1, self.scratch.remote().at(0), &probe)]);
        expect_send_wc(
            send_cq,
            qa,
            wr_id + 1,
            WcStatus::Success,
            WcOpcode::Write,
            what,
        );
        assert_eq!(
            snapshot(&self.scratch),
            overlay(&scratch_before, 0, &probe),
            "{what}: after reset"
        );
        assert_eq!(
            snapshot(target),
            target_before,
            "{what}: target bytes changed later"
        );
    }
}

pub fn wrong_rkey_is_remote_access_error<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let f = Refusals::new(&fabric);
    let target = region(&f.p.b.nic, 256, Access::ALL, 23);
    let known = [target.rkey, f.scratch.rkey];
    let wrong = [0x0100_0000u32, 0x8000_0000, 2, 0xFFFF_FFFF]
        .iter()
        .map(|x| Rkey(target.rkey.0 ^ x))
        .find(|k| !known.contains(k))
        .expect("a key not registered at B");
    let at = |offset| RemoteAddr {
        rkey: wrong,
        offset,
    };
    let data = [0xA5u8; 16];
    f.expect_refused(
        &target,
        "WRITE, wrong rkey",
        Op::Write {
            data: &data,
            remote: at(0),
            imm: None,
        },
    );
    f.expect_refused(
        &target,
        "WRITE-imm, wrong rkey",
        Refusals::<NicOf<B>>::imm_write(at(0), &data),
    );
    let op = f.read(at(0), 16);
    f.expect_refused(&target, "READ, wrong rkey", op);
    let op = f.cas(at(0));
    f.expect_refused(&target, "CAS, wrong rkey", op);
    let op = f.faa(at(0));
    f.expect_refused(&target, "FAA, wrong rkey", op);
}

pub fn out_of_bounds_is_remote_access_error<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let f = Refusals::new(&fabric);
    let target = region(&f.p.b.nic, 256, Access::ALL, 24);
    let r = target.remote();
    let data = [0x5Au8; 8];
    let w = |offset| Op::Write {
        data: &data,
        remote: r.at(offset),
        imm: None,
    };
    f.expect_refused(&target, "WRITE past end by 2", w(250));
    f.expect_refused(
        &target,
        "WRITE at end",
        Op::Write {
            data: &data[..1],
            remote: r.at(256),
            imm: None,
        },
    );
    f.expect_refused(&target, "WRITE offset u64::MAX", w(u64::MAX));
    f.expect_refused(&target, "WRITE offset+len overflows", w(u64::MAX - 3));
    f.expect_refused(
        &target,
        "WRITE-imm past end",
        Refusals::<NicOf<B>>::imm_write(r.at(252), &data),
    );
    let op = f.read(r.at(200), 57);
    f.expect_refused(&target, "READ past end by 1", op);
    let op = f.read(r.at(u64::MAX), 1);
    f.expect_refused(&target, "READ offset u64::MAX", op);
    let op = f.cas(r.at(256));
    f.expect_refused(&target, "CAS at end", op);
    let op = f.faa(r.at(u64::MAX - 7));
    f.expect_refused(&target, "FAA offset+8 overflows", op);
    let flush = |offset, len| Op::Flush {
        remote: r.at(offset),
        len,
        placement: Placement::Persistence,
    };
    f.expect_refused(&target, "FLUSH past end by 1", flush(200, 57));
    f.expect_refused(&target, "FLUSH offset+len overflows", flush(8, usize::MAX));
    f.expect_refused(
        &target,
        "ATOMIC WRITE at end",
        Op::AtomicWrite {
            remote: r.at(256),
            value: 1,
        },
    );
}

pub fn missing_right_is_remote_access_error<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let f = Refusals::new(&fabric);
    let nic = f.p.b.nic.clone();
    let read_only = region(&nic, 64, Access::REMOTE_READ, 25);
    let write_only = region(&nic, 64, Access::REMOTE_WRITE, 26);
    let no_atomic = region(&nic, 64, Access::REMOTE_READ | Access::REMOTE_WRITE, 27);
    let none = region(&nic, 64, Access::NONE, 28);
    let data = [1u8; 8];
    let w = |mr: &MemoryRegion| Op::Write {
        data: &data,
        remote: mr.remote().at(8),
        imm: None,
    };
    f.expect_refused(&read_only, "WRITE to READ-only", w(&read_only));
    f.expect_refused(&none, "WRITE to no-rights", w(&none));
    f.expect_refused(
        &read_only,
        "WRITE-imm to READ-only",
        Refusals::<NicOf<B>>::imm_write(read_only.remote().at(8), &data),
    );
    let op = f.read(write_only.remote().at(8), 8);
    f.expect_refused(&write_only, "READ from WRITE-only", op);
    let op = f.read(none.remote().at(8), 8);
    f.expect_refused(&none, "READ from no-rights", op);
    let op = f.cas(no_atomic.remote().at(8));
    f.expect_refused(&no_atomic, "CAS without ATOMIC", op);
    let op = f.faa(no_atomic.remote().at(8));
    f.expect_refused(&no_atomic, "FAA without ATOMIC", op);
    let atomic_only = region(&nic, 64, Access::REMOTE_ATOMIC, 30);
    f.expect_refused(
        &atomic_only,
        "ATOMIC WRITE without WRITE",
        Op::AtomicWrite {
            remote: atomic_only.remote().at(8),
            value: 7,
        },
    );
}

pub fn misaligned_atomic_is_remote_access_error<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let f = Refusals::new(&fabric);
    let target = region(&f.p.b.nic, 64, Access::ALL, 29);
    let r = target.remote();
    for offset in [4u64, 1, 12, 63 - 8] {
        let op = f.cas(r.at(offset));
        f.expect_refused(&target, &format!("CAS at offset {offset}"), op);
        let op = f.faa(r.at(offset));
        f.expect_refused(&target, &format!("FAA at offset {offset}"), op);
        let op = Op::AtomicWrite {
            remote: r.at(offset),
            value: 3,
        };
        f.expect_refused(&target, &format!("ATOMIC WRITE at offset {offset}"), op);
    }
}

pub fn deregistered_rkey_is_remote_access_error<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let f = Refusals::new(&fabric);
    let target = region(&f.p.b.nic, 128, Access::ALL, 30);
    let r = target.remote();
    f.p.b.nic.deregister(target.rkey).expect("deregister");
    assert!(
        f.p.b.nic.deregister(target.rkey).is_err(),
        "deregistering twice must fail"
    );
    let data = [7u8; 8];
    f.expect_refused(
        &target,
        "WRITE after deregister",
        Op::Write {
            data: &data,
            remote: r.at(0),
            imm: None,
        },
    );
    let op = f.read(r.at(0), 8);
    f.expect_refused(&target, "READ after deregister", op);
    let op = f.cas(r.at(0));
    f.expect_refused(&target, "CAS after deregister", op);
}

// ---------------------------------------------------------------------------
// Per-QP ordering

pub fn writes_to_one_address_last_wins<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 64);
    let target = region(&p.b.nic, 128, Access::ALL, 31);
    let before = snapshot(&target);
    let values: Vec<[u8; 8]> = (1..=64u64).map(|v| v.to_le_bytes()).collect();
    // One batch: all unsignaled but the last.
    let wrs: Vec<WorkRequest<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let wr = write(i as u64, target.remote().at(40), v);
            if i + 1 == values.len() {
                wr
            } else {
                wr.unsignaled()
            }
        })
        .collect();
    post(&p.qa, &wrs);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        63,
        WcStatus::Success,
        WcOpcode::Write,
        "last of batch",
    );
    assert_eq!(
        snapshot(&target),
        overlay(&before, 40, &64u64.to_le_bytes()),
        "batch: last WRITE wins"
    );
    // One post per request, no polling in between.
    for i in 0..32u64 {
        let v = (1000 + i).to_le_bytes();
        let wr = write(100 + i, target.remote().at(40), &v);
        post(&p.qa, &[if i == 31 { wr } else { wr.unsignaled() }]);
    }
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        131,
        WcStatus::Success,
        WcOpcode::Write,
        "last of posts",
    );
    assert_eq!(
        snapshot(&target),
        overlay(&before, 40, &1031u64.to_le_bytes()),
        "posts: last WRITE wins"
    );
}

pub fn read_after_write_on_one_qp_sees_the_write<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 32);
    let target = region(&p.b.nic, 256, Access::ALL, 32);
    let local = region(&p.a.nic, 10 * 32, Access::NONE, 33);
    let datas: Vec<Vec<u8>> = (0..10).map(|i| pattern(100 + i, 32)).collect();
    for (i, d) in datas.iter().enumerate() {
        post(
            &p.qa,
            &[
                write(2 * i as u64, target.remote().at(96), d).unsignaled(),
                read(2 * i as u64 + 1, target.remote().at(96), 32, &local, i * 32),
            ],
        );
    }
    let cs = wait_completions(&p.a.send_cq, 10, "READs");
    for (i, c) in cs.iter().enumerate() {
        assert_eq!(
            send_wc_key(c),
            (
                2 * i as u64 + 1,
                WcStatus::Success,
                WcOpcode::Read,
                p.qa.addr().qpn
            )
        );
        assert_eq!(
            bytes(&local, i * 32, 32),
            datas[i],
            "READ {i} must see WRITE {i}, not a later one"
        );
    }
}

pub fn sends_land_in_posting_order<B: Backend>(b: &B) {
    // Multi-packet: offsets increase with posting order.
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::multi_packet(), 32);
    let buf = region(&p.b.nic, 4096, Access::NONE, 34);
    post_recv(&p.b.srq, &[recv_buffer(1, &buf, 0, 4096)]);
    let msgs: Vec<Vec<u8>> = (0..32u8).map(|i| vec![i; 64]).collect();
    let wrs: Vec<_> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| send(i as u64, m).unsignaled())
        .collect();
    post(&p.qa, &wrs);
    let rc = wait_completions(&p.b.recv_cq, 32, "multi-packet SENDs");
    for (k, c) in rc.iter().enumerate() {
        assert_eq!(
            (c.status, c.wr_id, c.offset, c.byte_len),
            (WcStatus::Success, 1, 64 * k as u64, 64),
            "{c:?}"
        );
        assert_eq!(
            bytes(&buf, 64 * k, 64),
            msgs[k],
            "message {k} at offset {}",
            64 * k
        );
    }

    // One message per buffer: buffers taken in posting order by messages in
    // posting order.
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 32);
    let buf = region(&p.b.nic, 8 * 64, Access::NONE, 35);
    let buffers: Vec<_> = (0..8)
        .map(|i| recv_buffer(100 + i as u64, &buf, i * 64, 64))
        .collect();
    post_recv(&p.b.srq, &buffers);
    let wrs: Vec<_> = msgs[..8]
        .iter()
        .enumerate()
        .map(|(i, m)| send(i as u64, &m[..10]).unsignaled())
        .collect();
    post(&p.qa, &wrs);
    let rc = wait_completions(&p.b.recv_cq, 8, "single SENDs");
    for (k, c) in rc.iter().enumerate() {
        assert_eq!(
            (c.status, c.wr_id, c.offset, c.byte_len),
            (WcStatus::Success, 100 + k as u64, 0, 10),
            "{c:?}"
        );
        assert_eq!(bytes(&buf, 64 * k, 10), msgs[k][..10], "message {k}");
    }
}

// ---------------------------------------------------------------------------
// Signaled and unsignaled requests; the send-queue bound

pub fn only_signaled_success_completes<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 16);
    let target = region(&p.b.nic, 64, Access::ALL, 36);
    let local = region(&p.a.nic, 64, Access::NONE, 37);
    let buf = region(&p.b.nic, 64, Access::NONE, 38);
    post_recv(&p.b.srq, &[recv_buffer(1, &buf, 0, 64)]);
    let r = target.remote();
    let data = pattern(39, 16);
    post(
        &p.qa,
        &[
            write(1, r.at(0), &data).unsignaled(),
            send(2, b"hi").unsignaled(),
            read(3, r.at(0), 16, &local, 32).unsignaled(),
            WorkRequest::new(
                4,
                Op::FetchAdd {
                    remote: r.at(48),
                    add: 5,
                    local: LocalAddr {
                        mr: &local,
                        offset: 56,
                    },
                },
            )
            .unsignaled(),
            write(u64::MAX, r.at(16), &data),
        ],
    );
    let c = wait_one(&p.a.send_cq, "signaled after four unsignaled");
    assert_eq!(
        send_wc_key(&c),
        (
            u64::MAX,
            WcStatus::Success,
            WcOpcode::Write,
            p.qa.addr().qpn
        )
    );
    assert_empty(&p.a.send_cq, "unsignaled successes must not complete");
    // The unsignaled requests did execute.
    assert_eq!(bytes(&target, 0, 16), data);
    assert_eq!(bytes(&local, 32, 16), data, "unsignaled READ");
    let rc = wait_one(&p.b.recv_cq, "unsignaled SEND");
    assert_eq!((rc.wr_id, rc.byte_len), (1, 2));
    assert_eq!(bytes(&buf, 0, 2), b"hi");

    // wr_id round trip for every opcode.
    let ids = [0u64, 0x0123_4567_89AB_CDEF, 42, u64::MAX - 1];
    post(
        &p.qa,
        &[
            write(ids[0], r.at(0), &data),
            read(ids[1], r.at(0), 8, &local, 0),
            WorkRequest::new(
                ids[2],
                Op::CompareSwap {
                    remote: r.at(8),
                    expect: 0,
                    swap: 0,
                    local: LocalAddr {
                        mr: &local,
                        offset: 8,
                    },
                },
            ),
            WorkRequest::new(
                ids[3],
                Op::FetchAdd {
                    remote: r.at(48),
                    add: 0,
                    local: LocalAddr {
                        mr: &local,
                        offset: 16,
                    },
                },
            ),
        ],
    );
    let cs = wait_completions(&p.a.send_cq, 4, "wr_id round trip");
    let got: Vec<_> = cs.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (ids[0], WcStatus::Success, WcOpcode::Write),
            (ids[1], WcStatus::Success, WcOpcode::Read),
            (ids[2], WcStatus::Success, WcOpcode::CompareSwap),
            (ids[3], WcStatus::Success, WcOpcode::FetchAdd),
        ]
    );
}

pub fn send_queue_bound<B: Backend>(b: &B) {
    const DEPTH: usize = 8;
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), DEPTH);
    let target = region(&p.b.nic, 256, Access::ALL, 40);
    let before = snapshot(&target);
    let r = target.remote();
    let v = |i: u64| i.to_le_bytes();
    let vals: Vec<[u8; 8]> = (0..32).map(v).collect();

    // 5 unsignaled, 1 signaled (wr 5), 2 unsignaled: the queue is full.
    let wrs: Vec<_> = (0..DEPTH)
        .map(|i| {
            let wr = write(i as u64, r.at(8 * i as u64), &vals[i]);
            if i == 5 {
                wr
            } else {
                wr.unsignaled()
            }
        })
        .collect();
    post(&p.qa, &wrs);
    assert_eq!(p.qa.outstanding(), DEPTH);
    let one_more = [write(8, r.at(64), &vals[8])];
    assert_eq!(
        p.qa.post_send(&one_more),
        Err(FabricError::SendQueueFull {
            outstanding: DEPTH,
            depth: DEPTH
        })
    );
    assert_eq!(p.qa.outstanding(), DEPTH, "a refused post adds nothing");

    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        5,
        WcStatus::Success,
        WcOpcode::Write,
        "signaled wr 5",
    );
    wait_until("polling wr 5 retires it and the five before it", || {
        p.qa.outstanding() == 2
    });

    // 2 outstanding + 7 > 8: nothing of the batch may be posted.
    let too_many: Vec<_> = (0..7)
        .map(|i| write(100 + i, r.at(128 + 8 * i), &vals[20]))
        .collect();
    assert_eq!(
        p.qa.post_send(&too_many),
        Err(FabricError::SendQueueFull {
            outstanding: 2,
            depth: DEPTH
        })
    );
    assert_eq!(p.qa.outstanding(), 2);
    // 2 + 6 fits.
    let fits: Vec<_> = (0..6)
        .map(|i| {
            let wr = write(200 + i, r.at(192 + 8 * i), &vals[21]);
            if i == 5 {
                wr
            } else {
                wr.unsignaled()
            }
        })
        .collect();
    post(&p.qa, &fits);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        205,
        WcStatus::Success,
        WcOpcode::Write,
        "last of fitting batch",
    );
    wait_until("all slots retired", || p.qa.outstanding() == 0);
    assert_empty(&p.a.send_cq, "only signaled requests complete");
    assert_eq!(
        bytes(&target, 128, 56),
        before[128..184],
        "the refused batch must not have executed"
    );
    for i in 0..6 {
        assert_eq!(
            bytes(&target, 192 + 8 * i, 8),
            vals[21],
            "fitting batch request {i}"
        );
    }
    for (i, val) in vals.iter().enumerate().take(DEPTH) {
        assert_eq!(bytes(&target, 8 * i, 8), val, "first batch request {i}");
    }
}

pub fn bounded_cq_overflow_is_an_error<B: Backend>(b: &B) {
    const CAPACITY: usize = 4;
    let fabric = b.fabric();
    let config_a = EndpointConfig {
        send_cq: CqKind::Bounded { capacity: CAPACITY },
        ..EndpointConfig::single()
    };
    let p = connected_pair(&fabric, (A, config_a), (B, EndpointConfig::single()), 16);
    let target = region(&p.b.nic, 64, Access::ALL, 41);
    let data = [3u8; 8];
    for i in 0..CAPACITY as u64 {
        post(&p.qa, &[write(i, target.remote().at(8 * i), &data)]);
    }
    assert_eq!(p.qa.state(), QpState::Ready, "a full CQ is not an overflow");
    post(&p.qa, &[write(99, target.remote().at(40), &data)]);
    wait_until("the QP that overflowed its CQ enters Error", || {
        p.qa.state() == QpState::Error
    });
    let mut out = [BLANK; 8];
    assert_eq!(
        p.a.send_cq.poll(&mut out),
        Err(FabricError::CqOverflow { capacity: CAPACITY })
    );
}

pub fn ring_cq_overwrites_oldest<B: Backend>(b: &B) {
    const CAPACITY: usize = 4;
    const N: usize = 3 * CAPACITY;
    let fabric = b.fabric();
    let ring = CqKind::Ring { capacity: CAPACITY };
    let config_a = EndpointConfig {
        send_cq: ring,
        ..EndpointConfig::single()
    };
    let config_b = EndpointConfig {
        recv_cq: ring,
        ..EndpointConfig::multi_packet()
    };
    let p = connected_pair(&fabric, (A, config_a), (B, config_b), N);
    let target = region(&p.b.nic, 8 * N, Access::ALL, 42);

    // Send CQ: 3C signaled WRITEs, never polled until the ring has wrapped twice.
    let vals: Vec<[u8; 8]> = (0..N as u64).map(|i| (i + 1).to_le_bytes()).collect();
    for (i, v) in vals.iter().enumerate() {
        post(
            &p.qa,
            &[write(i as u64, target.remote().at(8 * i as u64), v)],
        );
    }
    wait_until("send ring overwrote 2C entries", || {
        p.a.send_cq.overwritten() == 2 * CAPACITY as u64
    });
    assert_eq!(p.qa.state(), QpState::Ready, "a ring CQ never overflows");
    let got = poll_now(&p.a.send_cq);
    let ids: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    let expect: Vec<_> = (2 * CAPACITY..N)
        .map(|i| (i as u64, WcStatus::Success))
        .collect();
    assert_eq!(
        ids, expect,
        "a poll returns the most recent C entries, oldest first"
    );
    assert_eq!(p.a.send_cq.overwritten(), 2 * CAPACITY as u64);
    for (i, v) in vals.iter().enumerate() {
        assert_eq!(&bytes(&target, 8 * i, 8), v, "WRITE {i}");
    }
    wait_until("polling the newest entry retires every slot", || {
        p.qa.outstanding() == 0
    });

    // Receive CQ: 3C SENDs into a multi-packet SRQ, never polled.
    let buf = region(&p.b.nic, 64 * N, Access::NONE, 43);
    post_recv(&p.b.srq, &[recv_buffer(7, &buf, 0, 64 * N)]);
    let msgs: Vec<Vec<u8>> = (0..N as u8).map(|i| vec![i; 64]).collect();
    let wrs: Vec<_> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| send(1000 + i as u64, m).unsignaled())
        .collect();
    post(&p.qa, &wrs);
    wait_until("receive ring overwrote 2C entries", || {
        p.b.recv_cq.overwritten() == 2 * CAPACITY as u64
    });
    assert_eq!(p.qb.state(), QpState::Ready, "receiving QP stays Ready");
    assert_eq!(p.qa.state(), QpState::Ready, "sending QP stays Ready");
    let got = poll_now(&p.b.recv_cq);
    let offs: Vec<_> = got.iter().map(|c| (c.wr_id, c.offset, c.status)).collect();
    let expect: Vec<_> = (2 * CAPACITY..N)
        .map(|i| (7, 64 * i as u64, WcStatus::Success))
        .collect();
    assert_eq!(offs, expect, "most recent C receive completions");
}

// ---------------------------------------------------------------------------
// Multi-packet shared receive queue

pub fn mp_srq_lands_stride_aligned<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::multi_packet(), 16);
    let buf = region(&p.b.nic, 2048, Access::NONE, 44);
    let mut image = snapshot(&buf);
    // The buffer sits at region offset 512 so that buffer and region offsets differ.
    post_recv(&p.b.srq, &[recv_buffer(1, &buf, 512, 1024)]);
    let cases = [
        (1usize, 0u64),
        (64, 64),
        (65, 128),
        (100, 256),
        (200, 384),
        (384, 640),
    ];
    for (i, &(len, offset)) in cases.iter().enumerate() {
        let msg = pattern(200 + i as u64, len);
        post(&p.qa, &[send(i as u64, &msg).unsignaled()]);
        let c = wait_one(&p.b.recv_cq, "multi-packet SEND");
        assert_eq!(
            c,
            Completion {
                wr_id: 1,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                qpn: p.qb.addr().qpn,
                byte_len: len as u32,
                offset,
                imm: None,
                src: Some(p.qa.addr()),
            },
            "message of {len} B"
        );
        image = overlay(&image, 512 + offset as usize, &msg);
        assert_eq!(
            snapshot(&buf),
            image,
            "message of {len} B lands at {offset}, padding untouched"
        );
        let posted = if i + 1 < cases.len() { 1 } else { 0 };
        assert_eq!(p.b.srq.posted(), posted, "after the message of {len} B");
    }
}

pub fn mp_srq_buffer_shared_by_two_qps<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let nb = Endpoint::new(
        fabric.attach(B).expect("attach"),
        EndpointConfig::multi_packet(),
    );
    let na = Endpoint::new(fabric.attach(A).expect("attach"), EndpointConfig::single());
    let nc = Endpoint::new(fabric.attach(C).expect("attach"), EndpointConfig::single());
    let (qa, qba) = connect(&na, &nb, 8);
    let (qc, qbc) = connect(&nc, &nb, 8);
    let buf = region(&nb.nic, 1024, Access::NONE, 45);
    let mut image = snapshot(&buf);
    post_recv(&nb.srq, &[recv_buffer(3, &buf, 0, 1024)]);
    let steps: [(&_, &_, usize, u64); 4] = [
        (&qa, &qba, 100, 0),
        (&qc, &qbc, 10, 128),
        (&qa, &qba, 64, 192),
        (&qc, &qbc, 1, 256),
    ];
    for (i, (sender, receiver, len, offset)) in steps.into_iter().enumerate() {
        let msg = pattern(300 + i as u64, len);
        post(sender, &[send(i as u64, &msg).unsignaled()]);
        let c = wait_one(&nb.recv_cq, "SEND from two QPs");
        assert_eq!(
            (c.wr_id, c.status, c.offset, c.byte_len, c.src, c.qpn),
            (
                3,
                WcStatus::Success,
                offset,
                len as u32,
                Some(sender.addr()),
                receiver.addr().qpn
            ),
            "message {i}"
        );
        image = overlay(&image, offset as usize, &msg);
    }
    assert_eq!(snapshot(&buf), image);
}

pub fn mp_srq_spills_to_next_buffer<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::multi_packet(), 16);
    let buf = region(&p.b.nic, 1024, Access::NONE, 46);
    let mut image = snapshot(&buf);
    post_recv(
        &p.b.srq,
        &[recv_buffer(1, &buf, 0, 512), recv_buffer(2, &buf, 512, 512)],
    );
    assert_eq!(p.b.srq.posted(), 2);
    // 300 B at 0 (next free 320); 256 B does not fit in [320, 512): it goes to the
    // start of buffer 2 and [300, 512) of buffer 1 stays untouched.
    let steps = [
        (300usize, 1u64, 0u64, 2usize),
        (256, 2, 0, 1),
        (192, 2, 256, 1),
        (64, 2, 448, 0),
    ];
    for (i, &(len, wr_id, offset, posted)) in steps.iter().enumerate() {
        let msg = pattern(400 + i as u64, len);
        post(&p.qa, &[send(i as u64, &msg).unsignaled()]);
        let c = wait_one(&p.b.recv_cq, "spill");
        assert_eq!(
            (c.wr_id, c.status, c.offset, c.byte_len),
            (wr_id, WcStatus::Success, offset, len as u32),
            "message {i} of {len} B"
        );
        let base = if wr_id == 1 { 0 } else { 512 };
        image = overlay(&image, base + offset as usize, &msg);
        assert_eq!(
            snapshot(&buf),
            image,
            "message {i}: tail of buffer 1 must be skipped untouched"
        );
        assert_eq!(p.b.srq.posted(), posted, "posted() after message {i}");
    }
}

pub fn mp_srq_consumes_in_posting_order<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::multi_packet(), 16);
    let buf = region(&p.b.nic, 3072, Access::NONE, 47);
    let mut image = snapshot(&buf);
    // Posted at non-monotonic addresses: order must follow posting, not address.
    let order = [(10u64, 2048usize), (11, 0), (12, 1024)];
    let buffers: Vec<_> = order
        .iter()
        .map(|&(w, o)| recv_buffer(w, &buf, o, 1024))
        .collect();
    post_recv(&p.b.srq, &buffers);
    for (i, &(wr_id, at)) in order.iter().enumerate() {
        let msg = pattern(500 + i as u64, 1000);
        post(&p.qa, &[send(i as u64, &msg).unsignaled()]);
        let c = wait_one(&p.b.recv_cq, "posting order");
        assert_eq!(
            (c.wr_id, c.offset, c.byte_len, c.status),
            (wr_id, 0, 1000, WcStatus::Success),
            "message {i}"
        );
        image = overlay(&image, at, &msg);
        assert_eq!(
            snapshot(&buf),
            image,
            "message {i} lands in buffer {wr_id} at region offset {at}"
        );
        assert_eq!(
            p.b.srq.posted(),
            order.len() - 1 - i,
            "a buffer filled to its last stride is consumed"
        );
    }
}

pub fn mp_srq_message_larger_than_buffer<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::multi_packet(), 16);
    let buf = region(&p.b.nic, 512, Access::NONE, 48);
    let before = snapshot(&buf);
    post_recv(
        &p.b.srq,
        &[recv_buffer(1, &buf, 0, 256), recv_buffer(2, &buf, 256, 256)],
    );
    let big = pattern(49, 257);
    post(&p.qa, &[send(5, &big).unsignaled()]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        5,
        WcStatus::RemoteInvalidRequest,
        WcOpcode::Send,
        "too large",
    );
    assert_eq!(p.qa.state(), QpState::Error, "sender QP enters Error");
    let rc = wait_one(&p.b.recv_cq, "LocalLengthError");
    assert_eq!(
        (rc.wr_id, rc.status, rc.opcode, rc.qpn),
        (
            1,
            WcStatus::LocalLengthError,
            WcOpcode::Recv,
            p.qb.addr().qpn
        ),
        "the receiver's error names the buffer at the head: {rc:?}"
    );
    assert_eq!(snapshot(&buf), before, "nothing written");

    // An unused buffer is not consumed by a message it could never hold.
    p.qa.reset().expect("reset");
    let small = pattern(50, 64);
    post(&p.qa, &[send(6, &small).unsignaled()]);
    let rc = wait_one(&p.b.recv_cq, "after reset");
    assert_eq!(
        (rc.wr_id, rc.offset, rc.status),
        (1, 0, WcStatus::Success),
        "{rc:?}"
    );
    let image = overlay(&before, 0, &small);
    assert_eq!(snapshot(&buf), image);

    // Too large with the head buffer partly used: still refused, nothing written.
    post(&p.qa, &[send(7, &pattern(51, 300)).unsignaled()]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        7,
        WcStatus::RemoteInvalidRequest,
        WcOpcode::Send,
        "too large 2",
    );
    let rc = wait_one(&p.b.recv_cq, "LocalLengthError 2");
    assert_eq!(rc.status, WcStatus::LocalLengthError, "{rc:?}");
    assert_eq!(snapshot(&buf), image, "nothing written");
}

pub fn single_srq_message_larger_than_buffer<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 16);
    let buf = region(&p.b.nic, 256, Access::NONE, 52);
    let before = snapshot(&buf);
    post_recv(
        &p.b.srq,
        &[recv_buffer(5, &buf, 0, 128), recv_buffer(6, &buf, 128, 128)],
    );
    post(&p.qa, &[send(1, &pattern(53, 129))]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::RemoteInvalidRequest,
        WcOpcode::Send,
        "too large",
    );
    assert_eq!(p.qa.state(), QpState::Error);
    let rc = wait_one(&p.b.recv_cq, "LocalLengthError");
    assert_eq!(
        (rc.wr_id, rc.status, rc.opcode, rc.qpn),
        (
            5,
            WcStatus::LocalLengthError,
            WcOpcode::Recv,
            p.qb.addr().qpn
        ),
        "{rc:?}"
    );
    assert_eq!(snapshot(&buf), before, "nothing written");
}

pub fn srq_without_buffer_is_rnr<B: Backend>(b: &B) {
    for config in [EndpointConfig::single(), EndpointConfig::multi_packet()] {
        let fabric = b.fabric();
        let p = pair(&fabric, config, 8);
        let what = format!("{:?}", config.srq);
        let target = region(&p.b.nic, 64, Access::ALL, 54);
        let before = snapshot(&target);
        post(&p.qa, &[send(1, b"nobody listens").unsignaled()]);
        expect_send_wc(
            &p.a.send_cq,
            &p.qa,
            1,
            WcStatus::RnrRetryExceeded,
            WcOpcode::Send,
            &what,
        );
        assert_eq!(p.qa.state(), QpState::Error, "{what}");
        p.qa.reset().expect("reset");
        let data = [9u8; 16];
        post(
            &p.qa,
            &[WorkRequest::new(
                2,
                Op::Write {
                    data: &data,
                    remote: target.remote().at(0),
                    imm: Some(3),
                },
            )],
        );
        expect_send_wc(
            &p.a.send_cq,
            &p.qa,
            2,
            WcStatus::RnrRetryExceeded,
            WcOpcode::Write,
            &what,
        );
        assert_eq!(
            snapshot(&target),
            before,
            "{what}: a WRITE-with-imm without a receive changes nothing"
        );
        assert_eq!(p.qa.state(), QpState::Error, "{what}");
        assert_empty(&p.b.recv_cq, &what);
    }
}

pub fn srq_buffers_max_bound<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let config = EndpointConfig {
        srq: SrqConfig::multi_packet(2),
        ..EndpointConfig::single()
    };
    let p = pair(&fabric, config, 8);
    let buf = region(&p.b.nic, 4 * 256, Access::NONE, 55);
    let three: Vec<_> = (0..3)
        .map(|i| recv_buffer(i as u64, &buf, 256 * i, 256))
        .collect();
    assert_eq!(
        p.b.srq.post_recv(&three),
        Err(FabricError::RecvQueueFull {
            posted: 0,
            buffers_max: 2
        })
    );
    assert_eq!(p.b.srq.posted(), 0, "a refused batch posts nothing");
    post_recv(&p.b.srq, &three[..2]);
    assert_eq!(p.b.srq.posted(), 2);
    assert_eq!(
        p.b.srq.post_recv(&three[2..]),
        Err(FabricError::RecvQueueFull {
            posted: 2,
            buffers_max: 2
        })
    );
    assert_eq!(p.b.srq.posted(), 2);
    // A message filling buffer 0 consumes it; then there is room for one more.
    post(&p.qa, &[send(1, &[1u8; 256]).unsignaled()]);
    let rc = wait_one(&p.b.recv_cq, "filling SEND");
    assert_eq!((rc.wr_id, rc.status), (0, WcStatus::Success));
    assert_eq!(p.b.srq.posted(), 1);
    post_recv(&p.b.srq, &three[2..]);
    assert_eq!(p.b.srq.posted(), 2);
}

// ---------------------------------------------------------------------------
// Persistence

fn recording_region<N: Nic>(
    nic: &N,
    memory: &Arc<RecordingMemory>,
    base: usize,
    len: usize,
    access: Access,
) -> MemoryRegion {
    let m: Arc<dyn RegionMemory> = memory.clone();
    nic.register(m, base, len, access)
        .expect("register recording memory")
}

pub fn persist_write_persists_landed_bytes<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let mem = Arc::new(RecordingMemory::new(4096));
    // Region at memory offset 512: persisted ranges are memory offsets.
    let target = recording_region(&p.b.nic, &mem, 512, 1024, Access::ALL);
    let buf = region(&p.b.nic, 64, Access::NONE, 56);
    post_recv(&p.b.srq, &[recv_buffer(1, &buf, 0, 64)]);
    mem.clear();

    let data = pattern(57, 37);
    post(
        &p.qa,
        &[write(1, target.remote().at(100), &data).persisted()],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::Success,
        WcOpcode::Write,
        "persisted WRITE",
    );
    assert_eq!(
        union(mem.persists()),
        vec![612..649],
        "persist covers exactly the landed bytes"
    );
    assert_eq!(
        mem.dirty(),
        vec![],
        "nothing left unpersisted at completion"
    );
    assert_eq!(bytes(&target, 100, 37), data);

    mem.clear();
    post(&p.qa, &[write(2, target.remote().at(300), &data[..20])]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        2,
        WcStatus::Success,
        WcOpcode::Write,
        "plain WRITE",
    );
    assert_eq!(
        mem.persists(),
        vec![],
        "a WRITE without persist persists nothing"
    );
    assert_eq!(mem.dirty(), vec![812..832], "and leaves its bytes dirty");

    mem.clear();
    post(
        &p.qa,
        &[WorkRequest::new(
            3,
            Op::Write {
                data: &data[..10],
                remote: target.remote().at(400),
                imm: Some(5),
            },
        )
        .persisted()],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        3,
        WcStatus::Success,
        WcOpcode::Write,
        "persisted WRITE-imm",
    );
    assert_eq!(union(mem.persists()), vec![912..922]);
    assert_eq!(mem.dirty(), vec![]);
}

fn flush(wr_id: u64, remote: RemoteAddr, len: usize, placement: Placement) -> WorkRequest<'static> {
    WorkRequest::new(
        wr_id,
        Op::Flush {
            remote,
            len,
            placement,
        },
    )
}

/// A FLUSH of the persistence placement posted behind plain WRITEs on the same
/// queue pair, in one `post_send`: when it completes, the WRITEs' bytes in its
/// range are persisted (it executed after they landed), and only its range is.
pub fn flush_persists_earlier_writes_of_its_qp<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let mem = Arc::new(RecordingMemory::new(4096));
    // Region at memory offset 512: persisted ranges are memory offsets.
    let target = recording_region(&p.b.nic, &mem, 512, 1024, Access::ALL);
    mem.clear();
    let data = pattern(61, 300);
    post(
        &p.qa,
        &[
            write(1, target.remote().at(100), &data[..37]).unsignaled(),
            write(2, target.remote().at(140), &data[37..200]).unsignaled(),
            write(3, target.remote().at(700), &data[200..]),
            flush(4, target.remote().at(96), 300, Placement::Persistence),
        ],
    );
    let wcs = wait_completions(&p.a.send_cq, 2, "WRITE then FLUSH");
    assert_eq!(
        wcs.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![
            (3, WcStatus::Success, WcOpcode::Write),
            (4, WcStatus::Success, WcOpcode::Flush),
        ],
        "FLUSH completes after the WRITEs before it"
    );
    assert_eq!(
        union(mem.persists()),
        vec![608..908],
        "the FLUSH persists its range, nothing else"
    );
    assert_eq!(
        mem.dirty(),
        vec![1212..1312],
        "the WRITE outside the range stays unpersisted; those inside are durable"
    );
    assert_eq!(bytes(&target, 100, 37), data[..37]);
    assert_eq!(bytes(&target, 140, 163), data[37..200]);
    // A FLUSH of length 0 checks the address and moves nothing.
    mem.clear();
    post(
        &p.qa,
        &[flush(5, target.remote().at(0), 0, Placement::Persistence)],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        5,
        WcStatus::Success,
        WcOpcode::Flush,
        "FLUSH of 0 bytes",
    );
    assert_eq!(mem.persists(), vec![]);
}

/// A FLUSH of the global-visibility placement completes in order and persists
/// nothing: landed bytes are visible already.
pub fn flush_global_visibility_moves_no_byte<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let mem = Arc::new(RecordingMemory::new(2048));
    let target = recording_region(&p.b.nic, &mem, 0, 1024, Access::ALL);
    mem.clear();
    let data = pattern(62, 64);
    post(
        &p.qa,
        &[
            write(1, target.remote().at(64), &data).unsignaled(),
            flush(2, target.remote().at(0), 1024, Placement::GlobalVisibility),
        ],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        2,
        WcStatus::Success,
        WcOpcode::Flush,
        "FLUSH global visibility",
    );
    assert_eq!(bytes(&target, 64, 64), data, "the WRITE is visible");
    assert_eq!(
        mem.persists(),
        vec![],
        "a global-visibility FLUSH persists nothing"
    );
    assert_eq!(mem.dirty(), vec![64..128]);
}

/// Each placement needs its own right (`IBV_ACCESS_FLUSH_GLOBAL`,
/// `IBV_ACCESS_FLUSH_PERSISTENT`); a refused FLUSH is a remote access error
/// that moves the queue pair to the error state, as every refusal.
pub fn flush_needs_its_placement_right<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let f = Refusals::new(&fabric);
    let nic = f.p.b.nic.clone();
    let global_only = region(&nic, 64, Access::REMOTE_WRITE | Access::FLUSH_GLOBAL, 31);
    let persistent_only = region(
        &nic,
        64,
        Access::REMOTE_WRITE | Access::FLUSH_PERSISTENT,
        32,
    );
    let write_only = region(&nic, 64, Access::REMOTE_WRITE, 33);
    let op = |mr: &MemoryRegion, placement| Op::Flush {
        remote: mr.remote().at(0),
        len: 64,
        placement,
    };
    f.expect_refused(
        &global_only,
        "persistent FLUSH with the global right only",
        op(&global_only, Placement::Persistence),
    );
    f.expect_refused(
        &persistent_only,
        "global FLUSH with the persistent right only",
        op(&persistent_only, Placement::GlobalVisibility),
    );
    f.expect_refused(
        &write_only,
        "FLUSH without a flush right",
        op(&write_only, Placement::Persistence),
    );
    for (mr, placement, what) in [
        (&global_only, Placement::GlobalVisibility, "global"),
        (&persistent_only, Placement::Persistence, "persistent"),
    ] {
        let id = 7000 + what.len() as u64;
        post(&f.p.qa, &[WorkRequest::new(id, op(mr, placement))]);
        expect_send_wc(
            &f.p.a.send_cq,
            &f.p.qa,
            id,
            WcStatus::Success,
            WcOpcode::Flush,
            &format!("{what} FLUSH with its right"),
        );
    }
}

/// ATOMIC WRITE stores its 8 bytes and nothing else, completes as
/// `AtomicWrite`, and with the persist option the 8 bytes are durable at the
/// completion.
pub fn atomic_write_stores_eight_bytes_whole<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let mem = Arc::new(RecordingMemory::new(1024));
    let target = recording_region(&p.b.nic, &mem, 256, 64, Access::REMOTE_WRITE);
    let before = snapshot(&target);
    mem.clear();
    let value = 0x0123_4567_89ab_cdefu64;
    post(
        &p.qa,
        &[WorkRequest::new(
            1,
            Op::AtomicWrite {
                remote: target.remote().at(16),
                value,
            },
        )],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::Success,
        WcOpcode::AtomicWrite,
        "ATOMIC WRITE",
    );
    assert_eq!(
        snapshot(&target),
        overlay(&before, 16, &value.to_le_bytes())
    );
    assert_eq!(mem.persists(), vec![], "no persist without the option");
    mem.clear();
    post(
        &p.qa,
        &[WorkRequest::new(
            2,
            Op::AtomicWrite {
                remote: target.remote().at(40),
                value: u64::MAX,
            },
        )
        .persisted()],
    );
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        2,
        WcStatus::Success,
        WcOpcode::AtomicWrite,
        "persisted ATOMIC WRITE",
    );
    assert_eq!(target.read_u64(40), u64::MAX);
    assert_eq!(union(mem.persists()), vec![296..304]);
    assert_eq!(
        mem.dirty(),
        vec![],
        "nothing left unpersisted at completion"
    );
}

pub fn persist_send_persists_landed_bytes<B: Backend>(b: &B) {
    for config in [EndpointConfig::single(), EndpointConfig::multi_packet()] {
        let what = format!("{:?}", config.srq);
        let fabric = b.fabric();
        let p = pair(&fabric, config, 8);
        let mem = Arc::new(RecordingMemory::new(4096));
        let buf = recording_region(&p.b.nic, &mem, 2048, 1024, Access::NONE);
        post_recv(
            &p.b.srq,
            &[
                recv_buffer(1, &buf, 64, 256),
                recv_buffer(2, &buf, 512, 256),
            ],
        );
        mem.clear();

        let msg = pattern(58, 70);
        post(&p.qa, &[send(1, &msg).persisted()]);
        expect_send_wc(
            &p.a.send_cq,
            &p.qa,
            1,
            WcStatus::Success,
            WcOpcode::Send,
            &what,
        );
        let rc = wait_one(&p.b.recv_cq, &what);
        assert_eq!((rc.wr_id, rc.offset, rc.byte_len), (1, 0, 70), "{what}");
        assert_eq!(
            union(mem.persists()),
            vec![2112..2182],
            "{what}: persist covers exactly the message"
        );
        assert_eq!(mem.dirty(), vec![], "{what}");

        mem.clear();
        post(&p.qa, &[send(2, &msg[..30])]);
        expect_send_wc(
            &p.a.send_cq,
            &p.qa,
            2,
            WcStatus::Success,
            WcOpcode::Send,
            &what,
        );
        let rc = wait_one(&p.b.recv_cq, &what);
        let at = 2048 + if rc.wr_id == 1 { 64 } else { 512 } + rc.offset as usize;
        assert_eq!(
            mem.persists(),
            vec![],
            "{what}: a SEND without persist persists nothing"
        );
        assert_eq!(
            mem.dirty(),
            vec![at..at + 30],
            "{what}: and leaves its bytes dirty"
        );
    }
}

// ---------------------------------------------------------------------------
// Faults

pub fn cut_link_fails_only_that_link<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let na = Endpoint::new(fabric.attach(A).expect("attach"), EndpointConfig::single());
    let nb = Endpoint::new(fabric.attach(B).expect("attach"), EndpointConfig::single());
    let nc = Endpoint::new(fabric.attach(C).expect("attach"), EndpointConfig::single());
    let (qab, qba) = connect(&na, &nb, 8);
    let (qac, _qca) = connect(&na, &nc, 8);
    let tb = region(&nb.nic, 64, Access::ALL, 60);
    let ta = region(&na.nic, 64, Access::ALL, 61);
    let tc = region(&nc.nic, 64, Access::ALL, 62);
    let (tb_before, ta_before) = (snapshot(&tb), snapshot(&ta));
    let data = [0xC3u8; 8];

    fabric.cut_link(A, B);
    post(&qab, &[write(1, tb.remote().at(0), &data).unsignaled()]);
    expect_send_wc(
        &na.send_cq,
        &qab,
        1,
        WcStatus::RetryExceeded,
        WcOpcode::Write,
        "A->B over cut link",
    );
    assert_eq!(qab.state(), QpState::Error);
    post(&qba, &[write(2, ta.remote().at(0), &data)]);
    expect_send_wc(
        &nb.send_cq,
        &qba,
        2,
        WcStatus::RetryExceeded,
        WcOpcode::Write,
        "B->A over cut link",
    );
    assert_eq!(qba.state(), QpState::Error);
    assert_eq!(
        (snapshot(&tb), snapshot(&ta)),
        (tb_before, ta_before),
        "nothing crossed the cut"
    );

    post(&qac, &[write(3, tc.remote().at(0), &data)]);
    expect_send_wc(
        &na.send_cq,
        &qac,
        3,
        WcStatus::Success,
        WcOpcode::Write,
        "A->C unaffected",
    );
    assert_eq!(bytes(&tc, 0, 8), data);
    assert_eq!(qac.state(), QpState::Ready);
}

pub fn heal_link_then_reset_recovers<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let tb = region(&p.b.nic, 64, Access::ALL, 63);
    let ta = region(&p.a.nic, 64, Access::ALL, 64);
    let data = [0x3Cu8; 8];
    fabric.cut_link(A, B);
    post(&p.qa, &[write(1, tb.remote().at(0), &data)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::RetryExceeded,
        WcOpcode::Write,
        "cut",
    );
    post(&p.qb, &[write(2, ta.remote().at(0), &data)]);
    expect_send_wc(
        &p.b.send_cq,
        &p.qb,
        2,
        WcStatus::RetryExceeded,
        WcOpcode::Write,
        "cut",
    );

    fabric.heal_link(A, B);
    assert_eq!(p.qa.state(), QpState::Error, "healing does not reset a QP");
    post(&p.qa, &[write(3, tb.remote().at(0), &data)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        3,
        WcStatus::WrFlushError,
        WcOpcode::Write,
        "healed, not reset",
    );
    p.qa.reset().expect("reset a");
    p.qb.reset().expect("reset b");
    post(&p.qa, &[write(4, tb.remote().at(8), &data)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        4,
        WcStatus::Success,
        WcOpcode::Write,
        "A->B after reset",
    );
    post(&p.qb, &[write(5, ta.remote().at(8), &data)]);
    expect_send_wc(
        &p.b.send_cq,
        &p.qb,
        5,
        WcStatus::Success,
        WcOpcode::Write,
        "B->A after reset",
    );
    assert_eq!(
        (bytes(&tb, 8, 8), bytes(&ta, 8, 8)),
        (data.to_vec(), data.to_vec())
    );
}

const DELAY_NS: u64 = 1_000_000;

/// A queue pair destroyed at the target (a server removed from the
/// configuration) fails the sender's requests, even those a delay held back from
/// before the close: nothing lands after it.
pub fn closed_peer_fails_held_writes<B: Backend>(b: &B) {
    let clock = ManualClock::new();
    let fabric = b.fabric_with_clock(clock.clone());
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 128, Access::ALL, 68);
    let before = snapshot(&target);
    assert_eq!(p.qb.peer(), Some(p.qa.addr()), "connected to the sender");
    fabric.set_delay_ns(A, B, DELAY_NS);
    let data = pattern(69, 24);
    post(&p.qa, &[write(1, target.remote().at(0), &data)]);
    p.qb.close();
    assert_eq!(
        p.qb.state(),
        QpState::Error,
        "a closed QP is in the error state"
    );
    assert_eq!(p.qb.peer(), None, "a closed QP has no peer");
    clock.advance_ns(DELAY_NS);
    let c = wait_one(&p.a.send_cq, "the held WRITE");
    assert_eq!((c.wr_id, c.status), (1, WcStatus::RetryExceeded), "{c:?}");
    assert_eq!(snapshot(&target), before, "nothing landed after the close");
    fabric.set_delay_ns(A, B, 0);
    p.qa.reset().expect("reset the sender");
    post(&p.qa, &[write(2, target.remote().at(0), &data)]);
    let c = wait_one(&p.a.send_cq, "a WRITE after the close");
    assert_eq!((c.wr_id, c.status), (2, WcStatus::RetryExceeded), "{c:?}");
    assert_eq!(snapshot(&target), before, "nothing lands on a closed QP");
}

pub fn delay_holds_request_until_deadline<B: Backend>(b: &B) {
    let clock = ManualClock::new();
    let fabric = b.fabric_with_clock(clock.clone());
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 128, Access::ALL, 65);
    let before = snapshot(&target);
    let buf = region(&p.b.nic, 64, Access::NONE, 66);
    let buf_before = snapshot(&buf);
    post_recv(&p.b.srq, &[recv_buffer(1, &buf, 0, 64)]);
    fabric.set_delay_ns(A, B, DELAY_NS);

    let data = pattern(67, 24);
    post(
        &p.qa,
        &[write(1, target.remote().at(32), &data), send(2, &data[..8])],
    );
    for step in [0, DELAY_NS - 1] {
        clock.advance_ns(step);
        for _ in 0..ABSENCE_POLLS {
            assert_empty(&p.a.send_cq, "delayed requests completed early");
            assert_empty(&p.b.recv_cq, "delayed SEND landed early");
        }
        assert_eq!(snapshot(&target), before, "delayed WRITE landed early");
        assert_eq!(snapshot(&buf), buf_before, "delayed SEND landed early");
    }
    clock.advance_ns(1);
    let cs = wait_completions(&p.a.send_cq, 2, "delayed requests at their deadline");
    assert_eq!(
        send_wc_key(&cs[0]),
        (1, WcStatus::Success, WcOpcode::Write, p.qa.addr().qpn)
    );
    assert_eq!(
        send_wc_key(&cs[1]),
        (2, WcStatus::Success, WcOpcode::Send, p.qa.addr().qpn)
    );
    assert_eq!(snapshot(&target), overlay(&before, 32, &data));
    let rc = wait_one(&p.b.recv_cq, "delayed SEND");
    assert_eq!(
        (rc.wr_id, rc.byte_len, rc.status),
        (1, 8, WcStatus::Success)
    );
    assert_eq!(bytes(&buf, 0, 8), data[..8]);

    // Delay 0 removes the delay: no clock movement needed.
    fabric.set_delay_ns(A, B, 0);
    post(&p.qa, &[write(3, target.remote().at(0), &data[..8])]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        3,
        WcStatus::Success,
        WcOpcode::Write,
        "undelayed",
    );
}

pub fn delay_keeps_qp_order<B: Backend>(b: &B) {
    let clock = ManualClock::new();
    let fabric = b.fabric_with_clock(clock.clone());
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let target = region(&p.b.nic, 64, Access::ALL, 68);
    let before = snapshot(&target);
    let one = 1u64.to_le_bytes();
    let two = 2u64.to_le_bytes();

    fabric.set_delay_ns(A, B, DELAY_NS);
    post(&p.qa, &[write(1, target.remote().at(0), &one)]);
    clock.advance_ns(DELAY_NS / 2);
    // A shorter delay, then none: the later requests still wait behind the first.
    fabric.set_delay_ns(A, B, DELAY_NS / 10);
    post(&p.qa, &[write(2, target.remote().at(0), &two)]);
    fabric.set_delay_ns(A, B, 0);
    post(&p.qa, &[write(3, target.remote().at(8), &two)]);
    clock.advance_ns(DELAY_NS / 10);
    for _ in 0..ABSENCE_POLLS {
        assert_empty(&p.a.send_cq, "a later request overtook an earlier one");
    }
    assert_eq!(
        snapshot(&target),
        before,
        "nothing executes before the first request"
    );
    clock.advance_ns(DELAY_NS - DELAY_NS / 2 - DELAY_NS / 10);
    let cs = wait_completions(&p.a.send_cq, 3, "in order after the first deadline");
    let ids: Vec<_> = cs.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        ids,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(
        snapshot(&target),
        overlay(&overlay(&before, 0, &two), 8, &two),
        "the second WRITE wins"
    );

    // Once the deadline has passed, the backend makes progress without the send CQ
    // being polled (here: the next post, after the delay was removed, must not be
    // stuck behind a request whose time has come).
    let image = snapshot(&target);
    fabric.set_delay_ns(A, B, DELAY_NS);
    post(&p.qa, &[write(4, target.remote().at(16), &one)]);
    clock.advance_ns(DELAY_NS);
    fabric.set_delay_ns(A, B, 0);
    post(&p.qa, &[write(5, target.remote().at(24), &one)]);
    let expect = overlay(&overlay(&image, 16, &one), 24, &one);
    wait_until(
        "delayed and undelayed WRITEs land after the deadline",
        || snapshot(&target) == expect,
    );
    let cs = wait_completions(&p.a.send_cq, 2, "after the deadline");
    let ids: Vec<_> = cs.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(ids, vec![(4, WcStatus::Success), (5, WcStatus::Success)]);
}

pub fn crash_node_fails_peers_and_self<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let na = Endpoint::new(fabric.attach(A).expect("attach"), EndpointConfig::single());
    let nb = Endpoint::new(fabric.attach(B).expect("attach"), EndpointConfig::single());
    let nc = Endpoint::new(fabric.attach(C).expect("attach"), EndpointConfig::single());
    let (qab, qba) = connect(&na, &nb, 8);
    let (qcb, _qbc) = connect(&nc, &nb, 8);
    let (qac, _qca) = connect(&na, &nc, 8);
    let tb = region(&nb.nic, 64, Access::ALL, 70);
    let ta = region(&na.nic, 64, Access::ALL, 71);
    let tc = region(&nc.nic, 64, Access::ALL, 72);
    let data = [0x77u8; 8];

    fabric.crash_node(B);
    post(&qab, &[write(1, tb.remote().at(0), &data).unsignaled()]);
    expect_send_wc(
        &na.send_cq,
        &qab,
        1,
        WcStatus::RetryExceeded,
        WcOpcode::Write,
        "A->crashed B",
    );
    assert_eq!(qab.state(), QpState::Error);
    post(&qcb, &[send(2, b"to the dead")]);
    expect_send_wc(
        &nc.send_cq,
        &qcb,
        2,
        WcStatus::RetryExceeded,
        WcOpcode::Send,
        "C->crashed B",
    );
    assert_eq!(qcb.state(), QpState::Error);
    assert_eq!(
        qba.post_send(&[write(3, ta.remote().at(0), &data)]),
        Err(FabricError::NodeDown(B)),
        "a crashed node cannot post"
    );
    post(&qac, &[write(4, tc.remote().at(0), &data)]);
    expect_send_wc(
        &na.send_cq,
        &qac,
        4,
        WcStatus::Success,
        WcOpcode::Write,
        "A->C unaffected",
    );
}

pub fn reattached_node_has_fresh_rkeys<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let na = fabric.attach(A).expect("attach");
    let nb = fabric.attach(B).expect("attach");
    let old: Vec<MemoryRegion> = (0..3)
        .map(|i| region(&nb, 64, Access::ALL, 73 + i))
        .collect();
    fabric.crash_node(B);

    let nb2 = fabric.attach(B).expect("re-attach a crashed node");
    let ea = Endpoint::new(na, EndpointConfig::single());
    let eb = Endpoint::new(nb2.clone(), EndpointConfig::single());
    let (qa, _qb) = connect(&ea, &eb, 8);
    let fresh: Vec<MemoryRegion> = (0..3)
        .map(|i| region(&nb2, 64, Access::ALL, 80 + i))
        .collect();
    let before: Vec<_> = fresh.iter().map(snapshot).collect();
    let data = [0x11u8; 8];
    for (i, o) in old.iter().enumerate() {
        post(&qa, &[write(i as u64, o.remote().at(0), &data)]);
        let what = format!("old {:?} after re-attach", o.rkey);
        expect_send_wc(
            &ea.send_cq,
            &qa,
            i as u64,
            WcStatus::RemoteAccessError,
            WcOpcode::Write,
            &what,
        );
        let after: Vec<_> = fresh.iter().map(snapshot).collect();
        assert_eq!(after, before, "{what} reached a fresh region");
        qa.reset().expect("reset");
    }
    post(&qa, &[write(9, fresh[0].remote().at(0), &data)]);
    expect_send_wc(
        &ea.send_cq,
        &qa,
        9,
        WcStatus::Success,
        WcOpcode::Write,
        "fresh rkey",
    );
    assert_eq!(bytes(&fresh[0], 0, 8), data);
}

pub fn power_fail_hands_each_memory_once<B: Backend>(b: &B) {
    let fabric = b.fabric();
    let p = pair(&fabric, EndpointConfig::single(), 8);
    let shared = Arc::new(RecordingMemory::new(2048));
    let alone = Arc::new(RecordingMemory::new(1024));
    let other = Arc::new(RecordingMemory::new(1024));
    let r1 = recording_region(&p.b.nic, &shared, 0, 1024, Access::ALL);
    let _r2 = recording_region(&p.b.nic, &shared, 1024, 1024, Access::ALL);
    let _r3 = recording_region(&p.b.nic, &alone, 0, 1024, Access::ALL);
    let ra = recording_region(&p.a.nic, &other, 0, 1024, Access::ALL);
    let policy = PowerFailure::DropSubset {
        seed: 99,
        drop_probability: 0.25,
    };

    fabric.power_fail(B, policy);
    assert_eq!(
        shared.power_failures(),
        vec![policy],
        "a memory under two regions fails once"
    );
    assert_eq!(alone.power_failures(), vec![policy]);
    assert_eq!(
        other.power_failures(),
        vec![],
        "another node's memory is untouched"
    );

    let data = [1u8; 8];
    post(&p.qa, &[write(1, r1.remote().at(0), &data)]);
    expect_send_wc(
        &p.a.send_cq,
        &p.qa,
        1,
        WcStatus::RetryExceeded,
        WcOpcode::Write,
        "A->powered-off B",
    );
    assert_eq!(
        p.qb.post_send(&[write(2, ra.remote().at(0), &data)]),
        Err(FabricError::NodeDown(B))
    );
}

// ---------------------------------------------------------------------------
// Concurrency

const CONCURRENT_SEED: u64 = 0x5EED_F0B1;

fn concurrent_message(sender: u8, seq: u16, len: usize) -> Vec<u8> {
    let mut m = pattern(CONCURRENT_SEED ^ ((sender as u64) << 32) ^ seq as u64, len);
    m[0] = sender;
    m[1..3].copy_from_slice(&seq.to_le_bytes());
    m[3..5].copy_from_slice(&(len as u16).to_le_bytes());
    m
}

pub fn concurrent_sends_into_one_mp_srq<B: Backend>(b: &B) {
    const SENDERS: usize = 2;
    const MSGS: usize = 200;
    const DEPTH: usize = 16;
    const BUFFERS: usize = 12;
    const BUFFER_BYTES: usize = 16 * 1024;
    let seed = CONCURRENT_SEED;
    let fabric = b.fabric();
    let nic_a = fabric.attach(A).expect("attach");
    let eb = Endpoint::new(
        fabric.attach(B).expect("attach"),
        EndpointConfig {
            recv_cq: CqKind::Bounded { capacity: 1024 },
            ..EndpointConfig::multi_packet()
        },
    );
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| Endpoint::new(nic_a.clone(), EndpointConfig::single()))
        .collect();
    let qps: Vec<_> = senders.iter().map(|e| connect(e, &eb, DEPTH)).collect();
    let buf = region(&eb.nic, BUFFERS * BUFFER_BYTES, Access::NONE, 90);
    let buffers: Vec<_> = (0..BUFFERS)
        .map(|i| recv_buffer(i as u64, &buf, i * BUFFER_BYTES, BUFFER_BYTES))
        .collect();
    post_recv(&eb.srq, &buffers);

    std::thread::scope(|s| {
        for (t, (ep, (qp, _))) in senders.iter().zip(&qps).enumerate() {
            s.spawn(move || {
                let mut rng = Rng(seed ^ t as u64);
                let take = |n: usize| {
                    for c in wait_completions(&ep.send_cq, n, "sender completions") {
                        assert_eq!(c.status, WcStatus::Success, "seed {seed:#x}: {c:?}");
                    }
                    n
                };
                let mut completed = 0;
                for seq in 0..MSGS {
                    if qp.outstanding() >= DEPTH {
                        completed += take(1);
                    }
                    let len = 8 + (rng.next() % 293) as usize;
                    let msg = concurrent_message(t as u8, seq as u16, len);
                    post(qp, &[send(seq as u64, &msg)]);
                }
                take(MSGS - completed);
            });
        }
    });

    let rc = wait_completions(&eb.recv_cq, SENDERS * MSGS, "receive completions");
    let mut seen: HashMap<(u8, u16), usize> = HashMap::new();
    let mut ranges: Vec<(usize, usize, u8, u16)> = Vec::new();
    for c in &rc {
        assert_eq!(
            (c.status, c.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "seed {seed:#x}: {c:?}"
        );
        assert_eq!(
            c.offset % STRIDE as u64,
            0,
            "seed {seed:#x}: offset not stride-aligned: {c:?}"
        );
        let len = c.byte_len as usize;
        assert!(
            c.offset as usize + len <= BUFFER_BYTES,
            "seed {seed:#x}: past its buffer: {c:?}"
        );
        let at = c.wr_id as usize * BUFFER_BYTES + c.offset as usize;
        let got = bytes(&buf, at, len);
        let (sender, seq) = (got[0], u16::from_le_bytes([got[1], got[2]]));
        assert!(
            (sender as usize) < SENDERS,
            "seed {seed:#x}: garbage header {c:?}"
        );
        assert_eq!(
            c.src,
            Some(qps[sender as usize].0.addr()),
            "seed {seed:#x}: src of {c:?}"
        );
        assert_eq!(
            got,
            concurrent_message(sender, seq, len),
            "seed {seed:#x}: message ({sender}, {seq}) corrupt"
        );
        *seen.entry((sender, seq)).or_default() += 1;
        ranges.push((at, at + len.div_ceil(STRIDE) * STRIDE, sender, seq));
    }
    assert_eq!(
        seen.len(),
        SENDERS * MSGS,
        "seed {seed:#x}: messages missing"
    );
    assert!(
        seen.values().all(|&n| n == 1),
        "seed {seed:#x}: a message landed twice"
    );
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "seed {seed:#x}: {:?} and {:?} overlap",
            w[0],
            w[1]
        );
    }
    // Buffers are posted in address order, so each sender's messages must land at
    // increasing addresses (per-QP order, buffers consumed in posting order).
    for t in 0..SENDERS as u8 {
        let seqs: Vec<u16> = ranges.iter().filter(|r| r.2 == t).map(|r| r.3).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "seed {seed:#x}: sender {t} landed out of order"
        );
    }
}
