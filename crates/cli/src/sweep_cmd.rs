//! `rowankv bench ycsb --sweep`: the open-loop latency-versus-throughput sweep
//! of seed 000 Figure 9 — its options from the arguments, the library's sweep
//! (`rowankv_bench::ycsb::sweep`), then its table, summary, JSON and plot.
//! Progress (the load bars, each probe and each point as it is measured) goes
//! to stderr; the results to stdout.

use anyhow::{Context, Result};
use rowankv_bench::plot;
use rowankv_bench::ycsb::sweep::{self, Rates, SweepEvent, SweepOptions};
use rowankv_bench::ycsb::{FabricKind, YcsbOptions};

use crate::{check_plot_target, write_plot, YcsbArgs};

/// `--quick`: each point's window, its warm-up, the probe and the rate steps
/// (30 %, 60 %, 90 %, 120 % of the peak).
pub(crate) const QUICK_POINT_SECONDS: f64 = 1.0;
const QUICK_WARMUP_SECONDS: f64 = 0.25;
const QUICK_PROBE_SECONDS: f64 = 1.0;
const QUICK_RATE_STEPS: usize = 4;

pub(crate) fn run(args: &YcsbArgs, ycsb: YcsbOptions) -> Result<()> {
    let mut opts = SweepOptions {
        ycsb,
        ..SweepOptions::default()
    };
    if args.quick {
        opts.warmup_seconds = QUICK_WARMUP_SECONDS;
        opts.probe_seconds = QUICK_PROBE_SECONDS;
        opts.rates = Rates::steps(QUICK_RATE_STEPS);
    }
    if let Some(n) = args.rate_steps {
        opts.rates = Rates::steps(n);
    }
    if let Some(r) = &args.rates {
        opts.rates = Rates::Fixed(r.clone());
    }
    opts.arrivals = args.arrivals.parse()?;
    if let Some(n) = args.inflight {
        opts.inflight_per_client_max = n;
    }
    opts.shared_stream = args.shared_stream;
    check_plot_target(args.plot.as_deref());

    let y = &opts.ycsb;
    let media = sweep::media_timing_label(
        y.fabric,
        y.media_bandwidth.is_some() && y.fabric == FabricKind::Loopback,
        y.media_bandwidth,
    );
    let timing = match sweep::models_label(y) {
        Some(m) => format!("{media}; {m}"),
        None => media,
    };
    let setting = format!(
        "YCSB-{} sweep, open loop: {} keys, {} sizes, {} servers, RF {}, {} workers/server, \
         {} clients ({}, at most {} in flight each), {} arrivals, {}, {} s per point after {} s of warm-up, \
         {} fabric; {timing}",
        y.workload.to_string().to_uppercase(),
        y.keys,
        y.sizes,
        y.servers,
        y.replication_factor,
        y.workers,
        y.clients,
        if opts.shared_stream {
            "all replaying one workload stream"
        } else {
            "a workload stream each"
        },
        opts.inflight_per_client_max,
        opts.arrivals,
        match &opts.rates {
            Rates::Fixed(r) => format!("rates {r:?} ops/s"),
            Rates::OfProbePeak(f) => format!(
                "rates {} to {} % of each strategy's peak ({} steps; peak from a {} s closed-loop probe, {} deep)",
                (f[0] * 100.0).round(),
                (f[f.len() - 1] * 100.0).round(),
                f.len(),
                opts.probe_seconds,
                y.depth
            ),
        },
        y.seconds,
        opts.warmup_seconds,
        args.fabric,
    );
    let setting = match &args.from {
        Some(file) => format!(
            "replotted from {} (its points carry their own setting)",
            file.display()
        ),
        None => setting,
    };
    eprintln!("{setting}");
    let mut on_event = |e: SweepEvent<'_>| {
        match e {
        SweepEvent::Probed {
            strategy,
            ops_per_sec,
            rates,
        } => eprintln!(
            "  {strategy:<6} closed-loop probe: {ops_per_sec:.0} ops/s; offered rates {:?} [{timing}]",
            rates
        ),
        SweepEvent::Point(p) => eprintln!("{}", sweep::point_line(p)),
    }
    };
    let points = match &args.from {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("--from {}", file.display()))?;
            let points: Vec<sweep::SweepPoint> = serde_json::from_str(&text)
                .with_context(|| format!("--from {}: not a sweep's points", file.display()))?;
            anyhow::ensure!(!points.is_empty(), "--from {}: no points", file.display());
            points
        }
        None => sweep::run(&opts, &mut on_event).context("YCSB sweep")?,
    };
    // The timing models of the points themselves (a replot's, not this
    // invocation's options).
    let timing = points[0].media_timing_label();
    let summary = sweep::summarize(&points);
    let report = sweep::summary_report(&summary, &timing);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&points)?);
        eprintln!("Summary [{timing}]");
        eprint!("{report}");
    } else {
        println!("{setting}");
        print!("{}", sweep::table(&points));
        println!("Summary [{timing}]");
        print!("{report}");
    }
    write_plot(args.plot.as_deref(), |p| plot::ycsb_sweep(&points, p))
}
