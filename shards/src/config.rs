//! Server configuration and its validation. Every rejection names the `serve` flag that sets the
//! key (a name a user can set, never only the internal key), the value and the rule (DESIGN
//! section 11). Never reads the environment or flags itself: `tools` does that.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::limits::{CHECKPOINT_INTERVAL_LIMIT, CLIENTS_TABLE_MAX_LIMIT, TIMER_TICKS_MAX};
use runtime::{IoDriver, TopologyConfig};
use storage::FsyncPolicy;

/// Smallest accepted `max_message_size`: a header plus a batch of one small message must fit.
pub const MESSAGE_SIZE_MIN: u32 = 1024;
/// Largest accepted `max_message_size`: one batch becomes one storage entry.
pub const MESSAGE_SIZE_MAX: u32 = storage::limits::ENTRY_SIZE_MAX;
/// Longest idle poll window: beyond 10 ms an idle shard is simply a busy loop.
pub const IDLE_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(10);
/// Shortest connection idle timeout: clients need some time between requests.
pub const CONNECTION_IDLE_TIMEOUT_MIN: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest connection idle timeout (one day).
pub const CONNECTION_IDLE_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_hours(24);
/// Smallest segment size (bytes); tests roll segments with small values.
pub const SEGMENT_SIZE_MIN: u64 = 4096;
/// Replica counts a cluster may have (`--addresses` lists this many): 1, or 3 and 5, which
/// tolerate 1 and 2 failed replicas (VSR needs 2f + 1; an even count tolerates no more than the
/// odd count below it).
pub const REPLICA_COUNTS: [usize; 3] = [1, 3, 5];
/// Shortest consensus tick: timers finer than a millisecond only burn CPU.
pub const TICK_MIN: std::time::Duration = std::time::Duration::from_millis(1);
/// Longest consensus tick: beyond one second a failover takes tens of seconds with default
/// tick counts.
pub const TICK_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// Smallest metadata journal segment (bytes): small enough that tests and the simulator see
/// segments roll and release (issue 9 section 0), large enough for many typical prepares.
pub const JOURNAL_SEGMENT_SIZE_MIN: u64 = 64 * 1024;
/// Largest metadata journal segment (bytes): the journal's hard maximum, because opening the
/// journal reads one whole segment into memory ([`storage::limits::JOURNAL_SEGMENT_SIZE_MAX`]).
pub const JOURNAL_SEGMENT_SIZE_MAX: u64 = storage::limits::JOURNAL_SEGMENT_SIZE_MAX;
/// Smallest `max_message_size` that carries one state chunk (issue 9 section 5): the 256-byte
/// chunk header plus one payload byte. A frame over a peer's limit tears down the whole replica
/// connection, so a smaller limit could never serve a chunk.
pub const STATE_CHUNK_MESSAGE_SIZE_MIN: u32 = bus::HEADER_SIZE as u32 + 1;

const _: () = assert!(MESSAGE_SIZE_MIN as usize > bus::HEADER_SIZE + bus::BATCH_HEADER_SIZE);
const _: () = assert!(MESSAGE_SIZE_MAX >= bus::limits::MESSAGE_SIZE_MAX_DEFAULT);
const _: () = assert!(MESSAGE_SIZE_MIN >= STATE_CHUNK_MESSAGE_SIZE_MIN);
const _: () = assert!(JOURNAL_SEGMENT_SIZE_MIN <= JOURNAL_SEGMENT_SIZE_MAX);
// A maximal journal record still gets a segment of its own above any configured size.
const _: () = assert!(
    storage::limits::JOURNAL_RECORD_SIZE_MAX as u64 <= storage::limits::JOURNAL_SEGMENT_SIZE_MAX
);

/// Largest `--replica` index: the largest replica count in [`REPLICA_COUNTS`], less one.
pub const REPLICA_INDEX_MAX: u8 = 4;
const _: () = assert!(REPLICA_INDEX_MAX as usize + 1 == REPLICA_COUNTS[REPLICA_COUNTS.len() - 1]);

/// A key whose rule is a fixed range of whole numbers of one unit (DESIGN section 11: a bad
/// value names the key, the value and the rule). [`ServerConfig::validate`] checks it, and the
/// `serve` flag parsers check the same range and state the same rule before a configuration
/// exists, so that a flag, a `SHARDLINE_*` variable or a config-file value out of range is a
/// usage error naming that flag or key, worded as `validate` words it. Rules that relate two
/// keys (`--view-change-timeout-ticks` above `--heartbeat-ticks`, `--replica` below the replica
/// count) stay `validate`'s alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangedKey {
    /// `--max-message-size`, bytes.
    MaxMessageSize,
    /// `--inbox-capacity`, frames.
    InboxCapacity,
    /// `--segment-size`, bytes.
    SegmentSize,
    /// `--idle-poll-us`, microseconds.
    IdlePollUs,
    /// `--idle-timeout-s`, seconds.
    IdleTimeoutS,
    /// `--clients-table-max`, sessions.
    ClientsTableMax,
    /// `--parked-polls-max`, parked polls per shard.
    ParkedPollsMax,
    /// `--checkpoint-interval`, committed ops.
    CheckpointInterval,
    /// `--journal-segment-size`, bytes.
    JournalSegmentSize,
    /// `--tick-ms`, milliseconds.
    TickMs,
    /// `--heartbeat-ticks`, ticks.
    HeartbeatTicks,
    /// `--view-change-timeout-ticks`, ticks (and above `--heartbeat-ticks`, which `validate`
    /// checks).
    ViewChangeTimeoutTicks,
}

impl RangedKey {
    /// Every ranged key, in `validate`'s order.
    pub const ALL: [RangedKey; 12] = [
        RangedKey::MaxMessageSize,
        RangedKey::InboxCapacity,
        RangedKey::SegmentSize,
        RangedKey::IdlePollUs,
        RangedKey::IdleTimeoutS,
        RangedKey::ClientsTableMax,
        RangedKey::ParkedPollsMax,
        RangedKey::CheckpointInterval,
        RangedKey::JournalSegmentSize,
        RangedKey::TickMs,
        RangedKey::HeartbeatTicks,
        RangedKey::ViewChangeTimeoutTicks,
    ];

    /// The `ServerConfig` field as `ConfigError::Invalid::key` names it.
    pub fn key(self) -> &'static str {
        match self {
            RangedKey::MaxMessageSize => "max_message_size",
            RangedKey::InboxCapacity => "inbox_capacity",
            RangedKey::SegmentSize => "segment_size_max",
            RangedKey::IdlePollUs => "idle_poll_us",
            RangedKey::IdleTimeoutS => "connection_idle_timeout_s",
            RangedKey::ClientsTableMax => "clients_table_max",
            RangedKey::ParkedPollsMax => "parked_polls_max",
            RangedKey::CheckpointInterval => "checkpoint_interval",
            RangedKey::JournalSegmentSize => "journal_segment_size_max",
            RangedKey::TickMs => "tick",
            RangedKey::HeartbeatTicks => "heartbeat_ticks",
            RangedKey::ViewChangeTimeoutTicks => "view_change_timeout_ticks",
        }
    }

    /// The `serve` flag that sets this key (`--tick-ms`).
    pub fn flag(self) -> &'static str {
        flag_of(self.key())
    }

    /// The accepted values, inclusive, in the key's unit.
    pub fn range(self) -> std::ops::RangeInclusive<u64> {
        // usize -> u64 is lossless on every target shardline builds for (64-bit Linux).
        match self {
            RangedKey::MaxMessageSize => u64::from(MESSAGE_SIZE_MIN)..=u64::from(MESSAGE_SIZE_MAX),
            RangedKey::InboxCapacity => 1..=runtime::limits::INBOX_CAPACITY_MAX as u64,
            RangedKey::SegmentSize => SEGMENT_SIZE_MIN..=storage::limits::SEGMENT_SIZE_MAX_LIMIT,
            RangedKey::IdlePollUs => 0..=IDLE_POLL_MAX.as_micros() as u64,
            RangedKey::IdleTimeoutS => {
                CONNECTION_IDLE_TIMEOUT_MIN.as_secs()..=CONNECTION_IDLE_TIMEOUT_MAX.as_secs()
            }
            RangedKey::ClientsTableMax => 1..=CLIENTS_TABLE_MAX_LIMIT as u64,
            RangedKey::ParkedPollsMax => 1..=crate::limits::PARKED_POLLS_MAX_LIMIT as u64,
            RangedKey::CheckpointInterval => 1..=CHECKPOINT_INTERVAL_LIMIT,
            RangedKey::JournalSegmentSize => JOURNAL_SEGMENT_SIZE_MIN..=JOURNAL_SEGMENT_SIZE_MAX,
            RangedKey::TickMs => TICK_MIN.as_millis() as u64..=TICK_MAX.as_millis() as u64,
            RangedKey::HeartbeatTicks => 1..=TIMER_TICKS_MAX,
            RangedKey::ViewChangeTimeoutTicks => 2..=TIMER_TICKS_MAX,
        }
    }

    /// The rule, as errors state it after the key and the value: `must be between 1 and
    /// 1000 ms`.
    pub fn rule(self) -> String {
        let range = self.range();
        let (min, max) = (range.start(), range.end());
        match self {
            RangedKey::MaxMessageSize => format!(
                "must be between {min} and {max} bytes (the 256-byte header plus at least one \
                 batch must fit)"
            ),
            RangedKey::InboxCapacity => format!("must be between {min} and {max} frames"),
            RangedKey::SegmentSize => format!("must be between {min} and {max} bytes"),
            RangedKey::IdlePollUs => format!("must be between {min} and {max} µs"),
            RangedKey::IdleTimeoutS => format!("must be between {min} and {max} seconds"),
            RangedKey::ClientsTableMax => format!("must be between {min} and {max} sessions"),
            RangedKey::ParkedPollsMax => {
                format!("must be between {min} and {max} parked polls per shard")
            }
            RangedKey::CheckpointInterval => format!("must be between {min} and {max} ops"),
            RangedKey::JournalSegmentSize => format!(
                "must be between {min} and {max} bytes (64KiB..=64MiB: opening the journal reads \
                 a whole segment into memory)"
            ),
            RangedKey::TickMs => format!("must be between {min} and {max} ms"),
            RangedKey::HeartbeatTicks | RangedKey::ViewChangeTimeoutTicks => {
                format!("must be between {min} and {max} ticks")
            }
        }
    }

    /// `value` (in the key's unit) against [`RangedKey::range`].
    ///
    /// # Errors
    /// `ConfigError::Invalid` naming the flag, `value` and [`RangedKey::rule`].
    pub fn check(self, value: u64) -> Result<(), ConfigError> {
        if self.range().contains(&value) {
            Ok(())
        } else {
            Err(self.refusal(value.to_string()))
        }
    }

    /// The `ConfigError::Invalid` of a value `value` (as the error shows it) out of range.
    fn refusal(self, value: String) -> ConfigError {
        ConfigError::Invalid {
            flag: self.flag(),
            key: self.key(),
            value,
            rule: self.rule(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub topology: TopologyConfig,
    pub io_driver: IoDriver,
    /// Frames per shard inbox (and per reply lane).
    pub inbox_capacity: usize,
    /// Client listener; port 0 picks a free port shared by every shard.
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub fsync: FsyncPolicy,
    /// Buffered or `O_DIRECT` partition log writes (`--write-mode`; `storage::WriteMode`).
    pub write_mode: storage::WriteMode,
    /// Largest message (header + body) accepted or sent, bytes.
    pub max_message_size: u32,
    /// Partition segment size before rolling, bytes.
    pub segment_size_max: u64,
    /// Idle poll window of every shard before it parks (see `runtime::block_on_with_idle_poll`).
    pub idle_poll: std::time::Duration,
    /// A connection with no complete frame header for this long is closed.
    pub connection_idle_timeout: std::time::Duration,
    /// Client sessions shard 0 keeps; registering one more evicts the least recently committed.
    pub clients_table_max: usize,
    /// Polls with a wait one shard holds parked at once (issue 11 section 3); one more is
    /// refused with `ResourceExhausted`.
    pub parked_polls_max: usize,
    /// Committed metadata ops between checkpoints (snapshot, superblock, journal release).
    pub checkpoint_interval: u64,
    /// Metadata journal segment size before it rolls, bytes ([`JOURNAL_SEGMENT_SIZE_MIN`] ..=
    /// [`JOURNAL_SEGMENT_SIZE_MAX`]). A checkpoint releases whole segments only, so this is
    /// how much journal a replica keeps at least (issue 9 section 0).
    pub journal_segment_size_max: u64,
    /// Cluster id: every replica of one cluster has the same; a replica frame from another
    /// cluster is dropped, and a data directory formatted for another cluster refuses to boot.
    pub cluster: u128,
    /// This replica's index into `addresses` (0 when `addresses` is empty).
    pub replica: u8,
    /// Replica-to-replica addresses, one per replica, in replica-index order (1, 3 or 5 of them).
    /// Empty: a single replica with no replica bus (today's behaviour).
    pub addresses: Vec<SocketAddr>,
    /// Length of one consensus tick; every VSR timer below counts ticks.
    pub tick: std::time::Duration,
    /// Ticks between two primary heartbeats (`Commit` messages) when no prepare carries the
    /// commit number.
    pub heartbeat_ticks: u64,
    /// Ticks a backup waits without hearing from its primary before it starts a view change
    /// (randomized up to twice this, so two backups do not collide forever).
    pub view_change_timeout_ticks: u64,
    /// A consumer-group member silent for this long is removed and its partitions reassigned
    /// (issue 11 section 2; [`crate::limits::GROUP_SESSION_TIMEOUT_MIN`] ..=
    /// [`crate::limits::GROUP_SESSION_TIMEOUT_MAX`]).
    pub group_session_timeout: std::time::Duration,
    /// How often each shard applies topic retention to the partitions it owns (issue 11
    /// section 4); a pass also runs after every acknowledged roll.
    /// [`crate::limits::RETENTION_INTERVAL_MIN`] ..= [`crate::limits::RETENTION_INTERVAL_MAX`].
    pub retention_interval: std::time::Duration,
}

impl ServerConfig {
    /// Replicas in the cluster: the number of `addresses`, or 1 without them.
    pub fn replica_count(&self) -> u8 {
        u8::try_from(self.addresses.len().max(1)).unwrap_or(u8::MAX)
    }

    /// A configuration with defaults for everything but the data directory.
    pub fn new(data_dir: PathBuf) -> ServerConfig {
        ServerConfig {
            topology: TopologyConfig {
                shards: runtime::ShardCountArg::All,
                cpus: None,
                pin: true,
            },
            io_driver: IoDriver::IoUring,
            inbox_capacity: runtime::limits::INBOX_CAPACITY_DEFAULT,
            listen: SocketAddr::from(([127, 0, 0, 1], 8090)),
            data_dir,
            fsync: FsyncPolicy::Always,
            write_mode: storage::WriteMode::Buffered,
            max_message_size: bus::limits::MESSAGE_SIZE_MAX_DEFAULT,
            segment_size_max: storage::limits::SEGMENT_SIZE_MAX_DEFAULT,
            idle_poll: std::time::Duration::ZERO,
            connection_idle_timeout: crate::limits::CONNECTION_IDLE_TIMEOUT,
            clients_table_max: crate::limits::CLIENTS_TABLE_MAX_DEFAULT,
            parked_polls_max: crate::limits::PARKED_POLLS_MAX_DEFAULT,
            checkpoint_interval: crate::limits::CHECKPOINT_INTERVAL_DEFAULT,
            journal_segment_size_max: storage::limits::JOURNAL_SEGMENT_SIZE_MAX,
            cluster: 0,
            replica: 0,
            addresses: Vec::new(),
            tick: crate::limits::TICK_DEFAULT,
            heartbeat_ticks: crate::limits::HEARTBEAT_TICKS_DEFAULT,
            view_change_timeout_ticks: crate::limits::VIEW_CHANGE_TIMEOUT_TICKS_DEFAULT,
            group_session_timeout: crate::limits::GROUP_SESSION_TIMEOUT_DEFAULT,
            retention_interval: crate::limits::RETENTION_INTERVAL_DEFAULT,
        }
    }

    /// Checks every value against its rule.
    ///
    /// # Errors
    /// `ConfigError::Invalid` naming the key, the value and the rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, value: String, rule: String| ConfigError::Invalid {
            flag: flag_of(key),
            key,
            value,
            rule,
        };
        if self.max_message_size < STATE_CHUNK_MESSAGE_SIZE_MIN {
            return Err(invalid(
                "max_message_size",
                self.max_message_size.to_string(),
                format!(
                    "must be at least {STATE_CHUNK_MESSAGE_SIZE_MIN} bytes to carry one \
                     state-chunk header ({} bytes) plus one payload byte (issue 9 section 5); \
                     the accepted range is between {MESSAGE_SIZE_MIN} and {MESSAGE_SIZE_MAX} bytes",
                    bus::HEADER_SIZE
                ),
            ));
        }
        RangedKey::MaxMessageSize.check(u64::from(self.max_message_size))?;
        RangedKey::InboxCapacity.check(self.inbox_capacity as u64)?;
        RangedKey::SegmentSize.check(self.segment_size_max)?;
        let session_range =
            crate::limits::GROUP_SESSION_TIMEOUT_MIN..=crate::limits::GROUP_SESSION_TIMEOUT_MAX;
        if !session_range.contains(&self.group_session_timeout) {
            return Err(invalid(
                "group_session_timeout",
                format!("{}ms", self.group_session_timeout.as_millis()),
                format!(
                    "must be between {} ms and {} s",
                    session_range.start().as_millis(),
                    session_range.end().as_secs()
                ),
            ));
        }
        // Durations are compared as durations (a library caller may set sub-unit values); the
        // error shows them in the flag's unit.
        if self.idle_poll > IDLE_POLL_MAX {
            return Err(RangedKey::IdlePollUs.refusal(self.idle_poll.as_micros().to_string()));
        }
        if !(CONNECTION_IDLE_TIMEOUT_MIN..=CONNECTION_IDLE_TIMEOUT_MAX)
            .contains(&self.connection_idle_timeout)
        {
            return Err(
                RangedKey::IdleTimeoutS.refusal(self.connection_idle_timeout.as_secs().to_string())
            );
        }
        RangedKey::ClientsTableMax.check(self.clients_table_max as u64)?;
        RangedKey::ParkedPollsMax.check(self.parked_polls_max as u64)?;
        RangedKey::CheckpointInterval.check(self.checkpoint_interval)?;
        RangedKey::JournalSegmentSize.check(self.journal_segment_size_max)?;
        if let runtime::ShardCountArg::Count(0) = self.topology.shards {
            return Err(invalid(
                "shards",
                "0".to_owned(),
                format!(
                    "shard count must be between 1 and {}",
                    runtime::limits::SHARD_COUNT_MAX
                ),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid(
                "data_dir",
                String::new(),
                "must name a directory".to_owned(),
            ));
        }
        self.validate_cluster()
    }

    /// The cluster keys' rules (issue 8 section 3), each error naming flag, value and rule.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, value: String, rule: String| ConfigError::Invalid {
            flag: flag_of(key),
            key,
            value,
            rule,
        };
        let addresses = || {
            self.addresses
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        if !self.addresses.is_empty() && !REPLICA_COUNTS.contains(&self.addresses.len()) {
            return Err(invalid(
                "addresses",
                addresses(),
                format!(
                    "must list 1, 3 or 5 replica addresses (the replica count; VSR needs 2f+1 \
                     replicas to survive f failures), not {}",
                    self.addresses.len()
                ),
            ));
        }
        if usize::from(self.replica) >= self.addresses.len().max(1) {
            return Err(invalid(
                "replica",
                self.replica.to_string(),
                if self.addresses.is_empty() {
                    "a replica index needs --addresses (one replica address per replica, this \
                     one's at index --replica); without them the server is a single replica, \
                     index 0"
                        .to_owned()
                } else {
                    format!(
                        "must be below the replica count {} (the number of --addresses)",
                        self.replica_count()
                    )
                },
            ));
        }
        for (index, address) in self.addresses.iter().enumerate() {
            if address.port() == 0 {
                return Err(invalid(
                    "addresses",
                    addresses(),
                    format!(
                        "replica {index}'s address {address} has port 0: peers must know the \
                         port to connect to"
                    ),
                ));
            }
            if let Some(first) = self.addresses[..index].iter().position(|a| a == address) {
                return Err(invalid(
                    "addresses",
                    addresses(),
                    format!(
                        "replicas {first} and {index} share the address {address}: each \
                         replica needs its own"
                    ),
                ));
            }
        }
        if let Some(index) = self.addresses.iter().position(|a| *a == self.listen) {
            // Another replica's address too: binding it means running on that replica's host
            // and port (or naming an address this host does not have).
            let whose = if index == usize::from(self.replica) {
                format!("this replica's (--replica {index})")
            } else {
                format!("replica {index}'s")
            };
            return Err(invalid(
                "listen",
                self.listen.to_string(),
                format!(
                    "is also {whose} replica address in --addresses: clients and replicas need \
                     different addresses"
                ),
            ));
        }
        if !(TICK_MIN..=TICK_MAX).contains(&self.tick) {
            return Err(RangedKey::TickMs.refusal(self.tick.as_millis().to_string()));
        }
        RangedKey::HeartbeatTicks.check(self.heartbeat_ticks)?;
        if self.view_change_timeout_ticks <= self.heartbeat_ticks {
            return Err(invalid(
                "view_change_timeout_ticks",
                self.view_change_timeout_ticks.to_string(),
                format!(
                    "must be greater than --heartbeat-ticks ({}): a backup that starts a view \
                     change before the next heartbeat could arrive deposes a healthy primary",
                    self.heartbeat_ticks
                ),
            ));
        }
        RangedKey::ViewChangeTimeoutTicks.check(self.view_change_timeout_ticks)?;
        let (interval_min, interval_max) = (
            crate::limits::RETENTION_INTERVAL_MIN,
            crate::limits::RETENTION_INTERVAL_MAX,
        );
        if !(interval_min..=interval_max).contains(&self.retention_interval) {
            return Err(invalid(
                "retention_interval",
                format!("{}ms", self.retention_interval.as_millis()),
                format!(
                    "must be between {} ms and {} s",
                    interval_min.as_millis(),
                    interval_max.as_secs()
                ),
            ));
        }
        Ok(())
    }
}

/// The `serve` flag that sets a configuration key.
fn flag_of(key: &'static str) -> &'static str {
    match key {
        "max_message_size" => "--max-message-size",
        "inbox_capacity" => "--inbox-capacity",
        "segment_size_max" => "--segment-size",
        "idle_poll_us" => "--idle-poll-us",
        "connection_idle_timeout_s" => "--idle-timeout-s",
        "clients_table_max" => "--clients-table-max",
        "parked_polls_max" => "--parked-polls-max",
        "checkpoint_interval" => "--checkpoint-interval",
        "journal_segment_size_max" => "--journal-segment-size",
        "shards" => "--shards",
        "data_dir" => "--data-dir",
        "listen" => "--listen",
        "cluster" => "--cluster",
        "replica" => "--replica",
        "addresses" => "--addresses",
        "tick" => "--tick-ms",
        "heartbeat_ticks" => "--heartbeat-ticks",
        "view_change_timeout_ticks" => "--view-change-timeout-ticks",
        "group_session_timeout" => "--group-session-timeout",
        "retention_interval" => "--retention-interval",
        _ => key,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Names the flag, the value and the rule; `key` is the `ServerConfig` field, for callers
    /// that configure the server without flags.
    #[error("invalid {flag} value {value:?}: {rule}")]
    Invalid {
        flag: &'static str,
        key: &'static str,
        value: String,
        rule: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_message_size_below_minimum_names_key_value_rule() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.max_message_size = 1000;
        let message = config.validate().unwrap_err().to_string();
        assert!(
            message.starts_with("invalid --max-message-size value \"1000\": must be between 1024"),
            "{message}"
        );
    }

    #[test]
    fn inbox_capacity_zero_rejected() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.inbox_capacity = 0;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--inbox-capacity value \"0\"")
        );
    }

    #[test]
    fn issue11_3_parked_polls_max_bounds_name_the_flag() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        for bad in [0, crate::limits::PARKED_POLLS_MAX_LIMIT + 1] {
            config.parked_polls_max = bad;
            let message = config.validate().unwrap_err().to_string();
            assert!(
                message.starts_with(&format!(
                    "invalid --parked-polls-max value \"{bad}\": must be between 1 and 1048576"
                )),
                "{message}"
            );
        }
        config.parked_polls_max = crate::limits::PARKED_POLLS_MAX_LIMIT;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn clients_table_max_and_checkpoint_interval_bounds() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.clients_table_max = 0;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            format!(
                "invalid --clients-table-max value \"0\": must be between 1 and \
                 {CLIENTS_TABLE_MAX_LIMIT} sessions"
            )
        );
        config.clients_table_max = 1;
        config.checkpoint_interval = CHECKPOINT_INTERVAL_LIMIT + 1;
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .starts_with("invalid --checkpoint-interval value")
        );
    }

    #[test]
    fn issue9_journal_segment_size_bounds_name_flag_value_rule() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        assert_eq!(
            config.journal_segment_size_max,
            storage::limits::JOURNAL_SEGMENT_SIZE_MAX
        );
        for bytes in [JOURNAL_SEGMENT_SIZE_MIN - 1, JOURNAL_SEGMENT_SIZE_MAX + 1] {
            config.journal_segment_size_max = bytes;
            assert_eq!(
                config.validate().unwrap_err().to_string(),
                format!(
                    "invalid --journal-segment-size value \"{bytes}\": must be between 65536 \
                     and 67108864 bytes (64KiB..=64MiB: opening the journal reads a whole \
                     segment into memory)"
                )
            );
        }
        for bytes in [JOURNAL_SEGMENT_SIZE_MIN, JOURNAL_SEGMENT_SIZE_MAX] {
            config.journal_segment_size_max = bytes;
            config.validate().unwrap();
        }
    }

    #[test]
    fn issue9_max_message_size_must_carry_a_state_chunk() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.max_message_size = bus::HEADER_SIZE as u32;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            format!(
                "invalid --max-message-size value \"256\": must be at least 257 bytes to carry \
                 one state-chunk header (256 bytes) plus one payload byte (issue 9 section 5); \
                 the accepted range is between 1024 and {MESSAGE_SIZE_MAX} bytes"
            )
        );
        config.max_message_size = STATE_CHUNK_MESSAGE_SIZE_MIN;
        let message = config.validate().unwrap_err().to_string();
        assert!(
            message.contains("must be between 1024"),
            "the general minimum still applies above the state-chunk rule: {message}"
        );
    }

    #[test]
    fn issue7_6_segment_size_error_names_the_flag_not_the_field() {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.segment_size_max = 10;
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            format!(
                "invalid --segment-size value \"10\": must be between 4096 and {} bytes",
                storage::limits::SEGMENT_SIZE_MAX_LIMIT
            )
        );
    }

    fn cluster_config(replica: u8, ports: &[u16]) -> ServerConfig {
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.replica = replica;
        config.addresses = ports
            .iter()
            .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
            .collect();
        config
    }

    fn error_of(config: &ServerConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn cluster_of_one_three_or_five_is_valid() {
        for ports in [
            &[7001][..],
            &[7001, 7002, 7003],
            &[7001, 7002, 7003, 7004, 7005],
        ] {
            for replica in 0..ports.len() as u8 {
                cluster_config(replica, ports).validate().unwrap();
            }
        }
    }

    #[test]
    fn replica_count_must_be_one_three_or_five() {
        for ports in [
            &[7001, 7002][..],
            &[7001, 7002, 7003, 7004],
            &[1, 2, 3, 4, 5, 6],
        ] {
            let message = error_of(&cluster_config(0, ports));
            assert!(
                message.starts_with("invalid --addresses value \"127.0.0.1:")
                    && message.contains(&format!(
                        "must list 1, 3 or 5 replica addresses (the replica count; VSR needs \
                         2f+1 replicas to survive f failures), not {}",
                        ports.len()
                    )),
                "{message}"
            );
        }
    }

    #[test]
    fn replica_must_be_below_the_count() {
        assert_eq!(
            error_of(&cluster_config(3, &[7001, 7002, 7003])),
            "invalid --replica value \"3\": must be below the replica count 3 (the number of \
             --addresses)"
        );
        assert_eq!(
            error_of(&cluster_config(1, &[])),
            "invalid --replica value \"1\": a replica index needs --addresses (one replica \
             address per replica, this one's at index --replica); without them the server is a \
             single replica, index 0"
        );
    }

    #[test]
    fn addresses_must_be_distinct_and_have_a_port() {
        assert_eq!(
            error_of(&cluster_config(0, &[7001, 7002, 7001])),
            "invalid --addresses value \"127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7001\": \
             replicas 0 and 2 share the address 127.0.0.1:7001: each replica needs its own"
        );
        assert_eq!(
            error_of(&cluster_config(0, &[7001, 0, 7003])),
            "invalid --addresses value \"127.0.0.1:7001,127.0.0.1:0,127.0.0.1:7003\": replica \
             1's address 127.0.0.1:0 has port 0: peers must know the port to connect to"
        );
    }

    #[test]
    fn own_replica_address_must_differ_from_listen() {
        let mut config = cluster_config(1, &[7001, 7002, 7003]);
        config.listen = SocketAddr::from(([127, 0, 0, 1], 7002));
        assert_eq!(
            error_of(&config),
            "invalid --listen value \"127.0.0.1:7002\": is also this replica's (--replica 1) \
             replica address in --addresses: clients and replicas need different addresses"
        );
        // Another replica's address is refused too (a new user set --listen to it by mistake).
        config.replica = 0;
        assert_eq!(
            error_of(&config),
            "invalid --listen value \"127.0.0.1:7002\": is also replica 1's replica address in \
             --addresses: clients and replicas need different addresses"
        );
    }

    #[test]
    fn tick_must_be_between_1_and_1000_ms() {
        let mut config = cluster_config(0, &[7001, 7002, 7003]);
        for ms in [0, 1001] {
            config.tick = std::time::Duration::from_millis(ms);
            assert_eq!(
                error_of(&config),
                format!("invalid --tick-ms value \"{ms}\": must be between 1 and 1000 ms")
            );
        }
        for ms in [1, 1000] {
            config.tick = std::time::Duration::from_millis(ms);
            config.validate().unwrap();
        }
    }

    #[test]
    fn heartbeat_must_be_a_tick_and_view_change_timeout_longer() {
        let mut config = cluster_config(0, &[7001, 7002, 7003]);
        config.heartbeat_ticks = 0;
        assert_eq!(
            error_of(&config),
            "invalid --heartbeat-ticks value \"0\": must be between 1 and 1000000 ticks"
        );
        config.heartbeat_ticks = TIMER_TICKS_MAX + 1;
        assert_eq!(
            error_of(&config),
            "invalid --heartbeat-ticks value \"1000001\": must be between 1 and 1000000 ticks"
        );
        config.heartbeat_ticks = 10;
        config.view_change_timeout_ticks = TIMER_TICKS_MAX + 1;
        assert_eq!(
            error_of(&config),
            "invalid --view-change-timeout-ticks value \"1000001\": must be between 2 and \
             1000000 ticks"
        );
        config.heartbeat_ticks = 10;
        config.view_change_timeout_ticks = 10;
        assert_eq!(
            error_of(&config),
            "invalid --view-change-timeout-ticks value \"10\": must be greater than \
             --heartbeat-ticks (10): a backup that starts a view change before the next \
             heartbeat could arrive deposes a healthy primary"
        );
        config.view_change_timeout_ticks = 11;
        config.validate().unwrap();
    }

    #[test]
    fn ranged_keys_accept_their_bounds_and_name_flag_value_rule_beyond_them() {
        for key in RangedKey::ALL {
            let (min, max) = (*key.range().start(), *key.range().end());
            assert!(min <= max, "{key:?}");
            key.check(min).unwrap();
            key.check(max).unwrap();
            let beyond = [min.checked_sub(1), max.checked_add(1)];
            for value in beyond.into_iter().flatten() {
                assert_eq!(
                    key.check(value).unwrap_err().to_string(),
                    format!("invalid {} value \"{value}\": {}", key.flag(), key.rule()),
                    "{key:?}"
                );
            }
            assert!(key.flag().starts_with("--"), "{key:?} has a flag");
        }
        let mut config = ServerConfig::new(PathBuf::from("/tmp/x"));
        config.idle_poll = std::time::Duration::from_micros(10_001);
        assert_eq!(
            error_of(&config),
            "invalid --idle-poll-us value \"10001\": must be between 0 and 10000 µs"
        );
    }

    #[test]
    fn defaults_are_valid() {
        ServerConfig::new(PathBuf::from("/tmp/x"))
            .validate()
            .unwrap();
    }
}
