//! The storage engine of one RowanKV server (seed 000 §4.1–§4.4, §4.7, §5.3).
//!
//! Owns: the pool's layout and segment meta table (`segment`), the log-entry format
//! (`entry`), the per-shard DRAM indexes (`index`), per-thread logs, cleaning and
//! recovery (`engine`). It stands on `pmem` (pools) and `rowan` (the backup log's
//! receiver) and never depends on anything above it (replication, server, CM).
//!
//! Invariants:
//! - an entry is durable before `put`/`delete` returns, and before the index points
//!   to it;
//! - an index item's version never decreases: versions, not arrival order, decide
//!   which entry is a key's latest;
//! - nothing read from PM is trusted before its checksum verifies; recovery reports
//!   and skips what does not verify;
//! - a write's request record (exactly-once retries) is in its log entry, and a
//!   shard's request table answers it `Done` only once that entry is indexed; every
//!   path that indexes an entry feeds the table (`Engine::request_outcome`).
#![forbid(unsafe_code)]

pub mod blog;
pub mod engine;
pub mod entry;
pub mod identity;
pub mod index;
pub mod segment;

pub use blog::{register_data_area, BackupLog, BackupLogConfig, ControlReport};
pub use engine::{
    hash_key, CleanReport, Engine, EngineConfig, InstallReport, RecoveryReport, Stored, Written,
    WORKERS_MAX,
};
pub use identity::{
    mark_stale, marked_stale, member_term, read_identity, record_member_term, write_identity,
    Identity,
};
pub use index::{RequestOutcome, RequestStats, REQUEST_CLIENTS_MAX, REQUEST_WINDOW};
pub use segment::{Owner, Reach, SegmentState, CLEANING_SEGMENTS};

use rowankv_types::ShardId;

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("corrupt pool: {0}")]
    Corrupt(String),
    #[error("out of space: no free segment")]
    OutOfSpace,
    #[error("no shard {0}")]
    NoSuchShard(ShardId),
    #[error("shard {0} has used every 48-bit version")]
    VersionsExhausted(ShardId),
    #[error(transparent)]
    Entry(#[from] entry::EntryError),
}
