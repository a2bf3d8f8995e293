//! RowanKV's experiments: the evaluation sections of the seed papers, reproduced on
//! the fabric and pmem stand-ins.
//!
//! This crate sits at the top of the stack (it may use every layer below it) and is
//! used only by the `rowankv` command line. Each experiment returns plain result
//! records (serde-serialisable, one per measured point) and has a table printer; the
//! command line chooses between the table and `--json`.
//!
//! Experiments:
//! - [`dlwa`]: seed 000 Figure 2 and Figure 8 — device-level write amplification of
//!   many remote write streams (one-sided WRITE into a log per sender) against one
//!   Rowan stream, with and without local sequential PM writers.
//! - [`engine_bench`]: one server's engine — PUT/GET rates against a DRAM map, DLWA
//!   of a PUT-only run, cold start.
//! - [`ycsb`]: seed 000 §6.3 — YCSB on an in-process cluster, the five replication
//!   strategies side by side (throughput, latency, DLWA per server, CPU per op).
//! - [`resp_load`]: RowanKV's RESP load generator (`rowankv bench resp`), the one
//!   client driver of the comparison with Redis (`scripts/redis-compare`), with its
//!   table, ratios and plot.
//! - [`rpc`]: seed 002 Figures 8 and 9 — the four durable RPCs against the seven
//!   classic RDMA RPC designs on the loopback fabric's wire model.
//! - [`rpc_figs`]: seed 002 Figures 12, 13, 15, 17, 18, 19 — recovery under receiver
//!   crashes, object size, receiver CPU load, concurrent senders, read/write ratio,
//!   batch size, on the same fabric and wire model.
//!
//! [`plot`] draws the results of `dlwa`, `ycsb` and the failover run as PNG files
//! (`--plot`), from the result records alone, with a font compiled in.
#![forbid(unsafe_code)]

pub mod coldstart;
pub mod dlwa;
pub mod engine_bench;
pub mod plot;
pub mod resp_load;
pub mod rpc;
pub mod rpc_figs;
pub mod table;
pub mod vs_clover;
pub mod ycsb;
