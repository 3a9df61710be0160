//! `shardline bench`: the load generator and its report. Orchestration lives here: one run per
//! requested shard count and repeat (`plan::run_order`: interleaved rounds), each on a fresh
//! embedded server (or on `--addr`), with a produce phase and a consume phase that reads back and
//! verifies every acknowledged message; then the summary and recommendation (`sweep`) and the
//! report files (`--json`, `--csv`, `--charts`, `--compare`), all checked before the first run.
//!
//! The headline figure is messages per server-CPU-second (DESIGN section 12), so it must never
//! count the bench's own CPU: only the server process is measured, from `/proc`.
//!
//! `--workload metadata` (in `metadata.rs`) measures metadata commit latency against a disk
//! baseline instead, on the same servers.

pub mod ack;
pub mod args;
pub mod charts;
pub mod compare;
pub mod cpu;
pub mod csv_report;
pub mod disk_baseline;
pub mod disk_space;
pub mod group;
pub mod host_cpu;
pub mod interrupt;
pub mod json_file;
pub mod limits;
pub mod metadata;
pub mod metadata_report;
pub mod payload;
pub mod phase;
pub mod plan;
pub mod report;
pub mod server;
pub mod sweep;
pub mod verify;
pub mod workload;
pub mod writeback;

use std::io::Write as _;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use anyhow::{Context as _, anyhow, bail};
use bus::{Client, ClientError, ErrorCode};

use self::ack::AckLedger;
use self::json_file::{ChartsDir, JsonReportFile, ReportFile};
use self::payload::PayloadSource;
use self::phase::{PhaseOutcome, latest_finish, progress_bar, run_phase};
use self::plan::ScheduledRun;
use self::report::{
    BenchReport, LATENCY_NOTE, PhaseFigures, PhaseMeasurement, RunReport, new_latency_histogram,
    page_cache_note, per_shard_reports, render_config, render_ratios, render_run,
    render_run_compact,
};
use self::server::EmbeddedServer;
use self::sweep::{CountSummary, Recommendation};
use self::verify::{PartitionVerdict, VerificationSummary};
use self::workload::{ProduceStop, SharedProgress, TopicLayout};

pub use self::args::{BenchArgs, BenchArgsError};
pub use self::plan::{BenchPlan, PayloadChoice, ServerTarget, ShardRequest, Workload};

/// Runs the bench as `args` say: every scheduled run (a table each, or one line each with
/// `--repeat` above 1), then, when more than one run happened, the median and spread per shard
/// count and the recommendation; writes `--json`, `--csv`, `--charts` and prints `--compare`
/// (also after a failed run, for the runs that completed), and fails if any acknowledged message
/// was not read back intact. `--workload metadata` runs [`metadata::run`] instead. A SIGINT
/// during any of it stops the embedded server, removes its run directory and the report outputs
/// this bench created and has not written, and exits 130 (`interrupt`).
///
/// # Errors
/// Invalid arguments (naming the flag and the rule), a `--json` or `--csv` path that cannot be
/// created, a `--charts` directory that cannot be created or written, a `--compare` file that is
/// not a bench report, a `--messages` run whose estimated bytes exceed the data root's free space
/// (`disk_space`; all checked before anything starts), a server that fails to start or stop,
/// a worker's request failing beyond its retry budget, an existing stream on `--addr`, or a failed
/// verification (naming the counts and the first bad partition and offset).
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let plan = args.validate()?;
    interrupt::install()?;
    check_embedded_topology(&plan)?;
    warn_ignored_server_variables(&plan);
    if let Some(root) = &args.data_root {
        // As `serve --data-dir` does: a missing directory is created, not refused.
        std::fs::create_dir_all(root)
            .with_context(|| format!("cannot create --data-root {}", root.display()))?;
    }
    // The load generator builds and verifies megabyte batches too.
    shards::resources::tune_allocator();
    let outputs = Outputs::open(&plan)?;
    if plan.workload == Workload::Metadata {
        // `validate` refuses --csv, --charts and --compare there: only --json is open.
        return metadata::run(&plan, outputs.json);
    }
    let payload = match &plan.payload {
        PayloadChoice::Size(size_bytes) => PayloadSource::fixed(*size_bytes as usize),
        PayloadChoice::File(path) => PayloadSource::from_file(path)?,
    };
    args::check_batch_size(
        plan.batch_message_count,
        payload.payload_len_max(),
        bus::limits::MESSAGE_SIZE_MAX_DEFAULT,
        args::DEFAULT_LIMIT_OWNER,
    )?;
    check_free_space(&plan, &payload)?;
    let schedule = plan.schedule();
    if plan.repeat_count > 1 {
        crate::output::print_line(&sequence_header(&plan, schedule.len()))?;
    }
    let mut runs = Vec::with_capacity(schedule.len());
    for scheduled in schedule {
        let (run, verification) = match run_one(&plan, scheduled, &payload) {
            Ok(outcome) => outcome,
            Err(error) => return Err(outputs.finish_after_failure(&plan, &runs, error)),
        };
        print_run(&plan, &run)?;
        runs.push(run);
        if !verification.is_clean() {
            let error = anyhow!(
                "verification failed with {} shards: {verification}",
                runs.last().map_or(0, |run| run.shards)
            );
            return Err(outputs.finish_after_failure(&plan, &runs, error));
        }
    }
    let (summary, recommendation) = summarize(&plan, &runs);
    if runs.len() > 1 {
        print_summary(&plan, &runs, &summary, recommendation.as_ref())?;
    }
    outputs.finish(&runs, summary, recommendation)
}

/// With the embedded server and `--messages`: refuses a run whose bytes would not fit on the
/// data root's filesystem (`disk_space`). Each run's directory is removed before the next starts,
/// so one run must fit. A `--duration` run has no message count to estimate, and an `--addr`
/// server's disk is not the bench's to measure: neither is checked.
fn check_free_space(plan: &BenchPlan, payload: &PayloadSource) -> anyhow::Result<()> {
    let (ServerTarget::Embedded { data_root, .. }, ProduceStop::MessageCount(message_count)) =
        (&plan.server, plan.stop)
    else {
        return Ok(());
    };
    let root = data_root.clone().unwrap_or_else(std::env::temp_dir);
    // Each producer sends its share, cycling through the payloads from its own message 0.
    let payload_bytes = (0..plan.producer_count)
        .map(|producer_index| {
            payload.payload_bytes(workload::producer_share(
                message_count,
                plan.producer_count,
                producer_index,
            ))
        })
        .fold(0_u64, u64::saturating_add);
    let size = disk_space::RunSize {
        message_count,
        payload_bytes,
        batch_message_count: plan.batch_message_count,
        producer_count: plan.producer_count,
    };
    disk_space::check_fits(&size, disk_space::available_bytes(&root)?, &root)?;
    Ok(())
}

/// The first line of a sequence with `--repeat` above 1, whose runs print one line each.
fn sequence_header(plan: &BenchPlan, run_count: usize) -> String {
    let counts = plan
        .shard_requests
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "== {run_count} runs: shards {counts}, {} rounds of one run per count, each on a fresh \
         server; one line per run (--json holds every figure)",
        plan.repeat_count
    )
}

/// One run's report on stdout: its table, or one line when `--repeat` is above 1 (preceded, for
/// the first run, by the setup and what the latency figures time).
fn print_run(plan: &BenchPlan, run: &RunReport) -> anyhow::Result<()> {
    if plan.repeat_count == 1 {
        return crate::output::print_text(&render_run(run));
    }
    if run.sequence == 0 {
        crate::output::print_line(&format!("config: {}", render_config(&run.config)))?;
        crate::output::print_line(LATENCY_NOTE)?;
    }
    crate::output::print_text(&render_run_compact(run, plan.repeat_count))
}

/// The median and spread per count, and the recommendation (`None` when `runs` is empty or
/// [`sweep::recommend`] finds nothing to choose from).
fn summarize(plan: &BenchPlan, runs: &[RunReport]) -> (Vec<CountSummary>, Option<Recommendation>) {
    if runs.is_empty() {
        return (Vec::new(), None);
    }
    let summary = sweep::summarize(runs);
    let recommendation = sweep::recommend(&summary, plan.efficiency_margin);
    (summary, recommendation)
}

/// After more than one run: the ratios between single runs (without `--repeat`), the summary
/// table and the recommendation line.
fn print_summary(
    plan: &BenchPlan,
    runs: &[RunReport],
    summary: &[CountSummary],
    recommendation: Option<&Recommendation>,
) -> anyhow::Result<()> {
    if plan.repeat_count == 1
        && let Some(ratios) = render_ratios(runs)
    {
        crate::output::print_line(&format!("\n{ratios}"))?;
    }
    // One blank line before the table, whether or not the table starts with one.
    let table = sweep::render_summary(summary);
    crate::output::print_text(&format!("\n{}", table.trim_start_matches('\n')))?;
    if let Some(recommendation) = recommendation {
        crate::output::print_line(&format!("recommendation: {}", recommendation.line))?;
    }
    Ok(())
}

/// The report outputs besides stdout, each checked before the first run so that a bad path
/// fails in a second rather than after a long sweep.
struct Outputs {
    json: Option<JsonReportFile>,
    csv: Option<ReportFile>,
    charts: Option<ChartsDir>,
    compare: Option<compare::Baseline>,
}

impl Outputs {
    /// Opens `--json` and `--csv` (created if missing), creates `--charts` and checks that it
    /// takes files, and loads `--compare`.
    fn open(plan: &BenchPlan) -> anyhow::Result<Outputs> {
        Ok(Outputs {
            json: plan.json.as_deref().map(JsonReportFile::open).transpose()?,
            csv: plan
                .csv
                .as_deref()
                .map(|path| ReportFile::open("--csv", path))
                .transpose()?,
            charts: plan.charts.as_deref().map(ChartsDir::prepare).transpose()?,
            compare: plan
                .compare
                .as_deref()
                .map(compare::load_baseline)
                .transpose()?,
        })
    }

    /// Writes every output for `runs`, and prints the comparison.
    fn finish(
        self,
        runs: &[RunReport],
        summary: Vec<CountSummary>,
        recommendation: Option<Recommendation>,
    ) -> anyhow::Result<()> {
        if let Some(csv) = self.csv {
            csv.write_text(&csv_report::render_csv(runs))?;
        }
        if let Some(dir) = self.charts {
            let shown = dir.path().display().to_string();
            let files = dir.write(|path| charts::write_charts(path, runs, &summary))?;
            crate::output::print_line(&format!("\ncharts: {} SVG files in {shown}", files.len()))?;
        }
        if let Some(baseline) = &self.compare {
            let table = compare::render_comparison(baseline, runs);
            crate::output::print_text(&format!("\n{}", table.trim_start_matches('\n')))?;
        }
        if let Some(json) = self.json {
            json.write(&BenchReport {
                runs: runs.to_vec(),
                summary,
                recommendation,
            })?;
        }
        Ok(())
    }

    /// After a failed run: the outputs for the runs that completed (none: the files this bench
    /// created are removed), then `error`, with any failure to write them added to it.
    fn finish_after_failure(
        self,
        plan: &BenchPlan,
        runs: &[RunReport],
        error: anyhow::Error,
    ) -> anyhow::Error {
        if runs.is_empty() {
            return error;
        }
        let (summary, recommendation) = summarize(plan, runs);
        match self.finish(runs, summary, recommendation) {
            Ok(()) => error,
            Err(output_error) => error.context(format!(
                "and the report of the {} completed runs could not be written: {output_error:#}",
                runs.len()
            )),
        }
    }
}

/// The server of one run: where to connect and whose CPU to measure.
struct RunServer {
    addr: SocketAddr,
    pid: Option<u32>,
    /// The embedded server's data directory; unknown for `--addr`.
    data_dir: Option<PathBuf>,
    embedded: Option<EmbeddedServer>,
}

fn start_server(plan: &BenchPlan, request: ShardRequest) -> anyhow::Result<RunServer> {
    match &plan.server {
        ServerTarget::Embedded { options, data_root } => {
            let exe = std::env::current_exe().context("cannot find the shardline executable")?;
            let server =
                EmbeddedServer::start(&exe, &request.to_string(), options, data_root.as_deref())?;
            Ok(RunServer {
                addr: server.addr(),
                pid: Some(server.pid()),
                data_dir: server.data_dir(),
                embedded: Some(server),
            })
        }
        ServerTarget::External { addr, pid } => {
            if let Some(pid) = pid {
                // Otherwise a wrong pid silently reports 0.00 CPU-seconds.
                let comm_path = format!("/proc/{pid}/comm");
                let comm = std::fs::read_to_string(&comm_path)
                    .with_context(|| format!("--server-pid {pid}: cannot read {comm_path}"))?;
                if comm.trim() != "shardline" {
                    bail!(
                        "--server-pid {pid} is not a shardline process (its command is {:?}); \
                         pass the pid of `shardline serve`",
                        comm.trim()
                    );
                }
            }
            let resolved = addr
                .to_socket_addrs()
                .with_context(|| format!("--addr {addr}: cannot resolve"))?
                .next()
                .with_context(|| format!("--addr {addr}: resolves to no address"))?;
            Ok(RunServer {
                addr: resolved,
                pid: *pid,
                data_dir: None,
                embedded: None,
            })
        }
    }
}

fn run_one(
    plan: &BenchPlan,
    scheduled: ScheduledRun,
    payload: &PayloadSource,
) -> anyhow::Result<(RunReport, VerificationSummary)> {
    let request = scheduled.request;
    let mut server = start_server(plan, request)?;
    // Checked before the stream is created, so a refused run leaves nothing behind.
    check_external_shard_count(plan, request, server.addr)?;
    check_external_frame_limit(plan, server.addr, payload)?;
    let measured = setup_topic(server.addr, plan).and_then(|layout| {
        let measured = measure(plan, &server, &layout, payload)?;
        Ok((layout, measured))
    });
    let (layout, measured) = match (measured, server.embedded.take()) {
        (Ok(measured), Some(embedded)) => {
            embedded.stop()?;
            measured
        }
        (Ok(measured), None) => measured,
        // The server's log usually says why requests failed (a panic, a full disk): keep it.
        (Err(error), Some(embedded)) => return Err(error.context(embedded.abandon())),
        (Err(error), None) => return Err(error),
    };
    Ok(build_report(
        plan,
        scheduled,
        &server_label(plan),
        &server,
        &layout,
        payload,
        &measured,
    ))
}

/// With `--addr` and a `--shards` count: fails unless the server runs that many shards.
fn check_external_shard_count(
    plan: &BenchPlan,
    request: ShardRequest,
    server_addr: SocketAddr,
) -> anyhow::Result<()> {
    if let (ShardRequest::Count(count), ServerTarget::External { addr, .. }) =
        (request, &plan.server)
    {
        let shard_count = server_shard_count(server_addr)?;
        if count != shard_count {
            bail!("--shards {count} but the server at {addr} runs {shard_count} shards");
        }
    }
    Ok(())
}

/// Without `--addr`: fails unless the embedded server can place every `--shards` entry, by the
/// rule `serve` applies (`runtime::Topology`: without `--no-pin`, no more shards than allowed
/// cores), before any server is started or directory created.
fn check_embedded_topology(plan: &BenchPlan) -> anyhow::Result<()> {
    let ServerTarget::Embedded { options, .. } = &plan.server else {
        return Ok(());
    };
    let cpus = options
        .cpus
        .as_deref()
        .map(str::parse::<runtime::CpuList>)
        .transpose()?;
    for request in &plan.shard_requests {
        let shards = match request {
            ShardRequest::All => runtime::ShardCountArg::All,
            ShardRequest::Count(count) => runtime::ShardCountArg::Count(*count),
        };
        runtime::Topology::resolve(&runtime::TopologyConfig {
            shards,
            cpus: cpus.clone(),
            pin: !options.no_pin,
        })?;
    }
    Ok(())
}

/// With the embedded server: one line on stderr naming the `SHARDLINE_*` variables its child is
/// started without (`server::ignored_server_variables`) and the bench flag for each. An `--addr`
/// server is not the bench's child: nothing is said.
fn warn_ignored_server_variables(plan: &BenchPlan) {
    if !matches!(plan.server, ServerTarget::Embedded { .. }) {
        return;
    }
    let ignored = server::ignored_server_variables(std::env::vars_os());
    if let Some(line) = server::ignored_variables_line(&ignored) {
        // Err: stderr is gone (a closed pipe); the line is only informative.
        let _ = writeln!(std::io::stderr(), "{line}");
    }
}

/// With `--addr`: fails unless one batch's request frame fits the server's `--max-message-size`
/// (asked with a Ping), before the bench stream is created.
fn check_external_frame_limit(
    plan: &BenchPlan,
    server_addr: SocketAddr,
    payload: &PayloadSource,
) -> anyhow::Result<()> {
    let ServerTarget::External { addr, .. } = &plan.server else {
        return Ok(());
    };
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    let server_limit = runtime.block_on(async {
        let mut client = Client::connect(server_addr)
            .await
            .context("cannot reach the server")?;
        client
            .server_max_message_size()
            .await
            .context("cannot ask the server for its --max-message-size")
    })?;
    if let Some(limit) = server_limit {
        args::check_batch_size(
            plan.batch_message_count,
            payload.payload_len_max(),
            limit,
            &format!("the server at {addr}'s"),
        )?;
    }
    Ok(())
}

fn server_label(plan: &BenchPlan) -> String {
    match &plan.server {
        ServerTarget::Embedded { .. } => "embedded".to_string(),
        ServerTarget::External { addr, .. } => addr.clone(),
    }
}

/// The shard count a running server reports.
fn server_shard_count(addr: SocketAddr) -> anyhow::Result<u16> {
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(async {
        let mut client = Client::connect(addr)
            .await
            .context("cannot reach the server")?;
        let metadata = client
            .get_metadata()
            .await
            .context("cannot read the metadata")?;
        Ok(metadata.shard_count)
    })
}

/// Creates the bench stream and topic and reads back their layout.
fn setup_topic(addr: SocketAddr, plan: &BenchPlan) -> anyhow::Result<TopicLayout> {
    const TOPIC_ID: u16 = 1;
    let stream_id = plan.stream_id;
    let stream_name = if stream_id == 1 {
        "bench".to_string()
    } else {
        format!("bench-{stream_id}")
    };
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(async {
        let mut client = Client::connect(addr)
            .await
            .context("cannot reach the server")?;
        match client.create_stream(stream_id, &stream_name).await {
            Err(ClientError::Server {
                code: ErrorCode::StreamAlreadyExists,
                message,
            }) => bail!(
                "{message} on {addr}; the bench needs a fresh stream (it names stream N \
                 \"bench-N\"): pass --stream-id with an unused id"
            ),
            result => result.with_context(|| format!("cannot create stream {stream_id}"))?,
        }
        client
            .create_topic(stream_id, TOPIC_ID, "bench", plan.partition_count)
            .await
            .with_context(|| format!("cannot create topic {stream_id}/{TOPIC_ID}"))?;
        let metadata = client
            .get_metadata()
            .await
            .context("cannot read the metadata")?;
        let topic = metadata
            .streams
            .iter()
            .find(|stream| stream.stream_id == stream_id)
            .and_then(|stream| {
                stream
                    .topics
                    .iter()
                    .find(|topic| topic.topic_id == TOPIC_ID)
            })
            .with_context(|| format!("the metadata lacks topic {stream_id}/{TOPIC_ID}"))?;
        let mut partitions = topic.partitions.clone();
        partitions.sort_by_key(|partition| partition.partition_id);
        anyhow::ensure!(
            partitions.len() == plan.partition_count as usize,
            "topic {stream_id}/{TOPIC_ID} has {} partitions, {} were asked for",
            partitions.len(),
            plan.partition_count
        );
        if let Some(bad) = partitions
            .iter()
            .find(|partition| partition.owner_shard >= metadata.shard_count)
        {
            bail!(
                "partition {} is owned by shard {} of {}",
                bad.partition_id,
                bad.owner_shard,
                metadata.shard_count
            );
        }
        Ok(TopicLayout {
            stream_id,
            topic_id: TOPIC_ID,
            partitions,
            shard_count: metadata.shard_count,
        })
    })
}

/// Everything one run measured.
struct Measured {
    produce: PhaseMeasurement,
    consume: PhaseMeasurement,
    verdicts: Vec<PartitionVerdict>,
}

/// Runs the produce and consume phases (or both at once with `--concurrent`).
fn measure(
    plan: &BenchPlan,
    server: &RunServer,
    layout: &TopicLayout,
    payload: &PayloadSource,
) -> anyhow::Result<Measured> {
    let ledger = AckLedger::new(layout.partitions.len());
    let progress = SharedProgress::default();
    let state = (layout, payload, &ledger, &progress);
    let total = match plan.stop {
        ProduceStop::MessageCount(count) => Some(count),
        ProduceStop::Duration(_) => None,
    };
    let (produce_outcome, consume_outcome) = if plan.concurrent {
        let bar = progress_bar("verified", total);
        let outcome = run_phase(
            plan,
            server.addr,
            server.pid,
            state,
            (plan.producer_count, plan.consumer_count),
            server.data_dir.as_deref(),
            &bar,
        );
        bar.finish_and_clear();
        let outcome = outcome?;
        let started_at = outcome.started_at;
        let consume = PhaseOutcome {
            producers: Vec::new(),
            consumers: outcome.consumers,
            started_at,
            cpu: None,
            host_cpu: None,
            writeback_flush: None,
        };
        (
            PhaseOutcome {
                consumers: Vec::new(),
                ..outcome
            },
            consume,
        )
    } else {
        let bar = progress_bar("produce", total);
        let produce = run_phase(
            plan,
            server.addr,
            server.pid,
            state,
            (plan.producer_count, 0),
            server.data_dir.as_deref(),
            &bar,
        );
        bar.finish_and_clear();
        let produce = produce?;
        progress.producers_done.store(true, Ordering::Release);
        let bar = progress_bar(
            "consume",
            Some(progress.messages_acked.load(Ordering::Relaxed)),
        );
        let consume = match plan.consumer_group {
            Some(mode) => {
                group::run_group_consume(plan, mode, server.addr, server.pid, state, &bar)
            }
            None => run_phase(
                plan,
                server.addr,
                server.pid,
                state,
                (0, plan.consumer_count),
                None,
                &bar,
            ),
        };
        bar.finish_and_clear();
        let consume = consume?;
        (produce, consume)
    };

    let partition_count = layout.partitions.len();
    let mut produce_latency = new_latency_histogram();
    for outcome in &produce_outcome.producers {
        produce_latency
            .add(&outcome.latency_us)
            .context("cannot merge latency histograms")?;
    }
    let produce_per_partition: Vec<(u64, u64)> = (0..partition_count)
        .map(|index| {
            ledger
                .ranges(index)
                .iter()
                .fold((0, 0), |(count, bytes), range| {
                    (
                        count + u64::from(range.message_count),
                        bytes + range.payload_bytes,
                    )
                })
        })
        .collect();
    let produce = PhaseMeasurement {
        elapsed: latest_finish(
            produce_outcome
                .producers
                .iter()
                .map(|outcome| outcome.finished_at),
            produce_outcome.started_at,
        ),
        message_count: produce_per_partition.iter().map(|(count, _)| count).sum(),
        payload_bytes: produce_per_partition.iter().map(|(_, bytes)| bytes).sum(),
        cpu: produce_outcome.cpu,
        host_cpu: produce_outcome.host_cpu,
        writeback_flush: produce_outcome.writeback_flush,
        latency_us: produce_latency,
        per_partition: produce_per_partition,
        busy_retry_count: produce_outcome
            .producers
            .iter()
            .map(|outcome| outcome.busy_retry_count)
            .sum(),
    };

    let mut consume_latency = new_latency_histogram();
    let mut consume_per_partition = vec![(0, 0); partition_count];
    let mut verdicts = Vec::with_capacity(partition_count);
    for outcome in &consume_outcome.consumers {
        consume_latency
            .add(&outcome.latency_us)
            .context("cannot merge latency histograms")?;
        for partition in &outcome.partitions {
            consume_per_partition[partition.partition_index] = (
                partition.verdict.verified_count,
                partition.verified_payload_bytes,
            );
            verdicts.push(partition.verdict.clone());
        }
    }
    let consume = PhaseMeasurement {
        elapsed: latest_finish(
            consume_outcome
                .consumers
                .iter()
                .map(|outcome| outcome.finished_at),
            consume_outcome.started_at,
        ),
        message_count: consume_per_partition.iter().map(|(count, _)| count).sum(),
        payload_bytes: consume_per_partition.iter().map(|(_, bytes)| bytes).sum(),
        cpu: consume_outcome.cpu,
        host_cpu: consume_outcome.host_cpu,
        writeback_flush: consume_outcome.writeback_flush,
        latency_us: consume_latency,
        per_partition: consume_per_partition,
        busy_retry_count: consume_outcome
            .consumers
            .iter()
            .map(|outcome| outcome.busy_retry_count)
            .sum(),
    };
    Ok(Measured {
        produce,
        consume,
        verdicts,
    })
}

fn build_report(
    plan: &BenchPlan,
    scheduled: ScheduledRun,
    server_label: &str,
    server: &RunServer,
    layout: &TopicLayout,
    payload: &PayloadSource,
    measured: &Measured,
) -> (RunReport, VerificationSummary) {
    let summary = VerificationSummary::from_verdicts(&measured.verdicts);
    let pid = server.pid;
    let cpu_note = match (pid, plan.concurrent) {
        (None, _) => Some(
            "CPU figures are n/a: the server's pid is unknown (pass --server-pid with --addr)"
                .to_string(),
        ),
        (Some(_), true) => Some(
            "--concurrent: CPU is measured once over both phases and reported under produce"
                .to_string(),
        ),
        (Some(_), false) => None,
    };
    let partition_ids: Vec<u16> = layout.partitions.iter().map(|p| p.partition_id).collect();
    let owners: Vec<u16> = layout.partitions.iter().map(|p| p.owner_shard).collect();
    let report = RunReport {
        shards: layout.shard_count,
        messages_sent: measured.produce.message_count,
        messages_verified: summary.verified_count,
        messages_lost: summary.lost_count,
        produce: PhaseFigures::from_measurement(&measured.produce),
        consume: PhaseFigures::from_measurement(&measured.consume),
        per_shard: per_shard_reports(
            layout.shard_count,
            &partition_ids,
            &owners,
            &measured.produce,
            &measured.consume,
        ),
        config: plan.run_config(
            scheduled.request,
            server_label,
            pid,
            payload,
            cpu_note,
            server.data_dir.as_deref(),
        ),
        repeat: scheduled.repeat,
        sequence: scheduled.sequence,
        page_cache_note: page_cache_note(measured.produce.payload_bytes, scheduled.sequence),
    };
    (report, summary)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use std::path::Path;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn plan(flags: &[&str]) -> BenchPlan {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).unwrap().bench.validate().unwrap()
    }

    fn read_json(path: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn after_a_failed_run_the_report_files_hold_the_completed_runs() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("j.json");
        let csv = dir.path().join("c.csv");
        let plan = plan(&[
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
        ]);
        let outputs = Outputs::open(&plan).unwrap();
        // Opened before the first run: both exist, empty, while the runs go.
        assert_eq!(std::fs::read_to_string(&json).unwrap(), "");
        assert_eq!(std::fs::read_to_string(&csv).unwrap(), "");
        let runs = [
            sweep::fixtures::run(1, 1, 0, 1000.0, Some(500.0)),
            sweep::fixtures::run(2, 1, 1, 1900.0, Some(475.0)),
        ];
        let error = outputs.finish_after_failure(
            &plan,
            &runs,
            anyhow!("verification failed with 2 shards: x"),
        );
        assert_eq!(format!("{error:#}"), "verification failed with 2 shards: x");
        let report = read_json(&json);
        assert_eq!(report["runs"].as_array().unwrap().len(), 2);
        assert_eq!(report["summary"].as_array().unwrap().len(), 2);
        assert_eq!(report["recommendation"]["shards"], 2, "{report:#}");
        // A header and one row per run and phase.
        assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 5);
    }

    #[test]
    fn a_failure_before_any_run_completes_leaves_no_report_file() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("j.json");
        let csv = dir.path().join("c.csv");
        let charts = dir.path().join("out").join("charts");
        let plan = plan(&[
            "--json",
            json.to_str().unwrap(),
            "--csv",
            csv.to_str().unwrap(),
            "--charts",
            charts.to_str().unwrap(),
        ]);
        let outputs = Outputs::open(&plan).unwrap();
        assert!(charts.is_dir());
        let error = outputs.finish_after_failure(&plan, &[], anyhow!("the server did not start"));
        assert_eq!(error.to_string(), "the server did not start");
        assert!(!json.exists());
        assert!(!csv.exists());
        assert!(!dir.path().join("out").exists());
    }

    #[test]
    fn the_charts_dir_is_created_and_left_empty_before_the_runs() {
        let dir = tempfile::tempdir().unwrap();
        let charts = dir.path().join("a").join("charts");
        let prepared = ChartsDir::prepare(&charts).unwrap();
        assert_eq!(prepared.path(), charts);
        assert_eq!(std::fs::read_dir(&charts).unwrap().count(), 0);
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            format!("{:#}", ChartsDir::prepare(&file).unwrap_err()),
            format!(
                "cannot create --charts {}: File exists (os error 17)",
                file.display()
            )
        );
    }

    #[test]
    fn an_unwritable_json_path_fails_before_any_server_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("x.json");
        // Nothing listens on port 1: a bench that got as far as the server would fail connecting.
        let args = Cli::try_parse_from([
            "bench",
            "--addr",
            "127.0.0.1:1",
            "--json",
            path.to_str().unwrap(),
        ])
        .unwrap()
        .bench;
        let error = run(&args).unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!(
                "cannot create --json {}: No such file or directory (os error 2)",
                path.display()
            )
        );
    }
}
