//! Power failure at every persist point of a seeded workload.
//!
//! The pool runs under the crash simulator. At the start of every persist (before
//! its lines become durable) a hook takes crash images — the bytes the pool would
//! hold if power failed right then, with seeded subsets of the unpersisted lines
//! dropped — recovers a fresh engine from each, and checks: every acknowledged write
//! is there with its latest value; the one write in flight may or may not be; no
//! other value appears (nothing torn, nothing invented).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_engine::{Engine, EngineConfig};
use rowankv_pmem::{Pool, PoolOptions, PowerFailure};
use rowankv_types::ShardId;

const SHARDS: u16 = 4;
const KEYS: u32 = 40;

fn config() -> EngineConfig {
    EngineConfig {
        segment_size_bytes: 16 << 10,
        mtu_bytes: 2048,
        shard_count: SHARDS,
        workers: 1,
        keys_per_shard_expected: 64,
        clean_grace: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// (shard, key).
type KeyId = (u16, Vec<u8>);

#[derive(Default)]
struct Acked {
    /// Acknowledged state: None = deleted.
    latest: BTreeMap<KeyId, Option<Vec<u8>>>,
    /// The write being carried out (not acknowledged).
    in_flight: Option<(KeyId, Option<Vec<u8>>)>,
}

fn check_image(image: Vec<u8>, acked: &Acked, what: &str) {
    let pool = Pool::from_image(&image, PoolOptions::default()).unwrap();
    let (engine, _report) = match Engine::open(pool, config()) {
        Ok(x) => x,
        Err(e) => panic!("{what}: recovery failed: {e}"),
    };
    for s in 0..SHARDS {
        for k in 0..KEYS {
            let id = (s, format!("key-{k}").into_bytes());
            let got = engine.get(ShardId(s), &id.1).unwrap().map(|(v, _)| v);
            let expected = acked.latest.get(&id).cloned().unwrap_or(None);
            if got == expected {
                continue;
            }
            match &acked.in_flight {
                Some((fid, fval)) if *fid == id && got == *fval => {}
                _ => panic!(
                    "{what}: shard {s} key-{k}: recovered {:?}, acknowledged {:?}",
                    got.map(|v| v.len()),
                    expected.map(|v| v.len())
                ),
            }
        }
    }
}

/// Run `ops` operations; at every persist point check `policies` images.
fn crash_run(seed: u64, ops: usize, policies_per_point: u64) -> u64 {
    let pool = Pool::anonymous(
        512 << 10,
        PoolOptions {
            crash_sim: true,
            ..PoolOptions::default()
        },
    )
    .unwrap();
    let engine = Engine::create(pool.clone(), config()).unwrap();
    let acked = Arc::new(Mutex::new(Acked::default()));
    let images = Arc::new(AtomicU64::new(0));
    {
        let acked = acked.clone();
        let images = images.clone();
        let crash_pool = pool.clone();
        pool.crash()
            .unwrap()
            .set_persist_hook(Some(Box::new(move |point| {
                let acked = acked.lock();
                let sim = crash_pool.crash().unwrap();
                for p in 0..policies_per_point {
                    let policy = if p == 0 {
                        PowerFailure::DropAll
                    } else {
                        PowerFailure::DropSubset {
                            seed: seed ^ (point << 8) ^ p,
                            drop_probability: 0.5,
                        }
                    };
                    check_image(
                        sim.image(policy),
                        &acked,
                        &format!("seed {seed:#x} point {point} {policy:?}"),
                    );
                    images.fetch_add(1, Ordering::Relaxed);
                }
            })));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in 0..ops {
        let shard = rng.gen_range(0..SHARDS);
        let key = format!("key-{}", rng.gen_range(0..KEYS)).into_bytes();
        let id = (shard, key.clone());
        let value = if rng.gen_range(0..5) == 0 {
            None
        } else {
            // Sizes up to several MTUs, so multi-block entries are torn too.
            let len = if rng.gen_range(0..20) == 0 {
                rng.gen_range(2000..5000)
            } else {
                rng.gen_range(0..200)
            };
            Some((0..len).map(|j| (i + j) as u8).collect::<Vec<u8>>())
        };
        acked.lock().in_flight = Some((id.clone(), value.clone()));
        match &value {
            Some(v) => engine.put(0, ShardId(shard), &key, v).map(|_| ()),
            None => engine.delete(0, ShardId(shard), &key).map(|_| ()),
        }
        .unwrap();
        {
            let mut a = acked.lock();
            a.latest.insert(id, value);
            a.in_flight = None;
        }
        if engine.free_segments() < 6 {
            engine.clean().unwrap();
        }
    }
    pool.crash().unwrap().set_persist_hook(None);
    images.load(Ordering::Relaxed)
}

#[test]
fn every_persist_point_recovers_every_acknowledged_write() {
    let mut total = 0;
    for seed in [1u64, 2, 3] {
        total += crash_run(0xC0FFEE00 + seed, 1_200, 3);
    }
    eprintln!("crash images checked: {total}");
    assert!(total >= 10_000, "only {total} crash images");
}
