//! Concurrency tests of the shard index against a model "PM": an append-only store of
//! (key, version) records addressed by index + 1. Every test prints its seed; replay
//! with `ROWANKV_SEED=<seed>`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_engine::index::{ShardIndex, Upsert};

const SEED_DEFAULT: u64 = 0x0123_4567_89ab_cdef;

fn seed() -> u64 {
    let seed = std::env::var("ROWANKV_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED_DEFAULT);
    eprintln!("index_concurrency seed={seed} (replay: ROWANKV_SEED={seed})");
    seed
}

fn thread_rng(seed: u64, thread: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ thread.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Key hash: a good mix, with the tag cut to 4 values so that keys sharing a bucket
/// often share a tag and `is_key` has to tell them apart.
fn hash_of(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z & 0x0003_ffff_ffff_ffff
}

/// Append-only model of PM, preallocated so readers need no lock.
struct Store {
    keys: Box<[AtomicU64]>,
    versions: Box<[AtomicU64]>,
    len: AtomicUsize,
    /// Busy-wait iterations per read made through the index's closures, standing in
    /// for PM read latency: it widens the index's critical sections so races happen.
    read_spins: u32,
}

impl Store {
    fn new(records_max: usize, read_spins: u32) -> Store {
        Store {
            keys: (0..records_max).map(|_| AtomicU64::new(0)).collect(),
            versions: (0..records_max).map(|_| AtomicU64::new(0)).collect(),
            len: AtomicUsize::new(0),
            read_spins,
        }
    }

    /// The record becomes visible to other threads through the index's Release store
    /// of its address.
    fn append(&self, key: u64, version: u64) -> u64 {
        let i = self.len.fetch_add(1, Ordering::Relaxed);
        assert!(i < self.keys.len(), "model store full");
        self.keys[i].store(key, Ordering::Relaxed);
        self.versions[i].store(version, Ordering::Relaxed);
        i as u64 + 1
    }

    fn key(&self, addr: u64) -> u64 {
        self.keys[addr as usize - 1].load(Ordering::Relaxed)
    }

    fn version(&self, addr: u64) -> u64 {
        self.versions[addr as usize - 1].load(Ordering::Relaxed)
    }

    fn pm_delay(&self) {
        for _ in 0..self.read_spins {
            std::hint::spin_loop();
        }
    }

    fn is_key(&self, addr: u64, key: u64) -> bool {
        self.pm_delay();
        self.key(addr) == key
    }

    fn version_slow(&self, addr: u64) -> u64 {
        self.pm_delay();
        self.version(addr)
    }

    fn records(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (1..=self.len.load(Ordering::Relaxed) as u64).map(|a| (self.key(a), self.version(a)))
    }

    fn put(&self, index: &ShardIndex, key: u64, version: u64) -> Upsert {
        let addr = self.append(key, version);
        let outcome = index.upsert(
            hash_of(key),
            addr,
            version,
            |a| self.is_key(a, key),
            |a| self.version_slow(a),
        );
        match outcome {
            Upsert::Inserted => {}
            Upsert::Replaced { old } => {
                assert_eq!(self.key(old), key);
                assert!(self.version(old) < version);
            }
            Upsert::Stale { current } => {
                assert_eq!(self.key(current), key);
                assert!(self.version(current) >= version);
            }
        }
        outcome
    }

    fn get(&self, index: &ShardIndex, key: u64) -> Option<u64> {
        index.get(hash_of(key), |a| self.is_key(a, key))
    }

    /// Highest version written for each key, from every record in the store.
    fn max_versions(&self, keys: u64) -> Vec<Option<u64>> {
        let mut max = vec![None; keys as usize];
        for (key, version) in self.records() {
            let m = &mut max[key as usize];
            *m = Some(m.map_or(version, |v: u64| v.max(version)));
        }
        max
    }
}

/// The index holds exactly the keys written, each pointing to its highest version.
fn check_final(index: &ShardIndex, store: &Store, keys: u64, seed: u64) {
    let max = store.max_versions(keys);
    for key in 0..keys {
        let found = store.get(index, key).map(|a| {
            assert_eq!(store.key(a), key, "seed {seed}");
            store.version(a)
        });
        assert_eq!(found, max[key as usize], "seed {seed} key {key}");
    }
    let written = max.iter().filter(|m| m.is_some()).count();
    assert_eq!(index.len(), written, "seed {seed}");
    let mut items = 0;
    index.for_each(|_| items += 1);
    assert_eq!(items, written, "seed {seed}");
}

const KEYS: u64 = 1000;
const READ_SPINS: u32 = 64;
const WRITERS: u64 = 4;
const BATCHES_PER_WRITER: usize = 3000;
/// Versions a writer reserves at once and applies in shuffled order, so lower
/// versions often arrive after higher ones.
const VERSION_BATCH: u64 = 8;

/// Writers upsert random keys with versions unique per key (one global counter);
/// `readers` threads check every lookup meanwhile.
fn run_upserts(seed: u64, items_expected: usize, readers: u64) {
    let index = ShardIndex::with_capacity(items_expected);
    let store = Store::new(
        WRITERS as usize * BATCHES_PER_WRITER * VERSION_BATCH as usize,
        READ_SPINS,
    );
    let version_next = AtomicU64::new(1);
    let writers_done = AtomicUsize::new(0);
    let stale = AtomicUsize::new(0);
    thread::scope(|s| {
        for w in 0..WRITERS {
            let (index, store, version_next) = (&index, &store, &version_next);
            let (writers_done, stale) = (&writers_done, &stale);
            s.spawn(move || {
                let mut rng = thread_rng(seed, w);
                for _ in 0..BATCHES_PER_WRITER {
                    let first = version_next.fetch_add(VERSION_BATCH, Ordering::Relaxed);
                    let mut versions: Vec<u64> = (first..first + VERSION_BATCH).collect();
                    versions.shuffle(&mut rng);
                    // Half the batch goes to one key, so its shuffled versions
                    // arrive out of order at the same item.
                    let key_hot = rng.gen_range(0..KEYS);
                    for version in versions {
                        let key = if rng.gen_bool(0.5) {
                            key_hot
                        } else {
                            rng.gen_range(0..KEYS)
                        };
                        if let Upsert::Stale { .. } = store.put(index, key, version) {
                            stale.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                writers_done.fetch_add(1, Ordering::Release);
            });
        }
        for r in 0..readers {
            let (index, store, writers_done) = (&index, &store, &writers_done);
            s.spawn(move || {
                let mut rng = thread_rng(seed, WRITERS + r);
                // Highest version this thread has observed per key.
                let mut seen = vec![0u64; KEYS as usize];
                let mut hits = 0u64;
                while writers_done.load(Ordering::Acquire) < WRITERS as usize {
                    let key = rng.gen_range(0..KEYS);
                    let Some(addr) = store.get(index, key) else {
                        assert_eq!(seen[key as usize], 0, "seed {seed}: key {key} vanished");
                        continue;
                    };
                    assert_eq!(store.key(addr), key, "seed {seed}: address of another key");
                    let version = store.version(addr);
                    assert!(
                        version >= seen[key as usize],
                        "seed {seed}: key {key} went back from version {} to {version}",
                        seen[key as usize]
                    );
                    seen[key as usize] = version;
                    hits += 1;
                }
                eprintln!("reader {r}: {hits} hits");
            });
        }
    });
    eprintln!(
        "items_expected {items_expected}: {} stale of {} writes, {} overflow buckets",
        stale.load(Ordering::Relaxed),
        store.len.load(Ordering::Relaxed),
        index.overflow_bucket_count()
    );
    assert!(
        stale.load(Ordering::Relaxed) > 0,
        "seed {seed}: no stale write exercised"
    );
    check_final(&index, &store, KEYS, seed);
}

#[test]
fn index_concurrent_upserts_keep_max_version() {
    let seed = seed();
    // Few buckets (long, concurrently growing chains) and the nominal size.
    run_upserts(seed, 0, 0);
    run_upserts(seed, KEYS as usize, 0);
}

#[test]
fn index_concurrent_gets_see_own_key_and_monotonic_versions() {
    let seed = seed();
    run_upserts(seed, 0, 2);
    run_upserts(seed, KEYS as usize, 2);
}

#[test]
fn index_racing_inserts_of_same_keys_make_one_item_each() {
    const ROUNDS: u64 = 40;
    const RACERS: usize = 2;
    let seed = seed();
    for round in 0..ROUNDS {
        let index = ShardIndex::with_capacity(if round % 2 == 0 { 0 } else { KEYS as usize });
        let store = Store::new(RACERS * KEYS as usize, READ_SPINS);
        let version_next = AtomicU64::new(1);
        let inserted = AtomicUsize::new(0);
        // Keys each racer has finished; a racer starts key i only once every racer
        // has finished key i - 1, so all racers insert the same new key at once.
        let progress: Vec<AtomicUsize> = (0..RACERS).map(|_| AtomicUsize::new(0)).collect();
        let mut keys: Vec<u64> = (0..KEYS).collect();
        keys.shuffle(&mut thread_rng(seed ^ round, RACERS as u64));
        thread::scope(|s| {
            for t in 0..RACERS {
                let (index, store, version_next) = (&index, &store, &version_next);
                let (inserted, progress, keys) = (&inserted, &progress, &keys);
                s.spawn(move || {
                    for (i, &key) in keys.iter().enumerate() {
                        while progress.iter().any(|p| p.load(Ordering::Acquire) < i) {
                            thread::yield_now();
                        }
                        let version = version_next.fetch_add(1, Ordering::Relaxed);
                        if store.put(index, key, version) == Upsert::Inserted {
                            inserted.fetch_add(1, Ordering::Relaxed);
                        }
                        progress[t].store(i + 1, Ordering::Release);
                    }
                });
            }
        });
        assert_eq!(index.len(), KEYS as usize, "seed {seed} round {round}");
        assert_eq!(
            inserted.load(Ordering::Relaxed),
            KEYS as usize,
            "seed {seed} round {round}"
        );
        check_final(&index, &store, KEYS, seed);
    }
}

#[test]
fn index_relocate_racing_upsert_keeps_highest_version() {
    const KEYS_HOT: u64 = 32;
    const WRITERS_HOT: u64 = 2;
    const WRITES_PER_WRITER: usize = 40_000;
    const RELOCATIONS_MAX: usize = 200_000;
    let seed = seed();
    let index = ShardIndex::with_capacity(0);
    let store = Store::new(
        WRITERS_HOT as usize * WRITES_PER_WRITER + RELOCATIONS_MAX,
        READ_SPINS,
    );
    let version_next = AtomicU64::new(1);
    let writers_done = AtomicUsize::new(0);
    let relocated = AtomicUsize::new(0);
    let relocate_lost = AtomicUsize::new(0);
    let cleaner_done = AtomicBool::new(false);
    thread::scope(|s| {
        for w in 0..WRITERS_HOT {
            let (index, store, version_next, writers_done, relocated, cleaner_done) = (
                &index,
                &store,
                &version_next,
                &writers_done,
                &relocated,
                &cleaner_done,
            );
            s.spawn(move || {
                let mut rng = thread_rng(seed, w);
                for i in 0..WRITES_PER_WRITER {
                    // Halfway, wait for the cleaner to have won a relocation: on a
                    // loaded machine it might otherwise start only after the
                    // writers are done, and the race would not be run at all.
                    if i == WRITES_PER_WRITER / 2 {
                        while relocated.load(Ordering::Relaxed) == 0
                            && !cleaner_done.load(Ordering::Acquire)
                        {
                            thread::yield_now();
                        }
                    }
                    let key = rng.gen_range(0..KEYS_HOT);
                    let version = version_next.fetch_add(1, Ordering::Relaxed);
                    store.put(index, key, version);
                    // Read-your-writes: a relocation of an older copy must not
                    // have overwritten this write.
                    let addr = store.get(index, key).expect("written key present");
                    assert!(
                        store.version(addr) >= version,
                        "seed {seed}: key {key} lost version {version}"
                    );
                }
                writers_done.fetch_add(1, Ordering::Release);
            });
        }
        let (index, store, relocated, relocate_lost, writers_done, cleaner_done) = (
            &index,
            &store,
            &relocated,
            &relocate_lost,
            &writers_done,
            &cleaner_done,
        );
        // The cleaner: copy the entry an item points to, then relocate the item.
        s.spawn(move || {
            let mut rng = thread_rng(seed, WRITERS_HOT);
            let mut seen = vec![0u64; KEYS_HOT as usize];
            for _ in 0..RELOCATIONS_MAX {
                if writers_done.load(Ordering::Acquire) == WRITERS_HOT as usize {
                    break;
                }
                let key = rng.gen_range(0..KEYS_HOT);
                let Some(old) = store.get(index, key) else {
                    continue;
                };
                let version = store.version(old);
                assert!(
                    version >= seen[key as usize],
                    "seed {seed}: key {key} went back to version {version}"
                );
                seen[key as usize] = version;
                let new = store.append(key, version);
                if index.relocate(hash_of(key), old, new) {
                    relocated.fetch_add(1, Ordering::Relaxed);
                } else {
                    relocate_lost.fetch_add(1, Ordering::Relaxed);
                }
            }
            cleaner_done.store(true, Ordering::Release);
        });
    });
    eprintln!(
        "relocated {}, lost to a newer write {}",
        relocated.load(Ordering::Relaxed),
        relocate_lost.load(Ordering::Relaxed)
    );
    assert!(
        relocated.load(Ordering::Relaxed) > 0,
        "seed {seed}: no relocation won"
    );
    // Copies carry their original's version, so the maximum over the store is the
    // maximum written; a stale copy winning would leave a lower version.
    check_final(&index, &store, KEYS_HOT, seed);
}
