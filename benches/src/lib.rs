//! Criterion micro-benchmarks live in `benches/benches/`; this library holds what the benchmark
//! binaries share: [`cluster`], three real `serve` replicas on this host, and [`serve_child`],
//! one `serve` with its metrics for the follow measurements.

pub mod cluster;
pub mod serve_child;
