//! `rowankv demo`: the main job on the embedded default.

use anyhow::{Context, Result};
use clap::Args;
use rowankv_bench::ycsb::{self, YcsbOptions};
use rowankv_server::Strategy;

#[derive(Args)]
pub struct DemoArgs {
    /// Seconds of YCSB-A with Rowan.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds per strategy in the comparison.
    #[arg(long, default_value_t = 2.0)]
    compare_seconds: f64,
    /// Objects loaded.
    #[arg(long, default_value_t = 50_000)]
    records: u64,
    /// Seconds of the failover phase (a server is killed halfway).
    #[arg(long, default_value_t = 3.0)]
    failover_seconds: f64,
    /// Server lease in ms for the failover phase.
    #[arg(long, default_value_t = 50)]
    lease_ms: u64,
}

pub fn run(args: DemoArgs) -> Result<()> {
    println!("RowanKV demo: 3 servers, replication factor 3, emulated persistent memory,");
    println!("all on the in-process loopback fabric.\n");
    let base = YcsbOptions {
        records: args.records,
        pool_bytes: 1 << 30,
        ..YcsbOptions::default()
    };
    println!(
        "1. Load {} objects (ZippyDB sizes), then YCSB-A (50% PUT, Zipfian 0.99) for {} s, replicating with Rowan:",
        args.records, args.seconds
    );
    let rowan = ycsb::run(&YcsbOptions {
        seconds: args.seconds,
        strategies: vec![Strategy::Rowan],
        ..base.clone()
    })
    .map_err(anyhow::Error::msg)
    .context("YCSB-A with Rowan")?;
    print!("{}", ycsb::table(&rowan));
    println!(
        "\n2. The same workload, {} s each, with the other replication strategies:",
        args.compare_seconds
    );
    let others = ycsb::run(&YcsbOptions {
        seconds: args.compare_seconds,
        strategies: vec![
            Strategy::Rpc,
            Strategy::Rwrite,
            Strategy::Batch,
            Strategy::Share,
            Strategy::Drpc,
        ],
        ..base.clone()
    })
    .map_err(anyhow::Error::msg)
    .context("comparison")?;
    let mut all = rowan.clone();
    all.extend(others);
    print!("{}", ycsb::table(&all));
    println!(
        "\n3. Failover: YCSB-A with Rowan for {} s; server s2 is killed at {:.1} s (lease {} ms).\n   \
         Throughput per 100 ms, with the failure, the configuration commit and the promotions marked:",
        args.failover_seconds,
        args.failover_seconds / 2.0,
        args.lease_ms
    );
    let failover = ycsb::run(&YcsbOptions {
        seconds: args.failover_seconds,
        strategies: vec![Strategy::Rowan],
        kill_at: Some(args.failover_seconds / 2.0),
        lease_ns: Some(args.lease_ms * 1_000_000),
        verify: true,
        ..base
    })
    .map_err(anyhow::Error::msg)
    .context("failover")?;
    let f = &failover[0];
    print!("{}", ycsb::timeline_report(f));
    println!(
        "   Every acknowledged write read back afterwards: {} keys, {} missing or older.",
        f.verified_keys, f.lost_writes
    );
    let r = &all[0];
    println!("\nSummary");
    println!(
        "  Rowan: {:.0} ops/s, PUT median {:.0} µs (p99 {:.0} µs), highest per-server DLWA {:.3}.",
        r.ops_per_sec, r.put_p50_us, r.put_p99_us, r.dlwa_max
    );
    for o in &all[1..] {
        println!(
            "  {:>6}: throughput {:.2}x Rowan's, PUT median {:.2}x, DLWA {:.3}.",
            o.strategy,
            o.ops_per_sec / r.ops_per_sec.max(1.0),
            o.put_p50_us / r.put_p50_us.max(1.0),
            o.dlwa_max
        );
    }
    let errors: u64 = all.iter().map(|r| r.errors + r.timeouts).sum();
    println!("  Errors and timeouts over the comparison runs: {errors}.");
    if let Some(t) = &f.failover {
        let ms = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.0} ms"));
        println!(
            "  Failover: new configuration committed {} after the kill, all {} shards of s{} served again after {}; \
             {} operations of unknown outcome or refused while it ran; {} acknowledged writes lost.",
            ms(t.committed_ms),
            t.shards_promoted,
            t.killed,
            ms(t.all_served_ms),
            f.errors + f.timeouts,
            f.lost_writes
        );
        if !t.others_failed.is_empty() {
            println!(
                "  Live servers evicted because their lease renewals were late: {:?}.",
                t.others_failed
            );
        }
    }
    if f.lost_writes > 0 {
        anyhow::bail!(
            "{} acknowledged writes were lost in the failover",
            f.lost_writes
        );
    }
    Ok(())
}
