//! `rowankv`: the one command line of RowanKV.
//!
//! Subcommands today: `demo` (the main job: a 3-server cluster, YCSB-A with Rowan and
//! a comparison of the replication strategies), `sim` (the deterministic
//! simulation with faults), `bench dlwa` (seed 000 Figures 2 and
//! 8), `bench engine` (one server's engine), `bench ycsb` (seed 000 §6.3) and
//! `bench resp` (the RESP load generator of the comparison with Redis) and `bench rpc`
//! (seed 002's durable RPCs against the classic RDMA RPC designs). The command line only
//! parses options, runs a library entry point and prints; all logic lives in the
//! crates below it.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rowankv_bench::dlwa::{self, DlwaOptions, Mode};
use rowankv_bench::plot::{self, PlotError};

mod bench_more;
mod bench_rpc;
mod chaos_cmd;
mod demo;
mod deploy_cmd;
mod recovery_cmd;
mod sim_cmd;
mod sweep_cmd;

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
    /// The main job: a 3-server cluster on emulated PM, a load, YCSB-A with Rowan,
    /// then a short comparison with the other replication strategies.
    Demo(demo::DemoArgs),
    /// Deterministic simulation of a whole cluster with faults, every history
    /// checked (no lost acknowledged write, per-key linearizability, no answer
    /// from a stale configuration).
    Sim(sim_cmd::SimArgs),
    /// Run a server process of a deployed cluster (`docs/deployment.md`).
    Server(deploy_cmd::ProcessArgs),
    /// Run a configuration manager process of a deployed cluster.
    Cm(deploy_cmd::ProcessArgs),
    /// Store VALUE under KEY in a deployed cluster (reached through --cm or $ROWANKV_CM).
    Put(deploy_cmd::PutArgs),
    /// Print KEY's value (exit status 1 if it has none).
    Get(deploy_cmd::KeyArgs),
    /// Delete KEY.
    Del(deploy_cmd::KeyArgs),
    /// The cluster's configuration as its CM serves it: term, members and their
    /// addresses, shards per server.
    Status(deploy_cmd::StatusArgs),
    /// Remove server NODE from a deployed cluster on purpose: its shards move to
    /// their backups, then it stops (its pool may not serve this cluster again).
    Leave(deploy_cmd::LeaveArgs),
    /// Move a shard's primary to another server (dynamic resharding): the
    /// source hands it over and copies it while clients go on.
    Reshard(deploy_cmd::ReshardArgs),
    /// Step server NODE's calendar clock by --ms (what expiry times are
    /// measured against; never its lease clock), as `date -s` on its host would.
    ClockStep(deploy_cmd::ClockStepArgs),
    /// A mixed load on a deployed cluster from this process, every write
    /// recorded and every read checked against it.
    Workload(deploy_cmd::WorkloadArgs),
    /// Chaos run against real processes: etcd, two CMs and the servers (RF 3),
    /// faults from a seed (kill -9, SIGSTOP past the lease, power cut), every
    /// operation recorded and the history checked (`docs/chaos.md`).
    Chaos(chaos_cmd::ChaosArgs),
    /// One client process of a chaos run (started by `rowankv chaos`):
    /// operations until its standard input closes, each in its journal.
    #[command(hide = true)]
    ChaosClient(chaos_cmd::ChaosClientArgs),
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
    /// YCSB on an in-process cluster, replication strategies side by side (seed 000
    /// §6.3). With no options: the paper's setting scaled to this machine. With
    /// --sweep: median latency against throughput under an open-loop load (Figure 9).
    Ycsb(Box<YcsbArgs>),
    /// Failover timeline: YCSB-A on 3 servers, the last one killed mid-run;
    /// time to commit the new configuration and to serve every shard again
    /// (seed 000 §6.5, Figure 14).
    Failover(recovery_cmd::FailoverArgs),
    /// Cold start: load, power failure of every server, recovery from what was
    /// persisted, every acknowledged write checked (seed 000 §4.7, §6.5).
    Coldstart(recovery_cmd::ColdStartArgs),
    /// RESP load generator: N connections x pipeline depth of SET (or SET/GET)
    /// against one RESP address (a RowanKV server's Redis port or a redis-server);
    /// the driver of scripts/redis-compare. With --from: report saved records.
    Resp(Box<RespArgs>),
    /// Durable RPCs (SFlush, WFlush, S-RFlush, W-RFlush) against seven classic RDMA
    /// RPC designs at 32 B, 1 KiB, 64 KiB, light and heavy load, wire model on
    /// (seed 002 Figures 8 and 9); the goals, met or missed. --figures
    /// adds Figures 12, 13, 15, 17, 18 and 19 (failures, object size, receiver
    /// CPU load, senders, read/write ratio, batch size).
    Rpc(bench_rpc::RpcArgs),
    /// Dynamic resharding under a hotspot: uniform YCSB-B, then 80 % of one
    /// server's requests shifted to one shard of another; the CM's detection,
    /// the migration, objects moved, throughput before, during and after
    /// (seed 000 §6.6, Figure 15).
    Reshard(bench_more::ReshardArgs),
    /// Clover on passive PM, natively and through the in-network interposer:
    /// YCSB-A Zipfian throughput and round trips, cached keys, switch memory,
    /// wire model on (seed 004).
    Clover(bench_more::CloverArgs),
    /// Rowan-KV against Clover on the same fabric, media and timing models:
    /// ZippyDB and 4 KiB objects, YCSB-A and B, throughput and DLWA (seed 000
    /// Figure 16).
    VsClover(bench_more::VsCloverArgs),
    /// The strategies side by side while one parameter varies: log entry
    /// size, replication factor, workers, DIMMs (seed 000 Figure 13), object
    /// sizes (Table 2), uniform against Zipfian keys (§6.3).
    Sens(bench_more::SensArgs),
}

#[derive(Args)]
struct RespArgs {
    /// host:port of the RESP server to load.
    #[arg(long, required_unless_present = "from")]
    addr: Option<String>,
    /// Connections, one thread each.
    #[arg(long, default_value_t = 50)]
    connections: usize,
    /// Requests sent per batch (one batch in flight per connection).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Size of the key space (keys key:%012u).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Key distribution: uniform, zipf (0.99) or zipf:THETA.
    #[arg(long, default_value = "uniform")]
    dist: String,
    /// set (SET only) or setget (SET and GET, half each).
    #[arg(long, default_value = "set")]
    mix: String,
    /// Send WAIT NUMREPLICAS TIMEOUT_MS (e.g. "2 0") after SETs.
    #[arg(long, value_name = "\"NUMREPLICAS TIMEOUT_MS\"")]
    wait: Option<String>,
    /// request: a WAIT after every SET; batch: one after each batch holding a SET.
    #[arg(long, default_value = "request")]
    wait_per: String,
    /// Measured seconds (default 10 unless --requests).
    #[arg(long, conflicts_with = "requests")]
    duration: Option<f64>,
    /// Measured requests in all, instead of --duration.
    #[arg(long)]
    requests: Option<u64>,
    /// Seconds of load before the measured phase.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Server processes whose CPU time is charged per operation, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pids: Vec<u32>,
    /// Name of the run in the table and the JSON.
    #[arg(long, default_value = "run")]
    label: String,
    /// What an acknowledged SET means in this configuration (for the table).
    #[arg(long, default_value = "")]
    durability: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the record as JSON (with --from: the ratios too).
    #[arg(long)]
    json: bool,
    /// Instead of running: read records (a JSON array, or one object) from this
    /// file and print their table, Markdown table (--markdown) and ratios.
    #[arg(long, value_name = "FILE.json")]
    from: Option<PathBuf>,
    /// With --from: Markdown tables.
    #[arg(long, requires = "from")]
    markdown: bool,
    /// Draw throughput and latency per record into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct YcsbArgs {
    /// Workload: load, a, b, c, d, f.
    #[arg(long, default_value = "a")]
    workload: String,
    /// Key distribution: zipfian (0.99), zipfian:THETA, uniform, latest.
    #[arg(long)]
    keys: Option<String>,
    /// Object sizes: zippydb, up2x, udb, etc, sys, fixed:K:V.
    #[arg(long, default_value = "zippydb")]
    sizes: String,
    /// Strategies to run side by side, comma-separated (rowan, rpc, rwrite, batch, share, drpc).
    #[arg(long, value_delimiter = ',', default_value = "rowan")]
    compare: Vec<String>,
    /// Objects loaded before the measured phase.
    #[arg(long)]
    records: Option<u64>,
    /// Length of the measured phase, seconds (with --sweep: of each point's
    /// window; default 5).
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long)]
    servers: Option<usize>,
    /// Replication factor.
    #[arg(long)]
    rf: Option<u8>,
    /// Worker roles per server.
    #[arg(long)]
    workers: Option<usize>,
    #[arg(long)]
    shards_per_server: Option<u16>,
    /// Client load generators.
    #[arg(long)]
    clients: Option<usize>,
    /// Operations in flight per client (with --sweep: of the closed-loop probe).
    #[arg(long)]
    depth: Option<usize>,
    /// OS threads that run the cluster's roles.
    #[arg(long)]
    threads: Option<usize>,
    /// Media write bandwidth per DIMM, bytes/s (timing mode).
    #[arg(long)]
    media_bandwidth: Option<u64>,
    /// Turn the media model's timing off (DLWA is still counted).
    #[arg(long)]
    no_media_timing: bool,
    /// Log segment size per server, KiB (default 1024).
    #[arg(long, value_name = "KIB")]
    segment_kib: Option<usize>,
    /// How often each server's clean roles look for segments below 75 % live,
    /// ms (default 20).
    #[arg(long, value_name = "MS")]
    clean_interval_ms: Option<u64>,
    /// Each server's pool, MiB (default 2048; 512 with --quick).
    #[arg(long, value_name = "MIB")]
    pool_mib: Option<usize>,
    /// Put the loopback fabric's wire and NIC timing model on (ConnectX-5
    /// figures, docs/wire-model.md): every request lands and completes at the
    /// times it gives.
    #[arg(long)]
    wire_model: bool,
    /// Run the cluster on modelled time with the CPU model (docs/cpu-model.md):
    /// one thread steps every role in order of modelled time, each role on a
    /// modelled core of its own charged its measured step time minus the
    /// emulated NIC's work; the wire model is on. Loopback only; with --sweep.
    #[arg(long, requires = "sweep")]
    cpu_model: bool,
    /// With --sweep: run nothing; read the points of an earlier sweep's
    /// --json output and print its table and summary (and --plot) again.
    #[arg(long, value_name = "FILE.json", requires = "sweep")]
    from: Option<PathBuf>,
    /// Also draw the latency CDF of remote persistence (one replication write
    /// to one backup until its durable ACK) per strategy (seed 000 Figure 11).
    #[arg(long, value_name = "FILE.png", conflicts_with = "sweep")]
    plot_cdf: Option<PathBuf>,
    /// Modelled DIMMs per server (default 3); each writes at --media-bandwidth.
    #[arg(long)]
    dimms: Option<usize>,
    /// Closed loop: every client draws its own workload stream, as YCSB's
    /// threads do (default: all replay one stream; the sweep always gives
    /// each client its own unless --shared-stream).
    #[arg(long, conflicts_with = "sweep")]
    stream_per_client: bool,
    #[arg(long)]
    seed: Option<u64>,
    /// A small, fast run (smoke test).
    #[arg(long)]
    quick: bool,
    /// Print one JSON object per strategy (an array); with --sweep, one per
    /// point (the summary goes to stderr).
    #[arg(long)]
    json: bool,
    /// Also draw throughput and PUT/GET latency per strategy into this PNG file
    /// (with --sweep: median latency against throughput).
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// `loopback`: the cluster in this process; `tcp`: a CM and the servers as
    /// processes on this host over the tcp fabric, the load from this one (no
    /// media model there: no DLWA; CPU per operation counts every process).
    #[arg(long, default_value = "loopback")]
    fabric: String,
    /// Open loop: sweep offered rates, measuring latency from each operation's
    /// scheduled start; report median PUT/GET latency against throughput per
    /// strategy and the paper's comparison at rpc's peak (seed 000 Figure 9).
    #[arg(long)]
    sweep: bool,
    /// Offered rates, total ops/s over all clients, the same for every
    /// strategy (default: --rate-steps fractions of each strategy's peak).
    #[arg(
        long,
        value_delimiter = ',',
        requires = "sweep",
        conflicts_with = "rate_steps"
    )]
    rates: Option<Vec<f64>>,
    /// Rates as N even steps up to 120 % of each strategy's peak, found by a
    /// closed-loop probe on its cluster (default 12: 10 %, 20 %, … 120 %).
    #[arg(long, value_name = "N", requires = "sweep")]
    rate_steps: Option<usize>,
    /// How each client spaces its operations: poisson (exponential gaps) or
    /// uniform (fixed gaps).
    #[arg(long, default_value = "poisson", requires = "sweep")]
    arrivals: String,
    /// Operations in flight per client of the open loop (default 16); an
    /// operation due while its client is at the bound waits, and the wait counts.
    #[arg(long, value_name = "N", requires = "sweep")]
    inflight: Option<usize>,
    /// Every open-loop client replays one workload stream, as the closed-loop
    /// generators do (default: a stream per client, as YCSB's threads).
    #[arg(long, requires = "sweep")]
    shared_stream: bool,
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
    /// Also draw DLWA and the remote write rate per configuration into this PNG
    /// file (Figures 2 and 8 style).
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

fn main() {
    // Errors are printed with their causes, without a backtrace (whatever
    // RUST_BACKTRACE says): they are the user's to read.
    if let Err(e) = run() {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    // Warnings and errors of the store's roles go to stderr; `RUST_LOG` (for
    // example `RUST_LOG=rowankv_server=info`) shows more. The simulator fails
    // servers on purpose, thousands of times, and the demo narrates its own
    // failover: they log errors only.
    let default = match cli.command {
        Command::Sim(_) | Command::Demo(_) | Command::Chaos(_) | Command::ChaosClient(_) => "error",
        // A process's log tells what it did: joins, configurations, failovers.
        Command::Server(_) | Command::Cm(_) => "info,rowankv_fabric=warn,rowankv_rpc=warn",
        // A client command's output is its answer; what it retried is not news.
        Command::Put(_)
        | Command::Get(_)
        | Command::Del(_)
        | Command::Status(_)
        | Command::Leave(_)
        | Command::Reshard(_)
        | Command::ClockStep(_) => "error",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .init();
    match cli.command {
        Command::Bench {
            which: BenchCommand::Dlwa(args),
        } => bench_dlwa(args),
        Command::Bench {
            which: BenchCommand::Engine(args),
        } => bench_engine(args),
        Command::Bench {
            which: BenchCommand::Ycsb(args),
        } => bench_ycsb(*args),
        Command::Bench {
            which: BenchCommand::Failover(args),
        } => recovery_cmd::failover(args),
        Command::Bench {
            which: BenchCommand::Coldstart(args),
        } => recovery_cmd::cold_start(args),
        Command::Bench {
            which: BenchCommand::Resp(args),
        } => bench_resp(*args),
        Command::Bench {
            which: BenchCommand::Rpc(args),
        } => bench_rpc::run(args),
        Command::Bench {
            which: BenchCommand::Reshard(args),
        } => bench_more::reshard(args),
        Command::Bench {
            which: BenchCommand::Clover(args),
        } => bench_more::clover(args),
        Command::Bench {
            which: BenchCommand::VsClover(args),
        } => bench_more::vs_clover(args),
        Command::Bench {
            which: BenchCommand::Sens(args),
        } => bench_more::sens(args),
        Command::Demo(args) => demo::run(args),
        Command::Server(args) => deploy_cmd::server(args),
        Command::Cm(args) => deploy_cmd::cm(args),
        Command::Put(args) => deploy_cmd::put(args),
        Command::Get(args) => deploy_cmd::get(args),
        Command::Del(args) => deploy_cmd::del(args),
        Command::Status(args) => deploy_cmd::status(args),
        Command::Leave(args) => deploy_cmd::leave(args),
        Command::Reshard(args) => deploy_cmd::reshard(args),
        Command::ClockStep(args) => deploy_cmd::clock_step(args),
        Command::Workload(args) => deploy_cmd::workload(args),
        Command::Sim(args) => sim_cmd::run_cmd(args),
        Command::Chaos(args) => chaos_cmd::run(args),
        Command::ChaosClient(args) => chaos_cmd::client(args),
    }
}

fn bench_ycsb(args: YcsbArgs) -> Result<()> {
    use rowankv_bench::ycsb;
    let opts = ycsb_options(&args)?;
    if args.sweep {
        return sweep_cmd::run(&args, opts);
    }
    check_plot_target(args.plot.as_deref());
    check_plot_target(args.plot_cdf.as_deref());
    let results = ycsb::run(&opts)
        .map_err(anyhow::Error::msg)
        .context("YCSB")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!("{}", ycsb_setting(&opts, &args.fabric));
        print!("{}", ycsb::table(&results));
        print!("{}", ycsb::runner::ack_report(&results));
    }
    write_plot(args.plot.as_deref(), |p| plot::ycsb_compare(&results, p))?;
    write_plot(args.plot_cdf.as_deref(), |p| {
        plot::replication_cdf(&results, p)
    })
}

/// The setting of a `bench ycsb` run, as its first line says it.
fn ycsb_setting(opts: &rowankv_bench::ycsb::YcsbOptions, fabric: &str) -> String {
    use rowankv_bench::ycsb;
    format!(
        "YCSB-{} {} keys, {:?} sizes, {} servers, RF {}, {} workers/server, {} clients x {} deep ({}), {} s, {} fabric, {} DIMMs/server; media timing {}",
        opts.workload,
        opts.keys.name(),
        opts.sizes,
        opts.servers,
        opts.replication_factor,
        opts.workers,
        opts.clients,
        opts.depth,
        if opts.stream_per_client { "a stream each" } else { "one shared stream" },
        opts.seconds,
        fabric,
        opts.dimms,
        if opts.fabric == ycsb::FabricKind::Tcp {
            "n/a (servers in other processes)".to_string()
        } else {
            opts.media_bandwidth.map_or("off".to_string(), |b| format!("{} MB/s per DIMM", b / 1_000_000))
        },
    ) + &opts
        .wire_model
        .map_or(String::new(), |m| format!("; {}", m.label()))
}

/// The options of `bench ycsb` from its arguments (closed loop and sweep alike).
fn ycsb_options(args: &YcsbArgs) -> Result<rowankv_bench::ycsb::YcsbOptions> {
    use rowankv_bench::ycsb::{sweep, YcsbOptions};
    let mut opts = YcsbOptions::default();
    if args.sweep {
        opts.seconds = sweep::SWEEP_POINT_SECONDS;
    }
    if args.quick {
        opts.quick_cluster();
        opts.seconds = 2.0;
        if args.sweep {
            opts.seconds = sweep_cmd::QUICK_POINT_SECONDS;
        }
    }
    opts.workload = args.workload.parse().map_err(anyhow::Error::msg)?;
    opts.keys = match &args.keys {
        Some(k) => k.parse().map_err(anyhow::Error::msg)?,
        None => opts.workload.default_key_dist(),
    };
    opts.sizes = args.sizes.parse().map_err(anyhow::Error::msg)?;
    opts.strategies = args
        .compare
        .iter()
        .map(|s| s.parse().map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    if let Some(v) = args.records {
        opts.records = v;
    }
    if let Some(v) = args.seconds {
        opts.seconds = v;
    }
    if let Some(v) = args.servers {
        opts.servers = v;
    }
    if let Some(v) = args.rf {
        opts.replication_factor = v;
    }
    if let Some(v) = args.workers {
        opts.workers = v;
    }
    if let Some(v) = args.shards_per_server {
        opts.shards_per_server = v;
    }
    if let Some(v) = args.clients {
        opts.clients = v;
    }
    if let Some(v) = args.depth {
        opts.depth = v;
    }
    if let Some(v) = args.threads {
        opts.threads = v;
    }
    if let Some(v) = args.media_bandwidth {
        opts.media_bandwidth = Some(v);
    }
    if args.no_media_timing {
        opts.media_bandwidth = None;
    }
    if let Some(v) = args.segment_kib {
        opts.segment_bytes = v << 10;
    }
    if let Some(v) = args.clean_interval_ms {
        opts.clean_interval_ns = Some(v * 1_000_000);
    }
    if let Some(v) = args.pool_mib {
        opts.pool_bytes = v << 20;
    }
    if let Some(v) = args.dimms {
        opts.dimms = v;
    }
    opts.stream_per_client = args.stream_per_client;
    if let Some(v) = args.seed {
        opts.seed = v;
    }
    opts.fabric = args.fabric.parse().map_err(anyhow::Error::msg)?;
    if args.wire_model {
        anyhow::ensure!(
            opts.fabric == rowankv_bench::ycsb::FabricKind::Loopback,
            "--wire-model is the loopback fabric's timing model (tcp has real wires)"
        );
        opts.wire_model = Some(rowankv_fabric::WireModel::CONNECTX5);
    }
    if args.cpu_model {
        anyhow::ensure!(
            opts.fabric == rowankv_bench::ycsb::FabricKind::Loopback,
            "--cpu-model runs the cluster in this process on modelled time: it needs the loopback fabric"
        );
        anyhow::ensure!(
            args.media_bandwidth.is_none(),
            "--cpu-model runs with media timing off (docs/cpu-model.md): drop --media-bandwidth"
        );
        opts.media_bandwidth = None;
        opts.cpu_model = Some(rowankv_server::CpuModel::default());
        opts.wire_model = Some(
            opts.wire_model
                .unwrap_or(rowankv_fabric::WireModel::CONNECTX5),
        );
    }
    opts.progress = !args.json;
    Ok(opts)
}

fn bench_resp(args: RespArgs) -> Result<()> {
    use rowankv_bench::resp_load::{self, RespLoadOptions, RespLoadResult, Stop, Wait};
    check_plot_target(args.plot.as_deref());
    if let Some(file) = &args.from {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("--from {}", file.display()))?;
        let results: Vec<RespLoadResult> = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(_) => vec![serde_json::from_str(&text)
                .with_context(|| format!("--from {}: not RESP load records", file.display()))?],
        };
        let ratios = resp_load::ratios(&results);
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "results": results,
                    "ratios": ratios,
                }))?
            );
        } else if args.markdown {
            print!("{}", resp_load::markdown(&results));
            if !ratios.is_empty() {
                println!();
                print!("{}", resp_load::ratios_markdown(&ratios));
            }
        } else {
            print!("{}", resp_load::table(&results));
            if !ratios.is_empty() {
                println!();
                print!("{}", resp_load::ratios_markdown(&ratios));
            }
        }
        return write_plot(args.plot.as_deref(), |p| resp_load::plot(&results, p));
    }
    let addr = args.addr.context("--addr is required")?;
    let opts = RespLoadOptions {
        connections: args.connections,
        pipeline: args.pipeline,
        value_bytes: args.value_bytes,
        keys: args.keys,
        dist: resp_load::parse_dist(&args.dist)?,
        mix: args.mix.parse()?,
        wait: args
            .wait
            .as_deref()
            .map(|w| Wait::parse(w, args.wait_per.parse()?))
            .transpose()?,
        stop: match (args.duration, args.requests) {
            (_, Some(n)) => Stop::Requests(n),
            (d, None) => Stop::Seconds(d.unwrap_or(10.0)),
        },
        warmup_s: args.warmup,
        pids: args.pids,
        label: args.label,
        durability: args.durability,
        seed: args.seed,
        ..RespLoadOptions::new(addr)
    };
    if args.wait.is_none() && args.wait_per != "request" {
        bail!("--wait-per needs --wait");
    }
    let result = resp_load::run(&opts).context("RESP load")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", resp_load::table(std::slice::from_ref(&result)));
    }
    write_plot(args.plot.as_deref(), |p| {
        resp_load::plot(std::slice::from_ref(&result), p)
    })?;
    if result.errors > 0 {
        bail!(
            "{}: {} replies were errors or not the expected answer (e.g. {:?})",
            result.label,
            result.errors,
            result.error_samples
        );
    }
    Ok(())
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
    check_plot_target(args.plot.as_deref());
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
    write_plot(args.plot.as_deref(), |p| plot::dlwa(&points, p))
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

/// Before a run: warn at once if `--plot` names a file that cannot be written, so
/// that a long benchmark is not run for a plot that will fail (it still runs and
/// prints its results).
pub(crate) fn check_plot_target(path: Option<&Path>) {
    if let Some(Err(e)) = path.map(plot::check_target) {
        eprintln!(
            "warning: {e}; the benchmark runs and prints its results, but the plot will fail"
        );
    }
}

/// After a run whose results are printed: draw the plot if `--plot` was given.
pub(crate) fn write_plot(
    path: Option<&Path>,
    draw: impl FnOnce(&Path) -> Result<(), PlotError>,
) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    draw(path).context("--plot")?;
    eprintln!("plot written to {}", path.display());
    Ok(())
}
