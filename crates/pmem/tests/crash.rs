//! The crash simulator: what survives a power failure, determinism of DropSubset,
//! images, and the persist hook.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_pmem::{Pool, PoolOptions, PowerFailure, RegionMemory};

fn sim_pool(size_bytes: usize) -> Arc<Pool> {
    let opts = PoolOptions {
        crash_sim: true,
        ..PoolOptions::default()
    };
    Pool::anonymous(size_bytes, opts).unwrap()
}

fn contents(pool: &Pool) -> Vec<u8> {
    let mut out = vec![0u8; pool.len_bytes()];
    pool.read(0, &mut out);
    out
}

#[test]
fn persisted_data_survives_a_power_failure() {
    let pool = sim_pool(4096);
    pool.write(0, b"durable!");
    pool.write_u64(64, 77);
    pool.persist(0, 72);
    assert_eq!(pool.crash().unwrap().dirty_lines(), 0);
    pool.power_fail(PowerFailure::DropAll);
    let mut out = [0u8; 8];
    pool.read(0, &mut out);
    assert_eq!(&out, b"durable!");
    assert_eq!(pool.read_u64(64), 77);
}

#[test]
fn unpersisted_data_is_gone_after_drop_all() {
    let pool = sim_pool(4096);
    pool.write(0, b"old");
    pool.persist(0, 3);
    pool.write(0, b"new");
    pool.write(200, b"never persisted");
    pool.nt_copy(1024, &[9u8; 300]);
    pool.dma_write(2048, &[8u8; 64]);
    pool.dma_fetch_add(3072, 1);
    let crash = pool.crash().unwrap();
    assert!(crash.dirty_lines() > 0);
    pool.power_fail(PowerFailure::DropAll);
    assert_eq!(crash.dirty_lines(), 0);
    let mut expected = vec![0u8; 4096];
    expected[..3].copy_from_slice(b"old");
    assert_eq!(contents(&pool), expected);
}

#[test]
fn drain_makes_nt_stores_durable_but_not_cached_stores() {
    let pool = sim_pool(4096);
    pool.nt_copy(0, &[5u8; 100]);
    pool.write(512, &[6u8; 10]);
    pool.drain(0, 4096);
    let crash = pool.crash().unwrap();
    assert_eq!(
        crash.dirty_lines(),
        1,
        "the cached line still needs a flush"
    );
    pool.power_fail(PowerFailure::DropAll);
    let after = contents(&pool);
    assert_eq!(&after[..100], &[5u8; 100]);
    assert_eq!(&after[512..522], &[0u8; 10]);
}

#[test]
fn a_line_written_both_ways_needs_persist() {
    let pool = sim_pool(4096);
    pool.write(0, &[1u8; 8]);
    pool.nt_copy(8, &[2u8; 8]);
    pool.drain(0, 64);
    assert_eq!(pool.crash().unwrap().dirty_lines(), 1);
    pool.persist(0, 64);
    assert_eq!(pool.crash().unwrap().dirty_lines(), 0);
}

#[test]
fn dma_persist_makes_dma_writes_durable() {
    let pool = sim_pool(4096);
    let memory: Arc<dyn RegionMemory> = pool.clone();
    memory.dma_write(128, b"from the wire");
    memory.dma_persist(128, 13);
    memory.dma_write(1024, b"unflushed");
    memory.power_fail(PowerFailure::DropAll);
    let after = contents(&pool);
    assert_eq!(&after[128..141], b"from the wire");
    assert_eq!(&after[1024..1033], &[0u8; 9]);
}

/// Hundreds of dirty lines, every one holding bytes that differ from its durable
/// contents.
fn many_dirty_lines(pool: &Pool) {
    for line in 0..500usize {
        pool.write(line * 64 + (line % 50), &[(line % 255) as u8 + 1; 7]);
    }
    assert_eq!(pool.crash().unwrap().dirty_lines(), 500);
}

#[test]
fn drop_subset_is_a_function_of_the_seed() {
    let pool = sim_pool(64 * 1024);
    many_dirty_lines(&pool);
    let crash = pool.crash().unwrap();
    let subset = |seed| PowerFailure::DropSubset {
        seed,
        drop_probability: 0.5,
    };
    let a1 = crash.image(subset(1));
    let a2 = crash.image(subset(1));
    let b = crash.image(subset(2));
    assert_eq!(a1, a2, "same seed, same dirty set: identical images");
    assert_ne!(a1, b, "a different seed drops different lines");
    let all = crash.image(PowerFailure::DropAll);
    let none = contents(&pool);
    assert_ne!(a1, all);
    assert_ne!(a1, none);

    // Applying it to the live pool gives the same bytes as the image.
    pool.power_fail(subset(1));
    assert_eq!(contents(&pool), a1);
    assert_eq!(crash.dirty_lines(), 0);
}

#[test]
fn drop_subset_probability_bounds() {
    let pool = sim_pool(64 * 1024);
    many_dirty_lines(&pool);
    let crash = pool.crash().unwrap();
    let keep_all = crash.image(PowerFailure::DropSubset {
        seed: 7,
        drop_probability: 0.0,
    });
    assert_eq!(keep_all, contents(&pool));
    let drop_all = crash.image(PowerFailure::DropSubset {
        seed: 7,
        drop_probability: 1.0,
    });
    assert_eq!(drop_all, crash.image(PowerFailure::DropAll));
}

#[test]
#[should_panic(expected = "drop_probability")]
fn drop_probability_outside_unit_interval_panics() {
    let pool = sim_pool(4096);
    pool.crash().unwrap().image(PowerFailure::DropSubset {
        seed: 0,
        drop_probability: 1.5,
    });
}

#[test]
fn image_leaves_the_live_pool_unchanged() {
    let pool = sim_pool(64 * 1024);
    many_dirty_lines(&pool);
    let before = contents(&pool);
    let crash = pool.crash().unwrap();
    let image = crash.image(PowerFailure::DropAll);
    assert_ne!(image, before);
    assert_eq!(image, vec![0u8; 64 * 1024]);
    assert_eq!(contents(&pool), before);
    assert_eq!(crash.dirty_lines(), 500);
}

#[test]
fn persist_hook_sees_each_persist_point_before_it_takes_effect() {
    let pool = sim_pool(4096);
    // (persist point, crash image taken at its start)
    type Seen = Mutex<Vec<(u64, Vec<u8>)>>;
    let seen: Arc<Seen> = Arc::default();
    {
        let weak = Arc::downgrade(&pool);
        let seen = Arc::clone(&seen);
        pool.crash()
            .unwrap()
            .set_persist_hook(Some(Box::new(move |index| {
                let pool = weak.upgrade().expect("pool alive while persisting");
                let image = pool.crash().unwrap().image(PowerFailure::DropAll);
                seen.lock().push((index, image));
            })));
    }
    pool.write(0, b"AAAA");
    pool.persist(0, 4); // point 0: the image does not yet hold AAAA
    pool.write(64, b"BBBB");
    pool.write(0, b"CCCC");
    pool.persist(64, 4); // point 1: AAAA durable; BBBB and CCCC not
    pool.nt_copy(128, b"DDDDDDDD");
    pool.drain(128, 8); // point 2: BBBB durable
    pool.dma_persist(0, 0); // point 3

    let crash = pool.crash().unwrap();
    assert_eq!(crash.persist_points(), 4);
    crash.set_persist_hook(None);
    pool.persist(0, 64);
    assert_eq!(crash.persist_points(), 5);

    let seen = seen.lock();
    let indices: Vec<u64> = seen.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, vec![0, 1, 2, 3]);
    assert_eq!(&seen[0].1[0..4], &[0u8; 4]);
    assert_eq!(&seen[1].1[0..4], b"AAAA", "CCCC is not durable");
    assert_eq!(&seen[1].1[64..68], &[0u8; 4]);
    assert_eq!(&seen[2].1[64..68], b"BBBB");
    assert_eq!(&seen[2].1[128..136], &[0u8; 8]);
    assert_eq!(&seen[3].1[128..136], b"DDDDDDDD");
    assert_eq!(&seen[3].1[0..4], b"AAAA");
}

#[test]
fn concurrent_writers_and_a_crash_image() {
    let pool = sim_pool(1 << 16);
    let persisted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let pool = Arc::clone(&pool);
            let persisted = Arc::clone(&persisted);
            std::thread::spawn(move || {
                let base = (t as usize) << 14;
                for i in 0..200usize {
                    let at = base + i * 8;
                    pool.write_u64(at, t * 1000 + i as u64 + 1);
                    if i % 2 == 0 {
                        pool.persist(at, 8);
                        persisted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every even slot was persisted after its store, so it is in the image whatever
    // became of the odd slots sharing its line.
    let image = pool.crash().unwrap().image(PowerFailure::DropAll);
    for t in 0..4u64 {
        let base = (t as usize) << 14;
        for i in (0..200usize).step_by(2) {
            let at = base + i * 8;
            let word = u64::from_ne_bytes(image[at..at + 8].try_into().unwrap());
            assert_eq!(word, t * 1000 + i as u64 + 1, "thread {t} slot {i}");
        }
    }
    assert_eq!(persisted.load(Ordering::Relaxed), 400);
}
