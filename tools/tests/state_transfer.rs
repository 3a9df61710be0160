//! Issue 9, end to end: three real `shardline serve` processes with `--checkpoint-interval 8
//! --journal-segment-size 64KiB`. A backup is killed and cut off (`cut_off`: what is sent to it
//! while it is down is lost, not queued for its next start); the others commit enough changes
//! that their checkpoints release the journal segments holding the ops it lacks and their memory
//! no longer holds them either (`may_still_supply`). Without both, it may catch up with no
//! transfer. Restarted, it
//! catches up by state transfer (offer, manifest, chunks, install) and repairs the tail above
//! the checkpoint: every replica shows the same metadata, the restarted one has the installed
//! topics' partition directories, and once it is the primary a retried request of a session
//! committed while it was down gets its original reply (the client table came with the
//! checkpoint). Each replica runs two shards, so the restore reaches a shard other than 0.

mod common;

use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{
    CONVERGE_DEADLINE, Cluster, DropSink, last_start, others, request_at_primary, shape, tail,
};

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

/// `checkpoint_op` of every "checkpoint done" line of `stderr`, in log order.
fn checkpoints_done(stderr: &str) -> Vec<u64> {
    stderr
        .lines()
        .filter(|line| line.contains("checkpoint done"))
        .filter_map(|line| {
            let value = &line[line.find(" checkpoint_op=")? + " checkpoint_op=".len()..];
            value
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// Why replica `index` may still supply op `lagging_commit + 1` to a repair, or `None` when it
/// surely cannot, so a replica that lacks that op needs a state transfer.
///
/// A replica serves repair from its journal and from memory (`shards::vsr::replica::repair`,
/// `on_request_prepare`). A released journal segment alone is not enough: memory keeps the
/// prepares from the checkpoint before the newest one on (`Replica::on_checkpoint_done`), and the
/// segment file goes before the core learns of the checkpoint that released it. The third-newest
/// "checkpoint done" line bounds that floor from below: the newest logged checkpoint started only
/// once the core had handled the one before it, which dropped the prepares below the one before
/// that.
fn may_still_supply(cluster: &Cluster, index: usize, lagging_commit: u64) -> Option<String> {
    let needed = lagging_commit + 1;
    let segments = segment_first_ops(&cluster.dirs[index]);
    if segments.first().is_none_or(|&first| first <= needed) {
        return Some(format!(
            "replica {index}'s journal may hold op {needed}: its segments start at {segments:?}"
        ));
    }
    let checkpoints = checkpoints_done(&cluster.stderr(index));
    let memory_floor = checkpoints.iter().rev().nth(2);
    if memory_floor.is_none_or(|&floor| floor <= needed) {
        return Some(format!(
            "replica {index}'s memory may hold op {needed}: it keeps the prepares from the \
             checkpoint before its newest on, and its last checkpoints are {:?}",
            &checkpoints[checkpoints.len().saturating_sub(3)..]
        ));
    }
    None
}

/// Kills replica `victim` (kill -9) and cuts it off: its replica-bus address is held by a
/// [`DropSink`] (drop it before restarting the replica), so what its peers send it while it is
/// down is lost instead of waiting in their outbound queues for its next start, which could
/// catch it up with no state transfer (seen in this test under load: a restarted backup
/// applied the 120 prepares it had missed from the primary's queued frames, with no repair
/// request answered).
fn cut_off(cluster: &mut Cluster, victim: usize) -> DropSink {
    cluster.kill9(victim);
    DropSink::bind(cluster.replicas[victim])
}

/// Commits CreateStreams (requests after `*request`) until no replica in `survivors` can supply
/// op `lagging_commit + 1` (see [`may_still_supply`]), so a replica at `lagging_commit`, cut off
/// meanwhile ([`cut_off`]), needs a state transfer; returns each request number with its reply.
/// Gives up (panics with the reason) after 2000 requests.
fn commit_until_transfer_needed(
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
        let suppliers: Vec<String> = survivors
            .iter()
            .filter_map(|&index| may_still_supply(cluster, index, lagging_commit))
            .collect();
        if suppliers.is_empty() {
            return replies;
        }
        assert!(
            replies.len() < 2000,
            "after {} requests a survivor may still supply op {}: {suppliers:?}",
            replies.len(),
            lagging_commit + 1
        );
    }
}

/// Longest wait for a replica started with an install failpoint to reach it and die. Not a
/// timed assertion: it only turns a replica that never reaches the failpoint into a failure
/// instead of a hang.
const FAILPOINT_DEADLINE: Duration = Duration::from_mins(2);

/// Starts replica `victim` with `SHARDLINE_FAILPOINT=failpoint` and checks that it killed
/// itself there, before or after it listened, having asked for a state transfer. Panics with
/// its last log lines otherwise (see [`wait_failpoint_exit`] for one that does not exit).
fn expect_failpoint_kill(cluster: &mut Cluster, victim: usize, failpoint: &str) {
    let stderr = if let Err(stderr) = cluster.start_replica_armed(victim, failpoint) {
        // It reached the failpoint before it listened (the start reaped it).
        eprintln!("replica {victim} reached {failpoint} before it listened");
        stderr
    } else {
        wait_failpoint_exit(cluster, victim, failpoint)
    };
    let run = last_start(&stderr);
    assert!(
        run.contains(&format!(
            "failpoint {failpoint}: killing the process with SIGKILL"
        )),
        "replica {victim} did not stop at {failpoint}:\n{}",
        tail(run, 40)
    );
    assert!(
        run.contains("state transfer: asking the primary for its checkpoint"),
        "replica {victim} stopped at {failpoint} without asking for a state transfer:\n{}",
        tail(run, 40)
    );
}

/// Waits (at most [`FAILPOINT_DEADLINE`]) for running replica `victim`, armed with `failpoint`,
/// to die of SIGKILL; returns its stderr log. Panics if it is still running then (it is killed
/// first), naming what it waited for, whether the replica asked for a state transfer, its
/// state-transfer and view lines and its last log lines, or if it exited any other way.
fn wait_failpoint_exit(cluster: &mut Cluster, victim: usize, failpoint: &str) -> String {
    let mut armed = cluster.servers[victim].take().expect("replica is running");
    let status = armed.wait_exit_within(FAILPOINT_DEADLINE);
    let stderr = armed.stderr();
    let run = last_start(&stderr);
    let Some(status) = status else {
        drop(armed);
        let notable: Vec<&str> = run
            .lines()
            .filter(|line| line.contains("state transfer") || line.contains(" view"))
            .collect();
        panic!(
            "replica {victim}, started with SHARDLINE_FAILPOINT={failpoint}, still ran after \
             {FAILPOINT_DEADLINE:?} (killed now): the failpoint never fired; asked for a state \
             transfer: {}; its state-transfer and view lines:\n{}\nits last log lines:\n{}\n{}",
            run.contains("state transfer: asking the primary for its checkpoint"),
            notable[notable.len().saturating_sub(20)..].join("\n"),
            tail(run, 30),
            cluster.stderrs()
        );
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "replica {victim} did not die of its failpoint {failpoint} ({status}):\n{}",
        tail(run, 40)
    );
    stderr
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
    let sink = cut_off(&mut cluster, victim);
    let survivors = others(victim);

    // A topic the victim learns only from the installed checkpoint, then commits until both
    // survivors released every segment holding an op the victim lacks.
    let mut request = 2;
    let mut replies = vec![(request, create_long_stream(&cluster, request))];
    create_topic(&cluster, STREAM_BASE + 2);
    replies.extend(commit_until_transfer_needed(
        &cluster,
        &survivors,
        victim_commit,
        &mut request,
    ));

    drop(sink);
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
/// journal restart. Each round asserts the failpoint fired (the replica asked for a state
/// transfer, logged the failpoint and died of SIGKILL) and fails, never hangs, if it did not.
/// Restarted without the failpoint, it boots (the install marker makes boot finish the journal
/// restart) and catches up: the metadata agrees on all three.
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
        let sink = cut_off(&mut cluster, victim);
        commit_until_transfer_needed(&cluster, &survivors, lagging_commit, &mut request);
        drop(sink);
        expect_failpoint_kill(&mut cluster, victim, failpoint);
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
        let run = last_start(&stderr);
        assert!(
            run.contains("a crash interrupted a state transfer install"),
            "after a crash at {failpoint}, boot did not finish the install:\n{}",
            tail(run, 40)
        );
    }
}
