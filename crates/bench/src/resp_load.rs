//! `rowankv bench resp`: RowanKV's own RESP load generator, the one client driver
//! behind the comparison with Redis (`scripts/redis-compare`,
//! `docs/results/redis.md`).
//!
//! It speaks plain RESP2 to one address, or to several (comma-separated:
//! connection `i` goes to address `i mod n`, as clients spread over a cluster's
//! servers), so the same driver, with the same parameters, loads RowanKV servers'
//! RESP front ends and a `redis-server`:
//! - `connections` blocking TCP connections, one OS thread each;
//! - each connection sends a *batch* of `pipeline` requests in one write, then reads
//!   that many replies (closed loop: one batch in flight per connection);
//! - requests are `SET key value` (fixed `value_bytes`) or, with [`Mix::SetGet`],
//!   `SET` or `GET` with probability ½ each; keys are `key:%012u` (16 B) over a key
//!   space of `keys`, drawn uniformly or from YCSB's scrambled Zipfian (the
//!   generator of [`crate::ycsb::workload`], reused);
//! - optionally `WAIT NUMREPLICAS TIMEOUT`, after every `SET` ([`WaitPer::Request`])
//!   or once after every batch that holds a `SET` ([`WaitPer::Batch`]).
//!
//! A request's latency runs from its batch's send to the arrival of the reply that
//! acknowledges it: its own reply, or — when WAIT is on, for a `SET` — the reply of
//! the WAIT that covers it, since only then does the client know the write is on
//! the replicas. Throughput counts `SET` and `GET` requests (never the WAITs).
//!
//! Every reply is checked: `SET` must answer `+OK`, `GET` a bulk string or null,
//! `WAIT` an integer of at least `NUMREPLICAS`. Anything else (an error reply above
//! all) counts as an error, with the first few kept as samples; the command line
//! fails when a run has any. Bytes that are not RESP, a closed connection, or no
//! reply within [`REPLY_TIMEOUT`] end the run with an error.
//!
//! CPU per operation: the utime + stime of the given processes (`/proc/PID/stat`)
//! and of this process, sampled when the measured phase starts and after it ends,
//! divided by the operations measured. The `/proc` figures tick at `USER_HZ` (100
//! per second), so a run should last seconds, not milliseconds.
//!
//! This module also owns the comparison's reporting: the table (plain and
//! Markdown), the ratios of RowanKV against each Redis configuration with the
//! issue's goals ([`ratios`]), and the plot ([`plot`]). Those read only the result
//! records, so `--from FILE.json` reports a run saved earlier.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_resp::{encode_request, ReplyParseError, ReplyParser, Value};
use serde::{Deserialize, Serialize};

use crate::plot::PlotError;
use crate::ycsb::workload::{KeyDist, Permutation, Zipfian};

/// Bound on connections (one OS thread each).
pub const CONNECTIONS_MAX: usize = 1024;
/// Bound on the requests of one batch.
pub const PIPELINE_MAX: usize = 4096;
/// Bound on a value.
pub const VALUE_BYTES_MAX: usize = 1 << 20;
/// Bound on the key space: the keys are `key:` and 12 decimal digits.
pub const KEYS_MAX: u64 = 1_000_000_000_000;
/// How long a connection waits for the next bytes of a reply before the run fails.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Error replies kept word for word per run (the rest are only counted).
pub const ERROR_SAMPLES_MAX: usize = 5;
/// Highest latency the histograms hold: a reply later than this is clamped (and
/// the reply timeout fires long before in practice).
const LATENCY_NS_MAX: u64 = 120_000_000_000;
/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Fixed key of the permutation that spreads the popular Zipfian ranks over the key
/// space: the same in every connection, so all agree on which keys are hot.
const KEY_SCRAMBLE: u64 = 0x5245_5350_4c6f_6164; // "RESPLoad"
/// `/proc/PID/stat` counts CPU time in clock ticks of `USER_HZ`, which the kernel
/// fixes at 100 per second for user space on every architecture Linux runs on.
const CLOCK_TICKS_PER_S: f64 = 100.0;

const _: () = assert!(KEYS_MAX <= 10u64.pow(12));
const _: () = assert!(ERROR_SAMPLES_MAX >= 1);
const _: () = assert!(LATENCY_NS_MAX > REPLY_TIMEOUT.as_nanos() as u64);

/// Which requests a batch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// Every request a `SET`.
    Set,
    /// `SET` or `GET`, ½ each.
    SetGet,
}

impl FromStr for Mix {
    type Err = RespLoadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "set" => Ok(Mix::Set),
            "setget" | "set-get" => Ok(Mix::SetGet),
            _ => Err(RespLoadError::Option(format!(
                "unknown mix {s:?} (expected set or setget)"
            ))),
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mix::Set => "set",
            Mix::SetGet => "setget",
        })
    }
}

/// Where a `WAIT` goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitPer {
    /// After every `SET`.
    Request,
    /// Once at the end of every batch that holds a `SET`.
    Batch,
}

impl FromStr for WaitPer {
    type Err = RespLoadError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "request" => Ok(WaitPer::Request),
            "batch" => Ok(WaitPer::Batch),
            _ => Err(RespLoadError::Option(format!(
                "unknown --wait-per {s:?} (expected request or batch)"
            ))),
        }
    }
}

/// `WAIT replicas timeout_ms`, and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wait {
    pub replicas: u32,
    /// 0: wait for ever (Redis's meaning); the reply timeout still applies.
    pub timeout_ms: u64,
    pub per: WaitPer,
}

impl Wait {
    /// Parses `"NUMREPLICAS TIMEOUT"` (as the `WAIT` command takes them).
    pub fn parse(text: &str, per: WaitPer) -> Result<Wait, RespLoadError> {
        let err = || {
            RespLoadError::Option(format!(
                "--wait {text:?}: expected \"NUMREPLICAS TIMEOUT_MS\", e.g. \"2 0\""
            ))
        };
        let mut words = text.split_whitespace();
        let (Some(r), Some(t), None) = (words.next(), words.next(), words.next()) else {
            return Err(err());
        };
        Ok(Wait {
            replicas: r.parse().map_err(|_| err())?,
            timeout_ms: t.parse().map_err(|_| err())?,
            per,
        })
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = match self.per {
            WaitPer::Request => "request",
            WaitPer::Batch => "batch",
        };
        write!(f, "WAIT {} {} per {per}", self.replicas, self.timeout_ms)
    }
}

/// When the measured phase ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many seconds (batches already sent are finished).
    Seconds(f64),
    /// After this many requests in all, shared out over the connections.
    Requests(u64),
}

/// Parses a key distribution: `uniform`, `zipf` or `zipfian` (θ 0.99), or
/// `zipf:THETA` / `zipfian:THETA` (YCSB's "latest" has no meaning here).
pub fn parse_dist(text: &str) -> Result<KeyDist, RespLoadError> {
    let lower = text.to_ascii_lowercase();
    let normalised = match lower.strip_prefix("zipf") {
        Some(rest) if !rest.starts_with("ian") => format!("zipfian{rest}"),
        _ => lower,
    };
    match normalised.parse::<KeyDist>() {
        Ok(KeyDist::Latest) | Err(_) => Err(RespLoadError::Option(format!(
            "unknown --dist {text:?} (expected uniform, zipf or zipf:THETA with 0 < THETA < 1)"
        ))),
        Ok(d) => Ok(d),
    }
}

/// One run of the load generator.
#[derive(Clone, Debug)]
pub struct RespLoadOptions {
    /// `host:port` of a RESP server, or several comma-separated (connections are
    /// spread over them round-robin).
    pub addr: String,
    pub connections: usize,
    /// Requests per batch.
    pub pipeline: usize,
    pub value_bytes: usize,
    /// Size of the key space.
    pub keys: u64,
    pub dist: KeyDist,
    pub mix: Mix,
    pub wait: Option<Wait>,
    pub stop: Stop,
    /// Seconds of load before the measured phase (not counted).
    pub warmup_s: f64,
    /// Processes whose CPU time is charged to the operations (the servers).
    pub pids: Vec<u32>,
    /// Names the run in the table and the JSON (e.g. `rowankv`, `redis-wait`).
    pub label: String,
    /// What an acknowledged write means in this configuration, for the table.
    pub durability: String,
    pub seed: u64,
}

impl RespLoadOptions {
    /// A short SET-only 100 B run against `addr`.
    pub fn new(addr: impl Into<String>) -> RespLoadOptions {
        RespLoadOptions {
            addr: addr.into(),
            connections: 50,
            pipeline: 1,
            value_bytes: 100,
            keys: 100_000,
            dist: KeyDist::Uniform,
            mix: Mix::Set,
            wait: None,
            stop: Stop::Seconds(10.0),
            warmup_s: 2.0,
            pids: Vec::new(),
            label: "run".to_string(),
            durability: String::new(),
            seed: 1,
        }
    }

    /// The addresses of `addr`, in order (never empty: `""` gives one empty
    /// address, refused by [`RespLoadOptions::validate`]).
    pub fn addrs(&self) -> Vec<&str> {
        self.addr.split(',').map(str::trim).collect()
    }

    /// Checks every option, before any connection is opened.
    pub fn validate(&self) -> Result<(), RespLoadError> {
        let bad = |m: String| Err(RespLoadError::Option(m));
        if !(1..=CONNECTIONS_MAX).contains(&self.connections) {
            return bad(format!(
                "--connections {} outside 1..={CONNECTIONS_MAX}",
                self.connections
            ));
        }
        if !(1..=PIPELINE_MAX).contains(&self.pipeline) {
            return bad(format!(
                "--pipeline {} outside 1..={PIPELINE_MAX}",
                self.pipeline
            ));
        }
        if !(1..=VALUE_BYTES_MAX).contains(&self.value_bytes) {
            return bad(format!(
                "--value-bytes {} outside 1..={VALUE_BYTES_MAX}",
                self.value_bytes
            ));
        }
        if !(1..=KEYS_MAX).contains(&self.keys) {
            return bad(format!("--keys {} outside 1..={KEYS_MAX}", self.keys));
        }
        if matches!(self.dist, KeyDist::Latest) {
            return bad("--dist latest has no meaning here".to_string());
        }
        match self.stop {
            Stop::Seconds(s) if !(s.is_finite() && s > 0.0) => {
                return bad(format!(
                    "--duration {s} must be a positive number of seconds"
                ))
            }
            Stop::Requests(0) => return bad("--requests must be at least 1".to_string()),
            _ => {}
        }
        if !(self.warmup_s.is_finite() && self.warmup_s >= 0.0) {
            return bad(format!(
                "--warmup {} must be 0 or more seconds",
                self.warmup_s
            ));
        }
        for addr in self.addrs() {
            if addr.to_socket_addrs().is_err() {
                return bad(format!("--addr {addr:?} is not a reachable host:port"));
            }
        }
        Ok(())
    }
}

/// What can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum RespLoadError {
    #[error("{0}")]
    Option(String),
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection {connection}: {source}")]
    Io {
        connection: usize,
        source: std::io::Error,
    },
    #[error("connection {connection}: no reply within {} s", REPLY_TIMEOUT.as_secs())]
    Timeout { connection: usize },
    #[error("connection {connection}: the server closed the connection")]
    Closed { connection: usize },
    #[error("connection {connection}: the server's bytes are not RESP: {source}")]
    Protocol {
        connection: usize,
        source: ReplyParseError,
    },
    #[error("CPU time of process {pid}: {reason}")]
    Cpu { pid: String, reason: String },
    #[error("connection thread {0} panicked")]
    Panicked(usize),
    /// The measured phase ended with no request answered: a result of 0 ops/s
    /// would say nothing about the server (warm up longer, or measure longer).
    #[error(
        "no request was answered in the {seconds:.1} s measured (after {warmup_s} s of warm-up)"
    )]
    NothingMeasured { seconds: f64, warmup_s: f64 },
}

/// The record of one run: what the table, the JSON and the plot show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RespLoadResult {
    pub label: String,
    /// What an acknowledged write means in the configuration measured.
    pub durability: String,
    pub addr: String,
    pub connections: usize,
    pub pipeline: usize,
    pub value_bytes: usize,
    pub keys: u64,
    pub dist: String,
    pub mix: Mix,
    /// `none`, or e.g. `WAIT 2 0 per request`.
    pub wait: String,
    /// Length of the measured phase.
    pub seconds: f64,
    /// `SET`s and `GET`s measured.
    pub ops: u64,
    pub sets: u64,
    pub gets: u64,
    /// `WAIT`s sent in the measured phase.
    pub waits: u64,
    /// Replies that were errors or not what the request expects (warm-up included).
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub ops_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// CPU time of `server_pids` per operation; `None` without pids.
    pub server_cpu_us_per_op: Option<f64>,
    pub server_pids: Vec<u32>,
    /// CPU time of the load generator itself per operation.
    pub client_cpu_us_per_op: f64,
}

/// Runs the load (see the module docs).
pub fn run(opts: &RespLoadOptions) -> Result<RespLoadResult, RespLoadError> {
    opts.validate()?;
    // Connect every connection before the clock starts, so a refused address fails
    // at once and connection set-up is not measured.
    let addrs = opts.addrs();
    let mut streams = Vec::with_capacity(opts.connections);
    for i in 0..opts.connections {
        let addr = addrs[i % addrs.len()];
        let stream = TcpStream::connect(addr).map_err(|source| RespLoadError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        stream
            .set_nodelay(true)
            .and_then(|()| stream.set_read_timeout(Some(REPLY_TIMEOUT)))
            .map_err(|source| RespLoadError::Io {
                connection: streams.len(),
                source,
            })?;
        streams.push(stream);
    }
    let value: Arc<[u8]> = (0..opts.value_bytes)
        .map(|i| b'a' + (i % 26) as u8)
        .collect::<Vec<u8>>()
        .into();
    let start = Instant::now();
    let measure_start = start + Duration::from_secs_f64(opts.warmup_s);
    let handles: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(connection, stream)| {
            let plan = ConnectionPlan {
                connection,
                opts: opts.clone(),
                value: Arc::clone(&value),
                measure_start,
                requests: match opts.stop {
                    Stop::Requests(n) => Some(share(n, opts.connections, connection)),
                    Stop::Seconds(_) => None,
                },
            };
            std::thread::Builder::new()
                .name(format!("resp-load-{connection}"))
                .spawn(move || drive(stream, plan))
                .expect("spawn a load thread")
        })
        .collect();
    std::thread::sleep(measure_start.saturating_duration_since(Instant::now()));
    let cpu_before = cpu_ticks(&opts.pids)?;
    let self_before = process_cpu_ticks("self")?;
    let mut outcomes = Vec::with_capacity(handles.len());
    let mut first_error = None;
    for (connection, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(o)) => outcomes.push(o),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(RespLoadError::Panicked(connection));
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let cpu_after = cpu_ticks(&opts.pids)?;
    let self_after = process_cpu_ticks("self")?;
    let mut hist = new_histogram();
    let mut total = Outcome::new();
    let mut end = measure_start;
    for o in outcomes {
        hist.add(&o.hist).expect("histograms of equal bounds");
        total.ops += o.ops;
        total.sets += o.sets;
        total.gets += o.gets;
        total.waits += o.waits;
        total.errors += o.errors;
        for s in o.error_samples {
            if total.error_samples.len() < ERROR_SAMPLES_MAX {
                total.error_samples.push(s);
            }
        }
        if let Some(done) = o.last_done {
            end = end.max(done);
        }
    }
    let seconds = end.saturating_duration_since(measure_start).as_secs_f64();
    if total.ops == 0 {
        return Err(RespLoadError::NothingMeasured {
            seconds: match opts.stop {
                Stop::Seconds(s) => s,
                Stop::Requests(_) => seconds,
            },
            warmup_s: opts.warmup_s,
        });
    }
    let per_op_us = |ticks: u64| {
        (total.ops > 0).then(|| ticks as f64 / CLOCK_TICKS_PER_S * 1e6 / total.ops as f64)
    };
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(RespLoadResult {
        label: opts.label.clone(),
        durability: opts.durability.clone(),
        addr: opts.addr.clone(),
        connections: opts.connections,
        pipeline: opts.pipeline,
        value_bytes: opts.value_bytes,
        keys: opts.keys,
        dist: dist_name(opts.dist),
        mix: opts.mix,
        wait: opts.wait.map_or("none".to_string(), |w| w.to_string()),
        seconds,
        ops: total.ops,
        sets: total.sets,
        gets: total.gets,
        waits: total.waits,
        errors: total.errors,
        error_samples: total.error_samples,
        ops_per_s: if seconds > 0.0 {
            total.ops as f64 / seconds
        } else {
            0.0
        },
        p50_us: us(hist.value_at_quantile(0.50)),
        p99_us: us(hist.value_at_quantile(0.99)),
        p999_us: us(hist.value_at_quantile(0.999)),
        max_us: us(hist.max()),
        server_cpu_us_per_op: if opts.pids.is_empty() {
            None
        } else {
            per_op_us(cpu_after.saturating_sub(cpu_before))
        },
        server_pids: opts.pids.clone(),
        client_cpu_us_per_op: per_op_us(self_after.saturating_sub(self_before)).unwrap_or(0.0),
    })
}

/// `zipf` (θ 0.99), `zipf:THETA` or `uniform`.
fn dist_name(dist: KeyDist) -> String {
    dist.to_string().replace("zipfian", "zipf")
}

/// Connection `i`'s share of `n` requests over `connections`.
fn share(n: u64, connections: usize, i: usize) -> u64 {
    let c = connections as u64;
    n / c + u64::from((i as u64) < n % c)
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid bounds")
}

/// What one connection thread is given.
struct ConnectionPlan {
    connection: usize,
    opts: RespLoadOptions,
    value: Arc<[u8]>,
    measure_start: Instant,
    /// This connection's measured requests (`Stop::Requests`), or `None`.
    requests: Option<u64>,
}

/// What one connection measured.
struct Outcome {
    hist: Histogram<u64>,
    ops: u64,
    sets: u64,
    gets: u64,
    waits: u64,
    errors: u64,
    error_samples: Vec<String>,
    /// When the last measured batch completed.
    last_done: Option<Instant>,
}

impl Outcome {
    fn new() -> Outcome {
        Outcome {
            hist: new_histogram(),
            ops: 0,
            sets: 0,
            gets: 0,
            waits: 0,
            errors: 0,
            error_samples: Vec::new(),
            last_done: None,
        }
    }

    fn error(&mut self, text: String) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES_MAX {
            self.error_samples.push(text);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Set,
    Get,
    Wait,
}

/// One command of a batch: its kind and the request (index in the batch) it
/// acknowledges; a per-batch WAIT acknowledges every `SET` of the batch (`None`).
#[derive(Clone, Copy, Debug)]
struct Command {
    kind: Kind,
    request: Option<usize>,
}

/// Picks the keys of one connection.
struct KeyChooser {
    keys: u64,
    zipf: Option<(Zipfian, Permutation)>,
}

impl KeyChooser {
    fn new(keys: u64, dist: KeyDist) -> KeyChooser {
        let zipf = match dist {
            KeyDist::Zipfian { theta } => Some((
                Zipfian::new(keys, theta),
                Permutation::new(keys, KEY_SCRAMBLE),
            )),
            KeyDist::Uniform | KeyDist::Latest => None,
        };
        KeyChooser { keys, zipf }
    }

    fn next(&self, rng: &mut ChaCha8Rng) -> u64 {
        match &self.zipf {
            Some((z, p)) => p.apply(z.sample(rng)),
            None => rng.gen_range(0..self.keys),
        }
    }
}

/// One connection's closed loop: build a batch, send it, read its replies.
fn drive(mut stream: TcpStream, plan: ConnectionPlan) -> Result<Outcome, RespLoadError> {
    let opts = &plan.opts;
    let connection = plan.connection;
    let mut rng = ChaCha8Rng::seed_from_u64(
        opts.seed ^ (connection as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    let chooser = KeyChooser::new(opts.keys, opts.dist);
    let end = match opts.stop {
        Stop::Seconds(s) => Some(plan.measure_start + Duration::from_secs_f64(s)),
        Stop::Requests(_) => None,
    };
    let wait_args = opts
        .wait
        .map(|w| (w.replicas.to_string(), w.timeout_ms.to_string()));
    let mut out = Outcome::new();
    let mut remaining = plan.requests;
    let mut parser = ReplyParser::default();
    let mut send = Vec::new();
    let mut recv: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let mut commands: Vec<Command> = Vec::with_capacity(2 * opts.pipeline + 1);
    let mut done_at: Vec<Option<Instant>> = Vec::with_capacity(opts.pipeline);
    let mut kinds: Vec<Kind> = Vec::with_capacity(opts.pipeline);
    loop {
        let now = Instant::now();
        let measured = now >= plan.measure_start;
        let batch = match (measured, end, remaining) {
            (false, _, _) => opts.pipeline,
            (true, Some(end), _) if now >= end => break,
            (true, Some(_), _) => opts.pipeline,
            (true, None, Some(0)) => break,
            (true, None, Some(n)) => opts.pipeline.min(n as usize),
            (true, None, None) => unreachable!("a run stops by time or by count"),
        };
        send.clear();
        commands.clear();
        kinds.clear();
        for i in 0..batch {
            let key = format!("key:{:012}", chooser.next(&mut rng));
            let is_set = opts.mix == Mix::Set || rng.gen_bool(0.5);
            if is_set {
                encode_request(&[b"SET", key.as_bytes(), &plan.value[..]], &mut send);
                kinds.push(Kind::Set);
                commands.push(Command {
                    kind: Kind::Set,
                    request: Some(i),
                });
                if let (Some(w), Some((r, t))) = (opts.wait, &wait_args) {
                    if w.per == WaitPer::Request {
                        encode_request(&[b"WAIT", r.as_bytes(), t.as_bytes()], &mut send);
                        commands.push(Command {
                            kind: Kind::Wait,
                            request: Some(i),
                        });
                    }
                }
            } else {
                encode_request(&[b"GET", key.as_bytes()], &mut send);
                kinds.push(Kind::Get);
                commands.push(Command {
                    kind: Kind::Get,
                    request: Some(i),
                });
            }
        }
        if let (Some(w), Some((r, t))) = (opts.wait, &wait_args) {
            if w.per == WaitPer::Batch && kinds.contains(&Kind::Set) {
                encode_request(&[b"WAIT", r.as_bytes(), t.as_bytes()], &mut send);
                commands.push(Command {
                    kind: Kind::Wait,
                    request: None,
                });
            }
        }
        done_at.clear();
        done_at.resize(batch, None);
        let sent_at = Instant::now();
        stream
            .write_all(&send)
            .map_err(|source| RespLoadError::Io { connection, source })?;
        let mut next = 0;
        let mut read_at = sent_at;
        while next < commands.len() {
            let reply = match parser.parse(&recv) {
                Ok(Some((reply, consumed))) => {
                    recv.drain(..consumed);
                    reply
                }
                Ok(None) => {
                    let n = match stream.read(&mut chunk) {
                        Ok(0) => return Err(RespLoadError::Closed { connection }),
                        Ok(n) => n,
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            return Err(RespLoadError::Timeout { connection })
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(source) => return Err(RespLoadError::Io { connection, source }),
                    };
                    read_at = Instant::now();
                    recv.extend_from_slice(&chunk[..n]);
                    continue;
                }
                Err(source) => return Err(RespLoadError::Protocol { connection, source }),
            };
            let command = commands[next];
            next += 1;
            if let Some(problem) = check_reply(command.kind, &reply, opts.wait) {
                out.error(problem);
            }
            match command.request {
                Some(i) => done_at[i] = Some(read_at),
                None => {
                    for (i, k) in kinds.iter().enumerate() {
                        if *k == Kind::Set {
                            done_at[i] = Some(read_at);
                        }
                    }
                }
            }
        }
        if !measured {
            continue;
        }
        for (kind, done) in kinds.iter().zip(&done_at) {
            let done = done.expect("every request of a batch has its reply");
            let ns = done.saturating_duration_since(sent_at).as_nanos() as u64;
            out.hist.saturating_record(ns.clamp(1, LATENCY_NS_MAX));
            match kind {
                Kind::Set => out.sets += 1,
                Kind::Get => out.gets += 1,
                Kind::Wait => unreachable!("WAIT is never a request"),
            }
        }
        out.ops += batch as u64;
        out.waits += commands.iter().filter(|c| c.kind == Kind::Wait).count() as u64;
        out.last_done = Some(read_at);
        if let Some(n) = remaining.as_mut() {
            *n -= batch as u64;
        }
    }
    Ok(out)
}

/// Why `reply` does not acknowledge a `kind` command, or `None` if it does.
fn check_reply(kind: Kind, reply: &Value, wait: Option<Wait>) -> Option<String> {
    let name = match kind {
        Kind::Set => "SET",
        Kind::Get => "GET",
        Kind::Wait => "WAIT",
    };
    match (kind, reply) {
        (_, Value::Error(e)) => Some(format!("{name}: -{}", String::from_utf8_lossy(e))),
        (Kind::Set, Value::SimpleString(s)) if s == b"OK" => None,
        (Kind::Get, Value::BulkString(_) | Value::Null) => None,
        (Kind::Wait, Value::Integer(n)) => {
            let wanted = wait.map_or(0, |w| i64::from(w.replicas));
            (*n < wanted).then(|| format!("WAIT: {n} of {wanted} replicas acknowledged"))
        }
        (_, other) => Some(format!("{name}: unexpected reply {other:?}")),
    }
}

/// The summed CPU ticks of `pids`.
fn cpu_ticks(pids: &[u32]) -> Result<u64, RespLoadError> {
    pids.iter().map(|p| process_cpu_ticks(&p.to_string())).sum()
}

/// utime + stime of process `pid` (a number or `self`), in clock ticks.
pub fn process_cpu_ticks(pid: &str) -> Result<u64, RespLoadError> {
    let err = |reason: String| RespLoadError::Cpu {
        pid: pid.to_string(),
        reason,
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| err(format!("cannot read /proc/{pid}/stat: {e}")))?;
    // The command name (field 2) is in parentheses and may hold spaces: the
    // fields are counted after its closing one. utime and stime are fields 14
    // and 15, so the 12th and 13th after the name.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| err("no command name in /proc/PID/stat".to_string()))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64, RespLoadError> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| err(format!("field {} of /proc/PID/stat unreadable", i + 3)))
    };
    Ok(field(11)? + field(12)?)
}

// ---------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------

const TABLE_HEADER: [&str; 12] = [
    "label",
    "size B",
    "keys",
    "mix",
    "pipe",
    "wait",
    "ops/s",
    "p50 µs",
    "p99 µs",
    "p99.9 µs",
    "srv CPU µs/op",
    "cli CPU µs/op",
];

fn table_rows(results: &[RespLoadResult]) -> Vec<Vec<String>> {
    results
        .iter()
        .map(|r| {
            vec![
                r.label.clone(),
                r.value_bytes.to_string(),
                r.dist.clone(),
                r.mix.to_string(),
                r.pipeline.to_string(),
                r.wait.clone(),
                format!("{:.0}", r.ops_per_s),
                format!("{:.0}", r.p50_us),
                format!("{:.0}", r.p99_us),
                format!("{:.0}", r.p999_us),
                r.server_cpu_us_per_op
                    .map_or("-".to_string(), |c| format!("{c:.1}")),
                format!("{:.1}", r.client_cpu_us_per_op),
            ]
        })
        .collect()
}

/// The results as a fixed-width table (errors, when any, on lines below it).
pub fn table(results: &[RespLoadResult]) -> String {
    let mut out = crate::table::render(&TABLE_HEADER, &table_rows(results));
    for r in results.iter().filter(|r| r.errors > 0) {
        out.push_str(&format!(
            "{}: {} error replies, e.g. {:?}\n",
            r.label, r.errors, r.error_samples
        ));
    }
    out
}

/// The results as a Markdown table, with each configuration's durability.
pub fn markdown(results: &[RespLoadResult]) -> String {
    let mut header: Vec<&str> = TABLE_HEADER.to_vec();
    header.push("errors");
    header.push("durability of an acknowledged SET");
    let mut out = format!("| {} |\n", header.join(" | "));
    out.push_str(&format!("|{}\n", " --- |".repeat(header.len())));
    for (r, mut row) in results.iter().zip(table_rows(results)) {
        row.push(r.errors.to_string());
        row.push(r.durability.replace('|', "/"));
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// RowanKV's throughput over one Redis configuration's, measured in the same run
/// with the same load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ratio {
    /// The load both ran: size, keys, mix, pipeline, connections.
    pub load: String,
    pub redis_label: String,
    pub redis_wait: String,
    pub rowankv_ops_per_s: f64,
    pub redis_ops_per_s: f64,
    /// `rowankv_ops_per_s / redis_ops_per_s`.
    pub ratio: f64,
    /// The goal for this pair (SET-only 100 B only), as a minimum ratio.
    pub goal_min: Option<f64>,
    pub goal_met: Option<bool>,
}

/// The goal of RowanKV against a Redis configuration, by the label
/// `scripts/redis-compare` gives it: ≥ 5× Redis with WAIT 2 and an fsync'd AOF
/// (equal durability), ≥ 2× Redis with WAIT 2 alone, within 2× (≥ 0.5×) of plain
/// Redis. The issue sets them for SET-only 100 B.
fn goal_min(label: &str) -> Option<f64> {
    if label.starts_with("redis-wait-aof") {
        Some(5.0)
    } else if label.starts_with("redis-wait") {
        Some(2.0)
    } else if label.starts_with("redis-plain") {
        Some(0.5)
    } else {
        None
    }
}

fn load_name(r: &RespLoadResult) -> String {
    format!(
        "{} B, {}, {}, {} conn x {} pipe",
        r.value_bytes, r.dist, r.mix, r.connections, r.pipeline
    )
}

/// Each `redis*` record against the `rowankv` record of the same load (value
/// size, keys, mix, connections, pipeline).
pub fn ratios(results: &[RespLoadResult]) -> Vec<Ratio> {
    let same_load = |a: &RespLoadResult, b: &RespLoadResult| {
        (a.value_bytes, &a.dist, a.mix, a.connections, a.pipeline)
            == (b.value_bytes, &b.dist, b.mix, b.connections, b.pipeline)
    };
    let mut out = Vec::new();
    for redis in results.iter().filter(|r| r.label.starts_with("redis")) {
        let Some(rowan) = results
            .iter()
            .find(|r| r.label.starts_with("rowankv") && same_load(r, redis))
        else {
            continue;
        };
        let ratio = rowan.ops_per_s / redis.ops_per_s.max(f64::MIN_POSITIVE);
        let goal =
            goal_min(&redis.label).filter(|_| redis.mix == Mix::Set && redis.value_bytes == 100);
        out.push(Ratio {
            load: load_name(redis),
            redis_label: redis.label.clone(),
            redis_wait: redis.wait.clone(),
            rowankv_ops_per_s: rowan.ops_per_s,
            redis_ops_per_s: redis.ops_per_s,
            ratio,
            goal_min: goal,
            goal_met: goal.map(|g| ratio >= g),
        });
    }
    out
}

/// The ratios as a Markdown table.
pub fn ratios_markdown(ratios: &[Ratio]) -> String {
    let mut out = String::from(
        "| load | Redis configuration | Redis wait | RowanKV ops/s | Redis ops/s | RowanKV / Redis | goal | met |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for r in ratios {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.2}x | {} | {} |\n",
            r.load,
            r.redis_label,
            r.redis_wait,
            r.rowankv_ops_per_s,
            r.redis_ops_per_s,
            r.ratio,
            r.goal_min.map_or("-".to_string(), |g| format!(">= {g}x")),
            match r.goal_met {
                None => "-".to_string(),
                Some(true) => "yes".to_string(),
                Some(false) => format!(
                    "no: short by {:.2}x ({:.0} % of the goal)",
                    r.goal_min.unwrap_or(0.0) - r.ratio,
                    100.0 * r.ratio / r.goal_min.unwrap_or(1.0)
                ),
            }
        ));
    }
    out
}

// ---------------------------------------------------------------------------------
// Plot
// ---------------------------------------------------------------------------------

/// Bound on the records one plot draws (one bar group each).
pub const PLOT_RECORDS_MAX: usize = 16;
const PLOT_SIZE_PX: (u32, u32) = (1500, 700);
const PLOT_FONT_FAMILY: &str = crate::plot::FONT_FAMILY;
const PLOT_COLOURS: &[RGBColor] = crate::plot::PALETTE.split_at(6).0;

/// Draws throughput, and p50/p99/p99.9 latency (log scale), per record into a PNG
/// file, one bar per record in the order given, the label under it.
pub fn plot(results: &[RespLoadResult], path: &Path) -> Result<(), PlotError> {
    if results.is_empty() {
        return Err(PlotError::NoData("no RESP load records".into()));
    }
    if results.len() > PLOT_RECORDS_MAX {
        return Err(PlotError::NoData(format!(
            "{} records; at most {PLOT_RECORDS_MAX} fit one plot (plot one load at a time)",
            results.len()
        )));
    }
    crate::plot::render(path, PLOT_SIZE_PX, |root| draw_plot(results, root))
}

fn draw_plot(
    results: &[RespLoadResult],
    root: &crate::plot::Area<'_>,
) -> crate::plot::DrawResult<()> {
    let first = &results[0];
    root.fill(&WHITE)?;
    let title = format!(
        "RESP load: {} connections x pipeline {}, {} B values, {} keys, {} — RowanKV and Redis side by side",
        first.connections, first.pipeline, first.value_bytes, first.dist, first.mix
    );
    let body = root.titled(&title, (PLOT_FONT_FAMILY, 22))?;
    let (_, h) = body.dim_in_pixel();
    let (body, foot) = body.split_vertically(h.saturating_sub(30));
    foot.draw_text(
        &format!(
            "Measured {:.1} s per configuration; errors: {}. Latency: from the batch's send to the reply acknowledging the request (the WAIT's, when WAIT is on).",
            first.seconds,
            results.iter().map(|r| r.errors).sum::<u64>()
        ),
        &TextStyle::from((PLOT_FONT_FAMILY, 14)).color(&BLACK),
        (14, 6),
    )?;
    let panels = body.split_evenly((1, 2));
    let n = results.len() as i32;
    // Record i is centred at i * SLOT on an integer axis.
    const SLOT: i32 = 100;
    let labels: Vec<String> = results.iter().map(|r| r.label.clone()).collect();
    let name_at = |x: &i32| {
        if x.rem_euclid(SLOT) == 0 {
            labels.get((x / SLOT) as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let x_range =
        || (-SLOT / 2..n * SLOT - SLOT / 2).with_key_points((0..n).map(|i| i * SLOT).collect());

    let kops: Vec<f64> = results.iter().map(|r| r.ops_per_s / 1e3).collect();
    let hi = kops.iter().copied().fold(0.0, f64::max).max(1e-3) * 1.15;
    let mut chart = ChartBuilder::on(&panels[0])
        .caption("Throughput", (PLOT_FONT_FAMILY, 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range(), 0.0..hi)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&name_at)
        .y_desc("operations per second (thousands)")
        .label_style((PLOT_FONT_FAMILY, 13))
        .draw()?;
    let half = SLOT * 35 / 100;
    chart.draw_series(kops.iter().enumerate().map(|(i, &v)| {
        let x = i as i32 * SLOT;
        Rectangle::new(
            [(x - half, 0.0), (x + half, v)],
            PLOT_COLOURS[i % PLOT_COLOURS.len()].filled(),
        )
    }))?;
    let above = TextStyle::from((PLOT_FONT_FAMILY, 13))
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(
        kops.iter()
            .enumerate()
            .map(|(i, &v)| Text::new(format!("{v:.1}"), (i as i32 * SLOT, v), above.clone())),
    )?;

    let lat: Vec<[f64; 3]> = results
        .iter()
        .map(|r| [r.p50_us, r.p99_us, r.p999_us].map(|v| v.max(1.0)))
        .collect();
    let top = lat.iter().flatten().copied().fold(1.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&panels[1])
        .caption("Latency (p50, p99, p99.9)", (PLOT_FONT_FAMILY, 18))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range(), (1.0..top).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&name_at)
        .y_desc("µs (log scale)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((PLOT_FONT_FAMILY, 13))
        .draw()?;
    let third = SLOT * 25 / 100;
    let shades = [
        RGBColor(120, 170, 210),
        RGBColor(31, 119, 180),
        RGBColor(10, 50, 90),
    ];
    for (k, (name, shade)) in ["p50", "p99", "p99.9"].iter().zip(shades).enumerate() {
        chart
            .draw_series(lat.iter().enumerate().map(|(i, v)| {
                let x = i as i32 * SLOT + (k as i32 - 1) * third;
                Rectangle::new(
                    [(x - third / 2, 1.0), (x + third / 2, v[k])],
                    shade.filled(),
                )
            }))?
            .label(*name)
            .legend(crate::plot::legend_box(shade));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font((PLOT_FONT_FAMILY, 13))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// What the test server saw.
    #[derive(Default)]
    struct Seen {
        sets: AtomicU64,
        gets: AtomicU64,
        waits: AtomicU64,
        writes: AtomicU64,
    }

    /// How the test server answers.
    #[derive(Clone, Copy)]
    struct Behaviour {
        /// Every `SET` whose 1-based number is a multiple of this answers `-ERR`.
        set_error_every: Option<u64>,
        /// What `WAIT` answers.
        wait_reply: i64,
        /// How long every answer is held back.
        reply_delay: Duration,
    }

    /// A RESP server on a free local port: SET answers `+OK`, GET a bulk string,
    /// WAIT an integer; one thread per connection.
    fn server(behaviour: Behaviour) -> (String, Arc<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Seen::default());
        let s = Arc::clone(&seen);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let seen = Arc::clone(&s);
                std::thread::spawn(move || {
                    let mut parser = rowankv_resp::RequestParser::default();
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = match conn.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        let mut out = Vec::new();
                        while let Ok(Some((req, used))) = parser.parse(&buf) {
                            buf.drain(..used);
                            if req.is("SET") {
                                let k = seen.sets.fetch_add(1, Ordering::SeqCst) + 1;
                                match behaviour.set_error_every {
                                    Some(e) if k % e == 0 => out.extend_from_slice(b"-ERR no\r\n"),
                                    _ => out.extend_from_slice(b"+OK\r\n"),
                                }
                            } else if req.is("GET") {
                                seen.gets.fetch_add(1, Ordering::SeqCst);
                                out.extend_from_slice(b"$1\r\nv\r\n");
                            } else if req.is("WAIT") {
                                seen.waits.fetch_add(1, Ordering::SeqCst);
                                out.extend_from_slice(
                                    format!(":{}\r\n", behaviour.wait_reply).as_bytes(),
                                );
                            } else {
                                out.extend_from_slice(b"-ERR unknown command\r\n");
                            }
                        }
                        if !out.is_empty() {
                            std::thread::sleep(behaviour.reply_delay);
                            seen.writes.fetch_add(1, Ordering::SeqCst);
                            if conn.write_all(&out).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, seen)
    }

    const HAPPY: Behaviour = Behaviour {
        set_error_every: None,
        wait_reply: 2,
        reply_delay: Duration::ZERO,
    };

    fn opts(addr: &str, requests: u64) -> RespLoadOptions {
        RespLoadOptions {
            connections: 3,
            pipeline: 4,
            keys: 1000,
            stop: Stop::Requests(requests),
            warmup_s: 0.0,
            ..RespLoadOptions::new(addr)
        }
    }

    #[test]
    fn counts_every_reply_of_a_set_only_run() {
        let (addr, seen) = server(HAPPY);
        let r = run(&opts(&addr, 1001)).unwrap();
        assert_eq!(
            (r.ops, r.sets, r.gets, r.waits, r.errors),
            (1001, 1001, 0, 0, 0)
        );
        assert_eq!(seen.sets.load(Ordering::SeqCst), 1001);
        assert_eq!(seen.waits.load(Ordering::SeqCst), 0);
        assert!(r.ops_per_s > 0.0 && r.p50_us > 0.0 && r.p99_us >= r.p50_us);
        assert!(r.server_cpu_us_per_op.is_none());
    }

    #[test]
    fn connections_are_spread_over_every_address_given() {
        let servers: Vec<_> = (0..3).map(|_| server(HAPPY)).collect();
        let addr = servers
            .iter()
            .map(|(a, _)| a.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let o = RespLoadOptions {
            connections: 6,
            ..opts(&addr, 600)
        };
        let r = run(&o).unwrap();
        assert_eq!((r.ops, r.errors), (600, 0));
        // Six connections, 100 requests each, two per server.
        for (a, seen) in &servers {
            assert_eq!(seen.sets.load(Ordering::SeqCst), 200, "server {a}");
        }
        let bad = RespLoadOptions {
            addr: format!("{},nowhere", servers[0].0),
            ..opts(&addr, 10)
        };
        assert!(matches!(run(&bad), Err(RespLoadError::Option(m)) if m.contains("nowhere")));
    }

    #[test]
    fn wait_per_request_follows_every_set() {
        let (addr, seen) = server(HAPPY);
        let o = RespLoadOptions {
            mix: Mix::SetGet,
            wait: Some(Wait::parse("2 0", WaitPer::Request).unwrap()),
            ..opts(&addr, 600)
        };
        let r = run(&o).unwrap();
        assert_eq!(r.errors, 0);
        assert_eq!(r.ops, 600);
        assert_eq!(r.sets + r.gets, 600);
        assert!(r.sets > 200 && r.gets > 200, "about half each: {r:?}");
        assert_eq!(r.waits, r.sets);
        assert_eq!(seen.waits.load(Ordering::SeqCst), r.sets);
        assert_eq!(seen.gets.load(Ordering::SeqCst), r.gets);
        assert_eq!(r.wait, "WAIT 2 0 per request");
    }

    #[test]
    fn wait_per_batch_ends_every_batch() {
        let (addr, seen) = server(HAPPY);
        let o = RespLoadOptions {
            wait: Some(Wait::parse("2 0", WaitPer::Batch).unwrap()),
            ..opts(&addr, 100)
        };
        let r = run(&o).unwrap();
        // 100 requests over 3 connections: 34, 33, 33, in batches of at most 4:
        // 9 batches each.
        assert_eq!((r.ops, r.sets, r.errors), (100, 100, 0));
        assert_eq!(r.waits, 27);
        assert_eq!(seen.waits.load(Ordering::SeqCst), 27);
        assert_eq!(seen.sets.load(Ordering::SeqCst), 100);
    }

    #[test]
    fn error_replies_and_short_waits_are_counted() {
        let (addr, _) = server(Behaviour {
            set_error_every: Some(10),
            ..HAPPY
        });
        let r = run(&RespLoadOptions {
            connections: 1,
            ..opts(&addr, 100)
        })
        .unwrap();
        assert_eq!((r.ops, r.errors), (100, 10));
        assert_eq!(r.error_samples.len(), ERROR_SAMPLES_MAX);
        assert_eq!(r.error_samples[0], "SET: -ERR no");
        assert!(table(&[r]).contains("10 error replies"));

        let (addr, _) = server(Behaviour {
            wait_reply: 1,
            ..HAPPY
        });
        let r = run(&RespLoadOptions {
            wait: Some(Wait::parse("2 0", WaitPer::Request).unwrap()),
            ..opts(&addr, 20)
        })
        .unwrap();
        assert_eq!(r.errors, 20);
        assert_eq!(r.error_samples[0], "WAIT: 1 of 2 replicas acknowledged");
    }

    #[test]
    fn a_timed_run_with_warmup_measures_only_after_it() {
        let (addr, seen) = server(HAPPY);
        let o = RespLoadOptions {
            stop: Stop::Seconds(0.3),
            warmup_s: 0.2,
            dist: parse_dist("zipf").unwrap(),
            pids: vec![std::process::id()],
            ..opts(&addr, 1)
        };
        let r = run(&o).unwrap();
        assert!(r.ops > 0);
        assert!(
            seen.sets.load(Ordering::SeqCst) > r.ops,
            "warm-up not counted"
        );
        assert!(r.seconds >= 0.3 && r.seconds < 5.0, "{}", r.seconds);
        assert!(r.server_cpu_us_per_op.is_some());
        assert_eq!(r.dist, "zipf");
    }

    #[test]
    fn a_run_that_measures_nothing_is_an_error_not_zero_ops() {
        // Every answer takes 1.5 s: the batches sent in the 0.5 s of warm-up are
        // answered after the 0.2 s measured, and none is sent within them.
        let (addr, _) = server(Behaviour {
            reply_delay: Duration::from_millis(1500),
            ..HAPPY
        });
        let o = RespLoadOptions {
            stop: Stop::Seconds(0.2),
            warmup_s: 0.5,
            ..opts(&addr, 1)
        };
        let e = run(&o).unwrap_err();
        assert!(matches!(e, RespLoadError::NothingMeasured { .. }), "{e:?}");
        assert!(e.to_string().contains("no request was answered"), "{e}");
    }

    #[test]
    fn bad_options_are_refused_before_connecting() {
        let o = RespLoadOptions::new("127.0.0.1:1");
        for bad in [
            RespLoadOptions {
                pipeline: 0,
                ..o.clone()
            },
            RespLoadOptions {
                connections: 0,
                ..o.clone()
            },
            RespLoadOptions {
                value_bytes: 0,
                ..o.clone()
            },
            RespLoadOptions {
                keys: 0,
                ..o.clone()
            },
            RespLoadOptions {
                stop: Stop::Requests(0),
                ..o.clone()
            },
            RespLoadOptions {
                stop: Stop::Seconds(-1.0),
                ..o.clone()
            },
            RespLoadOptions {
                addr: "nowhere".into(),
                ..o.clone()
            },
        ] {
            assert!(
                matches!(run(&bad), Err(RespLoadError::Option(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(run(&o), Err(RespLoadError::Connect { .. })));
        assert!(Wait::parse("2", WaitPer::Request).is_err());
        assert!(Wait::parse("2 x", WaitPer::Request).is_err());
        assert!(parse_dist("latest").is_err());
        assert!(parse_dist("zipf:1.5").is_err());
        assert_eq!(
            parse_dist("zipf:0.9").unwrap(),
            KeyDist::Zipfian { theta: 0.9 }
        );
        assert!("both".parse::<Mix>().is_err());
        assert!("later".parse::<WaitPer>().is_err());
    }

    #[test]
    fn ratios_pair_each_redis_run_with_rowankv_on_the_same_load() {
        let (addr, _) = server(HAPPY);
        let base = run(&opts(&addr, 10)).unwrap();
        let rec = |label: &str, ops_per_s: f64| RespLoadResult {
            label: label.to_string(),
            ops_per_s,
            ..base.clone()
        };
        let results = vec![
            rec("rowankv", 1000.0),
            rec("redis-wait", 400.0),
            rec("redis-wait-aof-disk", 250.0),
            rec("redis-plain", 3000.0),
        ];
        let rs = ratios(&results);
        assert_eq!(rs.len(), 3);
        assert_eq!((rs[0].ratio, rs[0].goal_met), (2.5, Some(true)));
        assert_eq!((rs[1].ratio, rs[1].goal_met), (4.0, Some(false)));
        assert_eq!(rs[2].goal_min, Some(0.5));
        assert_eq!(rs[2].goal_met, Some(false));
        let md = ratios_markdown(&rs);
        assert!(md.contains("short by 1.00x"), "{md}");
        assert!(markdown(&results).lines().count() == 6);
    }
}
