//! YCSB on RowanKV: workload generation (`workload`) and the cluster runner that
//! compares replication strategies side by side (`runner`).

pub mod runner;
pub mod workload;

pub use runner::{
    run, table, timeline_report, FabricKind, FailoverTimes, TimedEvent, YcsbOptions, YcsbResult,
    SCALED_MEDIA_BANDWIDTH, TIMELINE_STEP_NS,
};
