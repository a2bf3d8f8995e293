//! Run many seeds of the simulation: `cargo run --release -p rowankv-clover
//! --example sim_sweep -- FIRST COUNT OPS`.
fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: FIRST COUNT OPS"))
        .collect();
    let (first, count, ops) = match args[..] {
        [f, c, o] => (f, c, o as usize),
        _ => (0, 200, 400),
    };
    let r = rowankv_clover::sim::run_seeds(first, count, ops);
    println!(
        "{}",
        serde_json::to_string_pretty(&r).expect("serialisable")
    );
    if !r.violations.is_empty() {
        std::process::exit(1);
    }
}
