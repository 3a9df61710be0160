//! `Namespace`: u64 packing (stream_id u32, topic_id u16, partition_id u16), the unit of
//! data-plane ownership.

/// bits 63..32 stream_id, 31..16 topic_id, 15..0 partition_id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(pub u64);

impl Namespace {
    pub fn new(stream_id: u32, topic_id: u16, partition_id: u16) -> Namespace {
        Namespace(
            (u64::from(stream_id) << 32) | (u64::from(topic_id) << 16) | u64::from(partition_id),
        )
    }
    pub fn stream_id(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn topic_id(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub fn partition_id(self) -> u16 {
        self.0 as u16
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.stream_id(),
            self.topic_id(),
            self.partition_id()
        )
    }
}
