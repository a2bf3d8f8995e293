//! `rowankv bench ycsb`: YCSB on an in-process cluster, one run per replication
//! strategy, side by side (seed 000 §6.3).
//!
//! Each strategy gets a fresh cluster with the same configuration. Load
//! generators are tasks on the cluster's own executor (so clients and servers
//! share the machine's cores the same way for every strategy); each keeps up to
//! `depth` operations in flight through a pipelined client. A run is: load
//! `records` objects (with a progress bar), reset the counters, run the workload
//! for `seconds`, then report throughput, PUT and GET latency (median, p99, p99.9
//! from fixed-bound histograms: 1 µs to 60 s, 3 significant digits), DLWA per
//! server from the media model over the measured phase, and CPU time per
//! operation (the process's user + system time over the phase, divided by the
//! operations completed — servers and clients together).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_client::{Client, ClientConfig, ClientError, Op as ClientOp, Output};
use rowankv_fabric::LoopbackNic;
use rowankv_pmem::{MediaModelConfig, MediaTiming};
use rowankv_server::{Cluster, ClusterConfig, Placement, ServerSettings, Step, Strategy, Task};
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
}

/// Media bandwidth per DIMM of the scaled setting (see `docs/results/ycsb.md`):
/// scaled down from Optane's ~2 GB/s by the ratio of the loopback cluster's
/// operation rate to the paper's, so that PM bandwidth binds here as it does in
/// the paper's one-DIMM experiment (Figure 13(d)).
pub const SCALED_MEDIA_BANDWIDTH: u64 = 4_000_000;

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
    pub cpu_us_per_op: f64,
    pub errors: u64,
    pub timeouts: u64,
    pub load_seconds: f64,
    pub media_timing: bool,
}

const PHASE_LOAD: u8 = 0;
const PHASE_WAIT: u8 = 1;
const PHASE_RUN: u8 = 2;
const PHASE_STOP: u8 = 3;

#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    puts: AtomicU64,
    gets: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    loaded: AtomicU64,
    load_clients_done: AtomicU64,
}

struct Histograms {
    put: Histogram<u64>,
    get: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// What an operation in flight is.
#[derive(Clone, Copy)]
enum Kind {
    Get,
    Put,
    /// F: the GET half of a read-modify-write; the PUT follows.
    RmwGet {
        record: u64,
        value_len: usize,
    },
}

/// A load generator: one pipelined client.
struct LoadClient {
    name: String,
    client: Client<LoopbackNic>,
    gen: Generator,
    sizes: SizeDist,
    depth: usize,
    max_value: usize,
    phase: Arc<AtomicU8>,
    counters: Arc<Counters>,
    hist: Arc<Mutex<Histograms>>,
    local: Histograms,
    inflight: std::collections::HashMap<u64, Kind>,
    done: Vec<rowankv_client::Completed>,
    key: Vec<u8>,
    value: Vec<u8>,
    rng: ChaCha8Rng,
    loading_done: bool,
    load_reported: bool,
}

impl LoadClient {
    fn submit(&mut self, op: Op) -> bool {
        let key_bytes = self.sizes.key_bytes();
        let (cop, kind) = match op {
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
                        key: self.key.clone(),
                        value: self.value.clone(),
                    },
                    Kind::Put,
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
        };
        match self.client.submit(cop) {
            Ok(id) => {
                self.inflight.insert(id.0, kind);
                true
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                false
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

impl Task for LoadClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, _now_ns: u64) -> Step {
        let phase = self.phase.load(Ordering::Acquire);
        if phase == PHASE_STOP {
            let mut h = self.hist.lock();
            let _ = h.put.add(&self.local.put);
            let _ = h.get.add(&self.local.get);
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
            match (&c.result, kind) {
                (Ok(_), Kind::Put)
                | (Err(ClientError::NotFound), Kind::Get)
                | (Ok(_), Kind::Get) => {
                    if measuring {
                        self.counters.ops.fetch_add(1, Ordering::Relaxed);
                        if matches!(kind, Kind::Put) {
                            self.counters.puts.fetch_add(1, Ordering::Relaxed);
                            let _ = self.local.put.record(us);
                        } else {
                            self.counters.gets.fetch_add(1, Ordering::Relaxed);
                            let _ = self.local.get.record(us);
                        }
                    } else if phase == PHASE_LOAD && matches!(kind, Kind::Put) {
                        self.counters.loaded.fetch_add(1, Ordering::Relaxed);
                    }
                }
                (
                    Ok(Output::Value { .. }) | Err(ClientError::NotFound),
                    Kind::RmwGet { record, value_len },
                ) => {
                    if measuring {
                        self.counters.gets.fetch_add(1, Ordering::Relaxed);
                        self.counters.ops.fetch_add(1, Ordering::Relaxed);
                        let _ = self.local.get.record(us);
                    }
                    self.submit(Op::Put { record, value_len });
                }
                (Err(ClientError::Timeout(_)), _) => {
                    self.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.done = done;
        match phase {
            PHASE_LOAD => {
                while !self.loading_done && self.client.inflight() < self.depth {
                    match self.gen.load_op() {
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
                    self.counters
                        .load_clients_done
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            PHASE_RUN => {
                while self.client.inflight() < self.depth {
                    let op = self.gen.next_op();
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

fn cpu_seconds() -> f64 {
    // The process's utime + stime from /proc (Linux), in clock ticks: no unsafe
    // call needed.
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields after the command: state is [0]; utime is field 14 overall → [11].
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / clock_ticks_per_second()
}

fn clock_ticks_per_second() -> f64 {
    // USER_HZ is 100 on every Linux configuration this runs on.
    100.0
}

/// Run every strategy of `opts` and return one result each.
pub fn run(opts: &YcsbOptions) -> Result<Vec<YcsbResult>, String> {
    let mut results = Vec::new();
    for &strategy in &opts.strategies {
        results.push(run_one(opts, strategy)?);
    }
    Ok(results)
}

fn run_one(opts: &YcsbOptions, strategy: Strategy) -> Result<YcsbResult, String> {
    let media = MediaModelConfig {
        timing: opts.media_bandwidth.map(|b| MediaTiming {
            media_write_bytes_per_sec_per_dimm: b,
        }),
        ..MediaModelConfig::default()
    };
    let total_shards = opts.shards_per_server as usize * opts.servers;
    let mut cluster = Cluster::start(ClusterConfig {
        servers: opts.servers,
        shards_per_server: opts.shards_per_server,
        replication_factor: opts.replication_factor,
        strategy,
        settings: ServerSettings {
            workers: opts.workers,
            ..ServerSettings::default()
        },
        pool_bytes: opts.pool_bytes,
        segment_bytes: opts.segment_bytes,
        media_model: Some(media),
        placement: Placement::Shared {
            threads: opts.threads,
        },
        keys_per_shard_expected: (opts.records as usize * 2 / total_shards).max(1024),
        ..ClusterConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let phase = Arc::new(AtomicU8::new(PHASE_WAIT));
    let counters = Arc::new(Counters::default());
    let hist = Arc::new(Mutex::new(Histograms {
        put: histogram(),
        get: histogram(),
    }));
    let max_value = KV_BYTES_MAX - opts.sizes.key_bytes();
    for c in 0..opts.clients {
        let nic = cluster.attach_client().map_err(|e| e.to_string())?;
        let client = Client::connect(
            nic,
            cluster.directory().clone(),
            cluster.config_source(),
            ClientConfig {
                worker_hint: c,
                inflight_max: opts.depth,
                timeout: Duration::from_secs(10),
                ..ClientConfig::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let gen = Generator::new(
            opts.workload,
            opts.keys,
            opts.sizes,
            opts.records,
            max_value,
            opts.seed,
        )
        .with_client(c as u64, opts.clients as u64);
        cluster.spawn(Box::new(LoadClient {
            name: format!("client-{c}"),
            client,
            gen,
            sizes: opts.sizes,
            depth: opts.depth,
            max_value,
            phase: phase.clone(),
            counters: counters.clone(),
            hist: hist.clone(),
            local: Histograms {
                put: histogram(),
                get: histogram(),
            },
            inflight: Default::default(),
            done: Vec::new(),
            key: Vec::new(),
            value: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(opts.seed ^ (c as u64).wrapping_mul(0x9e37_79b9)),
            loading_done: false,
            load_reported: false,
        }));
    }

    // Load.
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
    phase.store(PHASE_LOAD, Ordering::Release);
    while counters.load_clients_done.load(Ordering::Relaxed) < opts.clients as u64 {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(b) = &bar {
            b.set_position(counters.loaded.load(Ordering::Relaxed));
        }
        if load_start.elapsed() > Duration::from_secs(600) {
            return Err(format!("{strategy}: load did not finish in 600 s"));
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let load_seconds = load_start.elapsed().as_secs_f64();

    // Measure.
    cluster.flush_media();
    let media_before = cluster.media_stats();
    let errors_before = counters.errors.load(Ordering::Relaxed);
    let cpu_before = cpu_seconds();
    let start = Instant::now();
    phase.store(PHASE_RUN, Ordering::Release);
    std::thread::sleep(Duration::from_secs_f64(opts.seconds));
    let ops = counters.ops.load(Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;
    phase.store(PHASE_STOP, Ordering::Release);
    cluster.flush_media();
    let media_after = cluster.media_stats();
    // Let the clients hand in their histograms.
    std::thread::sleep(Duration::from_millis(100));
    cluster.shutdown();

    let dlwa_per_server: Vec<f64> = media_after
        .iter()
        .zip(&media_before)
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => a.delta(b).dlwa(),
            _ => 0.0,
        })
        .collect();
    let dlwa_max = dlwa_per_server.iter().copied().fold(0.0, f64::max);
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
        cpu_us_per_op: if ops > 0 { cpu * 1e6 / ops as f64 } else { 0.0 },
        errors: counters.errors.load(Ordering::Relaxed) - errors_before,
        timeouts: counters.timeouts.load(Ordering::Relaxed),
        load_seconds,
        media_timing: opts.media_bandwidth.is_some(),
    })
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
                format!("{:.3}", r.dlwa_max),
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
            "CPU µs/op",
            "errors",
        ],
        &rows,
    )
}
