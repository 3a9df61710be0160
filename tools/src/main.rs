//! The `shardline` binary.
fn main() {}
