//! `bench --csv FILE`: one row per run and phase, with a header (issue 10 section 2).
//!
//! Pure formatting of figures already in the reports (the `csv` crate does the quoting); must
//! never compute a figure the report does not hold: an absent figure is an empty cell.

use std::path::Path;

use anyhow::Context as _;

use super::report::{PhaseFigures, RunConfig, RunReport};

/// The CSV columns, in order. Units are in the names (`_us`, `_seconds`, `mb` = 10^6 payload
/// bytes); `messages` is the phase's acknowledged (produce) or verified (consume) count. New
/// columns go at the end, so that readers of the older ones by position keep working.
pub const CSV_COLUMNS: [&str; 36] = [
    "sequence",
    "repeat",
    "shards",
    "shards_requested",
    "phase",
    "messages",
    "elapsed_seconds",
    "msgs_per_sec",
    "mb_per_sec",
    "shard_cpu_seconds",
    "io_worker_cpu_seconds",
    "server_cpu_seconds",
    "msgs_per_server_cpu_second",
    "msgs_per_shard_cpu_second",
    "host_cpu_seconds",
    "host_cpu_seconds_per_gb",
    "load_generator_cpu_seconds",
    "writeback_flush_seconds",
    "latency_us_p50",
    "latency_us_p90",
    "latency_us_p99",
    "latency_us_p999",
    "latency_us_max",
    "busy_retries",
    "messages_lost",
    "page_cache_note",
    "cpu_note",
    "fsync",
    "payload",
    "producers",
    "consumers",
    "partitions",
    "batch_messages",
    "concurrent",
    "server",
    "write_mode",
];

fn optional(value: Option<f64>) -> String {
    value.map(|value| value.to_string()).unwrap_or_default()
}

/// The row of one phase of `run`, in [`CSV_COLUMNS`] order.
fn phase_row(run: &RunReport, phase: &str, figures: &PhaseFigures, messages: u64) -> Vec<String> {
    let config = &run.config;
    let latency = figures.latency_us;
    vec![
        run.sequence.to_string(),
        run.repeat.to_string(),
        run.shards.to_string(),
        config.shards_requested.clone(),
        phase.to_string(),
        messages.to_string(),
        figures.elapsed_seconds.to_string(),
        figures.msgs_per_sec.to_string(),
        figures.mb_per_sec.to_string(),
        optional(figures.shard_cpu_seconds),
        optional(figures.io_worker_cpu_seconds),
        optional(figures.server_cpu_seconds),
        optional(figures.msgs_per_server_cpu_second),
        optional(figures.msgs_per_shard_cpu_second),
        optional(figures.host_cpu_seconds),
        optional(figures.host_cpu_seconds_per_gb),
        optional(figures.load_generator_cpu_seconds),
        optional(figures.writeback_flush_seconds),
        latency.p50.to_string(),
        latency.p90.to_string(),
        latency.p99.to_string(),
        latency.p999.to_string(),
        latency.max.to_string(),
        figures.busy_retries.to_string(),
        run.messages_lost.to_string(),
        run.page_cache_note.clone().unwrap_or_default(),
        config.cpu_note.clone().unwrap_or_default(),
        config.fsync.clone(),
        config.payload.clone(),
        config.producers.to_string(),
        config.consumers.to_string(),
        config.partitions.to_string(),
        config.batch_messages.to_string(),
        config.concurrent.to_string(),
        config.server.clone(),
        write_mode_cell(config),
    ]
}

/// The `write_mode` cell, as the report's config line states it: `--write-mode` as given, the
/// server default (`buffered`) for an embedded server without it, empty for a running server
/// (`--addr`, whose mode is its own and unknown here).
fn write_mode_cell(config: &RunConfig) -> String {
    match (&config.write_mode, config.data_dir.is_some()) {
        (Some(mode), _) => mode.clone(),
        (None, true) => storage::WriteMode::default().to_string(),
        (None, false) => String::new(),
    }
}

/// The CSV text: the [`CSV_COLUMNS`] header, then one row per (run, phase): each run's produce
/// row, then its consume row, in the order of `runs`.
pub fn render_csv(runs: &[RunReport]) -> String {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer
        .write_record(CSV_COLUMNS)
        .expect("writing to memory cannot fail");
    for run in runs {
        for (phase, figures, messages) in [
            ("produce", &run.produce, run.messages_sent),
            ("consume", &run.consume, run.messages_verified),
        ] {
            let row = phase_row(run, phase, figures, messages);
            assert_eq!(row.len(), CSV_COLUMNS.len());
            writer
                .write_record(&row)
                .expect("writing to memory cannot fail");
        }
    }
    let bytes = writer.into_inner().expect("flushing to memory cannot fail");
    String::from_utf8(bytes).expect("every cell is a Rust string")
}

/// Writes [`render_csv`] to `path` (replacing it).
///
/// # Errors
/// The path cannot be written (named in the error).
pub fn write_csv(path: &Path, runs: &[RunReport]) -> anyhow::Result<()> {
    std::fs::write(path, render_csv(runs))
        .with_context(|| format!("cannot write --csv {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::super::sweep::fixtures::runs;
    use super::*;

    /// README's column table (Benchmarking) lists exactly [`CSV_COLUMNS`], in order.
    #[test]
    fn the_readme_lists_every_column_in_order() {
        let readme = include_str!("../../../README.md");
        let table = readme
            .split("| # | Column | Meaning |")
            .nth(1)
            .expect("README has the CSV column table");
        let listed: Vec<&str> = table
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .flat_map(|line| {
                let names = line.split('|').nth(2).unwrap_or_default();
                names
                    .split(',')
                    .map(|name| name.trim().trim_matches('`'))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(listed, CSV_COLUMNS);
    }

    fn parse(text: &str) -> (Vec<String>, Vec<csv::StringRecord>) {
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let header = reader
            .headers()
            .unwrap()
            .iter()
            .map(str::to_string)
            .collect();
        let rows = reader.records().collect::<Result<_, _>>().unwrap();
        (header, rows)
    }

    #[test]
    fn csv_has_a_header_and_one_row_per_run_and_phase() {
        let mut reports = runs(&[
            (1, &[(100_000.0, Some(50_000.0)), (110_000.0, None)]),
            (2, &[(190_000.0, Some(48_000.0))]),
        ]);
        reports[0].page_cache_note = Some("first run of the sequence, cold cache".to_string());
        let (header, rows) = parse(&render_csv(&reports));
        assert_eq!(header, CSV_COLUMNS);
        assert_eq!(rows.len(), 6);
        let column = |name: &str| CSV_COLUMNS.iter().position(|c| *c == name).unwrap();
        let cells = |row: usize, names: &[&str]| -> Vec<String> {
            names
                .iter()
                .map(|name| rows[row][column(name)].to_string())
                .collect()
        };
        let key = ["sequence", "repeat", "shards", "phase", "msgs_per_sec"];
        assert_eq!(cells(0, &key), ["0", "1", "1", "produce", "100000"]);
        assert_eq!(cells(1, &key), ["0", "1", "1", "consume", "200000"]);
        assert_eq!(cells(2, &key), ["1", "2", "1", "produce", "110000"]);
        assert_eq!(cells(5, &key), ["2", "1", "2", "consume", "380000"]);
        assert_eq!(
            cells(
                0,
                &["msgs_per_server_cpu_second", "latency_us_p99", "messages"]
            ),
            ["50000", "400", "1000000"]
        );
        // 20 server CPU-s, 25 host CPU-s over 10^9 payload bytes.
        assert_eq!(
            cells(
                0,
                &[
                    "host_cpu_seconds",
                    "host_cpu_seconds_per_gb",
                    "load_generator_cpu_seconds"
                ]
            ),
            ["25", "25", "20"]
        );
        // Absent figures and notes are empty cells, and a note with a comma survives quoting.
        assert_eq!(
            cells(
                2,
                &[
                    "server_cpu_seconds",
                    "msgs_per_server_cpu_second",
                    "page_cache_note"
                ]
            ),
            ["", "", ""]
        );
        assert_eq!(
            cells(0, &["page_cache_note", "fsync", "payload"]),
            ["first run of the sequence, cold cache", "never", "1000 B"]
        );
    }

    /// The write mode, as JSON and `--compare` carry it, is the last column (appended so that
    /// readers of the older columns by position keep working): `--write-mode` as given, the
    /// server default `buffered` for an embedded server without it, empty for a running server
    /// (`--addr`: its mode is its own, unknown here).
    #[test]
    fn csv_ends_with_the_write_mode() {
        assert_eq!(CSV_COLUMNS.last(), Some(&"write_mode"));
        let mut reports = runs(&[(1, &[(1.0, None)]), (2, &[(1.0, None)])]);
        reports.extend(runs(&[(4, &[(1.0, None)])]));
        reports[0].config.write_mode = Some("direct".to_string());
        reports[1].config.data_dir = Some("/tmp/shardline-bench-x".to_string());
        reports[2].config.data_dir = None;
        let (_, rows) = parse(&render_csv(&reports));
        let last: Vec<&str> = rows.iter().map(|row| &row[row.len() - 1]).collect();
        assert_eq!(
            last,
            ["direct", "direct", "buffered", "buffered", "", ""],
            "produce and consume rows of each run"
        );
    }

    #[test]
    fn csv_of_no_runs_is_the_header_alone() {
        let (header, rows) = parse(&render_csv(&[]));
        assert_eq!(header, CSV_COLUMNS);
        assert!(rows.is_empty());
    }

    #[test]
    fn write_csv_names_a_path_it_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("x.csv");
        let error = write_csv(&path, &[]).unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!(
                "cannot write --csv {}: No such file or directory (os error 2)",
                path.display()
            )
        );
        let good = dir.path().join("x.csv");
        write_csv(&good, &runs(&[(1, &[(1.0, None)])])).unwrap();
        assert_eq!(std::fs::read_to_string(good).unwrap().lines().count(), 3);
    }
}
