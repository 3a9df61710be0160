//! Consumer identities for stored offsets (issue 11 sections 1 and 2): a named consumer, or a
//! consumer group whose members share one offset per partition.

/// Whose offset a `StoreOffset` / `GetOffset` names: header `count` on the wire.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConsumerKind {
    /// A standalone consumer: the name is the consumer's own.
    Consumer = 0,
    /// A consumer group: the name is the group's; only a member assigned the partition in the
    /// current generation may store.
    Group = 1,
}

impl ConsumerKind {
    /// The kind numbered `value`, or `None` for an unknown number.
    pub fn from_u32(value: u32) -> Option<ConsumerKind> {
        match value {
            0 => Some(ConsumerKind::Consumer),
            1 => Some(ConsumerKind::Group),
            _ => None,
        }
    }
}

/// A consumer (or group) whose offset is stored per partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Consumer {
    pub kind: ConsumerKind,
    pub name: String,
}

impl Consumer {
    /// A consumer `kind` named `name`.
    ///
    /// # Errors
    /// The name is empty, longer than `NAME_LEN_MAX` bytes, or holds control characters; the
    /// message names the rule.
    pub fn new(kind: ConsumerKind, name: &str) -> Result<Consumer, String> {
        validate_consumer_name(name)?;
        Ok(Consumer {
            kind,
            name: name.to_owned(),
        })
    }
}

/// The rule for consumer and group names: 1..=`NAME_LEN_MAX` bytes of UTF-8 without control
/// characters (as stream and topic names).
///
/// # Errors
/// A message naming the rule the name breaks.
pub fn validate_consumer_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > crate::limits::NAME_LEN_MAX {
        return Err(format!(
            "consumer name must be 1 to {} bytes, got {}",
            crate::limits::NAME_LEN_MAX,
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!(
            "consumer name {name:?} contains control characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_1_consumer_names_follow_the_stream_name_rule() {
        assert!(Consumer::new(ConsumerKind::Consumer, "billing").is_ok());
        assert!(Consumer::new(ConsumerKind::Group, "").is_err());
        assert!(Consumer::new(ConsumerKind::Group, "a\nb").is_err());
        let long = "x".repeat(crate::limits::NAME_LEN_MAX + 1);
        assert!(Consumer::new(ConsumerKind::Consumer, &long).is_err());
        assert_eq!(ConsumerKind::from_u32(1), Some(ConsumerKind::Group));
        assert_eq!(ConsumerKind::from_u32(2), None);
    }
}
