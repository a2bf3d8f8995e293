//! Seed 000 Figure 15 (§6.6): dynamic resharding's timeline
//! (`rowankv bench reshard`).
//!
//! A read-intensive load (YCSB-B: 95 % GET, ZippyDB sizes, uniform keys) runs
//! on an in-process cluster with the CM's automatic resharding on and the
//! paper's 500 ms statistics window. `hotspot_at_s` into the measured phase,
//! 80 % of the requests for the shards one server (A) leads go to one shard
//! another server (B) leads instead: B is overloaded, and the CM is expected
//! to detect it and move that shard to a server holding none of its replicas
//! (A, the least loaded, when its plan picks it). The run records the
//! throughput timeline, each server's served requests per step, the
//! detection, the migration's start (the plan stored) and end (the CM's
//! finish), the objects it copied, and reads back every acknowledged write.
//!
//! No timing model: the servers share this machine's cores, so a hot server
//! is not the bottleneck it is on a server of its own, and the total
//! throughput need not drop the paper's 33 %; the per-server load (the
//! imbalance, max over average) is what the hotspot changes and the
//! migration mends, and the result reports both.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_server::events::EventKind;
use rowankv_server::Strategy;
use serde::Serialize;

use super::runner::{
    read_back, timed_events, wait_for_hand_in, Hotspot, LoadGenerators, Target, PHASE_RUN,
    PHASE_STOP, TIMELINE_STEP_NS,
};
use super::workload::{record_key, KeyDist, SizeDist, Workload};
use super::{TimedEvent, YcsbOptions};

/// Options of `rowankv bench reshard`.
#[derive(Clone, Debug)]
pub struct ReshardOptions {
    pub servers: usize,
    pub shards_per_server: u16,
    pub records: u64,
    /// Length of the measured phase.
    pub seconds: f64,
    /// When the hotspot starts, seconds into the phase (paper: 3 s).
    pub hotspot_at_s: f64,
    /// Share of server A's requests shifted to the hot shard (paper: 80 %).
    pub share: f64,
    pub clients: usize,
    pub depth: usize,
    pub workers: usize,
    /// The servers' statistics window (paper: 500 ms).
    pub window_ns: u64,
    pub seed: u64,
    pub progress: bool,
}

impl ReshardOptions {
    /// The paper's setting (6 servers), scaled to this machine.
    pub fn full() -> ReshardOptions {
        ReshardOptions {
            servers: 6,
            shards_per_server: 4,
            records: 200_000,
            seconds: 12.0,
            hotspot_at_s: 3.0,
            share: 0.8,
            clients: 24,
            depth: 2,
            workers: 2,
            window_ns: 500_000_000,
            seed: 42,
            progress: true,
        }
    }

    /// A small run for CI and a first look.
    pub fn quick() -> ReshardOptions {
        ReshardOptions {
            records: 20_000,
            seconds: 8.0,
            clients: 8,
            ..ReshardOptions::full()
        }
    }
}

/// One run's timeline and figures.
#[derive(Clone, Debug, Serialize)]
pub struct ReshardResult {
    pub servers: usize,
    pub shards_per_server: u16,
    pub records: u64,
    pub seconds: f64,
    pub clients: usize,
    /// `"none"`: no timing model is used.
    pub timing_model: String,
    /// Server A (requests shifted away), server B (the hot shard's primary),
    /// the hot shard.
    pub shifted_server: u32,
    pub hot_server: u32,
    pub hot_shard: u16,
    pub hotspot_at_ms: f64,
    /// Detection after the hotspot started: the CM's first `Overloaded` event
    /// for any server.
    pub detect_ms: Option<f64>,
    pub detected_server: Option<u32>,
    /// Ms into the phase: the first configuration stored after the
    /// detection (the migration list), and the last migration's finish.
    pub migration_start_ms: Option<f64>,
    pub migration_end_ms: Option<f64>,
    /// From the migration list stored to the last migration finished.
    pub migration_ms: Option<f64>,
    /// Shards moved, and where (shard, from, to).
    pub migrations: Vec<(u16, u32, u32)>,
    /// Live entries the migrations copied to their targets.
    pub objects_moved: u64,
    /// Mean ops/s before the hotspot (from 0.5 s), from a step after the
    /// hotspot to the migration's start, and from half a second after its
    /// end to the end of the phase.
    pub ops_per_sec_before: f64,
    pub ops_per_sec_hotspot: f64,
    pub ops_per_sec_after: Option<f64>,
    /// The busiest server's served requests over the average, in the same
    /// three intervals.
    pub imbalance_before: f64,
    pub imbalance_hotspot: f64,
    pub imbalance_after: Option<f64>,
    /// Operations completed per 100 ms step.
    pub timeline: Vec<u64>,
    /// Per server (by node), requests served per 100 ms step.
    pub server_timeline: Vec<(u32, Vec<u64>)>,
    pub events: Vec<TimedEvent>,
    /// Servers failed over during the run (a spoiled run when not 0).
    pub servers_failed: usize,
    pub errors: u64,
    pub timeouts: u64,
    pub verified_keys: u64,
    pub lost_writes: u64,
}

/// Run the experiment once.
pub fn run(opts: &ReshardOptions) -> Result<ReshardResult, String> {
    if !(0.0..1.0).contains(&(opts.hotspot_at_s / opts.seconds)) {
        return Err(format!(
            "the hotspot at {} s is not inside the {} s phase",
            opts.hotspot_at_s, opts.seconds
        ));
    }
    if opts.servers < 4 {
        return Err(format!(
            "{} servers: the hot shard needs a server holding none of its 3 replicas, \
             and another whose load shifts (at least 4)",
            opts.servers
        ));
    }
    let sizes = SizeDist::ZippyDb;
    let mut yopts = YcsbOptions {
        workload: Workload::B,
        keys: KeyDist::Uniform,
        sizes,
        records: opts.records,
        seconds: opts.seconds,
        servers: opts.servers,
        replication_factor: 3,
        workers: opts.workers,
        shards_per_server: opts.shards_per_server,
        clients: opts.clients,
        depth: opts.depth,
        strategies: vec![Strategy::Rowan],
        media_bandwidth: None,
        pool_bytes: 1 << 30,
        seed: opts.seed,
        progress: opts.progress,
        // Leases long enough that this machine's stalls fail no server.
        lease_ns: Some(1_000_000_000),
        verify: true,
        load_window_ns: Some(opts.window_ns),
        reshard_auto: true,
        ..YcsbOptions::default()
    };
    let mut target = Target::start(&yopts, Strategy::Rowan)?;
    let Target::Loopback(cluster) = &target else {
        return Err("resharding's benchmark runs on the loopback fabric".into());
    };
    let config = cluster.cm().current();
    // A: the first member; B and its hot shard: the first shard another
    // server leads of which A holds no replica (so A may take it).
    let shifted = config.members[0].node;
    let (hot_server, hot_shard) = config
        .shards
        .iter()
        .find(|s| s.primary != shifted && !s.is_replica(shifted))
        .map(|s| (s.primary, s.shard))
        .ok_or("no shard without a replica on the first server")?;
    let mut key = Vec::new();
    let mut shifted_records = Vec::with_capacity(opts.records as usize);
    let mut hot = Vec::new();
    for r in 0..opts.records {
        record_key(r, sizes.key_bytes(), &mut key);
        let s = config.shard_for_key(&key);
        shifted_records.push(s.primary == shifted);
        if s.shard == hot_shard {
            hot.push(r);
        }
    }
    let at_ns = (opts.hotspot_at_s * 1e9) as u64;
    yopts.hotspot = Some(Arc::new(Hotspot {
        at_ns,
        share: opts.share,
        shifted: shifted_records,
        hot,
    }));
    let steps = (opts.seconds * 1e9 / TIMELINE_STEP_NS as f64).ceil() as usize;
    let generators = LoadGenerators::spawn(&mut target, &yopts, steps + 10)?;
    generators.load(&yopts, Strategy::Rowan)?;
    let Target::Loopback(cluster) = &mut target else {
        unreachable!("checked above")
    };
    let servers = cluster.servers().to_vec();
    let served = || -> Vec<u64> {
        servers
            .iter()
            .map(|s| s.stats.gets.load(Ordering::Relaxed) + s.stats.puts.load(Ordering::Relaxed))
            .collect()
    };

    let clock = cluster.clock().clone();
    let run_start_ns = clock.now_ns();
    let counters = generators.counters.clone();
    counters.run_start_ns.store(run_start_ns, Ordering::Relaxed);
    let errors_before = counters.errors.load(Ordering::Relaxed);
    let timeouts_before = counters.timeouts.load(Ordering::Relaxed);
    generators.phase.store(PHASE_RUN, Ordering::Release);
    let start = Instant::now();
    let mut last = served();
    let mut per_server: Vec<Vec<u64>> = vec![Vec::with_capacity(steps); servers.len()];
    for step in 1..=steps {
        let due = start + Duration::from_nanos(step as u64 * TIMELINE_STEP_NS);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let now = served();
        for (i, (n, l)) in now.iter().zip(&last).enumerate() {
            per_server[i].push(n - l);
        }
        last = now;
    }
    generators.phase.store(PHASE_STOP, Ordering::Release);
    wait_for_hand_in(&counters, opts.clients);
    let acked = std::mem::take(&mut *generators.acked_out.lock());
    let (verified_keys, lost_writes) = read_back(cluster, sizes.key_bytes(), &acked)?;
    let timeline: Vec<u64> = counters
        .timeline
        .iter()
        .take(steps)
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    let events = timed_events(cluster, run_start_ns);
    let raw = cluster.events().snapshot();
    let errors = counters.errors.load(Ordering::Relaxed) - errors_before;
    let timeouts = counters.timeouts.load(Ordering::Relaxed) - timeouts_before;
    target.shutdown();

    // The marks, ms into the phase.
    let ms = |at_ns: u64| at_ns.saturating_sub(run_start_ns) as f64 / 1e6;
    let hotspot_at_ms = at_ns as f64 / 1e6;
    let after_hotspot = raw.iter().filter(|e| ms(e.at_ns) >= hotspot_at_ms);
    let detected = after_hotspot.clone().find_map(|e| match e.kind {
        EventKind::Overloaded { node, .. } => Some((e.at_ns, node)),
        _ => None,
    });
    let stored = detected.and_then(|(d, _)| {
        raw.iter()
            .find(|e| e.at_ns >= d && matches!(e.kind, EventKind::ConfigStored { .. }))
            .map(|e| e.at_ns)
    });
    let mut migrations = Vec::new();
    let mut objects_moved = 0;
    let mut end = None;
    for e in raw.iter().filter(|e| stored.is_some_and(|s| e.at_ns >= s)) {
        match e.kind {
            EventKind::MigrationFinished { shard, from, to } => {
                migrations.push((shard.0, from.0, to.0));
                end = Some(e.at_ns);
            }
            EventKind::MigrationCopied { entries, .. } => objects_moved += entries,
            _ => {}
        }
    }
    let servers_failed = raw
        .iter()
        .filter(|e| e.at_ns >= run_start_ns && matches!(e.kind, EventKind::ServerFailed { .. }))
        .count();

    let step_ms = TIMELINE_STEP_NS as f64 / 1e6;
    let range = |from_ms: f64, to_ms: f64| {
        let a = (from_ms / step_ms).ceil() as usize;
        let b = ((to_ms / step_ms).floor() as usize).min(steps);
        (a, b.max(a))
    };
    let rate = |(a, b): (usize, usize)| {
        if b <= a {
            return 0.0;
        }
        timeline[a..b].iter().sum::<u64>() as f64 / ((b - a) as f64 * step_ms / 1e3)
    };
    let imbalance = |(a, b): (usize, usize)| {
        let loads: Vec<u64> = per_server
            .iter()
            .map(|t| t[a.min(t.len())..b.min(t.len())].iter().sum())
            .collect();
        let total: u64 = loads.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let average = total as f64 / loads.len() as f64;
        *loads.iter().max().unwrap_or(&0) as f64 / average
    };
    let phase_ms = opts.seconds * 1e3;
    // Half a second for the load to settle after the start and the move.
    let before = range(500.0, hotspot_at_ms);
    // The hotspot: from one step after it starts to the migration's start
    // (the detection takes a few steps), at least one step.
    let hotspot = range(
        hotspot_at_ms + step_ms,
        stored
            .map_or(phase_ms, ms)
            .max(hotspot_at_ms + 2.0 * step_ms),
    );
    let after = end.map(|e| range(ms(e) + 500.0, phase_ms));
    let after = after.filter(|(a, b)| b > a);
    Ok(ReshardResult {
        servers: opts.servers,
        shards_per_server: opts.shards_per_server,
        records: opts.records,
        seconds: opts.seconds,
        clients: opts.clients,
        timing_model: "none".into(),
        shifted_server: shifted.0,
        hot_server: hot_server.0,
        hot_shard: hot_shard.0,
        hotspot_at_ms,
        detect_ms: detected.map(|(d, _)| ms(d) - hotspot_at_ms),
        detected_server: detected.map(|(_, n)| n.0),
        migration_start_ms: stored.map(ms),
        migration_end_ms: end.map(ms),
        migration_ms: stored.zip(end).map(|(s, e)| (e - s) as f64 / 1e6),
        migrations,
        objects_moved,
        ops_per_sec_before: rate(before),
        ops_per_sec_hotspot: rate(hotspot),
        ops_per_sec_after: after.map(rate),
        imbalance_before: imbalance(before),
        imbalance_hotspot: imbalance(hotspot),
        imbalance_after: after.map(imbalance),
        timeline,
        server_timeline: servers.iter().map(|s| s.node.0).zip(per_server).collect(),
        events,
        servers_failed,
        errors,
        timeouts,
        verified_keys,
        lost_writes,
    })
}

/// The run as text: every line says no timing model is used.
pub fn report(r: &ReshardResult) -> String {
    let tag = "[no timing model]";
    let opt = |v: Option<f64>, unit: &str| {
        v.map_or("not reached".to_string(), |v| format!("{v:.0}{unit}"))
    };
    let ratio = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(tag);
        out.push(' ');
        out.push_str(&s);
        out.push('\n');
    };
    line(format!(
        "resharding (seed 000 Fig. 15): {} servers x {} shards, RF 3, {} objects, YCSB-B uniform, {} clients, {:.0} s",
        r.servers, r.shards_per_server, r.records, r.clients, r.seconds
    ));
    line(format!(
        "hotspot at {:.0} ms: 80 % of n{}'s requests go to shard{} on n{}",
        r.hotspot_at_ms, r.shifted_server, r.hot_shard, r.hot_server
    ));
    line(format!(
        "overload detected after {} (server {})",
        opt(r.detect_ms, " ms"),
        r.detected_server.map_or("-".into(), |n| format!("n{n}"))
    ));
    let moves: Vec<String> = r
        .migrations
        .iter()
        .map(|(s, f, t)| format!("shard{s} n{f} -> n{t}"))
        .collect();
    line(format!(
        "migration: {} ({}), {} objects moved",
        opt(r.migration_ms, " ms"),
        if moves.is_empty() {
            "none finished".to_string()
        } else {
            moves.join(", ")
        },
        r.objects_moved
    ));
    line(format!(
        "ops/s: before {:.0}, hotspot {:.0}, after {}",
        r.ops_per_sec_before,
        r.ops_per_sec_hotspot,
        opt(r.ops_per_sec_after, "")
    ));
    line(format!(
        "busiest server / average: before {:.2}, hotspot {:.2}, after {}",
        r.imbalance_before,
        r.imbalance_hotspot,
        ratio(r.imbalance_after)
    ));
    line(format!(
        "{} acknowledged writes read back, {} lost; {} errors, {} timeouts, {} servers failed over",
        r.verified_keys, r.lost_writes, r.errors, r.timeouts, r.servers_failed
    ));
    out
}
