//! The engine against a `BTreeMap` model: random put/get/delete over many shards
//! from several threads, across restarts, and with cleaning in a small pool.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_engine::{Engine, EngineConfig};
use rowankv_pmem::{Pool, PoolOptions};
use rowankv_types::ShardId;

type Model = BTreeMap<(u16, Vec<u8>), Vec<u8>>;

fn config(workers: usize) -> EngineConfig {
    EngineConfig {
        segment_size_bytes: 64 << 10,
        shard_count: 8,
        workers,
        keys_per_shard_expected: 256,
        clean_grace: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// One thread's share of the work: keys that only it writes, so its model is exact.
fn run_ops(
    engine: &Engine,
    worker: usize,
    model: &mut Model,
    rng: &mut ChaCha8Rng,
    ops: usize,
    keys: u32,
) {
    for _ in 0..ops {
        let shard = rng.gen_range(0..8u16);
        let key = format!("w{worker}-k{}", rng.gen_range(0..keys)).into_bytes();
        match rng.gen_range(0..10) {
            0..=4 => {
                let len = rng.gen_range(0..300);
                let value: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                engine.put(worker, ShardId(shard), &key, &value).unwrap();
                model.insert((shard, key), value);
            }
            5..=6 => {
                engine.delete(worker, ShardId(shard), &key).unwrap();
                model.remove(&(shard, key));
            }
            _ => {
                let got = engine.get(ShardId(shard), &key).unwrap().map(|(v, _)| v);
                assert_eq!(
                    got.as_ref(),
                    model.get(&(shard, key.clone())),
                    "get {key:?}"
                );
            }
        }
    }
}

fn check_all(engine: &Engine, model: &Model, keys_written: &[(u16, Vec<u8>)]) {
    for (shard, key) in keys_written {
        let got = engine.get(ShardId(*shard), key).unwrap().map(|(v, _)| v);
        assert_eq!(
            got.as_ref(),
            model.get(&(*shard, key.clone())),
            "key {key:?} shard {shard}"
        );
    }
}

fn all_keys(workers: usize, keys: u32) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    for w in 0..workers {
        for k in 0..keys {
            for s in 0..8 {
                out.push((s, format!("w{w}-k{k}").into_bytes()));
            }
        }
    }
    out
}

#[test]
fn threads_and_restarts_agree_with_the_model() {
    let seed = 0x5EED_0001;
    let workers = 2;
    let pool = Pool::anonymous(16 << 20, PoolOptions::default()).unwrap();
    let mut models: Vec<Model> = vec![Model::new(); workers];
    let mut rngs: Vec<ChaCha8Rng> = (0..workers)
        .map(|w| ChaCha8Rng::seed_from_u64(seed + w as u64))
        .collect();
    let mut engine = Engine::create(pool.clone(), config(workers)).unwrap();
    for round in 0..4 {
        std::thread::scope(|s| {
            for (w, (model, rng)) in models.iter_mut().zip(rngs.iter_mut()).enumerate() {
                let engine = &engine;
                s.spawn(move || run_ops(engine, w, model, rng, 3_000, 200));
            }
        });
        let model: Model = models.iter().flat_map(|m| m.clone()).collect();
        check_all(&engine, &model, &all_keys(workers, 200));
        drop(engine);
        let (reopened, report) = Engine::open(pool.clone(), config(workers)).unwrap();
        assert!(
            report.corrupt_segments.is_empty(),
            "round {round}: {report:?}"
        );
        check_all(&reopened, &model, &all_keys(workers, 200));
        engine = reopened;
    }
}

#[test]
fn cleaning_keeps_a_write_heavy_run_inside_a_small_pool() {
    let seed = 0x5EED_0002;
    // 2 MiB: about 30 segments of 64 KiB; the run writes far more than that.
    let pool = Pool::anonymous(2 << 20, PoolOptions::default()).unwrap();
    let engine = Engine::create(pool.clone(), config(1)).unwrap();
    let mut model = Model::new();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut written_bytes = 0usize;
    let mut cleaned = 0;
    for i in 0..80_000 {
        let shard = rng.gen_range(0..8u16);
        let key = format!("k{}", rng.gen_range(0..300)).into_bytes();
        let value = vec![(i % 251) as u8; rng.gen_range(16..200)];
        written_bytes += value.len() + key.len() + 24;
        engine.put(0, ShardId(shard), &key, &value).unwrap();
        model.insert((shard, key), value);
        if engine.free_segments() < 8 {
            cleaned += engine.clean().unwrap().segments_cleaned;
        }
    }
    assert!(
        written_bytes > 4 * pool.len_bytes(),
        "the run must outgrow the pool"
    );
    assert!(cleaned > 0, "cleaning ran");
    let keys: Vec<(u16, Vec<u8>)> = (0..300)
        .flat_map(|k| (0..8).map(move |s| (s, format!("k{k}").into_bytes())))
        .collect();
    check_all(&engine, &model, &keys);
    drop(engine);
    let (reopened, _) = Engine::open(pool, config(1)).unwrap();
    check_all(&reopened, &model, &keys);
}

#[test]
fn cleaning_is_correct_under_concurrent_puts_and_gets() {
    let seed = 0x5EED_0003;
    let workers = 2;
    let pool = Pool::anonymous(3 << 20, PoolOptions::default()).unwrap();
    let two_cleaners = EngineConfig {
        cleaners: 2,
        ..config(workers)
    };
    let engine = Engine::create(pool.clone(), two_cleaners.clone()).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let mut models: Vec<Model> = vec![Model::new(); workers];
    let cleaned = std::thread::scope(|s| {
        // Two clean threads, each owning half of the segments.
        let cleaners: Vec<_> = (0..2)
            .map(|c| {
                let (engine, done) = (&engine, &done);
                s.spawn(move || {
                    let mut cleaned = 0;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        cleaned += engine.clean_as(c).unwrap().segments_cleaned;
                        std::thread::yield_now();
                    }
                    cleaned
                })
            })
            .collect();
        let handles: Vec<_> = models
            .iter_mut()
            .enumerate()
            .map(|(w, model)| {
                let engine = &engine;
                s.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed + w as u64);
                    // Few keys, many overwrites: most entries die young and the
                    // cleaner moves the survivors while this thread reads them.
                    run_ops(engine, w, model, &mut rng, 30_000, 60);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        cleaners
            .into_iter()
            .map(|c| c.join().unwrap())
            .sum::<usize>()
    });
    assert!(cleaned > 0, "the cleaner ran concurrently with the workers");
    let model: Model = models.iter().flat_map(|m| m.clone()).collect();
    check_all(&engine, &model, &all_keys(workers, 60));
    drop(engine);
    let (reopened, _) = Engine::open(pool, two_cleaners).unwrap();
    check_all(&reopened, &model, &all_keys(workers, 60));
}
