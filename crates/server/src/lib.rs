//! The RowanKV server (seed 000 §4.1, §4.5, §4.7, §5): worker roles that do
//! network I/O and KV logic, the control role (the Rowan receiver's control path,
//! leases, failover, re-replication, cold start), digest and clean roles, the
//! five replication strategies the paper compares and a sixth on seed 002's
//! durable RPCs (`drpc`), the runtime that schedules
//! the roles, and the assembly of one server on its NIC (`node`).
//!
//! It also reads the deployment files of `rowankv server` and `rowankv cm`
//! (`deploy`, `docs/deployment.md`).
//!
//! Layering: the server depends on the engine, the fabric, the RPC transport
//! (`rowankv-rpc`), the wire formats and the CM's interface only
//! (`ConfigSource` in `rowankv_wire`), never on the `cm` crate. The CM's role
//! is `rowankv_cm::role`; the in-process cluster, which assembles servers, CMs
//! and the embedded store in one process, is `rowankv_deploy::cluster`.
//!
//! Guarantees kept here:
//! - a PUT/DEL is answered `Ok` only after its entry is durable in the primary's
//!   t-log and in every backup's log; only then is it indexed at the primary;
//! - a request whose term differs from the server's (after refreshing from the
//!   CM) or whose cluster id is not the server's is refused and changes nothing;
//! - a malformed frame, an unknown type, an oversized key or value gets a typed
//!   error; the worker goes on serving;
//! - a client request is served only under a valid lease, a committed
//!   configuration, and for a shard whose replicas agree (after a promotion or a
//!   cold start); otherwise it is refused with `Blocked` and changes nothing
//!   (`control`, and the CM's role `rowankv_cm::role`: leases, failover,
//!   re-replication, cold start).
#![forbid(unsafe_code)]

pub mod background;
pub mod buggify;
pub mod control;
pub mod deploy;
pub mod events;
pub mod lease;
pub mod node;
pub mod replication;
pub mod runtime;
pub mod server;
pub mod services;
pub mod version;
pub mod worker;

pub use events::{Event, EventKind, EventLog};
pub use node::ClusterError;
pub use replication::{BatchConfig, Strategy};
pub use runtime::{CpuModel, Executor, Periodic, Placement, Step, Task};
pub use server::{
    FailoverSettings, ServerSettings, ServerShared, ServerStats, ShardLoads, KV_BYTES_MAX,
    LOAD_WINDOW_NS,
};
