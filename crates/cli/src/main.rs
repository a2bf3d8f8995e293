//! `rowankv`: the one command line of RowanKV.
//!
//! Subcommands today: `bench dlwa` (seed 000 Figures 2 and 8) and `bench engine`
//! (one server's engine). The command line only
//! parses options, runs a library entry point and prints; all logic lives in the
//! crates below it.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rowankv_bench::dlwa::{self, DlwaOptions, Mode};

#[derive(Parser)]
#[command(
    name = "rowankv",
    version,
    about = "RowanKV: a replicated persistent-memory key-value store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an experiment of the papers' evaluations.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Device-level write amplification: per-sender WRITE logs vs Rowan (seed 000
    /// Figures 2 and 8).
    Dlwa(DlwaArgs),
    /// One server's engine: PUT/GET against an unpersisted DRAM map in the same run,
    /// DLWA of a PUT-only run, cold start.
    Engine(EngineArgs),
}

#[derive(Args)]
struct EngineArgs {
    /// A small version (100 K objects instead of 1 M).
    #[arg(long)]
    quick: bool,
    /// Print a JSON array, one object per measurement.
    #[arg(long)]
    json: bool,
    /// Objects loaded (and PUTs measured) per thread count.
    #[arg(long)]
    objects: Option<usize>,
    /// Worker thread counts, comma-separated.
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Objects for the cold-start measurement.
    #[arg(long)]
    cold_start_objects: Option<usize>,
    /// Directory for pool files (default /dev/shm: the emulated medium).
    #[arg(long)]
    pool_dir: Option<PathBuf>,
}

#[derive(Args)]
struct DlwaArgs {
    /// A small version: fewer operations per point, the same sender counts.
    #[arg(long)]
    quick: bool,
    /// Print a JSON array, one object per measured point, instead of the table.
    #[arg(long)]
    json: bool,
    /// Sender (remote write stream) counts, comma-separated.
    #[arg(long, value_delimiter = ',')]
    senders: Option<Vec<usize>>,
    /// Write sizes in bytes (multiples of 64), comma-separated.
    #[arg(long, value_delimiter = ',')]
    sizes: Option<Vec<usize>>,
    /// Modes to run: write, rowan.
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Local writer counts on the receiver, comma-separated (the paper: 0,18).
    #[arg(long, value_delimiter = ',')]
    local_writers: Option<Vec<usize>>,
    /// Remote writes per measured point.
    #[arg(long)]
    ops: Option<usize>,
    /// Charge media bytes against an emulated media write bandwidth (2 GB/s per
    /// DIMM), so that write amplification costs throughput; results are labelled.
    #[arg(long)]
    media_timing: bool,
    /// Driver threads issuing the writes.
    #[arg(long)]
    threads: Option<usize>,
    /// Directory for the receiver's pool file (default /dev/shm).
    #[arg(long)]
    pool_dir: Option<PathBuf>,
    /// Seed of the issue schedule.
    #[arg(long)]
    seed: Option<u64>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench {
            which: BenchCommand::Dlwa(args),
        } => bench_dlwa(args),
        Command::Bench {
            which: BenchCommand::Engine(args),
        } => bench_engine(args),
    }
}

fn bench_dlwa(args: DlwaArgs) -> Result<()> {
    let mut opts = if args.quick {
        DlwaOptions::quick()
    } else {
        DlwaOptions::full()
    };
    if let Some(v) = args.senders {
        opts.sender_counts = v;
    }
    if let Some(v) = args.sizes {
        opts.write_sizes_bytes = v;
    }
    if let Some(v) = args.modes {
        opts.modes = v
            .iter()
            .map(|m| match m.as_str() {
                "write" => Ok(Mode::Write),
                "rowan" => Ok(Mode::Rowan),
                other => bail!("unknown mode {other:?} (expected write or rowan)"),
            })
            .collect::<Result<_>>()?;
    }
    if let Some(v) = args.local_writers {
        opts.local_writer_counts = v;
    }
    if let Some(v) = args.ops {
        opts.ops_per_point = v;
    }
    if let Some(v) = args.threads {
        opts.driver_threads = v;
    }
    if let Some(v) = args.pool_dir {
        opts.pool_dir = v;
    }
    if let Some(v) = args.seed {
        opts.seed = v;
    }
    if args.media_timing {
        opts.media.timing = Some(dlwa::default_timing());
    }
    let total = opts.sender_counts.len()
        * opts.write_sizes_bytes.len()
        * opts.modes.len()
        * opts.local_writer_counts.len();
    let mut done = 0;
    let points = dlwa::run(&opts, |p| {
        done += 1;
        eprintln!(
            "[{done}/{total}] {} {} B, {} senders, {} local writers: DLWA {:.3}",
            p.mode, p.write_size_bytes, p.senders, p.local_writer_count, p.dlwa
        );
    })
    .context("DLWA experiment")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&points)?);
    } else {
        if args.media_timing {
            println!("(media timing on: throughput is limited by emulated media bandwidth)");
        }
        print!("{}", dlwa::table(&points));
    }
    Ok(())
}

fn bench_engine(args: EngineArgs) -> Result<()> {
    use rowankv_bench::engine_bench::{self, EngineBenchOptions};
    let mut opts = if args.quick {
        EngineBenchOptions::quick()
    } else {
        EngineBenchOptions::full()
    };
    if let Some(v) = args.objects {
        opts.objects = v;
    }
    if let Some(v) = args.threads {
        opts.thread_counts = v;
    }
    if let Some(v) = args.cold_start_objects {
        opts.cold_start_objects = v;
    }
    if let Some(v) = args.pool_dir {
        opts.pool_dir = v;
    }
    let ms = engine_bench::run(&opts)
        .map_err(anyhow::Error::msg)
        .context("engine benchmark")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ms)?);
    } else {
        print!("{}", engine_bench::table(&ms));
    }
    Ok(())
}
