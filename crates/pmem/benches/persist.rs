//! Persist paths of an Emulated pool in /dev/shm, instruments off, against the
//! baseline of a plain copy + clwb + sfence (`raw_store_persist`).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rowankv_pmem::{raw_store_persist, Medium, Pool, PoolOptions};

const POOL_BYTES: usize = 64 << 20;

/// Sequential append offsets wrapping within the pool.
struct Appender {
    next: usize,
    size_bytes: usize,
}

impl Appender {
    fn next(&mut self) -> usize {
        if self.next + self.size_bytes > POOL_BYTES {
            self.next = 0;
        }
        let at = self.next;
        self.next += self.size_bytes;
        at
    }
}

fn persist(c: &mut Criterion) {
    let dir = tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm");
    let pool: Arc<Pool> = Pool::create(
        &dir.path().join("pool"),
        PoolOptions::new(Medium::Emulated, POOL_BYTES),
    )
    .expect("emulated pool");
    let mut group = c.benchmark_group("pool_persist");

    for size_bytes in [64usize, 256] {
        let data = vec![0xa5u8; size_bytes];
        group.throughput(Throughput::Bytes(size_bytes as u64));
        group.bench_function(format!("append_{size_bytes}B"), |b| {
            let mut appender = Appender {
                next: 0,
                size_bytes,
            };
            b.iter(|| {
                let at = appender.next();
                pool.write(at, black_box(&data));
                pool.persist(at, size_bytes);
            })
        });
    }

    let data = [0x5au8; 64];
    group.throughput(Throughput::Bytes(64));
    group.bench_function("nt_copy_persist_64B", |b| {
        let mut appender = Appender {
            next: 0,
            size_bytes: 64,
        };
        b.iter(|| pool.nt_copy_persist(appender.next(), black_box(&data)))
    });
    group.bench_function("memcpy_clwb_sfence_64B", |b| {
        let mut appender = Appender {
            next: 0,
            size_bytes: 64,
        };
        b.iter(|| raw_store_persist(&pool, appender.next(), black_box(&data)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = persist
}
criterion_main!(benches);
