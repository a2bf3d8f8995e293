//! `cargo run --release -p rowankv-clover --example bench [-- OPS_PER_POINT]`:
//! YCSB-A native versus interposer on the wire model; prints labelled lines and
//! the JSON report.
fn main() {
    let mut config = rowankv_clover::bench::BenchConfig::default();
    if let Some(ops) = std::env::args().nth(1) {
        config.ops_per_point = ops.parse().expect("OPS_PER_POINT is a number");
    }
    let report = rowankv_clover::bench::run(&config).expect("benchmark");
    for line in rowankv_clover::bench::render(&report) {
        println!("{line}");
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("serialisable")
    );
}
