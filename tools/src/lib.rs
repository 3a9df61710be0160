//! Library half of the `shardline` binary: the subcommands that are more than argument plumbing,
//! and the pieces every subcommand shares (stdout output, `HOST:PORT` arguments).
pub mod arg_values;
pub mod bench;
pub mod config_file;
pub mod doctor;
pub mod env_values;
pub mod listing;
pub mod metrics;
pub mod names;
pub mod output;
pub mod sim;
pub mod value_sources;
