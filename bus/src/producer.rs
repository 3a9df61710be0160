//! An idempotent producer (issue 7 item 5, after Kafka's idempotent producer, KIP-98): one
//! producer id per session and, per partition, the sequence number of the next message. Every
//! batch goes out stamped (`BatchBuilder::finish_stamped`) through `Client::send_stamped`, which
//! resends the same bytes after `Busy`, a lost reply or a reconnect; the owner shard answers a
//! resend of an appended batch with its original offsets, so each batch is appended once.
//!
//! After a send fails (the retry budget ran out, or the server refused) the producer cannot know
//! whether the batch was appended, and neither reusing its sequence numbers (a later batch would
//! be taken for it) nor skipping them (a gap) is safe: it starts a new session with a fresh id,
//! and its sequences start again at 0. This module must never send two different batches with the
//! same (producer, partition, sequence).

use std::collections::HashMap;

use crate::batch::{BatchBuilder, ProducerStamp};
use crate::client::{Client, ClientError, SendAck};
use crate::namespace::Namespace;

/// An idempotent producer over one `Client`. Not `Sync`; one per task.
#[derive(Debug)]
pub struct Producer {
    client: Client,
    /// Producer id of the current session (never 0).
    id: u64,
    /// Per partition: the sequence number of the next message this session sends there.
    sequence_next: HashMap<Namespace, u64>,
    /// A send started and has not finished: if it is still set when the next send starts, that
    /// send was cancelled with its outcome unknown, and the session is replaced.
    send_in_flight: bool,
}

/// A producer id unlikely to collide across processes and sessions: XXH3-64 of
/// `client::unique_seed` (clock, process id, a per-process counter). Never 0 (0 means "not
/// idempotent").
pub fn producer_id_new() -> u64 {
    twox_hash::XxHash3_64::oneshot(&crate::client::unique_seed()).max(1)
}

impl Producer {
    /// A producer with a fresh random id (`producer_id_new`) sending through `client`.
    pub fn new(client: Client) -> Producer {
        Producer::with_producer_id(client, producer_id_new())
    }

    /// A producer with id `producer_id`, sequences starting at 0 in every partition. Reuse an id
    /// only for a session that continues where the previous one stopped; a reused id starting
    /// again at 0 in a partition where the owner shard remembers it is refused (`SequenceGap`).
    ///
    /// # Panics
    /// If `producer_id` is 0, which on the wire means "not idempotent" (a caller bug).
    pub fn with_producer_id(client: Client, producer_id: u64) -> Producer {
        assert_ne!(producer_id, 0, "producer id 0 means not idempotent");
        Producer {
            client,
            id: producer_id,
            sequence_next: HashMap::new(),
            send_in_flight: false,
        }
    }

    /// Starts a new session: a fresh id, every partition's sequence back to 0.
    fn new_session(&mut self, why: &dyn std::fmt::Display) {
        let producer_id = producer_id_new();
        tracing::debug!(old = self.id, new = producer_id, %why, "starting a new producer session");
        self.id = producer_id;
        self.sequence_next.clear();
    }

    /// This session's producer id (changes after a failed send).
    pub fn producer_id(&self) -> u64 {
        self.id
    }

    /// The sequence number the next batch to `namespace` gets.
    pub fn sequence_next(&self, namespace: Namespace) -> u64 {
        self.sequence_next.get(&namespace).copied().unwrap_or(0)
    }

    /// The client underneath, e.g. for metadata calls or polls.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Stamps the batch in `builder` with this session's id and the partition's next sequence,
    /// sends it (resent by the client until acknowledged or the retry budget runs out), and
    /// advances the partition's sequence by its message count.
    ///
    /// # Errors
    /// As `Client::send_stamped`. After any error the batch may or may not have been appended
    /// (a definite refusal such as `InvalidBatch` means it was not); the producer has started a
    /// new session (`producer_id` changed), so the caller may send the batch again, knowing that
    /// this duplicates it if the failed send was in fact appended.
    ///
    /// # Cancel safety
    /// Not cancel safe: if dropped, the batch may or may not be appended; the next send starts a
    /// new session first, so no later batch is taken for the dropped one.
    pub async fn send(
        &mut self,
        namespace: Namespace,
        builder: BatchBuilder,
    ) -> Result<SendAck, ClientError> {
        if self.send_in_flight {
            self.new_session(&"the previous send was cancelled");
        }
        let stamp = ProducerStamp {
            producer: self.id,
            sequence: self.sequence_next(namespace),
        };
        let message_count = builder.message_count();
        let batch = builder.finish_stamped(stamp);
        self.send_in_flight = true;
        let result = self.client.send_stamped(namespace, batch, stamp).await;
        self.send_in_flight = false;
        match result {
            Ok(ack) => {
                self.sequence_next.insert(
                    namespace,
                    stamp.sequence.saturating_add(u64::from(message_count)),
                );
                Ok(ack)
            }
            Err(error) => {
                self.new_session(&error);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producer_ids_are_never_zero_and_differ() {
        let first = producer_id_new();
        let second = producer_id_new();
        assert_ne!(first, 0);
        assert_ne!(first, second);
    }
}
