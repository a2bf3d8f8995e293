//! The open-loop sweep through the library, on a tiny cluster: two strategies
//! at two fixed rates, each point reported with its figures, the summary
//! computed from them and the plot drawn. The scheduler and the summary are
//! tested on their own in `src/ycsb/sweep.rs`; this checks that a real sweep
//! holds its offered rates (an open loop does not run ahead of its schedule, as
//! a closed loop would) and measures what it says. Seconds, not minutes; no
//! assertion on how fast anything is.

use rowankv_bench::plot;
use rowankv_bench::ycsb::sweep::{self, Arrivals, Rates, SweepOptions};
use rowankv_bench::ycsb::YcsbOptions;
use rowankv_server::Strategy;

const RATES: [f64; 2] = [400.0, 1_200.0];

#[test]
fn a_tiny_sweep_holds_its_rates_and_reports_every_point() {
    let opts = SweepOptions {
        ycsb: YcsbOptions {
            records: 2_000,
            seconds: 0.5,
            workers: 2,
            shards_per_server: 4,
            clients: 4,
            pool_bytes: 256 << 20,
            strategies: vec![Strategy::Rowan, Strategy::Rpc],
            progress: false,
            ..YcsbOptions::default()
        },
        rates: Rates::Fixed(RATES.to_vec()),
        arrivals: Arrivals::Uniform,
        warmup_seconds: 0.25,
        ..SweepOptions::default()
    };
    let mut heard = 0;
    let points = sweep::run(&opts, &mut |e| {
        if let sweep::SweepEvent::Point(p) = e {
            heard += 1;
            assert!(sweep::point_line(p).contains("media timing on (4 MB/s per DIMM)"));
        }
    })
    .unwrap();
    assert_eq!(heard, 4, "every point reported as it was measured");
    let order: Vec<(&str, f64)> = points
        .iter()
        .map(|p| (p.strategy.as_str(), p.offered_ops_per_sec))
        .collect();
    assert_eq!(
        order,
        vec![
            ("rowan", RATES[0]),
            ("rowan", RATES[1]),
            ("rpc", RATES[0]),
            ("rpc", RATES[1])
        ]
    );
    for p in &points {
        assert_eq!(p.workload, "a");
        assert_eq!((p.offered_fraction, p.probe_ops_per_sec), (None, None));
        assert!(p.media_timing);
        assert_eq!(p.ops, p.puts + p.gets);
        assert!(p.puts > 0 && p.gets > 0, "{p:?}");
        // The open loop offers what it was asked to: it never runs ahead of
        // its schedule (a closed loop here would run at thousands of ops/s),
        // and at these light loads it is not far behind either.
        assert!(
            p.ops_per_sec <= 1.3 * p.offered_ops_per_sec,
            "{} at {}: achieved {}",
            p.strategy,
            p.offered_ops_per_sec,
            p.ops_per_sec
        );
        assert!(
            p.ops_per_sec >= 0.5 * p.offered_ops_per_sec,
            "{} at {}: achieved {}",
            p.strategy,
            p.offered_ops_per_sec,
            p.ops_per_sec
        );
        assert!(p.put_p50_us >= 1.0 && p.put_p99_us >= p.put_p50_us, "{p:?}");
        assert!(p.get_p50_us >= 1.0 && p.get_p99_us >= p.get_p50_us, "{p:?}");
        assert_eq!(p.errors + p.timeouts, 0, "{p:?}");
    }
    let summary = sweep::summarize(&points);
    assert_eq!(summary.peaks.len(), 2);
    let c = summary.rowan_vs_rpc.expect("rowan and rpc were swept");
    assert!(c.put_p50_ratio.is_some() && c.peak_ratio > 0.0);
    // Both ran the same rates: Rowan's point is at rpc's peak load exactly
    // when rpc kept up there, and never more than one rate away.
    assert!(RATES.contains(&c.rowan.offered_ops_per_sec));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sweep.png");
    plot::ycsb_sweep(&points, &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");

    // JSON carries the fields the figure is made from, and reads back.
    let json = serde_json::to_string(&points).unwrap();
    for field in [
        "strategy",
        "workload",
        "offered_ops_per_sec",
        "ops_per_sec",
        "put_p50_us",
        "put_p99_us",
        "get_p50_us",
        "get_p99_us",
        "media_timing",
    ] {
        assert!(json.contains(&format!("\"{field}\"")), "{field}");
    }
    let back: Vec<sweep::SweepPoint> = serde_json::from_str(&json).unwrap();
    assert_eq!(back.len(), points.len());
}
