//! `rowankv-clover`: Clover — a key-value store on passive disaggregated persistent
//! memory (Tsai, Shan and Zhang, ATC '20) — with the in-network conflict resolution
//! of seed 004: a top-of-rack interposer that redirects a CAS aimed at a stale
//! chain tail to the true tail. `docs/clover.md` describes the protocol and its
//! deviations from the papers.
//!
//! # What this crate owns
//! - [`layout`]: the slot, version and link-word formats of a memory node.
//! - [`MemoryNode`]: a PM pool registered with its NIC and nothing else (passive);
//!   crash and restart.
//! - [`MetadataServer`]: key index, space allocation in chunks, tail hints, garbage
//!   collection of old versions.
//! - [`Client`]: out-of-place writes appended by CAS, lock-free reads confirmed
//!   fresh by a null `next`, chain walks, tail caches, replication to the backups,
//!   recovery of a CAS whose outcome is unknown; an event-driven state machine.
//! - [`switch`]: the interposer ([`Switch`], [`InterposedNic`]) as a wrapper around
//!   any fabric's NIC.
//! - [`check`]: a per-key linearizability checker; [`sim`]: the deterministic
//!   seeded simulation; [`bench`]: YCSB-A native versus interposer on the wire
//!   model.
//!
//! # What it must never depend on
//! Only the fabric's and pmem's interfaces and `rowankv-types`; nothing above them
//! (no engine, server, client or replication crate). The fabric crate is untouched:
//! the switch wraps its traits.
//!
//! # Invariants
//! - A PUT is acknowledged only when its version is persisted on every replica, its
//!   link on the primary is durable (the primary was drained after the CAS) and it
//!   is linked on every backup.
//! - A GET returns the value of a version whose `next` was null when read and whose
//!   inbound link is durable (marked durable by its writer, or drained by the
//!   reader before it returns).
//! - A version is appended at most once: a writer whose CAS outcome is unknown first
//!   walks the chain looking for its version.
//! - Words naming a slot carry its generation, so a freed and reused slot is never
//!   taken for the version it held.
//! - The interposer only ever changes performance: it redirects a CAS only to the
//!   tail it believes, hides a redirected failure behind `layout::FAILED`, and
//!   drops its state on any anomaly.

#![forbid(unsafe_code)]

pub mod bench;
pub mod check;
mod client;
pub mod cluster;
pub mod layout;
mod memnode;
mod ms;
pub mod sim;
pub mod switch;
#[cfg(test)]
mod tests;

pub use client::{Client, ClientStats, Outcome, Reply, Request, CACHE_KEYS_MAX, SEND_DEPTH};
pub use memnode::{Connection, MemoryNode, ACCEPTED_MAX};
pub use ms::{KeyMeta, MetadataServer, MsStats, KEYS_MAX, MS_POLLS_MAX};
pub use switch::{InterposedNic, Switch, SwitchConfig, SwitchStats};

use rowankv_fabric::FabricError;
use rowankv_types::NodeId;

/// Debug tracing of client steps (tests only).
#[doc(hidden)]
pub static TRACE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Upper bounds on a configuration (a typo must not allocate a terabyte).
pub const REPLICAS_MAX: usize = 8;
pub const SLOTS_MAX: usize = 1 << 26;
pub const VALUE_BYTES_MAX_LIMIT: usize = 1 << 16;
pub const KEY_BYTES_MAX_LIMIT: usize = 1 << 10;

const _: () = assert!(REPLICAS_MAX < 256, "wr ids carry the replica in 8 bits");

/// How a Clover deployment is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Memory nodes that hold every version (the first is the primary).
    pub replicas: usize,
    /// Slots of each memory node (slot 0 is never used).
    pub slots: usize,
    pub value_bytes_max: usize,
    pub key_bytes_max: usize,
    /// Slots a client takes from the MS at once.
    pub chunk_slots: usize,
    /// GC keeps at least this many newest versions of a key.
    pub versions_kept: usize,
    /// Run GC on a key every this many reports of that key to the MS (0: only
    /// when asked).
    pub gc_every_reports: u64,
    /// Bound on chain-walk steps of one operation.
    pub walk_steps_max: usize,
    /// Bound on restarts of one operation from the MS hint.
    pub restarts_max: u32,
    /// Bound on polls a client waits for a memory node to come back.
    pub wait_polls_max: u64,
    /// Post the drain FLUSH with the CAS (one round); `false` posts it as its own
    /// round, which the simulator uses to widen the window a crash can hit.
    pub flush_with_cas: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            replicas: 2,
            slots: 1 << 14,
            value_bytes_max: 64,
            key_bytes_max: 64,
            chunk_slots: 16,
            versions_kept: 4,
            gc_every_reports: 8,
            walk_steps_max: 1 << 16,
            restarts_max: 64,
            wait_polls_max: 1 << 20,
            flush_with_cas: true,
        }
    }
}

impl Config {
    pub fn slot_bytes(&self) -> usize {
        layout::slot_bytes(self.value_bytes_max)
    }

    /// Bytes of a memory node's region.
    pub fn region_bytes(&self) -> usize {
        self.slots * self.slot_bytes()
    }

    pub fn check(&self) -> Result<(), CloverError> {
        let bad = |what: &'static str| Err(CloverError::BadConfig(what));
        if self.replicas == 0 || self.replicas > REPLICAS_MAX {
            return bad("replicas must be 1..=REPLICAS_MAX");
        }
        if self.slots < 2 || self.slots > SLOTS_MAX {
            return bad("slots must be 2..=SLOTS_MAX");
        }
        if self.value_bytes_max > VALUE_BYTES_MAX_LIMIT || self.key_bytes_max > KEY_BYTES_MAX_LIMIT
        {
            return bad("key or value bound too large");
        }
        if self.chunk_slots == 0 || self.versions_kept < 2 {
            return bad("chunk_slots must be >= 1 and versions_kept >= 2");
        }
        if self.walk_steps_max == 0 {
            return bad("walk_steps_max must be >= 1");
        }
        Ok(())
    }
}

/// Errors of Clover's operations.
#[derive(Debug, thiserror::Error)]
pub enum CloverError {
    #[error("fabric: {0}")]
    Fabric(#[from] FabricError),
    #[error("memory node {0} is down")]
    NodeDown(NodeId),
    #[error("{what} of {len} bytes exceeds the bound of {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("the memory nodes have no free slot")]
    OutOfSpace,
    #[error("bound reached: {0}")]
    Limit(&'static str),
    #[error("gave up: {0}")]
    GaveUp(&'static str),
    #[error("corrupt version at offset {offset}: {detail}")]
    Corrupt { offset: u64, detail: String },
    #[error("bad configuration: {0}")]
    BadConfig(&'static str),
}
