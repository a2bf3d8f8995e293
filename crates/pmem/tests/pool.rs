//! Pools on each medium: create/open, DAX refusal, images, bounds, atomics, and what
//! each path counts in the media model.

use std::path::Path;
use std::sync::Arc;

use rowankv_pmem::{
    raw_store_persist, MediaModelConfig, Medium, Pool, PoolError, PoolOptions, PowerFailure,
    RegionMemory,
};

const POOL_BYTES: usize = 1 << 20;

fn shm_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm")
}

/// A directory on the disk that holds the target directory (not tmpfs).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn round_trip(path: &Path, medium: Medium) {
    let pool = Pool::create(path, PoolOptions::new(medium, POOL_BYTES)).unwrap();
    assert_eq!(pool.medium(), medium);
    assert_eq!(pool.len_bytes(), POOL_BYTES);
    pool.write(4096 + 3, b"rowan");
    pool.write_u64(8, 0xfeed_f00d);
    pool.persist(0, 8192);
    pool.nt_copy_persist(POOL_BYTES - 100, &[7u8; 100]);
    drop(pool);

    let pool = Pool::open(path, PoolOptions::new(medium, 0)).unwrap();
    assert_eq!(pool.len_bytes(), POOL_BYTES, "size 0 takes the file's size");
    let mut out = [0u8; 5];
    pool.read(4096 + 3, &mut out);
    assert_eq!(&out, b"rowan");
    assert_eq!(pool.read_u64(8), 0xfeed_f00d);
    let mut tail = [0u8; 100];
    pool.read(POOL_BYTES - 100, &mut tail);
    assert_eq!(tail, [7u8; 100]);
    drop(pool);

    let pool = Pool::open(path, PoolOptions::new(medium, POOL_BYTES)).unwrap();
    assert_eq!(pool.read_u64(8), 0xfeed_f00d);
}

#[test]
fn emulated_round_trip_in_dev_shm() {
    let dir = shm_dir();
    round_trip(&dir.path().join("pool"), Medium::Emulated);
}

#[test]
fn msync_round_trip_on_disk() {
    let dir = disk_dir();
    round_trip(&dir.path().join("pool"), Medium::Msync);
}

#[test]
fn create_truncates_an_existing_file() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    let pool = Pool::create(&path, PoolOptions::new(Medium::Emulated, 4096)).unwrap();
    pool.write_u64(0, 42);
    pool.persist(0, 8);
    drop(pool);
    let pool = Pool::create(&path, PoolOptions::new(Medium::Emulated, 8192)).unwrap();
    assert_eq!(pool.read_u64(0), 0);
    assert_eq!(pool.len_bytes(), 8192);
}

#[test]
fn open_refuses_a_size_mismatch() {
    let dir = shm_dir();
    let path = dir.path().join("pool");
    drop(Pool::create(&path, PoolOptions::new(Medium::Emulated, 4096)).unwrap());
    let err = Pool::open(&path, PoolOptions::new(Medium::Emulated, 8192)).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::SizeMismatch {
                expected_bytes: 8192,
                actual_bytes: 4096,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn open_of_a_missing_file_is_an_io_error() {
    let dir = shm_dir();
    let err = Pool::open(&dir.path().join("absent"), PoolOptions::default()).unwrap_err();
    assert!(matches!(err, PoolError::Io { .. }), "{err}");
}

#[test]
fn bad_sizes_are_invalid_config() {
    let dir = shm_dir();
    for size_bytes in [0, 100] {
        let err = Pool::create(
            &dir.path().join("pool"),
            PoolOptions::new(Medium::Emulated, size_bytes),
        )
        .unwrap_err();
        assert!(matches!(err, PoolError::InvalidConfig(_)), "{err}");
    }
    assert!(matches!(
        Pool::from_image(&[0u8; 65], PoolOptions::default()),
        Err(PoolError::InvalidConfig(_))
    ));
    let bad_media = PoolOptions {
        media_model: Some(MediaModelConfig {
            wc_ways: 0,
            ..MediaModelConfig::default()
        }),
        ..PoolOptions::default()
    };
    assert!(matches!(
        Pool::anonymous(4096, bad_media),
        Err(PoolError::InvalidConfig(_))
    ));
}

fn assert_dax_refused(dir: &Path) {
    let path = dir.join("pool");
    let err = Pool::create(&path, PoolOptions::new(Medium::Dax, POOL_BYTES)).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, PoolError::DaxUnsupported { .. }), "{message}");
    assert!(
        message.contains("MAP_SYNC/DAX is not available on this file system"),
        "{message}"
    );
    assert!(message.contains("Emulated"), "{message}");
    assert!(message.contains("dax_fallback = true"), "{message}");

    let opts = PoolOptions {
        dax_fallback: true,
        ..PoolOptions::new(Medium::Dax, POOL_BYTES)
    };
    let pool = Pool::create(&path, opts.clone()).unwrap();
    assert_eq!(
        pool.medium(),
        Medium::Emulated,
        "fallback says what it became"
    );
    pool.write_u64(0, 9);
    pool.persist(0, 8);
    drop(pool);
    let pool = Pool::open(&path, opts).unwrap();
    assert_eq!(pool.medium(), Medium::Emulated);
    assert_eq!(pool.read_u64(0), 9);
}

/// Neither tmpfs nor this machine's disk has DAX: MAP_SYNC is refused.
#[test]
fn dax_is_refused_on_tmpfs_unless_fallback() {
    assert_dax_refused(shm_dir().path());
}

#[test]
fn dax_is_refused_on_a_tempfile_dir_unless_fallback() {
    assert_dax_refused(disk_dir().path());
}

#[test]
fn medium_names_round_trip() {
    for m in [Medium::Dax, Medium::Emulated, Medium::Msync] {
        assert_eq!(m.to_string().parse::<Medium>().unwrap(), m);
    }
    let err = "optane".parse::<Medium>().unwrap_err();
    assert!(err.to_string().contains("dax, emulated, msync"), "{err}");
}

#[test]
fn from_image_holds_the_bytes_all_durable() {
    let image: Vec<u8> = (0..8192).map(|i| (i % 251) as u8).collect();
    let opts = PoolOptions {
        crash_sim: true,
        ..PoolOptions::default()
    };
    let pool = Pool::from_image(&image, opts).unwrap();
    assert_eq!(pool.medium(), Medium::Emulated);
    let crash = pool.crash().unwrap();
    assert_eq!(crash.dirty_lines(), 0);
    assert_eq!(crash.image(PowerFailure::DropAll), image);
    pool.power_fail(PowerFailure::DropAll);
    let mut out = vec![0u8; image.len()];
    pool.read(0, &mut out);
    assert_eq!(out, image);
}

#[test]
fn anonymous_pool_is_emulated_and_zeroed() {
    let pool = Pool::anonymous(4096, PoolOptions::new(Medium::Msync, 0)).unwrap();
    assert_eq!(pool.medium(), Medium::Emulated);
    assert_eq!(pool.len_bytes(), 4096);
    assert!(pool.path().is_none());
    let mut out = [1u8; 4096];
    pool.read(0, &mut out);
    assert_eq!(out, [0u8; 4096]);
}

#[test]
fn atomics_on_aligned_words() {
    let pool = Pool::anonymous(4096, PoolOptions::default()).unwrap();
    assert_eq!(pool.fetch_add_u64(64, 5), 0);
    assert_eq!(pool.compare_swap_u64(64, 5, 11), 5);
    assert_eq!(
        pool.compare_swap_u64(64, 5, 1),
        11,
        "a failed CAS returns the current value"
    );
    assert_eq!(pool.dma_fetch_add(64, 1), 11);
    assert_eq!(pool.dma_compare_swap(64, 12, 13), 12);
    assert_eq!(pool.read_u64(64), 13);
    pool.write_u64(4088, u64::MAX);
    let mut last = [0u8; 8];
    pool.read(4088, &mut last);
    assert_eq!(last, [0xff; 8]);
}

#[test]
fn concurrent_fetch_add_from_cpu_and_dma() {
    let pool = Pool::anonymous(4096, PoolOptions::default()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    if t % 2 == 0 {
                        pool.fetch_add_u64(0, 1);
                    } else {
                        pool.dma_fetch_add(0, 1);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(pool.read_u64(0), 40_000);
}

#[test]
fn region_memory_round_trip() {
    let pool = Pool::anonymous(8192, PoolOptions::default()).unwrap();
    let memory: Arc<dyn RegionMemory> = pool.clone();
    assert_eq!(memory.len_bytes(), 8192);
    memory.dma_write(100, b"landed");
    memory.dma_persist(100, 6);
    let mut out = [0u8; 6];
    memory.dma_read(100, &mut out);
    assert_eq!(&out, b"landed");
    pool.read(100, &mut out);
    assert_eq!(&out, b"landed");
    // Without the crash simulator a power failure loses nothing (ADR, all drained).
    memory.power_fail(PowerFailure::DropAll);
    pool.read(100, &mut out);
    assert_eq!(&out, b"landed");
}

fn with_media() -> Arc<Pool> {
    let opts = PoolOptions {
        media_model: Some(MediaModelConfig::default()),
        ..PoolOptions::default()
    };
    Pool::anonymous(1 << 20, opts).unwrap()
}

#[test]
fn media_counts_what_reaches_the_dimms() {
    let pool = with_media();
    let media = pool.media().unwrap();
    pool.write(0, &[1u8; 256]);
    assert_eq!(
        media.stats().request_bytes,
        0,
        "a cached store alone reaches nothing"
    );
    pool.persist(0, 256);
    assert_eq!(media.stats().request_bytes, 256, "persist flushes 4 lines");
    pool.persist(10, 1);
    assert_eq!(
        media.stats().request_bytes,
        320,
        "a partial line is a whole request"
    );

    let before = media.stats();
    pool.nt_copy(4096, &[2u8; 128]);
    assert_eq!(
        media.stats().delta(&before).request_bytes,
        128,
        "nt stores count at once"
    );
    pool.drain(4096, 128);
    assert_eq!(
        media.stats().delta(&before).request_bytes,
        128,
        "drain counts nothing more"
    );

    let before = media.stats();
    pool.dma_write(8192, &[3u8; 64]);
    pool.dma_persist(8192, 64);
    assert_eq!(
        media.stats().delta(&before).request_bytes,
        64,
        "DMA counts as it lands"
    );
    pool.dma_fetch_add(8192, 1);
    pool.dma_compare_swap(8200, 0, 1);
    assert_eq!(
        media.stats().delta(&before).request_bytes,
        192,
        "DMA atomics are 64 B writes"
    );

    let before = media.stats();
    raw_store_persist(&pool, 12288, &[4u8; 64]);
    assert_eq!(media.stats(), before, "the baseline has no instruments");
    let mut out = [0u8; 64];
    pool.read(12288, &mut out);
    assert_eq!(out, [4u8; 64]);

    media.flush_buffers();
    assert!(media.stats().dlwa() >= 1.0);
}

#[test]
#[should_panic(expected = "out of range")]
fn write_out_of_range_panics() {
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .write(4090, &[0u8; 7]);
}

#[test]
#[should_panic(expected = "out of range")]
fn read_out_of_range_panics() {
    let mut out = [0u8; 2];
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .read(4095, &mut out);
}

#[test]
#[should_panic(expected = "out of range")]
fn persist_out_of_range_panics() {
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .persist(0, 4097);
}

#[test]
#[should_panic(expected = "out of range")]
fn nt_copy_out_of_range_panics() {
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .nt_copy(usize::MAX, &[0u8; 2]);
}

#[test]
#[should_panic(expected = "out of range")]
fn dma_write_out_of_range_panics() {
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .dma_write(4096, &[0u8; 1]);
}

#[test]
#[should_panic(expected = "out of range")]
fn word_out_of_range_panics() {
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .read_u64(4096);
}

#[test]
#[should_panic(expected = "unaligned")]
fn unaligned_atomic_panics() {
    Pool::anonymous(4096, PoolOptions::default())
        .unwrap()
        .write_u64(4, 1);
}

#[test]
#[should_panic(expected = "out of range")]
fn raw_store_persist_out_of_range_panics() {
    let pool = Pool::anonymous(4096, PoolOptions::default()).unwrap();
    raw_store_persist(&pool, 4095, &[0u8; 2]);
}
