//! `rowankv bench ycsb --sweep --quick` end to end through the command line: two
//! strategies, two rates derived from each strategy's closed-loop probe, the
//! JSON points on stdout, the progress and the summary on stderr (each line
//! naming the media timing model), and the plot. Seconds, not minutes; nothing
//! here is timed.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rowankv");

#[test]
fn a_quick_sweep_prints_every_point_the_summary_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("sweep.png");
    let out = Command::new(BIN)
        .args([
            "bench",
            "ycsb",
            "--sweep",
            "--quick",
            "--compare",
            "rowan,rpc",
            "--rate-steps",
            "2",
            "--records",
            "2000",
            "--seconds",
            "0.5",
            "--json",
            "--plot",
        ])
        .arg(&plot)
        .output()
        .expect("rowankv runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let points: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let f = |p: &serde_json::Value, k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k}: {p}"));
    let strategies: Vec<&str> = points
        .iter()
        .map(|p| p["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(strategies, ["rowan", "rowan", "rpc", "rpc"]);
    for pair in points.chunks(2) {
        // 2 steps: 60 % and 120 % of the strategy's own probe peak.
        let probe = f(&pair[0], "probe_ops_per_sec");
        assert!(probe > 0.0);
        for (p, fraction) in pair.iter().zip([0.6, 1.2]) {
            assert_eq!(f(p, "probe_ops_per_sec"), probe, "one probe per strategy");
            assert!((f(p, "offered_fraction") - fraction).abs() < 1e-9);
            assert_eq!(f(p, "offered_ops_per_sec"), (fraction * probe).round());
            assert!(f(p, "ops_per_sec") > 0.0, "{p}");
            assert!(
                f(p, "ops_per_sec") <= 1.3 * f(p, "offered_ops_per_sec"),
                "an open loop does not run ahead of its schedule: {p}"
            );
            for k in ["put_p50_us", "get_p50_us"] {
                assert!(f(p, k) >= 1.0, "{k}: {p}");
            }
            assert!(f(p, "put_p99_us") >= f(p, "put_p50_us"));
            assert!(f(p, "get_p99_us") >= f(p, "get_p50_us"));
            assert_eq!(p["workload"], "a");
            assert_eq!(p["media_timing"], true);
        }
    }
    // Progress and summary: every line after the setting names the timing
    // model, bar the summary table's header and rule.
    let timing = "media timing on (4 MB/s per DIMM)";
    assert!(stderr.contains(&format!("Summary [{timing}]")), "{stderr}");
    assert!(stderr.contains("closed-loop probe"), "{stderr}");
    assert!(stderr.contains("median PUT: rpc"), "{stderr}");
    assert!(stderr.contains("Peak throughput: rowan / rpc"), "{stderr}");
    for line in stderr.lines().filter(|l| {
        l.contains("YCSB-A offered")
            || l.contains("probe")
            || l.contains("median")
            || l.contains("Peak")
    }) {
        assert!(line.contains(timing), "{line}");
    }
    let png = std::fs::read(&plot).expect("the plot is written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}
