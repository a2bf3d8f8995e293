//! `bench rpc --figures 12..19` end to end on tiny runs: the fields every point
//! must carry, the counts that need no timing model, and Figure 12's crash and
//! recovery bookkeeping (a real receiver crash in every run).

use rowankv_bench::rpc::RpcDesign;
use rowankv_bench::rpc_figs::{self, FigOptions, Sweeps};

fn tiny(designs: &[&str]) -> FigOptions {
    FigOptions {
        sweeps: Sweeps {
            fig12_requests: 300,
            fig12_write_pct: vec![50],
            fig12_availability: vec![1.0, 0.90],
            fig13_sizes: vec![64],
            fig15_processing_us: vec![10],
            fig17_senders: vec![3],
            fig18_write_pct: vec![50],
            fig19_batch: vec![1, 4],
        },
        warmup_ms: 5,
        measure_ms: 30,
        only: Some(
            designs
                .iter()
                .map(|n| RpcDesign::from_name(n).unwrap())
                .collect(),
        ),
        ..FigOptions::quick()
    }
}

#[test]
fn every_point_carries_the_fields_and_the_wire_models_label() {
    let opts = tiny(&["farm", "wflush", "s-rflush"]);
    let points = rpc_figs::run(&[13, 15, 17, 18, 19], &opts, |_| {}).expect("run");
    // 13, 15, 17, 18: 3 designs each; 19: farm at 1, the two durable at 1 and 4.
    assert_eq!(points.len(), 4 * 3 + 5);
    let label = rowankv_fabric::WireModel::CONNECTX5.label();
    let json = serde_json::to_value(&points).unwrap();
    for p in json.as_array().unwrap() {
        for field in [
            "figure",
            "design",
            "param",
            "param_value",
            "ops_per_sec",
            "mean_us",
            "p50_us",
            "p99_us",
            "round_trips_per_op",
            "verbs_per_op",
            "bytes_to_receiver_per_op",
            "bytes_to_sender_per_op",
            "receiver_persists_per_op",
            "wire_model",
        ] {
            assert!(!p[field].is_null(), "{field} missing in {p}");
        }
        assert_eq!(p["wire_model"], label.as_str());
        assert!(p["ops_per_sec"].as_f64().unwrap() > 0.0, "{p}");
    }
    let get = |fig: u32, d: &str, v: f64| {
        points
            .iter()
            .find(|p| p.figure == fig && p.design == d && p.param_value == v)
            .unwrap_or_else(|| panic!("figure {fig} {d} {v}"))
    };
    // The parameter each figure sweeps.
    assert_eq!(get(13, "farm", 64.0).size_bytes, 64);
    assert_eq!(get(15, "farm", 10.0).processing_ns, 10_000);
    assert_eq!(get(17, "wflush", 3.0).senders, 3);
    assert_eq!(get(18, "wflush", 50.0).write_pct, 50);
    // Counts that need no timing model. FaRM: one round trip, a 32 B header.
    let farm = get(13, "farm", 64.0);
    assert_eq!(farm.round_trips_per_op, Some(1.0));
    assert_eq!(farm.bytes_to_receiver_per_op, Some(96.0));
    // WFlush: WRITE + FLUSH + ATOMIC WRITE and a completion, per request.
    assert_eq!(get(17, "wflush", 3.0).verbs_per_op, Some(4.0));
    // Half reads: the 64 KiB object goes to the receiver for half the requests only.
    let farm_rw = get(18, "farm", 50.0).bytes_to_receiver_per_op.unwrap();
    assert!(
        farm_rw > 0.4 * 65_568.0 && farm_rw < 0.6 * 65_568.0,
        "{farm_rw}"
    );
    // Batching: four requests share an entry (a partial batch when the window or
    // the ring is full), one round trip; unbatched, one each.
    assert_eq!(get(19, "s-rflush", 1.0).round_trips_per_op, Some(1.0));
    for d in ["wflush", "s-rflush"] {
        let rt = get(19, d, 4.0).round_trips_per_op.unwrap();
        assert!(
            (0.25..=0.5).contains(&rt),
            "{d}: {rt} round trips per request"
        );
    }
}

#[test]
fn figure_12_crashes_the_receiver_and_accounts_for_recovery() {
    let opts = tiny(&["farm", "darpc", "wflush", "s-rflush"]);
    let points = rpc_figs::run(&[12], &opts, |_| {}).expect("run");
    assert_eq!(points.len(), 8);
    for p in &points {
        let r = p.recovery.as_ref().expect("recovery measure");
        assert_eq!(r.requests, 300);
        let durable = p.kind == "durable";
        if r.availability == 1.0 {
            assert_eq!(r.failures, 0, "{}", p.design);
            assert_eq!(r.total_secs, r.measured_secs);
            continue;
        }
        // K = 216: one crash, after the 216th request issued.
        assert_eq!(r.requests_between_failures, Some(216));
        assert_eq!(r.failures, 1, "{}", p.design);
        assert!((r.modelled_downtime_secs - 0.003).abs() < 1e-12);
        let expect = r.measured_secs + r.modelled_downtime_secs + r.modelled_retransfer_secs;
        assert!((r.total_secs - expect).abs() < 1e-12);
        if durable {
            // Told by the restarted receiver what took effect: no re-transfer wait.
            assert_eq!(r.retransfer_waits, 0);
            assert_eq!(r.modelled_retransfer_secs, 0.0);
        } else {
            // One call outstanding: at most one request resent, after the timer.
            assert_eq!(r.reexecuted, 0);
            assert!(r.resent <= 1);
            assert_eq!(r.retransfer_waits, r.resent);
        }
        let base = if p.family == "send" { "darpc" } else { "farm" };
        assert_eq!(r.baseline, base);
        assert!(r.normalized_total.is_some());
        // Downtime, re-transfer waits and the measured restart: no more, no less.
        let cost = r.modelled_downtime_secs + r.modelled_retransfer_secs + r.recovery_secs;
        assert!((r.failure_cost_secs - cost).abs() < 1e-9);
        assert!(r.failure_cost_vs_baseline.is_some());
        assert!(r.effective_availability < 1.0);
    }
}
