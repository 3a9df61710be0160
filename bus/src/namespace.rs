//! `Namespace`: u64 packing (`stream_id` u32, `topic_id` u16, `partition_id` u16), the unit of
//! data-plane ownership. Pure arithmetic: every u64 is a valid namespace, and unpacking never
//! fails.

/// bits 63..32 `stream_id`, 31..16 `topic_id`, 15..0 `partition_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(pub u64);

impl Namespace {
    /// Packs the three ids; a stream-level request uses topic and partition 0.
    pub fn new(stream_id: u32, topic_id: u16, partition_id: u16) -> Namespace {
        Namespace(
            (u64::from(stream_id) << 32) | (u64::from(topic_id) << 16) | u64::from(partition_id),
        )
    }
    /// Bits 63..32.
    pub fn stream_id(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// Bits 31..16.
    pub fn topic_id(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// Bits 15..0.
    pub fn partition_id(self) -> u16 {
        self.0 as u16
    }
}

/// `stream/topic/partition`, e.g. `7/1/3`.
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

#[cfg(test)]
mod tests {
    use super::Namespace;

    #[test]
    fn packs_and_unpacks() {
        let namespace = Namespace::new(0xdead_beef, 0x1234, 0xabcd);
        assert_eq!(namespace.0, 0xdead_beef_1234_abcd);
        assert_eq!(
            (
                namespace.stream_id(),
                namespace.topic_id(),
                namespace.partition_id()
            ),
            (0xdead_beef, 0x1234, 0xabcd)
        );
        assert_eq!(Namespace::new(7, 1, 3).to_string(), "7/1/3");
        assert_eq!(Namespace::new(7, 0, 0).0, 7 << 32);
    }
}
