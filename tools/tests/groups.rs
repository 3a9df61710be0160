//! Issue 11 section 2, consumer groups, against the real `shardline serve`: `group create|
//! delete|list` through the CLI, membership and assignment through `JoinGroup` /
//! `GroupHeartbeat` / `LeaveGroup` (3 members over 8 partitions: after every change of
//! membership each partition is assigned to exactly one member), session expiry, and with
//! stored offsets (`GroupMember`) every message consumed exactly once while members join and
//! leave.
//!
//! Every loop has an end condition and a deadline that fails with a message; assertions are on
//! assignments and data, never on timing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use bus::{BatchBuilder, Client, ClientError, ErrorCode, GroupMember, Heartbeat, Namespace};
use common::{BIN, Server, block_on};

const PARTITION_COUNT: u16 = 8;
const GROUP: &str = "billing";
/// Longest any convergence loop below may take before the test fails.
const DEADLINE: Duration = Duration::from_mins(1);

fn start(dir: &Path, extra: &[&str]) -> Server {
    let mut args = vec!["--shards", "2", "--no-pin", "--fsync", "never"];
    args.extend_from_slice(extra);
    Server::start(&dir.join("data"), &args)
}

/// Stream 1 "orders", topic 1 "events" of 8 partitions, group "billing".
fn create_topic_and_group(addr: SocketAddr) {
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        client.create_stream(1, "orders").await.unwrap();
        client
            .create_topic(1, 1, "events", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
        client.create_group(1, 1, GROUP).await.unwrap();
    });
}

fn run(server: &Server, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .args(["--addr", &server.addr.to_string()])
        .output()
        .unwrap()
}

fn client_ok(server: &Server, args: &[&str]) -> String {
    let output = run(server, args);
    assert!(
        output.status.success(),
        "{args:?}: {:?}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn server_code<T: std::fmt::Debug>(result: Result<T, ClientError>) -> ErrorCode {
    match result {
        Err(ClientError::Server { code, .. }) => code,
        other => panic!("expected a server error, got {other:?}"),
    }
}

/// A member driven by hand: its client and the partitions it reads.
struct Member {
    client: Client,
    held: Vec<u16>,
    generation: u32,
}

impl Member {
    async fn join(addr: SocketAddr) -> Member {
        let mut client = Client::connect(addr).await.unwrap();
        let assignment = client.join_group(1, 1, GROUP).await.unwrap();
        Member {
            client,
            held: assignment.partitions,
            generation: assignment.generation,
        }
    }

    /// One heartbeat reporting what it reads; then it reads exactly its new assignment.
    async fn heartbeat(&mut self) {
        let heartbeat = Heartbeat {
            group: GROUP.to_owned(),
            held: self.held.clone(),
        };
        let assignment = self.client.heartbeat(1, 1, &heartbeat).await.unwrap();
        self.held = assignment.partitions;
        self.generation = assignment.generation;
    }
}

/// Heartbeats every member in turn until the partitions they read cover all 8, each once;
/// asserts at every step that no partition is read by two members.
async fn converge(members: &mut [&mut Member]) {
    let start = Instant::now();
    loop {
        for index in 0..members.len() {
            members[index].heartbeat().await;
            let mut seen = BTreeSet::new();
            for other in members.iter() {
                for partition in &other.held {
                    assert!(
                        seen.insert(*partition),
                        "partition {partition} read by two members"
                    );
                }
            }
        }
        let covered: usize = members.iter().map(|m| m.held.len()).sum();
        if covered == usize::from(PARTITION_COUNT) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "assignment did not converge within {DEADLINE:?}: {:?}",
            members.iter().map(|m| m.held.clone()).collect::<Vec<_>>()
        );
    }
}

/// Each live member's partitions as `GetMetadata` shows them, by member client id.
async fn listed_members(client: &mut Client) -> BTreeMap<String, Vec<u16>> {
    let metadata = client.get_metadata().await.unwrap();
    let group = &metadata.streams[0].topics[0].groups[0];
    assert_eq!(group.name, GROUP);
    group
        .members
        .iter()
        .map(|m| (m.client.clone(), m.partitions.clone()))
        .collect()
}

#[test]
fn issue11_2_three_members_over_eight_partitions_each_partition_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    create_topic_and_group(server.addr);
    block_on(async {
        let mut a = Member::join(server.addr).await;
        assert_eq!(a.held, (0..PARTITION_COUNT).collect::<Vec<_>>());
        let mut b = Member::join(server.addr).await;
        let mut c = Member::join(server.addr).await;
        converge(&mut [&mut a, &mut b, &mut c]).await;
        // Range assignment over the members sorted by client id: 3, 3 and 2 partitions.
        let mut by_id: Vec<&Member> = vec![&a, &b, &c];
        by_id.sort_by_key(|m| m.client.client_id());
        let shares: Vec<Vec<u16>> = by_id.iter().map(|m| m.held.clone()).collect();
        assert_eq!(shares, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]);
        let mut observer = Client::connect(server.addr).await.unwrap();
        let listed = listed_members(&mut observer).await;
        assert_eq!(listed.len(), 3);
        assert_eq!(
            listed[&format!("{:#x}", a.client.client_id())],
            a.held,
            "GetMetadata shows the member's partitions"
        );

        // B leaves: its partitions go to A and C.
        b.client.leave_group(1, 1, GROUP).await.unwrap();
        assert_eq!(
            server_code(b.client.leave_group(1, 1, GROUP).await),
            ErrorCode::NotGroupMember
        );
        converge(&mut [&mut a, &mut c]).await;
        assert_eq!(listed_members(&mut observer).await.len(), 2);

        // A fourth member joins: still every partition read by exactly one.
        let mut d = Member::join(server.addr).await;
        converge(&mut [&mut a, &mut c, &mut d]).await;
        let generation = a.generation;
        assert!(
            generation >= 5,
            "generation grew with each change: {generation}"
        );
        assert_eq!(listed_members(&mut observer).await.len(), 3);
    });
}

#[test]
fn issue11_2_a_silent_member_times_out_and_its_partitions_move() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--group-session-timeout", "300ms"]);
    create_topic_and_group(server.addr);
    block_on(async {
        let mut a = Member::join(server.addr).await;
        let mut b = Member::join(server.addr).await;
        converge(&mut [&mut a, &mut b]).await;
        assert_eq!(a.held.len() + b.held.len(), usize::from(PARTITION_COUNT));
        // B stops heartbeating; A keeps on until it reads everything.
        let start = Instant::now();
        while a.held.len() < usize::from(PARTITION_COUNT) {
            assert!(
                start.elapsed() < DEADLINE,
                "B's partitions did not move to A within {DEADLINE:?}: A reads {:?}",
                a.held
            );
            compio::time::sleep(Duration::from_millis(50)).await;
            a.heartbeat().await;
        }
        let heartbeat = Heartbeat {
            group: GROUP.to_owned(),
            held: b.held.clone(),
        };
        assert_eq!(
            server_code(b.client.heartbeat(1, 1, &heartbeat).await),
            ErrorCode::NotGroupMember
        );
    });
}

#[test]
fn issue11_2_group_requests_name_their_problem() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    create_topic_and_group(server.addr);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        assert_eq!(
            server_code(client.join_group(1, 1, "nobody").await),
            ErrorCode::GroupNotFound
        );
        assert_eq!(
            server_code(client.join_group(1, 1, "").await),
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            server_code(client.create_group(1, 1, GROUP).await),
            ErrorCode::GroupAlreadyExists
        );
        let heartbeat = Heartbeat {
            group: GROUP.to_owned(),
            held: Vec::new(),
        };
        assert_eq!(
            server_code(client.heartbeat(1, 1, &heartbeat).await),
            ErrorCode::NotGroupMember
        );
        client.join_group(1, 1, GROUP).await.unwrap();
        let beyond = Heartbeat {
            group: GROUP.to_owned(),
            held: vec![PARTITION_COUNT],
        };
        assert_eq!(
            server_code(client.heartbeat(1, 1, &beyond).await),
            ErrorCode::InvalidArgument
        );
        // Deleting the group ends its membership.
        client.delete_group(1, 1, GROUP).await.unwrap();
        assert_eq!(
            server_code(client.heartbeat(1, 1, &heartbeat).await),
            ErrorCode::GroupNotFound
        );
    });
}

#[test]
fn issue11_2_group_create_list_delete_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    client_ok(&server, &["stream", "create", "1", "orders"]);
    client_ok(
        &server,
        &[
            "topic",
            "create",
            "orders",
            "1",
            "events",
            "--partitions",
            "4",
        ],
    );
    assert_eq!(
        client_ok(&server, &["group", "create", "orders", "events", "billing"]),
        "created group \"billing\" on topic 1/1\n"
    );
    assert_eq!(
        client_ok(&server, &["group", "list", "orders", "events"]),
        "GROUP    GENERATION  MEMBERS  MEMBER  PARTITIONS\nbilling           0        0  -       -\n"
    );
    let member_id = block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        client.join_group(1, 1, "billing").await.unwrap();
        client.client_id()
    });
    let json: serde_json::Value =
        serde_json::from_str(&client_ok(&server, &["group", "list", "1", "1", "--json"])).unwrap();
    assert_eq!(json[0]["name"], "billing");
    assert_eq!(json[0]["generation"], 1);
    assert_eq!(json[0]["members"][0]["client"], format!("{member_id:#x}"));
    assert_eq!(
        json[0]["members"][0]["partitions"],
        serde_json::json!([0, 1, 2, 3])
    );
    let refused = run(&server, &["group", "create", "orders", "events", "billing"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("GroupAlreadyExists"),
        "{refused:?}"
    );
    assert_eq!(
        client_ok(&server, &["group", "delete", "orders", "events", "billing"]),
        "deleted group \"billing\" of topic 1/1\n"
    );
    assert_eq!(
        client_ok(&server, &["group", "list", "orders", "events"]),
        "GROUP  GENERATION  MEMBERS  MEMBER  PARTITIONS\n"
    );
    let missing = run(&server, &["group", "delete", "orders", "events", "billing"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("GroupNotFound"),
        "{missing:?}"
    );
}

/// Sends `per_partition` messages to each partition; payload `P:I` (partition, index).
async fn produce(client: &mut Client, per_partition: u32) {
    for partition in 0..PARTITION_COUNT {
        let mut builder = BatchBuilder::default();
        for index in 0..per_partition {
            builder.push(
                u64::from(index),
                0,
                format!("{partition}:{index}").as_bytes(),
            );
        }
        client
            .send_messages(Namespace::new(1, 1, partition), builder.finish())
            .await
            .unwrap();
    }
}

/// Polls `member` until `stop` says so, recording each message's (partition, offset); closes it.
async fn consume(
    mut member: GroupMember,
    seen: std::rc::Rc<std::cell::RefCell<Vec<(u16, u64)>>>,
    until: impl Fn(usize) -> bool,
) {
    let start = Instant::now();
    loop {
        let poll = member.poll().await.unwrap();
        let mut read_count = 0;
        if let (Some(partition), Some(result)) = (poll.partition, poll.result) {
            for message in result.messages().unwrap() {
                seen.borrow_mut().push((partition, message.offset));
                read_count += 1;
            }
        }
        if read_count == 0 {
            // Caught up, or waiting for a partition: let the other members run.
            compio::time::sleep(Duration::from_millis(5)).await;
        }
        if until(seen.borrow().len()) {
            break;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "consumption did not finish within {DEADLINE:?}: {} messages seen",
            seen.borrow().len()
        );
    }
    member.close().await.unwrap();
}

#[test]
fn issue11_2_group_members_consume_every_message_exactly_once_while_members_come_and_go() {
    const PER_PARTITION: u32 = 500;
    let total = usize::from(PARTITION_COUNT) * PER_PARTITION as usize;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    create_topic_and_group(server.addr);
    let addr = server.addr;
    let seen = block_on(async move {
        let mut producer = Client::connect(addr).await.unwrap();
        produce(&mut producer, PER_PARTITION).await;
        let seen = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let join = move |poll_count: u32| async move {
            GroupMember::join(Client::connect(addr).await.unwrap(), 1, 1, GROUP)
                .await
                .unwrap()
                .with_poll_count(poll_count)
                .with_heartbeat_interval(Duration::from_millis(20))
        };
        // Two members stay to the end; a third leaves after a quarter, a fourth joins then.
        let stayers: Vec<_> = [0, 1]
            .into_iter()
            .map(|_| {
                let seen = std::rc::Rc::clone(&seen);
                async move {
                    let member = join(7).await;
                    consume(member, seen, move |count| count >= total).await;
                }
            })
            .map(compio::runtime::spawn)
            .collect();
        let leaver = join(5).await;
        consume(leaver, std::rc::Rc::clone(&seen), move |count| {
            count >= total / 4
        })
        .await;
        let late = join(11).await;
        consume(late, std::rc::Rc::clone(&seen), move |count| count >= total).await;
        for stayer in stayers {
            stayer.await.unwrap();
        }
        std::rc::Rc::try_unwrap(seen).unwrap().into_inner()
    });
    let mut counts: BTreeMap<(u16, u64), u32> = BTreeMap::new();
    for key in &seen {
        *counts.entry(*key).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "messages consumed more than once: {twice:?}"
    );
    assert_eq!(counts.len(), total, "every message consumed");
}

#[test]
fn issue11_2_a_backup_answers_group_requests_not_primary() {
    use common::cluster::{Cluster, others, raw_request};
    let cluster = Cluster::start();
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    let backup = others(primary)[0];
    let clients = cluster.clients.clone();
    let assignment = block_on(async move {
        let mut client = Client::connect_any(&clients).await.unwrap();
        client.create_stream(1, "orders").await.unwrap();
        client
            .create_topic(1, 1, "events", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
        client.create_group(1, 1, GROUP).await.unwrap();
        // The client library follows a backup's NotPrimary to the primary.
        let mut member = Client::connect(clients[backup]).await.unwrap();
        member.join_group(1, 1, GROUP).await.unwrap()
    });
    assert_eq!(
        assignment.partitions,
        (0..PARTITION_COUNT).collect::<Vec<_>>()
    );
    let (header, _) = raw_request(
        cluster.clients[backup],
        0x6e0,
        1,
        bus::Operation::JoinGroup,
        Namespace::new(1, 1, 0),
        GROUP.as_bytes(),
    )
    .expect("the backup answers");
    assert_eq!(
        ErrorCode::from_u32(header.error_code),
        Some(ErrorCode::NotPrimary),
        "a backup holds no membership"
    );
}
