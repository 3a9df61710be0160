//! The receiving side of state transfer on shard 0 (DESIGN section 10, issue 9 section 4),
//! owned by the core. FOUNDATION STUB: the receiver helper fills this in.

/// The receiver's stage (DESIGN section 10): `Idle -> AwaitingTarget -> Fetching -> Installing
/// -> Idle`; any other edge is a bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Idle,
    AwaitingTarget,
    Fetching,
    Installing,
}
