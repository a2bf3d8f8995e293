//! Benchmarks (below).
