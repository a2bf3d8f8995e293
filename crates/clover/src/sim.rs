//! Simulation (below).
