//! `rowankv bench reshard` (seed 000 §6.6, Figure 15), `rowankv bench sens`
//! (Figure 13, Table 2, uniform keys) and `rowankv bench clover` (seed 004:
//! Clover natively and through the in-network interposer).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use rowankv_bench::plot;
use rowankv_bench::ycsb::reshard::{self, ReshardOptions};

#[derive(Args)]
pub struct ReshardArgs {
    /// A small run (20,000 objects, 8 s): CI's smoke run and a first look.
    #[arg(long)]
    quick: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Also draw the timeline (throughput with the hotspot, the detection and
    /// the migration marked; each server's requests) into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// Objects loaded (default: 200,000; --quick: 20,000).
    #[arg(long)]
    records: Option<u64>,
    /// Length of the measured phase in seconds (default 12; --quick: 8).
    #[arg(long)]
    seconds: Option<f64>,
}

pub fn reshard(args: ReshardArgs) -> Result<()> {
    let mut opts = if args.quick {
        ReshardOptions::quick()
    } else {
        ReshardOptions::full()
    };
    if let Some(r) = args.records {
        opts.records = r;
    }
    if let Some(s) = args.seconds {
        opts.seconds = s;
    }
    opts.progress = !args.json;
    crate::check_plot_target(args.plot.as_deref());
    let r = reshard::run(&opts).map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", reshard::report(&r));
    }
    let plotted = crate::write_plot(args.plot.as_deref(), |p| plot::reshard(&r, p));
    if r.lost_writes > 0 {
        if let Err(e) = plotted {
            eprintln!("error: {e:#}");
        }
        anyhow::bail!(
            "{} acknowledged writes were not readable after the migration",
            r.lost_writes
        );
    }
    plotted
}

#[derive(Args)]
pub struct SensArgs {
    /// The parameter: entry-size (Figure 13(a)), rf (13(b)), workers (13(c)),
    /// dimms (13(d)), sizes (Table 2), keys (uniform against Zipfian).
    #[arg(long)]
    vary: String,
    /// Its values, comma-separated (default: the figure's).
    #[arg(long, value_delimiter = ',')]
    values: Option<Vec<String>>,
    /// Strategies side by side, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rowan,rpc,rwrite,batch,share"
    )]
    compare: Vec<String>,
    /// A small, fast run (the quick setting of `bench ycsb`, two values).
    #[arg(long)]
    quick: bool,
    /// Print a JSON array, one object per strategy and value.
    #[arg(long)]
    json: bool,
    /// Also draw throughput, median PUT latency and DLWA against the values.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// Measured seconds per strategy and value (default 4; --quick: 1).
    #[arg(long)]
    seconds: Option<f64>,
    /// Objects loaded (default 200,000; --quick: 20,000).
    #[arg(long)]
    records: Option<u64>,
    /// A workload stream per client (see `bench ycsb --stream-per-client`).
    #[arg(long)]
    stream_per_client: bool,
    /// Turn the media model's timing off.
    #[arg(long)]
    no_media_timing: bool,
}

pub fn sens(args: SensArgs) -> Result<()> {
    use rowankv_bench::ycsb::sens::{self, SensOptions, Vary};
    use rowankv_bench::ycsb::YcsbOptions;
    let vary: Vary = args.vary.parse().map_err(anyhow::Error::msg)?;
    let mut base = YcsbOptions {
        seconds: 4.0,
        ..YcsbOptions::default()
    };
    if args.quick {
        base.quick_cluster();
        base.seconds = 1.0;
    }
    base.strategies = args
        .compare
        .iter()
        .map(|s| s.parse().map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    if let Some(s) = args.seconds {
        base.seconds = s;
    }
    if let Some(r) = args.records {
        base.records = r;
    }
    base.stream_per_client = args.stream_per_client;
    if args.no_media_timing {
        base.media_bandwidth = None;
    }
    base.progress = false;
    let opts = SensOptions {
        vary,
        values: args
            .values
            .clone()
            .unwrap_or_else(|| vary.default_values(args.quick)),
        base,
    };
    crate::check_plot_target(args.plot.as_deref());
    let points =
        sens::run(&opts, |p| eprintln!("{}", sens::line(p))).map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&points)?);
        eprint!("{}", sens::table(&points));
    } else {
        print!("{}", sens::table(&points));
    }
    crate::write_plot(args.plot.as_deref(), |p| plot::sensitivity(&points, p))
}

#[derive(Args)]
pub struct CloverArgs {
    /// Fewer operations per point and fewer points.
    #[arg(long)]
    quick: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Write the plot (Figures 2, 3 and 4) to this PNG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
    /// Operations per point (default 1,000,000, --quick 5,000).
    #[arg(long, value_name = "N")]
    ops: Option<u64>,
    /// Measure the driver thread's wall time instead of the wire model's
    /// time (modelled by default: a manual clock, no CPU time in it).
    #[arg(long)]
    wall_clock: bool,
}

pub fn clover(args: CloverArgs) -> Result<()> {
    crate::check_plot_target(args.plot.as_deref());
    let mut config = if args.quick {
        rowankv_clover::bench::BenchConfig {
            ops_per_point: 5_000,
            clients: vec![8, 32],
            cached_keys: vec![0, 16, 1024],
            memory_keys: vec![1_000, 10_000],
            ..rowankv_clover::bench::BenchConfig::default()
        }
    } else {
        rowankv_clover::bench::BenchConfig {
            ops_per_point: 1_000_000,
            ..rowankv_clover::bench::BenchConfig::default()
        }
    };
    if let Some(ops) = args.ops {
        anyhow::ensure!(
            (1..=rowankv_clover::bench::OPS_PER_POINT_MAX).contains(&ops),
            "--ops {ops}: between 1 and {}",
            rowankv_clover::bench::OPS_PER_POINT_MAX
        );
        config.ops_per_point = ops;
    }
    if args.wall_clock {
        config.timing = rowankv_clover::bench::Timing::Wall;
    }
    let report = rowankv_clover::bench::run(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return crate::write_plot(args.plot.as_deref(), |p| plot::clover(&report, p));
    }
    for line in rowankv_clover::bench::render(&report) {
        println!("{line}");
    }
    // Side by side in this run: the interposer's throughput over native's at
    // each client count.
    for n in report.ycsb_a.iter().filter(|p| p.mode == "native") {
        if let Some(i) = report
            .ycsb_a
            .iter()
            .find(|p| p.mode == "interposer" && p.clients == n.clients)
        {
            println!(
                "clover interposer / native | clients {:3} | {:.2}x ops/s | {}",
                n.clients,
                i.ops_per_sec / n.ops_per_sec.max(1e-9),
                n.model
            );
        }
    }
    crate::write_plot(args.plot.as_deref(), |p| plot::clover(&report, p))
}

#[derive(Args)]
pub struct VsCloverArgs {
    /// Fewer records, clients and operations (a run of seconds).
    #[arg(long)]
    quick: bool,
    /// Print the points as JSON.
    #[arg(long)]
    json: bool,
    /// Blocking clients of each system (default 32, --quick 8).
    #[arg(long)]
    clients: Option<usize>,
    /// Write the plot (Figure 16: throughput bars with DLWA) to this PNG file.
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

pub fn vs_clover(args: VsCloverArgs) -> Result<()> {
    use rowankv_bench::vs_clover::{self, VsOptions};
    let mut opts = if args.quick {
        VsOptions::quick()
    } else {
        VsOptions::default()
    };
    if let Some(c) = args.clients {
        anyhow::ensure!((1..=1024).contains(&c), "--clients {c}: between 1 and 1024");
        opts.clients = c;
    }
    crate::check_plot_target(args.plot.as_deref());
    let points = vs_clover::run(&opts, |p| eprintln!("{}", vs_clover::line(p)))
        .map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&points)?);
        eprint!("{}", vs_clover::table(&points));
    } else {
        print!("{}", vs_clover::table(&points));
    }
    crate::write_plot(args.plot.as_deref(), |p| plot::vs_clover(&points, p))
}
