//! `rowankv bench rpc`: seed 002's evaluation of the durable RPCs against the
//! classic RDMA RPC designs, wire model on — Figures 8 and 9 (`rowankv_bench::rpc`)
//! and Figures 12, 13, 15, 17, 18, 19 (`rowankv_bench::rpc_figs`), chosen with
//! `--figures`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rowankv_bench::rpc::{self, Load, RpcDesign, RpcOptions};
use rowankv_bench::rpc_figs::{self, FigOptions, FIGURES};

#[derive(Args)]
pub(crate) struct RpcArgs {
    /// A smoke run of every figure (unless --figures says which): Figure 8's
    /// points at 60 ms each; the other figures at one or two values of their
    /// sweep, 40 ms per point, Figure 12 a 400-request workload with one crash
    /// (about 10 s in all on 2 cores).
    #[arg(long)]
    quick: bool,
    /// Print a JSON object {points, goals} instead of the tables: one object per
    /// measured point, each with `figure`, `design`, `param`, `param_value`,
    /// `ops_per_sec`, `p50_us`, `p99_us`, `round_trips_per_op` (and `recovery` for
    /// Figure 12).
    #[arg(long)]
    json: bool,
    /// Figures to run, comma-separated, or `all` (default 8; with --quick, all).
    /// 8 (and 9, the same
    /// points' latencies): eleven designs × 32 B/1 KiB/64 KiB × heavy/light load.
    /// 12: total time of a 1 KiB workload (100 µs processing) under real receiver
    /// crashes at availability 100/99/95/90 % and 5/50/95 % writes, durable
    /// (recovery re-executes the redo ring) vs resending classic (darpc, farm);
    /// downtime 3 ms per failure and a 1 ms re-transfer interval modelled (the
    /// paper's 300 ms and 100 ms ÷ 100). 13: object size 64 B..64 KiB. 15:
    /// receiver processing 0..200 µs per request. 17: 1..8 concurrent senders. 18:
    /// 5/50/95 % writes. 19: durable batch size (FlowConfig::batch_max) 1..16.
    /// 15, 17 and 18 at the paper's default 64 KiB object (FaSST left out, as in
    /// the paper), 19 at 1 KiB.
    #[arg(long, alias = "figure", value_delimiter = ',', value_name = "N|all")]
    figures: Option<Vec<String>>,
    /// Designs, comma-separated (default: each figure's own list; Figure 8 all
    /// eleven: darpc, farm, fasst, l5, rfp, octopus, scalerpc, sflush, wflush,
    /// s-rflush, w-rflush).
    #[arg(long, value_delimiter = ',')]
    designs: Option<Vec<String>>,
    /// Figure 8 only: request sizes in bytes, comma-separated (default 32,1024,65536).
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Figure 8 only: loads, heavy (100 µs receiver processing per request), light.
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<String>>,
    /// Measured milliseconds per point (after the warm-up; not Figure 12, which
    /// runs its workload whole).
    #[arg(long)]
    measure_ms: Option<u64>,
    /// Draw the plots: Figure 8 into this PNG, every other figure N into the same
    /// name with `-figN` before the extension (e.g. rpc.png → rpc-fig13.png).
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

/// The figures asked for, in the order of [`FIGURES`] (9 is 8).
fn parse_figures(v: Option<&[String]>, quick: bool) -> Result<Vec<u32>> {
    let Some(v) = v else {
        // A full run keeps the command's first behaviour (Figures 8 and 9); the
        // smoke run (CI) covers every figure.
        return Ok(if quick { FIGURES.to_vec() } else { vec![8] });
    };
    let mut out = Vec::new();
    for f in v {
        let f = f.trim();
        if f.eq_ignore_ascii_case("all") {
            return Ok(FIGURES.to_vec());
        }
        let n: u32 = f
            .parse()
            .ok()
            .map(|n| if n == 9 { 8 } else { n })
            .filter(|n| FIGURES.contains(n))
            .with_context(|| {
                format!("unknown figure {f:?} (expected one of {FIGURES:?}, 9 or all)")
            })?;
        out.push(n);
    }
    Ok(FIGURES
        .iter()
        .copied()
        .filter(|f| out.contains(f))
        .collect())
}

pub(crate) fn run(args: RpcArgs) -> Result<()> {
    let figures = parse_figures(args.figures.as_deref(), args.quick)?;
    let mut opts = if args.quick {
        RpcOptions::quick()
    } else {
        RpcOptions::full()
    };
    let mut fig_opts = if args.quick {
        FigOptions::quick()
    } else {
        FigOptions::full()
    };
    if let Some(v) = args.designs {
        let designs: Vec<RpcDesign> = v
            .iter()
            .map(|n| match RpcDesign::from_name(n) {
                Some(d) => Ok(d),
                None => bail!("unknown design {n:?} (expected one of {:?})", rpc::DESIGNS),
            })
            .collect::<Result<_>>()?;
        fig_opts.only = Some(designs.clone());
        opts.designs = designs;
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
        fig_opts.measure_ms = v.max(1);
    }
    crate::check_plot_target(args.plot.as_deref());
    eprintln!("{}", opts.model.label());
    let run_fig8 = figures.contains(&8);
    let others: Vec<u32> = figures.iter().copied().filter(|f| *f != 8).collect();
    let total = if run_fig8 {
        opts.designs.len() * opts.sizes_bytes.len() * opts.loads.len()
    } else {
        0
    } + rpc_figs::point_count(&others, &fig_opts);
    let mut done = 0;
    let points = if run_fig8 {
        rpc::run(&opts, |p| {
            done += 1;
            match p.ops_per_sec {
                Some(ops) => eprintln!(
                    "[{done}/{total}] fig 8 {} {} B {}: {:.0} op/s, p99 {:.1} µs (wire model on)",
                    p.design,
                    p.size_bytes,
                    p.load.name(),
                    ops,
                    p.p99_us.unwrap_or(0.0)
                ),
                None => eprintln!(
                    "[{done}/{total}] fig 8 {} {} B {}: not applicable",
                    p.design,
                    p.size_bytes,
                    p.load.name()
                ),
            }
        })
        .context("RPC benchmark, Figure 8")?
    } else {
        Vec::new()
    };
    let fig_points = rpc_figs::run(&others, &fig_opts, |p| {
        done += 1;
        match (p.ops_per_sec, &p.recovery) {
            (Some(ops), Some(r)) => eprintln!(
                "[{done}/{total}] fig 12 {} {} % writes, availability {:.1} %: {} failures, total {:.3} s ({:.0} op/s; wire model on)",
                p.design,
                r.write_pct,
                100.0 * r.availability,
                r.failures,
                r.total_secs,
                ops
            ),
            (Some(ops), None) => eprintln!(
                "[{done}/{total}] fig {} {} {}={}: {:.0} op/s, mean {:.1} µs, p99 {:.1} µs (wire model on)",
                p.figure,
                p.design,
                p.param,
                p.param_value,
                ops,
                p.mean_us.unwrap_or(0.0),
                p.p99_us.unwrap_or(0.0)
            ),
            (None, _) => eprintln!(
                "[{done}/{total}] fig {} {} {}={}: not applicable",
                p.figure, p.design, p.param, p.param_value
            ),
        }
    })
    .context("RPC benchmark, Figures 12-19")?;
    let goals = rpc::goals(&points);
    if args.json {
        let mut all: Vec<serde_json::Value> = points
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        for p in &fig_points {
            all.push(serde_json::to_value(p)?);
        }
        let out = serde_json::json!({ "points": all, "goals": goals });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if run_fig8 {
            println!("Figures 8 and 9");
            print!("{}", rpc::table(&points));
            println!();
            print!("{}", rpc::goals_report(&goals));
        }
        for &f in &others {
            println!();
            print!("{}", rpc_figs::table(&fig_points, f));
        }
    }
    if let Some(base) = args.plot.as_deref() {
        if run_fig8 {
            crate::write_plot(Some(base), |p| rpc::plot(&points, p))?;
        }
        for &f in &others {
            let path = rpc_figs::plot_path(base, f);
            crate::write_plot(Some(&path), |p| rpc_figs::plot(&fig_points, f, p))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_parse_in_the_papers_order() {
        assert_eq!(parse_figures(None, false).unwrap(), vec![8]);
        assert_eq!(parse_figures(None, true).unwrap(), FIGURES.to_vec());
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_figures(Some(&v(&["all"])), false).unwrap(),
            FIGURES.to_vec()
        );
        assert_eq!(
            parse_figures(Some(&v(&["19", "9", "12"])), false).unwrap(),
            vec![8, 12, 19]
        );
        assert_eq!(parse_figures(Some(&v(&["8"])), true).unwrap(), vec![8]);
        assert!(parse_figures(Some(&v(&["14"])), false).is_err());
        assert!(parse_figures(Some(&v(&["x"])), false).is_err());
    }
}
