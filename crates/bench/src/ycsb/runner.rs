//! `rowankv bench ycsb`: YCSB on a cluster, one run per replication strategy,
//! side by side (seed 000 §6.3). The cluster is in this process (`loopback`,
//! the default) or, with `FabricKind::Tcp`, a CM and the servers as processes
//! on this host over the tcp fabric, the load generators staying here (no media
//! model there: no DLWA; CPU time counts every process; a failover is timed
//! from a client, the CM's events being in its process).
//!
//! Each strategy gets a fresh cluster with the same configuration. Load
//! generators are tasks on the cluster's own executor (so clients and servers
//! share the machine's cores the same way for every strategy); each keeps up to
//! `depth` operations in flight through a pipelined client. A run is: load
//! `records` objects (with a progress bar), reset the counters, run the workload
//! for `seconds`, then report throughput, PUT and GET latency (median, p99, p99.9
//! from fixed-bound histograms: 1 µs to 60 s, 3 significant digits), DLWA per
//! server from the media model over the measured phase, the media's and the
//! cleaners' bytes per operation, the latency distribution of replication
//! ACKs (seed 000 Figure 11), and CPU time per operation (the process's user +
//! system time over the phase, divided by the operations completed — servers
//! and clients together). With `stream_per_client` each client draws its own
//! workload stream; by default all replay one.
//!
//! With `kill_at`, the last server is killed that far into the measured phase
//! (seed 000 §6.5): the run then reports a throughput timeline in 100 ms steps,
//! the failover events (failure detected, configuration stored and committed,
//! shards served again) and how long each took after the kill. With `verify`,
//! every acknowledged PUT is read back at the end: the value must be there at
//! that version or a later one. With `hotspot`, part of the requests shift to
//! one shard from a point of the phase on (Figure 15, driven by `reshard`).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_client::{Client, ClientConfig, ClientError, Op as ClientOp, Output};
use rowankv_deploy::local::{cpu_seconds_of, LocalCluster, LocalSpec};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_fabric::Nic;
use rowankv_pmem::{MediaModelConfig, MediaTiming};
use rowankv_server::{EventKind, Executor, Placement, ServerSettings, Step, Strategy, Task};
use rowankv_types::NodeId;
use rowankv_types::{Clock, SystemClock};
use rowankv_wire::frame::KV_BYTES_MAX;
use serde::Serialize;

use super::workload::{record_key, Generator, KeyDist, Op, SizeDist, Workload};

/// Options of a YCSB run.
#[derive(Clone, Debug)]
pub struct YcsbOptions {
    pub workload: Workload,
    pub keys: KeyDist,
    pub sizes: SizeDist,
    pub records: u64,
    /// Length of the measured phase.
    pub seconds: f64,
    pub servers: usize,
    pub replication_factor: u8,
    pub workers: usize,
    pub shards_per_server: u16,
    pub clients: usize,
    /// Operations in flight per client.
    pub depth: usize,
    pub strategies: Vec<Strategy>,
    /// Media bandwidth per DIMM in bytes per second; `None`: timing off.
    pub media_bandwidth: Option<u64>,
    /// OS threads of the executor.
    pub threads: usize,
    pub pool_bytes: usize,
    pub segment_bytes: usize,
    pub seed: u64,
    pub progress: bool,
    /// Kill the last server this many seconds into the measured phase.
    pub kill_at: Option<f64>,
    /// Server lease (failure detection); `None`: the server default.
    pub lease_ns: Option<u64>,
    /// Read back every acknowledged PUT at the end.
    pub verify: bool,
    /// `loopback` (one process) or `tcp` (a CM and the servers as processes
    /// on this host, the load generators in this one: no media model there,
    /// so no DLWA; CPU time is this process's and theirs).
    pub fabric: FabricKind,
    /// The `rowankv` binary that `tcp` starts (default: this executable).
    pub binary: Option<std::path::PathBuf>,
    /// Figure 15's shift of load ([`Hotspot`]).
    pub hotspot: Option<Arc<Hotspot>>,
    /// The servers' load statistics window; `None`: the server default.
    pub load_window_ns: Option<u64>,
    /// The active CM commits the moves its load detection plans
    /// (`FailoverSettings::reshard_auto`).
    pub reshard_auto: bool,
    /// Every client draws its operations from a generator of its own seed,
    /// as YCSB's client threads do (the sweep's default). Off (the default of
    /// the closed loop, and of every closed-loop result before 2026-12-07):
    /// every client replays the stream of `seed`, so that most writes are
    /// overwritten moments later by another client and the cleaner finds
    /// little live data to copy.
    pub stream_per_client: bool,
    /// Modelled DIMMs per server's medium (seed 000 Figure 13(d): 1 to 3);
    /// with timing on, each writes at `media_bandwidth`.
    pub dimms: usize,
    /// How often each clean role looks for segments below the threshold;
    /// `None`: the server default.
    pub clean_interval_ns: Option<u64>,
    /// The loopback fabric's wire and NIC timing model (`docs/wire-model.md`);
    /// `None` (the default): requests are carried out when posted.
    pub wire_model: Option<rowankv_fabric::WireModel>,
    /// Run the cluster on modelled time with this CPU model
    /// (`docs/cpu-model.md`; loopback only): a modelled core per role,
    /// charged its measured step time minus the emulated NIC's work. The
    /// wire model is then always on (ConnectX-5 figures unless
    /// `wire_model` says otherwise).
    pub cpu_model: Option<rowankv_server::CpuModel>,
}

/// A cumulative distribution from the counts of the servers' latency
/// buckets: `(upper bound µs, fraction of observations ≤ it)` for every
/// bounded bucket up to the one that completes the distribution.
pub fn ack_cdf(counts: &[u64]) -> Vec<(f64, f64)> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut seen = 0u64;
    for (i, &n) in counts
        .iter()
        .enumerate()
        .take(rowankv_server::server::LATENCY_BUCKETS)
    {
        seen += n;
        out.push(((1u64 << i) as f64, seen as f64 / total as f64));
        if seen == total {
            break;
        }
    }
    out
}

/// The smallest bucket bound at or below which `q` of a CDF's observations
/// fall (an upper bound of the quantile; the last bound when none is).
pub fn cdf_quantile_bound(cdf: &[(f64, f64)], q: f64) -> f64 {
    cdf.iter()
        .find(|(_, f)| *f >= q)
        .or(cdf.last())
        .map_or(0.0, |(b, _)| *b)
}

/// The seed of client `c`'s own workload stream, drawn from the run's `seed`.
pub fn client_stream_seed(seed: u64, c: usize) -> u64 {
    seed ^ (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Figure 15's hotspot (seed 000 §6.6): from `at_ns` into the measured
/// phase, a request for a record whose shard the shifted server leads goes,
/// with probability `share`, to a record of the hot shard instead.
pub struct Hotspot {
    pub at_ns: u64,
    pub share: f64,
    /// Per record: whether the shifted server leads its shard.
    pub shifted: Vec<bool>,
    /// The hot shard's records.
    pub hot: Vec<u64>,
}

impl std::fmt::Debug for Hotspot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hotspot")
            .field("at_ns", &self.at_ns)
            .field("share", &self.share)
            .field(
                "shifted_records",
                &self.shifted.iter().filter(|&&s| s).count(),
            )
            .field("hot_records", &self.hot.len())
            .finish()
    }
}

impl Hotspot {
    /// `op`, or its hotspot counterpart `since_ns` into the phase.
    fn apply(&self, op: Op, since_ns: u64, rng: &mut ChaCha8Rng) -> Op {
        if since_ns < self.at_ns || self.hot.is_empty() {
            return op;
        }
        let shift = |record: u64, rng: &mut ChaCha8Rng| {
            if self.shifted.get(record as usize).copied().unwrap_or(false)
                && rng.gen::<f64>() < self.share
            {
                self.hot[rng.gen_range(0..self.hot.len())]
            } else {
                record
            }
        };
        match op {
            Op::Get { record } => Op::Get {
                record: shift(record, rng),
            },
            Op::Put { record, value_len } => Op::Put {
                record: shift(record, rng),
                value_len,
            },
            Op::ReadModifyWrite { record, value_len } => Op::ReadModifyWrite {
                record: shift(record, rng),
                value_len,
            },
            insert @ Op::Insert { .. } => insert,
        }
    }
}

/// Which fabric a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FabricKind {
    Loopback,
    Tcp,
}

impl std::str::FromStr for FabricKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "loopback" => Ok(FabricKind::Loopback),
            "tcp" => Ok(FabricKind::Tcp),
            other => Err(format!("{other:?}: the fabric is loopback or tcp")),
        }
    }
}

/// Media bandwidth per DIMM of the scaled setting (see `docs/results/ycsb.md`):
/// scaled down from Optane's ~2 GB/s by the ratio of the loopback cluster's
/// operation rate to the paper's, so that PM bandwidth binds here as it does in
/// the paper's one-DIMM experiment (Figure 13(d)).
pub const SCALED_MEDIA_BANDWIDTH: u64 = 4_000_000;

impl YcsbOptions {
    /// The small cluster of `--quick` runs (the measured seconds are each
    /// command's own): 20,000 objects, 4 workers per server, 8 clients, 8
    /// shards per server, 512 MiB pools.
    pub fn quick_cluster(&mut self) {
        self.records = 20_000;
        self.workers = 4;
        self.clients = 8;
        self.shards_per_server = 8;
        self.pool_bytes = 512 << 20;
    }
}

impl Default for YcsbOptions {
    /// The paper's setting scaled to this machine.
    fn default() -> Self {
        YcsbOptions {
            workload: Workload::A,
            keys: KeyDist::Zipfian { theta: 0.99 },
            sizes: SizeDist::ZippyDb,
            records: 200_000,
            seconds: 10.0,
            servers: 3,
            replication_factor: 3,
            workers: 48,
            shards_per_server: 48,
            clients: 48,
            depth: 4,
            strategies: vec![Strategy::Rowan],
            media_bandwidth: Some(SCALED_MEDIA_BANDWIDTH),
            threads: 2,
            pool_bytes: 2 << 30,
            segment_bytes: 1 << 20,
            seed: 42,
            progress: true,
            kill_at: None,
            lease_ns: None,
            verify: false,
            fabric: FabricKind::Loopback,
            binary: None,
            hotspot: None,
            load_window_ns: None,
            reshard_auto: false,
            stream_per_client: false,
            dimms: MediaModelConfig::default().dimm_count,
            clean_interval_ns: None,
            wire_model: None,
            cpu_model: None,
        }
    }
}

/// The result of one strategy's run.
#[derive(Clone, Debug, Serialize)]
pub struct YcsbResult {
    pub strategy: String,
    pub workload: String,
    pub sizes: String,
    pub servers: usize,
    pub replication_factor: u8,
    pub workers: usize,
    pub clients: usize,
    pub records: u64,
    pub seconds: f64,
    pub ops: u64,
    pub ops_per_sec: f64,
    pub puts: u64,
    pub gets: u64,
    pub put_p50_us: f64,
    pub put_p99_us: f64,
    pub put_p999_us: f64,
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub get_p999_us: f64,
    pub dlwa_per_server: Vec<f64>,
    pub dlwa_max: f64,
    /// Bytes written to the media models (all servers) per completed
    /// operation, as requested by the stores (log appends, replicas, the
    /// cleaner's copies)…
    pub request_bytes_per_op: f64,
    /// …and as the modelled DIMMs wrote them (XPLines, read-modify-writes).
    pub media_bytes_per_op: f64,
    /// Bytes the servers' cleaners copied per completed operation (part of
    /// `request_bytes_per_op`; 0 on `tcp`, whose servers are not in this process).
    pub cleaner_bytes_per_op: f64,
    /// Replication writes acknowledged durable by a backup in the measured
    /// phase (seed 000 Figure 11's "remote persistence"), all servers.
    pub replication_acks: u64,
    /// Their latency, from the primary's worker sending one to one backup to
    /// the worker taking its durable ACK: `(bound µs, fraction ≤ bound)` at the
    /// servers' histogram bounds (1 µs · 2^i), exact at each bound. Empty on
    /// `tcp` (the servers are in other processes).
    pub replication_ack_cdf: Vec<(f64, f64)>,
    pub cpu_us_per_op: f64,
    pub errors: u64,
    pub timeouts: u64,
    pub load_seconds: f64,
    pub media_timing: bool,
    /// Media write bandwidth per DIMM of the timing mode, when `media_timing` is on.
    pub media_write_bytes_per_sec_per_dimm: Option<u64>,
    /// Operations completed per 100 ms of the measured phase.
    pub timeline: Vec<u64>,
    /// Failover events, ms into the measured phase.
    pub events: Vec<TimedEvent>,
    pub failover: Option<FailoverTimes>,
    /// Acknowledged PUTs read back (keys), and those missing or older.
    pub verified_keys: u64,
    pub lost_writes: u64,
    /// `loopback` or `tcp`.
    pub fabric: FabricKind,
}

/// An event of the failover timeline.
#[derive(Clone, Debug, Serialize)]
pub struct TimedEvent {
    pub at_ms: f64,
    pub what: String,
}

/// How long failover took after the kill (ms).
#[derive(Clone, Debug, Serialize)]
pub struct FailoverTimes {
    pub killed: u32,
    pub kill_at_ms: f64,
    /// Until the CM found the lease expired.
    pub detected_ms: Option<f64>,
    /// Until the new configuration was in the coordination store.
    pub stored_ms: Option<f64>,
    /// Until every server had it and the failed lease had expired (commit).
    pub committed_ms: Option<f64>,
    /// Until every shard the failed server was primary of was served again.
    pub all_served_ms: Option<f64>,
    pub shards_promoted: usize,
    /// Live servers evicted because their renewals were late: any other server
    /// whose lease expired, and the killed one if its lease expired before the
    /// kill.
    pub others_failed: Vec<u32>,
}

/// Buckets of the throughput timeline ([`YcsbResult::timeline`]).
pub const TIMELINE_STEP_NS: u64 = 100_000_000;

const PHASE_LOAD: u8 = 0;
const PHASE_WAIT: u8 = 1;
pub(super) const PHASE_RUN: u8 = 2;
pub(super) const PHASE_STOP: u8 = 3;

pub(super) struct Counters {
    pub(super) ops: AtomicU64,
    puts: AtomicU64,
    gets: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) timeouts: AtomicU64,
    loaded: AtomicU64,
    load_clients_done: AtomicU64,
    /// Start of the measured phase on the cluster's clock.
    pub(super) run_start_ns: AtomicU64,
    pub(super) timeline: Vec<AtomicU64>,
    /// Clients that handed in their histograms (and acknowledged versions).
    handed_in: AtomicU64,
}

impl Counters {
    fn new(buckets: usize) -> Counters {
        Counters {
            ops: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            gets: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            loaded: AtomicU64::new(0),
            load_clients_done: AtomicU64::new(0),
            run_start_ns: AtomicU64::new(0),
            timeline: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            handed_in: AtomicU64::new(0),
        }
    }
}

struct Histograms {
    put: Histogram<u64>,
    get: Histogram<u64>,
}

pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// What an operation in flight is.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Get,
    Put {
        record: u64,
    },
    /// F: the GET half of a read-modify-write; the PUT follows.
    RmwGet {
        record: u64,
        value_len: usize,
    },
}

/// A load generator: one pipelined client.
struct LoadClient<N: Nic> {
    client: Client<N>,
    /// What keeps a process client attached (its fabric node and directory).
    _keep: Option<Box<dyn std::any::Any + Send>>,
    p: LoadParts,
    local: Histograms,
    inflight: std::collections::HashMap<u64, Kind>,
    done: Vec<rowankv_client::Completed>,
    loading_done: bool,
    load_reported: bool,
}

/// Scratch space and the value generator of one load generator: what turns a
/// workload [`Op`] into a client request.
pub(super) struct Requests {
    sizes: SizeDist,
    max_value: usize,
    /// Fills values (random bytes, so that nothing compresses or dedups).
    rng: ChaCha8Rng,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl Requests {
    pub(super) fn new(sizes: SizeDist, max_value: usize, rng: ChaCha8Rng) -> Requests {
        Requests {
            sizes,
            max_value,
            rng,
            key: Vec::new(),
            value: Vec::new(),
        }
    }

    /// The request of `op`, and what to remember about it until it completes.
    pub(super) fn request(&mut self, op: Op) -> (ClientOp, Kind) {
        let key_bytes = self.sizes.key_bytes();
        match op {
            Op::Get { record } => {
                record_key(record, key_bytes, &mut self.key);
                (
                    ClientOp::Get {
                        key: self.key.clone(),
                    },
                    Kind::Get,
                )
            }
            Op::Put { record, value_len } | Op::Insert { record, value_len } => {
                record_key(record, key_bytes, &mut self.key);
                self.fill_value(value_len);
                (
                    ClientOp::Put {
                        expires_at_ms: None,
                        key: self.key.clone(),
                        value: self.value.clone(),
                    },
                    Kind::Put { record },
                )
            }
            Op::ReadModifyWrite { record, value_len } => {
                record_key(record, key_bytes, &mut self.key);
                (
                    ClientOp::Get {
                        key: self.key.clone(),
                    },
                    Kind::RmwGet { record, value_len },
                )
            }
        }
    }

    fn fill_value(&mut self, len: usize) {
        let len = len.min(self.max_value);
        self.value.clear();
        self.value.resize(len, 0);
        self.rng.fill(&mut self.value[..]);
    }
}

impl<N: Nic> LoadClient<N> {
    fn submit(&mut self, op: Op) -> bool {
        let (cop, kind) = self.p.requests.request(op);
        match self.client.submit(cop) {
            Ok(id) => {
                self.inflight.insert(id.0, kind);
                true
            }
            Err(_) => {
                self.p.counters.errors.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

impl<N: Nic> Task for LoadClient<N> {
    fn name(&self) -> &str {
        &self.p.name
    }

    fn step(&mut self, now_ns: u64) -> Step {
        let phase = self.p.phase.load(Ordering::Acquire);
        if phase == PHASE_STOP {
            let mut h = self.p.hist.lock();
            let _ = h.put.add(&self.local.put);
            let _ = h.get.add(&self.local.get);
            if let Some(acked) = self.p.acked.take() {
                let mut out = self.p.acked_out.lock();
                for (r, v) in acked {
                    let e = out.entry(r).or_insert(0);
                    *e = (*e).max(v);
                }
            }
            self.p.counters.handed_in.fetch_add(1, Ordering::Release);
            return Step::Done;
        }
        let mut did = false;
        self.done.clear();
        let mut done = std::mem::take(&mut self.done);
        if self.client.poll(&mut done) > 0 {
            did = true;
        }
        for c in &done {
            let Some(kind) = self.inflight.remove(&c.id.0) else {
                continue;
            };
            let us = (c.latency.as_nanos() / 1000).max(1) as u64;
            let measuring = phase == PHASE_RUN;
            if let (Ok(Output::Written { version }), Kind::Put { record }, Some(acked)) =
                (&c.result, kind, self.p.acked.as_mut())
            {
                let e = acked.entry(record).or_insert(0);
                *e = (*e).max(*version);
            }
            match (&c.result, kind) {
                (Ok(_), Kind::Put { .. })
                | (Err(ClientError::NotFound), Kind::Get)
                | (Ok(_), Kind::Get) => {
                    if measuring {
                        self.p.counters.ops.fetch_add(1, Ordering::Relaxed);
                        let start = self.p.counters.run_start_ns.load(Ordering::Relaxed);
                        let b = (now_ns.saturating_sub(start) / TIMELINE_STEP_NS) as usize;
                        if let Some(slot) = self.p.counters.timeline.get(b) {
                            slot.fetch_add(1, Ordering::Relaxed);
                        }
                        if matches!(kind, Kind::Put { .. }) {
                            self.p.counters.puts.fetch_add(1, Ordering::Relaxed);
                            let _ = self.local.put.record(us);
                        } else {
                            self.p.counters.gets.fetch_add(1, Ordering::Relaxed);
                            let _ = self.local.get.record(us);
                        }
                    } else if phase == PHASE_LOAD && matches!(kind, Kind::Put { .. }) {
                        self.p.counters.loaded.fetch_add(1, Ordering::Relaxed);
                    }
                }
                (
                    Ok(Output::Value { .. }) | Err(ClientError::NotFound),
                    Kind::RmwGet { record, value_len },
                ) => {
                    if measuring {
                        self.p.counters.gets.fetch_add(1, Ordering::Relaxed);
                        self.p.counters.ops.fetch_add(1, Ordering::Relaxed);
                        let _ = self.local.get.record(us);
                    }
                    self.submit(Op::Put { record, value_len });
                }
                (Err(e), _) if e.is_unknown() => {
                    self.p.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    self.p.counters.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.done = done;
        match phase {
            PHASE_LOAD => {
                while !self.loading_done && self.client.inflight() < self.p.depth {
                    match self.p.gen.load_op() {
                        Some(op) => {
                            did |= self.submit(op);
                        }
                        None => {
                            self.loading_done = true;
                        }
                    }
                }
                if self.loading_done && !self.load_reported && self.client.inflight() == 0 {
                    self.load_reported = true;
                    self.p
                        .counters
                        .load_clients_done
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            PHASE_RUN => {
                while self.client.inflight() < self.p.depth {
                    let mut op = self.p.gen.next_op();
                    if let Some(h) = &self.p.hotspot {
                        let start = self.p.counters.run_start_ns.load(Ordering::Relaxed);
                        op = h.apply(op, now_ns.saturating_sub(start), &mut self.p.requests.rng);
                    }
                    if !self.submit(op) {
                        break;
                    }
                    did = true;
                }
            }
            _ => {}
        }
        if did {
            Step::Worked
        } else {
            Step::Idle
        }
    }
}

/// This process's CPU time (user + system), seconds.
fn cpu_seconds() -> f64 {
    cpu_seconds_of(std::process::id()).unwrap_or(0.0)
}

/// Where a run's servers are: in this process, or processes on this host.
pub(super) enum Target {
    Loopback(Box<Cluster>),
    Tcp(Box<TcpTarget>),
}

pub(super) struct TcpTarget {
    local: LocalCluster,
    executor: Option<Executor>,
    clock: Arc<dyn Clock>,
    _dir: tempfile::TempDir,
}

impl Target {
    pub(super) fn start(opts: &YcsbOptions, strategy: Strategy) -> Result<Target, String> {
        let total_shards = opts.shards_per_server as usize * opts.servers;
        if opts.fabric == FabricKind::Tcp && opts.cpu_model.is_some() {
            return Err(
                "the CPU model runs a cluster in one process: it needs the loopback fabric".into(),
            );
        }
        if opts.cpu_model.is_some() && opts.media_bandwidth.is_some() {
            // The NIC's writes to PM would be timed by whoever moved them
            // (docs/cpu-model.md): not faithful yet.
            return Err("the CPU model runs with media timing off (--no-media-timing): on modelled time \
                        the media model does not yet share a DIMM fairly between steps and the NIC's writes".into());
        }
        if opts.fabric == FabricKind::Tcp {
            let binary = match &opts.binary {
                Some(b) => b.clone(),
                None => std::env::current_exe().map_err(|e| e.to_string())?,
            };
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            if std::env::var_os("ROWANKV_KEEP_LOGS").is_some() {
                eprintln!(
                    "tcp cluster files and logs kept in {}",
                    dir.path().display()
                );
            }
            let local = LocalCluster::start(LocalSpec {
                binary,
                dir: dir.path().to_path_buf(),
                cluster_id: 0x7c90_0000_0000_0001 | rand::random::<u32>() as u64,
                servers: opts.servers,
                shards_per_server: opts.shards_per_server,
                replication_factor: opts.replication_factor,
                strategy: strategy.name().to_string(),
                workers: opts.workers as u16,
                pool_bytes: opts.pool_bytes as u64,
                segment_bytes: opts.segment_bytes as u64,
                lease_ms: opts.lease_ns.map_or(200, |l| (l / 1_000_000).max(5)),
            })
            .map_err(|e| e.to_string())?;
            let clock: Arc<dyn Clock> = SystemClock::new();
            let executor = Executor::new(
                Placement::Shared {
                    threads: opts.threads,
                },
                clock.clone(),
            );
            return Ok(Target::Tcp(Box::new(TcpTarget {
                local,
                executor: Some(executor),
                clock,
                _dir: dir,
            })));
        }
        let media = MediaModelConfig {
            timing: opts.media_bandwidth.map(|b| MediaTiming {
                media_write_bytes_per_sec_per_dimm: b,
            }),
            dimm_count: opts.dimms,
            ..MediaModelConfig::default()
        };
        Cluster::start(ClusterConfig {
            servers: opts.servers,
            shards_per_server: opts.shards_per_server,
            replication_factor: opts.replication_factor,
            strategy,
            settings: {
                let mut s = ServerSettings {
                    workers: opts.workers,
                    ..ServerSettings::default()
                };
                if let Some(lease) = opts.lease_ns {
                    s.failover.lease_ns = lease;
                    s.failover.renew_ns = (lease / 10).max(1_000_000);
                    s.failover.cm_lease_ns = 4 * lease;
                }
                if let Some(w) = opts.load_window_ns {
                    s.load_window_ns = w;
                }
                s.failover.reshard_auto = opts.reshard_auto;
                if let Some(c) = opts.clean_interval_ns {
                    s.clean_interval_ns = c;
                }
                s
            },
            pool_bytes: opts.pool_bytes,
            segment_bytes: opts.segment_bytes,
            media_model: Some(media),
            placement: match opts.cpu_model {
                Some(m) => Placement::Modelled(m),
                None => Placement::Shared {
                    threads: opts.threads,
                },
            },
            keys_per_shard_expected: (opts.records as usize * 2 / total_shards).max(1024),
            wire_model: match opts.cpu_model {
                Some(_) => Some(
                    opts.wire_model
                        .unwrap_or(rowankv_fabric::WireModel::CONNECTX5),
                ),
                None => opts.wire_model,
            },
            ..ClusterConfig::default()
        })
        .map(|c| Target::Loopback(Box::new(c)))
        .map_err(|e| e.to_string())
    }

    pub(super) fn clock(&self) -> Arc<dyn Clock> {
        match self {
            Target::Loopback(c) => c.clock().clone(),
            Target::Tcp(t) => t.clock.clone(),
        }
    }

    /// A load generator with a new client, on the cluster's executor (`tcp`:
    /// on this process's).
    pub(super) fn spawn_client(
        &mut self,
        config: ClientConfig,
        parts: impl ClientTask,
    ) -> Result<(), String> {
        match self {
            Target::Loopback(cluster) => {
                let nic = cluster.attach_client().map_err(|e| e.to_string())?;
                let client = Client::connect(
                    nic,
                    cluster.directory().clone(),
                    cluster.config_source(),
                    config,
                )
                .map_err(|e| e.to_string())?;
                cluster.spawn(parts.with_client(client, None));
            }
            Target::Tcp(t) => {
                let l = &t.local;
                let remote = rowankv_deploy::client::connect(
                    l.spec.cluster_id,
                    &l.secret,
                    std::slice::from_ref(&l.cm),
                    config,
                )
                .map_err(|e| e.to_string())?;
                let keep: Box<dyn std::any::Any + Send> = Box::new((remote.net, remote.source));
                if let Some(ex) = &mut t.executor {
                    ex.spawn(parts.with_client(remote.client, Some(keep)));
                }
            }
        }
        Ok(())
    }

    fn flush_media(&self) {
        if let Target::Loopback(c) = self {
            c.flush_media();
        }
    }

    /// Media counters per server (none for servers in other processes).
    /// The servers' replication-ACK histograms summed, bucket by bucket
    /// (empty on `tcp`).
    fn replication_ack_buckets(&self) -> Vec<u64> {
        match self {
            Target::Loopback(c) => {
                let mut sum = vec![0u64; rowankv_server::server::LATENCY_BUCKETS + 1];
                for s in c.servers() {
                    let (buckets, _) = s.stats.replication_ack.snapshot();
                    for (acc, (_, n)) in sum.iter_mut().zip(buckets) {
                        *acc += n;
                    }
                }
                sum
            }
            Target::Tcp(_) => Vec::new(),
        }
    }

    /// Bytes the servers' cleaners have copied so far (0 on `tcp`).
    fn cleaner_bytes_moved(&self) -> u64 {
        match self {
            Target::Loopback(c) => c
                .servers()
                .iter()
                .map(|s| s.stats.cleaner_bytes_moved.load(Ordering::Relaxed))
                .sum(),
            Target::Tcp(_) => 0,
        }
    }

    fn media_stats(&self) -> Vec<Option<rowankv_pmem::MediaStats>> {
        match self {
            Target::Loopback(c) => c.media_stats(),
            Target::Tcp(t) => vec![None; t.local.spec.servers],
        }
    }

    /// CPU seconds used so far by this process and the servers' (and CM's).
    fn cpu_seconds(&self) -> f64 {
        match self {
            Target::Loopback(_) => cpu_seconds(),
            Target::Tcp(t) => {
                cpu_seconds()
                    + t.local
                        .pids()
                        .into_iter()
                        .filter_map(cpu_seconds_of)
                        .sum::<f64>()
            }
        }
    }

    fn members(&self) -> usize {
        match self {
            Target::Loopback(c) => c.cm().current().members.len(),
            Target::Tcp(t) => t.local.config().map_or(0, |c| c.members.len()),
        }
    }

    pub(super) fn shutdown(self) {
        match self {
            Target::Loopback(c) => c.shutdown(),
            Target::Tcp(mut t) => {
                if let Some(ex) = t.executor.take() {
                    ex.stop();
                }
                drop(t.local);
                if std::env::var_os("ROWANKV_KEEP_LOGS").is_some() {
                    let _ = t._dir.keep();
                }
            }
        }
    }
}

/// Everything of a load generator but its client.
struct LoadParts {
    name: String,
    gen: Generator,
    requests: Requests,
    depth: usize,
    phase: Arc<AtomicU8>,
    counters: Arc<Counters>,
    hist: Arc<Mutex<Histograms>>,
    /// With `verify`: the highest acknowledged version of each record written.
    acked: Option<std::collections::HashMap<u64, u64>>,
    acked_out: Arc<Mutex<std::collections::HashMap<u64, u64>>>,
    hotspot: Option<Arc<Hotspot>>,
}

/// A load generator waiting for its client: [`Target::spawn_client`] connects
/// one (its type depends on the fabric) and runs the task it makes.
pub(super) trait ClientTask {
    fn with_client<N: Nic>(
        self,
        client: Client<N>,
        keep: Option<Box<dyn std::any::Any + Send>>,
    ) -> Box<dyn Task>;
}

impl ClientTask for LoadParts {
    fn with_client<N: Nic>(
        self,
        client: Client<N>,
        keep: Option<Box<dyn std::any::Any + Send>>,
    ) -> Box<dyn Task> {
        Box::new(LoadClient {
            client,
            _keep: keep,
            p: self,
            local: Histograms {
                put: histogram(),
                get: histogram(),
            },
            inflight: Default::default(),
            done: Vec::new(),
            loading_done: false,
            load_reported: false,
        })
    }
}

/// Run every strategy of `opts` and return one result each.
pub fn run(opts: &YcsbOptions) -> Result<Vec<YcsbResult>, String> {
    if opts.cpu_model.is_some() {
        // Its windows are measured in real time (the sweep's are on the
        // cluster's clock).
        return Err("the CPU model is for the open-loop sweep (--sweep): the closed loop measures real time".into());
    }
    let mut results = Vec::new();
    for &strategy in &opts.strategies {
        results.push(run_one(opts, strategy)?);
    }
    Ok(results)
}

/// The closed-loop load generators of a run and what they share with the
/// harness.
pub(super) struct LoadGenerators {
    pub(super) phase: Arc<AtomicU8>,
    pub(super) counters: Arc<Counters>,
    hist: Arc<Mutex<Histograms>>,
    pub(super) acked_out: Arc<Mutex<std::collections::HashMap<u64, u64>>>,
    clients: usize,
}

impl LoadGenerators {
    /// Start `opts.clients` generators on `target`, each keeping up to
    /// `opts.depth` operations in flight; they wait for [`LoadGenerators::load`].
    /// `buckets`: steps of the throughput timeline.
    pub(super) fn spawn(
        target: &mut Target,
        opts: &YcsbOptions,
        buckets: usize,
    ) -> Result<LoadGenerators, String> {
        let g = LoadGenerators {
            phase: Arc::new(AtomicU8::new(PHASE_WAIT)),
            counters: Arc::new(Counters::new(buckets)),
            hist: Arc::new(Mutex::new(Histograms {
                put: histogram(),
                get: histogram(),
            })),
            acked_out: Arc::new(Mutex::new(std::collections::HashMap::new())),
            clients: opts.clients,
        };
        let max_value = max_value_bytes(opts.sizes);
        for c in 0..opts.clients {
            let config = ClientConfig {
                worker_hint: c,
                inflight_max: opts.depth,
                timeout: Duration::from_secs(10),
                // The cluster's clock: modelled time on the CPU model.
                clock: target.clock(),
                ..ClientConfig::default()
            };
            let gen = Generator::new(
                opts.workload,
                opts.keys,
                opts.sizes,
                opts.records,
                max_value,
                if opts.stream_per_client {
                    client_stream_seed(opts.seed, c)
                } else {
                    opts.seed
                },
            )
            .with_client(c as u64, opts.clients as u64);
            let parts = LoadParts {
                name: format!("client-{c}"),
                gen,
                requests: Requests::new(
                    opts.sizes,
                    max_value,
                    ChaCha8Rng::seed_from_u64(opts.seed ^ (c as u64).wrapping_mul(0x9e37_79b9)),
                ),
                depth: opts.depth,
                phase: g.phase.clone(),
                counters: g.counters.clone(),
                hist: g.hist.clone(),
                acked: opts.verify.then(std::collections::HashMap::new),
                acked_out: g.acked_out.clone(),
                hotspot: opts.hotspot.clone(),
            };
            target.spawn_client(config, parts)?;
        }
        Ok(g)
    }

    /// Load `opts.records` objects (with a progress bar if `opts.progress`);
    /// the seconds it took.
    pub(super) fn load(&self, opts: &YcsbOptions, strategy: Strategy) -> Result<f64, String> {
        let load_start = Instant::now();
        let bar = opts.progress.then(|| {
            let b = indicatif::ProgressBar::new(opts.records);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "  load {prefix:>6} [{bar:30}] {pos}/{len} {per_sec}",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            b.set_prefix(strategy.name());
            b
        });
        self.phase.store(PHASE_LOAD, Ordering::Release);
        while self.counters.load_clients_done.load(Ordering::Relaxed) < self.clients as u64 {
            std::thread::sleep(Duration::from_millis(50));
            if let Some(b) = &bar {
                b.set_position(self.counters.loaded.load(Ordering::Relaxed));
            }
            if load_start.elapsed() > Duration::from_secs(LOAD_SECONDS_MAX) {
                return Err(format!(
                    "{strategy}: load did not finish in {LOAD_SECONDS_MAX} s"
                ));
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        Ok(load_start.elapsed().as_secs_f64())
    }

    /// Stop the generators and let them hand in what they measured.
    pub(super) fn stop(&self) {
        self.phase.store(PHASE_STOP, Ordering::Release);
        wait_for_hand_in(&self.counters, self.clients);
    }
}

/// How long loading may take before the run is abandoned.
const LOAD_SECONDS_MAX: u64 = 600;

/// The longest value a request may carry: a frame holds the key and the value.
pub(super) fn max_value_bytes(sizes: SizeDist) -> usize {
    KV_BYTES_MAX - sizes.key_bytes()
}

fn run_one(opts: &YcsbOptions, strategy: Strategy) -> Result<YcsbResult, String> {
    let mut target = Target::start(opts, strategy)?;
    let buckets = (opts.seconds * 1e9 / TIMELINE_STEP_NS as f64).ceil() as usize + 10;
    let generators = LoadGenerators::spawn(&mut target, opts, buckets)?;
    let load_seconds = generators.load(opts, strategy)?;
    let LoadGenerators {
        phase,
        counters,
        hist,
        acked_out,
        ..
    } = generators;

    // Measure.
    target.flush_media();
    let media_before = target.media_stats();
    let cleaned_before = target.cleaner_bytes_moved();
    let acks_before = target.replication_ack_buckets();
    let errors_before = counters.errors.load(Ordering::Relaxed);
    let cpu_before = target.cpu_seconds();
    let start = Instant::now();
    let clock = target.clock();
    let run_start_ns = clock.now_ns();
    counters.run_start_ns.store(run_start_ns, Ordering::Relaxed);
    phase.store(PHASE_RUN, Ordering::Release);
    let mut kill = None;
    let mut tcp_watch = None;
    if let Some(at) = opts.kill_at.filter(|&a| a < opts.seconds) {
        std::thread::sleep(Duration::from_secs_f64(at));
        let victim = opts.servers - 1;
        let members = target.members();
        if members < 2 {
            phase.store(PHASE_STOP, Ordering::Release);
            wait_for_hand_in(&counters, opts.clients);
            target.shutdown();
            return Err(format!(
                "run spoiled: live servers were evicted before the kill (their leases \
                 were renewed late), {members} server left, nothing to fail over to; \
                 a longer --lease-ms tolerates longer stalls of this machine"
            ));
        }
        let kill_ns = clock.now_ns();
        match &mut target {
            Target::Loopback(cluster) => {
                kill = Some((victim, kill_ns));
                cluster.kill_server(victim);
            }
            Target::Tcp(t) => {
                let before = t.local.config().map_err(|e| e.to_string())?;
                let kill_ns = clock.now_ns();
                let killed = t.local.kill_server(victim);
                kill = Some((victim, kill_ns));
                tcp_watch = Some(watch_tcp_failover(&t.local, before, killed)?);
            }
        }
        std::thread::sleep(Duration::from_secs_f64(opts.seconds - at));
    } else {
        std::thread::sleep(Duration::from_secs_f64(opts.seconds));
    }
    let ops = counters.ops.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = target.cpu_seconds() - cpu_before;
    phase.store(PHASE_STOP, Ordering::Release);
    target.flush_media();
    let media_after = target.media_stats();
    let cleaned = target.cleaner_bytes_moved().saturating_sub(cleaned_before);
    let acks: Vec<u64> = target
        .replication_ack_buckets()
        .iter()
        .zip(&acks_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    wait_for_hand_in(&counters, opts.clients);
    let acked = std::mem::take(&mut *acked_out.lock());
    let (verified_keys, lost_writes, events, failover) = match &mut target {
        Target::Loopback(cluster) => {
            let checked = if opts.verify {
                read_back(cluster, opts.sizes.key_bytes(), &acked).map_err(|e| {
                    // What the cluster went through explains a failed read-back.
                    let events: Vec<String> = timed_events(cluster, run_start_ns)
                        .iter()
                        .map(|ev| format!("{:.1} ms: {}", ev.at_ms, ev.what))
                        .collect();
                    let killed = kill.map_or(String::new(), |(v, at)| {
                        format!(
                            "; s{v} killed at {:.1} ms",
                            at.saturating_sub(run_start_ns) as f64 / 1e6
                        )
                    });
                    format!(
                        "reading back the acknowledged writes: {e}{killed}; events since the start of the phase: [{}]",
                        events.join("; ")
                    )
                })?
            } else {
                (0, 0)
            };
            let events = timed_events(cluster, run_start_ns);
            let failover =
                kill.map(|(victim, at)| failover_times(cluster, victim, at, run_start_ns));
            (checked.0, checked.1, events, failover)
        }
        Target::Tcp(t) => {
            let checked = if opts.verify {
                let l = &t.local;
                let mut remote = rowankv_deploy::client::connect(
                    l.spec.cluster_id,
                    &l.secret,
                    std::slice::from_ref(&l.cm),
                    read_back_config(),
                )
                .map_err(|e| e.to_string())?;
                read_back_with(&mut remote.client, opts.sizes.key_bytes(), &acked)
                    .map_err(|e| format!("reading back the acknowledged writes: {e}"))?
            } else {
                (0, 0)
            };
            let failover = match (tcp_watch, kill) {
                (Some(w), Some((_, at))) => {
                    let mut f = w.join().map_err(|_| "the failover watcher panicked")?;
                    f.kill_at_ms = (at - run_start_ns) as f64 / 1e6;
                    Some(f)
                }
                _ => None,
            };
            (checked.0, checked.1, Vec::new(), failover)
        }
    };
    let timeline: Vec<u64> = counters
        .timeline
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .take((opts.seconds * 1e9 / TIMELINE_STEP_NS as f64).ceil() as usize)
        .collect();
    target.shutdown();

    let dlwa_per_server: Vec<f64> = media_after
        .iter()
        .zip(&media_before)
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => a.delta(b).dlwa(),
            _ => 0.0,
        })
        .collect();
    let dlwa_max = dlwa_per_server.iter().copied().fold(0.0, f64::max);
    let (request_bytes, media_bytes) = media_after
        .iter()
        .zip(&media_before)
        .filter_map(|(a, b)| Some(a.as_ref()?.delta(b.as_ref()?)))
        .fold((0u64, 0u64), |(r, m), d| {
            (r + d.request_bytes, m + d.media_bytes)
        });
    let h = hist.lock();
    let q = |h: &Histogram<u64>, p: f64| {
        if h.is_empty() {
            0.0
        } else {
            h.value_at_quantile(p) as f64
        }
    };
    Ok(YcsbResult {
        strategy: strategy.name().to_string(),
        workload: opts.workload.to_string(),
        sizes: format!("{:?}", opts.sizes).to_lowercase(),
        servers: opts.servers,
        replication_factor: opts.replication_factor,
        workers: opts.workers,
        clients: opts.clients,
        records: opts.records,
        seconds: elapsed,
        ops,
        ops_per_sec: ops as f64 / elapsed,
        puts: counters.puts.load(Ordering::Relaxed),
        gets: counters.gets.load(Ordering::Relaxed),
        put_p50_us: q(&h.put, 0.5),
        put_p99_us: q(&h.put, 0.99),
        put_p999_us: q(&h.put, 0.999),
        get_p50_us: q(&h.get, 0.5),
        get_p99_us: q(&h.get, 0.99),
        get_p999_us: q(&h.get, 0.999),
        dlwa_per_server,
        dlwa_max,
        request_bytes_per_op: request_bytes as f64 / ops.max(1) as f64,
        media_bytes_per_op: media_bytes as f64 / ops.max(1) as f64,
        cleaner_bytes_per_op: cleaned as f64 / ops.max(1) as f64,
        replication_acks: acks.iter().sum(),
        replication_ack_cdf: ack_cdf(&acks),
        cpu_us_per_op: if ops > 0 { cpu * 1e6 / ops as f64 } else { 0.0 },
        errors: counters.errors.load(Ordering::Relaxed) - errors_before,
        timeouts: counters.timeouts.load(Ordering::Relaxed),
        load_seconds,
        media_timing: opts.media_bandwidth.is_some(),
        media_write_bytes_per_sec_per_dimm: opts.media_bandwidth,
        timeline,
        events,
        failover,
        verified_keys,
        lost_writes,
        fabric: opts.fabric,
    })
}

/// Let the clients hand in their histograms (they stop at `PHASE_STOP`).
pub(super) fn wait_for_hand_in(counters: &Counters, clients: usize) {
    let hand_in = Instant::now();
    while counters.handed_in.load(Ordering::Acquire) < clients as u64
        && hand_in.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The cluster's events since `run_start_ns`, in ms from it.
pub(super) fn timed_events(cluster: &Cluster, run_start_ns: u64) -> Vec<TimedEvent> {
    cluster
        .events()
        .snapshot()
        .into_iter()
        .filter(|e| e.at_ns >= run_start_ns)
        .map(|e| TimedEvent {
            at_ms: e.at_ns.saturating_sub(run_start_ns) as f64 / 1e6,
            what: describe(&e.kind),
        })
        .collect()
}

fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::CmActive { cm, term } => format!("CM {cm} active at {term}"),
        EventKind::ServerFailed { node } => format!("lease of {node} expired: failed"),
        EventKind::ConfigStored { term } => format!("configuration {term} stored"),
        EventKind::ConfigCommitted { term } => format!("configuration {term} committed"),
        EventKind::ShardServed { node, shard, term } => {
            format!("{shard} served by {node} at {term}")
        }
        EventKind::ReplicaCopied { shard, to, entries } => {
            format!("{shard} copied to {to} ({entries} entries)")
        }
        EventKind::MigrationServed { shard, from, to } => {
            format!("{shard} served by {to}, migrating from {from}")
        }
        EventKind::MigrationFinished { shard, from, to } => {
            format!("migration of {shard} from {from} to {to} finished")
        }
        EventKind::MigrationCopied { shard, to, entries } => {
            format!("{shard} migrated to {to} ({entries} entries copied)")
        }
        EventKind::Overloaded {
            node,
            load_per_s,
            average_per_s,
            shard,
            to,
        } => format!(
            "{node} overloaded ({load_per_s}/s, average {average_per_s}/s): {shard} would move to {to}"
        ),
    }
}

/// Over `tcp` the CM's events are in its process: a thread watches from the
/// outside instead, from the kill on. It reads the configuration from the CM
/// every 5 ms until a term without one of `before`'s members is there (the
/// failover committed, as a client sees it), then reads a key of every shard
/// whose primary changed until each is served (found or not found, not
/// refused). Times are from `killed`.
fn watch_tcp_failover(
    local: &LocalCluster,
    before: Arc<rowankv_wire::config::Config>,
    killed: Instant,
) -> Result<std::thread::JoinHandle<FailoverTimes>, String> {
    use rowankv_wire::config::ConfigSource;
    let (net, source) = local.source().map_err(|e| e.to_string())?;
    let reach = (
        local.spec.cluster_id,
        local.secret.clone(),
        local.cm.clone(),
    );
    Ok(std::thread::spawn(move || {
        let _net = net;
        let ms = |t: Instant| t.duration_since(killed).as_secs_f64() * 1e3;
        let mut times = FailoverTimes {
            killed: 0,
            kill_at_ms: 0.0,
            detected_ms: None,
            stored_ms: None,
            committed_ms: None,
            all_served_ms: None,
            shards_promoted: 0,
            others_failed: Vec::new(),
        };
        let deadline = killed + Duration::from_secs(30);
        let after = loop {
            if Instant::now() > deadline {
                return times;
            }
            if let Ok(c) = source.fetch() {
                if c.term > before.term && c.members.len() < before.members.len() {
                    times.committed_ms = Some(ms(Instant::now()));
                    break c;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Some(gone) = before
            .members
            .iter()
            .find(|m| after.member(m.node).is_none())
        {
            times.killed = gone.node.0;
        }
        // A key of every shard whose primary changed.
        let moved: Vec<_> = after
            .shards
            .iter()
            .filter(|s| before.shard(s.shard).map(|b| b.primary) != Some(s.primary))
            .map(|s| s.shard)
            .collect();
        times.shards_promoted = moved.len();
        let mut probes = Vec::new();
        for i in 0u64.. {
            if probes.len() == moved.len() || i > 1_000_000 {
                break;
            }
            let key = format!("failover-probe-{i}").into_bytes();
            let shard = after.shard_for_key(&key).shard;
            if moved.contains(&shard) && !probes.iter().any(|(s, _)| *s == shard) {
                probes.push((shard, key));
            }
        }
        let Ok(mut remote) = rowankv_deploy::client::connect(
            reach.0,
            &reach.1,
            std::slice::from_ref(&reach.2),
            ClientConfig {
                timeout: Duration::from_secs(10),
                ..ClientConfig::default()
            },
        ) else {
            return times;
        };
        for (_, key) in &probes {
            while Instant::now() < deadline {
                match remote.client.get(key) {
                    Ok(_) | Err(ClientError::NotFound) => break,
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        }
        times.all_served_ms = Some(ms(Instant::now()));
        times
    }))
}

/// When each failover step happened after the kill of server `victim` at `kill_ns`.
fn failover_times(
    cluster: &Cluster,
    victim: usize,
    kill_ns: u64,
    run_start_ns: u64,
) -> FailoverTimes {
    let node = NodeId(victim as u32);
    let events = cluster.events().snapshot();
    let after = |e: &&rowankv_server::Event| e.at_ns >= kill_ns;
    let since = |ns: u64| (ns - kill_ns) as f64 / 1e6;
    let detected = events
        .iter()
        .filter(after)
        .find(|e| e.kind == EventKind::ServerFailed { node });
    let stored = detected.and_then(|d| {
        events
            .iter()
            .find(|e| e.at_ns >= d.at_ns && matches!(e.kind, EventKind::ConfigStored { .. }))
    });
    let term = stored.and_then(|e| match e.kind {
        EventKind::ConfigStored { term } => Some(term),
        _ => None,
    });
    let committed = term.and_then(|t| {
        events
            .iter()
            .find(|e| e.kind == EventKind::ConfigCommitted { term: t })
    });
    let served: Vec<&rowankv_server::Event> = term
        .map(|t| {
            events
                .iter()
                .filter(|e| matches!(e.kind, EventKind::ShardServed { term, .. } if term == t))
                .collect()
        })
        .unwrap_or_default();
    // Promotions of that term are the victim's shards (it was primary of
    // `shards_per_server` of them).
    let mut shards: Vec<_> = served
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::ShardServed { shard, .. } => Some(shard),
            _ => None,
        })
        .collect();
    shards.sort_unstable();
    shards.dedup();
    let promoted = shards.len();
    let expected = cluster.config().shards_per_server as usize;
    FailoverTimes {
        killed: node.0,
        kill_at_ms: (kill_ns - run_start_ns) as f64 / 1e6,
        detected_ms: detected.map(|e| since(e.at_ns)),
        stored_ms: stored.map(|e| since(e.at_ns)),
        committed_ms: committed.map(|e| since(e.at_ns)),
        all_served_ms: (promoted >= expected)
            .then(|| served.iter().map(|e| e.at_ns).max())
            .flatten()
            .map(since),
        shards_promoted: promoted,
        others_failed: events
            .iter()
            .filter_map(|e| match e.kind {
                // The victim counts too if it was evicted before it was killed.
                EventKind::ServerFailed { node: n } if n != node || e.at_ns < kill_ns => Some(n.0),
                _ => None,
            })
            .collect(),
    }
}

/// Read back every acknowledged PUT (record → its highest acknowledged version;
/// keys of `key_bytes`): (keys checked, keys missing or at an older version).
pub(crate) fn read_back(
    cluster: &mut Cluster,
    key_bytes: usize,
    acked: &std::collections::HashMap<u64, u64>,
) -> Result<(u64, u64), String> {
    let nic = cluster.attach_client().map_err(|e| e.to_string())?;
    let mut client = Client::connect(
        nic,
        cluster.directory().clone(),
        cluster.config_source(),
        read_back_config(),
    )
    .map_err(|e| e.to_string())?;
    read_back_with(&mut client, key_bytes, acked)
}

fn read_back_config() -> ClientConfig {
    ClientConfig {
        inflight_max: 32,
        timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    }
}

/// [`read_back`] through `client`.
fn read_back_with<N: Nic>(
    client: &mut Client<N>,
    key_bytes: usize,
    acked: &std::collections::HashMap<u64, u64>,
) -> Result<(u64, u64), String> {
    let mut records: Vec<(u64, u64)> = acked.iter().map(|(r, v)| (*r, *v)).collect();
    records.sort_unstable();
    let mut pending: std::collections::HashMap<u64, (u64, u64)> = std::collections::HashMap::new();
    let mut next = 0;
    let mut lost = 0u64;
    let mut done = Vec::new();
    let mut key = Vec::new();
    while next < records.len() || !pending.is_empty() {
        while next < records.len() && client.inflight() < 32 {
            let (record, version) = records[next];
            record_key(record, key_bytes, &mut key);
            let id = client
                .submit(ClientOp::Get { key: key.clone() })
                .map_err(|e| e.to_string())?;
            pending.insert(id.0, (record, version));
            next += 1;
        }
        done.clear();
        if client.poll(&mut done) == 0 {
            std::thread::yield_now();
        }
        for c in &done {
            let Some((record, version)) = pending.remove(&c.id.0) else {
                continue;
            };
            match &c.result {
                Ok(Output::Value { version: got, .. }) if *got >= version => {}
                other => {
                    if lost < 5 {
                        tracing::warn!(
                            record,
                            version,
                            ?other,
                            "an acknowledged write is not readable"
                        );
                    }
                    lost += 1;
                }
            }
        }
    }
    Ok((records.len() as u64, lost))
}

/// Remote persistence per strategy (seed 000 Figure 11): replication ACKs
/// taken and the bucket bounds of their p50 and p99, one line each, with the
/// timing model.
pub fn ack_report(results: &[YcsbResult]) -> String {
    let mut out = String::new();
    for r in results.iter().filter(|r| !r.replication_ack_cdf.is_empty()) {
        out += &format!(
            "remote persistence {:<6} {:>9} replication ACKs  p50 <= {} µs  p99 <= {} µs  p99.9 <= {} µs  [{}]\n",
            r.strategy,
            r.replication_acks,
            cdf_quantile_bound(&r.replication_ack_cdf, 0.5),
            cdf_quantile_bound(&r.replication_ack_cdf, 0.99),
            cdf_quantile_bound(&r.replication_ack_cdf, 0.999),
            super::sweep::media_timing_label(
                r.fabric,
                r.media_timing,
                r.media_write_bytes_per_sec_per_dimm
            )
        );
    }
    out
}

/// The comparison table.
pub fn table(results: &[YcsbResult]) -> String {
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            vec![
                r.strategy.clone(),
                format!("{:.0}", r.ops_per_sec),
                format!("{:.0}", r.put_p50_us),
                format!("{:.0}", r.put_p99_us),
                format!("{:.0}", r.get_p50_us),
                format!("{:.0}", r.get_p99_us),
                if r.fabric == FabricKind::Tcp {
                    "n/a".to_string()
                } else {
                    format!("{:.3}", r.dlwa_max)
                },
                if r.fabric == FabricKind::Tcp {
                    "n/a".to_string()
                } else {
                    format!("{:.0}", r.media_bytes_per_op)
                },
                if r.fabric == FabricKind::Tcp {
                    "n/a".to_string()
                } else {
                    format!("{:.0}", r.cleaner_bytes_per_op)
                },
                format!("{:.1}", r.cpu_us_per_op),
                format!("{}", r.errors + r.timeouts),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "strategy",
            "ops/s",
            "put p50 µs",
            "put p99 µs",
            "get p50 µs",
            "get p99 µs",
            "DLWA max",
            "media B/op",
            "cleaned B/op",
            "CPU µs/op",
            "errors",
        ],
        &rows,
    )
}

/// The throughput timeline of a run with a kill: one line per 100 ms, a bar
/// scaled to the busiest step, and the failover events of that step marked.
pub fn timeline_report(r: &YcsbResult) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let peak = r.timeline.iter().copied().max().unwrap_or(0).max(1);
    let step_ms = TIMELINE_STEP_NS as f64 / 1e6;
    let kill_ms = r.failover.as_ref().map(|f| f.kill_at_ms);
    let _ = writeln!(out, "  time (ms)   ops/s    throughput");
    for (i, &n) in r.timeline.iter().enumerate() {
        let from = i as f64 * step_ms;
        let to = from + step_ms;
        let mut marks: Vec<String> = Vec::new();
        if kill_ms.is_some_and(|k| k >= from && k < to) {
            marks.push(format!(
                "KILL s{}",
                r.failover.as_ref().map_or(0, |f| f.killed)
            ));
        }
        let mut promoted = 0;
        for e in r.events.iter().filter(|e| e.at_ms >= from && e.at_ms < to) {
            if e.what.contains(" served by ") {
                promoted += 1;
            } else {
                marks.push(e.what.clone());
            }
        }
        if promoted > 0 {
            marks.push(format!("{promoted} shard(s) promoted"));
        }
        let bar = "#".repeat((n * 40 / peak) as usize);
        let _ = writeln!(
            out,
            "  {:>5.0}-{:<5.0} {:>8.0}  {:<40} {}",
            from,
            to,
            n as f64 / (step_ms / 1e3),
            bar,
            marks.join("; ")
        );
    }
    if let Some(f) = &r.failover {
        let t = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1} ms"));
        let _ = writeln!(
            out,
            "  failover of s{} (killed at {:.0} ms): detected after {}, configuration stored after {}, \
             committed after {}, all {} of its shards served again after {}",
            f.killed,
            f.kill_at_ms,
            t(f.detected_ms),
            t(f.stored_ms),
            t(f.committed_ms),
            f.shards_promoted,
            t(f.all_served_ms)
        );
        if !f.others_failed.is_empty() {
            let _ = writeln!(
                out,
                "  live servers evicted (leases renewed late): {:?}",
                f.others_failed
            );
        }
    }
    out
}
