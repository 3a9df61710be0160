//! Bodies of control-plane replies (`GetMetadata`), serde JSON. Field names are wire format:
//! rename none without a protocol version bump.

/// The `GetMetadata` reply body: every stream, topic and partition, with its owner shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Metadata {
    pub shard_count: u16,
    pub streams: Vec<StreamInfo>,
}

/// One stream and its topics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamInfo {
    pub stream_id: u32,
    pub name: String,
    pub topics: Vec<TopicInfo>,
}

/// One topic and its partitions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopicInfo {
    pub topic_id: u16,
    pub name: String,
    pub partitions: Vec<PartitionInfo>,
}

/// One partition and the shard that owns its log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionInfo {
    pub partition_id: u16,
    pub owner_shard: u16,
    /// Next offset to be assigned (messages in the partition).
    pub next_offset: u64,
}
