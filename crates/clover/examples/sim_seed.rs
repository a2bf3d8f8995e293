//! Replay one seed of the simulation, with the clients' steps traced on stderr
//! and, if it fails, its history on stdout:
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
    let (r, mut h) = rowankv_clover::sim::run_seed_with_history(seed, ops);
    println!(
        "{}",
        serde_json::to_string_pretty(&r).expect("serialisable")
    );
    if !r.violations.is_empty() {
        h.sort_by_key(|e| (e.key, e.invoke));
        for e in &h {
            println!("{e:?}");
        }
    }
}
