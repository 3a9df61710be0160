//! The simulated clients: each registers, then sends its share of the run's metadata changes,
//! one request in flight, retrying on timeout and following `NotPrimary` to the primary it names
//! (or the next replica). The changes are CreateStream / CreateTopic / DeleteTopic with ids drawn
//! so that some conflict across clients (a stream created twice, a topic in a stream that does
//! not exist yet): the cluster must reject those deterministically, the same on every replica.
//!
//! A client never changes a request's operation when it retries it (that would be a different
//! request under the same number, which the core refuses).

use std::collections::VecDeque;

use shards::metadata::MetadataOp;
use shards::vsr::message::{ClientReply, ClientRequest, ReplicaIndex};
use shards::vsr::prepare::PrepareOperation;

use super::prng::Prng;

/// Ticks a client waits for a reply before it retries at the next replica.
pub const REQUEST_TIMEOUT_TICKS: u64 = 60;
/// Simulated microseconds per tick (the driver's 10 ms tick), for request timestamps.
pub const TICK_US: u64 = 10_000;

/// Where a client is with its current request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Sends (or resends) the current request at `send_tick`.
    Ready { send_tick: u64 },
    /// Waiting for the reply to the attempt that carried `token`.
    Waiting { token: u64, deadline_tick: u64 },
    /// Every request answered.
    Done,
}

/// One simulated client.
#[derive(Debug)]
pub struct Client {
    pub id: u128,
    /// The current request number (0: Register).
    request: u64,
    operation: PrepareOperation,
    /// The changes still to send after the current one.
    backlog: VecDeque<MetadataOp>,
    phase: Phase,
    /// The replica the next attempt goes to.
    target: ReplicaIndex,
    replica_count: u8,
    /// Attempts of the current request so far.
    pub attempt_count: u64,
}

/// What a reply did to its client (for the checks and the trace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyEffect {
    /// The final reply to `request`; the client moved on.
    Final { request: u64 },
    /// Not final (NotPrimary, Error, Evicted); the client retries.
    Retry,
    /// For an attempt the client no longer waits for (a duplicate or a late reply).
    Stale,
}

/// Generates `request_count` changes: stream ids mostly fresh, sometimes reused; topics in
/// streams that may not exist (yet), sometimes deleted.
pub fn generate_operations(prng: &mut Prng, request_count: u64) -> Vec<MetadataOp> {
    let mut next_stream_id = 1u32;
    (0..request_count)
        .map(|_| match prng.below(10) {
            0..=3 => {
                // One in four reuses an earlier id: StreamAlreadyExists for the later commit.
                let stream_id = if next_stream_id > 1 && prng.chance(0.25) {
                    prng.range_inclusive(1, u64::from(next_stream_id) - 1) as u32
                } else {
                    next_stream_id += 1;
                    next_stream_id - 1
                };
                MetadataOp::CreateStream {
                    stream_id,
                    name: format!("stream-{stream_id}"),
                }
            }
            4..=7 => {
                let stream_id = prng.range_inclusive(1, u64::from(next_stream_id)) as u32;
                let topic_id = prng.range_inclusive(1, 3) as u16;
                MetadataOp::CreateTopic {
                    stream_id,
                    topic_id,
                    name: format!("topic-{stream_id}-{topic_id}"),
                    partition_count: prng.range_inclusive(1, 4) as u32,
                    retention: shards::metadata::Retention {
                        bytes: prng.below(2) * 1_000_000,
                        ms: 0,
                    },
                }
            }
            8 => MetadataOp::DeleteTopic {
                stream_id: prng.range_inclusive(1, u64::from(next_stream_id)) as u32,
                topic_id: prng.range_inclusive(1, 3) as u16,
            },
            // Issue 11: retention changes and consumer groups take the same commit path.
            _ => {
                let stream_id = prng.range_inclusive(1, u64::from(next_stream_id)) as u32;
                let topic_id = prng.range_inclusive(1, 3) as u16;
                let name = format!("group-{}", prng.below(2));
                match prng.below(3) {
                    0 => MetadataOp::AlterTopic {
                        stream_id,
                        topic_id,
                        retention_bytes: None,
                        retention_ms: Some(prng.below(3) * 60_000),
                    },
                    1 => MetadataOp::CreateGroup {
                        stream_id,
                        topic_id,
                        name,
                    },
                    _ => MetadataOp::DeleteGroup {
                        stream_id,
                        topic_id,
                        name,
                    },
                }
            }
        })
        .collect()
}

impl Client {
    /// Client `id` that will send `operations` (after its Register), starting at replica
    /// `target` at tick `start_tick`.
    pub fn new(
        id: u128,
        operations: Vec<MetadataOp>,
        replica_count: u8,
        target: ReplicaIndex,
        start_tick: u64,
    ) -> Client {
        assert!(id != 0, "client id 0 is reserved");
        Client {
            id,
            request: 0,
            operation: PrepareOperation::Register,
            backlog: operations.into(),
            phase: Phase::Ready {
                send_tick: start_tick,
            },
            target,
            replica_count,
            attempt_count: 0,
        }
    }

    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The request the client waits on, if any.
    pub fn pending_request(&self) -> Option<u64> {
        (!self.is_done()).then_some(self.request)
    }

    /// At tick `now`: the attempt to send, if one is due (a first send, or a retry after a
    /// timeout, which goes to the next replica). `token` is the attempt's fresh token.
    pub fn poll_send(&mut self, now: u64, token: u64) -> Option<(ReplicaIndex, ClientRequest)> {
        match self.phase {
            Phase::Ready { send_tick } if now >= send_tick => {}
            Phase::Waiting { deadline_tick, .. } if now >= deadline_tick => {
                self.target = (self.target + 1) % self.replica_count;
            }
            _ => return None,
        }
        self.phase = Phase::Waiting {
            token,
            deadline_tick: now + REQUEST_TIMEOUT_TICKS,
        };
        self.attempt_count += 1;
        Some((
            self.target,
            ClientRequest {
                token,
                client: self.id,
                request: self.request,
                operation: self.operation.clone(),
                timestamp_us: now * TICK_US,
            },
        ))
    }

    /// The reply `reply` to the attempt that carried `token`, at tick `now`.
    pub fn on_reply(
        &mut self,
        prng: &mut Prng,
        now: u64,
        token: u64,
        reply: &ClientReply,
    ) -> ReplyEffect {
        match self.phase {
            Phase::Waiting { token: waiting, .. } if waiting == token => {}
            _ => return ReplyEffect::Stale,
        }
        match reply {
            ClientReply::Committed(_) | ClientReply::Registered { .. } => {
                let request = self.request;
                self.advance(prng, now);
                ReplyEffect::Final { request }
            }
            ClientReply::NotPrimary { primary, .. } => {
                let (target, wait) = match primary {
                    Some(primary) if *primary != self.target => (*primary, 1),
                    _ => ((self.target + 1) % self.replica_count, 10),
                };
                self.target = target;
                self.phase = Phase::Ready {
                    send_tick: now + wait,
                };
                ReplyEffect::Retry
            }
            ClientReply::Error { .. } | ClientReply::Evicted { .. } => {
                self.phase = Phase::Ready {
                    send_tick: now + prng.range_inclusive(5, 20),
                };
                ReplyEffect::Retry
            }
        }
    }

    fn advance(&mut self, prng: &mut Prng, now: u64) {
        self.attempt_count = 0;
        match self.backlog.pop_front() {
            Some(operation) => {
                self.request += 1;
                self.operation = PrepareOperation::Metadata(operation);
                self.phase = Phase::Ready {
                    send_tick: now + prng.range_inclusive(0, 5),
                };
            }
            None => self.phase = Phase::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_registers_retries_follows_not_primary_and_finishes() {
        let mut prng = Prng::new(1);
        let operations = generate_operations(&mut prng, 1);
        let mut client = Client::new(5, operations, 3, 0, 0);
        let (target, register) = client.poll_send(0, 100).unwrap();
        assert_eq!((target, register.request), (0, 0));
        assert_eq!(register.operation, PrepareOperation::Register);
        assert!(client.poll_send(1, 101).is_none(), "one request in flight");
        // A timeout resends the same request to the next replica.
        let (target, retry) = client.poll_send(REQUEST_TIMEOUT_TICKS, 102).unwrap();
        assert_eq!((target, retry.request, retry.token), (1, 0, 102));
        assert_eq!(
            client.on_reply(&mut prng, 70, 100, &ClientReply::Registered { session: 1 }),
            ReplyEffect::Stale,
            "a reply to an abandoned attempt"
        );
        let not_primary = ClientReply::NotPrimary {
            view: 2,
            primary: Some(2),
        };
        assert_eq!(
            client.on_reply(&mut prng, 70, 102, &not_primary),
            ReplyEffect::Retry
        );
        let (target, retry) = client.poll_send(71, 103).unwrap();
        assert_eq!((target, retry.request), (2, 0));
        let registered = ClientReply::Registered { session: 1 };
        assert_eq!(
            client.on_reply(&mut prng, 72, 103, &registered),
            ReplyEffect::Final { request: 0 }
        );
        let (_, change) = client.poll_send(100, 104).unwrap();
        assert_eq!(change.request, 1);
        assert!(matches!(change.operation, PrepareOperation::Metadata(_)));
        assert_eq!(client.pending_request(), Some(1));
    }

    #[test]
    fn operations_include_conflicts() {
        let mut prng = Prng::new(2);
        let operations = generate_operations(&mut prng, 200);
        let mut created = std::collections::BTreeSet::new();
        let reused = operations
            .iter()
            .filter(|operation| match operation {
                MetadataOp::CreateStream { stream_id, .. } => !created.insert(*stream_id),
                _ => false,
            })
            .count();
        assert!(reused > 0, "some CreateStream reuse an id");
        assert!(
            operations
                .iter()
                .any(|operation| matches!(operation, MetadataOp::DeleteTopic { .. }))
        );
    }
}
