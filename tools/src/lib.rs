//! Library half of the `shardline` binary: the subcommands that are more than argument plumbing.
pub mod bench;
