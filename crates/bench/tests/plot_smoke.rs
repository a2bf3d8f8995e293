//! `--plot` end to end through the library: a real (tiny) DLWA sweep and a real
//! (short) YCSB run, each plotted from its own results. The plots' drawing is
//! tested in `src/plot.rs` on synthetic results; this checks that what the
//! experiments return is plottable. Seconds, not minutes.

use rowankv_bench::dlwa::{self, DlwaOptions, Mode};
use rowankv_bench::plot;
use rowankv_bench::ycsb::{self, YcsbOptions};
use rowankv_server::Strategy;

/// The file is a PNG of some substance (the drawing itself is checked by the
/// unit tests, which decode it).
fn assert_png(path: &std::path::Path) {
    let bytes = std::fs::read(path).expect("plot written");
    assert!(bytes.len() > 10_000, "{} bytes", bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
}

#[test]
fn a_dlwa_sweep_plots() {
    let opts = DlwaOptions {
        sender_counts: vec![1, 36],
        write_sizes_bytes: vec![64],
        modes: vec![Mode::Write, Mode::Rowan],
        local_writer_counts: vec![0],
        ops_per_point: 4_000,
        warmup_ops: 2_000,
        ..DlwaOptions::quick()
    };
    let points = dlwa::run(&opts, |_| {}).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlwa.png");
    plot::dlwa(&points, &path).unwrap();
    assert_png(&path);
}

#[test]
fn a_short_ycsb_comparison_plots() {
    let opts = YcsbOptions {
        records: 2_000,
        seconds: 0.5,
        workers: 2,
        shards_per_server: 4,
        clients: 2,
        pool_bytes: 256 << 20,
        strategies: vec![Strategy::Rowan, Strategy::Rpc],
        progress: false,
        ..YcsbOptions::default()
    };
    let results = ycsb::run(&opts).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ycsb.png");
    plot::ycsb_compare(&results, &path).unwrap();
    assert_png(&path);
    // The same results drawn as a timeline: a run without a kill has no marks.
    let timeline = dir.path().join("timeline.png");
    plot::failover(&results[..1], &timeline).unwrap();
    assert_png(&timeline);
    // Figure 11 from the same run: every strategy took replication ACKs, and
    // each CDF rises to 1 at its last bound.
    for r in &results {
        assert!(
            r.replication_acks > 0,
            "{}: no replication ACKs",
            r.strategy
        );
        let cdf = &r.replication_ack_cdf;
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(cdf.last().unwrap().1, 1.0, "{}: {cdf:?}", r.strategy);
        assert!(ycsb::runner::cdf_quantile_bound(cdf, 0.5) >= 1.0);
    }
    let cdf = dir.path().join("cdf.png");
    plot::replication_cdf(&results, &cdf).unwrap();
    assert_png(&cdf);
}

#[test]
fn a_short_sensitivity_run_plots_and_varies_only_its_parameter() {
    use rowankv_bench::ycsb::sens::{self, SensOptions, Vary};
    let base = YcsbOptions {
        records: 2_000,
        seconds: 0.4,
        workers: 2,
        shards_per_server: 4,
        clients: 2,
        pool_bytes: 256 << 20,
        strategies: vec![Strategy::Rowan, Strategy::Rpc],
        progress: false,
        ..YcsbOptions::default()
    };
    let opts = SensOptions {
        vary: Vary::EntrySize,
        values: vec!["128".into(), "512".into()],
        base,
    };
    let points = sens::run(&opts, |_| {}).unwrap();
    assert_eq!(points.len(), 4, "two values x two strategies");
    for p in &points {
        assert!(p.ops_per_sec > 0.0 && p.errors == 0, "{p:?}");
    }
    // A 512 B entry writes more bytes per operation than a 128 B one.
    let bytes = |v: &str| {
        points
            .iter()
            .find(|p| p.value == v && p.strategy == "rowan")
            .unwrap()
            .media_bytes_per_op
    };
    assert!(
        bytes("512") > 2.0 * bytes("128"),
        "{} vs {}",
        bytes("512"),
        bytes("128")
    );
    let table = sens::table(&points);
    assert!(table.contains("rowan/rpc"), "{table}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sens.png");
    plot::sensitivity(&points, &path).unwrap();
    assert_png(&path);
}

#[test]
fn a_short_clover_run_plots_its_four_panels() {
    let config = rowankv_clover::bench::BenchConfig {
        keys: 64,
        ops_per_point: 500,
        clients: vec![4, 8],
        cached_keys: vec![0, 8, 64],
        memory_keys: vec![100, 1_000],
        ..rowankv_clover::bench::BenchConfig::default()
    };
    let report = rowankv_clover::bench::run(&config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clover.png");
    plot::clover(&report, &path).unwrap();
    assert_png(&path);
    // A run with no points is refused, and leaves no file.
    let empty = rowankv_clover::bench::BenchReport {
        ycsb_a: Vec::new(),
        ..report
    };
    let none = dir.path().join("none.png");
    assert!(plot::clover(&empty, &none).is_err());
    assert!(!none.exists());
}

#[test]
fn a_quick_comparison_with_clover_plots_figure_16() {
    let opts = rowankv_bench::vs_clover::VsOptions {
        records: 500,
        clients: 4,
        seconds: 0.5,
        clover_ops: 2_000,
        workloads: vec![rowankv_bench::ycsb::workload::Workload::A],
        ..rowankv_bench::vs_clover::VsOptions::quick()
    };
    let points = rowankv_bench::vs_clover::run(&opts, |_| {}).unwrap();
    assert_eq!(points.len(), 4, "two systems, two object sizes");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fig16.png");
    plot::vs_clover(&points, &path).unwrap();
    assert_png(&path);
    let none = dir.path().join("none.png");
    assert!(plot::vs_clover(&[], &none).is_err());
    assert!(!none.exists());
}
