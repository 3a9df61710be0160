//! `shardline bench --shards LIST --repeat K` end to end: the real binary with a tiny workload,
//! checking the run order, the one-line-per-run report, the summary and recommendation, the
//! `--json` fields and that `--csv` and `--charts` were written (their contents are tested beside
//! their modules), and that bad report paths fail before any server starts. Never asserts a
//! timing.

mod common;

use common::{bench, path_arg, text};

use serde_json::Value;

/// The tiny workload: two producers and consumers, 20 000 messages of 100 bytes, no fsync.
const TINY: [&str; 10] = [
    "--no-pin",
    "--messages",
    "20000",
    "--message-size",
    "100",
    "--batch",
    "100",
    "--fsync",
    "never",
    "--partitions=2",
];

#[test]
fn repeated_counts_run_in_rounds_and_end_with_a_summary_and_every_report_file() {
    let dir = tempfile::tempdir().unwrap();
    let data_root = dir.path().join("data");
    let json = dir.path().join("sweep.json");
    let csv = dir.path().join("sweep.csv");
    let charts = dir.path().join("charts");
    let mut args = vec!["--shards", "1,2", "--repeat", "2"];
    args.extend(TINY);
    args.extend([
        "--data-root",
        path_arg(&data_root),
        "--json",
        path_arg(&json),
        "--csv",
        path_arg(&csv),
        "--charts",
        path_arg(&charts),
    ]);
    let output = bench(&args);
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );

    // Interleaved rounds, one line per run.
    assert!(
        stdout.starts_with(
            "== 4 runs: shards 1,2, 2 rounds of one run per count, each on a fresh server; one \
             line per run (--json holds every figure)\n"
        ),
        "{stdout}"
    );
    let run_lines: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("run "))
        .collect();
    let prefixes = [
        "run 1: shards=1 repeat 1/2 | produce ",
        "run 2: shards=2 repeat 1/2 | produce ",
        "run 3: shards=1 repeat 2/2 | produce ",
        "run 4: shards=2 repeat 2/2 | produce ",
    ];
    assert_eq!(run_lines.len(), prefixes.len(), "{stdout}");
    for (line, prefix) in run_lines.iter().zip(prefixes) {
        assert!(
            line.starts_with(prefix) && line.ends_with(" | lost 0"),
            "{line}"
        );
        // Both phases carry the host figures (issue 12 item 4).
        assert_eq!(line.matches(" host-cpu ").count(), 2, "{line}");
        assert_eq!(line.matches(" host-s/GB p99 ").count(), 2, "{line}");
    }
    assert!(
        stdout.contains(
            "\nhost CPU (CPU-seconds of the whole host less the bench's own; s/GB per 10^9 \
             payload bytes; median [min..max])\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("\nconfig: server=embedded producers=2 consumers=2 partitions=2"),
        "{stdout}"
    );
    // A tiny run never crosses the page-cache threshold.
    assert!(!stdout.contains("page cache:"), "{stdout}");

    // The JSON: every run with its labels, the summary per count, the recommendation.
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let labels: Vec<(u64, u64, u64)> = runs
        .iter()
        .map(|run| {
            (
                run["shards"].as_u64().unwrap(),
                run["repeat"].as_u64().unwrap(),
                run["sequence"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(labels, [(1, 1, 0), (2, 1, 1), (1, 2, 2), (2, 2, 3)]);
    for run in runs {
        assert_eq!(run["messages_verified"], 20_000, "{run:#}");
        assert!(run["page_cache_note"].is_null(), "{run:#}");
    }

    // Host CPU (issue 12 item 4) in every phase: never negative, per GB of the phase's 2 * 10^6
    // payload bytes, and the bench's own CPU beside it.
    let mut produce_host_cpu_seconds = 0.0;
    for run in runs {
        for phase in [run, &run["consume"]] {
            let host = phase["host_cpu_seconds"].as_f64().unwrap();
            let per_gb = phase["host_cpu_seconds_per_gb"].as_f64().unwrap();
            let own = phase["load_generator_cpu_seconds"].as_f64().unwrap();
            assert!(host >= 0.0 && own >= 0.0, "{run:#}");
            assert!(
                (per_gb - host / 0.002).abs() <= 1e-6 * per_gb.max(1.0),
                "{run:#}"
            );
        }
        produce_host_cpu_seconds += run["host_cpu_seconds"].as_f64().unwrap();
        // The produce window ended with a syncfs of the embedded server's data directory; the
        // consume phase flushes nothing.
        let flush_seconds = run["writeback_flush_seconds"].as_f64().unwrap();
        assert!(flush_seconds >= 0.0, "{run:#}");
        assert!(
            run["consume"]["writeback_flush_seconds"].is_null(),
            "{run:#}"
        );
    }
    // The server appended 80 000 messages over the four produce phases: the host was busy.
    assert!(produce_host_cpu_seconds > 0.0, "{report:#}");
    let summary = report["summary"].as_array().unwrap();
    let counts: Vec<(u64, u64)> = summary
        .iter()
        .map(|count| {
            (
                count["shards"].as_u64().unwrap(),
                count["produce_msgs_per_sec"]["runs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [(1, 2), (2, 2)]);

    // The recommendation needs a 1-shard CPU figure, which a tiny run may round to zero kernel
    // ticks: either way the text and the JSON agree.
    let recommendation_lines: Vec<&str> = stdout
        .lines()
        .filter(|line| line.starts_with("recommendation: "))
        .collect();
    if let Some(line) = report["recommendation"]["line"].as_str() {
        assert_eq!(recommendation_lines, [format!("recommendation: {line}")]);
        let shards = report["recommendation"]["shards"].as_u64().unwrap();
        assert!([1, 2].contains(&shards), "{report:#}");
        assert!(line.starts_with(&format!("{shards} shard")), "{line}");
    } else {
        assert!(report["recommendation"].is_null(), "{report:#}");
        assert!(recommendation_lines.is_empty(), "{stdout}");
        assert!(stdout.contains("no recommendation"), "{stdout}");
    }

    // The files exist; their contents are tested beside `csv_report` and `charts`, except the
    // host CPU columns, checked here against the JSON.
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let mut csv_lines = csv_text.lines();
    let header: Vec<&str> = csv_lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|cell| *cell == name).unwrap();
    let host_column = column("host_cpu_seconds");
    let per_gb_column = column("host_cpu_seconds_per_gb");
    let own_column = column("load_generator_cpu_seconds");
    let flush_column = column("writeback_flush_seconds");
    let rows: Vec<Vec<&str>> = csv_lines.map(|line| line.split(',').collect()).collect();
    assert_eq!(rows.len(), 8, "{csv_text}");
    // The write mode is the last column (appended for old readers): the embedded server's
    // default, as the JSON's config line says.
    assert_eq!(header.last(), Some(&"write_mode"), "{csv_text}");
    for row in &rows {
        assert_eq!(row.last(), Some(&"buffered"), "{csv_text}");
    }
    for row in &rows {
        for index in [host_column, per_gb_column, own_column] {
            let value: f64 = row[index].parse().unwrap();
            assert!(value >= 0.0, "{csv_text}");
        }
    }
    let csv_produce_host: f64 = rows
        .iter()
        .step_by(2)
        .map(|row| row[host_column].parse::<f64>().unwrap())
        .sum();
    assert!(
        (csv_produce_host - produce_host_cpu_seconds).abs() < 1e-9,
        "{csv_text}"
    );
    for (index, row) in rows.iter().enumerate() {
        let cell = row[flush_column];
        if index % 2 == 0 {
            assert!(cell.parse::<f64>().unwrap() >= 0.0, "{csv_text}");
        } else {
            assert_eq!(cell, "", "consume rows flush nothing: {csv_text}");
        }
    }
    let svg_count = std::fs::read_dir(&charts)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|extension| extension == "svg")
        })
        .count();
    assert!(svg_count >= 1, "no SVG in {}", charts.display());
    assert!(stdout.contains(&format!(" SVG files in {}\n", charts.display())));

    // That report is a baseline for the next run.
    let mut again = vec!["--shards", "1"];
    again.extend(TINY);
    again.extend([
        "--data-root",
        path_arg(&data_root),
        "--compare",
        path_arg(&json),
    ]);
    let output = bench(&again);
    assert!(
        output.status.success(),
        "{}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    // One run: a table, no summary.
    let stdout = text(&output.stdout);
    // Same settings as the baseline: compared without a warning.
    assert!(stdout.contains("\n== compared with "), "{stdout}");
    assert!(!stdout.contains("settings differ"), "{stdout}");
    assert!(stdout.contains("\n== shards=1 (requested 1) "), "{stdout}");
    assert!(
        stdout.contains(" s flushing the data directory's filesystem (syncfs) after the last ack"),
        "{stdout}"
    );
    assert!(!stdout.contains("recommendation: "), "{stdout}");
}

#[test]
fn bad_report_paths_fail_before_any_server_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data_root = dir.path().join("data");
    let json = dir.path().join("kept-out.json");
    let missing = dir.path().join("missing");
    let missing_csv = missing.join("x.csv");
    let a_file = dir.path().join("a-file");
    std::fs::write(&a_file, "not a directory").unwrap();
    let cases = [
        (
            vec!["--csv", path_arg(&missing_csv)],
            format!(
                "error: cannot create --csv {}: No such file or directory (os error 2)\n",
                missing_csv.display()
            ),
        ),
        (
            vec!["--charts", path_arg(&a_file)],
            format!(
                "error: cannot create --charts {}: File exists (os error 17)\n",
                a_file.display()
            ),
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["--shards", "1"];
        args.extend(TINY);
        args.extend([
            "--data-root",
            path_arg(&data_root),
            "--json",
            path_arg(&json),
        ]);
        args.extend(flags);
        let output = bench(&args);
        assert!(!output.status.success());
        assert_eq!(text(&output.stderr), expected);
        assert_eq!(text(&output.stdout), "");
        // Nothing ran: the --json file it created is removed, no run directory was made.
        assert!(!json.exists());
        assert!(
            !data_root.exists() || std::fs::read_dir(&data_root).unwrap().next().is_none(),
            "a run directory was created"
        );
    }
    let mut args = vec!["--shards", "1"];
    args.extend(TINY);
    let missing_report = missing.join("old.json");
    args.extend(["--compare", path_arg(&missing_report)]);
    let output = bench(&args);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with("error: ") && stderr.contains(&missing_report.display().to_string()),
        "{stderr}"
    );
    assert_eq!(text(&output.stdout), "");
}
