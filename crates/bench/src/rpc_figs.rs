//! Seed 002 §5.4 and §5.5: the rest of the durable-RPC evaluation, beside Figures 8
//! and 9 ([`crate::rpc`]), on the same loopback fabric with the same wire model on
//! (`WireModel::CONNECTX5`, never tuned) and the receiver's memory a
//! `rowankv_pmem::Pool`.
//!
//! | figure | swept | designs | object | receiver processing |
//! | --- | --- | --- | --- | --- |
//! | 12 | availability × write ratio; real receiver crashes | the four durable vs DaRPC (SEND) and FaRM (WRITE), resending | 1 KiB | 100 µs |
//! | 13 | object size 64 B .. 64 KiB | all eleven (FaSST ≤ 4 KiB) | swept | none |
//! | 15 | receiver processing per request 0 .. 200 µs | the ten without FaSST | 64 KiB | swept |
//! | 17 | concurrent senders 1 .. 8 to one receiver | the ten without FaSST | 64 KiB | none |
//! | 18 | write ratio 5 %, 50 %, 95 % | the ten without FaSST | 64 KiB | none |
//! | 19 | batch size (`FlowConfig::batch_max`) 1 .. 16 | the four durable; the seven classic at 1 as reference | 1 KiB | none |
//!
//! 64 KiB is the paper's default object (§5.1, "the default object size is 64 KB");
//! FaSST cannot carry it (one UD message within the 4 KiB MTU), and the paper's
//! Figure 15 leaves it out as we do for every 64 KiB figure.
//!
//! # Reads and writes
//! A write carries the object (`size` bytes) and is answered with 8 bytes; a read
//! carries 16 bytes and is answered with the object. Classic: the sender waits for
//! the reply of either. Durable: a write's op is its durable acknowledgement (as in
//! Figure 8); a read's op is its completion (the sender needs the reply: "RDMA read
//! operations are on the critical path", §5.5). Which ops are writes: a
//! deterministic, evenly spread pattern with exactly the ratio ([`is_write`]).
//!
//! # Figure 12: how availability is modelled
//! A workload of [`Sweeps::fig12_requests`] requests runs once per design, write
//! ratio and availability level. The receiver really crashes: its thread is stopped
//! right after the sender issues a request, the fabric's `power_fail` drops every
//! line of its pool (crash simulator on) that was not persisted, and it restarts:
//! the durable receiver by `Receiver::open` on its pool (recovery re-executes the
//! requests its redo ring holds; the sender resends only from `next_seq` and the
//! reads whose replies were lost), the classic server by a new `Server` on the same
//! pool (nothing to recover; the sender resends its unanswered request). All of
//! that — the restart, recovery, reconnection, the resends — is measured wall time.
//! Two costs are modelled, added and never slept, and printed apart:
//! - **downtime per failure** `D` = [`DOWNTIME_PER_FAILURE_NS`] (3 ms: the paper's
//!   300 ms unikernel start-up, §5.4, divided by 100 because our workload is 10⁴
//!   requests, not 10⁹), paid by both kinds;
//! - **re-transfer interval** `R` = [`RETRANSFER_INTERVAL_NS`] (1 ms: the paper's
//!   100 ms, divided by the same 100), paid by a resending (classic) sender once per
//!   failure that left it a request unanswered: it learns only from its timer that
//!   the request must be sent again. A durable sender is told by the restarted
//!   receiver (`Offer::next_seq`) what took effect, and pays no timer.
//!
//! Availability `A` = uptime / (uptime + downtime) sets the failures: the mean
//! uptime between failures is `MTBF = D·A/(1−A)`, which at a nominal
//! [`NOMINAL_UPTIME_PER_REQUEST_NS`] (125 µs: 100 µs of processing plus the
//! wire, about what every design takes under this load) is a failure every
//! `K = round(MTBF / 125 µs)` requests issued ([`requests_between_failures`]). The
//! same request indices crash every design ([`crash_points`]); the availability
//! each run actually had (its measured time against its modelled downtime) is
//! printed beside it.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use plotters::prelude::*;
use rowankv_classic_rpc::{
    ClientStats, Design, Handler, Layout, RpcError, ServerConfig, ServerStats, Totals,
};
use rowankv_drpc::layout::request_bytes;
use rowankv_drpc::{
    DrpcError, Event, FlowConfig, Receiver, ReceiverStats, RingGeometry, SenderStats, Variant,
};
use rowankv_fabric::{Fabric, FaultInjector, LoopbackFabric, LoopbackNic, PowerFailure, WireModel};
use rowankv_types::NodeId;
use serde::Serialize;

use crate::plot::{self, PlotError, FONT_FAMILY};
pub use crate::rpc::is_write;
use crate::rpc::{
    self, classic_limit, classic_server, connect_sender, drive_classic, drive_durable,
    durable_receiver, elapsed_ns, histogram, opt, pool, record, request, size_name, us, Await,
    BenchOperator, Idle, OpCounts, ReceiverThread, RpcBenchError, RpcDesign, SenderMeasure,
    Workload, DESIGNS, RECEIVER, REPLY_BYTES, STALL_NS_MAX,
};

/// The figures `rowankv bench rpc --figures` can run (9 is 8's latencies).
pub const FIGURES: [u32; 7] = [8, 12, 13, 15, 17, 18, 19];
/// The paper's default object (§5.1).
pub const DEFAULT_OBJECT_BYTES: usize = 64 << 10;
/// Figure 19's object (batching amortises per-message costs; at 64 KiB a batch of
/// 16 would be a 1 MiB entry whose wire time hides them).
pub const FIG19_OBJECT_BYTES: usize = 1024;
/// Figure 12's object and processing.
pub const FIG12_OBJECT_BYTES: usize = 1024;
pub const FIG12_PROCESSING_NS: u64 = rowankv_classic_rpc::HEAVY_LOAD_PROCESSING_NS;
/// A read request's bytes.
pub const READ_REQUEST_BYTES: usize = 16;
/// Figure 12's modelled costs (see the module documentation).
pub const DOWNTIME_PER_FAILURE_NS: u64 = 3_000_000;
pub const RETRANSFER_INTERVAL_NS: u64 = 1_000_000;
pub const NOMINAL_UPTIME_PER_REQUEST_NS: u64 = 125_000;
/// The resending baseline each durable design is normalised to in Figure 12.
pub const FIG12_SEND_BASELINE: &str = "darpc";
pub const FIG12_WRITE_BASELINE: &str = "farm";
const FIRST_SENDER: u32 = 1;

/// Mean uptime between failures at availability `a` (0 < a < 1), ns.
pub fn mtbf_ns(a: f64) -> f64 {
    DOWNTIME_PER_FAILURE_NS as f64 * a / (1.0 - a)
}

/// Requests issued between two failures at availability `a`; `None` at `a` ≥ 1.
pub fn requests_between_failures(a: f64) -> Option<u64> {
    (a < 1.0).then(|| ((mtbf_ns(a) / NOMINAL_UPTIME_PER_REQUEST_NS as f64).round() as u64).max(1))
}

/// The request counts after whose issue the receiver crashes: every K-th request
/// of the `n` (none at the last: a crash must leave work behind it).
pub fn crash_points(n: u64, a: f64) -> Vec<u64> {
    match requests_between_failures(a) {
        None => Vec::new(),
        Some(k) => (1..).map(|i| i * k).take_while(|&c| c < n).collect(),
    }
}

/// The availability a run had: its measured time against its modelled downtime.
pub fn availability_of(measured_secs: f64, failures: u64) -> f64 {
    let down = failures as f64 * DOWNTIME_PER_FAILURE_NS as f64 / 1e9;
    if measured_secs + down <= 0.0 {
        return 1.0;
    }
    measured_secs / (measured_secs + down)
}

/// Figure 12's total: measured time plus the modelled downtime and re-transfer
/// waits, seconds.
pub fn fig12_total_secs(measured_secs: f64, failures: u64, retransfer_waits: u64) -> f64 {
    measured_secs + modelled_secs(failures, retransfer_waits)
}

/// Figure 12's modelled downtime and re-transfer waits, seconds.
fn modelled_secs(failures: u64, retransfer_waits: u64) -> f64 {
    (failures * DOWNTIME_PER_FAILURE_NS + retransfer_waits * RETRANSFER_INTERVAL_NS) as f64 / 1e9
}

/// What each figure sweeps.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweeps {
    pub fig12_requests: u64,
    pub fig12_write_pct: Vec<u32>,
    /// 1.0: no failure (the failure-free reference).
    pub fig12_availability: Vec<f64>,
    pub fig13_sizes: Vec<usize>,
    pub fig15_processing_us: Vec<u64>,
    pub fig17_senders: Vec<usize>,
    pub fig18_write_pct: Vec<u32>,
    pub fig19_batch: Vec<usize>,
}

impl Sweeps {
    pub fn full() -> Sweeps {
        Sweeps {
            fig12_requests: 6_000,
            fig12_write_pct: vec![5, 50, 95],
            fig12_availability: vec![1.0, 0.99, 0.95, 0.90],
            fig13_sizes: vec![64, 256, 1024, 4096, 16 << 10, 64 << 10],
            fig15_processing_us: vec![0, 10, 25, 50, 100, 200],
            fig17_senders: vec![1, 2, 4, 8],
            fig18_write_pct: vec![5, 50, 95],
            fig19_batch: vec![1, 2, 4, 8, 16],
        }
    }

    /// One or two values of each sweep, small workloads: the CI smoke run.
    pub fn quick() -> Sweeps {
        Sweeps {
            fig12_requests: 400,
            fig12_write_pct: vec![50],
            fig12_availability: vec![0.90],
            fig13_sizes: vec![64, 64 << 10],
            fig15_processing_us: vec![0, 100],
            fig17_senders: vec![1, 2],
            fig18_write_pct: vec![5, 95],
            fig19_batch: vec![1, 4],
        }
    }
}

/// What to run for the figures of this module.
#[derive(Clone, Debug)]
pub struct FigOptions {
    pub sweeps: Sweeps,
    /// Per point: unmeasured, then measured (Figure 12 runs its workload whole).
    pub warmup_ms: u64,
    pub measure_ms: u64,
    pub model: WireModel,
    /// Only these designs (of each figure's own list), if set.
    pub only: Option<Vec<RpcDesign>>,
}

impl FigOptions {
    pub fn full() -> FigOptions {
        FigOptions {
            sweeps: Sweeps::full(),
            warmup_ms: 100,
            measure_ms: 400,
            model: WireModel::CONNECTX5,
            only: None,
        }
    }

    pub fn quick() -> FigOptions {
        FigOptions {
            sweeps: Sweeps::quick(),
            warmup_ms: 10,
            measure_ms: 40,
            model: WireModel::CONNECTX5,
            only: None,
        }
    }
}

fn design(name: &str) -> RpcDesign {
    RpcDesign::from_name(name).expect("a known design")
}

/// The designs a figure compares, in the paper's order (before `--designs`).
pub fn figure_designs(figure: u32) -> Vec<RpcDesign> {
    match figure {
        12 => ["darpc", "farm", "sflush", "wflush", "s-rflush", "w-rflush"]
            .iter()
            .map(|n| design(n))
            .collect(),
        13 => DESIGNS.iter().map(|n| design(n)).collect(),
        19 => DESIGNS.iter().map(|n| design(n)).collect(),
        _ => DESIGNS
            .iter()
            .filter(|n| **n != "fasst")
            .map(|n| design(n))
            .collect(),
    }
}

/// Figure 12's resending baseline of a design's family.
pub fn fig12_baseline(d: RpcDesign) -> &'static str {
    if d.family() == "send" {
        FIG12_SEND_BASELINE
    } else {
        FIG12_WRITE_BASELINE
    }
}

/// What Figure 12 measured of one run.
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryMeasure {
    /// The availability level asked for (1.0: no failure).
    pub availability: f64,
    /// The availability the run had: measured / (measured + modelled downtime).
    pub effective_availability: f64,
    pub requests: u64,
    pub write_pct: u32,
    pub failures: u64,
    pub requests_between_failures: Option<u64>,
    /// Wall time of the whole workload: requests, crashes, restarts, recovery,
    /// reconnections, resends.
    pub measured_secs: f64,
    /// Of it: restart and recovery (`Receiver::open` with its re-executions, or a
    /// new classic server) and reconnection.
    pub recovery_secs: f64,
    pub modelled_downtime_secs: f64,
    pub modelled_retransfer_secs: f64,
    pub total_secs: f64,
    /// Requests recovery re-executed from the redo ring (durable only).
    pub reexecuted: u64,
    /// Requests the sender sent again after a failure.
    pub resent: u64,
    /// Failures after which the sender waited its re-transfer interval.
    pub retransfer_waits: u64,
    /// The resending baseline of the family, and total / its total (same write
    /// ratio and availability); 1 for the baseline itself.
    pub baseline: String,
    pub normalized_total: Option<f64>,
    /// What the failures cost within this run, apart from the design's failure-free
    /// speed: modelled downtime + modelled re-transfer waits + measured restart and
    /// recovery (for a durable receiver this includes re-executing the ring's
    /// requests, work a failure-free run does too: an upper bound). And that over
    /// the baseline's at the same write ratio and availability.
    pub failure_cost_secs: f64,
    pub failure_cost_vs_baseline: Option<f64>,
}

/// One measured point of Figures 12..19.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FigPoint {
    pub figure: u32,
    pub design: String,
    pub kind: String,
    pub family: String,
    /// The swept parameter and its value.
    pub param: String,
    pub param_value: f64,
    pub size_bytes: usize,
    pub processing_ns: u64,
    pub senders: usize,
    pub write_pct: u32,
    /// Requests per durable entry (`FlowConfig::batch_max`); 1 for classic.
    pub batch_max: usize,
    pub applicable: bool,
    pub note: Option<String>,
    pub op_counts: String,
    pub ops_per_sec: Option<f64>,
    pub ops_measured: Option<u64>,
    pub measured_secs: Option<f64>,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub requests_counted: Option<u64>,
    pub round_trips_per_op: Option<f64>,
    pub messages_per_op: Option<f64>,
    pub verbs_per_op: Option<f64>,
    pub bytes_to_receiver_per_op: Option<f64>,
    pub bytes_to_sender_per_op: Option<f64>,
    pub receiver_persists_per_op: Option<f64>,
    pub recovery: Option<RecoveryMeasure>,
    pub wire_model: String,
}

/// One point to measure.
#[derive(Clone, Copy, Debug)]
struct Spec {
    figure: u32,
    design: RpcDesign,
    size: usize,
    processing_ns: u64,
    senders: usize,
    write_pct: u32,
    batch: usize,
    param: &'static str,
    value: f64,
}

impl Spec {
    fn base(figure: u32, design: RpcDesign) -> Spec {
        Spec {
            figure,
            design,
            size: DEFAULT_OBJECT_BYTES,
            processing_ns: 0,
            senders: 1,
            write_pct: 100,
            batch: 1,
            param: "",
            value: 0.0,
        }
    }
}

fn op_counts(d: RpcDesign, write_pct: u32) -> String {
    match (d.is_durable(), write_pct) {
        (false, _) => "reply received (1 call outstanding per sender)".into(),
        (true, 100) => {
            "durable ack received (processed later, FIFO; next request sent on the ack)".into()
        }
        (true, _) => "write: durable ack received; read: its reply (completion) received".into(),
    }
}

fn blank(s: &Spec, model: &WireModel) -> FigPoint {
    FigPoint {
        figure: s.figure,
        design: s.design.name().into(),
        kind: s.design.kind().into(),
        family: s.design.family().into(),
        param: s.param.into(),
        param_value: s.value,
        size_bytes: s.size,
        processing_ns: s.processing_ns,
        senders: s.senders,
        write_pct: s.write_pct,
        batch_max: s.batch,
        applicable: true,
        op_counts: op_counts(s.design, s.write_pct),
        wire_model: model.label(),
        ..FigPoint::default()
    }
}

/// The points of one figure, in sweep order.
fn specs(figure: u32, opts: &FigOptions) -> Vec<Spec> {
    let designs: Vec<RpcDesign> = figure_designs(figure)
        .into_iter()
        .filter(|d| opts.only.as_ref().is_none_or(|o| o.contains(d)))
        .collect();
    let sw = &opts.sweeps;
    let mut out = Vec::new();
    let d = &designs;
    match figure {
        13 => sweep(&mut out, d, 13, "size_bytes", &sw.fig13_sizes, |s, size| {
            s.size = size;
            size as f64
        }),
        15 => sweep(
            &mut out,
            d,
            15,
            "processing_us",
            &sw.fig15_processing_us,
            |s, p| {
                s.processing_ns = p * 1000;
                p as f64
            },
        ),
        17 => sweep(&mut out, d, 17, "senders", &sw.fig17_senders, |s, n| {
            s.senders = n;
            n as f64
        }),
        18 => sweep(&mut out, d, 18, "write_pct", &sw.fig18_write_pct, |s, w| {
            s.write_pct = w;
            f64::from(w)
        }),
        19 => {
            sweep(&mut out, d, 19, "batch_max", &sw.fig19_batch, |s, b| {
                s.size = FIG19_OBJECT_BYTES;
                s.batch = b;
                b as f64
            });
            // The classic designs do not batch: measured once, at 1.
            out.retain(|s| s.design.is_durable() || s.batch == 1);
        }
        12 => {
            for &w in &sw.fig12_write_pct {
                sweep(
                    &mut out,
                    d,
                    12,
                    "availability",
                    &sw.fig12_availability,
                    |s, a| {
                        s.size = FIG12_OBJECT_BYTES;
                        s.processing_ns = FIG12_PROCESSING_NS;
                        s.write_pct = w;
                        a
                    },
                );
            }
        }
        _ => {}
    }
    out
}

/// A point of `figure` per value of its sweep and design, in that order: `set`
/// puts the value in the point and says it as the parameter's value.
fn sweep<T: Copy>(
    out: &mut Vec<Spec>,
    designs: &[RpcDesign],
    figure: u32,
    param: &'static str,
    values: &[T],
    set: impl Fn(&mut Spec, T) -> f64,
) {
    for &v in values {
        for &d in designs {
            let mut s = Spec {
                param,
                ..Spec::base(figure, d)
            };
            s.value = set(&mut s, v);
            out.push(s);
        }
    }
}

/// How many points `figures` will measure.
pub fn point_count(figures: &[u32], opts: &FigOptions) -> usize {
    figures.iter().map(|&f| specs(f, opts).len()).sum()
}

/// Runs every point of `figures` (8 is not run here: see [`crate::rpc`]).
pub fn run(
    figures: &[u32],
    opts: &FigOptions,
    mut progress: impl FnMut(&FigPoint),
) -> Result<Vec<FigPoint>, RpcBenchError> {
    let mut points = Vec::new();
    for &f in figures {
        let mut of_fig = Vec::new();
        for s in specs(f, opts) {
            let p = if f == 12 {
                run_fig12(&s, opts)?
            } else {
                run_point(&s, opts)?
            };
            progress(&p);
            of_fig.push(p);
        }
        if f == 12 {
            normalise_fig12(&mut of_fig);
        }
        points.extend(of_fig);
    }
    Ok(points)
}

/// Figure 12: each run's total over its family's resending baseline's.
pub fn normalise_fig12(points: &mut [FigPoint]) {
    // (design, write %, availability) -> (total, failure cost).
    let of: Vec<(String, u32, f64, f64, f64)> = points
        .iter()
        .filter_map(|p| {
            let r = p.recovery.as_ref()?;
            Some((
                p.design.clone(),
                r.write_pct,
                r.availability,
                r.total_secs,
                r.failure_cost_secs,
            ))
        })
        .collect();
    for p in points.iter_mut() {
        let Some(r) = p.recovery.as_mut() else {
            continue;
        };
        let base = of
            .iter()
            .find(|(d, w, a, ..)| *d == r.baseline && *w == r.write_pct && *a == r.availability);
        r.normalized_total = base.map(|(.., t, _)| r.total_secs / t);
        r.failure_cost_vs_baseline = match base {
            Some((.., c)) if r.failures > 0 && *c > 0.0 => Some(r.failure_cost_secs / c),
            _ => None,
        };
    }
}

// ---------------------------------------------------------------------------
// Shared pieces

fn operator(s: &Spec) -> BenchOperator {
    BenchOperator {
        processing_ns: s.processing_ns,
        object: Arc::new(request(s.size)),
    }
}

fn write_request(size: usize) -> Vec<u8> {
    let mut r = request(size);
    r[0] = b'W';
    r
}

fn read_request() -> Vec<u8> {
    let mut r = vec![0u8; READ_REQUEST_BYTES];
    r[0] = b'R';
    r
}

/// Sender `c`'s workload of a point (senders start at different places of the
/// pattern).
fn workload<'a>(
    s: &Spec,
    opts: &FigOptions,
    write: &'a [u8],
    read: &'a [u8],
    c: usize,
) -> Workload<'a> {
    Workload {
        write,
        read,
        write_pct: s.write_pct,
        first_op: (c as u64) * 37,
        batch: s.batch,
        read_reply_bytes: s.size,
        warmup_ms: opts.warmup_ms,
        measure_ms: opts.measure_ms,
    }
}

/// The receiver's service for these figures, classic: a write is answered with 8
/// bytes, a read with the object (as [`BenchOperator`] does for the durable ones).
fn classic_handler(size: usize) -> Handler {
    let object = Arc::new(request(size));
    Arc::new(move |req: &[u8]| {
        if req.first() == Some(&b'R') {
            object.to_vec()
        } else {
            (req.len() as u64).to_le_bytes().to_vec()
        }
    })
}

fn classic_config(s: &Spec) -> ServerConfig {
    let reply = if s.write_pct < 100 {
        s.size
    } else {
        REPLY_BYTES
    };
    rpc::classic_config(s.senders, s.size, reply, s.processing_ns)
}

/// The point of a classic design that cannot carry its messages (FaSST above its
/// MTU), if it cannot.
fn inapplicable(d: Design, s: &Spec, config: &ServerConfig, model: &WireModel) -> Option<FigPoint> {
    let note = classic_limit(d, config, s.size, s.write_pct < 100, "message")?;
    Some(FigPoint {
        applicable: false,
        note: Some(note),
        ..blank(s, model)
    })
}

fn durable_flow(s: &Spec) -> FlowConfig {
    let reads = s.write_pct < 100;
    FlowConfig {
        reply_bytes_max: if reads {
            s.size.max(REPLY_BYTES)
        } else {
            REPLY_BYTES
        },
        batch_max: s.batch,
        ..rpc::flow()
    }
}

/// Rings for `senders` connections, each holding a window of the largest entries.
fn durable_geometry(s: &Spec, flow: &FlowConfig) -> RingGeometry {
    let body = s.batch * request_bytes(s.size.max(READ_REQUEST_BYTES));
    rpc::geometry(s.senders as u32, body, flow)
}

fn receiver_thread(
    receiver: Receiver<LoopbackNic, BenchOperator>,
) -> Result<ReceiverThread<BenchOperator>, RpcBenchError> {
    ReceiverThread::spawn(receiver, "drpc-receiver".into())
}

fn stalled(s: &Spec, message: String) -> RpcBenchError {
    RpcBenchError::Stalled {
        design: s.design.name(),
        size_bytes: s.size,
        load: "figure point",
        message: format!("figure {} {}={}: {message}", s.figure, s.param, s.value),
    }
}

/// `f` of each of `senders` on a thread of its own; the results in order.
fn on_threads<T: Send, R: Send>(senders: Vec<T>, f: impl Fn(usize, T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = senders
            .into_iter()
            .enumerate()
            .map(|(c, sender)| scope.spawn(move || f(c, sender)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a sender thread panicked"))
            .collect()
    })
}

impl FigPoint {
    fn set_counts(&mut self, c: &OpCounts) {
        self.requests_counted = Some(c.requests);
        self.round_trips_per_op = Some(c.round_trips);
        self.messages_per_op = Some(c.messages);
        self.verbs_per_op = Some(c.verbs);
        self.bytes_to_receiver_per_op = Some(c.bytes_to_receiver);
        self.bytes_to_sender_per_op = Some(c.bytes_to_sender);
        self.receiver_persists_per_op = Some(c.receiver_persists);
    }

    /// The senders' measures together: their op rates summed, the longest interval,
    /// the latencies merged.
    fn set_measure(&mut self, measures: &[SenderMeasure]) {
        let mut hist = histogram();
        let mut rate = 0.0;
        let mut ops = 0;
        let mut secs = 0.0f64;
        for m in measures {
            hist.add(&m.hist).expect("same bounds");
            rate += m.ops as f64 / m.secs.max(1e-9);
            ops += m.ops;
            secs = secs.max(m.secs);
        }
        self.ops_per_sec = Some(rate);
        self.ops_measured = Some(ops);
        self.measured_secs = Some(secs);
        self.set_latency(&hist);
    }

    fn set_latency(&mut self, hist: &Histogram<u64>) {
        self.mean_us = (!hist.is_empty()).then(|| hist.mean() / 1e3);
        self.p50_us = us(hist, 0.50);
        self.p99_us = us(hist, 0.99);
    }
}

// ---------------------------------------------------------------------------
// Figures 13, 15, 17, 18, 19: timed points

fn run_point(s: &Spec, opts: &FigOptions) -> Result<FigPoint, RpcBenchError> {
    match s.design {
        RpcDesign::Classic(d) => classic_point(d, s, opts),
        RpcDesign::Durable(v) => durable_point(v, s, opts),
    }
}

fn classic_point(d: Design, s: &Spec, opts: &FigOptions) -> Result<FigPoint, RpcBenchError> {
    let config = classic_config(s);
    if let Some(point) = inapplicable(d, s, &config, &opts.model) {
        return Ok(point);
    }
    let mut point = blank(s, &opts.model);
    let fabric = LoopbackFabric::with_model(opts.model)?;
    let pool = pool(Layout::new(&config).server_bytes(), false)?;
    let senders = FIRST_SENDER..FIRST_SENDER + s.senders as u32;
    let (running, clients) =
        classic_server(d, &fabric, pool, config, classic_handler(s.size), senders)?;
    let (write, read) = (write_request(s.size), read_request());
    let results = on_threads(clients, |c, mut client| {
        let m = drive_classic(&mut client, &workload(s, opts, &write, &read, c))?;
        Ok::<_, RpcError>((client.stats(), m))
    });
    let server = running.stop()?;
    let (stats, measures): (Vec<ClientStats>, Vec<SenderMeasure>) = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    point.set_measure(&measures);
    let totals = Totals::of(&stats, &server.stats());
    point.set_counts(&OpCounts::classic(&totals, totals.calls.max(1)));
    Ok(point)
}

fn durable_point(v: Variant, s: &Spec, opts: &FigOptions) -> Result<FigPoint, RpcBenchError> {
    let mut point = blank(s, &opts.model);
    let flow = durable_flow(s);
    let g = durable_geometry(s, &flow);
    let fabric = LoopbackFabric::with_model(opts.model)?;
    let pool = pool(g.pool_bytes(), false)?;
    let mut receiver = durable_receiver(&fabric, pool, g, flow, operator(s))?;
    let mut senders = Vec::new();
    for c in 0..s.senders as u32 {
        let node = NodeId(FIRST_SENDER + c);
        senders.push(connect_sender(&fabric, &mut receiver, node, c, v, flow)?);
    }
    let running = receiver_thread(receiver)?;
    let (write, read) = (write_request(s.size), read_request());
    let results = on_threads(senders, |c, mut sender| {
        let w = workload(s, opts, &write, &read, c);
        let m = drive_durable(&mut sender, &w).map_err(|e| e.to_string())?;
        Ok::<_, String>((sender.stats(), m))
    });
    let receiver = running.stop()?;
    let (sstats, measures): (Vec<SenderStats>, Vec<SenderMeasure>) = results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| stalled(s, e))?
        .into_iter()
        .unzip();
    let rs = receiver.stats();
    let sent: u64 = sstats.iter().map(|x| x.requests_sent).sum();
    assert_eq!(
        sent, rs.requests_completed,
        "every request sent was drained to its completion"
    );
    point.set_measure(&measures);
    let reply_bytes = measures.iter().map(|m| m.reply_bytes).sum();
    point.set_counts(&OpCounts::durable(&sstats, &rs, reply_bytes));
    Ok(point)
}

// ---------------------------------------------------------------------------
// Figure 12: a workload under real receiver crashes

#[derive(Default)]
struct Fig12Tally {
    failures: u64,
    recovery_ns: u64,
    reexecuted: u64,
    resent: u64,
    retransfer_waits: u64,
}

fn run_fig12(s: &Spec, opts: &FigOptions) -> Result<FigPoint, RpcBenchError> {
    let mut point = blank(s, &opts.model);
    let n = opts.sweeps.fig12_requests;
    let crashes = crash_points(n, s.value);
    let start = Instant::now();
    let mut hist = histogram();
    let tally = match s.design {
        RpcDesign::Classic(d) => {
            let config = classic_config(s);
            if let Some(point) = inapplicable(d, s, &config, &opts.model) {
                return Ok(point);
            }
            fig12_classic(d, s, opts, &config, &crashes, &mut hist, &mut point)?
        }
        RpcDesign::Durable(v) => fig12_durable(v, s, opts, &crashes, &mut hist, &mut point)?,
    };
    let measured = start.elapsed().as_secs_f64();
    let total = fig12_total_secs(measured, tally.failures, tally.retransfer_waits);
    point.ops_per_sec = Some(n as f64 / total);
    point.ops_measured = Some(n);
    point.measured_secs = Some(measured);
    point.set_latency(&hist);
    point.recovery = Some(RecoveryMeasure {
        availability: s.value,
        effective_availability: availability_of(measured, tally.failures),
        requests: n,
        write_pct: s.write_pct,
        failures: tally.failures,
        requests_between_failures: requests_between_failures(s.value),
        measured_secs: measured,
        recovery_secs: tally.recovery_ns as f64 / 1e9,
        modelled_downtime_secs: modelled_secs(tally.failures, 0),
        modelled_retransfer_secs: modelled_secs(0, tally.retransfer_waits),
        total_secs: total,
        reexecuted: tally.reexecuted,
        resent: tally.resent,
        retransfer_waits: tally.retransfer_waits,
        baseline: fig12_baseline(s.design).into(),
        normalized_total: None,
        failure_cost_secs: modelled_secs(tally.failures, tally.retransfer_waits)
            + tally.recovery_ns as f64 / 1e9,
        failure_cost_vs_baseline: None,
    });
    Ok(point)
}

fn add_server(acc: &mut ServerStats, s: &ServerStats) {
    acc.requests += s.requests;
    acc.persists += s.persists;
    acc.verbs.send += s.verbs.send;
    acc.verbs.write += s.verbs.write;
    acc.verbs.write_imm += s.verbs.write_imm;
    acc.verbs.read += s.verbs.read;
    acc.bytes_to_server += s.bytes_to_server;
    acc.bytes_to_client += s.bytes_to_client;
}

#[allow(clippy::too_many_arguments)]
fn fig12_classic(
    d: Design,
    s: &Spec,
    opts: &FigOptions,
    config: &ServerConfig,
    crashes: &[u64],
    hist: &mut Histogram<u64>,
    point: &mut FigPoint,
) -> Result<Fig12Tally, RpcBenchError> {
    let n = opts.sweeps.fig12_requests;
    let fabric = LoopbackFabric::with_model(opts.model)?;
    let pool = pool(Layout::new(config).server_bytes(), true)?;
    let handler = classic_handler(s.size);
    let (write, read) = (write_request(s.size), read_request());
    let work = workload(s, opts, &write, &read, 0);
    // The server, and a client of it on `node`.
    let start_server = |node: u32| -> Result<_, RpcBenchError> {
        let nodes = node..node + 1;
        let (running, mut clients) =
            classic_server(d, &fabric, pool.clone(), *config, handler.clone(), nodes)?;
        Ok((running, clients.pop().expect("one client")))
    };
    let mut node = FIRST_SENDER;
    let (mut running, mut client) = start_server(node)?;
    let mut client_acc = ClientStats::default();
    let mut server_acc = ServerStats::default();
    let mut t = Fig12Tally::default();
    for i in 0..n {
        let (_, _, req) = work.op(i);
        let called = Instant::now();
        if !crashes.contains(&(i + 1)) {
            client.call(req)?;
            record(hist, elapsed_ns(called));
            continue;
        }
        // The receiver crashes right after this request is posted.
        client.post(req)?;
        let stopped = running.stop()?;
        let answered = matches!(client.poll(), Ok(Some(_)));
        fabric.power_fail(RECEIVER, PowerFailure::DropAll);
        add_server(&mut server_acc, &stopped.stats());
        drop(stopped);
        client_acc.add(&client.stats());
        t.failures += 1;
        let restart = Instant::now();
        node += 1;
        (running, client) = start_server(node)?;
        t.recovery_ns += elapsed_ns(restart);
        if !answered {
            // Unanswered: after its re-transfer interval the sender sends it again.
            t.retransfer_waits += 1;
            t.resent += 1;
            client.call(req)?;
        }
        record(hist, elapsed_ns(called));
    }
    let stopped = running.stop()?;
    add_server(&mut server_acc, &stopped.stats());
    client_acc.add(&client.stats());
    let totals = Totals::of(&[client_acc], &server_acc);
    point.set_counts(&OpCounts::classic(&totals, n));
    Ok(t)
}

fn fig12_durable(
    v: Variant,
    s: &Spec,
    opts: &FigOptions,
    crashes: &[u64],
    hist: &mut Histogram<u64>,
    point: &mut FigPoint,
) -> Result<Fig12Tally, RpcBenchError> {
    let n = opts.sweeps.fig12_requests;
    let flow = durable_flow(s);
    let g = durable_geometry(s, &flow);
    let fabric = LoopbackFabric::with_model(opts.model)?;
    let pool = pool(g.pool_bytes(), true)?;
    let operator = operator(s);
    let (write, read) = (write_request(s.size), read_request());
    let work = workload(s, opts, &write, &read, 0);
    let mut node = FIRST_SENDER;
    let connect = |receiver: &mut Receiver<LoopbackNic, BenchOperator>, node: u32| {
        connect_sender(&fabric, receiver, NodeId(node), 0, v, flow)
    };
    let mut receiver = durable_receiver(&fabric, pool.clone(), g, flow, operator.clone())?;
    let mut sender = connect(&mut receiver, node)?;
    let mut running = receiver_thread(receiver)?;
    let mut t = Fig12Tally::default();
    let mut sstats: Vec<SenderStats> = Vec::new();
    let mut rstats: Vec<ReceiverStats> = Vec::new();
    // Outstanding requests: seq -> (op index, is a read, first called at).
    let mut outstanding: BTreeMap<u64, (u64, bool, Instant)> = BTreeMap::new();
    let mut first_called: BTreeMap<u64, Instant> = BTreeMap::new();
    let mut resend: VecDeque<u64> = VecDeque::new();
    let mut started = 0u64;
    let mut done = 0u64;
    let mut awaiting: Option<Await> = None;
    let mut events = Vec::new();
    let mut idle = Idle::default();
    let mut last_progress = Instant::now();
    let mut reply_bytes = 0u64;
    let finish = |op: u64, first: &mut BTreeMap<u64, Instant>, hist: &mut Histogram<u64>| {
        if let Some(at) = first.remove(&op) {
            record(hist, elapsed_ns(at));
        }
    };
    while done < n {
        if last_progress.elapsed() > Duration::from_nanos(STALL_NS_MAX) {
            return Err(stalled(
                s,
                format!(
                    "no progress ({done} of {n} done, {} outstanding)",
                    outstanding.len()
                ),
            ));
        }
        let mut crash_now = false;
        if awaiting.is_none() {
            let next = resend.front().copied().or((started < n).then_some(started));
            if let Some(op) = next {
                let (w, code, payload) = work.op(op);
                match sender.call(code, payload) {
                    Ok(seq) => {
                        let now = Instant::now();
                        if resend.front() == Some(&op) {
                            resend.pop_front();
                        } else {
                            started += 1;
                            first_called.insert(op, now);
                            crash_now = crashes.contains(&started);
                        }
                        outstanding.insert(seq, (op, !w, now));
                        awaiting = Some(if w {
                            Await::Durable(seq)
                        } else {
                            Await::Completed(seq)
                        });
                    }
                    Err(DrpcError::WouldBlock) => {}
                    Err(x) => return Err(x.into()),
                }
            }
        }
        if crash_now {
            // The receiver crashes right after this request is issued.
            let crashed = running.stop()?;
            events.clear();
            let _ = sender.poll(&mut events);
            for ev in events.drain(..) {
                if let Event::Completed { seq, reply } = ev {
                    reply_bytes += reply.len() as u64;
                    if let Some((op, ..)) = outstanding.remove(&seq) {
                        done += 1;
                        finish(op, &mut first_called, hist);
                    }
                }
            }
            fabric.power_fail(RECEIVER, PowerFailure::DropAll);
            rstats.push(crashed.stats());
            drop(crashed);
            sstats.push(sender.stats());
            t.failures += 1;
            let restart = Instant::now();
            let (mut receiver, report) = Receiver::open(
                pool.clone(),
                fabric.attach(RECEIVER)?,
                flow,
                operator.clone(),
            )?;
            let next_seq = report.next_seq[0];
            t.reexecuted += report.reexecuted.len() as u64;
            for (seq, (op, is_read, _)) in std::mem::take(&mut outstanding) {
                if seq < next_seq && !is_read {
                    // Took effect (before the crash, or re-executed by recovery).
                    done += 1;
                    finish(op, &mut first_called, hist);
                } else {
                    // Never durable, or a read whose reply was lost: sent again.
                    resend.push_back(op);
                    t.resent += 1;
                }
            }
            node += 1;
            sender = connect(&mut receiver, node)?;
            running = receiver_thread(receiver)?;
            t.recovery_ns += elapsed_ns(restart);
            awaiting = None;
            last_progress = Instant::now();
            continue;
        }
        sender.poll(&mut events)?;
        if events.is_empty() {
            idle.wait();
            continue;
        }
        idle.reset();
        last_progress = Instant::now();
        for ev in events.drain(..) {
            match ev {
                Event::Durable { seq } => {
                    if awaiting == Some(Await::Durable(seq)) {
                        awaiting = None;
                    }
                }
                Event::Completed { seq, reply } => {
                    reply_bytes += reply.len() as u64;
                    if awaiting == Some(Await::Completed(seq)) {
                        awaiting = None;
                    }
                    if let Some((op, ..)) = outstanding.remove(&seq) {
                        done += 1;
                        finish(op, &mut first_called, hist);
                    }
                }
            }
        }
    }
    let receiver = running.stop()?;
    rstats.push(receiver.stats());
    sstats.push(sender.stats());
    let sum = |f: fn(&ReceiverStats) -> u64| rstats.iter().map(f).sum::<u64>();
    let rs = ReceiverStats {
        requests_completed: sum(|r| r.requests_completed),
        replies_sent: sum(|r| r.replies_sent),
        persists: sum(|r| r.persists),
        durable_notices: sum(|r| r.durable_notices),
        ..ReceiverStats::default()
    };
    point.set_counts(&OpCounts::durable(&sstats, &rs, reply_bytes));
    // Per op of the workload (re-executions and resends included in the counts).
    let scale = rs.requests_completed.max(1) as f64 / n as f64;
    for x in [
        &mut point.round_trips_per_op,
        &mut point.messages_per_op,
        &mut point.verbs_per_op,
        &mut point.bytes_to_receiver_per_op,
        &mut point.receiver_persists_per_op,
    ] {
        *x = x.map(|v| v * scale);
    }
    Ok(t)
}

// ---------------------------------------------------------------------------
// The tables

fn param_name(p: &FigPoint) -> String {
    match p.param.as_str() {
        "size_bytes" => size_name(p.param_value as usize),
        "processing_us" => format!("{} µs", p.param_value),
        "senders" => format!("{} snd", p.param_value),
        "write_pct" => format!("{} % wr", p.param_value),
        "batch_max" => format!("batch {}", p.param_value),
        "availability" => format!("{:.1} %", 100.0 * p.param_value),
        _ => format!("{}", p.param_value),
    }
}

/// What a figure is, in one line.
pub fn figure_title(figure: u32) -> &'static str {
    match figure {
        12 => "Figure 12: total time of a 1 KiB workload (100 µs processing) under real receiver crashes, durable (recovery re-executes the redo ring) vs resend (classic)",
        13 => "Figure 13: object size swept (light load, all writes)",
        15 => "Figure 15: receiver CPU load — busy processing per request swept (64 KiB, all writes)",
        17 => "Figure 17: concurrent senders to one receiver (64 KiB, light load, all writes)",
        18 => "Figure 18: read/write ratio (64 KiB, light load; a read waits for its reply in every design)",
        19 => "Figure 19: batch size, FlowConfig::batch_max (1 KiB, light load, all writes; classic designs do not batch: measured at 1)",
        _ => "",
    }
}

/// The table of one figure's points, under its title and the wire model's label.
pub fn table(points: &[FigPoint], figure: u32) -> String {
    let of: Vec<&FigPoint> = points.iter().filter(|p| p.figure == figure).collect();
    let mut s = String::new();
    let Some(first) = of.first() else {
        return s;
    };
    s.push_str(&format!(
        "{}\nEvery line below: {}\n",
        figure_title(figure),
        first.wire_model
    ));
    if figure == 12 {
        s.push_str(&format!(
            "Availability model: each failure is a real receiver crash (power failure of its pool, crash simulator on) and restart;\n\
             modelled and added, never slept: downtime {} ms per failure (both kinds; the paper's 300 ms ÷ 100), and a re-transfer\n\
             interval of {} ms (the paper's 100 ms ÷ 100) per failure that left a resending sender a request unanswered. A failure\n\
             every K = round(MTBF / {} µs) requests issued, MTBF = D·A/(1−A). total = measured + modelled; norm = total / the\n\
             family's resending baseline's (sflush, s-rflush: darpc; wflush, w-rflush: farm). fail s = what the failures cost in the\n\
             run: downtime + re-transfer waits + measured restart/recovery (durable: includes re-executing the ring); f/base = that\n\
             over the baseline's. mean µs: an op's first call to its taking effect (a read: its reply), crashes included.\n",
            DOWNTIME_PER_FAILURE_NS / 1_000_000,
            RETRANSFER_INTERVAL_NS / 1_000_000,
            NOMINAL_UPTIME_PER_REQUEST_NS / 1000
        ));
        s.push_str(&format!(
            "{:<9} {:>5} {:>7} {:>5} {:>5} {:>8} {:>8} {:>7} {:>7} {:>8} {:>6} {:>8} {:>6} {:>6} {:>6} {:>7} {:>6} {:>7} {}\n",
            "design", "wr %", "avail", "K", "fails", "meas s", "recov ms", "down s", "retx s", "total s",
            "norm", "fail s", "f/base", "reexec", "resent", "eff av", "RT/op", "mean µs", "wire model"
        ));
        for p in &of {
            let Some(r) = &p.recovery else {
                s.push_str(&format!(
                    "{:<9} {}\n",
                    p.design,
                    p.note.as_deref().unwrap_or("not applicable")
                ));
                continue;
            };
            s.push_str(&format!(
                "{:<9} {:>5} {:>7} {:>5} {:>5} {:>8.3} {:>8.2} {:>7.3} {:>7.3} {:>8.3} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6.2}% {:>6} {:>7} on\n",
                p.design,
                r.write_pct,
                format!("{:.1}%", 100.0 * r.availability),
                r.requests_between_failures.map_or("-".into(), |k| k.to_string()),
                r.failures,
                r.measured_secs,
                1e3 * r.recovery_secs,
                r.modelled_downtime_secs,
                r.modelled_retransfer_secs,
                r.total_secs,
                opt(r.normalized_total, 3),
                format!("{:.4}", r.failure_cost_secs),
                opt(r.failure_cost_vs_baseline, 2),
                r.reexecuted,
                r.resent,
                100.0 * r.effective_availability,
                opt(p.round_trips_per_op, 2),
                opt(p.mean_us, 1),
            ));
        }
        return s;
    }
    s.push_str(
        "op/s — classic: replies; durable: durable acks of writes (next request on the ack; a batch: its last request's ack),\n\
         replies of reads. Latency: call to that event (mean, p50, p99). Counts per request: RT, verbs, bytes to the receiver, receiver persists.\n",
    );
    s.push_str(&format!(
        "{:<9} {:<5} {:>10} {:>10} {:>9} {:>9} {:>9} {:>6} {:>6} {:>9} {:>8} {}\n",
        "design",
        "fam",
        "param",
        "op/s",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "RT/op",
        "verbs",
        "B→recv",
        "persists",
        "wire model"
    ));
    for p in &of {
        if !p.applicable {
            s.push_str(&format!(
                "{:<9} {:<5} {:>10} {} (wire model on)\n",
                p.design,
                p.family,
                param_name(p),
                p.note.as_deref().unwrap_or("not applicable")
            ));
            continue;
        }
        s.push_str(&format!(
            "{:<9} {:<5} {:>10} {:>10} {:>9} {:>9} {:>9} {:>6} {:>6} {:>9} {:>8} on\n",
            p.design,
            p.family,
            param_name(p),
            opt(p.ops_per_sec, 0),
            opt(p.mean_us, 1),
            opt(p.p50_us, 1),
            opt(p.p99_us, 1),
            opt(p.round_trips_per_op, 2),
            opt(p.verbs_per_op, 2),
            opt(p.bytes_to_receiver_per_op, 0),
            opt(p.receiver_persists_per_op, 2),
        ));
    }
    s
}

// ---------------------------------------------------------------------------
// The plots: one PNG per figure

const PLOT_PX: (u32, u32) = (1500, 900);

/// The file of one figure's plot: `F` with `-fig<N>` before its extension.
pub fn plot_path(base: &Path, figure: u32) -> std::path::PathBuf {
    let stem = base
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "rpc".into());
    let ext = base
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| "png".into());
    base.with_file_name(format!("{stem}-fig{figure}.{ext}"))
}

struct Panel {
    title: String,
    y_desc: String,
    /// (series name, points (x index, y)).
    series: Vec<(String, Vec<(usize, f64)>)>,
}

/// One figure's plot into `path`: two panels (op/s and mean latency against the
/// swept value, one line per design); Figure 12: one panel per write ratio,
/// normalised total time against availability.
pub fn plot(points: &[FigPoint], figure: u32, path: &Path) -> Result<(), PlotError> {
    let of: Vec<&FigPoint> = points
        .iter()
        .filter(|p| p.figure == figure && p.ops_per_sec.is_some())
        .collect();
    if of.is_empty() {
        return Err(PlotError::NoData(format!(
            "no measured point of figure {figure}"
        )));
    }
    let mut xs: Vec<f64> = of.iter().map(|p| p.param_value).collect();
    xs.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    xs.dedup();
    if figure == 12 {
        xs.reverse();
    }
    let x_labels: Vec<String> = xs
        .iter()
        .map(|x| {
            let p = of.iter().find(|p| p.param_value == *x).expect("present");
            param_name(p)
        })
        .collect();
    let mut designs: Vec<String> = Vec::new();
    for p in &of {
        if !designs.contains(&p.design) {
            designs.push(p.design.clone());
        }
    }
    let xi = |v: f64| xs.iter().position(|x| *x == v).expect("present");
    let series_of = |sel: &dyn Fn(&FigPoint) -> bool, y: &dyn Fn(&FigPoint) -> Option<f64>| {
        designs
            .iter()
            .map(|d| {
                let pts: Vec<(usize, f64)> = of
                    .iter()
                    .filter(|p| p.design == *d && sel(p))
                    .filter_map(|p| Some((xi(p.param_value), y(p)?)))
                    .collect();
                (d.clone(), pts)
            })
            .filter(|(_, pts)| !pts.is_empty())
            .collect::<Vec<_>>()
    };
    let panels: Vec<Panel> = if figure == 12 {
        let mut ws: Vec<u32> = of.iter().map(|p| p.write_pct).collect();
        ws.sort_unstable();
        ws.dedup();
        let totals = ws.iter().map(|&w| Panel {
            title: format!("{w} % writes: total time / resending baseline's"),
            y_desc: "normalised total time".into(),
            series: series_of(&|p| p.write_pct == w, &|p| {
                p.recovery.as_ref().and_then(|r| r.normalized_total)
            }),
        });
        let costs = ws.iter().map(|&w| Panel {
            title: format!("{w} % writes: what the failures cost"),
            y_desc: "downtime + re-transfer + recovery, ms".into(),
            series: series_of(&|p| p.write_pct == w, &|p| {
                p.recovery.as_ref().map(|r| 1e3 * r.failure_cost_secs)
            }),
        });
        totals.chain(costs).collect()
    } else {
        vec![
            Panel {
                title: "(a) throughput".into(),
                y_desc: "op/s".into(),
                series: series_of(&|_| true, &|p| p.ops_per_sec),
            },
            Panel {
                title: "(b) mean latency (the paper's metric)".into(),
                y_desc: "µs".into(),
                series: series_of(&|_| true, &|p| p.mean_us),
            },
        ]
    };
    let caption = vec![
        format!(
            "Every point: {}; loopback fabric, receiver memory an emulated-PM pool; one run on a 2-vCPU machine.",
            of[0].wire_model
        ),
        match figure {
            12 => format!(
                "Real receiver crashes and restarts (measured) + modelled downtime {} ms per failure and {} ms re-transfer wait per failure that left a resending sender unanswered.",
                DOWNTIME_PER_FAILURE_NS / 1_000_000,
                RETRANSFER_INTERVAL_NS / 1_000_000
            ),
            _ => "Classic: op = reply. Durable: op = durable ack of a write (processed later, FIFO), reply of a read.".into(),
        },
    ];
    plot::render(path, PLOT_PX, |root| {
        draw(root, figure_title(figure), &caption, &x_labels, &panels)
    })
}

fn draw(
    root: &plot::Area<'_>,
    title: &str,
    caption: &[String],
    x_labels: &[String],
    panels: &[Panel],
) -> plot::DrawResult<()> {
    root.fill(&WHITE)?;
    let body = root.titled(&format!("Seed 002 {title}"), (FONT_FAMILY, 17))?;
    let (_, h) = body.dim_in_pixel();
    let (body, foot) = body.split_vertically(h - 60);
    plot::caption_lines(&foot, caption, 14, 6, 22)?;
    let cols = if panels.len() > 3 {
        panels.len().div_ceil(2)
    } else {
        panels.len().max(1)
    };
    let areas = body.split_evenly((panels.len().div_ceil(cols).max(1), cols));
    let mut names: Vec<&str> = Vec::new();
    for p in panels {
        for (n, _) in &p.series {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    for (area, panel) in areas.iter().zip(panels) {
        let y_max = panel
            .series
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|(_, y)| *y))
            .fold(0.0f64, f64::max)
            .max(1e-9)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT_FAMILY, 16))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.3f64..x_labels.len() as f64 - 0.7, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_labels(x_labels.len() * 2 + 1)
            .x_label_formatter(&|x| plot::category_label(x_labels, *x))
            .y_desc(panel.y_desc.as_str())
            .y_label_formatter(&|y| {
                if y_max < 10.0 {
                    format!("{y:.2}")
                } else {
                    format!("{y:.0}")
                }
            })
            .label_style((FONT_FAMILY, 13))
            .draw()?;
        for (name, pts) in &panel.series {
            let ci = names.iter().position(|n| n == name).unwrap_or(0);
            let colour = plot::PALETTE[ci % plot::PALETTE.len()];
            let durable = ["sflush", "wflush", "s-rflush", "w-rflush"].contains(&name.as_str());
            let style = ShapeStyle {
                color: colour.to_rgba(),
                filled: true,
                stroke_width: if durable { 3 } else { 1 },
            };
            let line: Vec<(f64, f64)> = pts.iter().map(|(x, y)| (*x as f64, *y)).collect();
            chart
                .draw_series(LineSeries::new(line.clone(), style))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            chart.draw_series(
                line.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, colour.filled())),
            )?;
        }
        plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 12)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_drpc::layout::entry_bytes;

    #[test]
    fn write_pattern_has_exactly_the_ratio_in_every_hundred() {
        for w in [0u32, 5, 50, 95, 100] {
            for start in [0u64, 37, 1000] {
                let writes = (start..start + 100).filter(|&i| is_write(i, w)).count();
                assert_eq!(writes, w as usize, "{w} % from {start}");
            }
        }
        // 50 %: alternating, reads first.
        let first: Vec<bool> = (0..4).map(|i| is_write(i, 50)).collect();
        assert_eq!(first, [false, true, false, true]);
        // 5 %: one write in every 20 ops.
        assert_eq!((0..20).filter(|&i| is_write(i, 5)).count(), 1);
    }

    #[test]
    fn availability_model_arithmetic() {
        // MTBF = D·A/(1−A), D = 3 ms.
        assert!((mtbf_ns(0.99) - 297_000_000.0).abs() < 1.0);
        assert!((mtbf_ns(0.90) - 27_000_000.0).abs() < 1.0);
        // K = round(MTBF / 125 µs).
        assert_eq!(requests_between_failures(0.99), Some(2376));
        assert_eq!(requests_between_failures(0.95), Some(456));
        assert_eq!(requests_between_failures(0.90), Some(216));
        assert_eq!(requests_between_failures(1.0), None);
        assert_eq!(requests_between_failures(0.01), Some(1));
        // The full run's workload of 6,000 requests.
        assert_eq!(crash_points(6_000, 0.99), vec![2376, 4752]);
        assert_eq!(crash_points(6_000, 0.95).len(), 13);
        assert_eq!(crash_points(6_000, 0.90).len(), 27);
        assert_eq!(crash_points(6_000, 1.0), Vec::<u64>::new());
        // Never at the very last request; the quick run's one failure.
        assert_eq!(crash_points(432, 0.90), vec![216]);
        assert_eq!(crash_points(400, 0.90), vec![216]);
        // 2 s measured, 2 failures of 3 ms: 2 / 2.006.
        assert!((availability_of(2.0, 2) - 2.0 / 2.006).abs() < 1e-12);
        assert_eq!(availability_of(1.0, 0), 1.0);
        // total = measured + 3 ms per failure + 1 ms per re-transfer wait.
        assert!((fig12_total_secs(1.0, 4, 3) - 1.015).abs() < 1e-12);
    }

    #[test]
    fn sweeps_follow_the_paper_and_quick_is_small() {
        let full = Sweeps::full();
        assert_eq!(full.fig13_sizes, [64, 256, 1024, 4096, 16384, 65536]);
        assert_eq!(full.fig18_write_pct, [5, 50, 95]);
        assert_eq!(full.fig19_batch, [1, 2, 4, 8, 16]);
        assert_eq!(full.fig17_senders, [1, 2, 4, 8]);
        assert_eq!(full.fig15_processing_us, [0, 10, 25, 50, 100, 200]);
        assert_eq!(full.fig12_availability, [1.0, 0.99, 0.95, 0.90]);
        // Every batch size is a valid flow (batch_max ≤ the window).
        for b in full.fig19_batch {
            let s = Spec {
                batch: b,
                ..Spec::base(19, design("wflush"))
            };
            durable_flow(&s).validate().expect("valid flow");
        }
        let full_opts = FigOptions::full();
        let quick = FigOptions::quick();
        let all = [12, 13, 15, 17, 18, 19];
        // Full: 6 designs × 3 ratios × 4 levels; 11 × 6 sizes; 10 × 6; 10 × 4; 10 × 3;
        // 4 durable × 5 batch sizes + 7 classic at 1.
        assert_eq!(specs(12, &full_opts).len(), 72);
        assert_eq!(specs(13, &full_opts).len(), 66);
        assert_eq!(specs(15, &full_opts).len(), 60);
        assert_eq!(specs(17, &full_opts).len(), 40);
        assert_eq!(specs(18, &full_opts).len(), 30);
        assert_eq!(specs(19, &full_opts).len(), 27);
        assert_eq!(point_count(&all, &quick), 6 + 22 + 20 + 20 + 20 + 15);
        // Figures at 64 KiB leave FaSST out, as the paper does.
        assert!(!figure_designs(15).contains(&design("fasst")));
        assert!(figure_designs(13).contains(&design("fasst")));
        assert_eq!(fig12_baseline(design("s-rflush")), "darpc");
        assert_eq!(fig12_baseline(design("wflush")), "farm");
    }

    #[test]
    fn durable_geometry_holds_a_window_of_batched_entries() {
        let flow = FlowConfig {
            batch_max: 16,
            ..FlowConfig::default()
        };
        let s = Spec {
            size: 1024,
            batch: 16,
            senders: 3,
            ..Spec::base(19, design("wflush"))
        };
        let g = durable_geometry(&s, &flow);
        assert_eq!(g.connections, 3);
        assert!(g.payload_bytes_max() >= 1024);
        assert!(g.chunk_bytes >= entry_bytes(16 * request_bytes(1024)));
        assert_eq!(g.ring_bytes, 18 * g.chunk_bytes);
        assert_eq!(g.chunk_bytes % 64, 0);
    }

    #[test]
    fn plot_paths_name_the_figure() {
        assert_eq!(
            plot_path(Path::new("docs/results/rpc.png"), 13),
            Path::new("docs/results/rpc-fig13.png")
        );
        assert_eq!(plot_path(Path::new("out"), 12), Path::new("out-fig12.png"));
    }

    #[test]
    fn normalisation_divides_by_the_family_baseline() {
        let mk = |d: &str, a: f64, total: f64| {
            let s = Spec {
                write_pct: 50,
                value: a,
                ..Spec::base(12, design(d))
            };
            let mut p = blank(&s, &WireModel::CONNECTX5);
            p.recovery = Some(RecoveryMeasure {
                availability: a,
                effective_availability: a,
                requests: 10,
                write_pct: 50,
                failures: u64::from(a < 1.0),
                requests_between_failures: requests_between_failures(a),
                measured_secs: total,
                recovery_secs: 0.0,
                modelled_downtime_secs: 0.0,
                modelled_retransfer_secs: 0.0,
                total_secs: total,
                reexecuted: 0,
                resent: 0,
                retransfer_waits: 0,
                baseline: fig12_baseline(design(d)).into(),
                normalized_total: None,
                failure_cost_secs: total / 8.0,
                failure_cost_vs_baseline: None,
            });
            p
        };
        let mut ps = vec![
            mk("darpc", 1.0, 1.5),
            mk("sflush", 1.0, 0.75),
            mk("darpc", 0.9, 2.0),
            mk("farm", 0.9, 4.0),
            mk("sflush", 0.9, 1.0),
            mk("wflush", 0.9, 3.0),
        ];
        normalise_fig12(&mut ps);
        let r = |i: usize| ps[i].recovery.clone().unwrap();
        let norm: Vec<f64> = (2..6).map(|i| r(i).normalized_total.unwrap()).collect();
        assert_eq!(norm, [1.0, 1.0, 0.5, 0.75]);
        assert_eq!(r(1).normalized_total, Some(0.5));
        // Failure cost (here an eighth of the total): sflush 0.125 against darpc's 0.25,
        // wflush 0.375 against farm's 0.5.
        assert_eq!(r(4).failure_cost_vs_baseline, Some(0.5));
        assert_eq!(r(5).failure_cost_vs_baseline, Some(0.75));
        assert_eq!(r(2).failure_cost_vs_baseline, Some(1.0));
        // The failure-free runs have no failures, hence no cost ratio.
        assert_eq!(r(1).failure_cost_vs_baseline, None);
    }
}
