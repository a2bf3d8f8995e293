//! The engine benchmark (issue: the engine of one server): PUT and GET rates of one
//! server's engine against an unpersisted concurrent DRAM map (`DashMap`) measured in
//! the same run, the DLWA of a PUT-only run from the media model, and cold-start time.
//!
//! Workload: 16 B keys (`%016u`), values of ZippyDB-like size — a log-normal with mean
//! 90.8 B (ZippyDB's average object size, seed 000 §6.1) and σ = 0.8, clipped to
//! [1, 1024] B; keys spread over 48 shards by hash. Each worker thread writes its own
//! key range (its own t-log); GETs pick uniformly among the loaded keys.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};
use rowankv_engine::{Engine, EngineConfig};
use rowankv_pmem::{MediaModelConfig, Medium, Pool, PoolOptions};
use rowankv_types::ShardId;
use serde::Serialize;

/// Mean of ZippyDB's object sizes (seed 000 §6.1).
pub const ZIPPYDB_MEAN_BYTES: f64 = 90.8;
const SIGMA: f64 = 0.8;
const VALUE_BYTES_MAX: usize = 1024;
const SHARDS: u16 = 48;

#[derive(Clone, Debug)]
pub struct EngineBenchOptions {
    pub objects: usize,
    pub thread_counts: Vec<usize>,
    pub get_ops: usize,
    /// Objects for the cold-start measurement.
    pub cold_start_objects: usize,
    pub pool_dir: PathBuf,
    pub seed: u64,
}

impl EngineBenchOptions {
    pub fn full() -> Self {
        EngineBenchOptions {
            objects: 1_000_000,
            thread_counts: vec![1, 2],
            get_ops: 2_000_000,
            cold_start_objects: 1_000_000,
            pool_dir: crate::dlwa::default_pool_dir(),
            seed: 7,
        }
    }

    pub fn quick() -> Self {
        EngineBenchOptions {
            objects: 100_000,
            get_ops: 200_000,
            cold_start_objects: 100_000,
            ..Self::full()
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct EngineMeasurement {
    /// `put`, `get`, `put_dlwa` or `cold_start`.
    pub op: String,
    pub threads: usize,
    pub ops_per_sec: f64,
    /// The DRAM map's rate for the same operations in the same run (0 where none).
    pub baseline_ops_per_sec: f64,
    /// `ops_per_sec / baseline_ops_per_sec`.
    pub ratio: f64,
    /// DLWA from the media model (1.0 where the model was off).
    pub dlwa: f64,
    pub objects: usize,
    /// Cold start: seconds to recover.
    pub seconds: f64,
}

fn key(i: usize) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(format!("{i:016}").as_bytes());
    k
}

fn shard_of(k: &[u8]) -> ShardId {
    ShardId((xxhash_rust::xxh3::xxh3_64(k) % SHARDS as u64) as u16)
}

/// Value sizes: log-normal with the ZippyDB mean.
fn values(n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mu = ZIPPYDB_MEAN_BYTES.ln() - SIGMA * SIGMA / 2.0;
    let dist = LogNormal::new(mu, SIGMA).expect("valid parameters");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = (dist.sample(&mut rng) as usize).clamp(1, VALUE_BYTES_MAX);
            vec![(i % 251) as u8; len]
        })
        .collect()
}

fn pool(
    opts: &EngineBenchOptions,
    objects: usize,
    media: bool,
) -> Result<(tempfile::TempDir, Arc<Pool>), String> {
    let dir = tempfile::tempdir_in(&opts.pool_dir).map_err(|e| e.to_string())?;
    // Entries average ~150 B padded to 64 B; leave room for the t-logs' open segments.
    let size_bytes = (objects * 256 + (64 << 20)).next_multiple_of(4 << 20);
    let pool = Pool::create(
        &dir.path().join("engine.pool"),
        PoolOptions {
            medium: Medium::Emulated,
            size_bytes,
            dax_fallback: false,
            media_model: media.then(MediaModelConfig::default),
            crash_sim: false,
        },
    )
    .map_err(|e| e.to_string())?;
    // PM is mapped up front; a tmpfs file allocates a page at its first touch, a
    // cost real PM never pays, so touch every page before measuring. (Plain CPU
    // stores: the media model counts nothing for them.)
    for page in (0..size_bytes).step_by(4096) {
        pool.write(page, &[0]);
    }
    Ok((dir, pool))
}

fn engine_config(workers: usize, objects: usize) -> EngineConfig {
    EngineConfig {
        shard_count: SHARDS,
        workers,
        keys_per_shard_expected: objects / SHARDS as usize + 1,
        ..EngineConfig::default()
    }
}

thread_local! {
    /// Each benchmark thread's value buffer, reused across GETs.
    static VALUE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `threads` threads over `0..n`, thread t taking indexes `t, t + threads, ...`;
/// returns operations per second.
fn timed(threads: usize, n: usize, f: impl Fn(usize, usize) + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || {
                let mut i = t;
                while i < n {
                    f(t, i);
                    i += threads;
                }
            });
        }
    });
    n as f64 / start.elapsed().as_secs_f64()
}

/// Run the benchmark.
pub fn run(opts: &EngineBenchOptions) -> Result<Vec<EngineMeasurement>, String> {
    let n = opts.objects;
    let vals = values(n, opts.seed);
    let keys: Vec<[u8; 16]> = (0..n).map(key).collect();
    let mut gets = ChaCha8Rng::seed_from_u64(opts.seed ^ 1);
    let get_keys: Vec<usize> = (0..opts.get_ops).map(|_| gets.gen_range(0..n)).collect();
    let mut out = Vec::new();
    for &threads in &opts.thread_counts {
        let (_dir, pool) = pool(opts, n, false)?;
        let engine = Engine::create(pool, engine_config(threads, n)).map_err(|e| e.to_string())?;
        let map: DashMap<[u8; 16], Vec<u8>> = DashMap::with_capacity(n);
        let base_put = timed(threads, n, |_, i| {
            map.insert(keys[i], vals[i].clone());
        });
        let put = timed(threads, n, |t, i| {
            engine
                .put(t, shard_of(&keys[i]), &keys[i], &vals[i])
                .expect("put");
        });
        // Both copy the value into a buffer the caller reuses, as a server does.
        let base_get = timed(threads, get_keys.len(), |_, i| {
            VALUE.with(|out| {
                let mut out = out.borrow_mut();
                out.clear();
                out.extend_from_slice(&map.get(&keys[get_keys[i]]).expect("loaded"));
                std::hint::black_box(&*out);
            })
        });
        let get = timed(threads, get_keys.len(), |_, i| {
            let k = &keys[get_keys[i]];
            VALUE.with(|out| {
                let mut out = out.borrow_mut();
                engine
                    .get_into(shard_of(k), k, &mut out)
                    .expect("get")
                    .expect("loaded");
                std::hint::black_box(&*out);
            })
        });
        for (op, rate, base) in [("put", put, base_put), ("get", get, base_get)] {
            out.push(EngineMeasurement {
                op: op.into(),
                threads,
                ops_per_sec: rate,
                baseline_ops_per_sec: base,
                ratio: rate / base,
                dlwa: 1.0,
                objects: n,
                seconds: 0.0,
            });
        }
    }
    // DLWA of a PUT-only run (1 worker), media model on.
    {
        let (_dir, pool) = pool(opts, n, true)?;
        let engine =
            Engine::create(pool.clone(), engine_config(1, n)).map_err(|e| e.to_string())?;
        let media = pool.media().expect("media model on");
        media.flush_buffers();
        let before = media.stats();
        let rate = timed(1, n, |t, i| {
            engine
                .put(t, shard_of(&keys[i]), &keys[i], &vals[i])
                .expect("put");
        });
        media.flush_buffers();
        let stats = media.stats().delta(&before);
        out.push(EngineMeasurement {
            op: "put_dlwa".into(),
            threads: 1,
            ops_per_sec: rate,
            baseline_ops_per_sec: 0.0,
            ratio: 0.0,
            dlwa: stats.dlwa(),
            objects: n,
            seconds: 0.0,
        });
    }
    // Cold start.
    {
        let m = opts.cold_start_objects;
        let cvals = values(m, opts.seed ^ 2);
        let (_dir, pool) = pool(opts, m, false)?;
        let engine =
            Engine::create(pool.clone(), engine_config(2, m)).map_err(|e| e.to_string())?;
        timed(2, m, |t, i| {
            let k = key(i);
            engine.put(t, shard_of(&k), &k, &cvals[i]).expect("put");
        });
        drop(engine);
        let start = Instant::now();
        let (engine, report) =
            Engine::open(pool, engine_config(2, m)).map_err(|e| e.to_string())?;
        let seconds = start.elapsed().as_secs_f64();
        if report.entries_indexed < m as u64 {
            return Err(format!(
                "cold start indexed {} of {m} objects",
                report.entries_indexed
            ));
        }
        // Every object is back with its value (checked after the timing).
        for (i, value) in cvals.iter().enumerate() {
            let k = key(i);
            let got = engine.get(shard_of(&k), &k).map_err(|e| e.to_string())?;
            if got.as_ref().map(|(v, _)| v.as_slice()) != Some(value.as_slice()) {
                return Err(format!("cold start lost object {i}"));
            }
        }
        out.push(EngineMeasurement {
            op: "cold_start".into(),
            threads: 1,
            ops_per_sec: m as f64 / seconds,
            baseline_ops_per_sec: 0.0,
            ratio: 0.0,
            dlwa: 1.0,
            objects: m,
            seconds,
        });
    }
    Ok(out)
}

/// Render measurements as a table.
pub fn table(ms: &[EngineMeasurement]) -> String {
    let rows: Vec<Vec<String>> = ms
        .iter()
        .map(|m| {
            vec![
                m.op.clone(),
                m.threads.to_string(),
                format!("{:.3}", m.ops_per_sec / 1e6),
                if m.baseline_ops_per_sec > 0.0 {
                    format!("{:.3}", m.baseline_ops_per_sec / 1e6)
                } else {
                    "-".into()
                },
                if m.ratio > 0.0 {
                    format!("{:.2}", m.ratio)
                } else {
                    "-".into()
                },
                format!("{:.3}", m.dlwa),
                if m.seconds > 0.0 {
                    format!("{:.3}", m.seconds)
                } else {
                    "-".into()
                },
            ]
        })
        .collect();
    crate::table::render(
        &[
            "op",
            "threads",
            "Mops/s",
            "dram_map_Mops/s",
            "ratio",
            "DLWA",
            "seconds",
        ],
        &rows,
    )
}
