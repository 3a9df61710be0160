//! Issue 7 section 6, what a new user tripped over: each test runs the real `shardline` binary
//! the way the issue's reporter did and checks the exact output and exit status.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{BIN, Server};

/// Runs `shardline args...` with stdin closed and returns its output.
fn shardline(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs a client command against `server` and asserts it succeeded; returns stdout.
fn client(server: &Server, args: &[&str]) -> String {
    let addr = server.addr.to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--addr", &addr]);
    let output = shardline(&all);
    assert!(
        output.status.success(),
        "{all:?}: {:?}\nstderr: {}",
        output.status,
        stderr_of(&output)
    );
    stdout_of(&output)
}

fn metadata(server: &Server) -> serde_json::Value {
    serde_json::from_str(&client(server, &["metadata"])).unwrap()
}

/// Owner shard of each partition of topic `stream_id/topic_id`, by partition id.
fn owners(metadata: &serde_json::Value, stream_id: u64, topic_id: u64) -> Vec<u64> {
    let stream = metadata["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|stream| stream["stream_id"] == stream_id)
        .unwrap();
    let topic = stream["topics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|topic| topic["topic_id"] == topic_id)
        .unwrap();
    let mut partitions: Vec<(u64, u64)> = topic["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["partition_id"].as_u64().unwrap(),
                p["owner_shard"].as_u64().unwrap(),
            )
        })
        .collect();
    partitions.sort_unstable();
    partitions.into_iter().map(|(_, owner)| owner).collect()
}

fn count_per_shard(owners: &[u64], shard_count: usize) -> Vec<usize> {
    let mut counts = vec![0; shard_count];
    for owner in owners {
        counts[*owner as usize] += 1;
    }
    counts
}

fn start(dir: &Path, extra: &[&str]) -> Server {
    Server::start(&dir.join("data"), extra)
}

#[test]
fn issue7_6_send_cuts_batches_to_the_server_max_message_size() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--shards", "1", "--max-message-size", "1024"]);
    client(&server, &["stream", "create", "1", "orders"]);
    client(&server, &["topic", "create", "1", "1", "events"]);
    // 100 lines of 21 bytes (20 and the newline), default --batch 100: one batch would be a
    // 5,504-byte frame, over the server's 1024.
    let lines: Vec<String> = (0..100)
        .map(|index| format!("message-{index:012}"))
        .collect();
    assert!(lines.iter().all(|line| line.len() == 20));
    let file = dir.path().join("lines.txt");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let file_arg = file.to_str().unwrap();
    let sent = client(
        &server,
        &["send", "--stream", "1", "--topic", "1", "--file", file_arg],
    );
    assert_eq!(sent, "sent 100 messages to 1/1/0 at offsets 0-99\n");
    let polled = client(
        &server,
        &[
            "poll", "--stream", "1", "--topic", "1", "--count", "1000", "--output", "raw",
        ],
    );
    assert_eq!(polled, lines.join("\n") + "\n");

    // One line too long for any frame under the limit is refused before anything is sent.
    let long = dir.path().join("long.txt");
    std::fs::write(&long, format!("ok\n{}\n", "x".repeat(689))).unwrap();
    let addr = server.addr.to_string();
    let output = shardline(&[
        "send",
        "--stream",
        "1",
        "--topic",
        "1",
        "--file",
        long.to_str().unwrap(),
        "--addr",
        &addr,
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr_of(&output),
        "error: line 2 holds 689 bytes, more than the 688 bytes a message may hold under the \
         server's --max-message-size 1024 (the request frame, 336 bytes of headers included)\n"
    );
    let next_offset = &metadata(&server)["streams"][0]["topics"][0]["partitions"][0]["next_offset"];
    assert_eq!(next_offset, 100, "nothing of the refused input was sent");
}

#[test]
fn issue7_6_send_skips_empty_lines_and_poll_prints_each_output_mode() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--shards", "1"]);
    client(&server, &["stream", "create", "1", "orders"]);
    client(&server, &["topic", "create", "1", "1", "events"]);
    let addr = server.addr.to_string();
    let mut child = Command::new(BIN)
        .args(["send", "--stream", "1", "--topic", "1", "--addr", &addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"\nhello\n\r\n\nworld\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert_eq!(
        stdout_of(&output),
        "sent 2 messages to 1/1/0 at offsets 0-1\n"
    );
    let poll = |mode: &str| {
        client(
            &server,
            &["poll", "--stream", "1", "--topic", "1", "--output", mode],
        )
    };
    assert_eq!(poll("text"), "0\thello\n1\tworld\n");
    assert_eq!(poll("raw"), "hello\nworld\n");
    let json: Vec<serde_json::Value> = poll("json")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(json.len(), 2);
    assert_eq!(json[1]["offset"], 1);
    assert_eq!(json[1]["id"], 1);
    assert_eq!(json[1]["payload"], "world");
    assert!(json[1]["timestamp_us"].as_u64().unwrap() > 1_600_000_000_000_000);

    let one = dir.path().join("one.txt");
    std::fs::write(&one, "single\n").unwrap();
    let sent = client(
        &server,
        &[
            "send",
            "--stream",
            "1",
            "--topic",
            "1",
            "--file",
            one.to_str().unwrap(),
        ],
    );
    assert_eq!(sent, "sent 1 message to 1/1/0 at offset 2\n");
}

/// Runs `shardline args...` with stdout a pipe whose reader is already closed.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn issue7_6_a_closed_stdout_ends_metadata_and_poll_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--shards", "1"]);
    client(&server, &["stream", "create", "1", "orders"]);
    client(&server, &["topic", "create", "1", "1", "events"]);
    let file = dir.path().join("lines.txt");
    std::fs::write(&file, "a\nb\nc\n").unwrap();
    client(
        &server,
        &[
            "send",
            "--stream",
            "1",
            "--topic",
            "1",
            "--file",
            file.to_str().unwrap(),
        ],
    );
    let addr = server.addr.to_string();
    for args in [
        vec!["metadata", "--addr", &addr],
        vec!["poll", "--stream", "1", "--topic", "1", "--addr", &addr],
    ] {
        let output = with_closed_stdout(&args);
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        assert_eq!(stderr_of(&output), "", "{args:?}");
    }
}

#[test]
fn issue7_6_inspect_snapshot_on_a_new_data_dir_says_no_snapshot_yet() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &["--shards", "1"]);
    assert_eq!(server.stop(), Some(0));
    let output = shardline(&["inspect", "snapshot", data_dir.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert_eq!(
        stdout_of(&output),
        format!(
            "snapshot {}\nno snapshot yet: no checkpoint has been written (the first comes \
             after --checkpoint-interval committed metadata ops, or at a clean shutdown after \
             one)\nresult: clean\n",
            data_dir.display()
        )
    );
}

#[test]
fn issue7_6_a_topics_partitions_spread_evenly_over_the_shards() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--shards", "2", "--no-pin"]);
    client(&server, &["stream", "create", "1", "orders"]);
    client(
        &server,
        &["topic", "create", "1", "1", "events", "--partitions", "8"],
    );
    // The README's `bench --addr ... --stream-id 7` topic: 2 partitions.
    client(&server, &["stream", "create", "7", "bench-7"]);
    client(
        &server,
        &["topic", "create", "7", "1", "bench", "--partitions", "2"],
    );
    let metadata = metadata(&server);
    assert_eq!(metadata["shard_count"], 2);
    assert_eq!(count_per_shard(&owners(&metadata, 1, 1), 2), [4, 4]);
    assert_eq!(count_per_shard(&owners(&metadata, 7, 1), 2), [1, 1]);

    // Ownership is not on disk: the same directory on one shard opens every partition there.
    assert_eq!(server.stop(), Some(0));
    let server = start(dir.path(), &["--shards", "1"]);
    let metadata = self::metadata(&server);
    assert_eq!(owners(&metadata, 1, 1), [0; 8]);
    assert_eq!(owners(&metadata, 7, 1), [0, 0]);
}

#[test]
fn issue7_6_host_names_resolve_for_listen_and_addr() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--shards",
            "1",
            "--listen",
            "localhost:0",
            "--data-dir",
        ])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let listening = line.trim_end().to_owned();
    let server = Server {
        child,
        addr: listening
            .strip_prefix("listening on ")
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {listening:?}")),
        stderr_log: dir.path().join("unused.log"),
    };
    assert_eq!(
        server.addr.ip(),
        std::net::IpAddr::from([127, 0, 0, 1]),
        "localhost listens on 127.0.0.1"
    );
    let by_name = format!("localhost:{}", server.addr.port());
    let output = shardline(&["metadata", "--addr", &by_name]);
    assert!(output.status.success(), "{}", stderr_of(&output));

    let output = shardline(&["metadata", "--addr", "no-such-host.invalid:8090"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = stderr_of(&output);
    assert!(
        stderr.starts_with(
            "error: invalid value 'no-such-host.invalid:8090' for '--addr <HOST:PORT>': cannot \
             resolve host name \"no-such-host.invalid\" of \"no-such-host.invalid:8090\": "
        ),
        "{stderr}"
    );
}

#[test]
fn issue7_6_a_bad_no_pin_value_lists_the_accepted_values() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("SHARDLINE_NO_PIN", "maybe")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = stderr_of(&output);
    assert!(
        stderr.starts_with(
            "error: SHARDLINE_NO_PIN=\"maybe\" (the environment variable for --no-pin): \
             \"maybe\" is not a boolean; accepted: 1, 0, true, false, yes, no, on, off (any \
             case), or empty"
        ),
        "{stderr}"
    );
}

#[test]
fn issue7_6_an_empty_no_pin_counts_as_unset() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_NO_PIN", "");
    let server = Server::start_with(command, &dir.path().join("data"), &["--shards", "1"]);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue7_6_sizes_take_suffixes_and_send_takes_any_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &[
            "--shards",
            "1",
            "--max-message-size",
            "1KiB",
            "--segment-size",
            "64MiB",
        ],
    );
    client(&server, &["stream", "create", "1", "orders"]);
    client(&server, &["topic", "create", "1", "1", "events"]);
    let file = dir.path().join("bin.txt");
    std::fs::write(&file, b"ok line\nbad \xff\xfe line\r\n\n").unwrap();
    let file_arg = file.to_str().unwrap();
    let sent = client(
        &server,
        &["send", "--stream", "1", "--topic", "1", "--file", file_arg],
    );
    assert_eq!(sent, "sent 2 messages to 1/1/0 at offsets 0-1\n");
    let polled = client(
        &server,
        &["poll", "--stream", "1", "--topic", "1", "--output", "raw"],
    );
    assert_eq!(
        polled.as_bytes(),
        "ok line\nbad \u{fffd}\u{fffd} line\n".as_bytes()
    );
    let polled = Command::new(BIN)
        .args([
            "poll", "--stream", "1", "--topic", "1", "--output", "raw", "--addr",
        ])
        .arg(server.addr.to_string())
        .output()
        .unwrap();
    assert_eq!(polled.stdout, b"ok line\nbad \xff\xfe line\n");

    // --max-message-size 1KiB is 1024 bytes: the same refusal as `1024`.
    let long = dir.path().join("long.txt");
    std::fs::write(&long, "x".repeat(689)).unwrap();
    let addr = server.addr.to_string();
    let send = |path: &str, partition: &str| {
        shardline(&[
            "send",
            "--stream",
            "1",
            "--topic",
            "1",
            "--partition",
            partition,
            "--file",
            path,
            "--addr",
            &addr,
        ])
    };
    let output = send(long.to_str().unwrap(), "0");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr_of(&output),
        "error: line 1 holds 689 bytes, more than the 688 bytes a message may hold under the \
         server's --max-message-size 1024 (the request frame, 336 bytes of headers included)\n"
    );

    // A refused batch leads with where it went and how much was acknowledged before it.
    let output = send(file_arg, "9");
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(
        stderr.starts_with(
            "error: send to 1/1/9 failed after 0 messages were acknowledged: server error \
             PartitionNotFound (6): "
        ),
        "{stderr}"
    );

    // A read error names the file.
    let output = send(dir.path().to_str().unwrap(), "0");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr_of(&output),
        format!(
            "error: cannot read messages from {}: Is a directory (os error 21)\n",
            dir.path().display()
        )
    );
}

#[test]
fn issue7_6_a_size_that_does_not_parse_names_the_accepted_forms() {
    let output = shardline(&["serve", "--max-message-size", "64MB"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr_of(&output).starts_with(
            "error: invalid value '64MB' for '--max-message-size <BYTES>': \"64MB\" is not a \
             size: use bytes, an integer (e.g. 67108864), or one with a suffix KiB, MiB or GiB \
             (e.g. 64MiB)"
        ),
        "{}",
        stderr_of(&output)
    );
}

#[test]
fn issue7_6_help_names_sighup_and_the_segment_size_range() {
    // Help wraps to the terminal width: compare with runs of whitespace made one space.
    let help = |args: &[&str]| {
        stdout_of(&shardline(args))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let top = help(&["--help"]);
    assert!(
        top.contains(
            "serve Run the server until SIGINT, SIGTERM or SIGHUP (each stops it cleanly)"
        ),
        "{top}"
    );
    let serve = help(&["serve", "--help"]);
    assert!(
        serve.starts_with("Run the server until SIGINT, SIGTERM or SIGHUP (each stops it cleanly)"),
        "{serve}"
    );
    assert!(
        serve.contains(
            "--segment-size <BYTES> Segment file size before a partition log rolls to a new \
             segment, bytes (4096..=1073741824, i.e. 4KiB..=1GiB; a KiB, MiB or GiB suffix is \
             accepted)"
        ),
        "{serve}"
    );
    assert!(!serve.contains(">= 4096"), "{serve}");
}

#[test]
fn issue7_6_a_bad_segment_size_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--segment-size",
            "10",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        stderr_of(&output).lines().next(),
        Some(
            "error: invalid value '10' for '--segment-size <BYTES>': must be between 4096 and \
             1073741824 bytes"
        )
    );
}

#[test]
fn issue7_6_bench_creates_its_data_root_and_notes_latency_data_and_placement() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("missing").join("root");
    let output = shardline(&[
        "bench",
        "--shards",
        "2",
        "--no-pin",
        "--partitions",
        "3",
        "--producers",
        "1",
        "--consumers",
        "1",
        "--messages",
        "300",
        "--message-size",
        "10",
        "--batch",
        "10",
        "--fsync",
        "never",
        "--data-root",
        root.to_str().unwrap(),
    ]);
    let stdout = stdout_of(&output);
    assert!(output.status.success(), "{stdout}\n{}", stderr_of(&output));
    assert!(root.is_dir());
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines.contains(
            &"latency: p50us..max-us time one batch round trip per request (produce: a \
              SendMessages batch until its acknowledgement; consume: a poll until its reply)"
        ),
        "{stdout}"
    );
    let data_line = lines
        .iter()
        .find(|line| line.starts_with("data: "))
        .unwrap();
    assert!(
        data_line.starts_with(&format!("data: {}/shardline-bench-", root.display()))
            && data_line
                .ends_with("/data (embedded server, fsync=never; removed when the run ends)"),
        "{data_line}"
    );
    let owned = lines
        .iter()
        .find(|line| line.starts_with("warning: partitions are spread unevenly"))
        .unwrap();
    assert!(
        owned.contains("shard 0 owns 1, shard 1 owns 2")
            || owned.contains("shard 0 owns 2, shard 1 owns 1"),
        "{owned}"
    );
}

#[test]
fn issue7_6_bench_refuses_a_batch_over_the_server_frame_limit_before_creating_anything() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--shards", "1", "--max-message-size", "1024"]);
    let addr = server.addr.to_string();
    let bench = |message_size: &str, batch: &str| {
        shardline(&[
            "bench",
            "--addr",
            &addr,
            "--stream-id",
            "7",
            "--message-size",
            message_size,
            "--batch",
            batch,
            "--messages",
            "20",
            "--producers",
            "1",
            "--consumers",
            "1",
        ])
    };
    let output = bench("2000", "10");
    assert_eq!(output.status.code(), Some(1), "{}", stdout_of(&output));
    // 256 + 32 + 10 × (32 + 2000) = 20608 bytes.
    assert_eq!(
        stderr_of(&output),
        format!(
            "error: --batch 10 messages of up to 2000 payload bytes make a 20608-byte request \
             frame, above the server at {addr}'s --max-message-size 1024; lower --batch or the \
             payload size\n"
        )
    );
    assert_eq!(
        metadata(&server)["streams"],
        serde_json::json!([]),
        "nothing was created"
    );

    // A batch that fits runs; a second run on the same stream id says so once.
    let output = bench("10", "10");
    assert!(output.status.success(), "{}", stderr_of(&output));
    let output = bench("10", "10");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr_of(&output),
        format!(
            "error: stream 7 already exists on {addr}; the bench needs a fresh stream (it names \
             stream N \"bench-N\"): pass --stream-id with an unused id\n"
        )
    );
}

#[test]
fn issue7_6_bench_refuses_more_shards_than_cores_before_starting_a_server() {
    let allowed = runtime::topology::allowed_cpus().unwrap();
    let shards = (allowed.len() + 1).to_string();
    let root = tempfile::tempdir().unwrap();
    let output = shardline(&[
        "bench",
        "--shards",
        &shards,
        "--messages",
        "10",
        "--data-root",
        root.path().to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(
        stderr.starts_with(&format!(
            "error: --shards {shards}: more shards than allowed cores ({} allowed {}: ",
            allowed.len(),
            if allowed.len() == 1 { "core" } else { "cores" }
        )) && stderr.ends_with("); lower --shards, or pass --no-pin to overprovision\n"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(root.path()).unwrap().count(),
        0,
        "no run directory was created"
    );
}
