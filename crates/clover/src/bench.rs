//! Benchmarks of seed 004 on the `loopback` fabric with the wire model on
//! (`docs/wire-model.md`; every printed line carries its label): YCSB-A (50 %
//! GET, 50 % PUT), Zipf 0.75 over 1,024 keys, blocking clients (one operation at
//! a time each), Clover native versus behind the interposer; the interposer
//! caching only the top-N keys; both at 5 % PUTs at the largest client count
//! (where Clover's paper counts round trips); the switch's memory for 1K..100K
//! keys. [`run_workload`] runs a caller's mix on replicated, media-modelled
//! pools for comparisons with other stores (seed 000 Figure 16).
//!
//! One driver thread steps every client's state machine (a blocking client is
//! one with one operation in flight). Time is measured one of two ways
//! ([`Timing`]):
//! - **modelled** (the default): the fabric runs on a manual clock that the
//!   driver moves to the next due landing or completion once every client has
//!   done what it can at this instant ([`LoopbackFabric::progress_due`]). A
//!   point's time is then the wire model's alone: round trips, the memory
//!   node's NIC message slots that 64 clients contend for, persistence DMAs,
//!   with no CPU time of this machine in it, as on the paper's testbed where
//!   every client has a core and the memory node has no CPU in the path.
//!   Requests land at a target in the order they were posted, which is the
//!   order the switch saw them (a FIFO switch port). The result is the same
//!   on every run of a seed.
//! - **wall**: the fabric runs on the system clock and a point's time is the
//!   driver thread's wall time, so its CPU time is in it (and, on a shared
//!   machine, its neighbours').
//!
//! Counts that need no model are reported too: round trips per operation (rounds
//! of one-sided requests plus calls to the MS, p50/p99), failed CASes,
//! redirections.
//!
//! Clients start with every key's metadata cached (steady state; no MS lookup
//! per first access) and no tail cached. Deviations (see `docs/clover.md`): one
//! memory node (the paper's testbed had one; replication is a knob, off here);
//! memory is DRAM (persistence is timed by the model's `dma_persist_ns`, not by
//! a PM pool); calls to the MS are counted as round trips but not timed, and in
//! modelled time the MS's own rounds (its GC's chain walks) are carried out
//! untimed too ([`LoopbackFabric::set_untimed`]): the MS is a machine of its
//! own off the clients' path, and its blocking rounds would otherwise stop the
//! clock. Its load on the memory node's NIC is therefore not modelled.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};
use rowankv_fabric::{LoopbackFabric, WireModel};
use rowankv_types::{Clock, ManualClock};
use serde::Serialize;

use crate::cluster::{AnyClient, Cluster, Memory};
use crate::switch::{SwitchConfig, BYTES_PER_CLIENT, BYTES_PER_KEY};
use crate::{CloverError, Config, Request};

/// Bound on the operations of one point.
pub const OPS_PER_POINT_MAX: u64 = 10_000_000;
/// YCSB-A's share of PUTs, Figures 2 and 4's workload.
pub const YCSB_A_PUT_FRACTION: f64 = 0.5;
/// The read-mostly share of PUTs at which Clover's paper counts round trips
/// (5 at p99 with 5 % writes).
pub const READ_MOSTLY_PUT_FRACTION: f64 = 0.05;

/// Bound on polls of one point (a stuck run ends with an error, not a hang).
pub const POLLS_PER_OP_MAX: u64 = 10_000_000;

/// How a point's time is measured (module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// The wire model's time on a manual clock, no CPU time in it.
    Modelled,
    /// The driver thread's wall time on the system clock.
    Wall,
}

impl Timing {
    /// The words every result line carries.
    pub fn label(self) -> &'static str {
        match self {
            Timing::Modelled => "modelled time (manual clock, no CPU time)",
            Timing::Wall => "wall time of one driver thread",
        }
    }
}

/// What a run measures.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub keys: usize,
    pub zipf_s: f64,
    pub value_bytes: usize,
    pub ops_per_point: u64,
    pub clients: Vec<usize>,
    /// Top-N sizes for the cached-keys sweep (run at the largest client count).
    pub cached_keys: Vec<usize>,
    /// Key counts for the switch-memory sweep.
    pub memory_keys: Vec<usize>,
    /// Also measure native and interposed at the largest client count with
    /// [`READ_MOSTLY_PUT_FRACTION`] PUTs (the round trips of Clover's paper).
    pub read_mostly: bool,
    pub model: WireModel,
    pub timing: Timing,
    pub seed: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            keys: 1024,
            zipf_s: 0.75,
            value_bytes: 64,
            ops_per_point: 50_000,
            clients: vec![8, 16, 32, 64],
            cached_keys: vec![0, 1, 2, 4, 8, 16, 64, 256, 1024],
            memory_keys: vec![1_000, 10_000, 100_000],
            read_mostly: true,
            model: WireModel::CONNECTX5,
            timing: Timing::Modelled,
            seed: 1,
        }
    }
}

/// One measured point.
#[derive(Clone, Debug, Serialize)]
pub struct BenchPoint {
    /// "native" or "interposer".
    pub mode: String,
    pub clients: usize,
    /// Keys the switch may cache (0 for native).
    pub cached_keys: usize,
    /// The share of PUTs (YCSB-A: 0.5).
    pub put_fraction: f64,
    pub ops_per_sec: f64,
    pub round_trips_p50: u32,
    pub round_trips_p99: u32,
    pub ops: u64,
    pub cas_failed: u64,
    pub cas_redirected: u64,
    /// Times the switch dropped its state during the point.
    pub switch_resets: u64,
    pub switch_bytes: usize,
    /// The wire model's label, with how time was measured.
    pub model: String,
}

/// The switch's memory for a key count.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryPoint {
    pub keys: usize,
    pub clients: usize,
    pub switch_bytes: usize,
    /// Measured: keys cached after writing every key once through the switch.
    pub keys_cached: usize,
}

/// Everything [`run`] measures.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub ycsb_a: Vec<BenchPoint>,
    pub top_n: Vec<BenchPoint>,
    /// 5 % PUTs at the largest client count, native then interposed.
    pub read_mostly: Vec<BenchPoint>,
    pub memory: Vec<MemoryPoint>,
}

/// Run every benchmark of `config`.
pub fn run(config: &BenchConfig) -> Result<BenchReport, CloverError> {
    let mut ycsb_a = Vec::new();
    for &clients in &config.clients {
        ycsb_a.push(point(config, clients, None)?);
        ycsb_a.push(point(config, clients, Some(config.keys))?);
    }
    let clients = config.clients.iter().copied().max().unwrap_or(1);
    let mut top_n = Vec::new();
    for &n in &config.cached_keys {
        top_n.push(point(config, clients, Some(n))?);
    }
    let mut read_mostly = Vec::new();
    if config.read_mostly {
        for cached in [None, Some(config.keys)] {
            read_mostly.push(point_with(
                config,
                clients,
                cached,
                READ_MOSTLY_PUT_FRACTION,
            )?);
        }
    }
    let mut memory = Vec::new();
    for &keys in &config.memory_keys {
        memory.push(switch_memory(keys, clients)?);
    }
    Ok(BenchReport {
        model: label(config),
        ycsb_a,
        top_n,
        read_mostly,
        memory,
    })
}

/// The model's label and how time was measured, for every result line.
fn label(config: &BenchConfig) -> String {
    format!("{}; {}", config.model.label(), config.timing.label())
}

/// A cluster on a fabric with `model`, and the manual clock it runs on when
/// time is modelled.
fn cluster_on(
    model: WireModel,
    timing: Timing,
    config: Config,
    memory: Memory,
    switch: SwitchConfig,
) -> Result<(Cluster, Option<Arc<ManualClock>>), CloverError> {
    let (fabric, clock) = match timing {
        Timing::Modelled => {
            let clock = ManualClock::new();
            let fabric = LoopbackFabric::with_clock_and_model(clock.clone(), model)?;
            (fabric, Some(clock))
        }
        Timing::Wall => (LoopbackFabric::with_model(model)?, None),
    };
    let cluster = Cluster::new(fabric, config, memory, switch)?;
    if clock.is_some() {
        // The MS's rounds (GC) block until they complete, which a manual
        // clock moved only by the driver would never let them do; the MS is
        // off the clients' path, so its rounds go untimed (module doc).
        cluster
            .fabric
            .set_untimed(rowankv_types::NodeId(crate::cluster::MS_NODE_ID), true);
    }
    Ok((cluster, clock))
}

/// The cluster of a [`point`]: one memory node on DRAM.
fn bench_cluster(
    config: &BenchConfig,
    keys: usize,
    switch: SwitchConfig,
) -> Result<(Cluster, Option<Arc<ManualClock>>), CloverError> {
    let cluster_config = Config {
        replicas: 1,
        slots: (keys * 8).clamp(1 << 15, crate::SLOTS_MAX),
        value_bytes_max: config.value_bytes.max(8),
        key_bytes_max: 32,
        chunk_slots: 64,
        versions_kept: 4,
        gc_every_reports: 8,
        ..Config::default()
    };
    cluster_on(
        config.model,
        config.timing,
        cluster_config,
        Memory::Dram,
        switch,
    )
}

/// With modelled time: once every client has done what it can at this
/// instant, carry out what is due and move the clock to the next due time.
/// Returns whether the clock moved.
fn advance(cl: &Cluster, clock: &ManualClock) -> bool {
    let now = clock.now_ns();
    match cl.fabric.progress_due() {
        Some(due) if due > now => {
            clock.advance_ns(due - now);
            true
        }
        _ => false,
    }
}

fn key(rank: usize) -> Vec<u8> {
    key_of(rank, 12)
}

/// Key `rank` as `user000…rank`, `bytes` long (at least 12).
fn key_of(rank: usize, bytes: usize) -> Vec<u8> {
    let width = bytes.max(12) - 4;
    format!("user{rank:0width$}").into_bytes()
}

/// Run one operation of `c` to its end (moving a modelled clock as needed).
fn run_one(
    cl: &Cluster,
    clock: Option<&ManualClock>,
    c: &mut AnyClient,
    req: Request,
    what: &'static str,
) -> Result<(), CloverError> {
    let mut o = c.start(req);
    let mut polls = 0u64;
    while o.is_none() {
        o = c.poll();
        if let Some(clock) = clock {
            if o.is_none() && !c.posts_on_next_poll() {
                advance(cl, clock);
            }
        }
        polls += 1;
        if polls > POLLS_PER_OP_MAX {
            return Err(CloverError::GaveUp(what));
        }
    }
    o.expect("finished").result.map(|_| ())
}

/// Write every key once, in rank order (so key ids are ranks + 1).
fn preload(
    cl: &mut Cluster,
    clock: Option<&ManualClock>,
    keys: usize,
    key_bytes: usize,
    value_bytes: usize,
) -> Result<(), CloverError> {
    let mut c = cl.client(false)?;
    for rank in 0..keys {
        let req = Request::Put {
            key: key_of(rank, key_bytes),
            value: vec![7; value_bytes],
        };
        run_one(cl, clock, &mut c, req, "preload stuck")?;
    }
    Ok(())
}

/// `n` clients (behind the switch if `interposed`) in steady state: every
/// client knows every key's id (its cache of tails stays cold and learns as it
/// goes) and is connected. Connections are made here, by a GET each, because a
/// new connection resets the switch (it may be a restarted memory node's): a
/// reset in the measured phase would be a warm-up's, not the protocol's.
fn ready_clients(
    cl: &mut Cluster,
    clock: Option<&ManualClock>,
    n: usize,
    interposed: bool,
    keys: &[Vec<u8>],
) -> Result<Vec<AnyClient>, CloverError> {
    let mut cs: Vec<AnyClient> = (0..n)
        .map(|_| cl.client(interposed))
        .collect::<Result<_, _>>()?;
    for c in cs.iter_mut() {
        c.prefetch_keys(keys);
        let first = Request::Get {
            key: keys.first().cloned().unwrap_or_default(),
        };
        run_one(cl, clock, c, first, "warm-up stuck")?;
    }
    Ok(cs)
}

/// Run `ops` operations drawn by `next` on blocking clients `cs` (each starts
/// its next operation as soon as one ends); their round trips, and the time
/// they took (modelled with `clock`, else wall time).
fn measure(
    cl: &Cluster,
    clock: Option<&ManualClock>,
    cs: &mut [AnyClient],
    ops: u64,
    mut next: impl FnMut() -> Request,
) -> Result<(Vec<u32>, f64), CloverError> {
    assert!(ops <= OPS_PER_POINT_MAX);
    let mut round_trips: Vec<u32> = Vec::with_capacity(ops as usize);
    let mut started = 0u64;
    let mut polls = 0u64;
    let t0 = Instant::now();
    let m0 = clock.map(|c| c.now_ns());
    while (round_trips.len() as u64) < ops {
        for c in cs.iter_mut() {
            // Everything this client can do at this instant: a round
            // transition takes two polls (a poll consumes a round's
            // completions or posts the next round), and a blocking client
            // starts its next operation as soon as one finishes.
            let mut done = if c.is_idle() {
                if started >= ops {
                    continue;
                }
                started += 1;
                c.start(next())
            } else {
                c.poll()
            };
            loop {
                if let Some(o) = done.take() {
                    o.result?;
                    round_trips.push(o.round_trips);
                    if started < ops {
                        started += 1;
                        done = c.start(next());
                        continue;
                    }
                } else if c.posts_on_next_poll() {
                    done = c.poll();
                    continue;
                }
                break;
            }
        }
        if let Some(clock) = clock {
            advance(cl, clock);
        }
        polls += 1;
        if polls > POLLS_PER_OP_MAX.saturating_mul(16) {
            return Err(CloverError::GaveUp("benchmark point stuck"));
        }
    }
    let elapsed_s = match (clock, m0) {
        (Some(c), Some(m0)) => (c.now_ns() - m0) as f64 / 1e9,
        _ => t0.elapsed().as_secs_f64(),
    };
    round_trips.sort_unstable();
    Ok((round_trips, elapsed_s))
}

/// The `p` quantile (0..=1) of `sorted` round trips (nearest rank below).
fn quantile(sorted: &[u32], p: f64) -> u32 {
    sorted
        .get(((sorted.len().saturating_sub(1)) as f64 * p) as usize)
        .copied()
        .unwrap_or(0)
}

/// What [`prepared`] gives: the cluster, its manual clock when time is
/// modelled, and the connected clients.
struct Prepared {
    cl: Cluster,
    clock: Option<Arc<ManualClock>>,
    clients: Vec<AnyClient>,
}

/// A point's cluster (one memory node, `config.keys` keys preloaded) and its
/// `clients` clients, connected (a connection resets the switch).
fn prepared(
    config: &BenchConfig,
    clients: usize,
    switch: SwitchConfig,
    interposed: bool,
) -> Result<Prepared, CloverError> {
    let (mut cl, clock) = bench_cluster(config, config.keys, switch)?;
    preload(
        &mut cl,
        clock.as_deref(),
        config.keys,
        12,
        config.value_bytes,
    )?;
    let all_keys: Vec<Vec<u8>> = (0..config.keys).map(key).collect();
    let clients = ready_clients(&mut cl, clock.as_deref(), clients, interposed, &all_keys)?;
    Ok(Prepared { cl, clock, clients })
}

/// A point's requests: keys drawn by `config`'s Zipf over the key space, a
/// `put_fraction` share of them PUTs of `config.value_bytes` bytes.
fn requests(
    config: &BenchConfig,
    put_fraction: f64,
    seed: u64,
) -> Result<impl FnMut() -> Request, CloverError> {
    let zipf = Zipf::new(config.keys as u64, config.zipf_s)
        .map_err(|_| CloverError::BadConfig("zipf exponent"))?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let value = vec![9u8; config.value_bytes];
    Ok(move || {
        let rank = zipf.sample(&mut rng) as usize - 1;
        if rng.gen_bool(1.0 - put_fraction) {
            Request::Get { key: key(rank) }
        } else {
            Request::Put {
                key: key(rank),
                value: value.clone(),
            }
        }
    })
}

/// One point: `clients` blocking clients, native (`cached_keys: None`) or behind
/// a switch caching the top `n` keys.
pub fn point(
    config: &BenchConfig,
    clients: usize,
    cached_keys: Option<usize>,
) -> Result<BenchPoint, CloverError> {
    point_with(config, clients, cached_keys, YCSB_A_PUT_FRACTION)
}

/// [`point`] with a share of PUTs other than YCSB-A's half.
pub fn point_with(
    config: &BenchConfig,
    clients: usize,
    cached_keys: Option<usize>,
    put_fraction: f64,
) -> Result<BenchPoint, CloverError> {
    if !(0.0..=1.0).contains(&put_fraction) {
        return Err(CloverError::BadConfig(
            "the share of PUTs is between 0 and 1",
        ));
    }
    assert!(config.ops_per_point <= OPS_PER_POINT_MAX);
    let switch = SwitchConfig {
        keys_max: cached_keys.unwrap_or(0),
        admit: cached_keys.map(|n| (1..=n as u64).collect::<HashSet<u64>>()),
        targets: None,
    };
    let interposed = cached_keys.is_some();
    let Prepared {
        cl,
        clock,
        clients: mut cs,
    } = prepared(config, clients, switch, interposed)?;
    let next_request = requests(config, put_fraction, config.seed)?;
    let before = cl.switch.stats();
    let (round_trips, elapsed_s) = measure(
        &cl,
        clock.as_deref(),
        &mut cs,
        config.ops_per_point,
        next_request,
    )?;
    let cas_failed = cs.iter().map(|c| c.stats().cas_failed).sum();
    Ok(BenchPoint {
        mode: if interposed { "interposer" } else { "native" }.into(),
        clients,
        cached_keys: cached_keys.unwrap_or(0),
        ops_per_sec: round_trips.len() as f64 / elapsed_s,
        put_fraction,
        round_trips_p50: quantile(&round_trips, 0.50),
        round_trips_p99: quantile(&round_trips, 0.99),
        ops: round_trips.len() as u64,
        cas_failed,
        cas_redirected: cl.switch.stats().cas_redirected - before.cas_redirected,
        switch_resets: cl.switch.stats().resets - before.resets,
        switch_bytes: cl.switch.memory_bytes(),
        model: label(config),
    })
}

/// A workload of blocking clients drawn by the caller, for comparisons with
/// other stores on the same fabric and media models (seed 000 Figure 16).
#[derive(Clone, Debug)]
pub struct Workload {
    pub keys: usize,
    pub key_bytes: usize,
    /// The largest value a PUT writes (every slot holds one this long).
    pub value_bytes_max: usize,
    /// Every key's value before the measured phase.
    pub preload_value_bytes: usize,
    pub clients: usize,
    pub ops: u64,
    /// Memory nodes, each a replica of every key (node 0 the primary).
    pub replicas: usize,
    pub memory: Memory,
    pub model: WireModel,
    pub timing: Timing,
    /// Clients behind the interposer (caching every key).
    pub interposed: bool,
    pub seed: u64,
}

/// What [`run_workload`] measured.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub ops: u64,
    pub ops_per_sec: f64,
    pub round_trips_p50: u32,
    pub round_trips_p99: u32,
    pub cas_failed: u64,
    /// Bytes the memory nodes' DIMMs were asked to write, per operation, and
    /// what reached their media (the media model's counts; 0 on DRAM).
    pub request_bytes_per_op: f64,
    pub media_bytes_per_op: f64,
    /// Media bytes over requested bytes (`None` without the media model).
    pub dlwa: Option<f64>,
    /// The wire model's label, with how time was measured.
    pub model: String,
}

/// Run `w`: `draw` gives each operation's key rank (below `w.keys`) and, for
/// a PUT, its value length (at most `w.value_bytes_max`); `None`: a GET.
pub fn run_workload(
    w: &Workload,
    mut draw: impl FnMut(&mut ChaCha8Rng) -> (usize, Option<usize>),
) -> Result<WorkloadResult, CloverError> {
    if w.keys == 0 || w.clients == 0 || w.ops == 0 || w.ops > OPS_PER_POINT_MAX {
        return Err(CloverError::BadConfig(
            "a workload needs keys, clients and 1..=10 M operations",
        ));
    }
    let config = Config {
        replicas: w.replicas,
        slots: (w.keys * 8).clamp(1 << 15, crate::SLOTS_MAX),
        value_bytes_max: w.value_bytes_max.max(8),
        key_bytes_max: w.key_bytes.max(12),
        chunk_slots: 64,
        versions_kept: 4,
        gc_every_reports: 8,
        ..Config::default()
    };
    let switch = SwitchConfig {
        keys_max: if w.interposed { w.keys } else { 0 },
        ..SwitchConfig::default()
    };
    let (mut cl, clock) = cluster_on(w.model, w.timing, config, w.memory.clone(), switch)?;
    preload(
        &mut cl,
        clock.as_deref(),
        w.keys,
        w.key_bytes,
        w.preload_value_bytes,
    )?;
    let all_keys: Vec<Vec<u8>> = (0..w.keys).map(|r| key_of(r, w.key_bytes)).collect();
    let mut cs = ready_clients(
        &mut cl,
        clock.as_deref(),
        w.clients,
        w.interposed,
        &all_keys,
    )?;
    let media_before = cl.media_stats();
    let mut rng = ChaCha8Rng::seed_from_u64(w.seed);
    let value = vec![9u8; w.value_bytes_max];
    let next = || match draw(&mut rng) {
        (rank, None) => Request::Get {
            key: all_keys[rank % w.keys].clone(),
        },
        (rank, Some(len)) => Request::Put {
            key: all_keys[rank % w.keys].clone(),
            value: value[..len.clamp(1, w.value_bytes_max)].to_vec(),
        },
    };
    let (round_trips, elapsed_s) = measure(&cl, clock.as_deref(), &mut cs, w.ops, next)?;
    let media = match (cl.media_stats(), media_before) {
        (Some(after), Some(before)) => Some(after.delta(&before)),
        _ => None,
    };
    let ops = round_trips.len() as u64;
    Ok(WorkloadResult {
        ops,
        ops_per_sec: ops as f64 / elapsed_s,
        round_trips_p50: quantile(&round_trips, 0.50),
        round_trips_p99: quantile(&round_trips, 0.99),
        cas_failed: cs.iter().map(|c| c.stats().cas_failed).sum(),
        request_bytes_per_op: media.map_or(0.0, |m| m.request_bytes as f64 / ops as f64),
        media_bytes_per_op: media.map_or(0.0, |m| m.media_bytes as f64 / ops as f64),
        dlwa: media.map(|m| m.dlwa()),
        model: format!("{}; {}", w.model.label(), w.timing.label()),
    })
}

/// The switch's tables after `keys` keys were written through it by
/// `clients` clients (measured), against the formula.
pub fn switch_memory(keys: usize, clients: usize) -> Result<MemoryPoint, CloverError> {
    // No timing is needed to count bytes: the fabric runs without the model.
    let mut cl = Cluster::new(
        LoopbackFabric::new(),
        Config {
            replicas: 1,
            slots: (keys * 4 + 4096).min(crate::SLOTS_MAX),
            value_bytes_max: 8,
            chunk_slots: 64,
            gc_every_reports: 0,
            ..Config::default()
        },
        Memory::Dram,
        SwitchConfig {
            keys_max: keys,
            ..SwitchConfig::default()
        },
    )?;
    let mut cs: Vec<AnyClient> = (0..clients)
        .map(|_| cl.client(true))
        .collect::<Result<_, _>>()?;
    // Two passes: a client's first connection resets the switch (a new
    // connection may mean a restarted memory node), so the first pass warms up.
    for rank in (0..keys).chain(0..keys) {
        let c = &mut cs[rank % clients];
        let mut o = c.start(Request::Put {
            key: key(rank),
            value: vec![1; 8],
        });
        let mut polls = 0u64;
        while o.is_none() {
            o = c.poll();
            polls += 1;
            if polls > POLLS_PER_OP_MAX {
                return Err(CloverError::GaveUp("memory sweep stuck"));
            }
        }
        o.expect("finished").result?;
    }
    let bytes = cl.switch.memory_bytes();
    assert!(bytes <= keys * BYTES_PER_KEY + clients * BYTES_PER_CLIENT);
    Ok(MemoryPoint {
        keys,
        clients,
        switch_bytes: bytes,
        keys_cached: cl.switch.keys_cached(),
    })
}

/// Lines for a terminal, each labelled with the model.
pub fn render(report: &BenchReport) -> Vec<String> {
    let mut out = Vec::new();
    for p in report
        .ycsb_a
        .iter()
        .chain(&report.top_n)
        .chain(&report.read_mostly)
    {
        out.push(format!(
            "clover {:>3.0} % put zipf0.75 | {:10} clients {:3} cached {:5} | {:10.0} ops/s | round trips p50 {} p99 {} | cas failed {} redirected {} | switch resets {} {} B | {}",
            p.put_fraction * 100.0, p.mode, p.clients, p.cached_keys, p.ops_per_sec, p.round_trips_p50, p.round_trips_p99,
            p.cas_failed, p.cas_redirected, p.switch_resets, p.switch_bytes, p.model
        ));
    }
    for m in &report.memory {
        out.push(format!(
            "clover switch memory | keys {:6} clients {:3} | {} B ({} keys cached) | counted, no timing model",
            m.keys, m.clients, m.switch_bytes, m.keys_cached
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_measures_every_point_with_its_label() {
        let config = BenchConfig {
            keys: 64,
            ops_per_point: 400,
            clients: vec![4, 8],
            cached_keys: vec![0, 8],
            memory_keys: vec![100],
            ..BenchConfig::default()
        };
        let r = run(&config).unwrap();
        assert_eq!(r.ycsb_a.len(), 4);
        assert_eq!(r.top_n.len(), 2);
        for p in r.ycsb_a.iter().chain(&r.top_n) {
            assert!(p.ops >= 400 && p.ops_per_sec > 0.0, "{p:?}");
            assert!(p.round_trips_p50 >= 1 && p.round_trips_p99 >= p.round_trips_p50);
            assert!(p.model.starts_with("wire model on"));
            assert!(p.mode == "native" || p.mode == "interposer");
            if p.mode == "native" {
                assert_eq!(p.cas_redirected, 0);
            }
        }
        // Caching no key redirects nothing.
        assert_eq!(r.top_n[0].cas_redirected, 0);
        assert_eq!(r.memory[0].keys_cached, 100);
        assert!(r.memory[0].switch_bytes >= 100 * BYTES_PER_KEY);
        assert!(render(&r).iter().all(|l| l.contains("model")));
        assert!(r.model.contains("modelled time"), "{}", r.model);
        // The read-mostly pair: native, then interposed, at 5 % PUTs.
        assert_eq!(r.read_mostly.len(), 2);
        assert_eq!(r.read_mostly[0].mode, "native");
        assert_eq!(r.read_mostly[1].mode, "interposer");
        for p in &r.read_mostly {
            assert_eq!(p.put_fraction, READ_MOSTLY_PUT_FRACTION);
            assert!(p.ops >= 400 && p.round_trips_p99 >= p.round_trips_p50);
        }
        assert!(point_with(&config, 4, None, 1.5).is_err());
    }

    /// The interposer must not feed its own resets. A reset in the measured
    /// phase (as a restarted memory node's connection causes) leaves every
    /// client's cached tail possibly stale; the switch must relearn from
    /// successful CASes and stay quiet. The rule it replaced (take a CAS's
    /// target as the tail at once) vouched for the stale guesses, and each one's
    /// failure reset it again: over a thousand resets in this test.
    #[test]
    fn after_a_reset_in_the_measured_phase_the_interposer_keeps_its_state_and_few_cas_fail() {
        let config = BenchConfig {
            ops_per_point: 20_000,
            ..BenchConfig::default()
        };
        let switch = SwitchConfig {
            keys_max: config.keys,
            ..SwitchConfig::default()
        };
        let Prepared {
            cl,
            clock,
            clients: mut cs,
        } = prepared(&config, 64, switch, true).unwrap();
        // Warm: every client has cached tails, and the switch knows them.
        let mut next = requests(&config, YCSB_A_PUT_FRACTION, 3).unwrap();
        measure(&cl, clock.as_deref(), &mut cs, 5_000, &mut next).unwrap();
        cl.switch.reset();
        let before = cl.switch.stats();
        measure(&cl, clock.as_deref(), &mut cs, 20_000, &mut next).unwrap();
        let after = cl.switch.stats();
        // Measured: 8 with the learning rule, 1,037 with the one it replaced.
        assert!(
            after.resets - before.resets <= 40,
            "the switch reset {} times in 20,000 operations after one reset",
            after.resets - before.resets
        );
        assert!(after.tails_learned > before.tails_learned, "{after:?}");
        assert!(after.cas_redirected > before.cas_redirected, "{after:?}");
        // Relearned: the next 20,000 operations fail a twentieth of the CASes
        // native Clover's clients fail at the same load, or fewer.
        let failed_before: u64 = cs.iter().map(|c| c.stats().cas_failed).sum();
        measure(&cl, clock.as_deref(), &mut cs, 20_000, &mut next).unwrap();
        let failed: u64 = cs.iter().map(|c| c.stats().cas_failed).sum::<u64>() - failed_before;
        let native = point(&config, 64, None).unwrap();
        assert!(
            failed * 20 < native.cas_failed,
            "failed CASes once relearned: interposer {failed} against native {}",
            native.cas_failed
        );
    }

    #[test]
    fn modelled_time_gives_the_same_point_on_every_run_and_wall_time_still_runs() {
        let config = BenchConfig {
            keys: 64,
            ops_per_point: 2_000,
            ..BenchConfig::default()
        };
        let a = point(&config, 16, Some(64)).unwrap();
        let b = point(&config, 16, Some(64)).unwrap();
        assert_eq!(a.ops_per_sec, b.ops_per_sec, "{a:?} {b:?}");
        assert_eq!(
            (a.cas_failed, a.cas_redirected, a.round_trips_p99),
            (b.cas_failed, b.cas_redirected, b.round_trips_p99)
        );
        // At most what the round trips allow: every operation takes at least
        // one round trip of two one-way latencies, and 16 clients run at once.
        let floor_s = 2.0 * config.model.one_way_ns as f64 / 1e9;
        assert!(a.ops_per_sec <= 16.0 / floor_s, "{a:?}");
        let wall = point(
            &BenchConfig {
                timing: Timing::Wall,
                ..config.clone()
            },
            16,
            Some(64),
        )
        .unwrap();
        assert!(
            wall.ops >= 2_000 && wall.model.contains("wall time"),
            "{wall:?}"
        );
    }
}
