//! Issue 11 section 5 (producers and names) and the CLI half of section 4 (retention flags),
//! through the real `shardline` binary against a real server: names resolve wherever an id is
//! taken, `stream list` and `topic list` print tables and JSON, `send` spreads round-robin or by
//! key as `bus::partition_for_key` says, `topic alter` changes what `topic list` shows.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{BIN, Server};

fn start(dir: &Path) -> Server {
    Server::start(&dir.join("data"), &["--shards", "2", "--no-pin"])
}

/// Runs `shardline args... --addr ADDR` with `input` on stdin; returns its output.
fn run(server: &Server, args: &[&str], input: &[u8]) -> Output {
    let addr = server.addr.to_string();
    let mut child = Command::new(BIN)
        .args(args)
        .args(["--addr", &addr])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs a client command that must succeed; returns stdout.
fn client(server: &Server, args: &[&str]) -> String {
    client_with_input(server, args, b"")
}

fn client_with_input(server: &Server, args: &[&str], input: &[u8]) -> String {
    let output = run(server, args, input);
    assert!(
        output.status.success(),
        "{args:?}: {:?}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs a client command that must fail with exit 1; returns stderr.
fn refused(server: &Server, args: &[&str], input: &[u8]) -> String {
    let output = run(server, args, input);
    assert_eq!(output.status.code(), Some(1), "{args:?}: {output:?}");
    assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
    String::from_utf8(output.stderr).unwrap()
}

/// Next offset of each partition of topic `stream_id/topic_id`, by partition id.
fn next_offsets(server: &Server, stream_id: u64, topic_id: u64) -> Vec<u64> {
    let metadata: serde_json::Value =
        serde_json::from_str(&client(server, &["metadata", "--json"])).unwrap();
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
                p["next_offset"].as_u64().unwrap(),
            )
        })
        .collect();
    partitions.sort_unstable();
    partitions.into_iter().map(|(_, next)| next).collect()
}

/// The raw payloads of partition `partition` of `orders/events`.
fn payloads(server: &Server, partition: u32) -> String {
    client(
        server,
        &[
            "poll",
            "--stream",
            "orders",
            "--topic",
            "events",
            "--partition",
            &partition.to_string(),
            "--count",
            "1000",
            "--output",
            "raw",
        ],
    )
}

#[test]
fn issue11_5_names_resolve_wherever_an_id_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    assert_eq!(
        client(&server, &["stream", "create", "orders"]),
        "created stream 1 \"orders\"\n",
        "without an id, the next free one"
    );
    assert_eq!(
        client(&server, &["stream", "create", "5", "audit"]),
        "created stream 5 \"audit\"\n",
        "`stream create ID NAME` as before"
    );
    assert_eq!(
        client(&server, &["stream", "create", "billing"]),
        "created stream 6 \"billing\"\n"
    );
    assert_eq!(
        client(
            &server,
            &["topic", "create", "orders", "events", "--partitions", "2"]
        ),
        "created topic 1/1 \"events\" with 2 partitions\n"
    );
    assert_eq!(
        client(&server, &["topic", "create", "orders", "3", "refunds"]),
        "created topic 1/3 \"refunds\" with 1 partition\n"
    );
    assert_eq!(
        client(&server, &["topic", "create", "1", "returns"]),
        "created topic 1/4 \"returns\" with 1 partition\n"
    );
    assert_eq!(
        client_with_input(
            &server,
            &[
                "send",
                "--stream",
                "orders",
                "--topic",
                "refunds",
                "--partition",
                "0"
            ],
            b"r1\nr2\n"
        ),
        "sent 2 messages to 1/3/0 at offsets 0-1\n"
    );
    assert_eq!(
        client(&server, &["poll", "--stream", "1", "--topic", "refunds"]),
        "0\tr1\n1\tr2\n"
    );
    assert_eq!(
        client(&server, &["topic", "delete", "orders", "refunds"]),
        "deleted topic 1/3\n"
    );
    assert_eq!(
        client(&server, &["topic", "delete", "orders", "4"]),
        "deleted topic 1/4\n"
    );
    assert_eq!(
        client(&server, &["stream", "delete", "billing"]),
        "deleted stream 6\n"
    );
    assert_eq!(
        client(&server, &["stream", "delete", "5"]),
        "deleted stream 5\n"
    );
    assert_eq!(
        client(&server, &["topic", "list", "orders"]),
        "ID  NAME    PARTITIONS  MESSAGES  RETENTION_BYTES  RETENTION_AGE  GROUPS\n \
         1  events           2         0        unlimited      unlimited  -\n"
    );

    // Unknown names are refused naming what was looked for, before anything changes.
    assert_eq!(
        refused(&server, &["stream", "delete", "nosuch"], b""),
        "error: no stream \"nosuch\" on the server (see `shardline stream list`)\n"
    );
    assert_eq!(
        refused(&server, &["topic", "create", "nosuch", "events"], b""),
        "error: no stream \"nosuch\" on the server (see `shardline stream list`)\n"
    );
    assert_eq!(
        refused(&server, &["topic", "delete", "orders", "nosuch"], b""),
        "error: no topic \"nosuch\" in stream 1 \"orders\" (see `shardline topic list 1`)\n"
    );
    assert_eq!(
        refused(&server, &["topic", "list", "nosuch"], b""),
        "error: no stream \"nosuch\" on the server (see `shardline stream list`)\n"
    );
    assert_eq!(
        refused(
            &server,
            &["send", "--stream", "orders", "--topic", "nosuch"],
            b"m\n"
        ),
        "error: no topic \"nosuch\" in stream 1 \"orders\" (see `shardline topic list 1`)\n"
    );
    assert_eq!(
        refused(
            &server,
            &["topic", "alter", "nosuch", "events", "--retention-ms", "1h"],
            b""
        ),
        "error: no stream \"nosuch\" on the server (see `shardline stream list`)\n"
    );
    // A name of digits could never be named again: refused.
    assert_eq!(
        refused(&server, &["stream", "create", "12"], b""),
        "error: stream name \"12\" is all digits, which every command reads as an id: give a \
         name with a letter or a sign in it\n"
    );
    assert_eq!(
        client(&server, &["stream", "list", "--json"]),
        "[{\"id\":1,\"name\":\"orders\",\"topics\":1,\"partitions\":2,\"messages\":0}]\n"
    );
}

#[test]
fn issue11_5_stream_list_and_topic_list_print_tables_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    assert_eq!(
        client(&server, &["stream", "list"]),
        "ID  NAME  TOPICS  PARTITIONS  MESSAGES\n",
        "no streams: the header alone"
    );
    assert_eq!(client(&server, &["stream", "list", "--json"]), "[]\n");
    client(&server, &["stream", "create", "orders"]);
    client(&server, &["stream", "create", "120", "eu-west-payments"]);
    client(
        &server,
        &[
            "topic",
            "create",
            "orders",
            "events",
            "--partitions",
            "3",
            "--retention-bytes",
            "1GiB",
            "--retention-ms",
            "7d",
        ],
    );
    client(&server, &["topic", "create", "orders", "audit"]);
    client_with_input(
        &server,
        &["send", "--stream", "orders", "--topic", "events"],
        b"a\nb\nc\nd\ne\n",
    );
    client_with_input(
        &server,
        &["send", "--stream", "orders", "--topic", "audit"],
        b"x\n",
    );
    assert_eq!(
        client(&server, &["stream", "list"]),
        " ID  NAME              TOPICS  PARTITIONS  MESSAGES\n  \
         1  orders                 2           4         6\n\
         120  eu-west-payments       0           0         0\n"
    );
    assert_eq!(
        client(&server, &["stream", "list", "--json"]),
        "[{\"id\":1,\"name\":\"orders\",\"topics\":2,\"partitions\":4,\"messages\":6},\
         {\"id\":120,\"name\":\"eu-west-payments\",\"topics\":0,\"partitions\":0,\"messages\":0}]\n"
    );
    assert_eq!(
        client(&server, &["topic", "list", "orders"]),
        "ID  NAME    PARTITIONS  MESSAGES  RETENTION_BYTES  RETENTION_AGE  GROUPS\n \
         1  events           3         5             1GiB             7d  -\n \
         2  audit            1         1        unlimited      unlimited  -\n"
    );
    assert_eq!(
        client(&server, &["topic", "list", "1", "--json"]),
        "[{\"id\":1,\"name\":\"events\",\"partitions\":3,\"messages\":5,\
         \"retention_bytes\":1073741824,\"retention_ms\":604800000,\"groups\":[]},\
         {\"id\":2,\"name\":\"audit\",\"partitions\":1,\"messages\":1,\"retention_bytes\":0,\
         \"retention_ms\":0,\"groups\":[]}]\n"
    );
    assert_eq!(
        client(&server, &["topic", "list", "eu-west-payments"]),
        "ID  NAME  PARTITIONS  MESSAGES  RETENTION_BYTES  RETENTION_AGE  GROUPS\n"
    );
}

#[test]
fn issue11_5_keyed_sends_land_where_partition_for_key_says() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    client(&server, &["stream", "create", "orders"]);
    client(
        &server,
        &["topic", "create", "orders", "events", "--partitions", "8"],
    );
    let user_42 = bus::partition_for_key(b"user-42", 8);
    assert_eq!(user_42, 5, "the README's example");
    let send_key = |input: &[u8]| {
        client_with_input(
            &server,
            &[
                "send", "--stream", "orders", "--topic", "events", "--key", "user-42",
            ],
            input,
        )
    };
    assert_eq!(send_key(b"k1\n"), "sent 1 message to 1/1/5 at offset 0\n");
    assert_eq!(
        send_key(b"k2\nk3\n"),
        "sent 2 messages to 1/1/5 at offsets 1-2\n",
        "the same key, the same partition"
    );

    // --key-field: each line to the partition of its field, in input order there.
    let users = ["ann", "bob", "cy", "dee", "ann", "eve", "bob", "ann"];
    let mut input = String::new();
    let mut expected: Vec<Vec<String>> = vec![Vec::new(); 8];
    for (index, user) in users.iter().enumerate() {
        let line = format!("{{\"user\":\"{user}\",\"n\":{index}}}");
        input.push_str(&line);
        input.push('\n');
        expected[bus::partition_for_key(user.as_bytes(), 8) as usize].push(line);
    }
    // A number keys by its JSON text: 42 as the bytes "42".
    input.push_str("{\"user\":42}\n");
    expected[bus::partition_for_key(b"42", 8) as usize].push("{\"user\":42}".to_owned());
    expected[user_42 as usize].splice(0..0, ["k1", "k2", "k3"].map(str::to_owned));
    let sent = client_with_input(
        &server,
        &[
            "send",
            "--stream",
            "orders",
            "--topic",
            "events",
            "--key-field",
            "user",
        ],
        input.as_bytes(),
    );
    let field_partitions: std::collections::BTreeSet<u32> = users
        .iter()
        .map(|user| bus::partition_for_key(user.as_bytes(), 8))
        .chain([bus::partition_for_key(b"42", 8)])
        .collect();
    assert!(
        field_partitions.len() >= 3,
        "the keys spread: {field_partitions:?}"
    );
    assert_eq!(
        sent.lines().count(),
        field_partitions.len(),
        "one line per partition written: {sent}"
    );
    for partition in 0..8u32 {
        let lines = &expected[partition as usize];
        let want = if lines.is_empty() {
            String::new()
        } else {
            lines.join("\n") + "\n"
        };
        assert_eq!(payloads(&server, partition), want, "partition {partition}");
    }

    // A line without the field is refused, naming its line number, before anything is sent.
    let before = next_offsets(&server, 1, 1);
    assert_eq!(
        refused(
            &server,
            &[
                "send",
                "--stream",
                "orders",
                "--topic",
                "events",
                "--key-field",
                "user"
            ],
            b"{\"user\":\"ann\"}\n\n{\"name\":\"bob\"}\n"
        ),
        "error: line 3 has no field \"user\" (--key-field \"user\"); nothing was sent\n"
    );
    assert_eq!(next_offsets(&server, 1, 1), before, "nothing was sent");

    // --partition and a key exclude each other (clap: exit 2).
    let output = run(
        &server,
        &[
            "send",
            "--stream",
            "1",
            "--topic",
            "1",
            "--partition",
            "0",
            "--key",
            "k",
        ],
        b"m\n",
    );
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot be used with"),
        "{output:?}"
    );
}

#[test]
fn issue11_5_send_without_a_partition_spreads_batches_round_robin() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    client(&server, &["stream", "create", "orders"]);
    client(
        &server,
        &["topic", "create", "orders", "events", "--partitions", "4"],
    );
    let sent = client_with_input(
        &server,
        &[
            "send", "--stream", "orders", "--topic", "events", "--batch", "1",
        ],
        b"m0\nm1\nm2\nm3\nm4\nm5\nm6\nm7\n",
    );
    assert_eq!(
        sent,
        "sent 2 messages to 1/1/0 at offsets 0-1\n\
         sent 2 messages to 1/1/1 at offsets 0-1\n\
         sent 2 messages to 1/1/2 at offsets 0-1\n\
         sent 2 messages to 1/1/3 at offsets 0-1\n"
    );
    assert_eq!(next_offsets(&server, 1, 1), [2, 2, 2, 2]);
    // Batch after batch to the next partition: partition p holds messages p and p + 4 of the
    // input, shifted by where the run started.
    let mut firsts = Vec::new();
    for partition in 0..4 {
        let text = payloads(&server, partition);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let first: usize = lines[0][1..].parse().unwrap();
        let second: usize = lines[1][1..].parse().unwrap();
        assert_eq!(second, first + 4, "partition {partition}: {text}");
        firsts.push(first);
    }
    let start = firsts.iter().position(|&first| first == 0).unwrap();
    for (offset, first) in firsts.iter().enumerate() {
        assert_eq!(*first, (offset + 4 - start) % 4, "{firsts:?}");
    }
}

#[test]
fn issue11_4_topic_alter_changes_what_topic_list_shows() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    client(&server, &["stream", "create", "orders"]);
    assert_eq!(
        client(
            &server,
            &[
                "topic",
                "create",
                "orders",
                "events",
                "--retention-bytes",
                "512MiB",
                "--retention-ms",
                "7d"
            ]
        ),
        "created topic 1/1 \"events\" with 1 partition, retention 512MiB by size and 7d by age\n"
    );
    assert_eq!(
        client(
            &server,
            &[
                "topic",
                "alter",
                "orders",
                "events",
                "--retention-ms",
                "12h"
            ]
        ),
        "altered topic 1/1: retention unchanged by size, 12h by age\n"
    );
    assert_eq!(
        client(&server, &["topic", "list", "orders"]),
        "ID  NAME    PARTITIONS  MESSAGES  RETENTION_BYTES  RETENTION_AGE  GROUPS\n \
         1  events           1         0           512MiB            12h  -\n"
    );
    assert_eq!(
        client(
            &server,
            &[
                "topic",
                "alter",
                "1",
                "1",
                "--retention-bytes",
                "2TiB",
                "--retention-ms",
                "0"
            ]
        ),
        "altered topic 1/1: retention 2TiB by size, unlimited by age\n"
    );
    assert_eq!(
        client(&server, &["topic", "list", "orders", "--json"]),
        "[{\"id\":1,\"name\":\"events\",\"partitions\":1,\"messages\":0,\
         \"retention_bytes\":2199023255552,\"retention_ms\":0,\"groups\":[]}]\n"
    );
    let output = run(&server, &["topic", "alter", "orders", "events"], b"");
    assert_eq!(
        output.status.code(),
        Some(2),
        "a change is required: {output:?}"
    );
}
