//! `shardline`: the server (`serve`), the load generator (`bench`), and client commands.
//!
//! Logs go to stderr (`RUST_LOG` or `--log` filters them); stdout carries only command output, so
//! scripts can parse it; a reader that closes stdout early (`| head -1`) ends the command quietly
//! with exit 0 (`shardline::output`). A write to stderr that fails (a closed pipe, as under `2>&1 | head`) is
//! dropped: logging must never panic, since a panic on the signal watcher or a shard thread would
//! take down what it was logging about.

mod client_cmds;
mod follow;
mod group_cmds;
mod inspect;
mod serve;
mod stream_cmds;

use std::io::Write as _;

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
    /// Run the server until SIGINT, SIGTERM or SIGHUP (each stops it cleanly).
    #[command(after_help = serve::SERVE_AFTER_HELP)]
    Serve(serve::ServeArgs),
    /// Measure throughput per core: produce, then consume and verify every message.
    Bench(shardline::bench::BenchArgs),
    /// Create, delete or list streams (by id or name).
    #[command(subcommand)]
    Stream(stream_cmds::StreamCommand),
    /// Create, delete, alter (retention) or list topics (by id or name).
    #[command(subcommand)]
    Topic(stream_cmds::TopicCommand),
    /// Create, delete or list consumer groups of a topic.
    #[command(subcommand)]
    Group(group_cmds::GroupCommand),
    /// Send messages, one per non-empty line from a file or stdin: to --partition, to the
    /// partition of --key or of each line's --key-field, or batch after batch round-robin over
    /// the topic's partitions.
    Send(client_cmds::SendArgs),
    /// Read messages from a partition: `OFFSET<TAB>PAYLOAD` lines (or --output raw|json).
    Poll(client_cmds::PollArgs),
    /// Print streams, topics, partitions with their owner shard and next offset, and the
    /// replica's view, index, primary and commit number (JSON).
    Metadata(client_cmds::MetadataArgs),
    /// Check a data file offline, read-only: superblock, snapshot, wal, segment, metadata, or a
    /// saved state-transfer manifest or client table (exit 1 on damage).
    Inspect(inspect::InspectArgs),
    /// Check this host before a deployment: io_uring, cores and cgroup quota, NUMA, open-file
    /// limit, the data directory's filesystem and fsync latency (exit 1 when `serve` would fail).
    Doctor(shardline::doctor::DoctorArgs),
    /// Simulate a cluster by seed: the real consensus core against a faulty network, disk and clock.
    Sim(shardline::sim::SimArgs),
}

/// A writer that drops its failures: every write reports the whole buffer written. Log lines are
/// best effort; tracing-subscriber reports a failed write with `eprintln!`, which panics when
/// stderr is the very thing that failed.
#[derive(Debug)]
struct LossyWriter<W>(W);

impl<W: std::io::Write> std::io::Write for LossyWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Err: nowhere left to report it; the line is lost, which is all a log line can lose.
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

/// The process's log subscriber: `filter`, plain or ANSI text, to stderr through a `LossyWriter`.
fn log_subscriber(
    filter: tracing_subscriber::EnvFilter,
    ansi: bool,
) -> impl tracing::Subscriber + Send + Sync + 'static {
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(|| LossyWriter(std::io::stderr()))
        // The writer never fails, and this report would be an `eprintln!` that panics if it did.
        .log_internal_errors(false)
        .finish()
}

fn init_logging(filter: Option<&str>) {
    let filter = filter.map_or_else(
        || tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        tracing_subscriber::EnvFilter::new,
    );
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::util::SubscriberInitExt::init(log_subscriber(filter, ansi));
}

/// `error` as one line: its message, then each cause in the chain whose text the line does not
/// already hold (our `thiserror` variants embed their source in their message; `anyhow` context
/// does not), joined by `: `.
fn error_line(error: &anyhow::Error) -> String {
    let mut line = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, sources) =
        match shardline::config_file::parse_with_config_file::<Cli>(&args, "serve", "config") {
            Ok(parsed) => parsed,
            Err(shardline::config_file::ParseFailure::Clap(error)) => error.exit(),
            Err(shardline::config_file::ParseFailure::File(error)) => {
                // Err: stderr is gone; the exit code still says it failed.
                let _ = writeln!(std::io::stderr(), "error: {error}");
                return std::process::ExitCode::from(2);
            }
            Err(shardline::config_file::ParseFailure::Env(error)) => {
                // Err: as above.
                let _ = writeln!(std::io::stderr(), "error: {error}");
                return std::process::ExitCode::from(2);
            }
        };
    // The simulator's cores log view changes and repairs by the thousand: only warnings and
    // errors unless asked for more.
    let log = match (&cli.command, cli.log.as_deref()) {
        (Command::Sim(_), None) if std::env::var_os("RUST_LOG").is_none() => Some("warn"),
        (_, log) => log,
    };
    init_logging(log);
    let result = match cli.command {
        Command::Serve(args) => serve::run(&args, &sources),
        Command::Bench(args) => shardline::bench::run(&args),
        Command::Stream(command) => stream_cmds::stream(command),
        Command::Topic(command) => stream_cmds::topic(command),
        Command::Group(command) => group_cmds::run(command),
        Command::Send(args) => client_cmds::send(&args),
        Command::Poll(args) => client_cmds::poll(&args),
        Command::Metadata(args) => client_cmds::metadata(&args),
        Command::Inspect(args) => return inspect::run(&args),
        Command::Doctor(args) => match shardline::doctor::run(&args) {
            Ok(code) => return code,
            Err(error) => Err(error),
        },
        Command::Sim(args) => match shardline::sim::run(&args) {
            Ok(0) => Ok(()),
            Ok(_) => return std::process::ExitCode::FAILURE,
            Err(error) => Err(shardline::output::stdout_error(error)),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `shardline metadata | head -1`: the reader has what it wanted.
        Err(error) if shardline::output::is_stdout_closed(&error) => {
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            // Err: stderr is gone; the exit code still says it failed.
            let _ = writeln!(std::io::stderr(), "error: {}", error_line(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    const BROKEN_STDERR_CHILD_ENV: &str = "SHARDLINE_BROKEN_STDERR_CHILD";

    #[derive(Debug, thiserror::Error)]
    enum OpenError {
        #[error("cannot open {path}: {source}")]
        Open {
            path: String,
            source: std::io::Error,
        },
    }

    fn not_a_directory() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::ENOTDIR)
    }

    #[test]
    fn error_line_skips_a_cause_its_message_already_holds() {
        let error = anyhow::Error::new(OpenError::Open {
            path: "/etc/hosts/data".to_owned(),
            source: not_a_directory(),
        })
        .context("cannot start the server");
        assert_eq!(
            error_line(&error),
            "cannot start the server: cannot open /etc/hosts/data: Not a directory (os error 20)"
        );
    }

    #[test]
    fn error_line_appends_a_cause_its_message_lacks() {
        let error = anyhow::Error::new(not_a_directory()).context("cannot create --data-dir x");
        assert_eq!(
            error_line(&error),
            "cannot create --data-dir x: Not a directory (os error 20)"
        );
        assert_eq!(
            error_line(&anyhow::anyhow!("no cause")),
            "no cause",
            "a lone message is printed as is"
        );
    }

    /// Every flag with a `whole_number` parser, given and defaulted: a parser whose type differs
    /// from its field's panics in clap's downcast at parse time, not at build time.
    #[test]
    fn whole_number_flags_parse_into_their_fields() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("shardline").chain(args.iter().copied()))
                .unwrap_or_else(|error| panic!("{args:?}: {error}"))
                .command
        };
        match parse(&["send", "--stream", "1", "--topic", "1"]) {
            Command::Send(args) => assert_eq!((args.batch, args.partition.partition), (100, None)),
            other => panic!("{other:?}"),
        }
        match parse(&[
            "send",
            "--stream",
            "1",
            "--topic",
            "1",
            "--batch",
            "7",
            "--partition",
            "3",
        ]) {
            Command::Send(args) => assert_eq!((args.batch, args.partition.partition), (7, Some(3))),
            other => panic!("{other:?}"),
        }
        match parse(&[
            "poll", "--stream", "1", "--topic", "1", "--offset", "5", "--count", "2",
        ]) {
            Command::Poll(args) => assert_eq!((args.offset, args.count), (Some(5), Some(2))),
            other => panic!("{other:?}"),
        }
        match parse(&["topic", "create", "1", "2", "t", "--partitions", "4096"]) {
            Command::Topic(stream_cmds::TopicCommand::Create {
                topic_id,
                partitions,
                ..
            }) => assert_eq!((topic_id, partitions), (Some(2), 4096)),
            other => panic!("{other:?}"),
        }
        match parse(&["topic", "create", "orders", "t"]) {
            Command::Topic(stream_cmds::TopicCommand::Create {
                topic_id,
                partitions,
                ..
            }) => assert_eq!((topic_id, partitions), (None, 1)),
            other => panic!("{other:?}"),
        }
        match parse(&["stream", "create", "9", "s"]) {
            Command::Stream(stream_cmds::StreamCommand::Create { stream_id, .. }) => {
                assert_eq!(stream_id, Some(9));
            }
            other => panic!("{other:?}"),
        }
    }

    /// `serve`, `sim` and `doctor`, whose range-checking parsers return the field's own type:
    /// defaults and given values both reach their fields.
    #[test]
    fn serve_sim_and_doctor_range_parsers_parse_into_their_fields() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("shardline").chain(args.iter().copied()))
                .unwrap_or_else(|error| panic!("{args:?}: {error}"))
                .command
        };
        match parse(&["serve"]) {
            Command::Serve(args) => {
                let defaults = shards::ServerConfig::new(args.data_dir.clone());
                let config = args.to_config();
                assert_eq!(config.inbox_capacity, defaults.inbox_capacity);
                assert_eq!(config.tick, defaults.tick);
                assert_eq!(config.max_message_size, defaults.max_message_size);
                assert_eq!(
                    config.journal_segment_size_max,
                    defaults.journal_segment_size_max
                );
                config.validate().unwrap();
            }
            other => panic!("{other:?}"),
        }
        match parse(&[
            "serve",
            "--max-message-size",
            "1KiB",
            "--inbox-capacity",
            "7",
            "--segment-size",
            "4KiB",
            "--idle-poll-us",
            "0",
            "--idle-timeout-s",
            "86400",
            "--clients-table-max",
            "3",
            "--parked-polls-max",
            "4",
            "--checkpoint-interval",
            "5",
            "--journal-segment-size",
            "64KiB",
            "--replica",
            "4",
            "--tick-ms",
            "1000",
            "--heartbeat-ticks",
            "1",
            "--view-change-timeout-ticks",
            "1000000",
        ]) {
            Command::Serve(args) => {
                assert_eq!(
                    (
                        args.max_message_size,
                        args.inbox_capacity,
                        args.segment_size,
                        args.idle_poll_us,
                        args.idle_timeout_s,
                        args.clients_table_max,
                        args.parked_polls_max,
                    ),
                    (1024, 7, 4096, 0, 86400, 3, 4)
                );
                assert_eq!(
                    (
                        args.checkpoint_interval,
                        args.journal_segment_size,
                        args.replica,
                        args.tick_ms,
                        args.heartbeat_ticks,
                        args.view_change_timeout_ticks,
                    ),
                    (5, 65536, 4, 1000, 1, 1_000_000)
                );
            }
            other => panic!("{other:?}"),
        }
        match parse(&["sim", "--seed", "0"]) {
            Command::Sim(args) => assert_eq!(
                (
                    args.seed,
                    args.ticks,
                    args.liveness_ticks,
                    args.requests,
                    args.jobs
                ),
                (
                    Some(0),
                    shardline::sim::TICKS_DEFAULT,
                    shardline::sim::LIVENESS_TICKS_DEFAULT,
                    shardline::sim::REQUESTS_DEFAULT,
                    None
                )
            ),
            other => panic!("{other:?}"),
        }
        match parse(&[
            "sim",
            "--seeds",
            "1..3",
            "--ticks",
            "0",
            "--liveness-ticks",
            "100000000",
            "--requests",
            "1000000",
            "--journal-segment-ops",
            "1000000",
            "--jobs",
            "1024",
        ]) {
            Command::Sim(args) => assert_eq!(
                (
                    args.seeds,
                    args.ticks,
                    args.liveness_ticks,
                    args.requests,
                    args.journal_segment_ops,
                    args.jobs
                ),
                (
                    Some(1..3),
                    0,
                    100_000_000,
                    1_000_000,
                    Some(1_000_000),
                    Some(1024)
                )
            ),
            other => panic!("{other:?}"),
        }
        match parse(&["doctor"]) {
            Command::Doctor(args) => {
                assert_eq!(
                    args.partitions,
                    shardline::doctor::limits::PARTITIONS_DEFAULT
                );
            }
            other => panic!("{other:?}"),
        }
        match parse(&["doctor", "--partitions", "1073741824"]) {
            Command::Doctor(args) => assert_eq!(args.partitions, 1 << 30),
            other => panic!("{other:?}"),
        }
    }

    #[derive(Debug)]
    struct BrokenPipe;

    impl std::io::Write for BrokenPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn lossy_writer_reports_a_failed_write_as_written() {
        let mut writer = LossyWriter(BrokenPipe);
        assert_eq!(writer.write(b"line\n").unwrap(), 5);
        writer.write_all(b"line\n").unwrap();
        writer.flush().unwrap();
    }

    /// Only does something in the child of `logging_to_a_closed_stderr_does_not_panic`: logs
    /// through the process's subscriber with stderr a closed pipe, then exits 0.
    #[test]
    fn broken_stderr_child() {
        if std::env::var_os(BROKEN_STDERR_CHILD_ENV).is_none() {
            return;
        }
        let subscriber = log_subscriber(tracing_subscriber::EnvFilter::new("info"), false);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("a line nobody reads");
            tracing::error!("and another");
        });
    }

    #[test]
    fn logging_to_a_closed_stderr_does_not_panic() {
        if std::env::var_os(BROKEN_STDERR_CHILD_ENV).is_some() {
            return;
        }
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::broken_stderr_child",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(BROKEN_STDERR_CHILD_ENV, "1")
            .stdout(std::process::Stdio::null())
            .stderr(writer)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
}
