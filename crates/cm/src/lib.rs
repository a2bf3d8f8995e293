//! The configuration manager (CM) of RowanKV and the coordination store it keeps
//! the configuration in.
//!
//! As in seed 000 §4.5 (FaRM-style reconfiguration), a configuration — a 64-bit
//! term, the membership and the shard map (`rowankv_wire::config::Config`) — is
//! stored persistently in a coordination service and cached by the CM, the servers
//! and the clients. Every configuration change is a new term, and each term is
//! committed exactly once. Leases in the coordination service decide which CM is
//! the active one; a standby takes over once the active CM's lease has expired.
//!
//! - `store`: the coordination service behind the `CoordStore` trait, shaped after
//!   etcd v3 (store-wide revisions, compare-and-put, leases); `EmbeddedStore` is the
//!   single-process backend, persisted to one file.
//! - `etcd`: `EtcdStore`, the same trait on a real etcd v3 through its JSON gateway
//!   (plain HTTP, no protoc, no async runtime), for two CMs that fail over
//!   (`docs/coordination.md`). Both backends pass one conformance suite.
//! - `manager`: `ConfigManager` — bootstrap of the first configuration, commit of
//!   term t+1 by compare-and-put, reload by a standby — and the active-CM lease
//!   (`ActiveLease`). It serves servers and clients as their `ConfigSource`.
//! - `role`: `CmTask`, the CM's role (seed 000 §4.5) as a task of the server's
//!   runtime on its own node of the fabric: the active-CM lease, server leases
//!   and failure detection, the prepare/commit exchange with the servers, and a
//!   standby CM that takes over on lease expiry; servers that join are handed to
//!   it (`Joins`).
//!
//! The CM sits above the server in the layering: its role depends on
//! `rowankv-server` (the runtime, the control port, the event log), the RPC
//! transport and the fabric. Servers and clients never depend on this crate;
//! they see the CM through `ConfigSource`. Time comes only from the `Clock`
//! given to the store and the role, so a simulator drives lease expiry.
#![forbid(unsafe_code)]

pub mod etcd;
pub mod manager;
pub mod plan;
pub mod role;
pub mod store;

pub use etcd::{EtcdConfig, EtcdStore};
pub use manager::{
    allocate_node, node_record, node_records, update_node_record, ActiveLease, CmError,
    ConfigManager, NodeRecord, StoreSource, ALLOCATED_NODE_BASE, CM_LEASE_KEY, COMMITTED_KEY,
    CONFIG_KEY, NEXT_NODE_KEY, NODE_RECORD_PREFIX,
};
pub use plan::{
    plan_failover, plan_join, plan_migrate, plan_migrated, plan_move, plan_ready, plan_reshard,
    server_loads, ReshardPolicy, ShardLoad,
};
pub use store::{CoordStore, EmbeddedStore, Guard, LeaseId, Revision, StoreError};
