//! Criterion micro-benchmarks live in `benches/benches/`; this library holds what the benchmark
//! binaries share: [`cluster`], three real `serve` replicas on this host.

pub mod cluster;
