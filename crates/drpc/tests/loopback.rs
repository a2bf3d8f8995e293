//! The four durable RPC variants on the loopback fabric: order, exactly-once
//! execution, truncation, batching, the slow-down signal, and a restart.

mod common;

use common::*;
use rowankv_drpc::{
    persisted_header, ConnId, DrpcError, Event, FlowConfig, Receiver, RingGeometry, Sender, Variant,
};
use rowankv_fabric::LoopbackFabric;
use rowankv_pmem::PoolOptions;
use rowankv_types::NodeId;

const REQUESTS: u64 = 40;

/// A window of six, one request executed per receiver poll, no slow-down: a test
/// can leave requests landed and not executed.
fn one_per_poll() -> FlowConfig {
    FlowConfig {
        inflight_max: 6,
        requests_per_poll_max: 1,
        slow_down_threshold: 16,
        ..flow()
    }
}

/// Every variant: each request is durable before it completes, completes once and in
/// seq order, its effect is applied once; the ring wraps several times and its
/// truncation point is persisted.
#[test]
fn every_variant_executes_each_request_once_in_order() {
    for variant in Variant::ALL {
        let fabric = LoopbackFabric::new();
        let pool = formatted_pool(PoolOptions::default());
        let conn = ConnId(1);
        let (mut r, mut s, report) = connect(&fabric, pool.clone(), variant, flow(), conn);
        assert_eq!(report.reexecuted, vec![], "a fresh ring holds nothing");
        assert_eq!(report.next_seq, vec![1, 1]);
        let reqs: Vec<u64> = (1..=REQUESTS).collect();
        let seen = drive(&mut r, &mut s, &reqs, |_| {});
        let v = variant.name();
        assert_eq!(seen.durable, reqs, "{v}: durable once each, in seq order");
        let completed: Vec<u64> = seen
            .order
            .iter()
            .filter_map(|e| match e {
                Event::Completed { seq, .. } => Some(*seq),
                Event::Durable { .. } => None,
            })
            .collect();
        assert_eq!(completed, reqs, "{v}: completed in seq order (FIFO)");
        for seq in &reqs {
            let durable_at = seen
                .order
                .iter()
                .position(|e| *e == Event::Durable { seq: *seq })
                .unwrap();
            let completed_at = seen
                .order
                .iter()
                .position(|e| matches!(e, Event::Completed { seq: s, .. } if s == seq))
                .unwrap();
            assert!(
                durable_at < completed_at,
                "{v}: {seq} durable before completed"
            );
            assert_eq!(
                seen.completed[seq],
                1u64.to_le_bytes(),
                "{v}: reply of {seq}"
            );
            assert_eq!(counter(&r, *seq), 1, "{v}: request {seq} applied once");
        }
        assert_eq!(r.done_seq(conn), REQUESTS);
        assert_eq!(r.backlog(conn), 0);
        let g = r.geometry();
        let (head, done) = persisted_header(&pool, &g, conn);
        assert_eq!(done, REQUESTS, "{v}: completion mark persisted");
        assert_eq!(head, r.head_abs(conn), "{v}: truncation persisted");
        assert!(
            head > 3 * g.ring_bytes as u64,
            "{v}: the ring wrapped (head {head})"
        );
        let st = s.stats();
        let wrs_per_entry = if variant == Variant::WFlush { 3 } else { 1 };
        assert_eq!(st.entries_posted, REQUESTS, "{v}: one entry per request");
        assert_eq!(
            st.work_requests_posted,
            wrs_per_entry * REQUESTS,
            "{v}: verbs"
        );
        let rs = r.stats();
        assert_eq!(rs.requests_completed, REQUESTS);
        let notices = if variant.receiver_initiated() {
            REQUESTS
        } else {
            0
        };
        assert_eq!(rs.durable_notices, notices, "{v}: RFlush notices");
        // The other connection's ring was never touched.
        assert_eq!(persisted_header(&pool, &g, ConnId(0)), (0, 0));
    }
}

/// Figure 6: with batching, several requests travel in one entry under one flush
/// (WFlush: one WRITE, one FLUSH, one ATOMIC WRITE per batch), each still durable and
/// executed once.
#[test]
fn batching_packs_requests_into_one_entry_and_one_flush() {
    for variant in Variant::ALL {
        let fabric = LoopbackFabric::new();
        let pool = formatted_pool(PoolOptions::default());
        let flow = FlowConfig {
            inflight_max: 8,
            batch_max: 4,
            slow_down_threshold: 16,
            requests_per_poll_max: 8,
            ..flow()
        };
        let (mut r, mut s, _) = connect(&fabric, pool, variant, flow, ConnId(0));
        // 8-byte payloads: four requests take one 64 B-aligned entry of 128 bytes.
        let mut sent = Vec::new();
        let mut events = Vec::new();
        let mut seqs = Vec::new();
        for i in 1..=32u64 {
            let p = i.to_le_bytes();
            loop {
                match s.call(OP_INCREMENT, &p) {
                    Ok(seq) => {
                        seqs.push(seq);
                        break;
                    }
                    Err(DrpcError::WouldBlock) => {
                        r.poll().unwrap();
                        s.poll(&mut events).unwrap();
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            sent.push(i);
        }
        for _ in 0..ROUNDS_MAX {
            if r.done_seq(ConnId(0)) == 32 {
                break;
            }
            s.flush().ok();
            r.poll().unwrap();
            s.poll(&mut events).unwrap();
        }
        s.poll(&mut events).unwrap();
        let v = variant.name();
        assert_eq!(seqs, (1..=32).collect::<Vec<_>>());
        assert_eq!(s.stats().entries_posted, 8, "{v}: 32 requests in 8 entries");
        let wrs = if variant == Variant::WFlush { 3 } else { 1 };
        assert_eq!(
            s.stats().work_requests_posted,
            8 * wrs,
            "{v}: one flush per batch"
        );
        assert_eq!(r.stats().entries_found, 8);
        for i in sent {
            assert_eq!(counter(&r, i), 1, "{v}: request {i} applied once");
        }
        let durable: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Durable { seq } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(
            durable,
            (1..=32).collect::<Vec<_>>(),
            "{v}: each durable once"
        );
    }
}

/// When the receiver's backlog passes the threshold its replies say so, and the
/// sender holds to the slowed window until a reply without the signal.
#[test]
fn slow_down_signal_throttles_the_sender() {
    for variant in Variant::ALL {
        let fabric = LoopbackFabric::new();
        let pool = formatted_pool(PoolOptions::default());
        let flow = FlowConfig {
            inflight_max: 6,
            inflight_slowed_max: 1,
            batch_max: 1,
            slow_down_threshold: 2,
            requests_per_poll_max: 1,
            reply_bytes_max: 64,
        };
        let (mut r, mut s, _) = connect(&fabric, pool, variant, flow, ConnId(0));
        let v = variant.name();
        let mut i = 1u64;
        let mut events = Vec::new();
        // Fill the window: six requests, all accepted.
        while s.call(OP_INCREMENT, &i.to_le_bytes()).is_ok() {
            i += 1;
        }
        assert_eq!(i, 7, "{v}: the window is six");
        // The receiver finds six and executes one: backlog five > threshold two.
        assert_eq!(r.poll().unwrap(), 1);
        assert_eq!(r.backlog(ConnId(0)), 5);
        s.poll(&mut events).unwrap();
        assert!(s.is_slowed(), "{v}: the completion carried the signal");
        assert_eq!(s.inflight(), 5);
        assert!(
            matches!(
                s.call(OP_INCREMENT, &i.to_le_bytes()),
                Err(DrpcError::WouldBlock)
            ),
            "{v}: a slowed sender holds back"
        );
        // Drain: each poll executes one; below the threshold the signal clears.
        while r.backlog(ConnId(0)) > 0 {
            r.poll().unwrap();
            s.poll(&mut events).unwrap();
            if r.backlog(ConnId(0)) > 2 {
                assert!(
                    s.is_slowed(),
                    "{v}: backlog {} still slowed",
                    r.backlog(ConnId(0))
                );
            }
        }
        assert!(!s.is_slowed(), "{v}: the signal cleared");
        assert_eq!(s.inflight(), 0);
        assert!(s.call(OP_INCREMENT, &i.to_le_bytes()).is_ok());
        assert_eq!(s.stats().slow_down_signals, 1, "{v}");
        assert!(r.stats().slow_down_replies >= 3, "{v}");
    }
}

/// A receiver restarted from its pool re-executes the requests that were durable but
/// not completed, reports where the sender continues, and the sender resends nothing
/// that was acknowledged.
#[test]
fn restart_reexecutes_durable_requests_and_the_sender_does_not_resend() {
    for variant in Variant::ALL {
        let v = variant.name();
        let pool = formatted_pool(PoolOptions::default());
        let flow = one_per_poll();
        {
            let fabric = LoopbackFabric::new();
            let (mut r, mut s, _) = connect(&fabric, pool.clone(), variant, flow, ConnId(0));
            for i in 1..=6u64 {
                assert_eq!(s.call(OP_INCREMENT, &payload(i)).unwrap(), i);
            }
            // One round: the receiver finds all six (and for RFlush persists and
            // notifies them) and executes one.
            assert_eq!(r.poll().unwrap(), 1);
            let mut events = Vec::new();
            s.poll(&mut events).unwrap();
            assert_eq!(s.durable_through(), 6, "{v}: all six acknowledged durable");
            assert_eq!(r.done_seq(ConnId(0)), 1);
            // The receiver stops here (process crash: the pool keeps what was stored).
        }
        let fabric = LoopbackFabric::new();
        let (r, mut s, report) = connect(&fabric, pool.clone(), variant, flow, ConnId(0));
        let reexecuted: Vec<u64> = report.reexecuted.iter().map(|(_, q)| *q).collect();
        assert_eq!(
            reexecuted,
            vec![2, 3, 4, 5, 6],
            "{v}: re-executed on restart"
        );
        assert_eq!(report.next_seq[0], 7, "{v}: nothing to resend");
        assert_eq!(s.next_seq(), Some(7));
        for i in 1..=6 {
            assert_eq!(counter(&r, i), 1, "{v}: request {i} exactly once");
        }
        let mut r = r;
        let seen = drive(&mut r, &mut s, &[7, 8, 9], |_| {});
        assert_eq!(
            seen.completed.keys().copied().collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
        for i in 1..=9 {
            assert_eq!(counter(&r, i), 1, "{v}: request {i} exactly once");
        }
    }
}

/// A pool that was never formatted, or formatted with another layout version, is
/// refused with a typed error, not read as a ring.
#[test]
fn unformatted_pool_is_refused() {
    let g = geometry();
    let pool = rowankv_pmem::Pool::anonymous(g.pool_bytes(), PoolOptions::default()).unwrap();
    let fabric = LoopbackFabric::new();
    let nic = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
    match rowankv_drpc::Receiver::open(pool, nic, flow(), Counters) {
        Err(DrpcError::Pool(msg)) => assert!(msg.contains("magic"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an unformatted pool opened"),
    }
}

/// The receiver's node loses power in the middle of a run (the fabric's fault
/// injector hands its pool to the crash simulator: every unpersisted line is lost).
/// The sender's next verb fails; the restarted receiver re-executes what its ring
/// holds; the sender, on a new connection, resends only from `next_seq`, which is
/// past everything it saw acknowledged; every request ends applied exactly once.
#[test]
fn receiver_power_failure_mid_run_then_resume() {
    use rowankv_fabric::{Fabric, FaultInjector, PowerFailure};
    use std::collections::BTreeSet;
    const N: u64 = 10;
    // Runs in which recovery re-executed something, and in which the sender resent.
    let (mut reexecuted, mut resent) = (0, 0);
    for variant in Variant::ALL {
        for crash_round in 1..=6 {
            let v = format!("{} crash after round {crash_round}", variant.name());
            let pool = formatted_pool(PoolOptions {
                crash_sim: true,
                ..PoolOptions::default()
            });
            let flow = FlowConfig {
                inflight_max: 4,
                requests_per_poll_max: 1,
                slow_down_threshold: 16,
                ..flow()
            };
            let fabric = LoopbackFabric::new();
            let (mut r, mut s, _) = connect(&fabric, pool.clone(), variant, flow, ConnId(0));
            let mut acked = BTreeSet::new();
            let mut next = 1;
            let mut events = Vec::new();
            for _ in 0..crash_round {
                while next <= N && s.call(OP_INCREMENT, &payload(next)).is_ok() {
                    next += 1;
                }
                r.poll().unwrap();
                events.clear();
                s.poll(&mut events).unwrap();
                for e in &events {
                    if let Event::Durable { seq } = e {
                        acked.insert(*seq);
                    }
                }
            }
            fabric.power_fail(RECEIVER, PowerFailure::DropAll);
            drop(r);
            // The sender learns of the crash from its next verb.
            if next <= N {
                s.call(OP_INCREMENT, &payload(next)).unwrap();
                s.flush().ok();
            }
            let err = s.poll(&mut events);
            if next <= N {
                assert!(
                    matches!(err, Err(DrpcError::Connection(_))),
                    "{v}: the sender sees the failure: {err:?}"
                );
            }
            // Restart on a fresh NIC; the sender reconnects from another queue pair.
            let nic_r = fabric.attach(RECEIVER).unwrap();
            let (mut r, report) =
                rowankv_drpc::Receiver::open(pool.clone(), nic_r, flow, Counters).unwrap();
            let next_seq = report.next_seq[0];
            assert!(
                acked.iter().all(|&k| k < next_seq),
                "{v}: next_seq {next_seq} below an acknowledged request ({acked:?})"
            );
            for k in 1..=N {
                assert_eq!(counter(&r, k), u64::from(k < next_seq), "{v}: request {k}");
            }
            let nic_s = fabric.attach(rowankv_types::NodeId(3)).unwrap();
            let mut s = rowankv_drpc::Sender::new(&nic_s, variant, flow).unwrap();
            let offer = r.accept(ConnId(0), variant, s.qp_addr()).unwrap();
            s.connect(&offer).unwrap();
            let resend: Vec<u64> = (next_seq..=N).collect();
            reexecuted += usize::from(!report.reexecuted.is_empty());
            resent += usize::from(!resend.is_empty());
            drive(&mut r, &mut s, &resend, |_| {});
            for k in 1..=N {
                assert_eq!(counter(&r, k), 1, "{v}: request {k} after the resend");
            }
        }
    }
    assert!(
        reexecuted > 0 && resent > 0,
        "{reexecuted} runs re-executed, {resent} resent"
    );
    println!("power failures: {reexecuted} of 24 runs re-executed on restart, {resent} resent");
}

/// A sender that dials again gets its connection back through `release`: every
/// request that landed on the old connection — acknowledged durable or not — is
/// executed once, its queue pair is closed (a late request of the old sender
/// fails), and the new sender goes on from the next seq at a fresh chunk.
#[test]
fn a_released_connection_executes_what_landed_and_is_accepted_again() {
    for variant in Variant::ALL {
        let v = variant.name();
        let pool = formatted_pool(PoolOptions::default());
        let flow = one_per_poll();
        let fabric = LoopbackFabric::new();
        let (mut r, mut old, _) = connect(&fabric, pool.clone(), variant, flow, ConnId(0));
        for i in 1..=5u64 {
            assert_eq!(old.call(OP_INCREMENT, &payload(i)).unwrap(), i);
        }
        assert_eq!(r.poll().unwrap(), 1, "{v}: one executed before the release");
        assert_eq!(
            r.release(ConnId(0)).unwrap(),
            4,
            "{v}: the other four landed"
        );
        assert_eq!(
            r.done_seq(ConnId(0)),
            5 + 6,
            "{v}: one window of seqs skipped"
        );
        assert_eq!(r.backlog(ConnId(0)), 0);
        for i in 1..=5 {
            assert_eq!(counter(&r, i), 1, "{v}: request {i} exactly once");
        }
        // The old sender's connection is gone: what it posts now fails.
        let late = old
            .call(OP_INCREMENT, &payload(6))
            .and_then(|_| old.flush());
        let mut events = Vec::new();
        let mut failed = late.is_err();
        for _ in 0..1000 {
            if failed {
                break;
            }
            failed = old.poll(&mut events).is_err() || old.call(OP_INCREMENT, &payload(6)).is_err();
            std::thread::yield_now();
        }
        assert!(
            failed,
            "{v}: the released connection still carries requests"
        );
        assert_eq!(
            counter(&r, 6),
            0,
            "{v}: nothing of the old sender lands any more"
        );
        // The same connection, accepted again, for a new sender.
        let nic = rowankv_fabric::Fabric::attach(&fabric, NodeId(9)).unwrap();
        let mut new = Sender::new(&nic, variant, flow).unwrap();
        let offer = r.accept(ConnId(0), variant, new.qp_addr()).unwrap();
        // One window (six) past the last executed: the old sender's seqs.
        assert_eq!(offer.next_seq, 12, "{v}");
        assert_eq!(
            offer.tail_abs % geometry().chunk_bytes as u64,
            0,
            "{v}: a fresh chunk"
        );
        new.connect(&offer).unwrap();
        let seen = drive(&mut r, &mut new, &[7, 8], |_| {});
        assert_eq!(
            seen.completed.keys().copied().collect::<Vec<_>>(),
            vec![12, 13]
        );
        for i in [1, 2, 3, 4, 5, 7, 8] {
            assert_eq!(counter(&r, i), 1, "{v}: request {i} exactly once");
        }
        // And after a restart the ring holds nothing to run again.
        drop(r);
        let fabric = LoopbackFabric::new();
        let (_r, _s, report) = connect(&fabric, pool, variant, flow, ConnId(0));
        assert!(report.reexecuted.is_empty(), "{v}: {:?}", report.reexecuted);
        assert_eq!(report.next_seq[0], 14);
    }
}

/// A ring set can live inside a larger pool, at `base` (RowanKV's `drpc`
/// strategy keeps it after the engine's segments): it formats, opens and
/// recovers there and leaves the bytes before `base` alone.
#[test]
fn a_ring_set_at_a_base_offset_leaves_the_rest_of_the_pool_alone() {
    let base = 3 * 4096;
    let g = RingGeometry { base, ..geometry() };
    assert_eq!(g.pool_bytes(), base + geometry().pool_bytes());
    let pool = rowankv_pmem::Pool::anonymous(g.pool_bytes(), PoolOptions::default()).unwrap();
    pool.write(0, &vec![0xA5; base]);
    Receiver::<rowankv_fabric::LoopbackNic, Counters>::format(&pool, g).unwrap();
    let fabric = LoopbackFabric::new();
    let nic_r = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
    let nic_s = rowankv_fabric::Fabric::attach(&fabric, SENDER).unwrap();
    let (mut r, _) = Receiver::open_at(pool.clone(), base, nic_r, flow(), Counters).unwrap();
    assert_eq!(r.geometry(), g);
    let mut s = Sender::new(&nic_s, Variant::WFlush, flow()).unwrap();
    let offer = r.accept(ConnId(1), Variant::WFlush, s.qp_addr()).unwrap();
    s.connect(&offer).unwrap();
    drive(&mut r, &mut s, &[1, 2, 3], |_| {});
    let mut before = vec![0u8; base];
    pool.read(0, &mut before);
    assert!(
        before.iter().all(|&b| b == 0xA5),
        "bytes before the base touched"
    );
    assert!(
        Receiver::open_at(
            pool.clone(),
            base + 4096,
            rowankv_fabric::Fabric::attach(&fabric, NodeId(7)).unwrap(),
            flow(),
            Counters
        )
        .is_err(),
        "no ring set one page further on"
    );
    let err = Receiver::<rowankv_fabric::LoopbackNic, Counters>::format(
        &pool,
        RingGeometry { base: 100, ..g },
    );
    assert!(
        matches!(err, Err(DrpcError::Config(_))),
        "an unaligned base"
    );
}

/// `drain` executes what had landed when it was called, every connection, and
/// returns: what lands later waits for the next poll.
#[test]
fn drain_executes_what_landed_and_ends() {
    for variant in Variant::ALL {
        let v = variant.name();
        let pool = formatted_pool(PoolOptions::default());
        let flow = one_per_poll();
        let fabric = LoopbackFabric::new();
        let (mut r, mut s, _) = connect(&fabric, pool, variant, flow, ConnId(1));
        for i in 1..=5u64 {
            s.call(OP_INCREMENT, &payload(i)).unwrap();
        }
        assert_eq!(r.drain().unwrap(), 5, "{v}: all five, though one per poll");
        assert_eq!(r.done_seq(ConnId(1)), 5);
        assert_eq!(r.drain().unwrap(), 0, "{v}: nothing more landed");
        let mut events = Vec::new();
        let mut completed = 0;
        for _ in 0..10_000 {
            events.clear();
            s.poll(&mut events).unwrap();
            completed += events
                .iter()
                .filter(|e| matches!(e, Event::Completed { .. }))
                .count();
            if completed == 5 {
                break;
            }
        }
        assert_eq!(completed, 5, "{v}: drained requests are answered");
        for i in 1..=5 {
            assert_eq!(counter(&r, i), 1, "{v}: request {i} exactly once");
        }
    }
}

/// An operator that cannot take a request now (RowanKV's b-log out of room)
/// answers `NotNow`: the request stays in the ring with nothing of it applied,
/// nothing after it on its connection runs first, `drain` and `release` say
/// they are not finished, recovery refuses to open rather than skip it — and
/// once the operator takes requests again each runs exactly once, in order.
#[test]
fn a_deferred_request_waits_in_the_ring_and_runs_later_exactly_once() {
    fn count(r: &Receiver<rowankv_fabric::LoopbackNic, Gated>, i: u64) -> u64 {
        let mut b = [0u8; 8];
        r.read_state(8 * i as usize, &mut b);
        u64::from_le_bytes(b)
    }
    use std::sync::atomic::Ordering::SeqCst;
    for variant in Variant::ALL {
        let v = variant.name();
        let pool = formatted_pool(PoolOptions::default());
        let flow = one_per_poll();
        let fabric = LoopbackFabric::new();
        let nic_r = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
        let nic_s = rowankv_fabric::Fabric::attach(&fabric, SENDER).unwrap();
        let (gated, closed) = Gated::new(true);
        let (mut r, _) = Receiver::open(pool.clone(), nic_r, flow, gated).unwrap();
        let mut s = Sender::new(&nic_s, variant, flow).unwrap();
        let offer = r.accept(ConnId(0), variant, s.qp_addr()).unwrap();
        s.connect(&offer).unwrap();
        for i in 1..=5u64 {
            s.call(OP_INCREMENT, &payload(i)).unwrap();
        }
        s.flush().unwrap();
        for _ in 0..100 {
            assert_eq!(r.poll().unwrap(), 0, "{v}: a deferred request runs");
        }
        assert!(r.stats().deferred >= 1, "{v}: {:?}", r.stats());
        assert_eq!(r.done_seq(ConnId(0)), 0, "{v}");
        match r.drain() {
            Err(DrpcError::NotNow { conn, seq, .. }) => assert_eq!((conn, seq), (ConnId(0), 1)),
            other => panic!("{v}: a drain past a deferred request: {other:?}"),
        }
        assert!(
            matches!(r.release(ConnId(0)), Err(DrpcError::NotNow { seq: 1, .. })),
            "{v}: a release past a deferred request"
        );
        assert!(
            r.accept(ConnId(0), variant, s.qp_addr()).is_err(),
            "{v}: accepted again before its release finished"
        );
        for i in 1..=5 {
            assert_eq!(
                count(&r, i),
                0,
                "{v}: request {i} took effect while deferred"
            );
        }
        // The gate opens: all five, in order, once.
        closed.store(false, SeqCst);
        let mut done = 0;
        for _ in 0..1000 {
            done += r.poll().unwrap();
            if done == 5 {
                break;
            }
        }
        assert_eq!(done, 5, "{v}");
        assert_eq!(r.done_seq(ConnId(0)), 5, "{v}");
        for i in 1..=5 {
            assert_eq!(count(&r, i), 1, "{v}: request {i} exactly once");
        }
        // Deferred again, then the receiver stops with 6..=8 in its ring:
        // recovery that cannot run them refuses to open, and runs them once
        // when it can.
        closed.store(true, SeqCst);
        let mut events = Vec::new();
        for i in 6..=8u64 {
            let mut called = false;
            for _ in 0..10_000 {
                match s.call(OP_INCREMENT, &payload(i)) {
                    Ok(_) => called = true,
                    Err(DrpcError::WouldBlock) => s.poll(&mut events).map(|_| ()).unwrap(),
                    Err(e) => panic!("{v}: {e}"),
                }
                if called {
                    break;
                }
            }
            assert!(called, "{v}: the window never opened");
        }
        s.flush().unwrap();
        for _ in 0..100 {
            r.poll().unwrap();
            events.clear();
            let _ = s.poll(&mut events);
        }
        drop(s);
        drop(r);
        let fabric = LoopbackFabric::new();
        let (still_closed, _) = Gated::new(true);
        let nic = rowankv_fabric::Fabric::attach(&fabric, RECEIVER).unwrap();
        match Receiver::open(pool.clone(), nic, flow, still_closed) {
            Err(DrpcError::NotNow { seq, .. }) => assert_eq!(seq, 6, "{v}"),
            Err(e) => panic!("{v}: {e}"),
            Ok(_) => panic!("{v}: opened with requests it could not run"),
        }
        let (open, _) = Gated::new(false);
        let nic = rowankv_fabric::Fabric::attach(&fabric, NodeId(8)).unwrap();
        let (r, report) = Receiver::open(pool, nic, flow, open).unwrap();
        assert_eq!(
            report.reexecuted,
            vec![(ConnId(0), 6), (ConnId(0), 7), (ConnId(0), 8)],
            "{v}"
        );
        for i in 1..=8 {
            assert_eq!(count(&r, i), 1, "{v}: request {i} exactly once");
        }
    }
}
