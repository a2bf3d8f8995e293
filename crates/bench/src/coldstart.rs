//! `rowankv bench coldstart`: a whole-cluster cold start (seed 000 §4.7, §6.5).
//!
//! A 3-server cluster (RF 3, Rowan) on pools that track persistence is loaded
//! with `records` objects (ZippyDB sizes) by pipelined clients, which note the
//! version of every acknowledged PUT. Then every server loses power at once:
//! each pool keeps only what was persisted (the crash simulator drops every
//! unpersisted line). Recovery is timed in its two parts:
//! 1. each server rebuilds its indexes from its segments (`Engine::open`);
//! 2. the cluster restarts from those engines and the stored configuration: the
//!    CM takes over once the old CM's lease has expired, servers renew their
//!    leases, and every primary makes its shards' replicas agree again
//!    (gathering entries of segments that were being filled, installing the
//!    union everywhere) before it serves them.
//!
//! Finally every acknowledged write is read back: it must be there at its
//! version or a later one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rowankv_client::{Client, ClientConfig, Op as ClientOp, Output};
use rowankv_deploy::{Cluster, ClusterConfig, Recovered};
use rowankv_engine::Engine;
use rowankv_pmem::{Medium, Pool, PoolOptions, PowerFailure};
use rowankv_server::{EventKind, Placement, ServerSettings, Strategy};
use serde::Serialize;

use crate::ycsb::runner::read_back;
use crate::ycsb::workload::{record_key, Generator, KeyDist, Op, SizeDist, Workload};

/// Options of a cold-start run.
#[derive(Clone, Debug)]
pub struct ColdStartOptions {
    pub records: u64,
    pub servers: usize,
    pub workers: usize,
    pub shards_per_server: u16,
    /// Loading clients (threads), each `depth` deep.
    pub clients: usize,
    pub depth: usize,
    pub pool_bytes: usize,
    pub segment_bytes: usize,
    pub seed: u64,
    pub progress: bool,
}

impl Default for ColdStartOptions {
    fn default() -> Self {
        ColdStartOptions {
            records: 1_000_000,
            servers: 3,
            workers: 8,
            shards_per_server: 16,
            clients: 2,
            depth: 32,
            pool_bytes: 768 << 20,
            segment_bytes: 1 << 20,
            seed: 7,
            progress: true,
        }
    }
}

/// What a cold start took.
#[derive(Clone, Debug, Serialize)]
pub struct ColdStartResult {
    pub records: u64,
    pub servers: usize,
    pub load_seconds: f64,
    pub acknowledged: u64,
    /// Index rebuild of every server (sequential, one after the other).
    pub rebuild_ms: Vec<f64>,
    pub entries_indexed: Vec<u64>,
    /// From restarting the cluster until every shard was served.
    pub serve_ms: f64,
    /// Of which: waiting for the old CM's lease in the store to expire.
    pub cm_takeover_ms: f64,
    pub shards: usize,
    pub total_ms: f64,
    pub verified_keys: u64,
    pub lost_writes: u64,
}

fn cluster_config(opts: &ColdStartOptions) -> ClusterConfig {
    let shards = opts.shards_per_server as usize * opts.servers;
    ClusterConfig {
        servers: opts.servers,
        shards_per_server: opts.shards_per_server,
        replication_factor: opts.servers.min(3) as u8,
        strategy: Strategy::Rowan,
        settings: ServerSettings {
            workers: opts.workers,
            ..ServerSettings::default()
        },
        pool_bytes: opts.pool_bytes,
        segment_bytes: opts.segment_bytes,
        media_model: None,
        crash_sim: true,
        placement: Placement::Shared { threads: 2 },
        keys_per_shard_expected: (opts.records as usize * 2 / shards).max(1024),
        ..ClusterConfig::default()
    }
}

/// Load `records` objects; returns each acknowledged record's version.
fn load(cluster: &mut Cluster, opts: &ColdStartOptions) -> Result<HashMap<u64, u64>, String> {
    let sizes = SizeDist::ZippyDb;
    let max_value = rowankv_server::KV_BYTES_MAX - sizes.key_bytes();
    let bar = opts.progress.then(|| {
        let b = indicatif::ProgressBar::new(opts.records);
        b.set_style(
            indicatif::ProgressStyle::with_template("  load [{bar:30}] {pos}/{len} {per_sec}")
                .expect("template")
                .progress_chars("=> "),
        );
        b
    });
    let mut handles = Vec::new();
    for c in 0..opts.clients {
        let nic = cluster.attach_client().map_err(|e| e.to_string())?;
        let directory = cluster.directory().clone();
        let source = cluster.config_source();
        let (depth, records, seed, clients) = (opts.depth, opts.records, opts.seed, opts.clients);
        let bar = bar.clone();
        handles.push(std::thread::spawn(
            move || -> Result<HashMap<u64, u64>, String> {
                let mut client = Client::connect(
                    nic,
                    directory,
                    source,
                    ClientConfig {
                        inflight_max: depth,
                        worker_hint: c,
                        timeout: Duration::from_secs(30),
                        ..ClientConfig::default()
                    },
                )
                .map_err(|e| e.to_string())?;
                let mut gen = Generator::new(
                    Workload::Load,
                    KeyDist::Uniform,
                    sizes,
                    records,
                    max_value,
                    seed,
                )
                .with_client(c as u64, clients as u64);
                let mut acked = HashMap::new();
                let mut inflight: HashMap<u64, u64> = HashMap::new();
                let mut done = Vec::new();
                let mut key = Vec::new();
                let mut exhausted = false;
                let mut value = Vec::new();
                while !exhausted || !inflight.is_empty() {
                    while !exhausted && client.inflight() < depth {
                        match gen.load_op() {
                            Some(
                                Op::Insert { record, value_len } | Op::Put { record, value_len },
                            ) => {
                                record_key(record, sizes.key_bytes(), &mut key);
                                value.clear();
                                value.extend(
                                    (0..value_len.min(max_value))
                                        .map(|i| (record as u8) ^ (i as u8)),
                                );
                                let id = client
                                    .submit(ClientOp::Put {
                                        expires_at_ms: None,
                                        key: key.clone(),
                                        value: value.clone(),
                                    })
                                    .map_err(|e| e.to_string())?;
                                inflight.insert(id.0, record);
                            }
                            Some(_) => {}
                            None => exhausted = true,
                        }
                    }
                    done.clear();
                    if client.poll(&mut done) == 0 {
                        std::thread::yield_now();
                    }
                    for d in &done {
                        let Some(record) = inflight.remove(&d.id.0) else {
                            continue;
                        };
                        match &d.result {
                            Ok(Output::Written { version }) => {
                                acked.insert(record, *version);
                            }
                            other => return Err(format!("loading record {record}: {other:?}")),
                        }
                    }
                    if let Some(b) = &bar {
                        b.inc(done.len() as u64);
                    }
                }
                Ok(acked)
            },
        ));
    }
    let mut acked = HashMap::new();
    for h in handles {
        acked.extend(
            h.join()
                .map_err(|_| "a loading client panicked".to_string())??,
        );
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(acked)
}

/// Load, power-fail every server, cold-start, check.
pub fn run(opts: &ColdStartOptions) -> Result<ColdStartResult, String> {
    let config = cluster_config(opts);
    let mut cluster = Cluster::start(config.clone()).map_err(|e| e.to_string())?;
    let load_start = Instant::now();
    let acked = load(&mut cluster, opts)?;
    let load_seconds = load_start.elapsed().as_secs_f64();

    // Power failure of every server at once: what each pool kept.
    let images: Vec<(rowankv_types::NodeId, Vec<u8>, rowankv_engine::EngineConfig)> = cluster
        .servers()
        .iter()
        .map(|s| {
            let image = s
                .engine
                .pool()
                .crash()
                .expect("pools track persistence")
                .image(PowerFailure::DropAll);
            (s.node, image, s.engine.config().clone())
        })
        .collect();
    let store = cluster.store().clone();
    cluster.shutdown();

    let start = Instant::now();
    let mut recovered = Vec::new();
    let mut rebuild_ms = Vec::new();
    let mut entries_indexed = Vec::new();
    for (node, image, engine_config) in images {
        let t = Instant::now();
        let mut popts = PoolOptions::new(Medium::Emulated, image.len());
        popts.crash_sim = true;
        let pool = Pool::from_image(&image, popts).map_err(|e| e.to_string())?;
        drop(image);
        let (engine, report) = Engine::open_replica(pool, engine_config)
            .map_err(|e| format!("recovering {node}: {e}"))?;
        rebuild_ms.push(t.elapsed().as_secs_f64() * 1e3);
        entries_indexed.push(report.entries_indexed);
        recovered.push(Recovered {
            node,
            engine: Arc::new(engine),
            closed_segments: report.closed_segments,
        });
    }
    let serve_start = Instant::now();
    let mut cluster = Cluster::recover(config, store, recovered).map_err(|e| e.to_string())?;
    let shards = cluster.config().shards_per_server as usize * cluster.config().servers;
    let mut cm_takeover_ms = 0.0;
    loop {
        let events = cluster.events().snapshot();
        if cm_takeover_ms == 0.0 {
            if let Some(e) = events
                .iter()
                .find(|e| matches!(e.kind, EventKind::CmActive { .. }))
            {
                let _ = e;
                cm_takeover_ms = serve_start.elapsed().as_secs_f64() * 1e3;
            }
        }
        let served = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ShardServed { .. }))
            .count();
        if served >= shards {
            break;
        }
        if serve_start.elapsed() > Duration::from_secs(300) {
            return Err(format!(
                "only {served} of {shards} shards served after 300 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let serve_ms = serve_start.elapsed().as_secs_f64() * 1e3;
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    let (verified_keys, lost_writes) =
        read_back(&mut cluster, SizeDist::ZippyDb.key_bytes(), &acked)?;
    cluster.shutdown();
    Ok(ColdStartResult {
        records: opts.records,
        servers: opts.servers,
        load_seconds,
        acknowledged: acked.len() as u64,
        rebuild_ms,
        entries_indexed,
        serve_ms,
        cm_takeover_ms,
        shards,
        total_ms,
        verified_keys,
        lost_writes,
    })
}

/// A human-readable report.
pub fn report(r: &ColdStartResult) -> String {
    let rebuild: Vec<String> = r
        .rebuild_ms
        .iter()
        .zip(&r.entries_indexed)
        .map(|(ms, n)| format!("{ms:.0} ms ({n} entries)"))
        .collect();
    format!(
        "cold start of {} objects on {} servers (loaded in {:.1} s, {} acknowledged)\n\
         \x20 index rebuild per server: {}\n\
         \x20 restart until all {} shards served: {:.0} ms (a CM was active after {:.0} ms)\n\
         \x20 total from power-on: {:.0} ms\n\
         \x20 acknowledged writes read back: {} keys, {} missing or older\n",
        r.records,
        r.servers,
        r.load_seconds,
        r.acknowledged,
        rebuild.join(", "),
        r.shards,
        r.serve_ms,
        r.cm_takeover_ms,
        r.total_ms,
        r.verified_keys,
        r.lost_writes
    )
}
