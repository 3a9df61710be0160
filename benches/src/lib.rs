//! Criterion micro-benchmarks live in `benches/benches/`; this library holds what the benchmark
//! binaries share: [`cluster`], three real `serve` replicas on this host, and [`serve_child`],
//! one `serve` with its metrics for the follow measurements, and [`median`] of the figures the
//! binaries report.

pub mod cluster;
pub mod serve_child;

/// The median of `values` (sorted in place; the mean of the two middle values for an even
/// count).
///
/// # Panics
/// If `values` is empty.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        f64::midpoint(values[middle - 1], values[middle])
    }
}
