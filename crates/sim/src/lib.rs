//! Deterministic whole-cluster simulation of RowanKV and the checks every
//! simulated history must pass.

pub mod check;
pub mod history;
pub mod preempt;
mod rejoin;
pub mod sim;

pub use sim::{expiry_of_value, run, FaultCounts, PlantedBug, RunResult, SimConfig};
