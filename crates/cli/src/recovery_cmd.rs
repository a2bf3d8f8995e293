//! `rowankv bench failover` and `rowankv bench coldstart` (seed 000 §6.5).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rowankv_bench::coldstart::{self, ColdStartOptions};
use rowankv_bench::plot;
use rowankv_bench::ycsb::{self, YcsbOptions};
use rowankv_server::Strategy;

#[derive(Args)]
pub struct FailoverArgs {
    /// Objects loaded before the measured phase.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Length of the measured phase (YCSB-A).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// When the last server is killed, seconds into the phase.
    #[arg(long, default_value_t = 2.0)]
    kill_at: f64,
    /// Server lease in ms (the paper: 10 ms on RDMA).
    #[arg(long, default_value_t = 50)]
    lease_ms: u64,
    /// Runs (the summary gives medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
    /// Also draw each run's throughput timeline, with the kill, the commit of the
    /// new configuration and the shards served again marked, into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// `loopback` (one process) or `tcp` (the CM and servers as processes; the
    /// commit and the shards served again are then seen from a client).
    #[arg(long, default_value = "loopback")]
    fabric: String,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

pub fn failover(args: FailoverArgs) -> Result<()> {
    let opts = YcsbOptions {
        records: args.records,
        seconds: args.seconds,
        kill_at: Some(args.kill_at),
        lease_ns: Some(args.lease_ms * 1_000_000),
        verify: true,
        pool_bytes: 1 << 30,
        strategies: vec![Strategy::Rowan],
        progress: !args.json,
        fabric: args.fabric.parse().map_err(anyhow::Error::msg)?,
        ..YcsbOptions::default()
    };
    crate::check_plot_target(args.plot.as_deref());
    let mut results = Vec::new();
    for run in 0..args.runs {
        let r = ycsb::run(&opts)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("failover run {run}"))?;
        let r = r.into_iter().next().context("one result")?;
        if !args.json {
            println!(
                "run {}: {} objects, 3 servers, RF 3, lease {} ms, {} fabric, media timing off, {:.0} ops/s over the phase",
                run + 1,
                args.records,
                args.lease_ms,
                args.fabric,
                r.ops_per_sec
            );
            print!("{}", ycsb::timeline_report(&r));
            println!(
                "  acknowledged writes read back: {} keys, {} missing or older",
                r.verified_keys, r.lost_writes
            );
        }
        results.push(r);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return crate::write_plot(args.plot.as_deref(), |p| plot::failover(&results, p));
    }
    let f: Vec<_> = results.iter().filter_map(|r| r.failover.clone()).collect();
    let m = |get: fn(&ycsb::FailoverTimes) -> Option<f64>| {
        median(f.iter().filter_map(get).collect()).map_or("—".into(), |v| format!("{v:.1} ms"))
    };
    println!(
        "median of {} runs after the kill: detected {}, stored {}, committed {}, all shards served {}",
        f.len(),
        m(|f| f.detected_ms),
        m(|f| f.stored_ms),
        m(|f| f.committed_ms),
        m(|f| f.all_served_ms)
    );
    let evicted: usize = f.iter().map(|f| f.others_failed.len()).sum();
    println!("live servers evicted (leases renewed late) over all runs: {evicted}");
    let lost: u64 = results.iter().map(|r| r.lost_writes).sum();
    println!("acknowledged writes lost over all runs: {lost}");
    let plotted = crate::write_plot(args.plot.as_deref(), |p| plot::failover(&results, p));
    if lost > 0 {
        if let Err(e) = plotted {
            eprintln!("error: {e:#}");
        }
        anyhow::bail!("{lost} acknowledged writes were not readable after failover");
    }
    plotted
}

#[derive(Args)]
pub struct ColdStartArgs {
    /// Objects loaded before the power failure.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Print results as JSON.
    #[arg(long)]
    json: bool,
}

pub fn cold_start(args: ColdStartArgs) -> Result<()> {
    let r = coldstart::run(&ColdStartOptions {
        records: args.records,
        progress: !args.json,
        ..ColdStartOptions::default()
    })
    .map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", coldstart::report(&r));
    }
    if r.lost_writes > 0 {
        anyhow::bail!(
            "{} acknowledged writes were not back after the cold start",
            r.lost_writes
        );
    }
    Ok(())
}
