//! Issue 9, end to end: three real `shardline serve` processes with `--checkpoint-interval 8
//! --journal-segment-size 64KiB`. A backup is killed; the others commit enough changes that
//! their checkpoints release the journal segments holding the ops it lacks; restarted, it
//! catches up by state transfer (offer, manifest, chunks, install) and repairs the tail above
//! the checkpoint: every replica shows the same metadata, the restarted one has the installed
//! topics' partition directories, and once it is the primary a retried request of a session
//! committed while it was down gets its original reply (the client table came with the
//! checkpoint). Each replica runs two shards, so the restore reaches a shard other than 0.

mod common;

use std::path::Path;
use std::time::Instant;

use common::cluster::{CONVERGE_DEADLINE, Cluster, others, request_at_primary, shape, tail};

/// The client whose session is created and used while the victim is down.
const CLIENT: u128 = 0x5eed_0009;
/// Stream ids of the changes committed while the victim is down start here.
const STREAM_BASE: u32 = 1000;

/// First ops of the journal segments under `data_dir/journal`, ascending.
fn segment_first_ops(data_dir: &Path) -> Vec<u64> {
    let mut ops: Vec<u64> = std::fs::read_dir(data_dir.join("journal"))
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".wal")?.parse().ok()
        })
        .collect();
    ops.sort_unstable();
    ops
}

/// A CreateStream request of `CLIENT` number `request` (stream `STREAM_BASE + request`) with a
/// 255-byte name, so ~200 of them fill a 64 KiB journal segment; returns the reply header.
fn create_long_stream(cluster: &Cluster, request: u64) -> bus::Header {
    let stream_id = STREAM_BASE + request as u32;
    let name = format!("{stream_id:0>255}");
    let (header, body) = request_at_primary(
        cluster,
        CLIENT,
        request,
        bus::Operation::CreateStream,
        bus::Namespace::new(stream_id, 0, 0),
        name.as_bytes(),
    );
    assert_eq!(
        header.error_code,
        0,
        "request {request}: {}",
        String::from_utf8_lossy(&body)
    );
    header
}

/// Kills the primary (never `keep`) and restarts the replica killed the round before, until
/// `keep` is the primary of the running replicas; returns those.
fn make_primary(cluster: &mut Cluster, keep: usize) -> Vec<usize> {
    let mut down: Option<usize> = None;
    let deadline = Instant::now() + CONVERGE_DEADLINE * 3;
    loop {
        let running: Vec<usize> = (0..3).filter(|i| Some(*i) != down).collect();
        let primary = cluster.wait_for_primary(&running);
        if primary == keep {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "replica {keep} never became the primary\n{}",
            cluster.stderrs()
        );
        if let Some(index) = down {
            cluster.start_replica(index);
            cluster.wait_converged(&[0, 1, 2]);
        }
        cluster.kill9(primary);
        down = Some(primary);
    }
}

/// `shardline topic create STREAM 1 events --partitions 2` through every client address.
fn create_topic(cluster: &Cluster, stream_id: u32) {
    common::cluster::cli(&[
        "topic",
        "create",
        &stream_id.to_string(),
        "1",
        "events",
        "--partitions",
        "2",
        "--addr",
        &cluster.all_clients(),
    ]);
}

/// Commits CreateStreams (requests after `*request`) until every replica in `survivors`
/// released the journal segments holding ops up to `lagging_commit + 1`; returns each request
/// number with its reply.
fn commit_until_released(
    cluster: &Cluster,
    survivors: &[usize],
    lagging_commit: u64,
    request: &mut u64,
) -> Vec<(u64, bus::Header)> {
    let mut replies = Vec::new();
    loop {
        for _ in 0..20 {
            *request += 1;
            replies.push((*request, create_long_stream(cluster, *request)));
        }
        let released = survivors.iter().all(|&index| {
            segment_first_ops(&cluster.dirs[index])
                .first()
                .is_some_and(|&first| first > lagging_commit + 1)
        });
        if released {
            return replies;
        }
        assert!(
            replies.len() < 2000,
            "the survivors never released their first journal segment: {:?}",
            survivors
                .iter()
                .map(|&index| segment_first_ops(&cluster.dirs[index]))
                .collect::<Vec<_>>()
        );
    }
}

/// The flags of the state-transfer cluster: two shards each (so the restore fan-out reaches a
/// shard other than 0), checkpoints every 8 ops, 64 KiB journal segments.
const TRANSFER_FLAGS: [&str; 6] = [
    "--shards",
    "2",
    "--checkpoint-interval",
    "8",
    "--journal-segment-size",
    "64KiB",
];

#[test]
fn issue9_lagging_replica_catches_up_by_state_transfer() {
    let mut cluster = Cluster::start_with(&TRANSFER_FLAGS);
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    let (registered, _) = request_at_primary(
        &cluster,
        CLIENT,
        0,
        bus::Operation::Register,
        bus::Namespace(0),
        &[],
    );
    assert_eq!(registered.error_code, 0);
    create_long_stream(&cluster, 1);
    let before = cluster.wait_converged(&[0, 1, 2]);
    let victim = (primary + 1) % 3;
    let victim_commit = before["commit"].as_u64().unwrap();
    cluster.kill9(victim);
    let survivors = others(victim);

    // A topic the victim learns only from the installed checkpoint, then commits until both
    // survivors released every segment holding an op the victim lacks.
    let mut request = 2;
    let mut replies = vec![(request, create_long_stream(&cluster, request))];
    create_topic(&cluster, STREAM_BASE + 2);
    replies.extend(commit_until_released(
        &cluster,
        &survivors,
        victim_commit,
        &mut request,
    ));

    cluster.start_replica(victim);
    let converged = cluster.wait_converged(&[0, 1, 2]);
    let stderr = cluster.stderr(victim);
    for line in [
        "state transfer: asking the primary for its checkpoint",
        "state transfer: checkpoint installed; the journal continues at the next op",
        "state transfer: checkpoint installed and every shard restored",
        "state transfer: checkpoint installed; repairing the tail above it",
    ] {
        assert!(
            stderr.contains(line),
            "replica {victim} did not log {line:?}:\n{}",
            tail(&stderr, 60)
        );
    }
    let streams = shape(&converged);
    assert_eq!(
        streams.as_array().unwrap().len(),
        usize::try_from(request).unwrap(),
        "every stream on all three"
    );
    // The partition directories of the topic the installed checkpoint holds.
    for partition in 0..2 {
        let dir =
            cluster.dirs[victim].join(format!("partitions/{}/1/{partition}", STREAM_BASE + 2));
        assert!(dir.is_dir(), "{} missing", dir.display());
    }

    // A retried request of the session committed while the victim was down, answered by the
    // victim as primary: the original reply, not a second apply.
    let running = make_primary(&mut cluster, victim);
    let (retried_request, original) = *replies.last().unwrap();
    let retried = create_long_stream(&cluster, retried_request);
    assert_eq!(
        (retried.operation, retried.offset, retried.count),
        (original.operation, original.offset, original.count),
        "retried request {retried_request} answered by replica {victim} as primary"
    );
    assert_eq!(cluster.wait_for_primary(&running), victim);
}

/// Issue 9 section 4, crash safety end to end: the lagging replica is killed (SIGKILL by
/// failpoint) right after each install step in turn: the snapshot, the superblock pairing, the
/// journal restart. Restarted without the failpoint, it boots (the install marker makes boot
/// finish the journal restart) and catches up: the metadata agrees on all three.
#[test]
fn issue9_replica_killed_at_each_install_step_boots_and_catches_up() {
    let mut cluster = Cluster::start_with(&TRANSFER_FLAGS);
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    let (registered, _) = request_at_primary(
        &cluster,
        CLIENT,
        0,
        bus::Operation::Register,
        bus::Namespace(0),
        &[],
    );
    assert_eq!(registered.error_code, 0);
    let victim = (primary + 1) % 3;
    let survivors = others(victim);
    let mut request = 0;
    for failpoint in shards::store::failpoint::INSTALL_FAILPOINTS {
        let lagging_commit = cluster.wait_converged(&[0, 1, 2])["commit"]
            .as_u64()
            .unwrap();
        cluster.kill9(victim);
        commit_until_released(&cluster, &survivors, lagging_commit, &mut request);
        cluster.start_replica_with_env(victim, &[("SHARDLINE_FAILPOINT", failpoint)]);
        let mut crashed = cluster.servers[victim].take().unwrap();
        let status = crashed.child.wait().unwrap();
        let stderr = crashed.stderr();
        assert!(
            !status.success() && stderr.contains(&format!("failpoint {failpoint}")),
            "replica {victim} did not stop at {failpoint} ({status}):\n{}",
            tail(&stderr, 40)
        );
        cluster.start_replica(victim);
        let converged = cluster.wait_converged(&[0, 1, 2]);
        assert_eq!(
            shape(&converged).as_array().unwrap().len(),
            usize::try_from(request).unwrap(),
            "after a crash at {failpoint}"
        );
        // The install marker is on disk from before the snapshot until after the journal
        // restart: after a crash at any of these steps, boot restarts the journal after the
        // installed checkpoint (the old journal is never replayed over it).
        let stderr = cluster.stderr(victim);
        let last_run = &stderr[stderr.rfind("starting data_dir").unwrap_or(0)..];
        assert!(
            last_run.contains("a crash interrupted a state transfer install"),
            "after a crash at {failpoint}, boot did not finish the install:\n{}",
            tail(last_run, 40)
        );
    }
}
