//! Crash tests of the redo ring with the pmem crash simulator: a power failure at
//! every persist point of a sequence of RPCs (and at every persist point of the
//! recovery from each of those crashes), checking that every request either takes
//! effect exactly once or was never acknowledged — and that a sender which resends
//! from the receiver's `next_seq` ends with every request exactly once.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use common::*;
use rowankv_drpc::{ConnId, FlowConfig, Receiver, Variant};
use rowankv_fabric::{LoopbackFabric, PowerFailure};
use rowankv_pmem::{Pool, PoolOptions};

/// RPCs per run: enough to wrap the 2 KiB ring and skip chunk tails.
const RPCS: u64 = 12;
/// Seeds of the adversarial-subset images taken beside the drop-all image.
const SUBSET_SEEDS: [u64; 2] = [11, 12];

struct CrashImage {
    point: u64,
    policy: PowerFailure,
    bytes: Vec<u8>,
    /// Requests the sender had seen acknowledged as durable when the power failed.
    acked: BTreeSet<u64>,
}

fn crash_sim() -> PoolOptions {
    PoolOptions {
        crash_sim: true,
        ..PoolOptions::default()
    }
}

/// Runs `RPCS` requests and returns the crash image at every persist point, with
/// what the sender had seen acknowledged at that instant.
fn run_and_capture(variant: Variant, flow: FlowConfig) -> Vec<CrashImage> {
    let pool = formatted_pool(crash_sim());
    let fabric = LoopbackFabric::new();
    let (mut r, mut s, _) = connect(&fabric, pool.clone(), variant, flow, ConnId(1));
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let images = Arc::new(Mutex::new(Vec::new()));
    let weak = Arc::downgrade(&pool);
    {
        let acked = acked.clone();
        let images = images.clone();
        pool.crash()
            .unwrap()
            .set_persist_hook(Some(Box::new(move |point| {
                let pool = weak.upgrade().expect("pool alive during the run");
                let acked = acked.lock().unwrap().clone();
                let sim = pool.crash().unwrap();
                let mut out = images.lock().unwrap();
                out.push(CrashImage {
                    point,
                    policy: PowerFailure::DropAll,
                    bytes: sim.image(PowerFailure::DropAll),
                    acked: acked.clone(),
                });
                for seed in SUBSET_SEEDS {
                    let policy = PowerFailure::DropSubset {
                        seed: seed ^ point,
                        drop_probability: 0.5,
                    };
                    out.push(CrashImage {
                        point,
                        policy,
                        bytes: sim.image(policy),
                        acked: acked.clone(),
                    });
                }
            })));
    }
    let reqs: Vec<u64> = (1..=RPCS).collect();
    let seen = drive(&mut r, &mut s, &reqs, |e| {
        if let rowankv_drpc::Event::Durable { seq } = e {
            acked.lock().unwrap().insert(*seq);
        }
    });
    assert_eq!(seen.completed.len() as u64, RPCS);
    pool.crash().unwrap().set_persist_hook(None);
    // And a power failure after the last persist.
    let mut out = std::mem::take(&mut *images.lock().unwrap());
    out.push(CrashImage {
        point: pool.crash().unwrap().persist_points(),
        policy: PowerFailure::DropAll,
        bytes: pool.crash().unwrap().image(PowerFailure::DropAll),
        acked: acked.lock().unwrap().clone(),
    });
    out
}

/// Recovers `bytes` and checks the exactly-once property against `acked`. Returns
/// the recovered receiver's `next_seq` for connection 1.
fn recover_and_check(
    bytes: &[u8],
    acked: &BTreeSet<u64>,
    flow: FlowConfig,
    what: &str,
) -> (Arc<Pool>, u64) {
    let pool = Pool::from_image(bytes, PoolOptions::default()).unwrap();
    let fabric = LoopbackFabric::new();
    let nic = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
    let (r, report) = Receiver::open(pool.clone(), nic, flow, Counters).unwrap();
    let next_seq = report.next_seq[1];
    assert_eq!(report.next_seq[0], 1, "{what}: connection 0 was never used");
    for i in 1..=RPCS {
        let c = counter(&r, i);
        assert!(c <= 1, "{what}: request {i} took effect {c} times");
        if acked.contains(&i) {
            assert_eq!(c, 1, "{what}: acknowledged request {i} lost");
        }
        // Below next_seq: in the ring, hence executed; from it on: never executed,
        // so the sender's resend of it is its only execution.
        let expect = u64::from(i < next_seq);
        assert_eq!(c, expect, "{what}: request {i} vs next_seq {next_seq}");
    }
    assert!(
        acked.iter().all(|&i| i < next_seq),
        "{what}: next_seq {next_seq} asks to resend an acknowledged request"
    );
    (pool, next_seq)
}

fn check_variant(variant: Variant, flow: FlowConfig) -> (usize, usize) {
    let v = variant.name();
    let images = run_and_capture(variant, flow);
    let points = images
        .iter()
        .map(|i| i.point)
        .collect::<BTreeSet<_>>()
        .len();
    assert!(points as u64 >= 3 * RPCS, "{v}: {points} persist points");
    let mut nested_images = 0;
    for img in &images {
        let what = format!("{v} point {} {:?}", img.point, img.policy);
        let (pool, next_seq) = recover_and_check(&img.bytes, &img.acked, flow, &what);

        // A crash during recovery: recover again from every persist point of it.
        if img.policy == PowerFailure::DropAll {
            let nested = Pool::from_image(&img.bytes, crash_sim()).unwrap();
            let captured = Arc::new(Mutex::new(Vec::new()));
            let weak = Arc::downgrade(&nested);
            let c2 = captured.clone();
            nested
                .crash()
                .unwrap()
                .set_persist_hook(Some(Box::new(move |_| {
                    let p = weak.upgrade().expect("pool alive");
                    c2.lock()
                        .unwrap()
                        .push(p.crash().unwrap().image(PowerFailure::DropAll));
                })));
            let fabric = LoopbackFabric::new();
            let nic = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
            let _ = Receiver::open(nested.clone(), nic, flow, Counters).unwrap();
            nested.crash().unwrap().set_persist_hook(None);
            for (k, bytes) in captured.lock().unwrap().iter().enumerate() {
                let what = format!("{what}, then at recovery persist {k}");
                let (_, again) = recover_and_check(bytes, &img.acked, flow, &what);
                assert_eq!(again, next_seq, "{what}: recovery is deterministic");
                nested_images += 1;
            }
        }

        // The sender resends what the receiver does not hold; afterwards every
        // request has taken effect exactly once.
        let fabric = LoopbackFabric::new();
        let (mut r, mut s, _) = connect(&fabric, pool, variant, flow, ConnId(1));
        assert_eq!(s.next_seq(), Some(next_seq));
        let resend: Vec<u64> = (next_seq..=RPCS).collect();
        for i in &resend {
            assert!(!img.acked.contains(i), "{what}: resending acknowledged {i}");
        }
        drive(&mut r, &mut s, &resend, |_| {});
        for i in 1..=RPCS {
            assert_eq!(counter(&r, i), 1, "{what}: after resend, request {i}");
        }
    }
    (images.len(), nested_images)
}

fn crash_test(variant: Variant, batch_max: usize) {
    let flow = FlowConfig {
        inflight_max: 4,
        batch_max,
        ..flow()
    };
    let (outer, nested) = check_variant(variant, flow);
    println!(
        "drpc crash images: {} batch_max {batch_max}: {outer} at the RPCs' persist points + {nested} during recovery = {}",
        variant.name(),
        outer + nested
    );
    assert!(outer + nested > 400, "only {} crash images", outer + nested);
}

// Each: a power failure at every persist point of 12 RPCs (drop all unpersisted
// lines, and two random subsets), and at every persist point of the recovery from
// each drop-all image; then the sender's resend from `next_seq`.

#[test]
fn crash_sflush_at_every_persist_point() {
    crash_test(Variant::SFlush, 1);
}

#[test]
fn crash_wflush_at_every_persist_point() {
    crash_test(Variant::WFlush, 1);
}

#[test]
fn crash_s_rflush_at_every_persist_point() {
    crash_test(Variant::SRFlush, 1);
}

#[test]
fn crash_w_rflush_at_every_persist_point() {
    crash_test(Variant::WRFlush, 1);
}

#[test]
fn crash_sflush_batched_at_every_persist_point() {
    crash_test(Variant::SFlush, 3);
}

#[test]
fn crash_wflush_batched_at_every_persist_point() {
    crash_test(Variant::WFlush, 3);
}

#[test]
fn crash_s_rflush_batched_at_every_persist_point() {
    crash_test(Variant::SRFlush, 3);
}

#[test]
fn crash_w_rflush_batched_at_every_persist_point() {
    crash_test(Variant::WRFlush, 3);
}

/// Two connections of different variants into one receiver, sharing its apply record
/// and state: a power failure at every persist point, recovery, and each
/// connection's `next_seq` checked against what its own sender saw acknowledged.
#[test]
fn crash_two_connections_at_every_persist_point() {
    const PER_CONN: u64 = 8;
    /// Counter index of connection c's request with seq k.
    fn index(c: usize, k: u64) -> u64 {
        100 * c as u64 + k
    }
    let variants = [Variant::WFlush, Variant::SRFlush];
    let flow = flow();
    let pool = formatted_pool(crash_sim());
    let fabric = LoopbackFabric::new();
    let nic_r = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
    let (mut r, _) = Receiver::open(pool.clone(), nic_r, flow, Counters).unwrap();
    let mut senders = Vec::new();
    for (c, variant) in variants.iter().enumerate() {
        let nic =
            rowankv_fabric::Fabric::attach(&fabric, rowankv_types::NodeId(10 + c as u32)).unwrap();
        let mut s = rowankv_drpc::Sender::new(&nic, *variant, flow).unwrap();
        let offer = r.accept(ConnId(c as u32), *variant, s.qp_addr()).unwrap();
        s.connect(&offer).unwrap();
        senders.push(s);
    }
    let acked = Arc::new(Mutex::new([BTreeSet::new(), BTreeSet::new()]));
    let images = Arc::new(Mutex::new(Vec::new()));
    {
        let weak = Arc::downgrade(&pool);
        let acked = acked.clone();
        let images = images.clone();
        pool.crash()
            .unwrap()
            .set_persist_hook(Some(Box::new(move |_| {
                let pool = weak.upgrade().expect("pool alive");
                let image = pool.crash().unwrap().image(PowerFailure::DropAll);
                images
                    .lock()
                    .unwrap()
                    .push((image, acked.lock().unwrap().clone()));
            })));
    }
    let mut sent = [1u64, 1];
    let mut completed = 0;
    let mut events = Vec::new();
    for _ in 0..ROUNDS_MAX {
        for (c, s) in senders.iter_mut().enumerate() {
            // Interleave: one request per connection per round.
            if sent[c] <= PER_CONN {
                match s.call(OP_INCREMENT, &payload(index(c, sent[c]))) {
                    Ok(seq) => {
                        assert_eq!(seq, sent[c]);
                        sent[c] += 1;
                    }
                    Err(rowankv_drpc::DrpcError::WouldBlock) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
        r.poll().unwrap();
        for (c, s) in senders.iter_mut().enumerate() {
            events.clear();
            s.poll(&mut events).unwrap();
            for e in &events {
                match e {
                    rowankv_drpc::Event::Durable { seq } => {
                        acked.lock().unwrap()[c].insert(*seq);
                    }
                    rowankv_drpc::Event::Completed { .. } => completed += 1,
                }
            }
        }
        if completed == 2 * PER_CONN {
            break;
        }
    }
    assert_eq!(completed, 2 * PER_CONN);
    pool.crash().unwrap().set_persist_hook(None);
    let images = std::mem::take(&mut *images.lock().unwrap());
    for (point, (bytes, acked)) in images.iter().enumerate() {
        let pool = Pool::from_image(bytes, PoolOptions::default()).unwrap();
        let fabric = LoopbackFabric::new();
        let nic = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
        let (r, report) = Receiver::open(pool, nic, flow, Counters).unwrap();
        for (c, acked) in acked.iter().enumerate() {
            let next_seq = report.next_seq[c];
            for k in 1..=PER_CONN {
                let got = counter(&r, index(c, k));
                let what = format!("point {point}: connection {c} request {k}");
                assert_eq!(
                    got,
                    u64::from(k < next_seq),
                    "{what} vs next_seq {next_seq}"
                );
                if acked.contains(&k) {
                    assert_eq!(got, 1, "{what}: acknowledged and lost");
                }
            }
        }
    }
    println!(
        "drpc crash images: two connections (wflush + s-rflush): {}",
        images.len()
    );
    assert!(images.len() as u64 >= 6 * PER_CONN);
}
