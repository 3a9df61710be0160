//! The deterministic apply of one committed prepare to the metadata state machine and the client
//! table: the same function on every replica, at every op, in op order (VSR Revisited section
//! 4.1 step 5 "the replica executes the operation": every replica must reach the same state).
//!
//! A metadata change is validated against the state at apply time, not at prepare time: with a
//! pipeline, several prepares are in flight at once and may conflict (two creates of one stream
//! name). A change that does not validate is not an error: it commits as a *rejection*, whose
//! cached reply carries the error code and message, and nothing else changes. So every replica
//! caches the same reply, and a client that retries after a failover gets the same answer.
//!
//! Pure: no I/O, no clock. Moved from `vsr::boot` (`apply_prepare`, `change_reply`,
//! `change_checksum`), which the single-replica path used.

use super::client_table::{CachedReply, ClientTable, Lookup, request_checksum};
use super::prepare::{PrepareBody, PrepareOperation};
use crate::metadata::{MetadataOp, MetadataState, Rejection};

/// The checksum of a metadata change's arguments (see [`CachedReply::request_checksum`]).
pub fn change_checksum(op: &MetadataOp) -> u64 {
    request_checksum(&serde_json::to_vec(op).expect("metadata op serializes: plain data"))
}

/// The `bus::Operation` number of a metadata change (the cached reply's `operation`).
pub fn change_operation(op: &MetadataOp) -> u8 {
    let operation = match op {
        MetadataOp::CreateStream { .. } => bus::Operation::CreateStream,
        MetadataOp::DeleteStream { .. } => bus::Operation::DeleteStream,
        MetadataOp::CreateTopic { .. } => bus::Operation::CreateTopic,
        MetadataOp::DeleteTopic { .. } => bus::Operation::DeleteTopic,
        MetadataOp::AlterTopic { .. } => bus::Operation::AlterTopic,
        MetadataOp::CreateGroup { .. } => bus::Operation::CreateGroup,
        MetadataOp::DeleteGroup { .. } => bus::Operation::DeleteGroup,
    };
    operation as u8
}

/// The reply a committed, applied metadata change sent (and a duplicate gets again).
pub fn change_reply(request: u64, op: &MetadataOp) -> CachedReply {
    CachedReply {
        request,
        operation: change_operation(op),
        error_code: 0,
        offset: 0,
        count: 0,
        body: Vec::new(),
        request_checksum: change_checksum(op),
    }
}

/// The reply a committed but rejected metadata change sent: the rejection's error code, its
/// message as the body (UTF-8).
pub fn rejection_reply(request: u64, op: &MetadataOp, rejection: &Rejection) -> CachedReply {
    CachedReply {
        error_code: rejection.code as u32,
        body: rejection.message.clone().into_bytes(),
        ..change_reply(request, op)
    }
}

/// The message of a request that reuses a committed request number with other arguments
/// (today's wording, from `Shard::commit_metadata`).
pub fn reused_request_message(client: u128, request: u64, op: &MetadataOp) -> String {
    format!(
        "request {request} of client {client:#034x} was already committed with other arguments \
         ({op:?} is not what was committed); request numbers must not be reused"
    )
}

/// The message of a request at or below the session's last committed one whose reply is gone.
pub fn stale_request_message(client: u128, request: u64, oldest_cached_request: u64) -> String {
    format!(
        "request {request} of client {client:#034x} is at or below the session's last committed \
         request, and no reply for it is cached (oldest cached: request {oldest_cached_request}); \
         a new request needs a higher number"
    )
}

/// The reason given to a client without a session.
pub fn no_session_reason(client: u128, clients_table_max: usize) -> String {
    format!(
        "client {client:#034x} has no session: it never registered, or it was evicted because the \
         client table was full (--clients-table-max {clients_table_max}); register again"
    )
}

/// What applying one committed prepare did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A session opened at this op; `evicted` lost its slot to make room.
    Registered { session: u64, evicted: Option<u128> },
    /// The client already had `session` (a second Register in the log): nothing changed.
    AlreadyRegistered { session: u64 },
    /// The change validated and was applied; `reply` is what the client gets (cached unless the
    /// client has no session).
    Changed { reply: CachedReply },
    /// The change did not validate against the state at this op: nothing changed but the
    /// session's request number; `reply` carries the rejection (cached like a success).
    Rejected { reply: CachedReply },
    /// The request number does not advance the client's session (a duplicate prepared twice, or
    /// requests prepared out of order): nothing changed. `lookup` is what the table says.
    Duplicate { lookup: Lookup },
}

impl Applied {
    /// Whether the metadata state machine changed (what `Action::Apply::applied` reports).
    pub fn changed_metadata(&self) -> bool {
        matches!(self, Applied::Changed { .. })
    }

    /// Whether the op changed the client table or the metadata.
    pub fn changed_anything(&self) -> bool {
        matches!(
            self,
            Applied::Registered { .. } | Applied::Changed { .. } | Applied::Rejected { .. }
        )
    }
}

/// Applies committed prepare `op` of `client` (already decoded from `body`) to the client table
/// and, for a valid change, to `metadata`. Boot replay and the live core both use it, so replay
/// rebuilds exactly what every replica had. Never fails: every outcome is deterministic.
///
/// # Panics
/// If `op` is not above every op already applied to the table or the state (ops apply in order).
pub fn apply_prepare(
    metadata: &mut MetadataState,
    client_table: &mut ClientTable,
    op: u64,
    client: u128,
    body: &PrepareBody,
) -> Applied {
    match &body.operation {
        PrepareOperation::Register => {
            if let Some(session) = client_table.session(client) {
                return Applied::AlreadyRegistered {
                    session: session.session,
                };
            }
            let evicted = client_table.register(client, op);
            Applied::Registered {
                session: op,
                evicted,
            }
        }
        PrepareOperation::Metadata(change) => {
            let lookup = client_table.lookup(client, body.request);
            let has_session = match lookup {
                Lookup::New => true,
                // Evicted after the prepare (a Register in the same pipeline filled the table):
                // the change still committed; only its cached reply is lost.
                Lookup::NoSession => false,
                Lookup::Cached(_) | Lookup::Stale { .. } => {
                    return Applied::Duplicate { lookup };
                }
            };
            let (reply, applied) = match metadata.validate(change) {
                Ok(()) => (change_reply(body.request, change), true),
                Err(rejection) => (rejection_reply(body.request, change, &rejection), false),
            };
            if has_session {
                client_table.commit(client, op, reply.clone());
            }
            if applied {
                metadata.apply(op, change);
                Applied::Changed { reply }
            } else {
                Applied::Rejected { reply }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(stream_id: u32, name: &str) -> PrepareOperation {
        PrepareOperation::Metadata(MetadataOp::CreateStream {
            stream_id,
            name: name.to_owned(),
        })
    }

    #[test]
    fn vsr_4_1_apply_rejects_a_conflicting_change_deterministically_and_caches_it() {
        let mut metadata = MetadataState::new();
        let mut table = ClientTable::new(8);
        let register = PrepareBody::new(7, 0, PrepareOperation::Register, 0, 0);
        assert_eq!(
            apply_prepare(&mut metadata, &mut table, 1, 7, &register),
            Applied::Registered {
                session: 1,
                evicted: None
            }
        );
        let first = PrepareBody::new(7, 1, create(1, "a"), 0, 0);
        assert!(matches!(
            apply_prepare(&mut metadata, &mut table, 2, 7, &first),
            Applied::Changed { .. }
        ));
        // Pipelined: the same name again validated fine at the primary, conflicts at apply.
        let second = PrepareBody::new(7, 2, create(2, "a"), 0, 0);
        let Applied::Rejected { reply } = apply_prepare(&mut metadata, &mut table, 3, 7, &second)
        else {
            panic!("expected a rejection");
        };
        assert_eq!(reply.error_code, bus::ErrorCode::StreamAlreadyExists as u32);
        assert!(
            String::from_utf8(reply.body.clone())
                .unwrap()
                .contains("\"a\"")
        );
        assert_eq!(metadata.streams.len(), 1);
        assert_eq!(table.lookup(7, 2), Lookup::Cached(reply));
        // The same request number again (prepared twice): nothing changes.
        assert!(matches!(
            apply_prepare(&mut metadata, &mut table, 4, 7, &second),
            Applied::Duplicate { .. }
        ));
        // A second Register keeps the session.
        assert_eq!(
            apply_prepare(&mut metadata, &mut table, 5, 7, &register),
            Applied::AlreadyRegistered { session: 1 }
        );
    }
}
