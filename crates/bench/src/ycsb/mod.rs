//! YCSB on RowanKV: workload generation (`workload`), the cluster runner that
//! compares replication strategies side by side (`runner`, closed loop),
//! the open-loop latency-versus-throughput sweep of seed 000 Figure 9 (`sweep`),
//! dynamic resharding's timeline under a hotspot, Figure 15 (`reshard`), and
//! the comparison as one parameter varies, Figure 13 and Table 2 (`sens`).

pub mod reshard;
pub mod runner;
pub mod sens;
pub mod sweep;
pub mod workload;

pub use runner::{
    run, table, timeline_report, FabricKind, FailoverTimes, TimedEvent, YcsbOptions, YcsbResult,
    SCALED_MEDIA_BANDWIDTH, TIMELINE_STEP_NS,
};
