//! `rowankv bench rpc`: seed 002 Figures 8 and 9 — the durable RPCs against the
//! classic RDMA RPC designs, wire model on (`rowankv_bench::rpc`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rowankv_bench::rpc::{self, Load, RpcDesign, RpcOptions};

#[derive(Args)]
pub(crate) struct RpcArgs {
    /// A smoke run: the same points, 60 ms measured each (a few seconds in all).
    #[arg(long)]
    quick: bool,
    /// Print a JSON object {points, goals} instead of the table.
    #[arg(long)]
    json: bool,
    /// Designs, comma-separated (default all eleven: darpc, farm, fasst, l5, rfp,
    /// octopus, scalerpc, sflush, wflush, s-rflush, w-rflush).
    #[arg(long, value_delimiter = ',')]
    designs: Option<Vec<String>>,
    /// Request sizes in bytes, comma-separated (default 32,1024,65536).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Loads: heavy (100 µs receiver processing per request), light.
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<String>>,
    /// Measured milliseconds per point (after the warm-up).
    #[arg(long)]
    measure_ms: Option<u64>,
    /// Also draw Figure 8 (throughput per design, size and load) into this PNG.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

pub(crate) fn run(args: RpcArgs) -> Result<()> {
    let mut opts = if args.quick {
        RpcOptions::quick()
    } else {
        RpcOptions::full()
    };
    if let Some(v) = args.designs {
        opts.designs = v
            .iter()
            .map(|n| match RpcDesign::from_name(n) {
                Some(d) => Ok(d),
                None => bail!("unknown design {n:?} (expected one of {:?})", rpc::DESIGNS),
            })
            .collect::<Result<_>>()?;
    }
    if let Some(v) = args.sizes {
        if v.contains(&0) {
            bail!("request sizes must be at least 1 byte");
        }
        opts.sizes_bytes = v;
    }
    if let Some(v) = args.loads {
        opts.loads = v
            .iter()
            .map(|l| match Load::from_name(l) {
                Some(l) => Ok(l),
                None => bail!("unknown load {l:?} (expected heavy or light)"),
            })
            .collect::<Result<_>>()?;
    }
    if let Some(v) = args.measure_ms {
        opts.measure_ms = v.max(1);
    }
    crate::check_plot_target(args.plot.as_deref());
    let total = opts.designs.len() * opts.sizes_bytes.len() * opts.loads.len();
    eprintln!("{}", opts.model.label());
    let mut done = 0;
    let points = rpc::run(&opts, |p| {
        done += 1;
        match p.ops_per_sec {
            Some(ops) => eprintln!(
                "[{done}/{total}] {} {} B {}: {:.0} op/s, p99 {:.1} µs",
                p.design,
                p.size_bytes,
                p.load.name(),
                ops,
                p.p99_us.unwrap_or(0.0)
            ),
            None => eprintln!(
                "[{done}/{total}] {} {} B {}: not applicable",
                p.design,
                p.size_bytes,
                p.load.name()
            ),
        }
    })
    .context("RPC benchmark")?;
    let goals = rpc::goals(&points);
    if args.json {
        let out = serde_json::json!({ "points": points, "goals": goals });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", rpc::table(&points));
        println!();
        print!("{}", rpc::goals_report(&goals));
    }
    crate::write_plot(args.plot.as_deref(), |p| rpc::plot(&points, p))
}
