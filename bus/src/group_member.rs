//! A consumer-group member for client programs (issue 11 section 2): joins a group, heartbeats
//! from its own poll loop (no extra thread or task), reads the partitions the coordinator assigns
//! it, stores the group's offsets, releases partitions a rebalance takes away, and leaves on
//! `close` (or, best effort, on drop).
//!
//! Delivery: a partition gained starts at the group's stored offset (0 when none is stored), so a
//! message is delivered again only when a member stopped without storing what it had read (it
//! crashed, or its session timed out while it was slow). `poll` first stores the positions read
//! so far (the caller has processed those messages by the time it polls again; at every poll, or
//! at most every `with_commit_interval`), and a lost partition's position is stored before it is released, so members that
//! `close` never deliver a message twice.
//!
//! This module must never read a partition the coordinator did not hand it, and never release a
//! partition before its position is stored (or the store was refused: then another member owns
//! it already, or this member is no longer one).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::batch::BatchError;
use crate::client::{Client, ClientError, PollResult};
use crate::command::ErrorCode;
use crate::consumer::{Consumer, ConsumerKind};
use crate::group::{GroupAssignment, Heartbeat};
use crate::namespace::Namespace;

/// Default time between two heartbeats of a member's poll loop: a tenth of the server's default
/// 10 s session timeout, so a few lost or slow heartbeats never end a session.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Default time a member with no partition waits before it asks again (its heartbeat is how it
/// learns of a handover, so this bounds how long a freed partition stays unread).
pub const IDLE_WAIT_DEFAULT: Duration = Duration::from_millis(20);
/// Default most messages one `poll` asks for.
pub const POLL_COUNT_DEFAULT: u32 = 1000;
/// Heartbeats one `heartbeat` call sends at most while each reply takes partitions away (each
/// sends the release of the previous one): a rebalance settles in two, so four leave slack.
const RELEASE_ROUND_MAX: u32 = 4;

/// Why a group member's call failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupMemberError {
    /// A request failed (see `ClientError`; e.g. `Server { code: GroupNotFound, .. }` when the
    /// group was deleted). The member may be polled again: it rejoins when it is no longer a
    /// member.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A poll reply held malformed batches.
    #[error("malformed batches in a poll of partition {partition}: {source}")]
    Batch {
        partition: u16,
        #[source]
        source: BatchError,
    },
    /// The member was closed: it left the group.
    #[error("the group member was closed")]
    Closed,
}

/// What one `poll` read: messages of one partition.
#[derive(Debug, Clone)]
pub struct GroupPoll {
    /// The partition read (`None` when this member has no partition now).
    pub partition: Option<u16>,
    /// The poll's result (empty batches when caught up or when `partition` is `None`).
    pub result: Option<PollResult>,
}

/// Where this member stands in one partition it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    /// The next offset to read.
    next_offset: u64,
    /// The offset last stored for the group (`next_offset` once everything read is stored).
    stored_offset: u64,
}

/// A member of one consumer group: owns its client connection (one request at a time). Not
/// `Sync`; use one per task.
#[derive(Debug)]
pub struct GroupMember {
    /// `None` once closed.
    client: Option<Client>,
    stream_id: u32,
    topic_id: u16,
    consumer: Consumer,
    generation: u32,
    /// The partitions this member reads, with its position in each: exactly those of its
    /// latest assignment once lost ones are released.
    positions: BTreeMap<u16, Position>,
    /// The index in `positions` of the partition the next poll reads (round robin).
    next_index: usize,
    /// When positions were last stored by `poll`.
    last_commit: Instant,
    /// Positions are stored by a `poll` at most this often (zero: at every poll).
    commit_interval: Duration,
    last_heartbeat: Instant,
    heartbeat_interval: Duration,
    idle_wait: Duration,
    poll_count: u32,
}

impl GroupMember {
    /// Joins consumer group `group` of topic `stream_id`/`topic_id` over `client` and takes its
    /// first assignment (reading each partition from the group's stored offset).
    ///
    /// # Errors
    /// `Client` when the join or an offset lookup fails: e.g. `Server { code: GroupNotFound,
    /// .. }`, or `InvalidArgument` for a bad name.
    ///
    /// # Cancel safety
    /// Not cancel safe: the join may be applied with no member to heartbeat it (its session
    /// then times out).
    pub async fn join(
        client: Client,
        stream_id: u32,
        topic_id: u16,
        group: &str,
    ) -> Result<GroupMember, GroupMemberError> {
        let consumer =
            Consumer::new(ConsumerKind::Group, group).map_err(|message| ClientError::Server {
                code: ErrorCode::InvalidArgument,
                message,
            })?;
        let mut member = GroupMember {
            client: Some(client),
            stream_id,
            topic_id,
            consumer,
            generation: 0,
            positions: BTreeMap::new(),
            next_index: 0,
            last_commit: Instant::now(),
            commit_interval: Duration::ZERO,
            last_heartbeat: Instant::now(),
            heartbeat_interval: HEARTBEAT_INTERVAL_DEFAULT,
            idle_wait: IDLE_WAIT_DEFAULT,
            poll_count: POLL_COUNT_DEFAULT,
        };
        member.rejoin().await?;
        Ok(member)
    }

    /// Heartbeats every `interval` from `poll` (keep it well under the server's
    /// `--group-session-timeout`).
    #[must_use]
    pub fn with_heartbeat_interval(mut self, interval: Duration) -> GroupMember {
        self.heartbeat_interval = interval;
        self
    }

    /// Waits `wait` in a `poll` that finds no partition to read before it heartbeats.
    #[must_use]
    pub fn with_idle_wait(mut self, wait: Duration) -> GroupMember {
        self.idle_wait = wait;
        self
    }

    /// Stores positions from `poll` at most every `interval` (default zero: every poll stores
    /// what the previous poll read). A longer interval saves a store round trip per poll; a
    /// member that stops without `close` then leaves up to `interval` of reads unstored, which
    /// the next member of those partitions reads again. Lost partitions and `close` always
    /// store.
    #[must_use]
    pub fn with_commit_interval(mut self, interval: Duration) -> GroupMember {
        self.commit_interval = interval;
        self
    }

    /// Asks for at most `count` messages per poll (at least 1).
    #[must_use]
    pub fn with_poll_count(mut self, count: u32) -> GroupMember {
        self.poll_count = count.max(1);
        self
    }

    /// The generation of the latest assignment.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The partitions this member reads now, ascending.
    pub fn partitions(&self) -> Vec<u16> {
        self.positions.keys().copied().collect()
    }

    /// This member's client id (its member id in `GetMetadata`'s `GroupInfo`).
    ///
    /// # Errors
    /// `Closed` after `close`.
    pub fn client_id(&self) -> Result<u128, GroupMemberError> {
        Ok(self
            .client
            .as_ref()
            .ok_or(GroupMemberError::Closed)?
            .client_id())
    }

    fn client(&mut self) -> Result<&mut Client, GroupMemberError> {
        self.client.as_mut().ok_or(GroupMemberError::Closed)
    }

    fn namespace(&self, partition: u16) -> Namespace {
        Namespace::new(self.stream_id, self.topic_id, partition)
    }

    /// Stores the positions read so far (every poll, or per `with_commit_interval`), heartbeats
    /// when due, then reads the next assigned partition in turn from this member's position
    /// there. With no partition it
    /// waits the idle wait and heartbeats, and returns a `GroupPoll` with `partition: None`.
    ///
    /// # Errors
    /// `Client` for a failed request (the member stays usable: a later poll retries, and rejoins
    /// if it is no longer a member); `Batch` for malformed batches; `Closed` after `close`.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled poll may leave a stored offset or a release half done (the
    /// next poll repeats them).
    pub async fn poll(&mut self) -> Result<GroupPoll, GroupMemberError> {
        self.client()?;
        if self.last_commit.elapsed() >= self.commit_interval {
            self.last_commit = Instant::now();
            match self.commit().await {
                Ok(()) => {}
                // This member was removed (its session timed out): the heartbeat rejoins.
                Err(GroupMemberError::Client(ClientError::Server {
                    code: ErrorCode::PartitionNotAssigned | ErrorCode::NotGroupMember,
                    ..
                })) => self.heartbeat().await?,
                Err(error) => return Err(error),
            }
        }
        if self.positions.is_empty() {
            compio::time::sleep(self.idle_wait).await;
            self.heartbeat().await?;
        } else if self.last_heartbeat.elapsed() >= self.heartbeat_interval {
            self.heartbeat().await?;
        }
        let Some((&partition, &position)) = self
            .positions
            .iter()
            .nth(self.next_index % self.positions.len().max(1))
        else {
            return Ok(GroupPoll {
                partition: None,
                result: None,
            });
        };
        self.next_index = self.next_index.wrapping_add(1);
        let namespace = self.namespace(partition);
        let count = self.poll_count;
        let result = match self
            .client()?
            .poll(namespace, position.next_offset, count)
            .await
        {
            Ok(result) => result,
            Err(ClientError::Server {
                code: ErrorCode::OffsetOutOfRange,
                ..
            }) => {
                self.move_into_range(partition).await?;
                return Ok(GroupPoll {
                    partition: Some(partition),
                    result: None,
                });
            }
            Err(error) => return Err(error.into()),
        };
        let read = result
            .messages()
            .map_err(|source| GroupMemberError::Batch { partition, source })?;
        if let Some(last) = read.last() {
            let next_offset = last.offset + 1;
            if let Some(position) = self.positions.get_mut(&partition) {
                position.next_offset = next_offset;
            }
        }
        Ok(GroupPoll {
            partition: Some(partition),
            result: Some(result),
        })
    }

    /// Moves the position in `partition` into what the partition holds after a poll was out of
    /// range: up to its first offset when retention deleted the stored position (those messages
    /// are gone), down to its next offset when the position is beyond it (the topic was
    /// recreated).
    async fn move_into_range(&mut self, partition: u16) -> Result<(), GroupMemberError> {
        let metadata = self.client()?.get_metadata().await?;
        let ends = metadata
            .streams
            .iter()
            .filter(|s| s.stream_id == self.stream_id)
            .flat_map(|s| &s.topics)
            .filter(|t| t.topic_id == self.topic_id)
            .flat_map(|t| &t.partitions)
            .find(|p| p.partition_id == partition)
            .map(|p| (p.first_offset, p.next_offset));
        if let (Some((first_offset, next_offset)), Some(position)) =
            (ends, self.positions.get_mut(&partition))
        {
            // Not `clamp`: the bounds come from the server, and clamp panics on a reversed pair.
            position.next_offset = position.next_offset.max(first_offset).min(next_offset);
        }
        Ok(())
    }

    /// Stores this member's position in every partition it reads where it read past the stored
    /// offset.
    ///
    /// # Errors
    /// `Client` when a store fails (e.g. `PartitionNotAssigned` after a rebalance this member
    /// has not heard of yet: heartbeat, then commit again); `Closed` after `close`.
    ///
    /// # Cancel safety
    /// Not cancel safe: some offsets may be stored.
    pub async fn commit(&mut self) -> Result<(), GroupMemberError> {
        let partitions: Vec<u16> = self.positions.keys().copied().collect();
        for partition in partitions {
            self.store(partition).await?;
        }
        Ok(())
    }

    /// Stores the position in `partition` if it moved since the last store.
    async fn store(&mut self, partition: u16) -> Result<(), GroupMemberError> {
        let Some(position) = self.positions.get(&partition).copied() else {
            return Ok(());
        };
        if position.next_offset == position.stored_offset {
            return Ok(());
        }
        let namespace = self.namespace(partition);
        let consumer = self.consumer.clone();
        let generation = self.generation;
        self.client()?
            .store_offset(namespace, &consumer, generation, position.next_offset)
            .await?;
        if let Some(stored) = self.positions.get_mut(&partition) {
            stored.stored_offset = position.next_offset;
        }
        Ok(())
    }

    /// Sends a heartbeat now (reporting the partitions this member reads) and applies the
    /// assignment: stores and releases lost partitions (heartbeating again to release them, at
    /// most `RELEASE_ROUND_MAX` times), takes gained ones from the group's stored offset. When
    /// the server no longer knows this member (`NotGroupMember`: its session timed out or the
    /// primary changed) it drops every partition unstored and joins again.
    ///
    /// # Errors
    /// `Client` when a request fails; `Closed` after `close`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `poll`).
    pub async fn heartbeat(&mut self) -> Result<(), GroupMemberError> {
        for _ in 0..RELEASE_ROUND_MAX {
            let heartbeat = Heartbeat {
                group: self.consumer.name.clone(),
                held: self.positions.keys().copied().collect(),
            };
            let (stream_id, topic_id) = (self.stream_id, self.topic_id);
            let reply = self
                .client()?
                .heartbeat(stream_id, topic_id, &heartbeat)
                .await;
            self.last_heartbeat = Instant::now();
            let assignment = match reply {
                Ok(assignment) => assignment,
                Err(ClientError::Server {
                    code: ErrorCode::NotGroupMember,
                    ..
                }) => return self.rejoin().await,
                Err(error) => return Err(error.into()),
            };
            if !self.apply(assignment).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Joins (again), dropping every partition: a member that is not one may not store.
    async fn rejoin(&mut self) -> Result<(), GroupMemberError> {
        self.positions.clear();
        let (stream_id, topic_id) = (self.stream_id, self.topic_id);
        let group = self.consumer.name.clone();
        let assignment = self
            .client()?
            .join_group(stream_id, topic_id, &group)
            .await?;
        self.last_heartbeat = Instant::now();
        self.apply(assignment).await?;
        Ok(())
    }

    /// Takes `assignment`: stores and drops lost partitions, looks up gained ones. Returns
    /// whether partitions were released (the coordinator learns it from the next heartbeat).
    async fn apply(&mut self, assignment: GroupAssignment) -> Result<bool, GroupMemberError> {
        self.generation = assignment.generation;
        let lost: Vec<u16> = self
            .positions
            .keys()
            .copied()
            .filter(|p| !assignment.partitions.contains(p))
            .collect();
        for partition in &lost {
            match self.store(*partition).await {
                // Refused: another member owns it already or this one is no longer a member;
                // either way the position is not ours to store.
                Ok(())
                | Err(GroupMemberError::Client(ClientError::Server {
                    code: ErrorCode::PartitionNotAssigned | ErrorCode::NotGroupMember,
                    ..
                })) => {}
                Err(error) => return Err(error),
            }
            self.positions.remove(partition);
        }
        for partition in assignment.partitions {
            if self.positions.contains_key(&partition) {
                continue;
            }
            let namespace = self.namespace(partition);
            let consumer = self.consumer.clone();
            let stored = self
                .client()?
                .get_offset(namespace, &consumer)
                .await?
                .unwrap_or(0);
            self.positions.insert(
                partition,
                Position {
                    next_offset: stored,
                    stored_offset: stored,
                },
            );
        }
        Ok(!lost.is_empty())
    }

    /// Stores every position and leaves the group, so its partitions go to the other members at
    /// once. The member cannot be used afterwards.
    ///
    /// # Errors
    /// `Client` when a store or the leave fails (the member is closed anyway; the server ends
    /// its session after the session timeout); `Closed` when already closed.
    ///
    /// # Cancel safety
    /// Not cancel safe: the member may have left or not.
    pub async fn close(&mut self) -> Result<(), GroupMemberError> {
        let committed = self.commit().await;
        let (stream_id, topic_id) = (self.stream_id, self.topic_id);
        let group = self.consumer.name.clone();
        let mut client = self.client.take().ok_or(GroupMemberError::Closed)?;
        self.positions.clear();
        let left = client.leave_group(stream_id, topic_id, &group).await;
        committed?;
        match left {
            Ok(())
            | Err(ClientError::Server {
                code: ErrorCode::NotGroupMember,
                ..
            }) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

impl Drop for GroupMember {
    /// A member dropped without `close` leaves the group from a task spawned on the current
    /// compio runtime (best effort: nothing is stored, and if the runtime stops first the
    /// server ends the session after its timeout).
    fn drop(&mut self) {
        let Some(mut client) = self.client.take() else {
            return;
        };
        let (stream_id, topic_id) = (self.stream_id, self.topic_id);
        let group = self.consumer.name.clone();
        let _ = compio::runtime::Runtime::try_with_current(move |runtime| {
            runtime
                .spawn(async move {
                    let _ = client.leave_group(stream_id, topic_id, &group).await;
                })
                .detach();
        });
    }
}
