//! `rowankv-pmem`: persistent-memory pools, their persist functions, a media model
//! of Optane-like DIMMs and a crash simulator.
//!
//! # What this crate owns
//! - [`Pool`]: a file (or anonymous memory) mapped into the address space, with the
//!   persist function of its [`Medium`] (after libpmem2): `Dax` (MAP_SYNC; `clwb` +
//!   `sfence`), `Emulated` (any file, normally tmpfs, or anonymous memory; `clwb` +
//!   `sfence`), `Msync` (a disk file; `msync`).
//! - The fabric seam: `impl rowankv_fabric::RegionMemory for Pool`, so that a NIC's
//!   DMA into a registered pool is seen by the media model and the crash simulator as
//!   a real RNIC's DMA (DDIO off) is seen by the DIMMs.
//! - [`MediaModel`]: request bytes and media bytes, hence device-level write
//!   amplification (DLWA), with 256 B XPLines and a set-associative write-combining
//!   buffer per DIMM (see `docs/media-model.md`).
//! - [`CrashSim`]: which 64 B lines are written but not durable, and what a power
//!   failure leaves of them (see `docs/pmem.md`).
//!
//! # What it must never depend on
//! Nothing above the fabric: no replication, engine, server or client crate. It
//! depends on `rowankv-fabric` only for the `RegionMemory` seam and `PowerFailure`.
//!
//! # Invariants
//! - An aligned 8-byte store ([`Pool::write_u64`], the atomics) is the only
//!   failure-atomic unit; anything larger may be torn by a power failure at 64 B line
//!   (simulator) or 8 B word (hardware) granularity.
//! - Persist = flush + drain. A store is durable only after a persist that covers it:
//!   cached stores after [`Pool::persist`]; non-temporal stores after [`Pool::drain`]
//!   (or `persist`); DMA writes after `dma_persist` (or `persist`).
//! - What a persisted byte survives: `Dax` and `Msync` survive power loss; `Emulated`
//!   survives a process crash and models ADR PM, whose power loss only the crash
//!   simulator can show.
//! - Offsets and lengths are checked on every call; out of range is a programmer
//!   error and panics (asserts stay on in release).
//! - All `unsafe` code lives in the private `raw` module, each block with its
//!   `SAFETY` argument.

mod crash;
mod media;
mod pool;
mod raw;

pub use crash::CrashSim;
pub use media::{
    media_write_duration, timing_slack_ns, MediaModel, MediaModelConfig, MediaStats, MediaTiming,
};
pub use pool::{raw_store_persist, Medium, ParseMediumError, Pool, PoolError, PoolOptions};
pub use raw::{flush_instruction, sfence, FlushInstruction, CACHELINE_BYTES};
pub use rowankv_fabric::{PowerFailure, RegionMemory};
