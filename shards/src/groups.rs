//! Consumer groups (issue 11 section 2): membership, heartbeats and partition assignment, the
//! primary's soft state on shard 0; the groups themselves are metadata (`MetadataOp::CreateGroup`,
//! committed through VSR like topics).
//!
//! The coordinator (`Coordinator`, one per replica, held by shard 0) keeps for each group its
//! live members (client ids, each with a session renewed by every join, heartbeat and store) and,
//! per partition, the member that owns it now. Assignment is deterministic range assignment over
//! the members sorted by client id (Kafka's range assignor): with `n` members and `p` partitions
//! the first `p % n` members take `p / n + 1` consecutive partitions, the rest `p / n`.
//!
//! Each partition is read by one member at a time: when a rebalance moves a partition from `a`
//! to `b`, it stays `a`'s (absent from `a`'s assignment, but storable by `a`) until `a`'s
//! heartbeat no longer lists it in `Heartbeat.held`, or `a` leaves or times out; only then is it
//! `b`'s. A partition handed to a member counts as held by it from that reply on, so a member
//! that started reading a partition it was just given cannot lose it before saying so.
//!
//! The generation grows at every change of membership or ownership. A member may store the
//! group's offset for a partition it owns, with a generation at least the one at which it was
//! handed the partition (so the member has seen the grant) and at most the current one.
//!
//! Membership is soft state: a backup answers `NotPrimary`, and a replica that sees a new view
//! forgets every member (they get `NotGroupMember` and join again). This module must never hold a
//! `RefCell` borrow across an `.await`, and never let a group's member count grow past
//! `GROUP_MEMBER_COUNT_MAX`.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bus::{
    ErrorCode, GroupAssignment, GroupInfo, GroupMemberInfo, Heartbeat, Namespace, Operation,
};
use runtime::ShardId;

use crate::frame::{ShardReply, ShardRequest};
use crate::limits::GROUP_MEMBER_COUNT_MAX;
use crate::shard::Shard;

/// A group as the coordinator names it: (stream id, topic id, group name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub stream_id: u32,
    pub topic_id: u16,
    pub name: String,
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group {:?} of topic {}/{}",
            self.name, self.stream_id, self.topic_id
        )
    }
}

/// A consumer-group request sent to shard 0.
#[derive(Debug)]
pub enum GroupRequest {
    /// Client `client` joins `group` (renews its session if it is a member already).
    Join { group: GroupKey, client: u128 },
    /// Client `client` leaves `group`.
    Leave { group: GroupKey, client: u128 },
    /// Member `client` of `group` renews its session and reports the partitions it still reads.
    Heartbeat {
        group: GroupKey,
        client: u128,
        held: Vec<u16>,
    },
    /// May member `client` of `group` store the group's offset of `partition` with `generation`?
    /// Answered `Ok` or the refusal to send the client.
    Authorize {
        group: GroupKey,
        client: u128,
        generation: u32,
        partition: u16,
    },
    /// Every group's live membership (for `GetMetadata`).
    Snapshot,
}

/// Shard 0's answer to a `GroupRequest` that is not itself a client reply.
#[derive(Debug)]
pub enum GroupReply {
    /// The live membership of every group that has members, by key.
    Snapshot(Vec<(GroupKey, GroupInfo)>),
}

/// Why the coordinator refused a request: the error code and message the client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    fn new(code: ErrorCode, message: String) -> Refusal {
        Refusal { code, message }
    }

    fn into_reply(self) -> ShardReply {
        ShardReply::error(self.code, self.message)
    }
}

/// A partition's current owner and the generation at which it was handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    client: u128,
    granted_generation: u32,
}

#[derive(Debug, Clone)]
struct Member {
    /// When the session was last renewed (join, heartbeat, store).
    last_seen: Instant,
    /// The partitions the member may still be reading: its last heartbeat's `held` plus
    /// everything handed to it since.
    held: BTreeSet<u16>,
}

/// One group's soft state.
#[derive(Debug, Clone)]
struct GroupState {
    partition_count: u16,
    generation: u32,
    members: BTreeMap<u128, Member>,
    /// Per partition: who should read it under range assignment of the current members.
    targets: Vec<Option<u128>>,
    /// Per partition: who reads it now (differs from `targets` while a handoff waits on the old
    /// member's release).
    owners: Vec<Option<Owner>>,
}

impl GroupState {
    fn new(partition_count: u16) -> GroupState {
        GroupState {
            partition_count,
            generation: 0,
            members: BTreeMap::new(),
            targets: vec![None; usize::from(partition_count)],
            owners: vec![None; usize::from(partition_count)],
        }
    }

    /// Recomputes targets and hands over every partition whose owner is gone or released it.
    /// `membership_changed`: a member joined, left or expired (the generation grows even when no
    /// partition moves yet, since targets changed).
    fn rebalance(&mut self, membership_changed: bool) {
        if membership_changed {
            self.targets = range_assignment(
                &self.members.keys().copied().collect::<Vec<_>>(),
                self.partition_count,
            );
        }
        let moves: Vec<(usize, Option<u128>)> = (0..self.owners.len())
            .filter_map(|index| {
                let target = self.targets[index];
                let owner = self.owners[index];
                let keeps = match owner {
                    None => target.is_none(),
                    Some(owner) if Some(owner.client) == target => true,
                    // A live member that still reads the partition keeps it until it releases.
                    Some(owner) => self.members.get(&owner.client).is_some_and(|member| {
                        member
                            .held
                            .contains(&u16::try_from(index).expect("partition ids fit u16"))
                    }),
                };
                (!keeps).then_some((index, target))
            })
            .collect();
        if !membership_changed && moves.is_empty() {
            return;
        }
        self.generation = self.generation.wrapping_add(1).max(1);
        for (index, target) in moves {
            self.owners[index] = target.map(|client| Owner {
                client,
                granted_generation: self.generation,
            });
        }
    }

    /// The partitions `client` may read now: those it owns and should own, ascending.
    fn assigned(&self, client: u128) -> Vec<u16> {
        (0..self.partition_count)
            .filter(|p| {
                let index = usize::from(*p);
                self.targets[index] == Some(client)
                    && self.owners[index].is_some_and(|owner| owner.client == client)
            })
            .collect()
    }

    /// `client`'s assignment, counting it as held from now on (the member may start reading it
    /// as soon as the reply arrives).
    fn assignment_of(&mut self, client: u128) -> GroupAssignment {
        let partitions = self.assigned(client);
        if let Some(member) = self.members.get_mut(&client) {
            member.held.extend(partitions.iter().copied());
        }
        GroupAssignment {
            generation: self.generation,
            partitions,
            member_count: u32::try_from(self.members.len()).unwrap_or(u32::MAX),
        }
    }

    fn info(&self, name: &str) -> GroupInfo {
        GroupInfo {
            name: name.to_owned(),
            generation: self.generation,
            members: self
                .members
                .keys()
                .map(|client| GroupMemberInfo {
                    client: format!("{client:#x}"),
                    partitions: self.assigned(*client),
                })
                .collect(),
        }
    }
}

/// Range assignment: `partition_count` partitions over `members` (ascending client ids), the
/// first `partition_count % n` members taking one more. Entry `p` is partition `p`'s member,
/// `None` for all when there are no members.
pub fn range_assignment(members: &[u128], partition_count: u16) -> Vec<Option<u128>> {
    let count = usize::from(partition_count);
    if members.is_empty() {
        return vec![None; count];
    }
    let base = count / members.len();
    let extra = count % members.len();
    let mut targets = Vec::with_capacity(count);
    for (index, member) in members.iter().enumerate() {
        let share = base + usize::from(index < extra);
        targets.extend(std::iter::repeat_n(Some(*member), share));
    }
    assert_eq!(
        targets.len(),
        count,
        "range assignment covers every partition"
    );
    targets
}

/// The consumer-group coordinator: every group's members, targets and owners, as the primary
/// holds them. Pure state machine: the caller passes the time and the metadata facts.
#[derive(Debug, Default)]
pub struct Coordinator {
    groups: BTreeMap<GroupKey, GroupState>,
    /// The view whose primary built this state: a new view starts empty.
    view: Option<u32>,
}

impl Coordinator {
    /// Forgets every member if `view` is not the view this state was built in.
    pub fn enter_view(&mut self, view: u32) {
        if self.view != Some(view) {
            if !self.groups.is_empty() {
                tracing::info!(
                    view,
                    group_count = self.groups.len(),
                    "new view: consumer-group membership starts over"
                );
            }
            self.groups.clear();
            self.view = Some(view);
        }
    }

    /// Drops the state of groups for which `partition_count_of` answers `None` (the group or its
    /// topic was deleted) or another partition count than the state was built with.
    pub fn retain_existing(&mut self, partition_count_of: impl Fn(&GroupKey) -> Option<u16>) {
        self.groups
            .retain(|key, state| partition_count_of(key) == Some(state.partition_count));
    }

    /// Removes every member whose session was last renewed more than `timeout` before `now`,
    /// rebalancing their groups.
    pub fn expire(&mut self, now: Instant, timeout: Duration) {
        for (key, state) in &mut self.groups {
            let before = state.members.len();
            state.members.retain(|client, member| {
                let alive = now.saturating_duration_since(member.last_seen) <= timeout;
                if !alive {
                    tracing::info!(%key, client = %format_args!("{client:#x}"), "group member session timed out");
                }
                alive
            });
            if state.members.len() != before {
                state.rebalance(true);
            }
        }
    }

    /// `client` joins `key` (a topic of `partition_count` partitions) at `now` and gets its
    /// assignment. A member that joins again keeps its partitions and renews its session.
    ///
    /// # Errors
    /// `ResourceExhausted` when the group already has `GROUP_MEMBER_COUNT_MAX` members.
    pub fn join(
        &mut self,
        key: &GroupKey,
        partition_count: u16,
        client: u128,
        now: Instant,
    ) -> Result<GroupAssignment, Refusal> {
        let state = self
            .groups
            .entry(key.clone())
            .or_insert_with(|| GroupState::new(partition_count));
        if let Some(member) = state.members.get_mut(&client) {
            member.last_seen = now;
            return Ok(state.assignment_of(client));
        }
        if state.members.len() >= GROUP_MEMBER_COUNT_MAX {
            return Err(Refusal::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "{key} already has {GROUP_MEMBER_COUNT_MAX} members, the most one group holds"
                ),
            ));
        }
        state.members.insert(
            client,
            Member {
                last_seen: now,
                held: BTreeSet::new(),
            },
        );
        state.rebalance(true);
        Ok(state.assignment_of(client))
    }

    /// Member `client` of `key` leaves: its partitions go to the others at once.
    ///
    /// # Errors
    /// `NotGroupMember` when `client` is not a member.
    pub fn leave(&mut self, key: &GroupKey, client: u128) -> Result<(), Refusal> {
        let state = self.member_state(key, client)?;
        state.members.remove(&client);
        state.rebalance(true);
        Ok(())
    }

    /// Member `client` of `key` renews its session at `now`, reports `held` (the partitions it
    /// still reads) and gets its current assignment.
    ///
    /// # Errors
    /// `NotGroupMember` when `client` is not a member; `InvalidArgument` when `held` names a
    /// partition the topic does not have.
    pub fn heartbeat(
        &mut self,
        key: &GroupKey,
        client: u128,
        held: &[u16],
        now: Instant,
    ) -> Result<GroupAssignment, Refusal> {
        let state = self.member_state(key, client)?;
        if let Some(partition) = held.iter().find(|p| **p >= state.partition_count) {
            return Err(Refusal::new(
                ErrorCode::InvalidArgument,
                format!(
                    "heartbeat of {key} holds partition {partition}, but the topic has {} partitions",
                    state.partition_count
                ),
            ));
        }
        let member = state
            .members
            .get_mut(&client)
            .expect("member_state found the member");
        member.last_seen = now;
        member.held = held.iter().copied().collect();
        state.rebalance(false);
        Ok(state.assignment_of(client))
    }

    /// Whether member `client` of `key` may store the group's offset of `partition` with
    /// `generation` (the generation of an assignment it received); renews its session at `now`.
    ///
    /// # Errors
    /// `NotGroupMember` when `client` is not a member; `PartitionNotAssigned` when another
    /// member owns the partition, or `generation` predates the partition's handover to `client`
    /// or is beyond the group's current generation (the message says which).
    pub fn authorize(
        &mut self,
        key: &GroupKey,
        client: u128,
        generation: u32,
        partition: u16,
        now: Instant,
    ) -> Result<(), Refusal> {
        let state = self.member_state(key, client)?;
        state
            .members
            .get_mut(&client)
            .expect("member_state found the member")
            .last_seen = now;
        let not_assigned = |detail: String| {
            Refusal::new(
                ErrorCode::PartitionNotAssigned,
                format!(
                    "{key}: partition {partition} is not assigned to member {client:#x} in \
                     generation {generation}: {detail}; heartbeat for the current assignment"
                ),
            )
        };
        let Some(owner) = state.owners.get(usize::from(partition)).copied() else {
            return Err(not_assigned(format!(
                "the topic has {} partitions",
                state.partition_count
            )));
        };
        match owner {
            Some(owner) if owner.client == client => {
                if generation < owner.granted_generation {
                    Err(not_assigned(format!(
                        "it was handed over in generation {}",
                        owner.granted_generation
                    )))
                } else if generation > state.generation {
                    Err(not_assigned(format!(
                        "the group's generation is {}",
                        state.generation
                    )))
                } else {
                    Ok(())
                }
            }
            _ => Err(not_assigned(format!(
                "the current generation is {} and another member holds it",
                state.generation
            ))),
        }
    }

    /// The live membership of every group that has members.
    pub fn snapshot(&self) -> Vec<(GroupKey, GroupInfo)> {
        self.groups
            .iter()
            .filter(|(_, state)| !state.members.is_empty())
            .map(|(key, state)| (key.clone(), state.info(&key.name)))
            .collect()
    }

    fn member_state(&mut self, key: &GroupKey, client: u128) -> Result<&mut GroupState, Refusal> {
        match self.groups.get_mut(key) {
            Some(state) if state.members.contains_key(&client) => Ok(state),
            _ => Err(Refusal::new(
                ErrorCode::NotGroupMember,
                format!(
                    "client {client:#x} is not a member of {key} (never joined, left, timed out, \
                     or the primary changed): join again"
                ),
            )),
        }
    }
}

/// The group named by a request's namespace and name.
fn group_key(header: &bus::Header, name: String) -> GroupKey {
    let namespace = Namespace(header.namespace);
    GroupKey {
        stream_id: namespace.stream_id(),
        topic_id: namespace.topic_id(),
        name,
    }
}

/// Decodes a `JoinGroup` / `LeaveGroup` / `GroupHeartbeat` request into the `GroupRequest` for
/// shard 0.
///
/// # Errors
/// `InvalidArgument` naming the problem: client id 0, a name that breaks the consumer-name rule,
/// a heartbeat body that is not `Heartbeat` JSON.
fn decode(header: &bus::Header, body: &[u8]) -> Result<GroupRequest, ShardReply> {
    let invalid = |message: String| ShardReply::error(ErrorCode::InvalidArgument, message);
    if header.client == 0 {
        return Err(invalid(
            "client id 0 cannot be a group member: connect with a client id".to_owned(),
        ));
    }
    let operation = Operation::from_u8(header.operation);
    if operation == Some(Operation::GroupHeartbeat) {
        let heartbeat: Heartbeat = serde_json::from_slice(body)
            .map_err(|e| invalid(format!("heartbeat body is not Heartbeat JSON: {e}")))?;
        bus::consumer::validate_consumer_name(&heartbeat.group).map_err(invalid)?;
        return Ok(GroupRequest::Heartbeat {
            group: group_key(header, heartbeat.group),
            client: header.client,
            held: heartbeat.held,
        });
    }
    let name = std::str::from_utf8(body)
        .map_err(|_| invalid("group name is not valid UTF-8".to_owned()))?;
    bus::consumer::validate_consumer_name(name).map_err(invalid)?;
    let group = group_key(header, name.to_owned());
    match operation {
        Some(Operation::JoinGroup) => Ok(GroupRequest::Join {
            group,
            client: header.client,
        }),
        Some(Operation::LeaveGroup) => Ok(GroupRequest::Leave {
            group,
            client: header.client,
        }),
        _ => Err(ShardReply::error(
            ErrorCode::Internal,
            format!("operation {} is not a group request", header.operation),
        )),
    }
}

/// Handles a client's `JoinGroup`, `LeaveGroup` or `GroupHeartbeat` on the connection's shard:
/// decodes it and sends it to shard 0, whose reply is the client's. A backup answers
/// `NotPrimary` (issue 8 section 2: membership lives with the primary).
///
/// # Cancel safety
/// Cancel safe for the caller (see `Shard::call`); shard 0 may still apply the request.
pub async fn handle(shard: &Rc<Shard>, header: &bus::Header, body: Vec<u8>) -> ShardReply {
    if let Err(reply) = shard.check_serves_data() {
        return reply;
    }
    match decode(header, &body) {
        Ok(request) => shard.call(ShardId(0), ShardRequest::Group(request)).await,
        Err(reply) => reply,
    }
}

/// Why group `key` cannot be used per the metadata, or its topic's partition count.
fn partition_count_of(shard: &Shard, key: &GroupKey) -> Result<u16, Refusal> {
    shard.with_metadata(|metadata| {
        if !metadata.group_exists(key.stream_id, key.topic_id, &key.name) {
            return Err(Refusal::new(
                ErrorCode::GroupNotFound,
                format!("{key} does not exist (see `shardline group list`)"),
            ));
        }
        let count = metadata
            .partition_count(key.stream_id, key.topic_id)
            .expect("a group's topic exists");
        Ok(u16::try_from(count)
            .expect("partition counts are at most bus::limits::PARTITION_COUNT_MAX"))
    })
}

/// Executes a `GroupRequest` on shard 0: checks this replica is the primary, expires timed-out
/// members, then applies it to the coordinator. Joins, heartbeats and leaves are answered with
/// the client's reply (`Ok` with the assignment JSON and the generation, or the refusal);
/// `Authorize` with `Ok` or the refusal; `Snapshot` with `Group(Snapshot)`.
///
/// # Cancel safety
/// Not async in effect: it completes in one step.
#[allow(clippy::unused_async)] // dispatched from `Shard::execute` like every request
pub async fn execute(shard: &Rc<Shard>, request: GroupRequest) -> ShardReply {
    let status = shard.status();
    if let Err(reply) = shard.check_serves_data() {
        shard.group_coordinator().borrow_mut().enter_view(u32::MAX);
        return reply;
    }
    let now = Instant::now();
    let mut coordinator = shard.group_coordinator().borrow_mut();
    coordinator.enter_view(status.view);
    coordinator.retain_existing(|key| partition_count_of(shard, key).ok());
    coordinator.expire(now, shard.config.group_session_timeout);
    let assignment_reply = |assignment: GroupAssignment| ShardReply::Ok {
        offset: 0,
        count: 0,
        generation: assignment.generation,
        body: serde_json::to_vec(&assignment).expect("an assignment serializes: plain data"),
    };
    let done = ShardReply::Ok {
        offset: 0,
        count: 0,
        generation: 0,
        body: Vec::new(),
    };
    let result = match request {
        GroupRequest::Snapshot => {
            return ShardReply::Group(GroupReply::Snapshot(coordinator.snapshot()));
        }
        GroupRequest::Join { group, client } => partition_count_of(shard, &group)
            .and_then(|count| coordinator.join(&group, count, client, now))
            .map(assignment_reply),
        GroupRequest::Leave { group, client } => partition_count_of(shard, &group)
            .and_then(|_| coordinator.leave(&group, client))
            .map(|()| done),
        GroupRequest::Heartbeat {
            group,
            client,
            held,
        } => partition_count_of(shard, &group)
            .and_then(|_| coordinator.heartbeat(&group, client, &held, now))
            .map(assignment_reply),
        GroupRequest::Authorize {
            group,
            client,
            generation,
            partition,
        } => partition_count_of(shard, &group)
            .and_then(|_| coordinator.authorize(&group, client, generation, partition, now))
            .map(|()| done),
    };
    result.unwrap_or_else(Refusal::into_reply)
}

/// Every group's live membership as shard 0's coordinator holds it, for `GetMetadata` (empty
/// on a backup, whose members are none).
///
/// # Errors
/// The reply of a failed call to shard 0 (`Busy`, `ShuttingDown`).
pub async fn snapshot(shard: &Rc<Shard>) -> Result<Vec<(GroupKey, GroupInfo)>, ShardReply> {
    match shard
        .call(ShardId(0), ShardRequest::Group(GroupRequest::Snapshot))
        .await
    {
        ShardReply::Group(GroupReply::Snapshot(groups)) => Ok(groups),
        ShardReply::NotPrimary { .. } => Ok(Vec::new()),
        other @ ShardReply::Error { .. } => Err(other),
        other => Err(ShardReply::error(
            ErrorCode::Internal,
            format!("unexpected reply to a group snapshot: {other:?}"),
        )),
    }
}

/// Whether the client of `header` may store group `consumer`'s offset in `namespace`: a member
/// that owns that partition, with `header.generation` at least the generation at which it was
/// handed the partition and at most the group's current one (issue 11 section 2). Asks shard 0.
/// A plain consumer (`ConsumerKind::Consumer`) needs no authorization.
///
/// # Errors
/// The refusal to send the client: `GroupNotFound` (no such group on the topic),
/// `NotGroupMember` (the client is not a live member), `PartitionNotAssigned` (another member
/// owns the partition, or the generation is stale), `NotPrimary` on a backup, `Busy` /
/// `ShuttingDown` when shard 0 cannot be reached.
///
/// # Cancel safety
/// Cancel safe: authorization changes nothing but the member's session time.
pub async fn authorize_store(
    shard: &Rc<Shard>,
    header: &bus::Header,
    consumer: &bus::Consumer,
    namespace: Namespace,
) -> Result<(), ShardReply> {
    if consumer.kind != bus::ConsumerKind::Group {
        return Ok(());
    }
    let request = GroupRequest::Authorize {
        group: GroupKey {
            stream_id: namespace.stream_id(),
            topic_id: namespace.topic_id(),
            name: consumer.name.clone(),
        },
        client: header.client,
        generation: header.generation,
        partition: namespace.partition_id(),
    };
    match shard.call(ShardId(0), ShardRequest::Group(request)).await {
        ShardReply::Ok { .. } => Ok(()),
        refusal => Err(refusal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u128 = 0xa;
    const B: u128 = 0xb;
    const C: u128 = 0xc;

    fn key() -> GroupKey {
        GroupKey {
            stream_id: 1,
            topic_id: 1,
            name: "billing".to_owned(),
        }
    }

    /// Every partition owned by exactly one member and every member's assignment disjoint.
    fn assert_exclusive(coordinator: &Coordinator, partition_count: u16) {
        let state = &coordinator.groups[&key()];
        let mut seen = BTreeSet::new();
        for client in state.members.keys() {
            for partition in state.assigned(*client) {
                assert!(
                    seen.insert(partition),
                    "partition {partition} assigned twice"
                );
            }
        }
        assert!(seen.len() <= usize::from(partition_count));
    }

    #[test]
    fn issue11_2_range_assignment_is_deterministic_and_covers_every_partition() {
        assert_eq!(
            range_assignment(&[A, B, C], 8),
            vec![
                Some(A),
                Some(A),
                Some(A),
                Some(B),
                Some(B),
                Some(B),
                Some(C),
                Some(C)
            ]
        );
        assert_eq!(range_assignment(&[], 3), vec![None, None, None]);
        assert_eq!(range_assignment(&[A, B, C], 2), vec![Some(A), Some(B)]);
    }

    #[test]
    fn issue11_2_first_member_gets_every_partition_and_generation_grows() {
        let mut coordinator = Coordinator::default();
        let now = Instant::now();
        let first = coordinator.join(&key(), 8, A, now).unwrap();
        assert_eq!(
            first,
            GroupAssignment {
                generation: 1,
                partitions: (0..8).collect(),
                member_count: 1
            }
        );
        // Joining again is a renewal, not a new member.
        assert_eq!(coordinator.join(&key(), 8, A, now).unwrap(), first);
    }

    #[test]
    fn issue11_2_a_partition_moves_only_after_its_old_member_releases_it() {
        let mut coordinator = Coordinator::default();
        let now = Instant::now();
        coordinator.join(&key(), 4, A, now).unwrap();
        // B joins: targets are A 0..2, B 2..4, but A still holds 2 and 3.
        let b = coordinator.join(&key(), 4, B, now).unwrap();
        assert_eq!((b.generation, b.partitions.clone()), (2, vec![]));
        assert_exclusive(&coordinator, 4);
        // A's heartbeat still holding everything: it is told to read only 0 and 1.
        let a = coordinator
            .heartbeat(&key(), A, &[0, 1, 2, 3], now)
            .unwrap();
        assert_eq!((a.generation, a.partitions), (2, vec![0, 1]));
        // A may still store 2 (its final commit), B may not.
        coordinator.authorize(&key(), A, 2, 2, now).unwrap();
        assert_eq!(
            coordinator
                .authorize(&key(), B, 2, 2, now)
                .unwrap_err()
                .code,
            ErrorCode::PartitionNotAssigned
        );
        assert_eq!(
            coordinator
                .heartbeat(&key(), B, &[], now)
                .unwrap()
                .partitions,
            Vec::<u16>::new()
        );
        // A releases 2 and 3: they move to B in generation 3.
        let a = coordinator.heartbeat(&key(), A, &[0, 1], now).unwrap();
        assert_eq!((a.generation, a.partitions), (3, vec![0, 1]));
        assert_eq!(
            coordinator
                .authorize(&key(), A, 3, 2, now)
                .unwrap_err()
                .code,
            ErrorCode::PartitionNotAssigned
        );
        let b = coordinator.heartbeat(&key(), B, &[], now).unwrap();
        assert_eq!((b.generation, b.partitions), (3, vec![2, 3]));
        // B's store must carry a generation that has seen the handover.
        assert_eq!(
            coordinator
                .authorize(&key(), B, 2, 2, now)
                .unwrap_err()
                .code,
            ErrorCode::PartitionNotAssigned
        );
        coordinator.authorize(&key(), B, 3, 2, now).unwrap();
        assert_exclusive(&coordinator, 4);
    }

    #[test]
    fn issue11_2_a_partition_just_handed_over_counts_as_held() {
        let mut coordinator = Coordinator::default();
        let now = Instant::now();
        // A got every partition in its join reply and may be reading them; its recorded held
        // is empty, yet B's join must not take them from it.
        coordinator.join(&key(), 2, A, now).unwrap();
        let b = coordinator.join(&key(), 2, B, now).unwrap();
        assert!(b.partitions.is_empty());
        coordinator.authorize(&key(), A, 2, 1, now).unwrap();
    }

    #[test]
    fn issue11_2_leave_and_expiry_hand_partitions_over_at_once() {
        let mut coordinator = Coordinator::default();
        let start = Instant::now();
        coordinator.join(&key(), 6, A, start).unwrap();
        coordinator.join(&key(), 6, B, start).unwrap();
        coordinator.join(&key(), 6, C, start).unwrap();
        // A releases what it no longer should read; B and C get theirs.
        coordinator.heartbeat(&key(), A, &[0, 1], start).unwrap();
        assert_eq!(
            coordinator
                .heartbeat(&key(), B, &[], start)
                .unwrap()
                .partitions,
            vec![2, 3]
        );
        assert_eq!(
            coordinator
                .heartbeat(&key(), C, &[], start)
                .unwrap()
                .partitions,
            vec![4, 5]
        );
        // B leaves: targets become A 0..3, C 3..6; B's partitions move at once, but 2 goes to A
        // and 3 to C only because B is gone (C still holds 4, 5 and keeps them).
        coordinator.leave(&key(), B).unwrap();
        let a = coordinator.heartbeat(&key(), A, &[0, 1], start).unwrap();
        assert_eq!(a.partitions, vec![0, 1, 2]);
        assert_eq!(
            coordinator
                .heartbeat(&key(), C, &[4, 5], start)
                .unwrap()
                .partitions,
            vec![3, 4, 5]
        );
        assert_eq!(
            coordinator.leave(&key(), B).unwrap_err().code,
            ErrorCode::NotGroupMember
        );
        // C stops heartbeating: after the timeout A owns everything.
        let timeout = Duration::from_secs(10);
        let later = start + Duration::from_secs(11);
        coordinator
            .heartbeat(&key(), A, &[0, 1, 2], start + Duration::from_secs(5))
            .unwrap();
        coordinator.expire(later, timeout);
        let a = coordinator.heartbeat(&key(), A, &[0, 1, 2], later).unwrap();
        assert_eq!((a.partitions, a.member_count), ((0..6).collect(), 1));
        assert_eq!(
            coordinator
                .heartbeat(&key(), C, &[], later)
                .unwrap_err()
                .code,
            ErrorCode::NotGroupMember
        );
        assert_exclusive(&coordinator, 6);
    }

    #[test]
    fn issue11_2_three_members_over_eight_partitions_converge_to_range_assignment() {
        let mut coordinator = Coordinator::default();
        let now = Instant::now();
        let mut held: BTreeMap<u128, Vec<u16>> = BTreeMap::new();
        for client in [C, A, B] {
            let assignment = coordinator.join(&key(), 8, client, now).unwrap();
            held.insert(client, assignment.partitions);
            assert_exclusive(&coordinator, 8);
        }
        // Members release what they lose and take what they get, one heartbeat each, until
        // nothing changes; bounded: each round settles at least one partition.
        for _ in 0..8 {
            for client in [A, B, C] {
                let assignment = coordinator
                    .heartbeat(&key(), client, &held[&client], now)
                    .unwrap();
                held.insert(client, assignment.partitions);
                assert_exclusive(&coordinator, 8);
            }
        }
        assert_eq!(held[&A], vec![0, 1, 2]);
        assert_eq!(held[&B], vec![3, 4, 5]);
        assert_eq!(held[&C], vec![6, 7]);
        let info = coordinator.snapshot();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].1.members.len(), 3);
        assert_eq!(info[0].1.members[0].client, "0xa");
    }

    #[test]
    fn issue11_2_state_of_a_deleted_group_or_an_old_view_is_dropped() {
        let mut coordinator = Coordinator::default();
        let now = Instant::now();
        coordinator.enter_view(0);
        coordinator.join(&key(), 2, A, now).unwrap();
        coordinator.retain_existing(|_| Some(2));
        assert_eq!(coordinator.snapshot().len(), 1);
        coordinator.retain_existing(|_| None);
        assert!(coordinator.snapshot().is_empty());
        coordinator.join(&key(), 2, A, now).unwrap();
        coordinator.enter_view(1);
        assert_eq!(
            coordinator.heartbeat(&key(), A, &[], now).unwrap_err().code,
            ErrorCode::NotGroupMember
        );
    }

    #[test]
    fn issue11_2_a_heartbeat_naming_a_missing_partition_is_refused() {
        let mut coordinator = Coordinator::default();
        let now = Instant::now();
        coordinator.join(&key(), 2, A, now).unwrap();
        let refusal = coordinator.heartbeat(&key(), A, &[2], now).unwrap_err();
        assert_eq!(refusal.code, ErrorCode::InvalidArgument);
        assert!(
            refusal.message.contains("holds partition 2"),
            "{}",
            refusal.message
        );
    }
}
