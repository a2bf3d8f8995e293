//! `rowankv bench ycsb --sweep`: median PUT and GET latency against throughput
//! under an open-loop load, one line per replication strategy (seed 000 §6.3,
//! Figure 9).
//!
//! **Why open loop.** The closed-loop runs of [`super::runner`] keep `depth`
//! operations in flight per client, so every strategy runs at its own peak and
//! its latency is mostly the queue those operations form (Little's law). The
//! paper compares medians *at the same load* — at RPC-KV's peak throughput —
//! which a closed loop cannot hold still. Here each client offers operations on
//! a schedule that does not depend on when earlier operations completed: a
//! fixed mean rate per client, so that the clients together offer the point's
//! rate (total operations per second).
//!
//! **Scheduling.** Each client has a [`Schedule`]: its share of the offered
//! rate (`rate / clients`), with either Poisson arrivals (exponential gaps, the
//! default: the aggregate of many independent users; the clients' streams sum
//! to a Poisson stream of the total rate) or uniform spacing (a fixed gap, the
//! clients' first operations staggered across one gap, as wrk2 spaces its
//! requests). A client sends every operation that is due when it is stepped,
//! as long as it has fewer than `inflight_per_client_max` operations in flight.
//!
//! **Coordinated omission.** Every operation's latency is measured from its
//! *scheduled* start, not from when it was sent: the time it waited because
//! its client was behind schedule (not stepped in time, or at its in-flight
//! bound) counts, as wrk2 corrects for. A closed loop, or an open loop that
//! measures from the send, would not see the waits a slow server imposes on the
//! operations queued behind it. A client that falls behind sends its late
//! operations as soon as it can; nothing is dropped, and no backlog is kept
//! other than the schedule's next due time (the backlog is implicit: every
//! arrival between that time and now).
//!
//! **Rates.** Either a fixed list, the same for every strategy, or fractions
//! of each strategy's peak, the same fractions for every strategy
//! ([`Rates::OfProbePeak`], the default: [`RATE_STEPS_DEFAULT`] steps from 10 %
//! to 120 %). The peak comes from a short closed-loop probe on the strategy's
//! own cluster after loading, run by the sweep's own clients (each `depth`
//! deep, `clients` × `depth` in flight as in `bench ycsb`), so each strategy is
//! measured from light load to past its saturation whatever its speed.
//!
//! **Workload streams.** Each client draws its operations from a generator of
//! its own seed, as YCSB's client threads do. The closed-loop generators of
//! [`super::runner`] all start from `seed`, so their clients replay one stream:
//! most writes are overwritten by another client moments later, which leaves
//! the cleaner little live data to copy, and with the media timing on that
//! roughly doubles Rowan's closed-loop throughput. `shared_stream` makes the
//! sweep's clients replay one stream the same way, to compare with those
//! results. The probe is run by the sweep's own clients, not by those
//! generators, so that the rates derive from the peak of the streams the
//! points offer.
//!
//! **One cluster per strategy.** Each strategy gets a fresh cluster of the same
//! configuration ([`Target::start`], as the closed-loop runs), loaded once; the
//! probe and every point of its sweep then run on that cluster in order of
//! rate. Each point starts with a warm-up (its schedules start afresh; what
//! completes then is not counted, nor is anything of an earlier point), then a
//! measured window of `seconds`. A point reports the operations completed in its
//! window (achieved ops/s = completions / window) and the latency of those
//! operations. Operations still unsent or in flight when the window closes are
//! not counted; past saturation the backlog grows through the window, so there
//! the medians measure the window's length as much as the store, and the
//! summary ([`summarize`]) takes its reference points where the strategy still
//! kept up ([`KEPT_UP_FRACTION_MIN`]).
//!
//! The clients are tasks on the cluster's own executor, as in the closed-loop
//! runs, so clients and servers share the machine's cores the same way for
//! every strategy. Their workload generators have a seed each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_client::{Client, ClientConfig, ClientError, Completed};
use rowankv_fabric::Nic;
use rowankv_server::{Step, Strategy, Task};
use serde::{Deserialize, Serialize};

use super::runner::{
    histogram, max_value_bytes, ClientTask, Kind, LoadGenerators, Requests, Target,
};
use super::workload::{Generator, Workload};
use super::{FabricKind, YcsbOptions};

/// Measured window of each point, unless `--seconds` says otherwise.
pub const SWEEP_POINT_SECONDS: f64 = 5.0;
/// Warm-up before each point's window: the schedules start afresh, the
/// previous point's operations drain, queues settle at the new rate.
pub const SWEEP_WARMUP_SECONDS: f64 = 1.0;
/// Length of the closed-loop probe that finds a strategy's peak.
pub const SWEEP_PROBE_SECONDS: f64 = 3.0;
/// Rate steps of the default sweep: 10 %, 20 %, … 120 % of the probe's peak.
pub const RATE_STEPS_DEFAULT: usize = 12;
/// The highest fraction of the probe's peak offered: past saturation, so that
/// every strategy's curve shows its knee.
pub const RATE_FRACTION_MAX: f64 = 1.2;
/// Bound on the points of one strategy's sweep.
pub const RATES_MAX: usize = 64;
/// Operations in flight per client (the bound of the open loop). Large enough
/// that it binds only near saturation (the closed loop reaches the peak with
/// 4), small enough that past saturation the servers' queues stay bounded:
/// the rest of the backlog waits in the schedule, where its wait is counted.
pub const INFLIGHT_PER_CLIENT_MAX_DEFAULT: usize = 16;
/// A point kept up with its offered load if it achieved at least this fraction
/// of it.
pub const KEPT_UP_FRACTION_MIN: f64 = 0.95;
/// How long the harness waits for the clients to hand in a point's figures.
const HAND_IN_WAIT_MAX: Duration = Duration::from_secs(10);
/// How often the sweep's controller reads the cluster's clock while it waits
/// for a window to pass.
const CLOCK_POLL: Duration = Duration::from_micros(200);
/// Mixed into each client's seeds, so that its workload stream differs from
/// the closed-loop generators' and from every other client's.
const SWEEP_SEED_SALT: u64 = 0x5377_6565_704f_4c31; // "SweepOL1"

/// The paper's figures and the goals the sweep is held to (seed 000 §6.3).
pub const PAPER_PUT_P50_RATIO: f64 = 1.77;
pub const GOAL_PUT_P50_RATIO_MIN: f64 = 1.5;
pub const PAPER_PEAK_RATIO: f64 = 1.22;
pub const GOAL_PEAK_RATIO_MIN: f64 = 1.2;

const _: () = assert!(KEPT_UP_FRACTION_MIN > 0.0 && KEPT_UP_FRACTION_MIN < 1.0);
const _: () = assert!(RATE_FRACTION_MAX > 1.0);
const _: () = assert!(RATE_STEPS_DEFAULT >= 2 && RATE_STEPS_DEFAULT <= RATES_MAX);

/// How a client spaces its operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Exponential gaps of the mean interval.
    Poisson,
    /// Every gap the mean interval.
    Uniform,
}

impl std::str::FromStr for Arrivals {
    type Err = SweepError;
    fn from_str(s: &str) -> Result<Self, SweepError> {
        match s {
            "poisson" => Ok(Arrivals::Poisson),
            "uniform" => Ok(Arrivals::Uniform),
            other => Err(SweepError::Arrivals(other.to_string())),
        }
    }
}

impl std::fmt::Display for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Arrivals::Poisson => "poisson",
            Arrivals::Uniform => "uniform",
        })
    }
}

/// The offered rates of a sweep (total operations per second over all
/// clients).
#[derive(Clone, Debug, PartialEq)]
pub enum Rates {
    /// The same rates for every strategy.
    Fixed(Vec<f64>),
    /// These fractions of each strategy's closed-loop peak, measured by a
    /// probe on its cluster before its sweep.
    OfProbePeak(Vec<f64>),
}

impl Rates {
    /// `steps` fractions of the probe's peak, evenly spaced up to
    /// [`RATE_FRACTION_MAX`].
    pub fn steps(steps: usize) -> Rates {
        Rates::OfProbePeak(fractions(steps))
    }
}

/// `steps` fractions `RATE_FRACTION_MAX * i / steps`, `i = 1..=steps`, to the
/// nearest 0.1 % (so that they print and serialise as written): 12 steps give
/// 10 %, 20 %, … 120 %; 4 give 30 %, 60 %, 90 %, 120 %.
pub fn fractions(steps: usize) -> Vec<f64> {
    const PER_MILLE: f64 = 1000.0;
    (1..=steps)
        .map(|i| (RATE_FRACTION_MAX * PER_MILLE * i as f64 / steps as f64).round() / PER_MILLE)
        .collect()
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("the sweep runs YCSB-A, B or C (the loads of Figure 9), not {0}")]
    Workload(Workload),
    #[error(
        "offered rates must be 1 to {RATES_MAX} positive, finite numbers (ops/s or fractions): {0:?}"
    )]
    Rates(Vec<f64>),
    #[error("unknown arrivals {0:?} (expected poisson or uniform)")]
    Arrivals(String),
    #[error("{0}")]
    Options(String),
    #[error("{strategy}: the closed-loop probe completed no operation in {seconds} s, so no rate can be derived from its peak")]
    NoProbePeak { strategy: String, seconds: f64 },
    #[error("{strategy}: {message}")]
    Cluster { strategy: String, message: String },
}

/// Options of a sweep.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// The cluster, workload, strategies and clients, as a closed-loop run's;
    /// `seconds` is each point's measured window, `depth` the probe's
    /// operations in flight per client. `kill_at` and `verify` are not used.
    pub ycsb: YcsbOptions,
    pub rates: Rates,
    pub arrivals: Arrivals,
    pub warmup_seconds: f64,
    pub probe_seconds: f64,
    pub inflight_per_client_max: usize,
    /// Every client replays the one stream of `ycsb.seed` (the closed-loop
    /// generators' workload) instead of a stream of its own.
    pub shared_stream: bool,
}

impl Default for SweepOptions {
    /// The closed-loop default setting, 12 rates from 10 % to 120 % of each
    /// strategy's peak, 5 s each after 1 s of warm-up, Poisson arrivals.
    fn default() -> Self {
        SweepOptions {
            ycsb: YcsbOptions {
                seconds: SWEEP_POINT_SECONDS,
                ..YcsbOptions::default()
            },
            rates: Rates::steps(RATE_STEPS_DEFAULT),
            arrivals: Arrivals::Poisson,
            warmup_seconds: SWEEP_WARMUP_SECONDS,
            probe_seconds: SWEEP_PROBE_SECONDS,
            inflight_per_client_max: INFLIGHT_PER_CLIENT_MAX_DEFAULT,
            shared_stream: false,
        }
    }
}

impl SweepOptions {
    fn check(&self) -> Result<(), SweepError> {
        let y = &self.ycsb;
        if !matches!(y.workload, Workload::A | Workload::B | Workload::C) {
            return Err(SweepError::Workload(y.workload));
        }
        let (Rates::Fixed(r) | Rates::OfProbePeak(r)) = &self.rates;
        if r.is_empty() || r.len() > RATES_MAX || r.iter().any(|v| !v.is_finite() || *v <= 0.0) {
            return Err(SweepError::Rates(r.clone()));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        let warmup_ok = self.warmup_seconds.is_finite() && self.warmup_seconds >= 0.0;
        if !positive(y.seconds)
            || !warmup_ok
            || (matches!(self.rates, Rates::OfProbePeak(_)) && !positive(self.probe_seconds))
        {
            return Err(SweepError::Options(format!(
                "window {} s, warm-up {} s, probe {} s: the window and the probe must be \
                 positive, the warm-up not negative",
                y.seconds, self.warmup_seconds, self.probe_seconds
            )));
        }
        if y.clients == 0 || self.inflight_per_client_max == 0 || y.depth == 0 {
            return Err(SweepError::Options(
                "clients, their operations in flight and the probe's depth must be at least 1"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// One point of a sweep: a strategy at one offered rate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepPoint {
    pub strategy: String,
    pub workload: String,
    pub sizes: String,
    pub keys: String,
    pub arrivals: Arrivals,
    /// Whether every client replayed one workload stream (see the module doc).
    #[serde(default)]
    pub shared_stream: bool,
    /// Operations per second the clients offered together.
    pub offered_ops_per_sec: f64,
    /// The fraction of the probe's peak this rate is, when derived from it.
    pub offered_fraction: Option<f64>,
    /// The strategy's closed-loop peak from the probe, when there was one.
    pub probe_ops_per_sec: Option<f64>,
    /// Operations completed per second of the window (achieved throughput).
    pub ops_per_sec: f64,
    /// Whether `ops_per_sec` reached [`KEPT_UP_FRACTION_MIN`] of the offered rate.
    pub kept_up: bool,
    pub ops: u64,
    pub puts: u64,
    pub gets: u64,
    /// Latency from each operation's scheduled start (see the module doc).
    pub put_p50_us: f64,
    pub put_p99_us: f64,
    pub put_p999_us: f64,
    pub get_p50_us: f64,
    pub get_p99_us: f64,
    pub get_p999_us: f64,
    /// How far behind its schedule the furthest-behind client was when the
    /// window closed (0 when every client was on time).
    pub schedule_lag_ms_max: f64,
    pub errors: u64,
    pub timeouts: u64,
    /// Length of the measured window and of the warm-up before it.
    pub seconds: f64,
    pub warmup_seconds: f64,
    pub servers: usize,
    pub replication_factor: u8,
    pub workers: usize,
    pub clients: usize,
    pub inflight_per_client_max: usize,
    pub records: u64,
    pub media_timing: bool,
    /// Media write bandwidth per DIMM of the timing mode, when `media_timing` is on.
    pub media_write_bytes_per_sec_per_dimm: Option<u64>,
    pub fabric: FabricKind,
    /// The wire and CPU models the point ran with, as [`models_label`] says
    /// them (`None`: neither; real time).
    #[serde(default)]
    pub models: Option<String>,
}

impl SweepPoint {
    /// The timing models (media, and wire and CPU when on) as every printed
    /// line says them.
    pub fn media_timing_label(&self) -> String {
        let media = media_timing_label(
            self.fabric,
            self.media_timing,
            self.media_write_bytes_per_sec_per_dimm,
        );
        match &self.models {
            Some(m) => format!("{media}; {m}"),
            None => media,
        }
    }
}

/// The wire and CPU models of a run (`None` when it has neither): a cluster
/// on the CPU model always has the wire model on.
pub fn models_label(y: &YcsbOptions) -> Option<String> {
    let wire = match y.cpu_model {
        Some(_) => Some(y.wire_model.unwrap_or(rowankv_fabric::WireModel::CONNECTX5)),
        None => y.wire_model,
    };
    let labels: Vec<String> = wire
        .map(|w| w.label())
        .into_iter()
        .chain(y.cpu_model.map(|c| c.label()))
        .collect();
    (!labels.is_empty()).then(|| labels.join("; "))
}

/// Whether a point achieving `achieved` ops/s kept up with `offered`.
pub fn kept_up(offered: f64, achieved: f64) -> bool {
    achieved >= KEPT_UP_FRACTION_MIN * offered
}

/// "media timing on (4 MB/s per DIMM)", "… off", or n/a over `tcp`.
pub fn media_timing_label(fabric: FabricKind, on: bool, bandwidth: Option<u64>) -> String {
    match (fabric, on, bandwidth) {
        (FabricKind::Tcp, _, _) => "media timing n/a (servers in other processes)".into(),
        (_, true, Some(b)) => format!("media timing on ({} MB/s per DIMM)", b / 1_000_000),
        (_, true, None) => "media timing on".into(),
        (_, false, _) => "media timing off".into(),
    }
}

// ---------------------------------------------------------------------------
// The schedule (pure: no clock, no I/O)

/// When one client's operations are due: arrivals at a fixed mean rate from a
/// start time, whatever happened to the operations before them.
#[derive(Clone, Debug)]
pub struct Schedule {
    arrivals: Arrivals,
    interval_ns: f64,
    /// The next arrival, ns on the cluster's clock (fractional: uniform gaps
    /// accumulate no rounding).
    next_ns: f64,
    rng: ChaCha8Rng,
}

impl Schedule {
    /// A schedule of `rate_ops_per_sec` from `start_ns`. `stagger` in `[0, 1)`
    /// places a uniform schedule's first arrival that fraction of a gap after
    /// the start (so that clients do not all send at once); Poisson arrivals
    /// draw their first gap like every other.
    pub fn new(
        arrivals: Arrivals,
        rate_ops_per_sec: f64,
        start_ns: u64,
        stagger: f64,
        seed: u64,
    ) -> Schedule {
        assert!(
            rate_ops_per_sec.is_finite() && rate_ops_per_sec > 0.0,
            "rate {rate_ops_per_sec}"
        );
        assert!((0.0..1.0).contains(&stagger), "stagger {stagger}");
        let mut s = Schedule {
            arrivals,
            interval_ns: 1e9 / rate_ops_per_sec,
            next_ns: start_ns as f64,
            rng: ChaCha8Rng::seed_from_u64(seed),
        };
        s.next_ns += match arrivals {
            Arrivals::Uniform => stagger * s.interval_ns,
            Arrivals::Poisson => s.gap_ns(),
        };
        s
    }

    fn gap_ns(&mut self) -> f64 {
        match self.arrivals {
            Arrivals::Uniform => self.interval_ns,
            Arrivals::Poisson => self.interval_ns * self.rng.sample::<f64, _>(rand_distr::Exp1),
        }
    }

    /// The scheduled start of the next operation.
    pub fn next_ns(&self) -> u64 {
        self.next_ns as u64
    }

    /// The scheduled start of the next operation if it is due at `now_ns`,
    /// moving the schedule past it. A client asks only when it can send: an
    /// operation it cannot send yet stays due, and its wait counts.
    pub fn take_due(&mut self, now_ns: u64) -> Option<u64> {
        let due = self.next_ns();
        if due > now_ns {
            return None;
        }
        self.next_ns += self.gap_ns();
        Some(due)
    }

    /// How far `now_ns` is behind the schedule: the age of the oldest
    /// operation due and not sent (0 when nothing is due).
    pub fn lag_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.next_ns())
    }
}

/// An open-loop operation's latency in µs: from its scheduled start to its
/// completion — the wait before it was sent (`sent_ns - scheduled_ns`: its
/// client behind schedule or at its in-flight bound) plus the client's own
/// measure from submission to completion (`service`). At least 1 µs, the
/// histograms' lowest value.
pub fn latency_from_schedule_us(scheduled_ns: u64, sent_ns: u64, service: Duration) -> u64 {
    assert!(
        sent_ns >= scheduled_ns,
        "sent at {sent_ns} before its schedule {scheduled_ns}"
    );
    let ns = (sent_ns - scheduled_ns) as u128 + service.as_nanos();
    ((ns / 1000) as u64).max(1)
}

// ---------------------------------------------------------------------------
// The open-loop client

/// The harness's instruction to the clients, in one atomic word so that a
/// client never reads a point's index with another point's window state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Before the probe or the first point.
    Idle,
    /// The closed-loop probe: keep `depth` in flight; count completions while
    /// `measuring`.
    Probe { measuring: bool },
    /// Run point `index`; count completions while `measuring`.
    Point { index: usize, measuring: bool },
    /// Hand in and end.
    Stop,
}

const STAGE_PROBE_WARMUP: u64 = u64::MAX - 3;
const STAGE_PROBE_MEASURE: u64 = u64::MAX - 2;
const STAGE_IDLE: u64 = u64::MAX - 1;
const STAGE_STOP: u64 = u64::MAX;
/// The point of an operation sent by the probe.
const PROBE_POINT: usize = usize::MAX;

impl Stage {
    fn encode(self) -> u64 {
        match self {
            Stage::Idle => STAGE_IDLE,
            Stage::Stop => STAGE_STOP,
            Stage::Probe { measuring: false } => STAGE_PROBE_WARMUP,
            Stage::Probe { measuring: true } => STAGE_PROBE_MEASURE,
            Stage::Point { index, measuring } => {
                assert!(index < RATES_MAX);
                ((index as u64) << 1) | measuring as u64
            }
        }
    }

    fn decode(word: u64) -> Stage {
        match word {
            STAGE_IDLE => Stage::Idle,
            STAGE_STOP => Stage::Stop,
            STAGE_PROBE_WARMUP => Stage::Probe { measuring: false },
            STAGE_PROBE_MEASURE => Stage::Probe { measuring: true },
            w => Stage::Point {
                index: (w >> 1) as usize,
                measuring: w & 1 == 1,
            },
        }
    }
}

/// What one client measured of one point (and, merged, all clients).
#[derive(Clone)]
struct Tally {
    put: Histogram<u64>,
    get: Histogram<u64>,
    puts: u64,
    gets: u64,
    errors: u64,
    timeouts: u64,
    lag_ns_max: u64,
    /// Clients whose figures are in.
    clients: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            put: histogram(),
            get: histogram(),
            puts: 0,
            gets: 0,
            errors: 0,
            timeouts: 0,
            lag_ns_max: 0,
            clients: 0,
        }
    }

    fn merge(&mut self, other: &Tally) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.put.add(&other.put);
        let _ = self.get.add(&other.get);
        self.puts += other.puts;
        self.gets += other.gets;
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        self.lag_ns_max = self.lag_ns_max.max(other.lag_ns_max);
        self.clients += other.clients;
    }
}

/// What the harness and the clients share.
struct Shared {
    stage: AtomicU64,
    /// Each point's offered rate (total ops/s), set before the first point.
    rates: OnceLock<Vec<f64>>,
    /// Operations completed in the probe's window.
    probe_ops: AtomicU64,
    /// One per point.
    tallies: Mutex<Vec<Tally>>,
    /// Clients that have ended.
    ended: AtomicU64,
}

/// An operation in flight.
#[derive(Clone, Copy)]
struct Flight {
    kind: Kind,
    point: usize,
    scheduled_ns: u64,
    sent_ns: u64,
}

/// Everything of an open-loop client but its client.
struct SweepParts {
    name: String,
    /// This client's index and the clients' number (to stagger uniform arrivals).
    index: usize,
    clients: usize,
    gen: Generator,
    requests: Requests,
    arrivals: Arrivals,
    /// Operations in flight in the probe (closed loop).
    depth: usize,
    /// Operations in flight at most in the open loop.
    inflight_max: usize,
    seed: u64,
    shared: Arc<Shared>,
}

impl ClientTask for SweepParts {
    fn with_client<N: Nic>(
        self,
        client: Client<N>,
        keep: Option<Box<dyn std::any::Any + Send>>,
    ) -> Box<dyn Task> {
        Box::new(SweepClient {
            client,
            _keep: keep,
            p: self,
            inflight: HashMap::new(),
            done: Vec::new(),
            current: None,
            tally: Tally::new(),
        })
    }
}

/// An open-loop load generator: one pipelined client sending on its schedule.
struct SweepClient<N: Nic> {
    client: Client<N>,
    /// What keeps a process client attached (its fabric node and directory).
    _keep: Option<Box<dyn std::any::Any + Send>>,
    p: SweepParts,
    /// Bounded by `inflight_max` (the client refuses more).
    inflight: HashMap<u64, Flight>,
    done: Vec<Completed>,
    /// The point being run and its schedule.
    current: Option<(usize, Schedule)>,
    tally: Tally,
}

impl<N: Nic> SweepClient<N> {
    /// Hand in the current point's figures (its schedule's lag at `now_ns`).
    fn hand_in(&mut self, now_ns: u64) {
        let Some((index, schedule)) = &self.current else {
            return;
        };
        let mut tally = std::mem::replace(&mut self.tally, Tally::new());
        tally.lag_ns_max = schedule.lag_ns(now_ns);
        tally.clients = 1;
        self.p.shared.tallies.lock()[*index].merge(&tally);
    }

    fn record(&mut self, c: &Completed, f: Flight) {
        let us = latency_from_schedule_us(f.scheduled_ns, f.sent_ns, c.latency);
        let t = &mut self.tally;
        match (&c.result, f.kind) {
            (Ok(_), Kind::Put { .. }) => {
                t.puts += 1;
                let _ = t.put.record(us);
            }
            (Ok(_) | Err(ClientError::NotFound), Kind::Get) => {
                t.gets += 1;
                let _ = t.get.record(us);
            }
            (Err(e), _) if e.is_unknown() => t.timeouts += 1,
            _ => t.errors += 1,
        }
    }
}

impl<N: Nic> Task for SweepClient<N> {
    fn name(&self) -> &str {
        &self.p.name
    }

    fn step(&mut self, now_ns: u64) -> Step {
        let stage = Stage::decode(self.p.shared.stage.load(Ordering::Acquire));
        match stage {
            Stage::Idle => return Step::Idle,
            Stage::Stop => {
                self.hand_in(now_ns);
                self.p.shared.ended.fetch_add(1, Ordering::Release);
                return Step::Done;
            }
            Stage::Point { index, .. } if self.current.as_ref().map(|(i, _)| *i) != Some(index) => {
                self.hand_in(now_ns);
                let rates = self
                    .p
                    .shared
                    .rates
                    .get()
                    .expect("the rates are set before the first point");
                let stagger = self.p.index as f64 / self.p.clients as f64;
                let schedule = Schedule::new(
                    self.p.arrivals,
                    rates[index] / self.p.clients as f64,
                    now_ns,
                    stagger,
                    self.p.seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                );
                self.current = Some((index, schedule));
            }
            _ => {}
        }
        let mut did = false;
        let mut done = std::mem::take(&mut self.done);
        done.clear();
        if self.client.poll(&mut done) > 0 {
            did = true;
        }
        for c in &done {
            let Some(f) = self.inflight.remove(&c.id.0) else {
                continue;
            };
            // Only the current stage's operations, and only those completing
            // in its window.
            match stage {
                Stage::Probe { measuring: true } if f.point == PROBE_POINT => {
                    if matches!(
                        (&c.result, f.kind),
                        (Ok(_), Kind::Put { .. }) | (Ok(_) | Err(ClientError::NotFound), Kind::Get)
                    ) {
                        self.p.shared.probe_ops.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Stage::Point {
                    index,
                    measuring: true,
                } if f.point == index => self.record(c, f),
                _ => {}
            }
        }
        self.done = done;
        match stage {
            Stage::Probe { .. } => {
                while self.client.inflight() < self.p.depth {
                    if !self.send(PROBE_POINT, now_ns, now_ns, false) {
                        break;
                    }
                    did = true;
                }
            }
            Stage::Point { index, measuring } => {
                while self.client.inflight() < self.p.inflight_max {
                    let Some((_, schedule)) = self.current.as_mut() else {
                        unreachable!("the schedule was set above");
                    };
                    let Some(scheduled_ns) = schedule.take_due(now_ns) else {
                        break;
                    };
                    // An operation the client refuses is lost to the schedule.
                    if !self.send(index, scheduled_ns, now_ns, measuring) {
                        break;
                    }
                    did = true;
                }
            }
            Stage::Idle | Stage::Stop => {}
        }
        if did {
            Step::Worked
        } else {
            Step::Idle
        }
    }
}

impl<N: Nic> SweepClient<N> {
    /// Send the workload's next operation for `point`, scheduled at
    /// `scheduled_ns`; whether the client took it (a refusal counts as an
    /// error of the point if `measuring`).
    fn send(&mut self, point: usize, scheduled_ns: u64, now_ns: u64, measuring: bool) -> bool {
        let (op, kind) = self.p.requests.request(self.p.gen.next_op());
        match self.client.submit(op) {
            Ok(id) => {
                self.inflight.insert(
                    id.0,
                    Flight {
                        kind,
                        point,
                        scheduled_ns,
                        sent_ns: now_ns,
                    },
                );
                true
            }
            Err(_) => {
                if measuring {
                    self.tally.errors += 1;
                }
                false
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The harness

/// What a sweep reports while it runs.
pub enum SweepEvent<'a> {
    /// A strategy's closed-loop probe: its peak and the rates derived from it.
    Probed {
        strategy: &'a str,
        ops_per_sec: f64,
        rates: &'a [f64],
    },
    /// A point measured.
    Point(&'a SweepPoint),
}

/// Run the sweep of every strategy of `opts.ycsb.strategies`, each on a fresh
/// cluster; the points in order (strategy, then rate). `on_event` hears of
/// each probe and point as it is measured.
pub fn run(
    opts: &SweepOptions,
    on_event: &mut dyn FnMut(SweepEvent<'_>),
) -> Result<Vec<SweepPoint>, SweepError> {
    opts.check()?;
    let mut points = Vec::new();
    for &strategy in &opts.ycsb.strategies {
        let cluster = |message: String| SweepError::Cluster {
            strategy: strategy.name().to_string(),
            message,
        };
        let mut target = Target::start(&opts.ycsb, strategy).map_err(cluster)?;
        let swept = sweep_one(&mut target, opts, strategy, on_event);
        target.shutdown();
        points.extend(swept?);
    }
    Ok(points)
}

/// Load `target`, probe its peak if the rates need it, and run every point.
fn sweep_one(
    target: &mut Target,
    opts: &SweepOptions,
    strategy: Strategy,
    on_event: &mut dyn FnMut(SweepEvent<'_>),
) -> Result<Vec<SweepPoint>, SweepError> {
    let y = &opts.ycsb;
    let cluster = |message: String| SweepError::Cluster {
        strategy: strategy.name().to_string(),
        message,
    };
    // Load through the closed-loop generators, then hand over to the sweep's
    // own clients: they run the probe too, so that the peak the rates derive
    // from is the peak of the very workload streams the points offer.
    let generators = LoadGenerators::spawn(target, y, 0).map_err(cluster)?;
    generators.load(y, strategy).map_err(cluster)?;
    generators.stop();

    let steps = match &opts.rates {
        Rates::Fixed(r) | Rates::OfProbePeak(r) => r.len(),
    };
    let shared = Arc::new(Shared {
        stage: AtomicU64::new(Stage::Idle.encode()),
        rates: OnceLock::new(),
        probe_ops: AtomicU64::new(0),
        tallies: Mutex::new(vec![Tally::new(); steps]),
        ended: AtomicU64::new(0),
    });
    let max_value = max_value_bytes(y.sizes);
    for c in 0..y.clients {
        let seed = super::runner::client_stream_seed(y.seed ^ SWEEP_SEED_SALT, c);
        let config = ClientConfig {
            worker_hint: c,
            inflight_max: opts.inflight_per_client_max.max(y.depth),
            timeout: Duration::from_secs(10),
            // The cluster's clock: modelled time on the CPU model.
            clock: target.clock(),
            ..ClientConfig::default()
        };
        let parts = SweepParts {
            name: format!("sweep-client-{c}"),
            index: c,
            clients: y.clients,
            gen: Generator::new(
                y.workload,
                y.keys,
                y.sizes,
                y.records,
                max_value,
                if opts.shared_stream { y.seed } else { seed },
            )
            .with_client(c as u64, y.clients as u64),
            requests: Requests::new(y.sizes, max_value, ChaCha8Rng::seed_from_u64(!seed)),
            arrivals: opts.arrivals,
            depth: y.depth,
            inflight_max: opts.inflight_per_client_max,
            seed,
            shared: shared.clone(),
        };
        target.spawn_client(config, parts).map_err(cluster)?;
    }
    let set_stage = |stage: Stage| shared.stage.store(stage.encode(), Ordering::Release);
    // Windows are measured on the cluster's clock: real time, or modelled
    // time when the cluster runs on the CPU model.
    let clock = target.clock();
    let wait_until = |t_ns: u64| {
        while clock.now_ns() < t_ns {
            std::thread::sleep(CLOCK_POLL);
        }
    };
    let wait = |seconds: f64| wait_until(clock.now_ns() + (seconds * 1e9) as u64);
    let since = |start_ns: u64| clock.now_ns().saturating_sub(start_ns) as f64 / 1e9;

    let (rates, fractions, probe) = match &opts.rates {
        Rates::Fixed(rates) => (rates.clone(), None, None),
        Rates::OfProbePeak(fractions) => {
            set_stage(Stage::Probe { measuring: false });
            wait(opts.warmup_seconds);
            let start = clock.now_ns();
            set_stage(Stage::Probe { measuring: true });
            wait(opts.probe_seconds);
            let ops = shared.probe_ops.load(Ordering::Relaxed);
            let peak = ops as f64 / since(start);
            if ops == 0 {
                set_stage(Stage::Stop);
                return Err(SweepError::NoProbePeak {
                    strategy: strategy.name().to_string(),
                    seconds: opts.probe_seconds,
                });
            }
            let rates: Vec<f64> = fractions
                .iter()
                .map(|f| (f * peak).round().max(1.0))
                .collect();
            on_event(SweepEvent::Probed {
                strategy: strategy.name(),
                ops_per_sec: peak,
                rates: &rates,
            });
            (rates, Some(fractions.clone()), Some(peak))
        }
    };
    assert_eq!(rates.len(), steps);
    shared
        .rates
        .set(rates.clone())
        .expect("the rates are set once, before the first point");

    let point = |index: usize, tally: &Tally, window_seconds: f64| {
        let q = |h: &Histogram<u64>, p: f64| {
            if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(p) as f64
            }
        };
        let offered = rates[index];
        let ops = tally.puts + tally.gets;
        let achieved = ops as f64 / window_seconds;
        SweepPoint {
            strategy: strategy.name().to_string(),
            workload: y.workload.to_string(),
            sizes: y.sizes.to_string(),
            keys: y.keys.to_string(),
            arrivals: opts.arrivals,
            shared_stream: opts.shared_stream,
            offered_ops_per_sec: offered,
            offered_fraction: fractions.as_ref().map(|f: &Vec<f64>| f[index]),
            probe_ops_per_sec: probe,
            ops_per_sec: achieved,
            kept_up: kept_up(offered, achieved),
            ops,
            puts: tally.puts,
            gets: tally.gets,
            put_p50_us: q(&tally.put, 0.5),
            put_p99_us: q(&tally.put, 0.99),
            put_p999_us: q(&tally.put, 0.999),
            get_p50_us: q(&tally.get, 0.5),
            get_p99_us: q(&tally.get, 0.99),
            get_p999_us: q(&tally.get, 0.999),
            schedule_lag_ms_max: tally.lag_ns_max as f64 / 1e6,
            errors: tally.errors,
            timeouts: tally.timeouts,
            seconds: window_seconds,
            warmup_seconds: opts.warmup_seconds,
            servers: y.servers,
            replication_factor: y.replication_factor,
            workers: y.workers,
            clients: y.clients,
            inflight_per_client_max: opts.inflight_per_client_max,
            records: y.records,
            media_timing: y.media_bandwidth.is_some() && y.fabric == FabricKind::Loopback,
            media_write_bytes_per_sec_per_dimm: y
                .media_bandwidth
                .filter(|_| y.fabric == FabricKind::Loopback),
            fabric: y.fabric,
            models: models_label(y),
        }
    };
    // The clients hand in a point when they see the next stage.
    let collect = |index: usize| -> Tally {
        let start = Instant::now();
        loop {
            let in_ = shared.tallies.lock()[index].clients;
            if in_ >= y.clients as u64 || start.elapsed() > HAND_IN_WAIT_MAX {
                if in_ < y.clients as u64 {
                    tracing::warn!(
                        strategy = strategy.name(),
                        point = index,
                        handed_in = in_,
                        clients = y.clients,
                        "not every client handed in its figures"
                    );
                }
                return shared.tallies.lock()[index].clone();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    };

    let mut points = Vec::with_capacity(rates.len());
    let mut window_seconds = vec![0.0; rates.len()];
    for index in 0..rates.len() {
        let warmup_end = clock.now_ns() + (opts.warmup_seconds * 1e9) as u64;
        set_stage(Stage::Point {
            index,
            measuring: false,
        });
        // The previous point's figures come in during this one's warm-up.
        if index > 0 {
            let p = point(index - 1, &collect(index - 1), window_seconds[index - 1]);
            on_event(SweepEvent::Point(&p));
            points.push(p);
        }
        wait_until(warmup_end);
        let window_start = clock.now_ns();
        set_stage(Stage::Point {
            index,
            measuring: true,
        });
        wait(y.seconds);
        window_seconds[index] = since(window_start);
    }
    set_stage(Stage::Stop);
    let last = rates.len() - 1;
    let p = point(last, &collect(last), window_seconds[last]);
    on_event(SweepEvent::Point(&p));
    points.push(p);
    let start = Instant::now();
    while shared.ended.load(Ordering::Acquire) < y.clients as u64
        && start.elapsed() < HAND_IN_WAIT_MAX
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(points)
}

// ---------------------------------------------------------------------------
// The summary (pure)

/// A point as the summary cites it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PointRef {
    pub offered_ops_per_sec: f64,
    pub ops_per_sec: f64,
    pub put_p50_us: f64,
    pub get_p50_us: f64,
    pub kept_up: bool,
}

impl From<&SweepPoint> for PointRef {
    fn from(p: &SweepPoint) -> PointRef {
        PointRef {
            offered_ops_per_sec: p.offered_ops_per_sec,
            ops_per_sec: p.ops_per_sec,
            put_p50_us: p.put_p50_us,
            get_p50_us: p.get_p50_us,
            kept_up: kept_up(p.offered_ops_per_sec, p.ops_per_sec),
        }
    }
}

/// A strategy's peak in a sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StrategyPeak {
    pub strategy: String,
    /// The highest achieved throughput of any of its points.
    pub peak_ops_per_sec: f64,
    /// Its peak load point: the highest throughput at which it still kept up
    /// with the offered load (the knee of its curve, where the paper reads
    /// "at the peak throughput of RPC-KV"); if no point kept up, the point of
    /// the highest throughput.
    pub peak_load: PointRef,
}

/// The comparison the paper makes at RPC-KV's peak throughput (seed 000 §6.3).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RowanVsRpc {
    /// `rpc`'s peak load point.
    pub rpc: PointRef,
    /// Rowan's point whose offered rate is nearest `rpc`'s peak load
    /// throughput (of two equally near, the higher rate).
    pub rowan: PointRef,
    /// How far Rowan's offered rate is from that throughput, as a fraction of
    /// it (0: the same load).
    pub load_offset: f64,
    /// rpc PUT p50 / Rowan PUT p50 there (paper: 1.77); `None` without PUTs.
    pub put_p50_ratio: Option<f64>,
    /// rpc GET p50 / Rowan GET p50 there; `None` without GETs.
    pub get_p50_ratio: Option<f64>,
    /// Rowan's peak throughput / `rpc`'s (paper: 1.22).
    pub peak_ratio: f64,
}

/// What a sweep shows, against the paper.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepSummary {
    /// In the order the strategies first appear.
    pub peaks: Vec<StrategyPeak>,
    /// When both `rowan` and `rpc` were swept.
    pub rowan_vs_rpc: Option<RowanVsRpc>,
}

/// The peaks of each strategy in `points` and, with `rowan` and `rpc` among
/// them, the paper's comparison at `rpc`'s peak load.
pub fn summarize(points: &[SweepPoint]) -> SweepSummary {
    let mut names: Vec<&str> = Vec::new();
    for p in points {
        if !names.contains(&p.strategy.as_str()) {
            names.push(&p.strategy);
        }
    }
    let of =
        |name: &str| -> Vec<&SweepPoint> { points.iter().filter(|p| p.strategy == name).collect() };
    let peaks: Vec<StrategyPeak> = names
        .iter()
        .map(|name| {
            let mine = of(name);
            let top = |ps: &mut dyn Iterator<Item = &&SweepPoint>| {
                ps.max_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec))
                    .map(|p| (*p).clone())
            };
            let highest = top(&mut mine.iter()).expect("a strategy named by a point has one");
            let knee = top(&mut mine
                .iter()
                .filter(|p| kept_up(p.offered_ops_per_sec, p.ops_per_sec)))
            .unwrap_or_else(|| highest.clone());
            StrategyPeak {
                strategy: name.to_string(),
                peak_ops_per_sec: highest.ops_per_sec,
                peak_load: PointRef::from(&knee),
            }
        })
        .collect();
    let peak = |name: &str| peaks.iter().find(|p| p.strategy == name);
    let rowan_vs_rpc = match (peak("rowan"), peak("rpc")) {
        (Some(rowan_peak), Some(rpc_peak)) => {
            let load = rpc_peak.peak_load.ops_per_sec;
            let nearest = of("rowan")
                .into_iter()
                .min_by(|a, b| {
                    let da = (a.offered_ops_per_sec - load).abs();
                    let db = (b.offered_ops_per_sec - load).abs();
                    // Of two equally near, the higher rate (the harder for Rowan).
                    da.total_cmp(&db)
                        .then(b.offered_ops_per_sec.total_cmp(&a.offered_ops_per_sec))
                })
                .expect("rowan has points");
            let rowan = PointRef::from(nearest);
            let ratio = |rpc: f64, rowan: f64| (rpc > 0.0 && rowan > 0.0).then(|| rpc / rowan);
            Some(RowanVsRpc {
                load_offset: if load > 0.0 {
                    rowan.offered_ops_per_sec / load - 1.0
                } else {
                    0.0
                },
                put_p50_ratio: ratio(rpc_peak.peak_load.put_p50_us, rowan.put_p50_us),
                get_p50_ratio: ratio(rpc_peak.peak_load.get_p50_us, rowan.get_p50_us),
                peak_ratio: if rpc_peak.peak_ops_per_sec > 0.0 {
                    rowan_peak.peak_ops_per_sec / rpc_peak.peak_ops_per_sec
                } else {
                    0.0
                },
                rpc: rpc_peak.peak_load.clone(),
                rowan,
            })
        }
        _ => None,
    };
    SweepSummary {
        peaks,
        rowan_vs_rpc,
    }
}

// ---------------------------------------------------------------------------
// Reports

fn us(v: f64) -> String {
    if v > 0.0 {
        format!("{v:.0}")
    } else {
        "—".to_string()
    }
}

/// One line per point, as the sweep prints it while it runs.
pub fn point_line(p: &SweepPoint) -> String {
    format!(
        "  {:<6} YCSB-{} offered {:>9.0} ops/s{}  achieved {:>9.0} ops/s{}  PUT p50/p99 {}/{} µs  \
         GET p50/p99 {}/{} µs  lag {:.1} ms  errors {}  [{}]",
        p.strategy,
        p.workload.to_uppercase(),
        p.offered_ops_per_sec,
        p.offered_fraction
            .map_or(String::new(), |f| format!(" ({:.0} %)", f * 100.0)),
        p.ops_per_sec,
        if p.kept_up { "" } else { " (behind)" },
        us(p.put_p50_us),
        us(p.put_p99_us),
        us(p.get_p50_us),
        us(p.get_p99_us),
        p.schedule_lag_ms_max,
        p.errors + p.timeouts,
        p.media_timing_label()
    )
}

/// Every point: one row each.
pub fn table(points: &[SweepPoint]) -> String {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.strategy.clone(),
                p.workload.to_uppercase(),
                format!("{:.0}", p.offered_ops_per_sec),
                format!("{:.0}", p.ops_per_sec),
                if p.kept_up { "yes" } else { "no" }.to_string(),
                us(p.put_p50_us),
                us(p.put_p99_us),
                us(p.get_p50_us),
                us(p.get_p99_us),
                format!("{:.1}", p.schedule_lag_ms_max),
                format!("{}", p.errors + p.timeouts),
                p.media_timing_label(),
            ]
        })
        .collect();
    crate::table::render(
        &[
            "strategy",
            "workload",
            "offered ops/s",
            "achieved ops/s",
            "kept up",
            "put p50 µs",
            "put p99 µs",
            "get p50 µs",
            "get p99 µs",
            "lag ms",
            "errors",
            "timing model",
        ],
        &rows,
    )
}

/// The summary as a short table and the comparison with the paper; every
/// line names the timing model (`timing`, e.g. [`SweepPoint::media_timing_label`]).
pub fn summary_report(s: &SweepSummary, timing: &str) -> String {
    use std::fmt::Write;
    let rows: Vec<Vec<String>> = s
        .peaks
        .iter()
        .map(|p| {
            vec![
                p.strategy.clone(),
                format!("{:.0}", p.peak_ops_per_sec),
                format!("{:.0}", p.peak_load.offered_ops_per_sec),
                format!("{:.0}", p.peak_load.ops_per_sec),
                us(p.peak_load.put_p50_us),
                us(p.peak_load.get_p50_us),
                timing.to_string(),
            ]
        })
        .collect();
    let mut out = crate::table::render(
        &[
            "strategy",
            "peak ops/s",
            "peak load: offered",
            "achieved",
            "put p50 µs",
            "get p50 µs",
            "timing model",
        ],
        &rows,
    );
    let met = |v: f64, goal: f64| if v >= goal { "met" } else { "NOT met" };
    match &s.rowan_vs_rpc {
        Some(c) => {
            let _ = writeln!(
                out,
                "At rpc's peak load (offered {:.0}, achieved {:.0} ops/s), rowan at offered {:.0} ops/s \
                 ({:+.1} % of that load) [{timing}]",
                c.rpc.offered_ops_per_sec,
                c.rpc.ops_per_sec,
                c.rowan.offered_ops_per_sec,
                c.load_offset * 100.0
            );
            match c.put_p50_ratio {
                Some(r) => {
                    let _ = writeln!(
                        out,
                        "  median PUT: rpc {} µs / rowan {} µs = {r:.2}x (paper {PAPER_PUT_P50_RATIO}x, \
                         goal >= {GOAL_PUT_P50_RATIO_MIN}x: {}) [{timing}]",
                        us(c.rpc.put_p50_us),
                        us(c.rowan.put_p50_us),
                        met(r, GOAL_PUT_P50_RATIO_MIN)
                    );
                }
                None => {
                    let _ = writeln!(out, "  median PUT: no PUTs measured [{timing}]");
                }
            }
            if let Some(r) = c.get_p50_ratio {
                let _ = writeln!(
                    out,
                    "  median GET: rpc {} µs / rowan {} µs = {r:.2}x (paper: 23 % lower for rowan) [{timing}]",
                    us(c.rpc.get_p50_us),
                    us(c.rowan.get_p50_us)
                );
            }
            let _ = writeln!(
                out,
                "Peak throughput: rowan / rpc = {:.2}x (paper {PAPER_PEAK_RATIO}x, goal >= {GOAL_PEAK_RATIO_MIN}x: {}) [{timing}]",
                c.peak_ratio,
                met(c.peak_ratio, GOAL_PEAK_RATIO_MIN)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "The paper's comparison needs both rowan and rpc in --compare [{timing}]"
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A client that is stepped every `step_ns` from 0 to `end_ns`, sends what
    /// its schedule has due while it has fewer than `inflight_max` in flight,
    /// and whose every operation takes `service_ns` from send to completion —
    /// except that it is not stepped at all in `stall` (start, end). Returns
    /// each operation's (scheduled, latency from schedule in µs).
    fn simulate(
        schedule: &mut Schedule,
        step_ns: u64,
        end_ns: u64,
        inflight_max: usize,
        service_ns: u64,
        stall: Option<(u64, u64)>,
    ) -> Vec<(u64, u64)> {
        let mut inflight: Vec<(u64, u64)> = Vec::new(); // (scheduled, sent)
        let mut done = Vec::new();
        let mut now = 0;
        while now <= end_ns {
            if stall.is_some_and(|(from, to)| now >= from && now < to) {
                now += step_ns;
                continue;
            }
            inflight.retain(|&(scheduled, sent)| {
                let finished = sent + service_ns <= now;
                if finished {
                    let lat =
                        latency_from_schedule_us(scheduled, sent, Duration::from_nanos(now - sent));
                    done.push((scheduled, lat));
                }
                !finished
            });
            while inflight.len() < inflight_max {
                match schedule.take_due(now) {
                    Some(s) => inflight.push((s, now)),
                    None => break,
                }
            }
            now += step_ns;
        }
        done
    }

    #[test]
    fn latency_counts_from_the_scheduled_start() {
        // Sent 3 ms late, 200 µs of service: 3.2 ms, not 200 µs.
        assert_eq!(
            latency_from_schedule_us(10 * MS, 13 * MS, Duration::from_micros(200)),
            3_200
        );
        // On time: the service alone; never below the histograms' 1 µs.
        assert_eq!(
            latency_from_schedule_us(5 * MS, 5 * MS, Duration::from_micros(70)),
            70
        );
        assert_eq!(latency_from_schedule_us(0, 0, Duration::ZERO), 1);
    }

    #[test]
    #[should_panic(expected = "before its schedule")]
    fn an_operation_cannot_be_sent_before_its_schedule() {
        latency_from_schedule_us(2 * MS, MS, Duration::ZERO);
    }

    #[test]
    fn an_uniform_schedule_is_due_at_its_gaps_and_staggered() {
        // 1000 ops/s: one every ms; half a gap in.
        let mut s = Schedule::new(Arrivals::Uniform, 1000.0, 10 * MS, 0.5, 1);
        assert_eq!(s.next_ns(), 10 * MS + MS / 2);
        assert_eq!(s.take_due(10 * MS), None, "not due before its time");
        assert_eq!(s.take_due(10 * MS + MS / 2), Some(10 * MS + MS / 2));
        assert_eq!(s.take_due(11 * MS), None);
        // Three gaps later, three are due, each with its own scheduled time.
        let now = 13 * MS + MS / 2;
        assert_eq!(s.lag_ns(now), 2 * MS);
        let due: Vec<u64> = std::iter::from_fn(|| s.take_due(now)).collect();
        assert_eq!(
            due,
            vec![11 * MS + MS / 2, 12 * MS + MS / 2, 13 * MS + MS / 2]
        );
        assert_eq!(s.lag_ns(now), 0);
    }

    #[test]
    fn rates_are_honoured_over_a_window() {
        // Uniform: exactly the rate (give or take the one at the edge).
        let mut s = Schedule::new(Arrivals::Uniform, 2_500.0, 0, 0.0, 7);
        let sent = simulate(&mut s, 10_000, 2_000 * MS, usize::MAX, 50_000, None);
        assert!((4_999..=5_001).contains(&sent.len()), "{}", sent.len());
        // Poisson: 20,000 ops/s over 2 s is 40,000 arrivals; a Poisson count's
        // standard deviation is its root (200); allow 5 of them.
        for seed in 0..4 {
            let mut s = Schedule::new(Arrivals::Poisson, 20_000.0, 0, 0.0, seed);
            let n = std::iter::from_fn(|| s.take_due(2_000 * MS)).count() as f64;
            assert!((n - 40_000.0).abs() < 1_000.0, "seed {seed}: {n} arrivals");
        }
        // Poisson gaps are exponential: their coefficient of variation is 1
        // (uniform gaps have 0).
        let mut s = Schedule::new(Arrivals::Poisson, 1_000.0, 0, 0.0, 3);
        let times: Vec<f64> = std::iter::from_fn(|| s.take_due(20_000 * MS))
            .map(|t| t as f64)
            .collect();
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.1, "coefficient of variation {cv}");
        assert!((mean - 1e6).abs() < 0.05e6, "mean gap {mean} ns");
    }

    #[test]
    fn a_late_send_shows_up_in_the_latency() {
        // 1000 ops/s, 100 µs of service, stepped every 10 µs: every operation
        // takes 100 µs...
        let mut s = Schedule::new(Arrivals::Uniform, 1000.0, 0, 0.0, 1);
        let calm = simulate(&mut s, 10_000, 50 * MS, 4, 100_000, None);
        assert!(calm.iter().all(|&(_, l)| l == 100), "{calm:?}");
        // ... but a client not stepped from 10 to 15 ms sends the operations
        // due meanwhile at 15 ms: each one's latency includes its wait.
        let mut s = Schedule::new(Arrivals::Uniform, 1000.0, 0, 0.0, 1);
        let stalled = simulate(
            &mut s,
            10_000,
            50 * MS,
            usize::MAX,
            100_000,
            Some((10 * MS, 15 * MS)),
        );
        let of = |t: u64| stalled.iter().find(|&&(s, _)| s == t).expect("sent").1;
        assert_eq!(of(9 * MS), 100);
        assert_eq!(of(10 * MS), 5_100, "scheduled at 10 ms, sent at 15 ms");
        assert_eq!(of(12 * MS), 3_100);
        assert_eq!(of(14 * MS), 1_100);
        assert_eq!(of(16 * MS), 100, "back on schedule");
        // Measured from the send instead, all would read 100 µs: the stall
        // would be invisible (coordinated omission).
        assert_eq!(stalled.len(), calm.len());
    }

    #[test]
    fn a_wait_for_the_inflight_bound_counts() {
        // One in flight at a time, each taking 3 ms, offered every ms: the
        // client can send one per 3 ms, so the k-th operation waits about
        // 2k ms for the bound before it is sent — and its latency says so.
        let mut s = Schedule::new(Arrivals::Uniform, 1000.0, 0, 0.0, 1);
        let done = simulate(&mut s, 10_000, 30 * MS, 1, 3 * MS, None);
        assert_eq!(done[0], (0, 3_000));
        assert_eq!(
            done[1],
            (MS, 5_000),
            "scheduled at 1 ms, sent at 3, done at 6"
        );
        assert_eq!(done[2], (2 * MS, 7_000));
        let latencies: Vec<u64> = done.iter().map(|d| d.1).collect();
        assert!(latencies.windows(2).all(|w| w[1] > w[0]), "{latencies:?}");
        // Throughput is what the bound allows, not what was offered.
        assert!(done.len() <= 30 / 3, "{}", done.len());
    }

    #[test]
    fn stages_round_trip_through_one_word() {
        for stage in [
            Stage::Idle,
            Stage::Stop,
            Stage::Probe { measuring: false },
            Stage::Probe { measuring: true },
            Stage::Point {
                index: 0,
                measuring: false,
            },
            Stage::Point {
                index: 0,
                measuring: true,
            },
            Stage::Point {
                index: RATES_MAX - 1,
                measuring: true,
            },
        ] {
            assert_eq!(Stage::decode(stage.encode()), stage);
        }
    }

    #[test]
    fn fractions_are_even_steps_to_past_the_peak() {
        let f = fractions(RATE_STEPS_DEFAULT);
        assert_eq!(f.len(), 12);
        assert!((f[0] - 0.1).abs() < 1e-12 && (f[11] - 1.2).abs() < 1e-12);
        assert!(f.windows(2).all(|w| (w[1] - w[0] - 0.1).abs() < 1e-12));
        assert_eq!(fractions(4), vec![0.3, 0.6, 0.9, 1.2]);
    }

    #[test]
    fn options_are_checked() {
        let bad = |f: fn(&mut SweepOptions)| {
            let mut o = SweepOptions::default();
            f(&mut o);
            o.check().unwrap_err().to_string()
        };
        assert!(bad(|o| o.ycsb.workload = Workload::F).contains("YCSB-A, B or C"));
        assert!(bad(|o| o.rates = Rates::Fixed(vec![])).contains("rates"));
        assert!(bad(|o| o.rates = Rates::Fixed(vec![100.0, f64::NAN])).contains("rates"));
        assert!(bad(|o| o.rates = Rates::steps(RATES_MAX + 1)).contains("rates"));
        assert!(bad(|o| o.ycsb.seconds = 0.0).contains("window"));
        assert!(bad(|o| o.inflight_per_client_max = 0).contains("at least 1"));
        SweepOptions::default().check().unwrap();
        assert!("poisson".parse::<Arrivals>().is_ok());
        assert!("bursty".parse::<Arrivals>().is_err());
    }

    /// A hand-made point: `put` and `get` are the medians in µs.
    fn pt(strategy: &str, offered: f64, achieved: f64, put: f64, get: f64) -> SweepPoint {
        SweepPoint {
            strategy: strategy.into(),
            workload: "a".into(),
            sizes: "zippydb".into(),
            keys: "zipfian".into(),
            arrivals: Arrivals::Poisson,
            shared_stream: false,
            offered_ops_per_sec: offered,
            offered_fraction: None,
            probe_ops_per_sec: None,
            ops_per_sec: achieved,
            kept_up: kept_up(offered, achieved),
            ops: achieved as u64 * 5,
            puts: achieved as u64 * 5 / 2,
            gets: achieved as u64 * 5 / 2,
            put_p50_us: put,
            put_p99_us: put * 4.0,
            put_p999_us: put * 8.0,
            get_p50_us: get,
            get_p99_us: get * 4.0,
            get_p999_us: get * 8.0,
            schedule_lag_ms_max: 0.0,
            errors: 0,
            timeouts: 0,
            seconds: 5.0,
            warmup_seconds: 1.0,
            servers: 3,
            replication_factor: 3,
            workers: 48,
            clients: 48,
            inflight_per_client_max: 16,
            records: 200_000,
            media_timing: true,
            media_write_bytes_per_sec_per_dimm: Some(4_000_000),
            fabric: FabricKind::Loopback,
            models: None,
        }
    }

    /// rpc saturates near 80 K (its 100 K point falls behind, its 120 K one
    /// achieves the most, with a huge median); rowan near 110 K.
    fn sweep() -> Vec<SweepPoint> {
        vec![
            pt("rowan", 20_000.0, 20_000.0, 300.0, 150.0),
            pt("rowan", 50_000.0, 49_900.0, 400.0, 180.0),
            pt("rowan", 80_000.0, 79_800.0, 700.0, 250.0),
            pt("rowan", 110_000.0, 106_000.0, 2_000.0, 700.0),
            pt("rowan", 140_000.0, 112_000.0, 90_000.0, 50_000.0),
            pt("rpc", 20_000.0, 19_900.0, 450.0, 200.0),
            pt("rpc", 60_000.0, 59_700.0, 800.0, 300.0),
            pt("rpc", 78_000.0, 77_000.0, 1_400.0, 400.0),
            pt("rpc", 100_000.0, 84_000.0, 60_000.0, 30_000.0),
            pt("rpc", 120_000.0, 86_000.0, 200_000.0, 90_000.0),
        ]
    }

    #[test]
    fn summary_takes_peaks_the_knee_and_the_nearest_rowan_point() {
        let s = summarize(&sweep());
        assert_eq!(s.peaks.len(), 2);
        assert_eq!(s.peaks[0].strategy, "rowan");
        assert_eq!(s.peaks[0].peak_ops_per_sec, 112_000.0);
        // 106 K of 110 K is 96 %: kept up.
        assert_eq!(s.peaks[0].peak_load.offered_ops_per_sec, 110_000.0);
        let rpc = &s.peaks[1];
        assert_eq!(rpc.peak_ops_per_sec, 86_000.0, "the highest throughput");
        // The knee, not the overloaded point of the highest throughput.
        assert_eq!(rpc.peak_load.offered_ops_per_sec, 78_000.0);
        assert!(rpc.peak_load.kept_up);

        let c = s.rowan_vs_rpc.clone().expect("rowan and rpc");
        // rpc's peak load achieved 77 K: rowan's nearest offered rate is 80 K.
        assert_eq!(c.rowan.offered_ops_per_sec, 80_000.0);
        assert!((c.load_offset - (80_000.0 / 77_000.0 - 1.0)).abs() < 1e-12);
        assert!((c.put_p50_ratio.unwrap() - 1_400.0 / 700.0).abs() < 1e-12);
        assert!((c.get_p50_ratio.unwrap() - 400.0 / 250.0).abs() < 1e-12);
        assert!((c.peak_ratio - 112_000.0 / 86_000.0).abs() < 1e-12);

        let report = summary_report(&s, "media timing on (4 MB/s per DIMM)");
        assert!(report.contains("2.00x"), "{report}");
        assert!(report.contains("1.30x"), "{report}");
        // Every line but the table's header and rule names the timing model.
        assert!(
            report
                .lines()
                .skip(2)
                .all(|l| l.contains("media timing on (4 MB/s per DIMM)")),
            "{report}"
        );
    }

    #[test]
    fn summary_ties_go_to_the_higher_rate_and_gaps_are_reported() {
        // rpc's knee achieves 60 K; rowan ran 50 K and 70 K only: equally
        // near, the higher one is taken.
        let points = vec![
            pt("rpc", 60_000.0, 60_000.0, 1_000.0, 300.0),
            pt("rowan", 50_000.0, 50_000.0, 400.0, 200.0),
            pt("rowan", 70_000.0, 70_000.0, 500.0, 220.0),
        ];
        let c = summarize(&points).rowan_vs_rpc.unwrap();
        assert_eq!(c.rowan.offered_ops_per_sec, 70_000.0);
        assert!((c.load_offset - 1.0 / 6.0).abs() < 1e-12);
        assert!((c.put_p50_ratio.unwrap() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn summary_without_a_kept_up_point_or_without_rpc() {
        // Every rpc point behind: its peak load is its highest throughput.
        let points = vec![
            pt("rpc", 50_000.0, 30_000.0, 9_000.0, 3_000.0),
            pt("rpc", 80_000.0, 31_000.0, 20_000.0, 6_000.0),
            pt("rowan", 30_000.0, 30_000.0, 500.0, 200.0),
        ];
        let s = summarize(&points);
        assert_eq!(s.peaks[0].peak_load.offered_ops_per_sec, 80_000.0);
        assert!(!s.peaks[0].peak_load.kept_up);
        // Workload C: no PUTs, no PUT ratio.
        let mut c_only = points.clone();
        for p in &mut c_only {
            p.put_p50_us = 0.0;
        }
        let c = summarize(&c_only).rowan_vs_rpc.unwrap();
        assert_eq!(c.put_p50_ratio, None);
        assert!(c.get_p50_ratio.is_some());
        let report = summary_report(&summarize(&c_only), "media timing off");
        assert!(report.contains("no PUTs measured"), "{report}");

        let alone = summarize(&points[2..]);
        assert_eq!(alone.peaks.len(), 1);
        assert_eq!(alone.rowan_vs_rpc, None);
        assert!(summary_report(&alone, "media timing off").contains("needs both rowan and rpc"));
        assert_eq!(summarize(&[]).peaks.len(), 0);
    }

    #[test]
    fn every_printed_line_names_the_timing_model() {
        let points = sweep();
        for p in &points {
            assert!(point_line(p).contains("media timing on (4 MB/s per DIMM)"));
        }
        let t = table(&points);
        assert!(t
            .lines()
            .skip(2)
            .all(|l| l.contains("media timing on (4 MB/s per DIMM)")));
        let mut off = pt("rowan", 1.0, 1.0, 1.0, 1.0);
        off.media_timing = false;
        off.media_write_bytes_per_sec_per_dimm = None;
        assert!(point_line(&off).contains("media timing off"));
    }
}
