//! Replay one seed of the simulation, with the clients' steps traced:
//! `cargo run --release -p rowankv-clover --example sim_seed -- SEED OPS`.
fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: SEED OPS"))
        .collect();
    let (seed, ops) = match args[..] {
        [s, o] => (s, o as usize),
        _ => (0, 400),
    };
    rowankv_clover::TRACE.store(true, std::sync::atomic::Ordering::Relaxed);
    let r = rowankv_clover::sim::run_seed(seed, ops);
    println!(
        "{}",
        serde_json::to_string_pretty(&r).expect("serialisable")
    );
}
