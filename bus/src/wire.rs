//! Bodies of control-plane replies (`GetMetadata`), serde JSON. Field names are wire format:
//! rename none without a protocol version bump.

/// The `GetMetadata` reply body: every stream, topic and partition, with its owner shard, and
/// where the answering replica stands in its cluster (issue 8 section 3). The cluster fields
/// default to 0 when absent, so a reply from a server that predates them still decodes (as a
/// single replica in view 0).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Metadata {
    pub shard_count: u16,
    pub streams: Vec<StreamInfo>,
    /// The answering replica's view.
    #[serde(default)]
    pub view: u32,
    /// The answering replica's index (0 for a single replica).
    #[serde(default)]
    pub replica: u8,
    /// The primary of `view` (`view % replica_count`).
    #[serde(default)]
    pub primary: u8,
    /// The answering replica's commit number: the highest op whose change it has applied (the
    /// metadata shown is the state after it).
    #[serde(default)]
    pub commit: u64,
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
    /// Retention by size, bytes per partition (0 = unlimited).
    #[serde(default)]
    pub retention_bytes: u64,
    /// Retention by age, milliseconds (0 = unlimited).
    #[serde(default)]
    pub retention_ms: u64,
    /// The topic's consumer groups, by name.
    #[serde(default)]
    pub groups: Vec<GroupInfo>,
}

/// One consumer group and, as the primary knows them, its live members.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupInfo {
    pub name: String,
    /// The group's generation (0 while it has no members).
    #[serde(default)]
    pub generation: u32,
    #[serde(default)]
    pub members: Vec<GroupMemberInfo>,
}

/// One live member of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupMemberInfo {
    /// The member's client id, `0x`-prefixed hex.
    pub client: String,
    /// The partitions assigned to it.
    pub partitions: Vec<u16>,
}

/// One partition and the shard that owns its log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionInfo {
    pub partition_id: u16,
    pub owner_shard: u16,
    /// Next offset to be assigned (messages in the partition).
    pub next_offset: u64,
    /// First offset still retained (0 until retention deleted a segment).
    #[serde(default)]
    pub first_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_from_a_server_without_cluster_fields_decodes_with_zeros() {
        let old: Metadata = serde_json::from_str(r#"{"shard_count":2,"streams":[]}"#).unwrap();
        assert_eq!(
            old,
            Metadata {
                shard_count: 2,
                ..Metadata::default()
            }
        );
        let new = Metadata {
            shard_count: 1,
            streams: Vec::new(),
            view: 4,
            replica: 2,
            primary: 1,
            commit: 99,
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(
            text,
            r#"{"shard_count":1,"streams":[],"view":4,"replica":2,"primary":1,"commit":99}"#
        );
        assert_eq!(serde_json::from_str::<Metadata>(&text).unwrap(), new);
    }
}
