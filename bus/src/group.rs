//! Consumer-group bodies (issue 11 section 2), serde JSON like `wire::Metadata`. Field names are
//! wire format.

/// The body of a `GroupHeartbeat` request.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Heartbeat {
    /// The group's name.
    pub group: String,
    /// The partitions the member still reads (it has not yet released them after a rebalance
    /// took them away). A partition is handed to its new member only once its old member no
    /// longer holds it, so each partition is read by one member at a time.
    #[serde(default)]
    pub held: Vec<u16>,
}

/// The reply body of `JoinGroup` and `GroupHeartbeat`: the member's assignment.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupAssignment {
    /// The group's generation: it grows at every change of membership or assignment.
    pub generation: u32,
    /// The partitions this member may read now, ascending.
    pub partitions: Vec<u16>,
    /// How many members the group has.
    pub member_count: u32,
}
