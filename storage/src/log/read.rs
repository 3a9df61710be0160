//! Reads by offset (`storage/FORMAT.md` section 3, "Reads"): the entries a read returns are
//! verified against their index rows and checksums in place, on a read-only mapping of their
//! segment (`mapped.rs`), and handed out as [`VerifiedSpans`]: byte ranges of page-cache pages
//! plus the entry headers, which a server sends without copying them through user space (issue
//! 12 item 2), or copies into a `Vec` ([`PartitionLog::read`]). A span whose pages are not all
//! in the page cache, or a segment that cannot be mapped, is read with a copy through io_uring
//! instead, so a shard thread never blocks on a page fault's disk read.
//!
//! It must never hand out a byte that was not verified, nor one at or past `acked_offset`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use compio::BufResult;

use super::mapped::SegmentMapping;
use super::{LogError, PartitionLog, ReadSpan, SpanFile, verify};
use crate::durable::read_exact_append;
use crate::entry::{ENTRY_HEADER_SIZE, EntryHeader};
use crate::limits::ENTRY_SIZE_MAX;

/// The verified entries of one read, in offset order: whole entries, as stored (each a 32-byte
/// header then its payload), in one or more spans (one per segment the read crossed).
///
/// Holds what keeps its bytes alive: a mapped span holds its segment's mapping (no file
/// descriptor; a mapping keeps a file that retention deleted readable until it drops), a copied
/// span its own `Vec`. `Send`: a poll reply may be sent by another shard than the owner.
#[derive(Debug, Default)]
pub struct VerifiedSpans {
    spans: Vec<VerifiedSpan>,
    /// Every entry's 32-byte header, in order (what a poll reply's `checksum_body` covers).
    entry_headers: Vec<[u8; ENTRY_HEADER_SIZE]>,
    size_bytes: u64,
}

impl VerifiedSpans {
    /// Bytes of all spans together (the reply body's size).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// No entry (the reader is caught up).
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The spans, in offset order.
    pub fn spans(&self) -> &[VerifiedSpan] {
        &self.spans
    }

    /// The header of every entry, in offset order.
    pub fn entry_headers(&self) -> &[[u8; ENTRY_HEADER_SIZE]] {
        &self.entry_headers
    }

    /// The spans, in offset order, by value (a copied span's buffer can then be sent as is).
    pub fn into_spans(self) -> Vec<VerifiedSpan> {
        self.spans
    }

    /// Whether any span can be sent without a copy (a mapped span).
    pub fn any_mapped(&self) -> bool {
        self.spans.iter().any(VerifiedSpan::is_mapped)
    }

    /// All entries concatenated into one `Vec` (the copying path: one memory copy per byte, from
    /// the page cache or from the span's own buffer).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.size_bytes as usize);
        for span in &self.spans {
            bytes.extend_from_slice(span.bytes());
        }
        bytes
    }

    fn push(&mut self, span: VerifiedSpan) {
        let bytes = span.bytes();
        let mut at = 0usize;
        while at < bytes.len() {
            let header: [u8; ENTRY_HEADER_SIZE] = bytes[at..at + ENTRY_HEADER_SIZE]
                .try_into()
                .expect("a verified entry holds its header");
            let length = u32::from_le_bytes([header[20], header[21], header[22], header[23]]);
            self.entry_headers.push(header);
            at += ENTRY_HEADER_SIZE + length as usize;
        }
        assert_eq!(at, bytes.len(), "verified spans hold whole entries");
        self.size_bytes += bytes.len() as u64;
        self.spans.push(span);
    }
}

/// Contiguous verified entries of one segment.
#[derive(Debug)]
pub struct VerifiedSpan {
    path: PathBuf,
    position: u64,
    bytes: SpanBytes,
}

#[derive(Debug)]
enum SpanBytes {
    /// `size` bytes at `position` of the segment's mapping: acknowledged and verified.
    Mapped {
        mapping: Arc<SegmentMapping>,
        size: u64,
    },
    /// Read with a copy (pages not in the page cache, or the segment could not be mapped).
    Copied(Vec<u8>),
}

impl VerifiedSpan {
    /// The segment file the span lies in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Byte position of the span's first entry in its segment.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Whether the bytes are page-cache pages of the segment (sendable with `vmsplice`), not a
    /// buffer of their own.
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, SpanBytes::Mapped { .. })
    }

    /// The buffer of a span read with a copy, or the span itself when it is mapped.
    ///
    /// # Errors
    /// The span, unchanged, when it is mapped.
    pub fn into_copied(self) -> Result<Vec<u8>, VerifiedSpan> {
        match self.bytes {
            SpanBytes::Copied(bytes) => Ok(bytes),
            SpanBytes::Mapped { .. } => Err(self),
        }
    }

    /// The span's entries, as stored.
    pub fn bytes(&self) -> &[u8] {
        match &self.bytes {
            // SAFETY: `read_spans` made this span only from a range below the log's
            // `acked_offset` that it verified, and acknowledged segment bytes are never
            // rewritten or cut (mapped.rs module doc); the `Arc` keeps the mapping alive.
            SpanBytes::Mapped { mapping, size } => unsafe { mapping.range(self.position, *size) },
            SpanBytes::Copied(bytes) => bytes,
        }
    }
}

impl PartitionLog {
    /// Whole entries starting with the one containing `offset`, at most `max_count` messages
    /// (at least one entry if any) and about `max_bytes`, verified and handed out as file ranges
    /// (issue 12 item 2). Only acknowledged entries are visible.
    ///
    /// Reading stops before the entry that would exceed `max_bytes` or once `max_count`
    /// messages are collected, but the first entry is always returned whole. An `offset` equal
    /// to `acked_offset()` returns no span (the reader is caught up); one below `first_offset()`
    /// is refused (retention deleted it). Every returned entry's header is checked against its
    /// index row and its payload against its checksum (`verify::check_entry_payload`) before it
    /// is returned, in place on the segment's mapping: reading stops before the first entry
    /// that fails, so the intact entries before a damaged one are returned, and the damage is an
    /// error only for a read that starts at it.
    ///
    /// # Errors
    /// - `OffsetOutOfRange`: `offset` is beyond `acked_offset()` (nothing was ever written
    ///   there; resume at `next_offset`).
    /// - `OffsetRetained`: `offset` is below `first_offset()`, also when retention deleted its
    ///   segment while this read waited (resume at `first_offset`; issue 11 section 4).
    /// - `Io` naming the segment, when the first entry to return cannot be read (or its closed
    ///   segment cannot be opened: closed segments are opened on demand).
    /// - `DescriptorsExhausted` naming the segment, when that open was refused for lack of file
    ///   descriptors (retry once some are freed; the log is unaffected).
    /// - `Corrupt` naming the segment and byte position, when the first entry to return does not
    ///   match what was written.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn read_spans(
        &self,
        offset: u64,
        max_count: u32,
        max_bytes: usize,
    ) -> Result<VerifiedSpans, LogError> {
        let next_offset = self.acked_offset();
        if offset > next_offset {
            return Err(LogError::OffsetOutOfRange {
                offset,
                next_offset,
            });
        }
        self.check_not_retained(offset)?;
        let spans = match self.plan_read(offset, max_count, max_bytes).await {
            Ok(spans) => spans,
            Err(error) => {
                // Retention may have deleted the segment while its index was loading.
                self.check_not_retained(offset)?;
                return Err(error);
            }
        };
        let mut verified = VerifiedSpans::default();
        for span in spans {
            match self.verified_span(span).await {
                Ok(span) => verified.push(span),
                Err((intact, error)) => {
                    if let Some(intact) = intact {
                        verified.push(intact);
                    }
                    if verified.is_empty() {
                        // Retention may have deleted the segment while this read waited for it.
                        self.check_not_retained(offset)?;
                        return Err(error);
                    }
                    // The entries before the damaged one are served; the next read starts at
                    // it and gets the error.
                    tracing::warn!(%error, "read stopped before a damaged entry");
                    return Ok(verified);
                }
            }
        }
        Ok(verified)
    }

    /// Whole entries as [`PartitionLog::read_spans`] returns them, copied into one `Vec` (the
    /// copying path: tests, and what cannot be sent without a copy).
    ///
    /// # Errors
    /// As [`PartitionLog::read_spans`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn read(
        &self,
        offset: u64,
        max_count: u32,
        max_bytes: usize,
    ) -> Result<Vec<u8>, LogError> {
        Ok(self
            .read_spans(offset, max_count, max_bytes)
            .await?
            .to_vec())
    }

    /// Verifies the entries of `span` and returns them: on the segment's mapping when its pages
    /// are all in the page cache, else read with a copy.
    ///
    /// # Errors
    /// The verified entries before the first that fails (`None` when none), with its error.
    async fn verified_span(
        &self,
        mut span: ReadSpan,
    ) -> Result<VerifiedSpan, (Option<VerifiedSpan>, LogError)> {
        let end = span.position + span.size_bytes;
        let cached = self
            .shared
            .state
            .borrow_mut()
            .mappings
            .get(span.segment_base_offset, end);
        // The file is opened (a closed segment: one closed-file slot, until this span is read)
        // only when no mapping covers the span yet, or to read it with a copy.
        let mut file = None;
        let mapping = if let Some(mapping) = cached {
            Some(mapping)
        } else {
            let opened = self.span_file(&mut span).await.map_err(|e| (None, e))?;
            let mapping = self.map_segment(&span, &opened, end);
            file = Some(opened);
            mapping
        };
        if let Some(mapping) = mapping {
            match mapping.is_resident(span.position, span.size_bytes) {
                Ok(true) => {
                    // SAFETY: the span lies below `acked_offset` (ReadPlan never plans past
                    // it), so inside the file and never rewritten or cut while mapped.
                    let bytes = unsafe { mapping.range(span.position, span.size_bytes) };
                    return match check_read_entries(&span, bytes) {
                        Ok(()) => Ok(mapped_span(&span, mapping, span.size_bytes)),
                        Err((intact_bytes, error)) => Err((
                            (intact_bytes > 0)
                                .then(|| mapped_span(&span, mapping, intact_bytes as u64)),
                            error,
                        )),
                    };
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::debug!(path = %span.path.display(), %error, "mincore failed: reading with a copy");
                }
            }
        }
        let file = match file {
            Some(file) => file,
            None => self.span_file(&mut span).await.map_err(|e| (None, e))?,
        };
        // Not in the page cache (or not mappable): read through io_uring, which faults nothing
        // on this thread and leaves the pages cached for the next read.
        let BufResult(result, bytes) = read_exact_append(
            file.file(),
            span.position,
            span.size_bytes as usize,
            Vec::new(),
        )
        .await;
        drop(file);
        if let Err(source) = result {
            return Err((
                None,
                LogError::Io {
                    path: span.path.clone(),
                    op: "read",
                    source,
                },
            ));
        }
        let copied = |mut bytes: Vec<u8>, size: usize| {
            bytes.truncate(size);
            VerifiedSpan {
                path: span.path.clone(),
                position: span.position,
                bytes: SpanBytes::Copied(bytes),
            }
        };
        match check_read_entries(&span, &bytes) {
            Ok(()) => {
                let size = bytes.len();
                Ok(copied(bytes, size))
            }
            Err((intact_bytes, error)) => Err((
                (intact_bytes > 0).then(|| copied(bytes, intact_bytes)),
                error,
            )),
        }
    }

    /// The file `span` reads: the active segment's, or a closed segment's through the
    /// closed-file cache.
    async fn span_file(&self, span: &mut ReadSpan) -> Result<SpanFile, LogError> {
        match span.file.take() {
            Some(file) => Ok(SpanFile::Active(file)),
            None => self.closed_segment_file(span).await.map(SpanFile::Closed),
        }
    }

    /// Maps the segment of `span` (at least `end` bytes: its possible size, so that the active
    /// segment's mapping serves it as it grows) and keeps the mapping; `None` (logged) when
    /// mmap fails, and the span is read with a copy.
    fn map_segment(
        &self,
        span: &ReadSpan,
        file: &SpanFile,
        end: u64,
    ) -> Option<Arc<SegmentMapping>> {
        use std::os::fd::AsFd;
        let capacity = self
            .shared
            .config
            .segment_size_max
            .max(u64::from(ENTRY_SIZE_MAX))
            .max(end);
        match SegmentMapping::map(file.file().as_fd(), capacity as usize) {
            Ok(mapping) => {
                let mapping = Arc::new(mapping);
                // A segment retention deleted while this read opened it (below the first
                // offset now) serves this read only: cached, it would keep the deleted file's
                // blocks allocated until evicted (found by review).
                if span.segment_base_offset >= self.first_offset() {
                    self.shared
                        .state
                        .borrow_mut()
                        .mappings
                        .insert(span.segment_base_offset, Arc::clone(&mapping));
                }
                Some(mapping)
            }
            Err(error) => {
                tracing::debug!(path = %span.path.display(), %error, "mmap failed: reading with a copy");
                None
            }
        }
    }
}

fn mapped_span(span: &ReadSpan, mapping: Arc<SegmentMapping>, size: u64) -> VerifiedSpan {
    VerifiedSpan {
        path: span.path.clone(),
        position: span.position,
        bytes: SpanBytes::Mapped { mapping, size },
    }
}

/// Checks entries read back against the index: same offset, count, length, and checksum.
///
/// # Errors
/// The bytes of the intact entries before the first one that fails, with its `Corrupt` error;
/// its reason ends with the offsets the index puts in the damaged entry and the offset a poll
/// can start from to read past it.
fn check_read_entries(span: &ReadSpan, bytes: &[u8]) -> Result<(), (usize, LogError)> {
    let mut at = 0usize;
    for expected in &span.rows {
        let position = span.position + at as u64;
        let end_offset = expected.base_offset + expected.message_count;
        let corrupt = |reason: String| {
            (
                at,
                LogError::Corrupt {
                    path: span.path.clone(),
                    position,
                    reason: format!(
                        "{reason} (the index puts offsets {}-{} in this entry; a poll from \
                         offset {end_offset} reads past it)",
                        expected.base_offset,
                        end_offset.saturating_sub(1),
                    ),
                },
            )
        };
        let entry = &bytes[at..at + expected.size_bytes as usize];
        let header = EntryHeader::decode(entry).ok_or_else(|| corrupt("short entry".to_owned()))?;
        if header.base_offset != expected.base_offset
            || u64::from(header.message_count) != expected.message_count
            || u64::from(header.length) + ENTRY_HEADER_SIZE as u64 != expected.size_bytes
        {
            return Err(corrupt(format!(
                "header (offset {}, {} messages, {} bytes) differs from the index (offset {}, {} \
                 messages, {} bytes)",
                header.base_offset,
                header.message_count,
                u64::from(header.length) + ENTRY_HEADER_SIZE as u64,
                expected.base_offset,
                expected.message_count,
                expected.size_bytes
            )));
        }
        verify::check_entry_payload(&header, &entry[ENTRY_HEADER_SIZE..]).map_err(corrupt)?;
        at += expected.size_bytes as usize;
    }
    Ok(())
}
