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
}
