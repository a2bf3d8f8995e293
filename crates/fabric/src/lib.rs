//! The fabric: RowanKV's stand-in for an RDMA NIC, with verbs semantics.
//!
//! This crate owns the verbs-like interface (`Fabric`, `Nic`, `QueuePair`,
//! `CompletionQueue`, `SharedReceiveQueue`, `FaultInjector`), the seam to the memory a
//! NIC reaches (`RegionMemory`), the `LoopbackFabric` backend (in process), the
//! `TcpFabric` backend (processes and hosts, `docs/format/tcp-fabric.md`), the
//! timing model of the wire and the NIC for `loopback` (`timing`,
//! `docs/wire-model.md`; off unless asked for), and the
//! conformance suite every backend must pass (`conformance`). It depends only on `rowankv-types`;
//! nothing above it (pmem, rowan, engine, ...) may be named here.
//!
//! Invariants every backend keeps:
//! - a remote access outside a registered region, with a wrong key, without the right,
//!   or (atomics) misaligned fails with `RemoteAccessError`, changes nothing at the
//!   target, and moves the initiating queue pair to the error state;
//! - requests of one queue pair execute in posting order;
//! - a completion of a request posted with `persist` means its bytes are durable at
//!   the target;
//! - receive buffers are consumed strictly in posting order.
//!
//! `unsafe` lives only in `memory.rs` (the DRAM backing), with its contract.

pub mod conformance;
pub mod loopback;
pub mod memory;
mod srq;
pub mod tcp;
pub mod timing;
mod verbs;

pub use loopback::{LoopbackCq, LoopbackFabric, LoopbackNic, LoopbackQp, LoopbackSrq};
pub use memory::{DramMemory, PowerFailure, RegionMemory};
pub use tcp::{AddressBook, TcpConfig, TcpCq, TcpFabric, TcpNic, TcpQp, TcpSrq};
pub use timing::WireModel;
pub use verbs::*;
