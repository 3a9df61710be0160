//! Every bound of the shards crate, with why it has its value.

use std::time::Duration;

/// Name of the metadata file under the data directory (durable replace + XXH3-64 trailer).
pub const METADATA_FILE_NAME: &str = "metadata.json";
/// Folder of partition logs under the data directory.
pub const PARTITIONS_DIR_NAME: &str = "partitions";
/// Largest poll reply payload (bytes) before `max_message_size` clamps it further: bounds the
/// memory one poll can pin on the owner shard.
pub const POLL_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Metadata requests waiting on shard 0 before new ones are answered `Busy`.
pub const METADATA_QUEUE_MAX: usize = 1024;
/// How long a shard waits before retrying a mesh send that must not be dropped (metadata
/// broadcast, replies to forwarded requests); the receiver drains its inbox every pump turn.
pub const MESH_RETRY_SLEEP: Duration = Duration::from_micros(200);
/// Retries of such a send before the shard gives up and reports the peer as stuck (50k * 200 µs
/// = 10 s: far beyond any healthy drain time).
pub const MESH_RETRY_MAX: u32 = 50_000;
/// How often a shard repeats its warning about one sealed segment whose age retention cannot
/// verify (its last entry is damaged, `storage/FORMAT.md` section 3c): the condition lasts until
/// an operator acts, and a warning every `--retention-interval` (10 s by default) would bury
/// other logs; passes in between log it at debug.
pub const UNVERIFIED_AGE_WARN_INTERVAL: Duration = Duration::from_mins(10);
/// Drain deadline at shutdown: after the stop signal, connections finish and answer the requests
/// they had read (and answer later ones `ShuttingDown`) for at most this long before they are
/// closed; well inside the launcher's 30 s `SHUTDOWN_DEADLINE`, which also covers the fsyncs.
pub const SHUTDOWN_DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// Default `--parked-polls-max`: polls one shard holds parked waiting for data at once (issue 11
/// section 3). A parked poll costs a few hundred bytes (its task, a waker, a map entry and a
/// runtime timer: about 4 MiB at this default) and no CPU while it waits; past the bound a poll
/// with a wait is refused with `ResourceExhausted`, so many idle followers cannot grow memory
/// without limit.
pub const PARKED_POLLS_MAX_DEFAULT: usize = 16_384;
/// Largest `--parked-polls-max` (about 256 MiB of parked polls per shard).
pub const PARKED_POLLS_MAX_LIMIT: usize = 1 << 20;
/// Name of the lock file that keeps a second server off the same data directory.
pub const LOCK_FILE_NAME: &str = "LOCK";
/// Default `--idle-timeout-s`: a connection with no complete frame for this long is closed (Kafka's
/// `connections.max.idle.ms` default is the same 10 minutes). Also bounds how long a half-sent
/// frame can hold its connection open.
pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_mins(10);
/// Once a header arrived, its body must arrive within this long (a slow-sending client cannot
/// hold a body's worth of memory indefinitely).
pub const FRAME_BODY_TIMEOUT: Duration = Duration::from_mins(1);
/// Request bodies and poll replies a shard's connections hold in memory at once (4 messages of the
/// default 64 MiB maximum). A request body that does not fit waits, without reading its socket
/// (TCP backpressure), until others finish, at most `RECEIVE_BUDGET_WAIT_MAX` (then the connection
/// closes); a poll that does not fit within that time is answered `Busy`. One request is always
/// admitted when none is held.
pub const RECEIVE_BYTES_MAX_PER_SHARD: u64 = 256 * 1024 * 1024;
/// Longest wait for receive budget before the request is refused.
pub const RECEIVE_BUDGET_WAIT_MAX: Duration = Duration::from_secs(10);
/// A reply the client does not read within this long closes the connection.
pub const REPLY_WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// File descriptors kept out of the partition and connection budgets (listeners, io_uring rings,
/// metadata, logs, stdio).
pub const FD_RESERVE: u64 = 256;
/// Splice pipes (two descriptors each) one shard opens at its start for poll replies sent
/// without a copy (`splice.rs`, issue 12 item 2): replies being written at once beyond this are
/// copied. Four cover the consumers one shard usually serves at a time; an idle pipe holds no
/// memory.
pub const SPLICE_PIPES_PER_SHARD_MAX: usize = 4;
/// Descriptors all splice pipes of the process may hold together, taken out of `FD_RESERVE`
/// (the partition and connection budgets are not touched); beyond it replies are copied.
pub const SPLICE_PIPE_FDS_MAX: usize = 64;
/// Poll replies whose verified spans total fewer bytes than this are copied, not spliced: a
/// spliced reply costs a separate header write plus a vmsplice and a splice per span (page
/// pinning, pipe bookkeeping), which for small replies costs more CPU than copying the bytes.
/// Measured with 68-byte dpkg messages in batches of 100 (replies of a few KiB): splicing them
/// cost 1.4x the consume CPU per GB of copying them (issue 12 item 2). 64 KiB copies in about
/// 6 us here, the order of those fixed costs.
pub const SPLICE_REPLY_BYTES_MIN: u64 = 64 * 1024;
/// Capacity asked of each splice pipe (`F_SETPIPE_SZ`): bytes moved per vmsplice + splice round.
/// 1 MiB is Linux's default `/proc/sys/fs/pipe-max-size`; a smaller limit leaves the pipe at the
/// default 64 KiB (more rounds, same bytes).
pub const SPLICE_PIPE_BYTES: usize = 1024 * 1024;
/// File descriptors budgeted per partition: its active segment, a second file while rolling (the
/// index file being written, then the next segment) or during recovery (a quarantine file), and
/// the closed segment files its log holds open for reads, kept or held by reads in flight
/// (`storage::limits::CLOSED_SEGMENT_FILES_OPEN_MAX`, an upper bound: concurrent reads of other
/// closed segments wait for a slot). Closed segments hold no descriptor otherwise, so the count
/// grows neither with the number of segments nor with concurrent polls. Under `--write-mode
/// direct` the active segment's `O_DIRECT` descriptor is the second file between rolls: a roll
/// (and a rollback) closes it before it opens anything, and the next write opens it again.
pub const FDS_PER_PARTITION: u64 = 2 + storage::limits::CLOSED_SEGMENT_FILES_OPEN_MAX as u64;
/// Fraction of the open-file limit (after the reserve) given to partitions; the rest is for
/// client connections.
pub const PARTITION_FD_SHARE_PERCENT: u64 = 50;
/// Listen backlog of each shard's SO_REUSEPORT socket.
pub const LISTEN_BACKLOG: i32 = 1024;
/// Replies cached per client session: a client has one request in flight, so one would do; a
/// few more let a client that pipelines in a later version, or retries late, still get its reply
/// instead of `RequestStale`. Metadata replies are a header's worth of fields, so 8 cost little.
pub const REPLY_RING_LEN_MAX: usize = 8;
/// Default `--clients-table-max`: client sessions shard 0 keeps before it evicts the least
/// recently committed one. A session is a few hundred bytes plus its cached replies.
pub const CLIENTS_TABLE_MAX_DEFAULT: usize = 4096;
/// Upper bound of `--clients-table-max` (1 Mi sessions: a few hundred MiB of snapshot at most).
pub const CLIENTS_TABLE_MAX_LIMIT: usize = 1 << 20;
/// Default `--checkpoint-interval`: committed metadata ops between checkpoints. Boot replays at
/// most this many journal records above the snapshot, and the journal holds about as many.
pub const CHECKPOINT_INTERVAL_DEFAULT: u64 = 1024;
/// Upper bound of `--checkpoint-interval`; the journal keeps every op above the checkpoint, so
/// this bounds its size (and boot's replay) by ops times the 1 MiB record limit in the worst case.
pub const CHECKPOINT_INTERVAL_LIMIT: u64 = 1 << 20;
/// Folder of the metadata journal (WAL) under the data directory (`storage/FORMAT.md` section 8).
pub const JOURNAL_DIR_NAME: &str = "journal";
/// Environment variable naming a failpoint for crash tests (`shards::store::failpoint`).
pub const FAILPOINT_ENV: &str = "SHARDLINE_FAILPOINT";
/// After answering an oversized request `MessageTooLarge`, the server discards what the client
/// still sends (up to the frame's announced size) for at most this long before it closes, so the
/// close does not reset the connection and destroy the reply unread.
pub const OVERSIZED_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Buffer of that discard loop (bytes): one per refused connection, briefly.
pub const OVERSIZED_DRAIN_CHUNK_BYTES: usize = 64 * 1024;
/// Batches remembered per idempotent producer and partition (`producers.rs`): a resend of any of
/// them is answered with its original offsets. Kafka keeps the same 5
/// (`max.in.flight.requests.per.connection` <= 5 with idempotence); our client has one request in
/// flight, so 5 leaves room for resends that arrive late.
pub const PRODUCER_WINDOW_BATCH_COUNT: usize = 5;
/// Producer-partition states one shard keeps; one more evicts the least recently used (whose
/// next batch is then taken as a first batch). A state is about 250 bytes (five remembered
/// batches, keys, eviction order), so 32 Ki states are about 8 MiB per shard.
pub const PRODUCER_STATE_COUNT_MAX: usize = 32 * 1024;
/// How long startup retries a listen address that is in use before it gives up: covers the few
/// milliseconds a server killed by SIGKILL keeps its listeners, with room for a loaded host.
pub const LISTEN_BIND_RETRY_MAX: Duration = Duration::from_secs(5);
/// Pause between two binds of an address in use.
pub const LISTEN_BIND_RETRY_SLEEP: Duration = Duration::from_millis(20);
/// At most one warning line per shard per this interval for failing accepts, with a count.
pub const ACCEPT_WARNING_INTERVAL: Duration = Duration::from_secs(1);
/// Pause before the next accept after a failure that a reserve descriptor cannot absorb.
pub const ACCEPT_RETRY_SLEEP: Duration = Duration::from_millis(10);
/// Longest wait to hand a refused client its `ResourceExhausted` frame (a few hundred bytes, which
/// any socket buffer takes at once) before the close.
pub const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Default consensus tick (`--tick-ms`): every VSR timer counts these.
pub const TICK_DEFAULT: Duration = Duration::from_millis(10);
/// Default `--heartbeat-ticks`: an idle primary sends `Commit` every 100 ms.
pub const HEARTBEAT_TICKS_DEFAULT: u64 = 10;
/// Default `--view-change-timeout-ticks`: a backup that heard nothing from its primary for
/// 300 ms (3 missed heartbeats) starts a view change.
pub const VIEW_CHANGE_TIMEOUT_TICKS_DEFAULT: u64 = 30;
/// Largest `--heartbeat-ticks` and `--view-change-timeout-ticks`: at the longest tick (1 s) a
/// million ticks is 11 days without a heartbeat or a failover, past any use; the bound keeps
/// `now + timeout` (and the randomized doubling of the view-change timeout) far from `u64`
/// overflow.
pub const TIMER_TICKS_MAX: u64 = 1_000_000;
const _: () = assert!(HEARTBEAT_TICKS_DEFAULT < VIEW_CHANGE_TIMEOUT_TICKS_DEFAULT);
const _: () = assert!(VIEW_CHANGE_TIMEOUT_TICKS_DEFAULT <= TIMER_TICKS_MAX);
/// Prepares a primary keeps in flight (prepared, not yet committed): concurrent clients' changes
/// share fsyncs, and a view change carries at most this many uncommitted prepares.
pub const PIPELINE_PREPARE_MAX: usize = 8;
/// Largest replica-bus frame (bytes, header included; `vsr::wire`): a DoViewChange or StartView
/// of `PIPELINE_PREPARE_MAX` journal records of the largest body
/// (`storage::limits::JOURNAL_RECORD_SIZE_MAX`) behind its 4-byte count, about 8 MiB. A peer's
/// frame announcing more is refused before its body is read.
pub const REPLICA_MESSAGE_SIZE_MAX: u32 =
    (bus::HEADER_SIZE + 4 + PIPELINE_PREPARE_MAX * storage::limits::JOURNAL_RECORD_SIZE_MAX) as u32;
/// Once a replica-link frame's header arrived, the rest of the frame (its body, up to
/// `REPLICA_MESSAGE_SIZE_MAX`, about 8 MiB) must arrive within this long, or the link closes: a
/// healthy peer on any working network sends 8 MiB in well under a second, and a stalled sender
/// must not pin a partly received body indefinitely.
pub const REPLICA_FRAME_REST_TIMEOUT: Duration = Duration::from_secs(10);
/// A replica-link body is read in chunks of this many bytes into a buffer that grows as they
/// arrive, so a header announcing 8 MiB costs memory only for what was actually sent.
pub const REPLICA_BODY_READ_CHUNK_BYTES: usize = 64 * 1024;
/// Inbound replica links per peer counted into the cap below: the peer's current link plus its
/// reconnect (the new link arrives before the old one is noticed closed).
pub const REPLICA_INBOUND_LINKS_PER_PEER: usize = 2;
/// Inbound replica links allowed beyond `REPLICA_INBOUND_LINKS_PER_PEER` per replica: room for
/// connections that have not sent their Hello yet (a probe, a refused peer retrying).
pub const REPLICA_INBOUND_LINKS_SPARE: usize = 4;
/// Largest number of inbound replica links (Hello pending or established) a replica holds at
/// once; one more is closed on accept with a rate-limited log line. Together with the
/// one-link-per-peer-index rule and `REPLICA_FRAME_REST_TIMEOUT` this bounds what unknown
/// connections can pin: at most this many partly received frames of `REPLICA_MESSAGE_SIZE_MAX`.
pub const fn replica_inbound_links_max(replica_count: usize) -> usize {
    replica_count * REPLICA_INBOUND_LINKS_PER_PEER + REPLICA_INBOUND_LINKS_SPARE
}
/// A replica link's up/down lines are logged the first time, then at most once per this
/// interval per peer with how many were not logged (a peer that refuses our link would
/// otherwise log several lines a second for as long as it runs).
pub const REPLICA_LINK_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// An outbound replica link that goes down within this long of its Hello was most likely closed
/// by the peer refusing the Hello (different cluster id or `--addresses`); such a link does not
/// reset the reconnect backoff, so a refusing peer is retried about once a second, not 20 times.
pub const REPLICA_LINK_REFUSED_WINDOW: Duration = Duration::from_secs(1);

const _: () =
    assert!(SHUTDOWN_DRAIN_DEADLINE.as_secs() < runtime::launcher::SHUTDOWN_DEADLINE.as_secs());
const _: () = assert!(LISTEN_BIND_RETRY_SLEEP.as_millis() < LISTEN_BIND_RETRY_MAX.as_millis());

/// Default `--group-session-timeout-ms`: a consumer-group member that sends no heartbeat (nor
/// join or store) for this long is removed and its partitions reassigned (issue 11 section 2).
/// Kafka's `session.timeout.ms` defaulted to 10 s for years; long enough for a member's poll loop
/// to heartbeat between polls, short enough that a dead member's partitions move soon.
pub const GROUP_SESSION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Shortest accepted group session timeout: below this a member's ordinary poll round trip
/// could outlast its session.
pub const GROUP_SESSION_TIMEOUT_MIN: Duration = Duration::from_millis(100);
/// Longest accepted group session timeout: a dead member keeps its partitions unread this long.
pub const GROUP_SESSION_TIMEOUT_MAX: Duration = Duration::from_hours(1);
/// Live members one consumer group holds; one more join is refused `ResourceExhausted`. Bounds
/// the primary's soft state per group (each member: about 100 bytes plus its held partitions)
/// and the work of one rebalance (members × partitions).
pub const GROUP_MEMBER_COUNT_MAX: usize = 1024;
/// Default `--retention-interval` (issue 11 section 4): how often each shard applies topic
/// retention to the partitions it owns besides after every roll. 10 s keeps an age limit within
/// seconds of exact while a pass costs one header read per expired segment.
pub const RETENTION_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// Shortest `--retention-interval`: one consensus tick; shorter only burns CPU.
pub const RETENTION_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// Longest `--retention-interval` (one day): an age limit is enforced at least this often.
pub const RETENTION_INTERVAL_MAX: Duration = Duration::from_hours(24);
const _: () = assert!(RETENTION_INTERVAL_MIN.as_nanos() <= RETENTION_INTERVAL_DEFAULT.as_nanos());
const _: () = assert!(RETENTION_INTERVAL_DEFAULT.as_nanos() <= RETENTION_INTERVAL_MAX.as_nanos());

// Splice pipes take at most a quarter of the reserve, which also holds listeners, rings, logs.
const _: () = assert!(SPLICE_PIPE_FDS_MAX as u64 <= FD_RESERVE / 4);
