//! Read-back verification: every acknowledged message must come back exactly once, at the offset
//! it was acknowledged at, with the id that was sent there, an intact checksum and its payload.
//!
//! The verifier works on plain records (offset, id, checksum ok, payload ok) so it can be tested
//! without a server; the consumer builds the records from `bus::MessageView`s. It must never talk
//! to the network and never forgive a fault: one fault fails the run.

use bus::{BatchError, BatchView, ChecksumRule, MessageView};
use serde::Serialize;

use super::ack::{AckRange, acked_count_in, acked_end_offset, overlapping_ack_count};

/// A polled message and whether its payload hashes to its checksum.
#[derive(Debug, Clone, Copy)]
pub struct CheckedMessage<'a> {
    pub message: MessageView<'a>,
    pub checksum_ok: bool,
}

/// The messages at or above `offset` in a poll reply's concatenated batches, each with its
/// payload checksum checked exactly once: under `ChecksumRule::MessageHeaders` (every batch
/// `bus::BatchBuilder` builds, so every bench batch) `BatchView::parse` already hashed each
/// payload against its checksum and failed the batch otherwise, so `checksum_ok` is `true`
/// without hashing again; under `Section` (batches from before issue 12) parse checked only the
/// section, so each payload is hashed here (`MessageView::verify`). The rule: storage/FORMAT.md
/// section 3, "Checksum rule".
///
/// # Errors
/// The first batch that does not parse (`BatchView::parse_many`), including a `MessageChecksum`
/// of a `MessageHeaders` batch.
pub fn checked_messages(body: &[u8], offset: u64) -> Result<Vec<CheckedMessage<'_>>, BatchError> {
    let batches = BatchView::parse_many(body)?;
    let mut checked = Vec::new();
    for batch in &batches {
        let parse_hashed_payloads = batch.checksum_rule() == ChecksumRule::MessageHeaders;
        checked.extend(
            batch
                .messages()
                .filter(|message| message.offset >= offset)
                .map(|message| CheckedMessage {
                    message,
                    checksum_ok: parse_hashed_payloads || message.verify(),
                }),
        );
    }
    Ok(checked)
}

/// One message as read back, reduced to what verification needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageRecord {
    pub offset: u64,
    pub id: u64,
    /// XXH3-64 of the payload equals the message's stored checksum ([`checked_messages`]).
    pub checksum_ok: bool,
    /// The payload equals the one the producer sent for this id.
    pub payload_ok: bool,
}

/// What went wrong, at the first place it went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// The next message read was at `found_offset`, above `expected_offset`.
    Gap {
        expected_offset: u64,
        found_offset: u64,
    },
    /// A message at an offset already read (or below it).
    Duplicate { offset: u64 },
    /// The id at `offset` is not the one acknowledged there.
    WrongId {
        offset: u64,
        expected_id: u64,
        found_id: u64,
    },
    /// The payload does not match its checksum.
    BadChecksum { offset: u64 },
    /// The payload matches its checksum but is not what was sent.
    BadPayload { offset: u64 },
    /// Acknowledged offsets `from_offset..to_offset` never came back.
    Missing { from_offset: u64, to_offset: u64 },
    /// Two acknowledged batches were given overlapping offsets.
    OverlappingAcks { message_count: u64 },
    /// A message nobody acknowledged, inside the acknowledged part of the log.
    Unacknowledged { offset: u64, id: u64 },
    /// A poll reply at `offset` did not parse.
    UnreadableBatch { offset: u64, error: String },
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Gap {
                expected_offset,
                found_offset,
            } => {
                write!(
                    f,
                    "gap: expected offset {expected_offset}, next was {found_offset}"
                )
            }
            Fault::Duplicate { offset } => write!(f, "duplicate message at offset {offset}"),
            Fault::WrongId {
                offset,
                expected_id,
                found_id,
            } => write!(
                f,
                "wrong id at offset {offset}: acknowledged {expected_id:#x}, read {found_id:#x}"
            ),
            Fault::BadChecksum { offset } => write!(f, "bad checksum at offset {offset}"),
            Fault::BadPayload { offset } => write!(f, "payload differs from sent at {offset}"),
            Fault::Missing {
                from_offset,
                to_offset,
            } => {
                // Half-open in the value, inclusive in the text: `offsets 3-4`.
                if to_offset - from_offset == 1 {
                    write!(f, "offset {from_offset} never came back")
                } else {
                    write!(f, "offsets {from_offset}-{} never came back", to_offset - 1)
                }
            }
            Fault::OverlappingAcks { message_count } => {
                write!(f, "{message_count} offsets were acknowledged twice")
            }
            Fault::Unacknowledged { offset, id } => {
                write!(f, "unacknowledged message {id:#x} at offset {offset}")
            }
            Fault::UnreadableBatch { offset, error } => {
                write!(f, "poll reply at offset {offset} does not parse: {error}")
            }
        }
    }
}

/// What one record did to the verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// Acknowledged here and intact.
    Verified,
    /// Acknowledged here but wrong (id, checksum or payload). A gap before a record is recorded as
    /// its own fault; the record itself can still be `Verified`.
    Faulty,
    /// At an offset already passed.
    Duplicate,
    /// No acknowledgement covers the offset.
    Unacknowledged,
}

/// Verifies one partition read sequentially from offset 0.
#[derive(Debug)]
pub struct PartitionVerifier {
    partition_id: u16,
    next_offset: u64,
    /// Index into the ack ranges of the range that held the previous offset (ranges are normally
    /// in offset order, so lookups are O(1) amortized).
    range_index: usize,
    verdict: PartitionVerdict,
}

/// Outcome of one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionVerdict {
    pub partition_id: u16,
    pub acked_count: u64,
    pub verified_count: u64,
    /// Acknowledged messages that are missing or wrong.
    pub lost_count: u64,
    pub duplicate_count: u64,
    pub unacknowledged_count: u64,
    pub fault_count: u64,
    pub first_fault: Option<Fault>,
}

impl PartitionVerdict {
    pub fn is_clean(&self) -> bool {
        self.fault_count == 0
    }
}

impl PartitionVerifier {
    pub fn new(partition_id: u16) -> PartitionVerifier {
        PartitionVerifier {
            partition_id,
            next_offset: 0,
            range_index: 0,
            verdict: PartitionVerdict {
                partition_id,
                ..PartitionVerdict::default()
            },
        }
    }

    pub fn partition_id(&self) -> u16 {
        self.partition_id
    }

    /// The offset to read next.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Records a fault found outside `observe` (an unreadable poll reply).
    pub fn record_fault(&mut self, fault: Fault) {
        self.verdict.fault_count += 1;
        self.verdict.first_fault.get_or_insert(fault);
    }

    fn find_range(&mut self, acks: &[AckRange], offset: u64) -> Option<AckRange> {
        while let Some(range) = acks.get(self.range_index) {
            if range.contains(offset) {
                return Some(*range);
            }
            if range.base_offset > offset {
                break;
            }
            self.range_index += 1;
        }
        // Out-of-order ranges (a server bug that `finish` reports as overlap or gap): full scan.
        let found = acks.iter().position(|range| range.contains(offset))?;
        self.range_index = found;
        Some(acks[found])
    }

    /// Checks the next message read. `acks` are this partition's acknowledged ranges known so far;
    /// the caller passes only records below their `acked_end_offset`.
    pub fn observe(&mut self, record: &MessageRecord, acks: &[AckRange]) -> Observation {
        if record.offset < self.next_offset {
            self.verdict.duplicate_count += 1;
            self.record_fault(Fault::Duplicate {
                offset: record.offset,
            });
            return Observation::Duplicate;
        }
        if record.offset > self.next_offset {
            self.verdict.lost_count += acked_count_in(acks, self.next_offset, record.offset);
            self.record_fault(Fault::Gap {
                expected_offset: self.next_offset,
                found_offset: record.offset,
            });
        }
        self.next_offset = record.offset + 1;
        let Some(range) = self.find_range(acks, record.offset) else {
            self.verdict.unacknowledged_count += 1;
            self.record_fault(Fault::Unacknowledged {
                offset: record.offset,
                id: record.id,
            });
            return Observation::Unacknowledged;
        };
        let expected_id = range.id_at(record.offset);
        let fault = if record.id != expected_id {
            Some(Fault::WrongId {
                offset: record.offset,
                expected_id,
                found_id: record.id,
            })
        } else if !record.checksum_ok {
            Some(Fault::BadChecksum {
                offset: record.offset,
            })
        } else if !record.payload_ok {
            Some(Fault::BadPayload {
                offset: record.offset,
            })
        } else {
            None
        };
        if let Some(fault) = fault {
            self.verdict.lost_count += 1;
            self.record_fault(fault);
            Observation::Faulty
        } else {
            self.verdict.verified_count += 1;
            Observation::Verified
        }
    }

    /// Closes the partition: everything acknowledged at or above the next offset is missing, and
    /// overlapping acknowledgements count as lost.
    pub fn finish(mut self, acks: &[AckRange]) -> PartitionVerdict {
        self.verdict.acked_count = acks
            .iter()
            .map(|range| u64::from(range.message_count))
            .sum();
        let acked_end = acked_end_offset(acks);
        if self.next_offset < acked_end {
            let missing_count = acked_count_in(acks, self.next_offset, acked_end);
            if missing_count > 0 {
                self.verdict.lost_count += missing_count;
                self.record_fault(Fault::Missing {
                    from_offset: self.next_offset,
                    to_offset: acked_end,
                });
            }
        }
        let overlap_count = overlapping_ack_count(acks);
        if overlap_count > 0 {
            self.verdict.lost_count += overlap_count;
            self.record_fault(Fault::OverlappingAcks {
                message_count: overlap_count,
            });
        }
        self.verdict
    }
}

/// Totals over every partition of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerificationSummary {
    pub acked_count: u64,
    pub verified_count: u64,
    pub lost_count: u64,
    pub duplicate_count: u64,
    pub unacknowledged_count: u64,
    pub fault_count: u64,
    /// The first faulty partition (lowest id) and its first fault.
    pub first_fault: Option<(u16, Fault)>,
}

impl VerificationSummary {
    pub fn from_verdicts(verdicts: &[PartitionVerdict]) -> VerificationSummary {
        let mut sorted: Vec<&PartitionVerdict> = verdicts.iter().collect();
        sorted.sort_by_key(|verdict| verdict.partition_id);
        let mut summary = VerificationSummary::default();
        for verdict in sorted {
            summary.acked_count += verdict.acked_count;
            summary.verified_count += verdict.verified_count;
            summary.lost_count += verdict.lost_count;
            summary.duplicate_count += verdict.duplicate_count;
            summary.unacknowledged_count += verdict.unacknowledged_count;
            summary.fault_count += verdict.fault_count;
            if summary.first_fault.is_none()
                && let Some(fault) = &verdict.first_fault
            {
                summary.first_fault = Some((verdict.partition_id, fault.clone()));
            }
        }
        summary
    }

    pub fn is_clean(&self) -> bool {
        self.fault_count == 0
    }
}

impl std::fmt::Display for VerificationSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} acknowledged messages verified, {} lost, {} duplicates, {} unacknowledged",
            self.verified_count,
            self.acked_count,
            self.lost_count,
            self.duplicate_count,
            self.unacknowledged_count
        )?;
        if let Some((partition_id, fault)) = &self.first_fault {
            write!(f, "; first fault: partition {partition_id}: {fault}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of three 4-byte messages (ids 10, 11, 12) stored at offset 100.
    fn batch() -> Vec<u8> {
        let mut builder = bus::BatchBuilder::with_capacity(3, 12);
        for (id, payload) in [(10, b"aaaa"), (11, b"bbbb"), (12, b"cccc")] {
            builder.push(id, 1_700_000_000_000_000, payload);
        }
        let mut bytes = builder.finish();
        bus::batch::set_base_offset(&mut bytes, 100);
        bytes
    }

    /// Where message `index`'s header starts in [`batch`] (4-byte payloads).
    fn message_header_at(index: usize) -> usize {
        bus::BATCH_HEADER_SIZE + index * (bus::MESSAGE_HEADER_SIZE + 4)
    }

    #[test]
    fn builder_batches_were_hashed_by_parse_and_come_back_checked() {
        let bytes = batch();
        let checked = checked_messages(&bytes, 101).unwrap();
        let seen: Vec<(u64, u64, bool)> = checked
            .iter()
            .map(|checked| {
                (
                    checked.message.offset,
                    checked.message.id,
                    checked.checksum_ok,
                )
            })
            .collect();
        assert_eq!(seen, [(101, 11, true), (102, 12, true)]);
        // A damaged payload fails the parse itself: no message is handed out unchecked.
        let mut damaged = bytes.clone();
        damaged[message_header_at(1) + bus::MESSAGE_HEADER_SIZE] ^= 1;
        assert!(matches!(
            checked_messages(&damaged, 100).unwrap_err(),
            BatchError::MessageChecksum { .. }
        ));
    }

    #[test]
    fn section_rule_batches_have_each_payload_hashed_here() {
        // The rule before issue 12: flag bits 1 and 2 clear, the batch checksum over the whole
        // section, and one message checksum that does not match its payload (parse cannot see
        // it).
        let mut bytes = batch();
        bytes[message_header_at(0) + 12] &= !((bus::MESSAGE_FLAG_CHECKSUM_OF_HEADERS
            | bus::MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP)
            as u8);
        bytes[message_header_at(2) + 24] ^= 1;
        let section_checksum = twox_hash::XxHash3_64::oneshot(&bytes[bus::BATCH_HEADER_SIZE..]);
        bytes[24..32].copy_from_slice(&section_checksum.to_le_bytes());
        let checked = checked_messages(&bytes, 0).unwrap();
        let verdicts: Vec<(u64, bool)> = checked
            .iter()
            .map(|checked| (checked.message.id, checked.checksum_ok))
            .collect();
        assert_eq!(verdicts, [(10, true), (11, true), (12, false)]);
    }

    fn range(base_offset: u64, message_count: u32, first_id: u64) -> AckRange {
        AckRange {
            base_offset,
            message_count,
            first_id,
            payload_bytes: 0,
        }
    }

    fn good(offset: u64, id: u64) -> MessageRecord {
        MessageRecord {
            offset,
            id,
            checksum_ok: true,
            payload_ok: true,
        }
    }

    /// Two batches: offsets 0..3 with ids 100.., offsets 3..5 with ids 500...
    fn two_batches() -> Vec<AckRange> {
        vec![range(0, 3, 100), range(3, 2, 500)]
    }

    fn run(records: &[MessageRecord], acks: &[AckRange]) -> PartitionVerdict {
        let mut verifier = PartitionVerifier::new(7);
        for record in records {
            verifier.observe(record, acks);
        }
        verifier.finish(acks)
    }

    #[test]
    fn clean_partition_verifies_every_message() {
        let acks = two_batches();
        let records = [
            good(0, 100),
            good(1, 101),
            good(2, 102),
            good(3, 500),
            good(4, 501),
        ];
        let verdict = run(&records, &acks);
        assert_eq!(
            verdict,
            PartitionVerdict {
                partition_id: 7,
                acked_count: 5,
                verified_count: 5,
                ..PartitionVerdict::default()
            }
        );
        assert!(verdict.is_clean());
    }

    #[test]
    fn gap_is_detected_and_counts_the_skipped_messages() {
        let acks = two_batches();
        let records = [good(0, 100), good(3, 500), good(4, 501)];
        let verdict = run(&records, &acks);
        assert_eq!(verdict.lost_count, 2);
        assert_eq!(verdict.verified_count, 3);
        assert_eq!(
            verdict.first_fault,
            Some(Fault::Gap {
                expected_offset: 1,
                found_offset: 3
            })
        );
    }

    #[test]
    fn duplicate_is_detected() {
        let acks = two_batches();
        let records = [
            good(0, 100),
            good(1, 101),
            good(1, 101),
            good(2, 102),
            good(3, 500),
            good(4, 501),
        ];
        let verdict = run(&records, &acks);
        assert_eq!(verdict.duplicate_count, 1);
        assert_eq!(verdict.lost_count, 0);
        assert_eq!(verdict.verified_count, 5);
        assert_eq!(verdict.first_fault, Some(Fault::Duplicate { offset: 1 }));
        assert!(!verdict.is_clean());
    }

    #[test]
    fn wrong_id_is_detected() {
        let acks = two_batches();
        let records = [
            good(0, 100),
            good(1, 101),
            good(2, 102),
            good(3, 501),
            good(4, 501),
        ];
        let verdict = run(&records, &acks);
        assert_eq!(verdict.lost_count, 1);
        assert_eq!(
            verdict.first_fault,
            Some(Fault::WrongId {
                offset: 3,
                expected_id: 500,
                found_id: 501
            })
        );
    }

    #[test]
    fn bad_checksum_is_detected() {
        let acks = two_batches();
        let mut records = [
            good(0, 100),
            good(1, 101),
            good(2, 102),
            good(3, 500),
            good(4, 501),
        ];
        records[2].checksum_ok = false;
        let verdict = run(&records, &acks);
        assert_eq!(verdict.lost_count, 1);
        assert_eq!(verdict.verified_count, 4);
        assert_eq!(verdict.first_fault, Some(Fault::BadChecksum { offset: 2 }));
    }

    #[test]
    fn bad_payload_is_detected() {
        let acks = two_batches();
        let mut records = [
            good(0, 100),
            good(1, 101),
            good(2, 102),
            good(3, 500),
            good(4, 501),
        ];
        records[4].payload_ok = false;
        let verdict = run(&records, &acks);
        assert_eq!(verdict.lost_count, 1);
        assert_eq!(verdict.first_fault, Some(Fault::BadPayload { offset: 4 }));
    }

    #[test]
    fn missing_tail_is_detected_at_finish() {
        let acks = two_batches();
        let verdict = run(&[good(0, 100), good(1, 101)], &acks);
        assert_eq!(verdict.lost_count, 3);
        assert_eq!(
            verdict.first_fault,
            Some(Fault::Missing {
                from_offset: 2,
                to_offset: 5
            })
        );
    }

    #[test]
    fn nothing_read_loses_everything() {
        let verdict = run(&[], &two_batches());
        assert_eq!(verdict.lost_count, 5);
        assert_eq!(verdict.verified_count, 0);
    }

    #[test]
    fn overlapping_acks_count_as_lost() {
        let acks = vec![range(0, 3, 100), range(2, 2, 500)];
        assert_eq!(overlapping_ack_count(&acks), 1);
        let records = [good(0, 100), good(1, 101), good(2, 102), good(3, 501)];
        let verdict = run(&records, &acks);
        assert_eq!(verdict.verified_count, 4);
        assert_eq!(verdict.lost_count, 1);
        assert_eq!(
            verdict.first_fault,
            Some(Fault::OverlappingAcks { message_count: 1 })
        );
    }

    #[test]
    fn unacknowledged_message_inside_a_hole_is_a_fault() {
        // The server acknowledged 0..2 and 3..4: offset 2 holds a message nobody was told about.
        let acks = vec![range(0, 2, 100), range(3, 1, 500)];
        let records = [good(0, 100), good(1, 101), good(2, 999), good(3, 500)];
        let verdict = run(&records, &acks);
        assert_eq!(verdict.unacknowledged_count, 1);
        assert_eq!(verdict.lost_count, 0);
        assert_eq!(verdict.verified_count, 3);
        assert_eq!(
            verdict.first_fault,
            Some(Fault::Unacknowledged { offset: 2, id: 999 })
        );
    }

    #[test]
    fn out_of_order_ranges_are_still_found() {
        let acks = vec![range(3, 2, 500), range(0, 3, 100)];
        let records = [
            good(0, 100),
            good(1, 101),
            good(2, 102),
            good(3, 500),
            good(4, 501),
        ];
        let verdict = run(&records, &acks);
        assert_eq!(verdict.verified_count, 5);
        assert!(verdict.is_clean());
    }

    #[test]
    fn summary_names_the_first_faulty_partition() {
        let clean = PartitionVerdict {
            partition_id: 1,
            acked_count: 5,
            verified_count: 5,
            ..PartitionVerdict::default()
        };
        let faulty = PartitionVerdict {
            partition_id: 4,
            acked_count: 5,
            verified_count: 3,
            lost_count: 2,
            fault_count: 1,
            first_fault: Some(Fault::Missing {
                from_offset: 3,
                to_offset: 5,
            }),
            ..PartitionVerdict::default()
        };
        let summary = VerificationSummary::from_verdicts(&[faulty, clean]);
        assert_eq!(summary.acked_count, 10);
        assert_eq!(summary.verified_count, 8);
        assert_eq!(summary.lost_count, 2);
        assert!(!summary.is_clean());
        assert_eq!(
            summary.to_string(),
            "8 of 10 acknowledged messages verified, 2 lost, 0 duplicates, 0 unacknowledged; \
             first fault: partition 4: offsets 3-4 never came back"
        );
    }
}
