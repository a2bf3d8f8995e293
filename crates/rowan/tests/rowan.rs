//! Rowan over the loopback fabric: what a receiver's log holds after many senders'
//! writes, how the control path finds used buffers, and what the persistence option
//! buys under a simulated power failure (seed 000 §3, §4.3). See `docs/rowan.md`.
//!
//! Every randomized test derives its inputs from a fixed seed and prints it in its
//! failure messages.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, Fabric, FaultInjector, LoopbackCq,
    LoopbackFabric, LoopbackNic, LoopbackQp, MemoryRegion, Nic, Op, PowerFailure, QpState,
    QueuePair, RegionMemory, WcOpcode, WcStatus, WorkRequest,
};
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_rowan::{
    padded_len, ReceiverConfig, RowanError, RowanReceiver, RowanSender, STRIDE_BYTES,
};
use rowankv_types::NodeId;

const RECEIVER: NodeId = NodeId(0);

/// A receiver on node 0 whose log is `memory`, and the fabric it is attached to.
struct Rig {
    fabric: LoopbackFabric,
    receiver: RowanReceiver<LoopbackNic>,
}

fn rig(memory: Arc<dyn RegionMemory>, config: ReceiverConfig) -> Rig {
    let fabric = LoopbackFabric::new();
    let nic = fabric.attach(RECEIVER).expect("attach receiver");
    let len = memory.len_bytes();
    let log = nic
        .register(memory, 0, len, Access::NONE)
        .expect("register log");
    let receiver = RowanReceiver::new(nic, log, config).expect("receiver");
    Rig { fabric, receiver }
}

fn pool(len_bytes: usize, crash_sim: bool) -> Arc<Pool> {
    Pool::anonymous(
        len_bytes,
        PoolOptions {
            crash_sim,
            ..PoolOptions::default()
        },
    )
    .expect("anonymous pool")
}

fn config(buffer_bytes: usize, posted_max: usize) -> ReceiverConfig {
    ReceiverConfig {
        buffer_bytes,
        posted_max,
        grace_ns: 1_000,
        ring_cq_entries: 64,
        qp_send_depth: 4,
    }
}

/// A sender node's NIC and its bounded send CQ.
struct SenderNode {
    nic: LoopbackNic,
    cq: LoopbackCq,
}

fn sender_node(fabric: &LoopbackFabric, id: u32, cq_capacity: usize) -> SenderNode {
    let nic = fabric.attach(NodeId(id)).expect("attach sender");
    let cq = nic
        .create_cq(CqKind::Bounded {
            capacity: cq_capacity,
        })
        .expect("sender cq");
    SenderNode { nic, cq }
}

/// A queue pair of `node` connected to a fresh queue pair of the receiver.
fn connected_qp(rig: &mut Rig, node: &SenderNode, send_depth: usize) -> LoopbackQp {
    let qp = node
        .nic
        .create_qp(&node.cq, &node.cq, None, send_depth)
        .expect("sender qp");
    let remote = rig.receiver.accept(qp.addr()).expect("accept");
    qp.connect(remote).expect("connect");
    qp
}

fn sender(
    rig: &mut Rig,
    node: &SenderNode,
    send_depth: usize,
    mtu_bytes: usize,
) -> RowanSender<LoopbackQp> {
    RowanSender::new(connected_qp(rig, node, send_depth), mtu_bytes)
}

/// Every completion now in `cq` (the loopback completes at `post_send`).
fn drain(cq: &LoopbackCq) -> Vec<Completion> {
    let mut all = Vec::new();
    let mut out = [zero_completion(); 64];
    loop {
        let n = cq.poll(&mut out).expect("poll");
        all.extend_from_slice(&out[..n]);
        if n < out.len() {
            return all;
        }
    }
}

fn zero_completion() -> Completion {
    Completion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        qpn: rowankv_types::QpNum(0),
        byte_len: 0,
        offset: 0,
        imm: None,
        src: None,
    }
}

/// The one completion in `cq`, which must be a success for `wr_id`.
fn expect_one_success(cq: &LoopbackCq, wr_id: u64) {
    let got = drain(cq);
    assert_eq!(got.len(), 1, "expected one completion, got {got:?}");
    assert_eq!(got[0].wr_id, wr_id, "{got:?}");
    assert_eq!(got[0].status, WcStatus::Success, "{got:?}");
}

fn read(log: &MemoryRegion, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    log.read(offset, &mut out);
    out
}

/// An entry of `len` bytes filled with `tag` (non-zero, so its first word is).
fn tagged(tag: u8, len: usize) -> Vec<u8> {
    assert_ne!(tag, 0);
    vec![tag; len]
}

// ---------------------------------------------------------------------------
// 1. Many senders, one sequential stream

const STREAM_SEED: u64 = 0x5EED_0001;
const SENDER_NODES: usize = 3;
const QPS_PER_NODE: usize = 4;
const STREAMS: usize = SENDER_NODES * QPS_PER_NODE;
const ENTRIES_PER_STREAM: usize = 200;
const STREAM_BUFFER_BYTES: usize = 64 << 10;
const STREAM_BUFFERS: usize = 16;
const STREAM_SEND_DEPTH: usize = 16;
const STREAM_MTU_BYTES: usize = 512;

/// Entry `seq` of stream `s`: an 8-byte header (stream + 1, seq, length, magic)
/// truncated to the entry's length, then random bytes. The first byte is never zero,
/// so neither is the entry's first word (what Rowan asks of every write).
fn stream_entries(seed: u64) -> Vec<Vec<Vec<u8>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..STREAMS)
        .map(|s| {
            (0..ENTRIES_PER_STREAM)
                .map(|seq| {
                    let len = rng.gen_range(1..=300usize);
                    let mut e = vec![0u8; len];
                    rng.fill(&mut e[..]);
                    let header = [
                        s as u8 + 1,
                        seq as u8,
                        (seq >> 8) as u8,
                        len as u8,
                        (len >> 8) as u8,
                        b'R',
                        b'K',
                        b'V',
                    ];
                    let h = len.min(header.len());
                    e[..h].copy_from_slice(&header[..h]);
                    e
                })
                .collect()
        })
        .collect()
}

fn wr_id(stream: usize, seq: usize) -> u64 {
    ((stream as u64) << 32) | seq as u64
}

/// A stream rig: a 1 MiB pool log with 16 buffers of 64 KiB posted in two batches,
/// and 3 sender nodes with 4 connected senders each (stream `n * 4 + q`).
fn stream_rig() -> (Rig, Vec<SenderNode>, Vec<RowanSender<LoopbackQp>>) {
    let log = pool(STREAM_BUFFERS * STREAM_BUFFER_BYTES, false);
    let mut rig = rig(log, config(STREAM_BUFFER_BYTES, STREAM_BUFFERS));
    let offsets: Vec<usize> = (0..STREAM_BUFFERS)
        .map(|i| i * STREAM_BUFFER_BYTES)
        .collect();
    let (first, second) = offsets.split_at(STREAM_BUFFERS / 2);
    rig.receiver.post(first).expect("post first batch");
    rig.receiver.post(second).expect("post second batch");
    let nodes: Vec<SenderNode> = (0..SENDER_NODES)
        .map(|n| sender_node(&rig.fabric, n as u32 + 1, QPS_PER_NODE * STREAM_SEND_DEPTH))
        .collect();
    let mut senders = Vec::new();
    for node in &nodes {
        for _ in 0..QPS_PER_NODE {
            senders.push(sender(&mut rig, node, STREAM_SEND_DEPTH, STREAM_MTU_BYTES));
        }
    }
    (rig, nodes, senders)
}

/// Write `entries[stream][seq]` on `sender`, first polling `cq` if its send queue is
/// full. Completions go to `done`.
fn write_entry(
    sender: &mut RowanSender<LoopbackQp>,
    cq: &LoopbackCq,
    done: &mut Vec<Completion>,
    stream: usize,
    seq: usize,
    entry: &[u8],
) {
    if sender.qp().outstanding() >= STREAM_SEND_DEPTH {
        done.extend(drain(cq));
    }
    sender
        .write(wr_id(stream, seq), entry)
        .unwrap_or_else(|e| panic!("seed {STREAM_SEED:#x}: stream {stream} seq {seq}: {e}"));
}

fn check_completions(done: &[Completion]) {
    let mut seen = HashSet::new();
    for c in done {
        assert_eq!(c.status, WcStatus::Success, "seed {STREAM_SEED:#x}: {c:?}");
        assert!(seen.insert(c.wr_id), "seed {STREAM_SEED:#x}: {c:?} twice");
    }
    assert_eq!(
        seen.len(),
        STREAMS * ENTRIES_PER_STREAM,
        "seed {STREAM_SEED:#x}"
    );
}

/// Scan the receiver's buffers in posting order and check that they hold every entry
/// exactly once, intact, packed back to back from offset 0 of each buffer (so at
/// stride-aligned offsets), each stream's entries in order, with a gap only at a
/// buffer's tail and only where the next buffer's first entry did not fit.
fn check_one_sequential_stream(receiver: &RowanReceiver<LoopbackNic>, entries: &[Vec<Vec<u8>>]) {
    let seed = STREAM_SEED;
    let buffer_bytes = receiver.config().buffer_bytes;
    let buffers: Vec<usize> = receiver.posted().collect();
    assert_eq!(
        buffers.len(),
        STREAM_BUFFERS,
        "no tick ran, so nothing is reported used"
    );
    let mut next = vec![0usize; entries.len()];
    let mut found = 0usize;
    let mut prev_tail_free_bytes: Option<usize> = None;
    let mut buffers_started = 0usize;
    for (b, &base) in buffers.iter().enumerate() {
        let buf = read(receiver.log(), base, buffer_bytes);
        let mut at = 0usize;
        // The scan only ever looks at the offset right after the previous entry's
        // padded end: an entry anywhere else is not found, and the tail check below
        // then fails on its bytes.
        while at < buffer_bytes && buf[at] != 0 {
            let s = buf[at] as usize - 1;
            assert!(
                s < entries.len(),
                "seed {seed:#x}: buffer {b} offset {at}: tag {}",
                buf[at]
            );
            let seq = next[s];
            assert!(
                seq < entries[s].len(),
                "seed {seed:#x}: stream {s} has an entry beyond its last at buffer {b} offset {at}"
            );
            let e = &entries[s][seq];
            let end = at + padded_len(e.len());
            assert!(
                end <= buffer_bytes,
                "seed {seed:#x}: stream {s} seq {seq} crosses buffer {b}'s end"
            );
            assert_eq!(
                &buf[at..at + e.len()],
                &e[..],
                "seed {seed:#x}: buffer {b} offset {at} is not stream {s}'s entry {seq} (order or integrity)"
            );
            assert!(
                buf[at + e.len()..end].iter().all(|&x| x == 0),
                "seed {seed:#x}: stream {s} seq {seq}: padding not zero"
            );
            if at == 0 {
                buffers_started += 1;
                if let Some(free) = prev_tail_free_bytes {
                    assert!(
                        free < padded_len(e.len()),
                        "seed {seed:#x}: buffer {} left {free} B free but stream {s} seq {seq} \
                         ({} B padded) went to the next buffer",
                        b - 1,
                        padded_len(e.len())
                    );
                }
            }
            next[s] += 1;
            found += 1;
            at = end;
        }
        assert!(
            buf[at..].iter().all(|&x| x == 0),
            "seed {seed:#x}: buffer {b}: bytes after the last packed entry (offset {at})"
        );
        prev_tail_free_bytes = Some(buffer_bytes - at);
    }
    for (s, &n) in next.iter().enumerate() {
        assert_eq!(
            n,
            entries[s].len(),
            "seed {seed:#x}: stream {s} entries found"
        );
    }
    assert_eq!(found, STREAMS * ENTRIES_PER_STREAM, "seed {seed:#x}");
    assert!(
        buffers_started >= 2,
        "seed {seed:#x}: the stream must cross a buffer boundary to test the spill rule"
    );
}

#[test]
fn many_senders_land_one_packed_stream_seeded_interleaving() {
    let entries = stream_entries(STREAM_SEED);
    let (rig, nodes, mut senders) = stream_rig();
    let mut rng = ChaCha8Rng::seed_from_u64(STREAM_SEED ^ 1);
    let mut next = [0usize; STREAMS];
    let mut live: Vec<usize> = (0..STREAMS).collect();
    let mut done = Vec::new();
    while !live.is_empty() {
        let i = rng.gen_range(0..live.len());
        let s = live[i];
        let node = &nodes[s / QPS_PER_NODE];
        write_entry(
            &mut senders[s],
            &node.cq,
            &mut done,
            s,
            next[s],
            &entries[s][next[s]],
        );
        next[s] += 1;
        if next[s] == ENTRIES_PER_STREAM {
            live.swap_remove(i);
        }
        if rng.gen_ratio(1, 8) {
            done.extend(drain(&nodes[rng.gen_range(0..SENDER_NODES)].cq));
        }
    }
    for node in &nodes {
        done.extend(drain(&node.cq));
    }
    check_completions(&done);
    check_one_sequential_stream(&rig.receiver, &entries);
}

#[test]
fn many_senders_land_one_packed_stream_one_thread_per_sender_node() {
    let entries = stream_entries(STREAM_SEED);
    let (rig, nodes, senders) = stream_rig();
    let mut per_node: Vec<Vec<RowanSender<LoopbackQp>>> = Vec::new();
    let mut senders = senders.into_iter();
    for _ in 0..SENDER_NODES {
        per_node.push(senders.by_ref().take(QPS_PER_NODE).collect());
    }
    let done: Vec<Completion> = std::thread::scope(|scope| {
        let handles: Vec<_> = per_node
            .into_iter()
            .zip(&nodes)
            .enumerate()
            .map(|(n, (mut mine, node))| {
                let entries = &entries;
                scope.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(STREAM_SEED ^ (n as u64 + 2));
                    let mut next = [0usize; QPS_PER_NODE];
                    let mut done = Vec::new();
                    for _ in 0..QPS_PER_NODE * ENTRIES_PER_STREAM {
                        let live: Vec<usize> = (0..QPS_PER_NODE)
                            .filter(|&q| next[q] < ENTRIES_PER_STREAM)
                            .collect();
                        let q = *live.choose(&mut rng).expect("entries left");
                        let s = n * QPS_PER_NODE + q;
                        write_entry(
                            &mut mine[q],
                            &node.cq,
                            &mut done,
                            s,
                            next[q],
                            &entries[s][next[q]],
                        );
                        next[q] += 1;
                    }
                    done.extend(drain(&node.cq));
                    done
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("sender thread"))
            .collect()
    });
    check_completions(&done);
    check_one_sequential_stream(&rig.receiver, &entries);
}

// ---------------------------------------------------------------------------
// 2. Padding

#[test]
fn writes_are_padded_to_the_64_byte_stride() {
    const BUFFER_BYTES: usize = 4096;
    let memory = pool(BUFFER_BYTES, false);
    // Garbage everywhere, so that the bytes Rowan wrote (entries and their zero
    // padding) can be told from bytes nobody wrote.
    memory.write(0, &[0xEE; BUFFER_BYTES]);
    let mut rig = rig(memory, config(BUFFER_BYTES, 1));
    rig.receiver.post(&[0]).expect("post");
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);

    let lens = [1usize, 63, 64, 65, 127];
    let occupied = [64usize, 64, 64, 128, 128];
    for (i, &len) in lens.iter().enumerate() {
        assert_eq!(padded_len(len), occupied[i]);
        s.write(i as u64, &tagged(i as u8 + 1, len)).expect("write");
        expect_one_success(&node.cq, i as u64);
    }
    let log = rig.receiver.log();
    let mut at = 0;
    for (i, &len) in lens.iter().enumerate() {
        let got = read(log, at, occupied[i]);
        assert!(
            got[..len].iter().all(|&b| b == i as u8 + 1),
            "write {i} ({len} B) at {at}"
        );
        assert!(
            got[len..].iter().all(|&b| b == 0),
            "write {i}: padding to {} B",
            occupied[i]
        );
        at += occupied[i];
    }
    assert_eq!(at, 448);
    assert!(
        read(log, at, BUFFER_BYTES - at).iter().all(|&b| b == 0xEE),
        "nothing written past the last padded write"
    );
}

// ---------------------------------------------------------------------------
// 3. Used-buffer detection and the grace period

/// `n` writes of 64 B with non-zero first words.
fn write_n(s: &mut RowanSender<LoopbackQp>, cq: &LoopbackCq, n: usize, tag: u8) {
    for i in 0..n {
        s.write(i as u64, &tagged(tag, STRIDE_BYTES))
            .expect("write");
        expect_one_success(cq, i as u64);
    }
}

#[test]
fn buffer_is_used_only_after_a_later_buffer_starts_and_the_grace_period_passes() {
    const BUFFER_BYTES: usize = 4096;
    const PER_BUFFER: usize = BUFFER_BYTES / STRIDE_BYTES;
    const GRACE_NS: u64 = 1_000;
    let mut rig = rig(pool(4 * BUFFER_BYTES, false), config(BUFFER_BYTES, 3));
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);
    let buffers = [BUFFER_BYTES, 2 * BUFFER_BYTES, 3 * BUFFER_BYTES];
    rig.receiver.post(&buffers).expect("post");
    assert_eq!(rig.receiver.posted_count(), 3);

    // Nothing written: nothing is used, however late.
    assert_eq!(rig.receiver.tick(0), Vec::<usize>::new());
    assert_eq!(rig.receiver.tick(10_000), Vec::<usize>::new());

    // Buffer 0 full, buffer 1 not started: the receiver cannot know yet.
    write_n(&mut s, &node.cq, PER_BUFFER, 1);
    assert_eq!(rig.receiver.tick(20_000), Vec::<usize>::new());
    assert_eq!(rig.receiver.log().read_u64(buffers[1]), 0);

    // Buffer 1 started: buffer 0 is consumed, used once the grace has passed since
    // the receiver first saw that.
    write_n(&mut s, &node.cq, 1, 2);
    assert_ne!(rig.receiver.log().read_u64(buffers[1]), 0);
    let t = 1_000_000;
    assert_eq!(rig.receiver.tick(t), Vec::<usize>::new());
    assert_eq!(rig.receiver.tick(t + GRACE_NS - 1), Vec::<usize>::new());
    assert_eq!(rig.receiver.posted_count(), 3);
    assert_eq!(rig.receiver.tick(t + GRACE_NS), vec![buffers[0]]);
    assert_eq!(rig.receiver.posted_count(), 2);
    assert_eq!(
        rig.receiver.posted().collect::<Vec<_>>(),
        buffers[1..].to_vec()
    );
    assert_eq!(
        rig.receiver.tick(t + GRACE_NS + 1),
        Vec::<usize>::new(),
        "reported once"
    );

    // Buffer 1 being filled is not used, however long it takes.
    write_n(&mut s, &node.cq, PER_BUFFER / 2, 3);
    assert_eq!(rig.receiver.tick(1_000_000_000_000), Vec::<usize>::new());
    assert_eq!(rig.receiver.posted_count(), 2);

    // Until buffer 2 starts.
    write_n(&mut s, &node.cq, PER_BUFFER - 1 - PER_BUFFER / 2, 3);
    assert_eq!(rig.receiver.tick(1_500_000_000_000), Vec::<usize>::new());
    write_n(&mut s, &node.cq, 1, 4);
    let t2 = 2_000_000_000_000;
    assert_eq!(rig.receiver.tick(t2), Vec::<usize>::new());
    assert_eq!(rig.receiver.tick(t2 + GRACE_NS - 1), Vec::<usize>::new());
    assert_eq!(rig.receiver.tick(t2 + GRACE_NS), vec![buffers[1]]);
    assert_eq!(rig.receiver.posted_count(), 1);
    assert_eq!(rig.receiver.posted().collect::<Vec<_>>(), vec![buffers[2]]);
}

#[test]
fn post_sorts_each_batch_by_address_and_the_nic_fills_the_lowest_first() {
    const BUFFER_BYTES: usize = 4096;
    let mut rig = rig(pool(4 * BUFFER_BYTES, false), config(BUFFER_BYTES, 4));
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);
    rig.receiver
        .post(&[3 * BUFFER_BYTES, BUFFER_BYTES, 2 * BUFFER_BYTES])
        .expect("post");
    rig.receiver.post(&[0]).expect("post a later batch");
    assert_eq!(
        rig.receiver.posted().collect::<Vec<_>>(),
        vec![BUFFER_BYTES, 2 * BUFFER_BYTES, 3 * BUFFER_BYTES, 0],
        "each batch sorted; batches in posting order"
    );
    s.write(1, &tagged(9, 100)).expect("write");
    expect_one_success(&node.cq, 1);
    assert_eq!(read(rig.receiver.log(), BUFFER_BYTES, 100), tagged(9, 100));
    assert_eq!(rig.receiver.log().read_u64(3 * BUFFER_BYTES), 0);
}

// ---------------------------------------------------------------------------
// 4. post(): first word zeroed and persisted; bounds; errors change nothing

#[test]
fn post_zeroes_and_persists_each_buffers_first_word() {
    const BUFFER_BYTES: usize = 4096;
    const GARBAGE: [u8; 8] = *b"garbage!";
    let memory = pool(2 * BUFFER_BYTES, true);
    let mut rig = rig(memory.clone(), config(BUFFER_BYTES, 2));
    let log = rig.receiver.log().clone();
    // Durable garbage in both buffers' first words.
    for b in [0, BUFFER_BYTES] {
        log.write(b, &GARBAGE);
        log.persist(b, GARBAGE.len());
    }
    rig.receiver.post(&[0]).expect("post");
    assert_eq!(log.read_u64(0), 0);
    // Counter-check: a zero that is stored but not persisted.
    log.write(BUFFER_BYTES, &[0; 8]);
    assert_eq!(log.read_u64(BUFFER_BYTES), 0);

    memory
        .crash()
        .expect("crash simulator")
        .power_fail(PowerFailure::DropAll);
    assert_eq!(memory.read_u64(0), 0, "post persisted the zero");
    assert_eq!(
        memory.read_u64(BUFFER_BYTES),
        u64::from_le_bytes(GARBAGE),
        "an unpersisted zero is lost, so the check above can fail"
    );
}

#[test]
fn post_refuses_more_than_posted_max_and_changes_nothing() {
    const BUFFER_BYTES: usize = 4096;
    let mut rig = rig(pool(4 * BUFFER_BYTES, false), config(BUFFER_BYTES, 2));
    let log = rig.receiver.log().clone();
    for b in 0..4 {
        log.write(b * BUFFER_BYTES, b"garbage!");
    }
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);

    assert_eq!(
        rig.receiver.post(&[0, BUFFER_BYTES, 2 * BUFFER_BYTES]),
        Err(RowanError::TooManyPosted {
            posted: 0,
            more: 3,
            posted_max: 2
        })
    );
    assert_eq!(rig.receiver.posted_count(), 0);
    assert_eq!(
        &read(&log, 0, 8),
        b"garbage!",
        "a refused batch zeroes nothing"
    );

    rig.receiver.post(&[0, BUFFER_BYTES]).expect("post two");
    assert_eq!(
        rig.receiver.post(&[2 * BUFFER_BYTES]),
        Err(RowanError::TooManyPosted {
            posted: 2,
            more: 1,
            posted_max: 2
        })
    );
    assert_eq!(rig.receiver.posted_count(), 2);
    assert_eq!(&read(&log, 2 * BUFFER_BYTES, 8), b"garbage!");

    // The refused buffer never reached the NIC: after two buffers' worth of writes
    // the next one finds no buffer.
    write_n(&mut s, &node.cq, 2 * BUFFER_BYTES / STRIDE_BYTES, 1);
    s.write(99, &tagged(2, 64)).expect("post_send");
    let got = drain(&node.cq);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, WcStatus::RnrRetryExceeded);
    assert_eq!(&read(&log, 2 * BUFFER_BYTES, 8), b"garbage!");
}

#[test]
fn post_refuses_misaligned_or_out_of_region_buffers_and_changes_nothing() {
    const BUFFER_BYTES: usize = 4096;
    const REGION_BYTES: usize = 4 * BUFFER_BYTES;
    let mut rig = rig(pool(REGION_BYTES, false), config(BUFFER_BYTES, 4));
    let log = rig.receiver.log().clone();
    log.write(0, b"garbage!");
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);

    let bad = [
        32,                              // not stride aligned
        REGION_BYTES - STRIDE_BYTES,     // runs past the region's end
        REGION_BYTES,                    // starts at the end
        usize::MAX - (STRIDE_BYTES - 1), // aligned, end overflows
    ];
    for offset in bad {
        assert_eq!(
            rig.receiver.post(&[0, offset]),
            Err(RowanError::BadBuffer {
                offset,
                len_bytes: BUFFER_BYTES
            }),
            "offset {offset}"
        );
        assert_eq!(rig.receiver.posted_count(), 0);
        assert_eq!(
            &read(&log, 0, 8),
            b"garbage!",
            "the good buffer of a refused batch is untouched"
        );
    }
    // Nothing reached the NIC.
    s.write(1, &tagged(1, 64)).expect("post_send");
    let got = drain(&node.cq);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, WcStatus::RnrRetryExceeded);
    assert_eq!(&read(&log, 0, 8), b"garbage!");
}

// ---------------------------------------------------------------------------
// 5. Durability

#[test]
fn persisted_write_survives_power_failure_and_unpersisted_send_does_not() {
    const BUFFER_BYTES: usize = 4096;
    let memory = pool(BUFFER_BYTES, true);
    let mut rig = rig(memory.clone(), config(BUFFER_BYTES, 1));
    rig.receiver.post(&[0]).expect("post");
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);
    let raw_node = sender_node(&rig.fabric, 2, 8);
    let raw = connected_qp(&mut rig, &raw_node, 8);

    let x = tagged(0x11, 200);
    let y = tagged(0x22, 256);
    let z = tagged(0x33, 100);
    s.write(1, &x).expect("write x");
    expect_one_success(&node.cq, 1);
    // The same SRQ, the same kind of SEND, but without the persistence option.
    raw.post_send(&[WorkRequest::new(
        2,
        Op::Send {
            data: &y,
            imm: None,
        },
    )])
    .expect("send y");
    expect_one_success(&raw_node.cq, 2);
    s.write(3, &z).expect("write z");
    expect_one_success(&node.cq, 3);
    let (x_at, y_at, z_at) = (0, 256, 512);
    assert_eq!(
        read(rig.receiver.log(), y_at, y.len()),
        y,
        "y landed and is visible"
    );

    rig.fabric.power_fail(RECEIVER, PowerFailure::DropAll);
    let mut after = vec![0u8; BUFFER_BYTES];
    memory.read(0, &mut after);
    assert_eq!(
        &after[x_at..x_at + x.len()],
        &x[..],
        "acknowledged write x lost"
    );
    assert_eq!(
        &after[z_at..z_at + z.len()],
        &z[..],
        "acknowledged write z lost"
    );
    assert!(
        after[y_at..y_at + y.len()].iter().all(|&b| b == 0),
        "an unpersisted SEND survived DropAll: the test could not tell the difference"
    );
}

// ---------------------------------------------------------------------------
// 6. The ring CQ

#[test]
fn ring_cq_is_never_polled_yet_ten_thousand_writes_succeed() {
    const SEED: u64 = 0x5EED_0006;
    const WRITES: usize = 10_000;
    const RING_ENTRIES: usize = 64;
    const BUFFER_BYTES: usize = 4096;
    const LOG_BUFFERS: usize = 16;
    const POSTED_MAX: usize = 8;
    const TICK_EVERY_WRITES: usize = 16;
    let mut cfg = config(BUFFER_BYTES, POSTED_MAX);
    cfg.ring_cq_entries = RING_ENTRIES;
    cfg.grace_ns = 100;
    let mut rig = rig(pool(LOG_BUFFERS * BUFFER_BYTES, false), cfg);
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);
    let mut free: Vec<usize> = (0..LOG_BUFFERS).map(|i| i * BUFFER_BYTES).collect();
    let batch: Vec<usize> = free.drain(..POSTED_MAX).collect();
    rig.receiver.post(&batch).expect("post");

    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let mut now_ns = 0;
    let mut used_total = 0;
    for i in 0..WRITES {
        let len = rng.gen_range(1..=256);
        s.write(i as u64, &tagged(1 + (i % 255) as u8, len))
            .unwrap_or_else(|e| panic!("seed {SEED:#x}: write {i}: {e}"));
        let got = drain(&node.cq);
        assert_eq!(got.len(), 1, "seed {SEED:#x}: write {i}: {got:?}");
        assert_eq!(
            got[0].status,
            WcStatus::Success,
            "seed {SEED:#x}: write {i}: {got:?}"
        );
        if i % TICK_EVERY_WRITES == 0 {
            // The control loop: recycle used buffers; it never touches the ring CQ.
            now_ns += 60;
            let used = rig.receiver.tick(now_ns);
            used_total += used.len();
            free.extend(used);
            let room = POSTED_MAX - rig.receiver.posted_count();
            let batch: Vec<usize> = free.drain(..room.min(free.len())).collect();
            if !batch.is_empty() {
                rig.receiver.post(&batch).expect("repost");
            }
        }
    }
    assert_eq!(s.qp().state(), QpState::Ready);
    assert!(
        used_total > LOG_BUFFERS,
        "buffers were recycled ({used_total} used)"
    );
    assert_eq!(
        rig.receiver.ring_overwritten(),
        (WRITES - RING_ENTRIES) as u64,
        "one receive completion per write, all but the last {RING_ENTRIES} overwritten"
    );
}

// ---------------------------------------------------------------------------
// 7. Refused writes

#[test]
fn oversize_and_empty_writes_are_refused_and_send_nothing() {
    const BUFFER_BYTES: usize = 4096;
    const MTU_BYTES: usize = 256;
    let mut rig = rig(pool(BUFFER_BYTES, false), config(BUFFER_BYTES, 1));
    rig.receiver.post(&[0]).expect("post");
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, MTU_BYTES);
    let before = read(rig.receiver.log(), 0, BUFFER_BYTES);

    let too_large = || RowanError::TooLarge {
        len_bytes: MTU_BYTES + 1,
        mtu_bytes: MTU_BYTES,
    };
    let big = tagged(1, MTU_BYTES + 1);
    let ok = tagged(2, 100);
    assert_eq!(s.write(1, &big), Err(too_large()));
    assert_eq!(s.write(2, &[]), Err(RowanError::Empty));
    assert_eq!(s.write_blocks(3, &[]), Err(RowanError::Empty));
    assert_eq!(s.write_blocks(4, &[&ok, &big, &ok]), Err(too_large()));
    assert_eq!(s.write_blocks(5, &[&ok, &[]]), Err(RowanError::Empty));

    assert_eq!(s.qp().outstanding(), 0);
    assert!(drain(&node.cq).is_empty());
    assert_eq!(
        read(rig.receiver.log(), 0, BUFFER_BYTES),
        before,
        "receiver log changed"
    );

    // Exactly one MTU is accepted, and lands first: the refused writes took no space.
    let mtu = tagged(3, MTU_BYTES);
    s.write(6, &mtu).expect("write of one MTU");
    expect_one_success(&node.cq, 6);
    assert_eq!(read(rig.receiver.log(), 0, MTU_BYTES), mtu);
}

// ---------------------------------------------------------------------------
// 8. write_blocks

#[test]
fn write_blocks_lands_each_block_stride_aligned_and_signals_only_the_last() {
    const BUFFER_BYTES: usize = 4096;
    let mut rig = rig(pool(BUFFER_BYTES, false), config(BUFFER_BYTES, 1));
    rig.receiver.post(&[0]).expect("post");
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);
    let blocks = [tagged(0xA1, 256), tagged(0xA2, 100), tagged(0xA3, 1)];
    let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
    s.write_blocks(42, &refs).expect("write_blocks");
    expect_one_success(&node.cq, 42);
    assert_eq!(
        s.qp().outstanding(),
        0,
        "the last completion retired every block"
    );
    let log = rig.receiver.log();
    let mut at = 0;
    for b in &blocks {
        assert_eq!(read(log, at, b.len()), *b, "block at {at}");
        at += padded_len(b.len());
    }
    assert_eq!(at, 256 + 128 + 64);
}

/// Memory that runs a hook once, inside the DMA of the first message starting with
/// `trigger`: it lets a test put another sender's write between two blocks.
struct HookMemory {
    inner: DramMemory,
    trigger: u8,
    /// Run the hook before the triggering bytes are written (else after).
    before_write: bool,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl RegionMemory for HookMemory {
    fn len_bytes(&self) -> usize {
        self.inner.len_bytes()
    }
    fn dma_write(&self, offset: usize, data: &[u8]) {
        if !self.before_write {
            self.inner.dma_write(offset, data);
        }
        if data.first() == Some(&self.trigger) {
            let hook = self.hook.lock().expect("hook lock").take();
            if let Some(hook) = hook {
                hook();
            }
        }
        if self.before_write {
            self.inner.dma_write(offset, data);
        }
    }
    fn dma_read(&self, offset: usize, out: &mut [u8]) {
        self.inner.dma_read(offset, out)
    }
    fn dma_persist(&self, offset: usize, len: usize) {
        self.inner.dma_persist(offset, len)
    }
    fn dma_compare_swap(&self, offset: usize, expect: u64, swap: u64) -> u64 {
        self.inner.dma_compare_swap(offset, expect, swap)
    }
    fn dma_fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.inner.dma_fetch_add(offset, add)
    }
    fn power_fail(&self, policy: PowerFailure) {
        self.inner.power_fail(policy)
    }
}

/// One buffer of a receiver on a [`HookMemory`] that triggers on 0xA1, and two
/// connected senders, A and B.
struct HookRig {
    memory: Arc<HookMemory>,
    rig: Rig,
    node_a: SenderNode,
    node_b: SenderNode,
    a: RowanSender<LoopbackQp>,
    b: RowanSender<LoopbackQp>,
}

fn hook_rig(before_write: bool) -> HookRig {
    const BUFFER_BYTES: usize = 4096;
    let memory = Arc::new(HookMemory {
        inner: DramMemory::new(BUFFER_BYTES),
        trigger: 0xA1,
        before_write,
        hook: Mutex::new(None),
    });
    let mut rig = rig(memory.clone(), config(BUFFER_BYTES, 1));
    rig.receiver.post(&[0]).expect("post");
    let node_a = sender_node(&rig.fabric, 1, 8);
    let node_b = sender_node(&rig.fabric, 2, 8);
    let a = sender(&mut rig, &node_a, 8, 256);
    let b = sender(&mut rig, &node_b, 8, 256);
    HookRig {
        memory,
        rig,
        node_a,
        node_b,
        a,
        b,
    }
}

#[test]
fn write_blocks_may_be_split_by_another_senders_write() {
    let HookRig {
        memory,
        rig,
        node_a,
        node_b,
        mut a,
        mut b,
    } = hook_rig(false);
    let b_entry = tagged(0xB1, 64);
    let b_copy = b_entry.clone();
    *memory.hook.lock().expect("hook lock") = Some(Box::new(move || {
        b.write(7, &b_copy).expect("B's write");
    }));

    let blocks = [tagged(0xA1, 100), tagged(0xA2, 200), tagged(0xA3, 64)];
    let refs: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
    a.write_blocks(1, &refs).expect("write_blocks");
    assert!(
        memory.hook.lock().expect("hook lock").is_none(),
        "B's write ran"
    );
    expect_one_success(&node_a.cq, 1);
    expect_one_success(&node_b.cq, 7);

    // A's first block, then B's entry, then A's other blocks, in order.
    let log = rig.receiver.log();
    let layout: [(usize, &[u8]); 4] = [
        (0, &blocks[0]),
        (128, &b_entry),
        (192, &blocks[1]),
        (448, &blocks[2]),
    ];
    for (at, bytes) in layout {
        assert_eq!(read(log, at, bytes.len()), bytes, "offset {at}");
    }
}

/// Messages land whole and in the order they took their places: while one
/// sender's message is being written, another sender's later message (from
/// another thread) waits. Otherwise the receiver would see a later message
/// land past a hole, declare the buffer consumed, and digest would stop at the
/// hole and skip whatever lands there afterwards.
#[test]
fn a_later_message_never_lands_past_one_still_being_written() {
    // The hook runs before A's bytes are written: a NIC's DMA (the thread
    // standing in for it) preempted between taking a place and filling it.
    let HookRig {
        memory,
        rig,
        node_a,
        node_b,
        mut a,
        mut b,
    } = hook_rig(true);
    let a_entry = tagged(0xA1, 128);
    let b_entry = tagged(0xB1, 64);
    let log = rig.receiver.log().clone();
    let (landed_tx, landed_rx) = std::sync::mpsc::channel();
    let b_thread = {
        let log = log.clone();
        let b_entry = b_entry.clone();
        move || {
            // B writes while A's message is still being written.
            b.write(7, &b_entry).expect("B's write");
            // Whenever B's write has landed, A's message is whole before it.
            let _ = landed_tx.send(read(&log, 0, 128));
        }
    };
    let handle = Arc::new(Mutex::new(None));
    let h = handle.clone();
    *memory.hook.lock().expect("hook lock") = Some(Box::new(move || {
        *h.lock().expect("handle lock") = Some(std::thread::spawn(b_thread));
        // A's DMA is slow: B has all the time it needs to land first.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }));
    a.write(1, &a_entry).expect("A's write");
    let b_done = handle
        .lock()
        .expect("handle lock")
        .take()
        .expect("B started");
    b_done.join().expect("B's thread");
    assert_eq!(
        landed_rx.recv().expect("B landed"),
        a_entry,
        "B's message landed while A's, before it, was still a hole"
    );
    expect_one_success(&node_a.cq, 1);
    expect_one_success(&node_b.cq, 7);
    assert_eq!(read(&log, 0, 128), a_entry);
    assert_eq!(read(&log, 128, 64), b_entry);
}

// ---------------------------------------------------------------------------
// 9. Receiver not ready

#[test]
fn write_without_posted_buffer_is_rnr_and_retry_after_reset_succeeds() {
    const BUFFER_BYTES: usize = 4096;
    let mut rig = rig(pool(BUFFER_BYTES, false), config(BUFFER_BYTES, 1));
    let node = sender_node(&rig.fabric, 1, 8);
    let mut s = sender(&mut rig, &node, 8, 256);
    let entry = tagged(5, 128);

    s.write(1, &entry).expect("post_send");
    let got = drain(&node.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].wr_id, got[0].status),
        (1, WcStatus::RnrRetryExceeded)
    );
    assert_eq!(s.qp().state(), QpState::Error);

    rig.receiver.post(&[0]).expect("post");
    // Still in the error state: flushed, not landed.
    s.write(2, &entry).expect("post_send");
    let got = drain(&node.cq);
    assert_eq!((got.len(), got[0].status), (1, WcStatus::WrFlushError));
    assert_eq!(rig.receiver.log().read_u64(0), 0);

    s.qp().reset().expect("reset");
    s.write(3, &entry).expect("retry");
    expect_one_success(&node.cq, 3);
    assert_eq!(read(rig.receiver.log(), 0, entry.len()), entry);
}

/// A sender that dials again under the key it used (a worker whose connection
/// failed, or a restarted server) gets a new queue pair and its old one is
/// closed: its SENDs fail and never land. Other keys, and the same key from
/// another node, keep theirs.
#[test]
fn accepting_a_sender_again_under_its_key_closes_its_old_queue_pair() {
    let mut rig = rig(Arc::new(DramMemory::new(64 * 1024)), config(4096, 8));
    rig.receiver.post(&[0, 4096, 8192]).expect("post");
    let a = sender_node(&rig.fabric, 1, 64);
    let b = sender_node(&rig.fabric, 2, 64);
    let dial = |rig: &mut Rig, node: &SenderNode, key: u16| {
        let qp = node.nic.create_qp(&node.cq, &node.cq, None, 8).unwrap();
        let remote = rig.receiver.accept_as(qp.addr(), key).expect("accept");
        qp.connect(remote).expect("connect");
        RowanSender::new(qp, 4096)
    };
    let mut old = dial(&mut rig, &a, 0);
    let mut other_key = dial(&mut rig, &a, 1);
    let mut other_node = dial(&mut rig, &b, 0);
    let mut new = dial(&mut rig, &a, 0);
    let entry = [7u8; 64];
    let status = |s: &mut RowanSender<LoopbackQp>, node: &SenderNode, id: u64| {
        s.write(id, &entry).expect("post");
        let c = drain(&node.cq);
        assert_eq!(c.len(), 1, "{c:?}");
        c[0].status
    };
    assert_ne!(
        status(&mut old, &a, 1),
        WcStatus::Success,
        "the old queue pair"
    );
    assert_eq!(status(&mut new, &a, 2), WcStatus::Success);
    assert_eq!(status(&mut other_key, &a, 3), WcStatus::Success);
    assert_eq!(status(&mut other_node, &b, 4), WcStatus::Success);
}
