//! Criterion micro-benchmarks live in `benches/benches/`; this library is empty.
