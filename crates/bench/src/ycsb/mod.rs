//! YCSB on RowanKV: workload generation (`workload`), the cluster runner that
//! compares replication strategies side by side (`runner`, closed loop),
//! the open-loop latency-versus-throughput sweep of seed 000 Figure 9 (`sweep`),
//! and dynamic resharding's timeline under a hotspot, Figure 15 (`reshard`).

pub mod reshard;
pub mod runner;
pub mod sweep;
pub mod workload;

pub use runner::{
    run, table, timeline_report, FabricKind, FailoverTimes, TimedEvent, YcsbOptions, YcsbResult,
    SCALED_MEDIA_BANDWIDTH, TIMELINE_STEP_NS,
};
