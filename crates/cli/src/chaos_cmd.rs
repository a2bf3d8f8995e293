//! `rowankv chaos`: a chaos run against real processes of this binary
//! (`rowankv_chaos`, `docs/chaos.md`). Parses the options, runs, prints the
//! figures; exits non-zero on any violation, printing the command that replays
//! the schedule.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rowankv_chaos::ChaosOptions;

#[derive(Args)]
pub struct ChaosArgs {
    /// Seconds of load (the run goes on until every scheduled fault was
    /// injected and healed, then heals, reads back and checks).
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Seed of the fault schedule and of the clients' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The run's directory (absent or empty): history.jsonl, faults.log,
    /// summary.json, logs/, and the cluster's files.
    #[arg(long, value_name = "D")]
    dir: PathBuf,
    /// Servers (replication factor 3).
    #[arg(long, default_value_t = 5)]
    servers: usize,
    /// Client processes, each with its own RowanKV client (one-key readers,
    /// one per server, come on top).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Keys, chosen Zipfian.
    #[arg(long, default_value_t = 200)]
    keys: usize,
    /// Zipf exponent of the key choice.
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// The servers' lease (pauses outlast it; a CM that becomes active counts
    /// no lease for ten of them).
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    /// How long the cluster may take to return to full replication after a
    /// fault is healed.
    #[arg(long, default_value_t = 60.0)]
    recover_timeout_s: f64,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// Search steps per key of the linearizability check.
    #[arg(long, default_value_t = 20_000_000)]
    check_budget: u64,
    /// The rowankv binary the processes run (default: this one).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// `netns`: every CM and server in a network namespace of its own on a
    /// bridge, with partitions and slow links among the faults (root,
    /// iproute2 and nftables); `loopback`: all on 127.0.0.1, no network faults.
    #[arg(long, default_value = "netns", value_parser = ["netns", "loopback"])]
    net: String,
    /// A planted bug, to prove the checks catch one: `serve-without-lease`
    /// (every server answers without a valid lease). The run must fail.
    #[arg(long, value_parser = ["serve-without-lease"])]
    planted: Option<String>,
}

pub fn run(a: ChaosArgs) -> Result<()> {
    let bin = match a.bin {
        Some(b) => b,
        None => std::env::current_exe().context("finding the rowankv binary")?,
    };
    let opts = ChaosOptions {
        servers: a.servers,
        clients: a.clients,
        keys: a.keys,
        zipf: a.zipf,
        lease_ms: a.lease_ms,
        recover_timeout_s: a.recover_timeout_s,
        etcd: a.etcd,
        check_budget: a.check_budget,
        netns: a.net == "netns",
        planted_serve_without_lease: a.planted.is_some(),
        ..ChaosOptions::new(a.seconds, a.seed, a.dir, bin)
    };
    let summary = match rowankv_chaos::run(&opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("replay: {}", opts.replay_command());
            return Err(e).context("chaos run");
        }
    };
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if !summary.passed() {
        eprintln!("{} violation(s):", summary.violations.len());
        for v in &summary.violations {
            eprintln!("- {v}");
        }
        eprintln!("replay: {}", summary.replay);
        bail!(
            "the chaos run found {} violation(s); files in {}",
            summary.violations.len(),
            opts.dir.display()
        );
    }
    eprintln!("chaos run passed; files in {}", opts.dir.display());
    Ok(())
}

#[derive(Args)]
pub struct ChaosClientArgs {
    #[arg(long)]
    cluster_id: u64,
    #[arg(long)]
    secret_file: PathBuf,
    /// The CMs' addresses, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    cms: Vec<String>,
    /// Keys k0..k<N>.
    #[arg(long)]
    keys: usize,
    #[arg(long)]
    zipf: f64,
    #[arg(long)]
    seed: u64,
    /// This client's number in the history.
    #[arg(long)]
    client: u32,
    /// Only GETs of this key (a one-key reader).
    #[arg(long)]
    reader: Option<String>,
    /// The run's start on the host's CLOCK_MONOTONIC.
    #[arg(long)]
    start_monotonic_ns: u64,
    /// The journal to create (it must not exist).
    #[arg(long)]
    journal: PathBuf,
}

pub fn client(a: ChaosClientArgs) -> Result<()> {
    let p = rowankv_chaos::fleet::ClientProcess {
        cluster_id: a.cluster_id,
        secret_file: a.secret_file,
        cms: a.cms,
        keys: a.keys,
        zipf: a.zipf,
        seed: a.seed,
        client: a.client,
        reader: a.reader,
        start_monotonic_ns: a.start_monotonic_ns,
        journal: a.journal,
    };
    rowankv_chaos::fleet::client_main(&p).context("chaos client")
}
