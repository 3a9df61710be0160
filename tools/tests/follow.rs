//! Issue 11 section 3, end to end on the real `shardline serve`: a poll with a wait is parked on
//! the owner shard and answered with the append that wakes it; `shardline poll --follow` prints
//! messages appended after it started and exits 0 on SIGTERM; parked polls are answered, and the
//! server exits 0, at SIGTERM; `--parked-polls-max` refuses one more clearly; the largest wire
//! wait is accepted (clamped) and still woken by an append; a deleted topic answers its parked
//! polls.
//!
//! Whether a poll is parked is read from the server's own gauge `shardline_parked_polls`, never
//! guessed from elapsed time.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bus::{BatchBuilder, Client, ClientError, ErrorCode, Namespace};
use common::{BIN, Server, block_on, unused_port};

/// How long the helpers below wait for a state the server reports before failing the test (a
/// bound on a hung test, not a speed assertion).
const SETTLE_DEADLINE: Duration = Duration::from_mins(1);
/// The wait every parked poll here asks for: far longer than any test step, so only an append,
/// the stop signal or the bound can end it.
const LONG_WAIT: Duration = Duration::from_secs(50);

/// A server with a metrics listener (to read `shardline_parked_polls`).
struct Served {
    server: Server,
    metrics: SocketAddr,
}

fn serve(data_dir: &Path, extra: &[&str]) -> Served {
    let metrics: SocketAddr = format!("127.0.0.1:{}", unused_port()).parse().unwrap();
    let metrics_text = metrics.to_string();
    let mut args = vec!["--no-pin", "--metrics-listen", &metrics_text];
    args.extend_from_slice(extra);
    Served {
        server: Server::start(data_dir, &args),
        metrics,
    }
}

/// Polls parked on every shard now (`shardline_parked_polls` summed), or `None` while the
/// metrics listener does not answer.
fn parked_polls(metrics: SocketAddr) -> Option<u64> {
    let mut stream = TcpStream::connect(metrics).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let total = text
        .lines()
        .filter(|line| line.starts_with("shardline_parked_polls{"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>();
    Some(total as u64)
}

/// Waits until the server reports exactly `expected` parked polls.
fn wait_parked(metrics: SocketAddr, expected: u64) {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut last = None;
    while Instant::now() < deadline {
        last = parked_polls(metrics);
        if last == Some(expected) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the server never reported {expected} parked polls (last scrape: {last:?})");
}

/// Stream 1 `s`, topic 1 `t` with `partition_count` partitions.
fn create_topic(addr: SocketAddr, partition_count: u32) {
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client
            .create_topic(1, 1, "t", partition_count)
            .await
            .unwrap();
    });
}

/// Appends one batch of `payloads` to `namespace`; returns its base offset.
fn append(addr: SocketAddr, namespace: Namespace, payloads: &[&str]) -> u64 {
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let mut builder = BatchBuilder::with_capacity(payloads.len(), 0);
        for (index, payload) in payloads.iter().enumerate() {
            builder.push(index as u64, 0, payload.as_bytes());
        }
        client
            .send_messages(namespace, builder.finish())
            .await
            .unwrap()
            .base_offset
    })
}

/// A poll of `namespace` at `offset` with `LONG_WAIT`, on a thread of its own: its (offset,
/// payload) pairs, or the error.
fn park_poll(
    addr: SocketAddr,
    namespace: Namespace,
    offset: u64,
) -> std::thread::JoinHandle<Result<Vec<(u64, String)>, ClientError>> {
    std::thread::spawn(move || {
        block_on(async move {
            let mut client = Client::connect(addr).await?;
            let result = client.poll_wait(namespace, offset, 100, LONG_WAIT).await?;
            Ok(result
                .messages()
                .unwrap()
                .iter()
                .map(|message| {
                    (
                        message.offset,
                        String::from_utf8(message.payload.to_vec()).unwrap(),
                    )
                })
                .collect())
        })
    })
}

fn owned(pairs: &[(u64, &str)]) -> Vec<(u64, String)> {
    pairs
        .iter()
        .map(|(offset, payload)| (*offset, (*payload).to_owned()))
        .collect()
}

#[test]
fn issue11_3_a_parked_poll_is_answered_with_the_append_that_wakes_it() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("data"), &["--shards", "2"]);
    let addr = served.server.addr;
    create_topic(addr, 2);
    let namespace = Namespace::new(1, 1, 1);
    append(addr, namespace, &["old"]);

    let waiting = park_poll(addr, namespace, 1);
    wait_parked(served.metrics, 1);
    assert_eq!(append(addr, namespace, &["first", "second"]), 1);
    let polled = waiting.join().unwrap().unwrap();
    assert_eq!(polled, owned(&[(1, "first"), (2, "second")]));
    wait_parked(served.metrics, 0);

    // A poll with a wait at an offset that has data answers at once, without parking.
    let at_once = park_poll(addr, namespace, 0).join().unwrap().unwrap();
    assert_eq!(at_once, owned(&[(0, "old"), (1, "first"), (2, "second")]));
    assert_eq!(served.server.stop(), Some(0));
}

#[test]
fn issue11_3_the_largest_wire_wait_is_clamped_and_still_woken_by_an_append() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("data"), &["--shards", "1"]);
    let addr = served.server.addr;
    create_topic(addr, 1);
    let namespace = Namespace::new(1, 1, 0);
    // A raw request: the client library clamps its wait itself, this one asks the server for
    // u32::MAX ms (49 days) and is parked like any other.
    let raw = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let mut header = bus::Header::new(bus::Command::Request, bus::Operation::PollMessages);
        header.namespace = namespace.0;
        header.offset = 0;
        header.count = 10;
        header.wait_ms = u32::MAX;
        stream
            .write_all(&bus::encode_frame(&mut header, &[]))
            .unwrap();
        let mut head = [0u8; bus::HEADER_SIZE];
        stream.read_exact(&mut head).unwrap();
        let reply: bus::Header = bytemuck::pod_read_unaligned(&head);
        let mut body = vec![0u8; reply.size as usize - bus::HEADER_SIZE];
        stream.read_exact(&mut body).unwrap();
        (reply, body)
    });
    wait_parked(served.metrics, 1);
    append(addr, namespace, &["woken"]);
    let (reply, body) = raw.join().unwrap();
    assert_eq!(reply.error_code, 0);
    assert_eq!(reply.count, 1);
    assert_eq!(reply.next_offset, 1);
    let messages = bus::client::messages_from(&body, 0).unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].payload, b"woken");
    assert_eq!(served.server.stop(), Some(0));
}

#[test]
fn issue11_3_parked_polls_are_answered_and_the_server_exits_0_on_sigterm() {
    const POLL_COUNT: u16 = 24;
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("data"), &["--shards", "2"]);
    let addr = served.server.addr;
    create_topic(addr, 4);
    let waiting: Vec<_> = (0..POLL_COUNT)
        .map(|index| park_poll(addr, Namespace::new(1, 1, index % 4), 0))
        .collect();
    wait_parked(served.metrics, u64::from(POLL_COUNT));

    let stderr_log = served.server.stderr_log.clone();
    assert_eq!(served.server.stop(), Some(0));
    for poll in waiting {
        assert_eq!(poll.join().unwrap().unwrap(), Vec::new(), "answered empty");
    }
    let stderr = std::fs::read_to_string(stderr_log).unwrap();
    assert!(stderr.contains("released parked polls"), "{stderr}");
    // Without the release the drain would wait for the parked polls until its deadline.
    assert!(!stderr.contains("drain deadline passed"), "{stderr}");
}

#[test]
fn issue11_3_past_parked_polls_max_a_poll_with_a_wait_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(
        &dir.path().join("data"),
        &["--shards", "1", "--parked-polls-max", "2"],
    );
    let addr = served.server.addr;
    create_topic(addr, 1);
    let namespace = Namespace::new(1, 1, 0);
    let first = park_poll(addr, namespace, 0);
    let second = park_poll(addr, namespace, 0);
    wait_parked(served.metrics, 2);

    let refused = park_poll(addr, namespace, 0).join().unwrap().unwrap_err();
    let ClientError::Server { code, message } = refused else {
        panic!("expected a server refusal, got {refused:?}");
    };
    assert_eq!(code, ErrorCode::ResourceExhausted);
    assert!(
        message.contains("already holds 2 parked polls (serve --parked-polls-max)"),
        "{message}"
    );
    // A poll without a wait is still served while the set is full.
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let result = client.poll(namespace, 0, 10).await.unwrap();
        assert_eq!(result.message_count, 0);
    });

    append(addr, namespace, &["both"]);
    assert_eq!(first.join().unwrap().unwrap(), owned(&[(0, "both")]));
    assert_eq!(second.join().unwrap().unwrap(), owned(&[(0, "both")]));
    assert_eq!(served.server.stop(), Some(0));
}

#[test]
fn issue11_3_deleting_the_topic_answers_its_parked_polls() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("data"), &["--shards", "2"]);
    let addr = served.server.addr;
    create_topic(addr, 2);
    let waiting: Vec<_> = (0..2)
        .map(|partition| park_poll(addr, Namespace::new(1, 1, partition), 0))
        .collect();
    wait_parked(served.metrics, 2);
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        client.delete_topic(1, 1).await.unwrap();
    });
    // The owner answers as it applies the delete; the connection's shard may apply it a moment
    // later, so the refusal comes from either: the topic is gone, or its partition is.
    for poll in waiting {
        let error = poll.join().unwrap().unwrap_err();
        assert!(
            matches!(
                error,
                ClientError::Server {
                    code: ErrorCode::TopicNotFound | ErrorCode::PartitionNotFound,
                    ..
                }
            ),
            "{error:?}"
        );
    }
    wait_parked(served.metrics, 0);
    assert_eq!(served.server.stop(), Some(0));
}

/// `shardline poll ... --follow` with stdout piped, and a thread forwarding its lines.
struct Follower {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Follower {
    fn start(addr: SocketAddr, extra: &[&str]) -> Follower {
        let mut child = Command::new(BIN)
            .args([
                "poll", "--stream", "s", "--topic", "t", "--follow", "--addr",
            ])
            .arg(addr.to_string())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Follower { child, lines }
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(SETTLE_DEADLINE)
            .expect("poll --follow printed no line")
    }

    /// SIGTERM, then the exit code and stderr.
    fn stop(self) -> (Option<i32>, String) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0);
        self.wait()
    }

    fn wait(mut self) -> (Option<i32>, String) {
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status.code(), stderr)
    }
}

#[test]
fn issue11_3_poll_follow_prints_messages_appended_after_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("data"), &["--shards", "2"]);
    let addr = served.server.addr;
    create_topic(addr, 1);
    let namespace = Namespace::new(1, 1, 0);
    append(addr, namespace, &["before-0", "before-1"]);

    let follower = Follower::start(addr, &[]);
    let counted = Follower::start(addr, &["--offset", "1", "--count", "3"]);
    assert_eq!(follower.next_line(), "0\tbefore-0");
    assert_eq!(follower.next_line(), "1\tbefore-1");
    assert_eq!(counted.next_line(), "1\tbefore-1");
    wait_parked(served.metrics, 2);

    append(addr, namespace, &["after-2"]);
    assert_eq!(follower.next_line(), "2\tafter-2");
    assert_eq!(counted.next_line(), "2\tafter-2");
    wait_parked(served.metrics, 2);
    append(addr, namespace, &["after-3", "after-4"]);
    assert_eq!(follower.next_line(), "3\tafter-3");
    assert_eq!(follower.next_line(), "4\tafter-4");
    // --count 3 ends the follow by itself at its third message.
    assert_eq!(counted.next_line(), "3\tafter-3");
    let (code, stderr) = counted.wait();
    assert_eq!(code, Some(0), "{stderr}");

    let (code, stderr) = follower.stop();
    assert_eq!(code, Some(0), "SIGTERM ends --follow cleanly: {stderr}");
    assert_eq!(served.server.stop(), Some(0));
}

/// Issue 11 sections 1 and 3: `poll --consumer` resumes after the stored offset, `--follow
/// --commit` stores as it goes.
#[test]
fn issue11_3_poll_consumer_resumes_after_its_committed_offset_and_follow_commits() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(&dir.path().join("data"), &["--shards", "2"]);
    let addr = served.server.addr;
    create_topic(addr, 1);
    let namespace = Namespace::new(1, 1, 0);
    append(addr, namespace, &["m0", "m1", "m2"]);

    let poll = |extra: &[&str]| {
        let output = Command::new(BIN)
            .args(["poll", "--stream", "s", "--topic", "t", "--addr"])
            .arg(addr.to_string())
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(
        poll(&["--consumer", "c1", "--commit", "--count", "2"]),
        "0\tm0\n1\tm1\n"
    );
    assert_eq!(poll(&["--consumer", "c1", "--commit"]), "2\tm2\n");
    // Without --commit the stored offset stays.
    append(addr, namespace, &["m3"]);
    assert_eq!(poll(&["--consumer", "c1"]), "3\tm3\n");

    let follower = Follower::start(addr, &["--consumer", "c1", "--commit"]);
    assert_eq!(follower.next_line(), "3\tm3");
    wait_parked(served.metrics, 1);
    append(addr, namespace, &["m4"]);
    assert_eq!(follower.next_line(), "4\tm4");
    wait_parked(served.metrics, 1);
    let (code, stderr) = follower.stop();
    assert_eq!(code, Some(0), "{stderr}");
    // --follow committed as it went: the next run starts after m4.
    append(addr, namespace, &["m5"]);
    assert_eq!(poll(&["--consumer", "c1", "--count", "5"]), "5\tm5\n");
    // Adversarial review: an explicit --offset takes the place of the stored offset (how a
    // consumer is moved), and --commit stores where it started when it was caught up.
    assert_eq!(
        poll(&[
            "--consumer",
            "c1",
            "--commit",
            "--offset",
            "1",
            "--count",
            "1"
        ]),
        "1\tm1\n"
    );
    assert_eq!(poll(&["--consumer", "c1", "--count", "1"]), "2\tm2\n");
    assert_eq!(poll(&["--consumer", "c2", "--commit", "--offset", "6"]), "");
    append(addr, namespace, &["m6"]);
    assert_eq!(poll(&["--consumer", "c2"]), "6\tm6\n");
    assert_eq!(served.server.stop(), Some(0));
}
