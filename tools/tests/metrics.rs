//! Issue 10 section 1, end to end: the real `shardline serve --metrics-listen` under traffic.
//! Each shard's `shardline_messages_appended_total` equals the messages acknowledged for the
//! partitions it owns (owners from GetMetadata), the text parses as a Prometheus exposition,
//! other paths and methods are refused, and a bad or taken metrics address refuses startup.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use bus::{BatchBuilder, Namespace};
use common::{BIN, block_on};

const PARTITION_COUNT: u16 = 8;
const BATCHES_PER_PARTITION: u64 = 20;
const MESSAGES_PER_BATCH: u64 = 25;

/// A `shardline serve` child with its client and metrics addresses (its first two stdout lines).
struct MetricsServer {
    child: Child,
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    stderr_log: std::path::PathBuf,
}

impl MetricsServer {
    fn start(data_dir: &Path) -> MetricsServer {
        let stderr_log = data_dir.with_extension("stderr.log");
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--shards",
                "2",
                "--no-pin",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let _ = tx.send(line);
            }
        });
        let next_line = || {
            rx.recv_timeout(Duration::from_mins(1)).unwrap_or_else(|_| {
                panic!(
                    "no stdout line; stderr:\n{}",
                    std::fs::read_to_string(&stderr_log).unwrap_or_default()
                )
            })
        };
        let listening = next_line();
        let addr = listening
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("first line {listening:?}"))
            .parse()
            .unwrap();
        let metrics = next_line();
        let metrics_addr = metrics
            .strip_prefix("metrics on http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("second line {metrics:?}"))
            .parse()
            .unwrap();
        MetricsServer {
            child,
            addr,
            metrics_addr,
            stderr_log,
        }
    }

    /// SIGTERM, then waits; the exit code.
    fn stop(mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0);
        self.child.wait().unwrap().code()
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One raw HTTP exchange: (status code, body).
fn http(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {answer:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http(addr, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
    assert_eq!(status, 200, "{body}");
    body
}

/// Every sample of the text: (name, labels) -> value, parsed with `prometheus-parse`.
fn samples(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let parsed =
        prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap();
    parsed
        .samples
        .into_iter()
        .filter_map(|sample| {
            let (prometheus_parse::Value::Counter(value)
            | prometheus_parse::Value::Gauge(value)
            | prometheus_parse::Value::Untyped(value)) = sample.value
            else {
                return None;
            };
            let labels: BTreeMap<String, String> = sample
                .labels
                .iter()
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            Some(((sample.metric, labels), value))
        })
        .collect()
}

/// A count as an integer (every figure compared exactly here is a whole count).
fn whole(value: f64) -> u64 {
    assert!(
        value >= 0.0 && value.fract() == 0.0,
        "{value} is not a count"
    );
    value as u64
}

/// The samples of family `name`, by their `shard` label, as whole counts.
fn per_shard(
    samples: &BTreeMap<(String, BTreeMap<String, String>), f64>,
    name: &str,
) -> BTreeMap<u16, u64> {
    samples
        .iter()
        .filter(|((metric, _), _)| metric == name)
        .map(|((_, labels), value)| (labels["shard"].parse().unwrap(), whole(*value)))
        .collect()
}

#[test]
fn a_scrape_during_traffic_counts_what_each_shard_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let server = MetricsServer::start(&dir.path().join("data"));
    let owners: Vec<u16> = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "metrics").await.unwrap();
        client
            .create_topic(1, 1, "events", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
        let metadata = client.get_metadata().await.unwrap();
        let mut partitions = metadata.streams[0].topics[0].partitions.clone();
        partitions.sort_by_key(|partition| partition.partition_id);
        partitions.iter().map(|p| p.owner_shard).collect()
    });
    assert_eq!(owners.len(), usize::from(PARTITION_COUNT));

    // Scrape all along the traffic: every scrape parses and counters never go down.
    let sending = Arc::new(AtomicBool::new(true));
    let scraper = {
        let sending = Arc::clone(&sending);
        let metrics_addr = server.metrics_addr;
        std::thread::spawn(move || {
            let mut previous: BTreeMap<u16, u64> = BTreeMap::new();
            let mut scrapes = 0;
            while sending.load(Ordering::Acquire) || scrapes == 0 {
                let samples = samples(&scrape(metrics_addr));
                let appended = per_shard(&samples, "shardline_messages_appended_total");
                for (shard, value) in &appended {
                    let before = previous.get(shard).copied().unwrap_or(0);
                    assert!(*value >= before, "shard {shard}: {before} -> {value}");
                }
                previous = appended;
                scrapes += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            scrapes
        })
    };

    let mut acknowledged = [0u64; 2];
    let mut acknowledged_bytes = [0u64; 2];
    let mut batches_sent = 0u64;
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        for round in 0..BATCHES_PER_PARTITION {
            for partition_id in 0..PARTITION_COUNT {
                let mut builder = BatchBuilder::with_capacity(MESSAGES_PER_BATCH as usize, 0);
                for index in 0..MESSAGES_PER_BATCH {
                    let id = (round * 1000 + index) * 100 + u64::from(partition_id);
                    builder.push(id, 1_700_000_000_000_000 + id, format!("m{id}").as_bytes());
                }
                let batch = builder.finish();
                let batch_bytes = batch.len() as u64;
                let ack = client
                    .send_messages(Namespace::new(1, 1, partition_id), batch)
                    .await
                    .unwrap();
                let owner = usize::from(owners[usize::from(partition_id)]);
                acknowledged[owner] += u64::from(ack.message_count);
                acknowledged_bytes[owner] += batch_bytes;
                batches_sent += 1;
            }
        }
    });
    sending.store(false, Ordering::Release);
    let scrapes = scraper.join().expect("every scrape during traffic parsed");
    assert!(scrapes >= 1);

    let text = scrape(server.metrics_addr);
    let samples = samples(&text);
    let expected: BTreeMap<u16, u64> = (0..2u16).zip(acknowledged).collect();
    assert_eq!(
        per_shard(&samples, "shardline_messages_appended_total"),
        expected,
        "{text}"
    );
    assert_eq!(
        expected.values().sum::<u64>(),
        u64::from(PARTITION_COUNT) * BATCHES_PER_PARTITION * MESSAGES_PER_BATCH
    );
    let expected_bytes: BTreeMap<u16, u64> = (0..2u16).zip(acknowledged_bytes).collect();
    assert_eq!(
        per_shard(&samples, "shardline_appended_bytes_total"),
        expected_bytes
    );
    let owned: BTreeMap<u16, u64> = (0..2u16)
        .map(|shard| {
            let count = owners.iter().filter(|owner| **owner == shard).count();
            (shard, count as u64)
        })
        .collect();
    assert_eq!(per_shard(&samples, "shardline_partitions"), owned);
    assert_eq!(
        per_shard(&samples, "shardline_shard_up"),
        BTreeMap::from([(0, 1), (1, 1)])
    );
    // Every send was answered `ok` by the shard whose connection took it.
    let sends_ok: u64 = samples
        .iter()
        .filter(|((name, labels), _)| {
            name == "shardline_requests_total"
                && labels.get("operation").map(String::as_str) == Some("send_messages")
                && labels.get("result").map(String::as_str) == Some("ok")
        })
        .map(|(_, value)| whole(*value))
        .sum();
    assert_eq!(sends_ok, batches_sent, "{text}");
    let process = |name: &str| {
        samples
            .get(&(name.to_owned(), BTreeMap::new()))
            .copied()
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert!(process("shardline_process_cpu_seconds_total") > 0.0);
    assert!(process("shardline_open_fds") > 0.0);
    assert!(process("shardline_open_fds") <= process("shardline_open_fds_limit"));
    assert_eq!(whole(process("shardline_is_primary")), 1);
    assert!(
        text.contains("shardline_io_driver_info{driver=\"io-uring\"} 1\n"),
        "{text}"
    );
    assert!(text.contains("shardline_fsync_duration_seconds_bucket{le=\"+Inf\",shard=\"0\"}"));
    assert!(text.ends_with("# EOF\n"));

    let (status, body) = http(server.metrics_addr, "GET /other HTTP/1.1\r\n\r\n");
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(server.metrics_addr, "DELETE /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 405, "{body}");
    let (status, body) = http(server.metrics_addr, "nonsense\r\n\r\n");
    assert_eq!(status, 400, "{body}");
    // Still serving after the refusals.
    scrape(server.metrics_addr);

    let stderr_log = server.stderr_log.clone();
    assert_eq!(server.stop(), Some(0), "graceful shutdown with metrics on");
    let stderr = std::fs::read_to_string(stderr_log).unwrap();
    assert!(stderr.contains("serving metrics"), "{stderr}");
}

fn serve_refused(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let output = Command::new(BIN)
        .args([
            "serve",
            "--shards",
            "1",
            "--no-pin",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data_dir)
        .args(extra)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success(), "{output:?}");
    output
}

#[test]
fn a_bad_metrics_address_refuses_startup_naming_flag_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let output = serve_refused(&data_dir, &["--metrics-listen", "nowhere"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--metrics-listen"), "{stderr}");
    assert!(stderr.contains("\"nowhere\" is not HOST:PORT"), "{stderr}");
}

#[test]
fn a_taken_metrics_port_refuses_startup_before_anything_is_written() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");

    let output = serve_refused(&data_dir, &["--metrics-listen", &addr], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot serve metrics on {addr} (--metrics-listen): "
        )),
        "{stderr}"
    );
    assert!(!data_dir.exists(), "nothing written before the refusal");
    assert!(output.stdout.is_empty(), "no listening line");

    // The same from the environment, and from the config file (which the message names).
    let output = serve_refused(&data_dir, &[], &[("SHARDLINE_METRICS_LISTEN", &addr)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("cannot serve metrics on {addr}")),
        "{stderr}"
    );
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, format!("metrics-listen = \"{addr}\"\n")).unwrap();
    let output = serve_refused(&data_dir, &["--config", config.to_str().unwrap()], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot serve metrics on {addr} (metrics-listen in config file {})",
            config.display()
        )),
        "{stderr}"
    );
    drop(taken);
}
