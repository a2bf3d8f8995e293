//! Helpers shared by the engine's integration tests: a small engine whose
//! segments fill, roll and are cleaned within a test.

use std::sync::Arc;

use rowankv_engine::EngineConfig;
use rowankv_pmem::{Pool, PoolOptions};

pub const MTU: usize = 2048;
pub const SEGMENT: usize = 16 << 10;
pub const POOL_BYTES: usize = 1 << 20;

/// 16 KiB segments of a 1 MiB pool, 4 shards, 2 workers, no cleaning grace.
pub fn small_config() -> EngineConfig {
    EngineConfig {
        segment_size_bytes: SEGMENT,
        mtu_bytes: MTU,
        shard_count: 4,
        workers: 2,
        keys_per_shard_expected: 256,
        clean_grace: std::time::Duration::ZERO,
        ..EngineConfig::default()
    }
}

/// An anonymous pool of `POOL_BYTES`, tracking persistence if `crash_sim`.
pub fn small_pool(crash_sim: bool) -> Arc<Pool> {
    Pool::anonymous(
        POOL_BYTES,
        PoolOptions {
            crash_sim,
            ..PoolOptions::default()
        },
    )
    .unwrap()
}
