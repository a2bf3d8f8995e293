//! `rowankv sim`: the deterministic whole-cluster simulation over many seeds.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use clap::Args;
use rowankv_server::Strategy;
use rowankv_sim::{run, PlantedBug, RunResult, SimConfig};

#[derive(Args)]
pub struct SimArgs {
    /// Seeds to run (from --first on).
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// First seed of the range.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Run exactly this seed (replay).
    #[arg(long)]
    seed: Option<u64>,
    /// Client operations per seed.
    #[arg(long, default_value_t = 2000)]
    ops: usize,
    /// With --seed: write the client-visible history as JSON lines here.
    #[arg(long)]
    history: Option<PathBuf>,
    /// With --seed: print every fault injected.
    #[arg(long)]
    verbose: bool,
    /// Run without faults.
    #[arg(long)]
    no_faults: bool,
    /// PUTs carry no expiry time (by default about a third carry one, far past
    /// the run, so entries with expiry times travel every path: as the
    /// simulator's pinned regressions run, `SimConfig::new`).
    #[arg(long)]
    no_expiring_puts: bool,
    /// No late restarts: a crashed server that is neither restarted within
    /// its lease nor followed by a power failure stays down, as in runs found
    /// before late restarts were simulated (for replaying such a seed).
    #[arg(long)]
    no_late_restarts: bool,
    /// No migrations: no operator moves a shard's primary mid-run (dynamic
    /// resharding; as in runs found before migrations were simulated).
    #[arg(long)]
    no_migrations: bool,
    /// Run a deliberately broken build: `serve-without-lease`,
    /// `commit-unsettled-tlog-segments`, `abandon-failed-writes`,
    /// `ignore-request-ids`, `announce-writes-late` or `ignore-member-term`.
    #[arg(long)]
    planted: Option<String>,
    /// Replicate with this strategy in every seed (default: the seed picks one of
    /// rowan, rpc, rwrite, batch, share, drpc in turn).
    #[arg(long)]
    strategy: Option<String>,
    /// Threads running seeds.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

pub fn run_cmd(args: SimArgs) -> Result<()> {
    let planted: Option<PlantedBug> = match args.planted.as_deref() {
        None => None,
        Some(name) => Some(name.parse().map_err(|e: String| anyhow::anyhow!(e))?),
    };
    let strategy: Option<Strategy> = match args.strategy.as_deref() {
        None => None,
        Some(name) => Some(name.parse().map_err(|e: String| anyhow::anyhow!(e))?),
    };
    if args.history.is_some() && args.seed.is_none() {
        bail!("--history needs --seed (one seed's history)");
    }
    let (first, count) = match args.seed {
        Some(s) => (s, 1),
        None => (args.first, args.seeds),
    };
    let next = AtomicU64::new(first);
    let totals = Mutex::new((0u64, 0u64, 0u64, 0u64)); // seeds, ops, faults, violations
    let migrations = Mutex::new((0u64, 0u64)); // started, finished
    let failing = Mutex::new(Vec::new());
    let config_for = |seed: u64| SimConfig {
        faults: !args.no_faults,
        planted,
        strategy,
        expiring_puts: !args.no_expiring_puts,
        late_restarts: !args.no_late_restarts,
        migrations: !args.no_migrations,
        ..SimConfig::new(seed, args.ops)
    };
    let report = |r: &RunResult| -> Result<()> {
        let mut t = totals.lock().expect("totals");
        t.0 += 1;
        t.1 += r.report.ops_checked as u64;
        t.2 += r.faults.total() as u64;
        t.3 += r.report.violations.len() as u64;
        let done = t.0;
        drop(t);
        {
            let mut m = migrations.lock().expect("migrations");
            m.0 += u64::from(r.faults.migrations);
            m.1 += u64::from(r.faults.migrations_finished);
        }
        if !r.report.violations.is_empty() {
            failing.lock().expect("failing").push(r.seed);
            println!(
                "FAIL seed {}: {} violation(s), {} faults, final term {}",
                r.seed,
                r.report.violations.len(),
                r.faults.total(),
                r.terms
            );
            for v in r.report.violations.iter().take(3) {
                println!("  {v}");
            }
            for line in &r.fault_log {
                println!("  fault {line}");
            }
            println!(
                "  replay: rowankv sim --seed {} --ops {}{} --verbose --history seed-{}.jsonl",
                r.seed,
                args.ops,
                planted.map_or(String::new(), |p| format!(" --planted {}", p.name()))
                    + &strategy.map_or(String::new(), |s| format!(" --strategy {s}")),
                r.seed
            );
        } else if args.seed.is_some() || done.is_multiple_of(50) {
            println!(
                "seed {} ok: {} ops checked over {} keys, {} faults, final term {}, {:.1} s simulated",
                r.seed,
                r.report.ops_checked,
                r.report.keys,
                r.faults.total(),
                r.terms,
                r.sim_ns as f64 / 1e9
            );
        }
        if args.verbose {
            for line in &r.fault_log {
                println!("  fault {line}");
            }
        }
        if let Some(path) = &args.history {
            let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
            let mut w = BufWriter::new(f);
            r.history.write_jsonl(&mut w)?;
            w.flush()?;
            println!(
                "history: {} operations in {} (fingerprint {:016x})",
                r.history.len(),
                path.display(),
                r.history.fingerprint()
            );
        }
        Ok(())
    };
    let error = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..args.threads.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + count {
                    break;
                }
                let r = run(&config_for(seed));
                if let Err(e) = report(&r) {
                    *error.lock().expect("error") = Some(e);
                }
            });
        }
    });
    if let Some(e) = error.into_inner().expect("error") {
        return Err(e);
    }
    let (seeds, ops, faults, violations) = *totals.lock().expect("totals");
    let mut failing = failing.into_inner().expect("failing");
    failing.sort_unstable();
    if !failing.is_empty() {
        println!("failing seeds: {failing:?}");
    }
    let (started, finished) = *migrations.lock().expect("migrations");
    if started > 0 {
        println!("migrations: {started} started, {finished} finished (the rest rolled back or cut off by the run's end)");
    }
    println!(
        "sim: seeds {seeds}, operations checked {ops}, faults injected {faults}, violations {violations}"
    );
    if violations > 0 {
        std::process::exit(1);
    }
    Ok(())
}
