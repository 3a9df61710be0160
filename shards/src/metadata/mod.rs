//! The metadata state machine: streams, topics and their partitions. Shard 0 owns the authoritative
//! copy and orders every change (op numbers); every shard applies the same ops to its read-only
//! copy. Pure: no I/O here (persistence is in `store`).

pub mod store;

use std::collections::BTreeMap;

use bus::{ErrorCode, Namespace};

/// Version of the persisted metadata payload.
pub const METADATA_VERSION: u32 = 1;

/// Every stream, topic and partition. Serialized whole into `metadata.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataState {
    pub version: u32,
    /// Op number of the last applied change (0 = none).
    pub op: u64,
    pub streams: BTreeMap<u32, StreamState>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamState {
    pub name: String,
    pub topics: BTreeMap<u16, TopicState>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicState {
    pub name: String,
    /// Partitions are numbered 0..partition_count.
    pub partition_count: u32,
    /// Retention limits (issue 11 section 4); absent in state written before retention.
    #[serde(default, skip_serializing_if = "Retention::is_unlimited")]
    pub retention: Retention,
    /// The topic's consumer groups by name (issue 11 section 2). Membership is the primary's
    /// soft state, not part of this; absent in state written before groups.
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub groups: std::collections::BTreeSet<String>,
}

/// A topic's retention: the owner shard deletes a partition's oldest sealed segments past either
/// limit (issue 11 section 4). 0 means no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Bytes per partition (segment file bytes), 0 = unlimited.
    pub bytes: u64,
    /// Age of a segment's newest message, milliseconds, 0 = unlimited.
    pub ms: u64,
}

impl Retention {
    /// Whether neither limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.bytes == 0 && self.ms == 0
    }
}

/// One metadata change, as ordered by shard 0.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum MetadataOp {
    CreateStream {
        stream_id: u32,
        name: String,
    },
    DeleteStream {
        stream_id: u32,
    },
    CreateTopic {
        stream_id: u32,
        topic_id: u16,
        name: String,
        partition_count: u32,
        /// Absent in prepares written before retention, and when unlimited (so the JSON of a
        /// topic without retention, and the checksum the client table keeps of it, is what it
        /// was before retention existed).
        #[serde(default, skip_serializing_if = "Retention::is_unlimited")]
        retention: Retention,
    },
    DeleteTopic {
        stream_id: u32,
        topic_id: u16,
    },
    /// Changes a topic's retention: `None` keeps a limit, `Some(0)` removes it.
    AlterTopic {
        stream_id: u32,
        topic_id: u16,
        retention_bytes: Option<u64>,
        retention_ms: Option<u64>,
    },
    CreateGroup {
        stream_id: u32,
        topic_id: u16,
        name: String,
    },
    DeleteGroup {
        stream_id: u32,
        topic_id: u16,
        name: String,
    },
}

/// A change the state machine refuses; becomes the client's error reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub code: ErrorCode,
    pub message: String,
}

fn reject(code: ErrorCode, message: String) -> Rejection {
    Rejection { code, message }
}

fn validate_name(kind: &str, name: &str) -> Result<(), Rejection> {
    if name.is_empty() || name.len() > bus::limits::NAME_LEN_MAX {
        return Err(reject(
            ErrorCode::InvalidArgument,
            format!(
                "{kind} name must be 1 to {} bytes, got {}",
                bus::limits::NAME_LEN_MAX,
                name.len()
            ),
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(reject(
            ErrorCode::InvalidArgument,
            format!("{kind} name {name:?} contains control characters"),
        ));
    }
    Ok(())
}

/// The partition-count rule of `CreateTopic`: `1..=bus::limits::PARTITION_COUNT_MAX`. Depends on
/// nothing but the count, so any replica may check it first, before rules that cost more (the
/// driver's open-file budget, which would otherwise answer a count of 100000000 with
/// descriptor advice instead of this rule).
///
/// # Errors
/// `InvalidArgument` naming the rule and the count.
pub fn check_partition_count(partition_count: u32) -> Result<(), Rejection> {
    if (1..=bus::limits::PARTITION_COUNT_MAX).contains(&partition_count) {
        return Ok(());
    }
    Err(reject(
        ErrorCode::InvalidArgument,
        format!(
            "partition count must be between 1 and {}, got {partition_count}",
            bus::limits::PARTITION_COUNT_MAX
        ),
    ))
}

impl MetadataState {
    pub fn new() -> MetadataState {
        MetadataState {
            version: METADATA_VERSION,
            op: 0,
            streams: BTreeMap::new(),
        }
    }

    /// Checks `op` against the current state without changing it.
    ///
    /// # Errors
    /// A `Rejection` with the stable error code the client gets.
    pub fn validate(&self, op: &MetadataOp) -> Result<(), Rejection> {
        match op {
            MetadataOp::CreateStream { stream_id, name } => {
                if *stream_id == 0 {
                    return Err(reject(
                        ErrorCode::InvalidArgument,
                        "stream id 0 is reserved; use 1 or above".into(),
                    ));
                }
                validate_name("stream", name)?;
                if self.streams.contains_key(stream_id) {
                    return Err(reject(
                        ErrorCode::StreamAlreadyExists,
                        format!("stream {stream_id} already exists"),
                    ));
                }
                if let Some((id, _)) = self.streams.iter().find(|(_, s)| s.name == *name) {
                    return Err(reject(
                        ErrorCode::StreamAlreadyExists,
                        format!("a stream named {name:?} already exists (id {id})"),
                    ));
                }
                Ok(())
            }
            MetadataOp::DeleteStream { stream_id } => self.stream(*stream_id).map(|_| ()),
            MetadataOp::CreateTopic {
                stream_id,
                topic_id,
                name,
                partition_count,
                retention: _,
            } => {
                let stream = self.stream(*stream_id)?;
                if *topic_id == 0 {
                    return Err(reject(
                        ErrorCode::InvalidArgument,
                        "topic id 0 is reserved; use 1 or above".into(),
                    ));
                }
                validate_name("topic", name)?;
                check_partition_count(*partition_count)?;
                if stream.topics.contains_key(topic_id) {
                    return Err(reject(
                        ErrorCode::TopicAlreadyExists,
                        format!("topic {topic_id} already exists in stream {stream_id}"),
                    ));
                }
                if stream.topics.values().any(|t| t.name == *name) {
                    return Err(reject(
                        ErrorCode::TopicAlreadyExists,
                        format!("a topic named {name:?} already exists in stream {stream_id}"),
                    ));
                }
                Ok(())
            }
            MetadataOp::DeleteTopic {
                stream_id,
                topic_id,
            } => self.topic(*stream_id, *topic_id).map(|_| ()),
            MetadataOp::AlterTopic {
                stream_id,
                topic_id,
                retention_bytes,
                retention_ms,
            } => {
                self.topic(*stream_id, *topic_id)?;
                if retention_bytes.is_none() && retention_ms.is_none() {
                    return Err(reject(
                        ErrorCode::InvalidArgument,
                        "topic alter changes nothing: give a retention by size or by age".into(),
                    ));
                }
                Ok(())
            }
            MetadataOp::CreateGroup {
                stream_id,
                topic_id,
                name,
            } => {
                let topic = self.topic(*stream_id, *topic_id)?;
                bus::consumer::validate_consumer_name(name).map_err(|message| {
                    reject(
                        ErrorCode::InvalidArgument,
                        message.replacen("consumer", "group", 1),
                    )
                })?;
                if topic.groups.contains(name) {
                    return Err(reject(
                        ErrorCode::GroupAlreadyExists,
                        format!("group {name:?} already exists on topic {stream_id}/{topic_id}"),
                    ));
                }
                Ok(())
            }
            MetadataOp::DeleteGroup {
                stream_id,
                topic_id,
                name,
            } => {
                let topic = self.topic(*stream_id, *topic_id)?;
                if !topic.groups.contains(name) {
                    return Err(reject(
                        ErrorCode::GroupNotFound,
                        format!("group {name:?} does not exist on topic {stream_id}/{topic_id}"),
                    ));
                }
                Ok(())
            }
        }
    }

    fn topic(&self, stream_id: u32, topic_id: u16) -> Result<&TopicState, Rejection> {
        self.stream(stream_id)?
            .topics
            .get(&topic_id)
            .ok_or_else(|| {
                reject(
                    ErrorCode::TopicNotFound,
                    format!("topic {topic_id} does not exist in stream {stream_id}"),
                )
            })
    }

    /// The retention of the topic of `namespace`, `None` when the topic does not exist.
    pub fn retention(&self, namespace: Namespace) -> Option<Retention> {
        self.streams
            .get(&namespace.stream_id())
            .and_then(|s| s.topics.get(&namespace.topic_id()))
            .map(|t| t.retention)
    }

    /// The partition count of topic `stream_id`/`topic_id`, `None` when it does not exist.
    pub fn partition_count(&self, stream_id: u32, topic_id: u16) -> Option<u32> {
        self.streams
            .get(&stream_id)
            .and_then(|s| s.topics.get(&topic_id))
            .map(|t| t.partition_count)
    }

    /// Whether consumer group `name` exists on topic `stream_id`/`topic_id`.
    pub fn group_exists(&self, stream_id: u32, topic_id: u16, name: &str) -> bool {
        self.streams
            .get(&stream_id)
            .and_then(|s| s.topics.get(&topic_id))
            .is_some_and(|t| t.groups.contains(name))
    }

    fn stream(&self, stream_id: u32) -> Result<&StreamState, Rejection> {
        self.streams.get(&stream_id).ok_or_else(|| {
            reject(
                ErrorCode::StreamNotFound,
                format!("stream {stream_id} does not exist"),
            )
        })
    }

    /// Applies a validated op and records `op_number`. Op numbers increase but may skip: the
    /// same op sequence also orders client Registers, which do not touch this state.
    ///
    /// # Panics
    /// If `op` does not validate, or `op_number` is not above the last applied op: both are bugs
    /// in the caller, which validates on shard 0 before ordering.
    pub fn apply(&mut self, op_number: u64, op: &MetadataOp) {
        assert!(
            op_number > self.op,
            "metadata ops must be applied in op order: op {op_number} after op {}",
            self.op
        );
        if let Err(rejection) = self.validate(op) {
            panic!(
                "applying an invalid metadata op {op:?}: {}",
                rejection.message
            );
        }
        match op {
            MetadataOp::CreateStream { stream_id, name } => {
                self.streams.insert(
                    *stream_id,
                    StreamState {
                        name: name.clone(),
                        topics: BTreeMap::new(),
                    },
                );
            }
            MetadataOp::DeleteStream { stream_id } => {
                self.streams.remove(stream_id);
            }
            MetadataOp::CreateTopic {
                stream_id,
                topic_id,
                name,
                partition_count,
                retention,
            } => {
                let stream = self.streams.get_mut(stream_id).expect("validated above");
                stream.topics.insert(
                    *topic_id,
                    TopicState {
                        name: name.clone(),
                        partition_count: *partition_count,
                        retention: *retention,
                        groups: std::collections::BTreeSet::new(),
                    },
                );
            }
            MetadataOp::DeleteTopic {
                stream_id,
                topic_id,
            } => {
                let stream = self.streams.get_mut(stream_id).expect("validated above");
                stream.topics.remove(topic_id);
            }
            MetadataOp::AlterTopic {
                stream_id,
                topic_id,
                retention_bytes,
                retention_ms,
            } => {
                let topic = self.topic_mut(*stream_id, *topic_id);
                if let Some(bytes) = retention_bytes {
                    topic.retention.bytes = *bytes;
                }
                if let Some(ms) = retention_ms {
                    topic.retention.ms = *ms;
                }
            }
            MetadataOp::CreateGroup {
                stream_id,
                topic_id,
                name,
            } => {
                self.topic_mut(*stream_id, *topic_id)
                    .groups
                    .insert(name.clone());
            }
            MetadataOp::DeleteGroup {
                stream_id,
                topic_id,
                name,
            } => {
                self.topic_mut(*stream_id, *topic_id).groups.remove(name);
            }
        }
        self.op = op_number;
    }

    /// Checks a loaded state against the same rules every change passed: each stream and topic is
    /// validated as the create that made it (against a state holding only its stream, so the
    /// rules cost O(1) each), and name uniqueness is checked with hash sets: O(streams + topics),
    /// not the O(n^2) of replaying every create into one state.
    ///
    /// # Errors
    /// The first rule a stream or topic breaks, naming it.
    fn topic_mut(&mut self, stream_id: u32, topic_id: u16) -> &mut TopicState {
        self.streams
            .get_mut(&stream_id)
            .and_then(|s| s.topics.get_mut(&topic_id))
            .expect("validated above")
    }

    pub fn check(&self) -> Result<(), String> {
        let mut stream_names = std::collections::HashMap::new();
        for (stream_id, stream) in &self.streams {
            let create = MetadataOp::CreateStream {
                stream_id: *stream_id,
                name: stream.name.clone(),
            };
            let mut single = MetadataState::new();
            single
                .validate(&create)
                .map_err(|rejection| format!("{create:?} breaks a rule: {}", rejection.message))?;
            if let Some(other) = stream_names.insert(stream.name.as_str(), *stream_id) {
                return Err(format!(
                    "{create:?} breaks a rule: a stream named {:?} already exists (id {other})",
                    stream.name
                ));
            }
            single.apply(1, &create);
            let mut topic_names = std::collections::HashMap::new();
            for (topic_id, topic) in &stream.topics {
                let create = MetadataOp::CreateTopic {
                    stream_id: *stream_id,
                    topic_id: *topic_id,
                    name: topic.name.clone(),
                    partition_count: topic.partition_count,
                    retention: topic.retention,
                };
                // `single` holds the stream without topics: this checks ids, name and partition
                // rules; uniqueness is the map's (ids) and the set's (names).
                single.validate(&create).map_err(|rejection| {
                    format!("{create:?} breaks a rule: {}", rejection.message)
                })?;
                if let Some(other) = topic_names.insert(topic.name.as_str(), *topic_id) {
                    return Err(format!(
                        "{create:?} breaks a rule: a topic named {:?} already exists in stream \
                         {stream_id} (id {other})",
                        topic.name
                    ));
                }
            }
        }
        // No rule ties `op` to the number of creates: a state migrated from metadata.json starts
        // at op 0 with all its creates, and Registers take op numbers too.
        Ok(())
    }

    /// Why a namespace names no partition: the stream, the topic, or the partition is missing.
    pub fn missing(&self, namespace: Namespace) -> Rejection {
        let Some(stream) = self.streams.get(&namespace.stream_id()) else {
            return reject(
                ErrorCode::StreamNotFound,
                format!("stream {} does not exist", namespace.stream_id()),
            );
        };
        let Some(topic) = stream.topics.get(&namespace.topic_id()) else {
            return reject(
                ErrorCode::TopicNotFound,
                format!(
                    "topic {} does not exist in stream {}",
                    namespace.topic_id(),
                    namespace.stream_id()
                ),
            );
        };
        reject(
            ErrorCode::PartitionNotFound,
            format!(
                "partition {} does not exist: topic {}/{} has {}",
                namespace.partition_id(),
                namespace.stream_id(),
                namespace.topic_id(),
                // Inclusive, as people read ranges: `partitions 0-7`.
                match topic.partition_count {
                    1 => "only partition 0".to_owned(),
                    count => format!("partitions 0-{}", count - 1),
                }
            ),
        )
    }

    /// True when the namespace names an existing partition.
    pub fn partition_exists(&self, namespace: Namespace) -> bool {
        self.streams
            .get(&namespace.stream_id())
            .and_then(|s| s.topics.get(&namespace.topic_id()))
            .is_some_and(|t| u32::from(namespace.partition_id()) < t.partition_count)
    }

    /// Every partition of every topic, in id order.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let mut namespaces = Vec::new();
        for (stream_id, stream) in &self.streams {
            for (topic_id, topic) in &stream.topics {
                for partition_id in 0..topic.partition_count {
                    namespaces.push(Namespace::new(*stream_id, *topic_id, partition_id as u16));
                }
            }
        }
        namespaces
    }

    /// The partitions an op creates or removes (empty for other ops).
    pub fn namespaces_of(&self, op: &MetadataOp) -> Vec<Namespace> {
        match op {
            MetadataOp::CreateTopic {
                stream_id,
                topic_id,
                partition_count,
                ..
            } => (0..*partition_count)
                .map(|p| Namespace::new(*stream_id, *topic_id, p as u16))
                .collect(),
            MetadataOp::DeleteTopic {
                stream_id,
                topic_id,
            } => self
                .streams
                .get(stream_id)
                .and_then(|s| s.topics.get(topic_id))
                .map(|t| {
                    (0..t.partition_count)
                        .map(|p| Namespace::new(*stream_id, *topic_id, p as u16))
                        .collect()
                })
                .unwrap_or_default(),
            MetadataOp::DeleteStream { stream_id } => self
                .streams
                .get(stream_id)
                .map(|s| {
                    s.topics
                        .iter()
                        .flat_map(|(topic_id, t)| {
                            (0..t.partition_count)
                                .map(move |p| Namespace::new(*stream_id, *topic_id, p as u16))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            MetadataOp::CreateStream { .. }
            | MetadataOp::AlterTopic { .. }
            | MetadataOp::CreateGroup { .. }
            | MetadataOp::DeleteGroup { .. } => Vec::new(),
        }
    }

    /// The wire view for GetMetadata; `next_offset` looks up each partition's next offset.
    /// The `GetMetadata` body of this state: `ends` gives each partition's first and next
    /// offsets (from its owner shard), `groups` each group's live membership (from the primary's
    /// soft state; `None` lists the group with no members).
    pub fn to_wire(
        &self,
        shard_count: u16,
        ends: impl Fn(Namespace) -> (u64, u64),
        groups: impl Fn(u32, u16, &str) -> Option<bus::GroupInfo>,
    ) -> bus::Metadata {
        bus::Metadata {
            shard_count,
            streams: self
                .streams
                .iter()
                .map(|(stream_id, stream)| bus::StreamInfo {
                    stream_id: *stream_id,
                    name: stream.name.clone(),
                    topics: stream
                        .topics
                        .iter()
                        .map(|(topic_id, topic)| bus::TopicInfo {
                            topic_id: *topic_id,
                            name: topic.name.clone(),
                            partitions: (0..topic.partition_count)
                                .map(|p| {
                                    let namespace = Namespace::new(*stream_id, *topic_id, p as u16);
                                    let (first_offset, next_offset) = ends(namespace);
                                    bus::PartitionInfo {
                                        partition_id: p as u16,
                                        owner_shard: crate::shard_for(namespace, shard_count).0,
                                        next_offset,
                                        first_offset,
                                    }
                                })
                                .collect(),
                            retention_bytes: topic.retention.bytes,
                            retention_ms: topic.retention.ms,
                            groups: topic
                                .groups
                                .iter()
                                .map(|name| {
                                    groups(*stream_id, *topic_id, name).unwrap_or_else(|| {
                                        bus::GroupInfo {
                                            name: name.clone(),
                                            generation: 0,
                                            members: Vec::new(),
                                        }
                                    })
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
            // The cluster fields are the replica's to fill (issue 8: view, replica, primary, commit).
            ..bus::Metadata::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_stream(id: u32, name: &str) -> MetadataOp {
        MetadataOp::CreateStream {
            stream_id: id,
            name: name.into(),
        }
    }

    #[test]
    fn create_and_delete_round_trip() {
        let mut state = MetadataState::new();
        state.apply(1, &create_stream(1, "orders"));
        let topic = MetadataOp::CreateTopic {
            stream_id: 1,
            topic_id: 2,
            name: "t".into(),
            partition_count: 3,
            retention: crate::metadata::Retention::default(),
        };
        state.apply(2, &topic);
        assert!(state.partition_exists(Namespace::new(1, 2, 2)));
        assert!(!state.partition_exists(Namespace::new(1, 2, 3)));
        assert_eq!(state.namespaces().len(), 3);
        assert_eq!(
            state
                .namespaces_of(&MetadataOp::DeleteStream { stream_id: 1 })
                .len(),
            3
        );
        state.apply(
            3,
            &MetadataOp::DeleteTopic {
                stream_id: 1,
                topic_id: 2,
            },
        );
        assert!(state.namespaces().is_empty());
        assert_eq!(state.op, 3);
    }

    #[test]
    fn rejections_carry_stable_codes() {
        let mut state = MetadataState::new();
        state.apply(1, &create_stream(1, "orders"));
        assert_eq!(
            state.validate(&create_stream(1, "x")).unwrap_err().code,
            ErrorCode::StreamAlreadyExists
        );
        assert_eq!(
            state
                .validate(&create_stream(2, "orders"))
                .unwrap_err()
                .code,
            ErrorCode::StreamAlreadyExists
        );
        assert_eq!(
            state.validate(&create_stream(0, "x")).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            state.validate(&create_stream(3, "")).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        let no_stream = MetadataOp::CreateTopic {
            stream_id: 9,
            topic_id: 1,
            name: "t".into(),
            partition_count: 1,
            retention: crate::metadata::Retention::default(),
        };
        assert_eq!(
            state.validate(&no_stream).unwrap_err().code,
            ErrorCode::StreamNotFound
        );
        let zero = MetadataOp::CreateTopic {
            stream_id: 1,
            topic_id: 1,
            name: "t".into(),
            partition_count: 0,
            retention: crate::metadata::Retention::default(),
        };
        assert_eq!(
            state.validate(&zero).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        let missing = MetadataOp::DeleteTopic {
            stream_id: 1,
            topic_id: 1,
        };
        assert_eq!(
            state.validate(&missing).unwrap_err().code,
            ErrorCode::TopicNotFound
        );
    }

    #[test]
    fn missing_names_the_level_that_is_missing() {
        let mut state = MetadataState::new();
        state.apply(1, &create_stream(1, "orders"));
        let topic = MetadataOp::CreateTopic {
            stream_id: 1,
            topic_id: 1,
            name: "t".into(),
            partition_count: 2,
            retention: crate::metadata::Retention::default(),
        };
        state.apply(2, &topic);
        let stream = state.missing(Namespace::new(9, 1, 0));
        assert_eq!(
            (stream.code, stream.message.as_str()),
            (ErrorCode::StreamNotFound, "stream 9 does not exist")
        );
        let topic = state.missing(Namespace::new(1, 5, 0));
        assert_eq!(
            (topic.code, topic.message.as_str()),
            (
                ErrorCode::TopicNotFound,
                "topic 5 does not exist in stream 1"
            )
        );
        let partition = state.missing(Namespace::new(1, 1, 7));
        assert_eq!(
            (partition.code, partition.message.as_str()),
            (
                ErrorCode::PartitionNotFound,
                "partition 7 does not exist: topic 1/1 has partitions 0-1"
            )
        );
    }

    #[test]
    fn check_rejects_states_no_sequence_of_valid_ops_produces() {
        let mut state = MetadataState::new();
        state.apply(1, &create_stream(1, "orders"));
        state.apply(
            2,
            &MetadataOp::CreateTopic {
                stream_id: 1,
                topic_id: 1,
                name: "t".into(),
                partition_count: 2,
                retention: crate::metadata::Retention::default(),
            },
        );
        state.check().unwrap();
        let mut zero = state.clone();
        zero.streams
            .get_mut(&1)
            .unwrap()
            .topics
            .get_mut(&1)
            .unwrap()
            .partition_count = 0;
        assert!(
            zero.check()
                .unwrap_err()
                .contains("partition count must be between 1")
        );
        let mut huge = state.clone();
        huge.streams
            .get_mut(&1)
            .unwrap()
            .topics
            .get_mut(&1)
            .unwrap()
            .partition_count = 100_000;
        assert!(huge.check().is_err());
        let mut id_zero = state.clone();
        let stream = id_zero.streams.remove(&1).unwrap();
        id_zero.streams.insert(0, stream);
        assert!(
            id_zero
                .check()
                .unwrap_err()
                .contains("stream id 0 is reserved")
        );
        let mut duplicate = state.clone();
        duplicate.streams.insert(
            2,
            StreamState {
                name: "orders".into(),
                topics: BTreeMap::new(),
            },
        );
        assert!(duplicate.check().unwrap_err().contains("already exists"));
        let mut duplicate_topic = state.clone();
        let topics = &mut duplicate_topic.streams.get_mut(&1).unwrap().topics;
        let existing = topics.values().next().unwrap().clone();
        topics.insert(u16::MAX, existing);
        let error = duplicate_topic.check().unwrap_err();
        assert!(error.contains("a topic named"), "{error}");
    }

    #[test]
    fn check_of_many_streams_is_linear() {
        // 100k streams: the old replay-through-validate took minutes here (O(n^2) name scans).
        let mut state = MetadataState::new();
        for stream_id in 1..=100_000u32 {
            state.streams.insert(
                stream_id,
                StreamState {
                    name: format!("stream-{stream_id}"),
                    topics: BTreeMap::new(),
                },
            );
        }
        state.check().unwrap();
        state.streams.get_mut(&100_000).unwrap().name = "stream-1".into();
        let error = state.check().unwrap_err();
        assert!(error.contains("already exists (id 1)"), "{error}");
    }

    #[test]
    #[should_panic(expected = "op order")]
    fn out_of_order_apply_is_a_bug() {
        let mut state = MetadataState::new();
        // Skipping op numbers is allowed (Registers take ops too); going back is a bug.
        state.apply(3, &create_stream(1, "a"));
        state.apply(3, &create_stream(2, "b"));
    }
}
