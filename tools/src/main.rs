//! `shardline`: the server (`serve`), the load generator (`bench`), and client commands.
//!
//! Logs go to stderr (`RUST_LOG` or `--log` filters them); stdout carries only command output, so
//! scripts can parse it.

mod client_cmds;
mod serve;

use clap::{Parser, Subcommand};

/// A thread-per-core streaming-log server: pinned shards that share nothing, one io_uring each.
#[derive(Debug, Parser)]
#[command(name = "shardline", version, propagate_version = true)]
#[command(
    after_help = "Quickstart:\n  shardline bench                      measure an embedded server on all allowed cores\n  shardline serve --data-dir ./data    run a server on 127.0.0.1:8090\n  shardline stream create 1 orders     then: topic create, send, poll, metadata"
)]
struct Cli {
    /// Log filter, e.g. `info`, `debug`, `shards=debug` (overrides RUST_LOG).
    #[arg(long, global = true, env = "SHARDLINE_LOG")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
    /// Measure throughput per core: produce, then consume and verify every message.
    Bench(tools::bench::BenchArgs),
    /// Create or delete streams.
    #[command(subcommand)]
    Stream(client_cmds::StreamCommand),
    /// Create or delete topics.
    #[command(subcommand)]
    Topic(client_cmds::TopicCommand),
    /// Send messages to a partition, one per line from a file or stdin.
    Send(client_cmds::SendArgs),
    /// Read messages from a partition.
    Poll(client_cmds::PollArgs),
    /// Print streams, topics, partitions with their owner shard and next offset (JSON).
    Metadata(client_cmds::AddrArgs),
}

fn init_logging(filter: Option<&str>) {
    let filter = filter.map_or_else(
        || tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        tracing_subscriber::EnvFilter::new,
    );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log.as_deref());
    let result = match cli.command {
        Command::Serve(args) => serve::run(&args),
        Command::Bench(args) => tools::bench::run(&args),
        Command::Stream(command) => client_cmds::stream(command),
        Command::Topic(command) => client_cmds::topic(command),
        Command::Send(args) => client_cmds::send(&args),
        Command::Poll(args) => client_cmds::poll(&args),
        Command::Metadata(args) => client_cmds::metadata(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
