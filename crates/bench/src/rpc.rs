//! Seed 002 §5.2, Figures 8 and 9: the four durable RPCs (`rowankv-drpc`) against the
//! seven classic RDMA RPC designs (`rowankv-classic-rpc`), measured in one run on the
//! loopback fabric with the wire model on (`WireModel::CONNECTX5`, never tuned), the
//! receiver's memory a `rowankv_pmem::Pool` (emulated medium: persists are real
//! `clwb` + `sfence`).
//!
//! # What a point measures
//! One sender thread (the bench thread) and one receiver thread (the classic
//! server's own, or a thread polling the durable [`Receiver`]), one connection, one
//! request size, one load: light (no receiver processing) or heavy
//! ([`HEAVY_LOAD_PROCESSING_NS`] = 100 µs of busy receiver CPU per request, in the
//! classic server's `processing_delay_ns` and in the durable operator alike).
//!
//! # What `ops_per_sec` counts — the one unlike thing, said on every output
//! - **Classic designs**: the sender waits for the RPC's reply before it sends the
//!   next request (one outstanding call: "the sender has to wait for a completion
//!   event from the remote CPU", §3). An op is a reply received; a reply means the
//!   request is durable *and* processed. Latency: post to reply.
//! - **Durable RPCs**: the sender waits for the request's durable acknowledgement
//!   (`Event::Durable`: the SFlush/WFlush completion, or the RFlush notice) and then
//!   sends the next one, without waiting for processing — the paper's point (§4.2:
//!   "the sender can initiate another RPC request earlier without waiting for the
//!   completion event of the former RPC"; §5.2: "once the sender is aware of the
//!   completion of remote data persisting, it can issue other RPC requests
//!   earlier"). An op is a durable acknowledgement; the receiver processes the
//!   request later, FIFO, and recovery would re-execute it after a crash. Latency:
//!   call to durable. The sender may run ahead of processing by at most the flow
//!   window (`FlowConfig::default()`: 16 requests not yet completed, 2 while the
//!   receiver signals slow-down), so over a run `ops_per_sec` is bounded by the
//!   receiver's processing rate too; `completed_per_sec` and the `completed_p*`
//!   latencies (call to `Event::Completed`) are reported beside it. The receiver
//!   executes one request per poll ([`flow`]), so the RFlush variants' notices are
//!   not held behind a batch of executions.
//!
//! # Counts that need no timing model
//! Over every call of a point (warm-up included; each request is drained to its
//! completion before the counters are read): round trips on the sender's critical
//! path to what it waits for, one-way messages, verbs (sender and receiver), bytes
//! each way, receiver persists per request. Durable RPCs: one round trip per entry
//! (SFlush, WFlush: the pipelined verbs' acknowledgement; RFlush: request then
//! notice); bytes to the receiver are the entry bytes posted; bytes to the sender
//! are the reply messages (24 B header + reply).
//!
//! # Goals (issue 16, Acceptance), computed from the points of the run
//! Pairing as the paper's §5.1: SFlush-RPC and S-RFlush-RPC against DaRPC and FaSST
//! (SEND); WFlush-RPC and W-RFlush-RPC against FaRM, L5, RFP, Octopus and ScaleRPC
//! (WRITE). Throughput under heavy load at 1 KiB and 64 KiB, each durable design
//! against the *best* classic of its family at that size (goal: +40 %); the p99 of
//! WFlush-RPC and W-RFlush-RPC at 1 KiB against the lowest p99 of the WRITE classics
//! (goal: 30 % lower), at each load (the paper does not say Figure 9's load).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use plotters::prelude::*;
use rowankv_classic_rpc::{
    Client, Design, Handler, Layout, RpcError, RunningServer, Server, ServerConfig, Totals,
    VerbFamily, HEAVY_LOAD_PROCESSING_NS,
};
use rowankv_drpc::layout::{align_up, entry_bytes, request_bytes, REPLY_HEADER_BYTES};
use rowankv_drpc::{
    ConnId, DrpcError, Effect, Event, FlowConfig, NotNow, Operator, Receiver, ReceiverStats,
    Request, RingGeometry, Sender, SenderStats, StateView, Variant,
};
use rowankv_fabric::{Fabric, FabricError, LoopbackFabric, LoopbackNic, WireModel};
use rowankv_pmem::{Pool, PoolError, PoolOptions};
use rowankv_types::NodeId;
use serde::Serialize;

use crate::plot::{self, PlotError, FONT_FAMILY};

/// Every design, in the paper's order: the seven classic ones, then the four durable.
pub const DESIGNS: [&str; 11] = [
    "darpc", "farm", "fasst", "l5", "rfp", "octopus", "scalerpc", "sflush", "wflush", "s-rflush",
    "w-rflush",
];
/// The paper's request sizes (§5.1: message passing, KV stores, file systems).
pub const SIZES_BYTES: [usize; 3] = [32, 1024, 64 << 10];
/// The throughput goal: durable over the best classic of the family, heavy load.
pub const THROUGHPUT_GAIN_GOAL: f64 = 0.40;
/// The tail-latency goal: WFlush/W-RFlush p99 below the WRITE classics' at 1 KiB.
pub const P99_CUT_GOAL: f64 = 0.30;
/// Reply of every request: 8 bytes (the request's length), for both kinds.
pub(crate) const REPLY_BYTES: usize = 8;
/// Latencies recorded up to 10 s, 3 significant digits.
const LATENCY_NS_MAX: u64 = 10_000_000_000;
/// A point gives up if its sender sees no progress for this long (a stuck design
/// must fail the run, not hang it).
pub(crate) const STALL_NS_MAX: u64 = 5_000_000_000;
/// Idle spins of the durable receiver's and sender's loops before they yield the
/// core (the classic server's loop and client's `call` do the same).
const IDLE_SPINS_BEFORE_YIELD: u32 = 64;
pub(crate) const SENDER: NodeId = NodeId(1);
pub(crate) const RECEIVER: NodeId = NodeId(0);

/// Receiver load per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    /// No receiver processing (Figure 8(b)).
    Light,
    /// 100 µs of busy receiver processing per request (Figure 8(a)).
    Heavy,
}

impl Load {
    pub fn name(self) -> &'static str {
        match self {
            Load::Light => "light",
            Load::Heavy => "heavy",
        }
    }

    pub fn from_name(s: &str) -> Option<Load> {
        match s {
            "light" => Some(Load::Light),
            "heavy" => Some(Load::Heavy),
            _ => None,
        }
    }

    pub fn processing_ns(self) -> u64 {
        match self {
            Load::Light => 0,
            Load::Heavy => HEAVY_LOAD_PROCESSING_NS,
        }
    }
}

/// A design of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcDesign {
    Classic(Design),
    Durable(Variant),
}

impl RpcDesign {
    pub fn from_name(name: &str) -> Option<RpcDesign> {
        if let Some(d) = Design::from_name(name) {
            return Some(RpcDesign::Classic(d));
        }
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == name)
            .map(RpcDesign::Durable)
    }

    pub fn name(self) -> &'static str {
        match self {
            RpcDesign::Classic(d) => d.name(),
            RpcDesign::Durable(v) => v.name(),
        }
    }

    /// The verb family the paper compares within (§5.1).
    pub fn family(self) -> &'static str {
        let send = match self {
            RpcDesign::Classic(d) => d.family() == VerbFamily::Send,
            RpcDesign::Durable(v) => v.uses_send(),
        };
        if send {
            "send"
        } else {
            "write"
        }
    }

    pub fn is_durable(self) -> bool {
        matches!(self, RpcDesign::Durable(_))
    }

    /// `classic` or `durable`.
    pub fn kind(self) -> &'static str {
        if self.is_durable() {
            "durable"
        } else {
            "classic"
        }
    }

    /// What one op of `ops_per_sec` is, for this design.
    pub fn op_counts(self) -> &'static str {
        match self {
            RpcDesign::Classic(_) => "reply received (durable and processed; 1 call outstanding)",
            RpcDesign::Durable(_) => {
                "durable ack received (processed later, FIFO; next request sent on the ack)"
            }
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RpcOptions {
    pub designs: Vec<RpcDesign>,
    pub sizes_bytes: Vec<usize>,
    pub loads: Vec<Load>,
    /// Per point: run unmeasured for this long, then measure for `measure_ms`.
    pub warmup_ms: u64,
    pub measure_ms: u64,
    pub model: WireModel,
}

impl RpcOptions {
    fn all(warmup_ms: u64, measure_ms: u64) -> RpcOptions {
        RpcOptions {
            designs: DESIGNS
                .iter()
                .map(|n| RpcDesign::from_name(n).expect("a known design"))
                .collect(),
            sizes_bytes: SIZES_BYTES.to_vec(),
            loads: vec![Load::Heavy, Load::Light],
            warmup_ms,
            measure_ms,
            model: WireModel::CONNECTX5,
        }
    }

    /// Every design, size and load; 1 s measured per point (about 1.5 minutes).
    pub fn full() -> RpcOptions {
        Self::all(200, 1_000)
    }

    /// The same points, 60 ms measured each: a smoke run of a few seconds.
    pub fn quick() -> RpcOptions {
        Self::all(20, 60)
    }
}

/// One measured point (or one that does not apply: FaSST above its MTU).
#[derive(Clone, Debug, Serialize)]
pub struct RpcPoint {
    /// The paper's figure this point belongs to: 8 (Figure 9's latencies are the
    /// same points' p50/p99).
    pub figure: u32,
    pub design: String,
    /// `classic` or `durable`.
    pub kind: String,
    /// `send` or `write`: the family the paper compares within.
    pub family: String,
    pub size_bytes: usize,
    pub load: Load,
    /// The swept parameter of the figure (`size_bytes` for Figure 8) and its value.
    pub param: String,
    pub param_value: f64,
    /// Receiver processing per request (busy CPU), ns.
    pub processing_ns: u64,
    /// False when the design cannot carry the size (FaSST above the 4 KiB UD MTU);
    /// every measure is then null.
    pub applicable: bool,
    pub note: Option<String>,
    /// What one op of `ops_per_sec` is (see the module documentation).
    pub op_counts: String,
    pub ops_per_sec: Option<f64>,
    /// Ops counted in the measured interval.
    pub ops_measured: Option<u64>,
    pub measured_secs: Option<f64>,
    /// Latency of an op: classic post to reply; durable call to durable ack.
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    /// Requests processed (completed) per second, and call-to-completion latency.
    /// Classic: the same as the op figures.
    pub completed_per_sec: Option<f64>,
    pub completed_p50_us: Option<f64>,
    pub completed_p99_us: Option<f64>,
    /// Counts that do not depend on the timing model (per request, warm-up included).
    pub requests_counted: Option<u64>,
    pub round_trips_per_op: Option<f64>,
    pub messages_per_op: Option<f64>,
    pub verbs_per_op: Option<f64>,
    pub sender_verbs_per_op: Option<f64>,
    pub receiver_verbs_per_op: Option<f64>,
    pub bytes_to_receiver_per_op: Option<f64>,
    pub bytes_to_sender_per_op: Option<f64>,
    pub receiver_persists_per_op: Option<f64>,
    /// RFP only: READs that found no result yet (timing-dependent, kept apart).
    pub empty_fetches_per_op: Option<f64>,
    /// The wire model's label: every point here is measured with it on.
    pub wire_model: String,
}

/// Why a point could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum RpcBenchError {
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    #[error("pool: {0}")]
    Pool(#[from] PoolError),
    #[error("durable RPC: {0}")]
    Drpc(#[from] DrpcError),
    #[error("classic RPC: {0}")]
    Rpc(#[from] RpcError),
    #[error("{design} {size_bytes} B {load}: {message}")]
    Stalled {
        design: &'static str,
        size_bytes: usize,
        load: &'static str,
        message: String,
    },
    #[error("the durable receiver's thread panicked")]
    ReceiverPanicked,
    #[error("starting a thread: {0}")]
    Thread(std::io::Error),
}

/// Runs every point of `opts`, calling `progress` after each.
pub fn run(
    opts: &RpcOptions,
    mut progress: impl FnMut(&RpcPoint),
) -> Result<Vec<RpcPoint>, RpcBenchError> {
    let mut points = Vec::new();
    for &load in &opts.loads {
        for &size in &opts.sizes_bytes {
            for &design in &opts.designs {
                let p = run_point(design, size, load, opts)?;
                progress(&p);
                points.push(p);
            }
        }
    }
    Ok(points)
}

/// One point.
pub fn run_point(
    design: RpcDesign,
    size_bytes: usize,
    load: Load,
    opts: &RpcOptions,
) -> Result<RpcPoint, RpcBenchError> {
    match design {
        RpcDesign::Classic(d) => run_classic(d, size_bytes, load, opts),
        RpcDesign::Durable(v) => run_durable(v, size_bytes, load, opts),
    }
}

fn blank(design: RpcDesign, size_bytes: usize, load: Load, model: &WireModel) -> RpcPoint {
    RpcPoint {
        figure: 8,
        design: design.name().to_string(),
        kind: design.kind().to_string(),
        family: design.family().to_string(),
        size_bytes,
        load,
        param: "size_bytes".to_string(),
        param_value: size_bytes as f64,
        processing_ns: load.processing_ns(),
        applicable: true,
        note: None,
        op_counts: design.op_counts().to_string(),
        ops_per_sec: None,
        ops_measured: None,
        measured_secs: None,
        p50_us: None,
        p99_us: None,
        p999_us: None,
        completed_per_sec: None,
        completed_p50_us: None,
        completed_p99_us: None,
        requests_counted: None,
        round_trips_per_op: None,
        messages_per_op: None,
        verbs_per_op: None,
        sender_verbs_per_op: None,
        receiver_verbs_per_op: None,
        bytes_to_receiver_per_op: None,
        bytes_to_sender_per_op: None,
        receiver_persists_per_op: None,
        empty_fetches_per_op: None,
        wire_model: model.label(),
    }
}

impl RpcPoint {
    /// The sender's measure. The durable RPCs' completions are measured apart; a
    /// classic op is its completion.
    fn set_measure(&mut self, m: &SenderMeasure, durable: bool) {
        // A durable measure's interval is at least 1 ns.
        self.ops_per_sec = Some(if m.secs > 0.0 {
            m.ops as f64 / m.secs
        } else {
            0.0
        });
        self.ops_measured = Some(m.ops);
        self.measured_secs = Some(m.secs);
        self.p50_us = us(&m.hist, 0.50);
        self.p99_us = us(&m.hist, 0.99);
        self.p999_us = us(&m.hist, 0.999);
        if durable {
            self.completed_per_sec = Some(m.completed_ops as f64 / m.secs);
            self.completed_p50_us = us(&m.completed, 0.50);
            self.completed_p99_us = us(&m.completed, 0.99);
        } else {
            self.completed_per_sec = self.ops_per_sec;
            self.completed_p50_us = self.p50_us;
            self.completed_p99_us = self.p99_us;
        }
    }

    fn set_counts(&mut self, c: &OpCounts) {
        self.requests_counted = Some(c.requests);
        self.round_trips_per_op = Some(c.round_trips);
        self.messages_per_op = Some(c.messages);
        self.verbs_per_op = Some(c.verbs);
        self.sender_verbs_per_op = Some(c.sender_verbs);
        self.receiver_verbs_per_op = Some(c.receiver_verbs);
        self.bytes_to_receiver_per_op = Some(c.bytes_to_receiver);
        self.bytes_to_sender_per_op = Some(c.bytes_to_sender);
        self.receiver_persists_per_op = Some(c.receiver_persists);
    }
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid bounds")
}

pub(crate) fn us(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1e3)
}

pub(crate) fn record(h: &mut Histogram<u64>, ns: u64) {
    h.saturating_record(ns.clamp(1, LATENCY_NS_MAX));
}

/// The request every point sends: `size_bytes` of a pattern.
pub(crate) fn request(size_bytes: usize) -> Vec<u8> {
    (0..size_bytes).map(|i| (i % 251) as u8).collect()
}

/// Busy receiver CPU for `ns` (the paper's injected processing, §5.2).
pub(crate) fn spin_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let start = Instant::now();
    while (start.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

pub(crate) fn elapsed_ns(since: Instant) -> u64 {
    since.elapsed().as_nanos() as u64
}

/// Whether op `i` of a workload with `write_pct` % writes is a write: exactly
/// `write_pct` of every 100 consecutive ops, evenly spread.
pub fn is_write(i: u64, write_pct: u32) -> bool {
    let w = u64::from(write_pct.min(100));
    (i + 1) * w / 100 > i * w / 100
}

/// The wait of a polling loop that found nothing: spin, yielding the core every
/// [`IDLE_SPINS_BEFORE_YIELD`] idle rounds (2 cores hold sender, receiver and the
/// fabric's engine).
#[derive(Default)]
pub(crate) struct Idle(u32);

impl Idle {
    /// The loop found work.
    pub(crate) fn reset(&mut self) {
        self.0 = 0;
    }

    /// The loop found nothing.
    pub(crate) fn wait(&mut self) {
        self.0 = self.0.wrapping_add(1);
        if self.0.is_multiple_of(IDLE_SPINS_BEFORE_YIELD) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Per-op counts that need no timing model (see the module documentation).
pub(crate) struct OpCounts {
    pub requests: u64,
    pub round_trips: f64,
    pub messages: f64,
    pub verbs: f64,
    pub sender_verbs: f64,
    pub receiver_verbs: f64,
    pub bytes_to_receiver: f64,
    pub bytes_to_sender: f64,
    pub receiver_persists: f64,
}

impl OpCounts {
    /// A classic run's totals over `ops` ops (per call: `totals.calls`, at least 1).
    pub(crate) fn classic(t: &Totals, ops: u64) -> OpCounts {
        let n = ops as f64;
        OpCounts {
            requests: t.calls,
            round_trips: t.round_trips as f64 / n,
            messages: t.messages as f64 / n,
            verbs: (t.client_verbs.total() + t.server_verbs.total()) as f64 / n,
            sender_verbs: t.client_verbs.total() as f64 / n,
            receiver_verbs: t.server_verbs.total() as f64 / n,
            bytes_to_receiver: t.bytes_to_server as f64 / n,
            bytes_to_sender: t.bytes_to_client as f64 / n,
            receiver_persists: t.receiver_persists as f64 / n,
        }
    }

    /// A durable run's, per request completed, of its senders and its receiver;
    /// `reply_payload_bytes`: the replies' payloads, every reply.
    pub(crate) fn durable(
        ss: &[SenderStats],
        rs: &ReceiverStats,
        reply_payload_bytes: u64,
    ) -> OpCounts {
        let n = rs.requests_completed.max(1) as f64;
        let sum = |f: fn(&SenderStats) -> u64| ss.iter().map(f).sum::<u64>();
        let sender_verbs = sum(|x| x.work_requests_posted) as f64 / n;
        let receiver_verbs = rs.replies_sent as f64 / n;
        // Every reply's header (completions and RFlush notices) and the replies' bytes.
        let headers = (rs.durable_notices + rs.requests_completed) * REPLY_HEADER_BYTES as u64;
        OpCounts {
            requests: rs.requests_completed,
            // One entry, one round trip to what the sender waits for (SFlush, WFlush:
            // the pipelined verbs' acknowledgement; RFlush: the request, then the
            // notice); a batch of k requests shares one.
            round_trips: sum(|x| x.entries_posted) as f64 / n,
            // Every verb here is one one-way message (no READ).
            messages: sender_verbs + receiver_verbs,
            verbs: sender_verbs + receiver_verbs,
            sender_verbs,
            receiver_verbs,
            bytes_to_receiver: sum(|x| x.bytes_posted) as f64 / n,
            bytes_to_sender: (headers + reply_payload_bytes) as f64 / n,
            receiver_persists: rs.persists as f64 / n,
        }
    }
}

/// What one sender sends, and when it measures.
#[derive(Clone, Copy)]
pub(crate) struct Workload<'a> {
    /// A write's payload (durable: op [`OP_STORE`]) and a read's ([`OP_READ`]).
    pub write: &'a [u8],
    pub read: &'a [u8],
    pub write_pct: u32,
    /// Where in the pattern of [`is_write`] this sender starts.
    pub first_op: u64,
    /// Durable: writes per entry; the sender waits for the durable ack of a batch's
    /// last request.
    pub batch: usize,
    /// Durable: bytes of a read's reply (a write's is [`REPLY_BYTES`]).
    pub read_reply_bytes: usize,
    /// Run unmeasured for this long, then measure for `measure_ms`.
    pub warmup_ms: u64,
    pub measure_ms: u64,
}

impl<'a> Workload<'a> {
    /// Op `i` of the pattern: whether it is a write, its durable op code, its payload.
    pub(crate) fn op(&self, i: u64) -> (bool, u16, &'a [u8]) {
        if is_write(i, self.write_pct) {
            (true, OP_STORE, self.write)
        } else {
            (false, OP_READ, self.read)
        }
    }

    /// Figure 8's: every op a write of `req`, one sender.
    fn writes(req: &'a [u8], opts: &RpcOptions) -> Workload<'a> {
        Workload {
            write: req,
            read: req,
            write_pct: 100,
            first_op: 0,
            batch: 1,
            read_reply_bytes: REPLY_BYTES,
            warmup_ms: opts.warmup_ms,
            measure_ms: opts.measure_ms,
        }
    }
}

/// One sender's measure over its measured interval.
pub(crate) struct SenderMeasure {
    /// Classic: replies received. Durable: durable acks of writes and replies of
    /// reads.
    pub ops: u64,
    pub secs: f64,
    /// Latency of an op: call to that event.
    pub hist: Histogram<u64>,
    /// Durable: requests completed in the interval, and call to completion.
    pub completed_ops: u64,
    pub completed: Histogram<u64>,
    /// Durable: bytes of the replies' payloads over every call.
    pub reply_bytes: u64,
}

// ---------------------------------------------------------------------------
// Classic designs

/// A classic server of `senders` clients, one call outstanding each; requests and
/// replies up to the sizes given (64 B at least).
pub(crate) fn classic_config(
    senders: usize,
    request_bytes_max: usize,
    reply_bytes_max: usize,
    processing_ns: u64,
) -> ServerConfig {
    ServerConfig {
        clients_max: senders,
        inflight_max: 1,
        request_bytes_max: request_bytes_max.max(64),
        reply_bytes_max: reply_bytes_max.max(64),
        processing_delay_ns: processing_ns,
        ..ServerConfig::default()
    }
}

/// Why `design` cannot carry `size_bytes` (FaSST above its MTU), if it cannot: the
/// request, or (with `reads`) the reply. `per` names the message in the note.
pub(crate) fn classic_limit(
    design: Design,
    config: &ServerConfig,
    size_bytes: usize,
    reads: bool,
    per: &str,
) -> Option<String> {
    let req = design.request_bytes_limit(config);
    let rep = design.reply_bytes_limit(config);
    let limit = if size_bytes > req {
        req
    } else if reads && size_bytes > rep {
        rep
    } else {
        return None;
    };
    Some(format!(
        "not applicable: {design} carries at most {limit} B per {per} (one UD message within the 4 KiB MTU, §5.1)"
    ))
}

/// An anonymous pool of at least `bytes` (the crash simulator on if asked).
pub(crate) fn pool(bytes: usize, crash_sim: bool) -> Result<Arc<Pool>, RpcBenchError> {
    Ok(Pool::anonymous(
        align_up(bytes, 4096),
        PoolOptions {
            crash_sim,
            ..PoolOptions::default()
        },
    )?)
}

/// A classic server of `design` on `fabric` over `pool`, a client connected from
/// each node of `senders`, the server's thread running.
pub(crate) fn classic_server(
    design: Design,
    fabric: &LoopbackFabric,
    pool: Arc<Pool>,
    config: ServerConfig,
    handler: Handler,
    senders: Range<u32>,
) -> Result<(RunningServer<LoopbackNic>, Vec<Client<LoopbackNic>>), RpcBenchError> {
    let mut server = Server::new(design, fabric.attach(RECEIVER)?, pool, config, handler)?;
    let mut clients = Vec::new();
    for node in senders {
        clients.push(server.connect(&fabric.attach(NodeId(node))?)?);
    }
    Ok((server.spawn()?, clients))
}

/// A classic sender's timed loop: call, wait for the reply, call the next.
pub(crate) fn drive_classic(
    client: &mut Client<LoopbackNic>,
    w: &Workload<'_>,
) -> Result<SenderMeasure, RpcError> {
    let mut hist = histogram();
    let start = Instant::now();
    let warmup = Duration::from_millis(w.warmup_ms);
    let measure_end = warmup + Duration::from_millis(w.measure_ms);
    let mut ops = 0u64;
    let mut measured_from = None;
    let mut i = w.first_op;
    let end = loop {
        let now = start.elapsed();
        if now >= measure_end {
            break now;
        }
        let (_, _, req) = w.op(i);
        i += 1;
        let t = Instant::now();
        client.call(req)?;
        let ns = elapsed_ns(t);
        if now >= warmup {
            measured_from.get_or_insert(now);
            ops += 1;
            record(&mut hist, ns);
        }
    };
    Ok(SenderMeasure {
        ops,
        secs: (end - measured_from.unwrap_or(end)).as_secs_f64(),
        hist,
        completed_ops: 0,
        completed: histogram(),
        reply_bytes: 0,
    })
}

fn run_classic(
    design: Design,
    size_bytes: usize,
    load: Load,
    opts: &RpcOptions,
) -> Result<RpcPoint, RpcBenchError> {
    let me = RpcDesign::Classic(design);
    let mut point = blank(me, size_bytes, load, &opts.model);
    let config = classic_config(1, size_bytes, REPLY_BYTES, load.processing_ns());
    if let Some(note) = classic_limit(design, &config, size_bytes, false, "request") {
        point.applicable = false;
        point.note = Some(note);
        return Ok(point);
    }
    let fabric = LoopbackFabric::with_model(opts.model)?;
    let pool = pool(Layout::new(&config).server_bytes(), false)?;
    let handler: Handler = Arc::new(|req: &[u8]| (req.len() as u64).to_le_bytes().to_vec());
    let (running, mut clients) = classic_server(
        design,
        &fabric,
        pool,
        config,
        handler,
        SENDER.0..SENDER.0 + 1,
    )?;
    let mut client = clients.pop().expect("one client");
    let req = request(size_bytes);
    let driven = drive_classic(&mut client, &Workload::writes(&req, opts));
    let server = running.stop()?;
    let m = driven?;
    let totals = Totals::of(&[client.stats()], &server.stats());
    point.set_measure(&m, false);
    point.set_counts(&OpCounts::classic(&totals, totals.calls.max(1)));
    if design == Design::Rfp {
        point.empty_fetches_per_op = Some(totals.per_call().empty_fetches);
    }
    Ok(point)
}

// ---------------------------------------------------------------------------
// Durable RPCs

/// The receiver's service: spends the processing time, answers a read
/// ([`OP_READ`]) with `object` and any other request with its length; no state
/// writes (the request itself is what is made durable, as in the classic designs,
/// whose handler writes nothing either).
#[derive(Clone)]
pub(crate) struct BenchOperator {
    pub processing_ns: u64,
    pub object: Arc<Vec<u8>>,
}

impl Operator for BenchOperator {
    fn execute(&mut self, _state: &StateView<'_>, request: &Request<'_>) -> Result<Effect, NotNow> {
        spin_ns(self.processing_ns);
        let reply = if request.op == OP_READ {
            self.object.to_vec()
        } else {
            (request.payload.len() as u64).to_le_bytes().to_vec()
        };
        Ok(Effect {
            writes: Vec::new(),
            reply,
        })
    }
}

const OP_STORE: u16 = 1;
const OP_READ: u16 = 2;

/// The durable connections' bounds: the crate's defaults (window 16, 2 while
/// slowed, slow-down above a backlog of 8, no batching), except that the receiver
/// executes one request per `poll` (default 16), so that it looks for newly landed
/// entries between every two requests: RFlush's notice is sent by the receiver's
/// CPU, which is also the one that processes (the crate's receiver is one state
/// machine), and the paper's receiver "notifies the completion of data persisting
/// to the sender immediately" (§4.1.2). The same for all four variants and every
/// point. (A quick run with 16 showed the RFlush variants' durable p50 at heavy
/// load near 100 µs: a new entry waited behind a batch of executions.)
pub fn flow() -> FlowConfig {
    FlowConfig {
        reply_bytes_max: REPLY_BYTES,
        requests_per_poll_max: 1,
        ..FlowConfig::default()
    }
}

/// Rings for `connections` connections, each holding a window's worth of entries
/// whose body is `body_bytes`.
pub(crate) fn geometry(connections: u32, body_bytes: usize, flow: &FlowConfig) -> RingGeometry {
    let chunk_bytes = entry_bytes(body_bytes).max(4096);
    RingGeometry {
        connections,
        ring_bytes: chunk_bytes * (flow.inflight_max + 2),
        chunk_bytes,
        state_bytes: 64,
        apply_bytes: 64,
        base: 0,
    }
}

/// A durable receiver on `fabric`, its rings laid out afresh in `pool`.
pub(crate) fn durable_receiver<O: Operator>(
    fabric: &LoopbackFabric,
    pool: Arc<Pool>,
    g: RingGeometry,
    flow: FlowConfig,
    operator: O,
) -> Result<Receiver<LoopbackNic, O>, RpcBenchError> {
    Receiver::<LoopbackNic, O>::format(&pool, g)?;
    let (receiver, _) = Receiver::open(pool, fabric.attach(RECEIVER)?, flow, operator)?;
    Ok(receiver)
}

/// A sender on `node`, connected to `receiver` as connection `conn`.
pub(crate) fn connect_sender<O: Operator>(
    fabric: &LoopbackFabric,
    receiver: &mut Receiver<LoopbackNic, O>,
    node: NodeId,
    conn: u32,
    variant: Variant,
    flow: FlowConfig,
) -> Result<Sender<LoopbackNic>, RpcBenchError> {
    let mut sender = Sender::new(&fabric.attach(node)?, variant, flow)?;
    let offer = receiver.accept(ConnId(conn), variant, sender.qp_addr())?;
    sender.connect(&offer)?;
    Ok(sender)
}

/// A durable receiver polled on its own thread until stopped.
pub(crate) struct ReceiverThread<O: Operator + Send + 'static> {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Receiver<LoopbackNic, O>, DrpcError>>,
}

impl<O: Operator + Send + 'static> ReceiverThread<O> {
    pub(crate) fn spawn(
        mut receiver: Receiver<LoopbackNic, O>,
        name: String,
    ) -> Result<Self, RpcBenchError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || -> Result<_, DrpcError> {
                let mut idle = Idle::default();
                while !stopping.load(Ordering::Acquire) {
                    if receiver.poll()? > 0 {
                        idle.reset();
                    } else {
                        idle.wait();
                    }
                }
                Ok(receiver)
            })
            .map_err(RpcBenchError::Thread)?;
        Ok(ReceiverThread { stop, thread })
    }

    pub(crate) fn stop(self) -> Result<Receiver<LoopbackNic, O>, RpcBenchError> {
        self.stop.store(true, Ordering::Release);
        Ok(self
            .thread
            .join()
            .map_err(|_| RpcBenchError::ReceiverPanicked)??)
    }
}

fn run_durable(
    variant: Variant,
    size_bytes: usize,
    load: Load,
    opts: &RpcOptions,
) -> Result<RpcPoint, RpcBenchError> {
    let me = RpcDesign::Durable(variant);
    let mut point = blank(me, size_bytes, load, &opts.model);
    let flow = flow();
    let g = geometry(1, request_bytes(size_bytes), &flow);
    let fabric = LoopbackFabric::with_model(opts.model)?;
    let operator = BenchOperator {
        processing_ns: load.processing_ns(),
        object: Arc::new(Vec::new()),
    };
    let mut receiver = durable_receiver(&fabric, pool(g.pool_bytes(), false)?, g, flow, operator)?;
    let mut sender = connect_sender(&fabric, &mut receiver, SENDER, 0, variant, flow)?;
    let running = ReceiverThread::spawn(receiver, format!("drpc-{}", variant.name()))?;
    let req = request(size_bytes);
    let driven = drive_durable(&mut sender, &Workload::writes(&req, opts));
    let receiver = running.stop()?;
    let m = driven.map_err(|e| match e {
        DriveError::Drpc(e) => RpcBenchError::Drpc(e),
        DriveError::Stalled(message) => RpcBenchError::Stalled {
            design: variant.name(),
            size_bytes,
            load: load.name(),
            message,
        },
    })?;

    let ss = sender.stats();
    let rs = receiver.stats();
    assert_eq!(
        ss.requests_sent, rs.requests_completed,
        "every request sent was drained to its completion"
    );
    point.set_measure(&m, true);
    point.set_counts(&OpCounts::durable(&[ss], &rs, m.reply_bytes));
    Ok(point)
}

pub(crate) enum DriveError {
    Drpc(DrpcError),
    Stalled(String),
}

impl From<DrpcError> for DriveError {
    fn from(e: DrpcError) -> Self {
        DriveError::Drpc(e)
    }
}

impl std::fmt::Display for DriveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriveError::Drpc(e) => write!(f, "{e}"),
            DriveError::Stalled(message) => f.write_str(message),
        }
    }
}

/// What the sender waits for before its next call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Await {
    Durable(u64),
    Completed(u64),
}

/// A durable sender's timed loop: a write waits for its durable ack (a batch: for
/// the last request's), a read for its completion; then the next call (within the
/// flow window). After the measured interval every request is drained to its
/// completion.
pub(crate) fn drive_durable(
    sender: &mut Sender<LoopbackNic>,
    w: &Workload<'_>,
) -> Result<SenderMeasure, DriveError> {
    let start = Instant::now();
    let warmup_ns = w.warmup_ms * 1_000_000;
    let end_ns = warmup_ns + w.measure_ms * 1_000_000;
    // Requests called and not completed: (seq, called at ns since start, is a read).
    let mut issued: VecDeque<(u64, u64, bool)> = VecDeque::new();
    let mut awaiting: Option<Await> = None;
    let mut in_batch = 0usize;
    let mut events = Vec::new();
    let mut m = SenderMeasure {
        ops: 0,
        secs: 0.0,
        hist: histogram(),
        completed_ops: 0,
        completed: histogram(),
        reply_bytes: 0,
    };
    let mut measured_from: Option<u64> = None;
    let mut measured_to = 0u64;
    let mut last_progress = 0u64;
    let mut idle = Idle::default();
    let mut i = w.first_op;
    // A partial batch goes now (or at the next poll if the ring is full).
    fn flush(sender: &mut Sender<LoopbackNic>) -> Result<(), DriveError> {
        match sender.flush() {
            Ok(()) | Err(DrpcError::WouldBlock) => Ok(()),
            Err(x) => Err(x.into()),
        }
    }
    loop {
        let now = elapsed_ns(start);
        let issuing = now < end_ns;
        if !issuing && measured_to == 0 {
            measured_to = now;
            flush(sender)?;
        }
        if !issuing && issued.is_empty() {
            break;
        }
        if now - last_progress > STALL_NS_MAX {
            return Err(DriveError::Stalled(format!(
                "no progress for {} s ({} requests outstanding)",
                STALL_NS_MAX / 1_000_000_000,
                issued.len()
            )));
        }
        // Calls back to back until a batch is full (the sender's `poll` posts a
        // partial batch, so a batch is filled between two polls).
        while issuing && awaiting.is_none() {
            let (write, op, payload) = w.op(i);
            match sender.call(op, payload) {
                Ok(seq) => {
                    i += 1;
                    issued.push_back((seq, elapsed_ns(start), !write));
                    if write {
                        in_batch += 1;
                        if in_batch >= w.batch {
                            in_batch = 0;
                            awaiting = Some(Await::Durable(seq));
                        }
                    } else {
                        flush(sender)?;
                        in_batch = 0;
                        awaiting = Some(Await::Completed(seq));
                    }
                }
                Err(DrpcError::WouldBlock) => break,
                Err(x) => return Err(x.into()),
            }
        }
        sender.poll(&mut events)?;
        if events.is_empty() {
            // As the classic client's `call` waits.
            idle.wait();
            continue;
        }
        idle.reset();
        let at = elapsed_ns(start);
        last_progress = at;
        let in_window = at >= warmup_ns && at < end_ns;
        if in_window {
            measured_from.get_or_insert(at);
        }
        for ev in events.drain(..) {
            match ev {
                Event::Durable { seq } => {
                    if awaiting == Some(Await::Durable(seq)) {
                        awaiting = None;
                    }
                    // A request's durable ack comes before its completion, so it is
                    // still issued.
                    if let Some(&(_, called, is_read)) = issued.iter().find(|(q, ..)| *q == seq) {
                        if !is_read && in_window {
                            m.ops += 1;
                            if called >= warmup_ns {
                                record(&mut m.hist, at - called);
                            }
                        }
                    }
                }
                Event::Completed { seq, .. } => {
                    let Some((q, called, is_read)) = issued.pop_front() else {
                        return Err(DriveError::Stalled(format!(
                            "completion of {seq} with nothing outstanding"
                        )));
                    };
                    if q != seq {
                        return Err(DriveError::Stalled(format!(
                            "completion of {seq} while {q} was the oldest outstanding"
                        )));
                    }
                    if awaiting == Some(Await::Completed(seq)) {
                        awaiting = None;
                    }
                    m.reply_bytes += if is_read {
                        w.read_reply_bytes
                    } else {
                        REPLY_BYTES
                    } as u64;
                    if in_window {
                        m.completed_ops += 1;
                        if called >= warmup_ns {
                            record(&mut m.completed, at - called);
                        }
                        if is_read {
                            m.ops += 1;
                            if called >= warmup_ns {
                                record(&mut m.hist, at - called);
                            }
                        }
                    }
                }
            }
        }
    }
    let from = measured_from.unwrap_or(measured_to);
    m.secs = ((measured_to.saturating_sub(from)) as f64 / 1e9).max(1e-9);
    Ok(m)
}

// ---------------------------------------------------------------------------
// Goals and the table

/// One comparison the issue asks for.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// `throughput` or `p99`.
    pub metric: String,
    pub size_bytes: usize,
    pub load: Load,
    pub durable: String,
    /// The classic design compared with (the best of the family at this point).
    pub classic: String,
    pub durable_value: f64,
    pub classic_value: f64,
    /// Throughput: durable / classic − 1. p99: 1 − durable / classic.
    pub improvement: f64,
    pub goal: f64,
    pub met: bool,
}

fn find<'a>(points: &'a [RpcPoint], design: &str, size: usize, load: Load) -> Option<&'a RpcPoint> {
    points
        .iter()
        .find(|p| p.design == design && p.size_bytes == size && p.load == load && p.applicable)
}

/// The goals, from the points of one run (only those whose points exist).
pub fn goals(points: &[RpcPoint]) -> Vec<Goal> {
    let classic_of = |family: &str| -> Vec<&'static str> {
        Design::ALL
            .iter()
            .filter(|d| RpcDesign::Classic(**d).family() == family)
            .map(|d| d.name())
            .collect()
    };
    let mut out = Vec::new();
    for size in [1024, 64 << 10] {
        for v in Variant::ALL {
            let me = RpcDesign::Durable(v);
            let Some(d) = find(points, v.name(), size, Load::Heavy) else {
                continue;
            };
            let best = classic_of(me.family())
                .into_iter()
                .filter_map(|c| find(points, c, size, Load::Heavy))
                .filter(|p| p.ops_per_sec.is_some())
                .max_by(|a, b| a.ops_per_sec.partial_cmp(&b.ops_per_sec).expect("finite"));
            let (Some(best), Some(dv)) = (best, d.ops_per_sec) else {
                continue;
            };
            let cv = best.ops_per_sec.expect("filtered");
            let improvement = dv / cv - 1.0;
            out.push(Goal {
                metric: "throughput".into(),
                size_bytes: size,
                load: Load::Heavy,
                durable: v.name().into(),
                classic: best.design.clone(),
                durable_value: dv,
                classic_value: cv,
                improvement,
                goal: THROUGHPUT_GAIN_GOAL,
                met: improvement >= THROUGHPUT_GAIN_GOAL,
            });
        }
    }
    for load in [Load::Heavy, Load::Light] {
        for v in [Variant::WFlush, Variant::WRFlush] {
            let Some(dv) = find(points, v.name(), 1024, load).and_then(|p| p.p99_us) else {
                continue;
            };
            let best = classic_of("write")
                .into_iter()
                .filter_map(|c| find(points, c, 1024, load))
                .filter(|p| p.p99_us.is_some())
                .min_by(|a, b| a.p99_us.partial_cmp(&b.p99_us).expect("finite"));
            let Some(best) = best else { continue };
            let cv = best.p99_us.expect("filtered");
            let improvement = 1.0 - dv / cv;
            out.push(Goal {
                metric: "p99".into(),
                size_bytes: 1024,
                load,
                durable: v.name().into(),
                classic: best.design.clone(),
                durable_value: dv,
                classic_value: cv,
                improvement,
                goal: P99_CUT_GOAL,
                met: improvement >= P99_CUT_GOAL,
            });
        }
    }
    out
}

pub(crate) fn size_name(b: usize) -> String {
    if b >= 1024 && b.is_multiple_of(1024) {
        format!("{} KiB", b / 1024)
    } else {
        format!("{b} B")
    }
}

pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

/// The table: one line per point, under a header naming the wire model every line
/// uses and what each kind's op/s counts.
pub fn table(points: &[RpcPoint]) -> String {
    let mut s = String::new();
    if let Some(p) = points.first() {
        s.push_str(&format!("Every line below: {}\n", p.wire_model));
    }
    s.push_str(
        "op/s counts — classic: replies received (request durable and processed; the sender waits for each reply);\n\
         durable: durable acks received (the sender sends the next request on the ack; processing follows, FIFO,\n\
         at most 16 requests behind). p50/p99: post to that event. done/s, done p99: durable RPCs' completions.\n",
    );
    s.push_str(&format!(
        "{:<9} {:<5} {:>7} {:<5} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6} {:>6} {:>7} {:>9} {:>8}\n",
        "design",
        "fam",
        "size",
        "load",
        "op/s",
        "p50 µs",
        "p99 µs",
        "done/s",
        "done p99",
        "RT/op",
        "verbs",
        "msgs",
        "B→recv",
        "persists"
    ));
    for p in points {
        if !p.applicable {
            s.push_str(&format!(
                "{:<9} {:<5} {:>7} {:<5} {}\n",
                p.design,
                p.family,
                size_name(p.size_bytes),
                p.load.name(),
                p.note.as_deref().unwrap_or("not applicable")
            ));
            continue;
        }
        s.push_str(&format!(
            "{:<9} {:<5} {:>7} {:<5} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6} {:>6} {:>7} {:>9} {:>8}\n",
            p.design,
            p.family,
            size_name(p.size_bytes),
            p.load.name(),
            opt(p.ops_per_sec, 0),
            opt(p.p50_us, 1),
            opt(p.p99_us, 1),
            opt(p.completed_per_sec, 0),
            opt(p.completed_p99_us, 1),
            opt(p.round_trips_per_op, 2),
            opt(p.verbs_per_op, 2),
            opt(p.messages_per_op, 2),
            opt(p.bytes_to_receiver_per_op, 0),
            opt(p.receiver_persists_per_op, 2),
        ));
    }
    s
}

/// The goals as lines: met, or missed by how much.
pub fn goals_report(goals: &[Goal]) -> String {
    let mut s = String::from(
        "Goals (issue 16; pairing of §5.1: sflush, s-rflush vs darpc, fasst; wflush, w-rflush vs farm, l5, rfp, octopus, scalerpc;\n\
         each durable design against the best classic of its family at that point):\n",
    );
    if goals.is_empty() {
        s.push_str("  (no point of the run allows a comparison)\n");
    }
    for g in goals {
        let line = match g.metric.as_str() {
            "throughput" => format!(
                "  throughput {} {} load: {} {:.0} op/s vs {} {:.0} op/s = {:+.1} % (goal ≥ +{:.0} %)",
                size_name(g.size_bytes),
                g.load.name(),
                g.durable,
                g.durable_value,
                g.classic,
                g.classic_value,
                100.0 * g.improvement,
                100.0 * g.goal
            ),
            _ => format!(
                "  p99 {} {} load: {} {:.1} µs (to durable) vs {} {:.1} µs (to reply) = {} (goal ≥ {:.0} % lower)",
                size_name(g.size_bytes),
                g.load.name(),
                g.durable,
                g.durable_value,
                g.classic,
                g.classic_value,
                if g.improvement >= 0.0 {
                    format!("{:.1} % lower", 100.0 * g.improvement)
                } else {
                    format!("{:.1} % higher", -100.0 * g.improvement)
                },
                100.0 * g.goal
            ),
        };
        let verdict = if g.met {
            "MET".to_string()
        } else {
            format!(
                "MISSED by {:.1} percentage points",
                100.0 * (g.goal - g.improvement)
            )
        };
        s.push_str(&format!("{line}: {verdict}\n"));
    }
    let met = goals.iter().filter(|g| g.met).count();
    s.push_str(&format!("  {met} of {} comparisons met\n", goals.len()));
    s
}

// ---------------------------------------------------------------------------
// The plot (Figure 8)

const PLOT_SIZE_PX: (u32, u32) = (1500, 900);
const SIZE_COLOURS: &[RGBColor] = plot::PALETTE.split_at(3).0;

/// Figure 8: throughput per design, one panel per load, one bar per size.
pub fn plot(points: &[RpcPoint], path: &Path) -> Result<(), PlotError> {
    if !points.iter().any(|p| p.ops_per_sec.is_some()) {
        return Err(PlotError::NoData("no measured RPC point".into()));
    }
    plot::render(path, PLOT_SIZE_PX, |root| draw(points, root))
}

fn draw(points: &[RpcPoint], root: &plot::Area<'_>) -> plot::DrawResult<()> {
    root.fill(&WHITE)?;
    let body = root.titled(
        "Seed 002 Figure 8: RPC throughput, durable vs classic (one run)",
        (FONT_FAMILY, 26),
    )?;
    let (_, h) = body.dim_in_pixel();
    let (body, foot) = body.split_vertically(h - 90);
    let label = points
        .first()
        .map(|p| p.wire_model.clone())
        .unwrap_or_default();
    let caption = [
        format!("Every bar: {label}; loopback fabric, receiver memory an emulated-PM pool."),
        "Classic: op = reply (durable and processed, 1 call outstanding). Durable (sflush..w-rflush): op = durable ack (next request sent on the ack; processed later, FIFO).".to_string(),
        "Heavy load: 100 µs busy receiver CPU per request. FaSST at 64 KiB: not applicable (4 KiB UD MTU).".to_string(),
    ];
    plot::caption_lines(&foot, &caption, 15, 8, 24)?;
    let loads: Vec<Load> = [Load::Heavy, Load::Light]
        .into_iter()
        .filter(|l| points.iter().any(|p| p.load == *l))
        .collect();
    let panels = body.split_evenly((loads.len(), 1));
    let mut designs: Vec<&str> = Vec::new();
    for p in points {
        if !designs.contains(&p.design.as_str()) {
            designs.push(&p.design);
        }
    }
    let mut sizes: Vec<usize> = points.iter().map(|p| p.size_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for (panel, load) in panels.iter().zip(&loads) {
        let of_load: Vec<&RpcPoint> = points.iter().filter(|p| p.load == *load).collect();
        let y_max = of_load
            .iter()
            .filter_map(|p| p.ops_per_sec)
            .fold(1.0f64, f64::max)
            * 1.12;
        let title = match load {
            Load::Heavy => "(a) heavy load (100 µs processing per request)",
            Load::Light => "(b) light load (no processing)",
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(title, (FONT_FAMILY, 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.5f64..designs.len() as f64 - 0.5, 0f64..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(designs.len() + 1)
            .x_label_formatter(&|x| plot::category_label(&designs, *x))
            .y_desc("op/s")
            .y_label_formatter(&|y| format!("{:.0}", y))
            .label_style((FONT_FAMILY, 14))
            .draw()?;
        let bar_w = 0.8 / sizes.len().max(1) as f64;
        for (si, size) in sizes.iter().enumerate() {
            let colour = SIZE_COLOURS[si % SIZE_COLOURS.len()];
            let bars: Vec<Rectangle<(f64, f64)>> = designs
                .iter()
                .enumerate()
                .filter_map(|(di, d)| {
                    let p = of_load
                        .iter()
                        .find(|p| p.design == *d && p.size_bytes == *size)?;
                    let v = p.ops_per_sec?;
                    let x0 = di as f64 - 0.4 + si as f64 * bar_w;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + bar_w * 0.9, v)],
                        colour.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(bars)?
                .label(size_name(*size))
                .legend(plot::legend_box(colour));
        }
        plot::draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 14)?;
    }
    Ok(())
}
