//! The state-transfer manifest codec (issue 9 section 2, `storage/FORMAT.md` section 11): what a
//! `StateTransferTarget{available = 1}` carries as its body, one entry per artifact of the offer.
//!
//! Layout (all integers little-endian):
//!
//! | bytes              | field          | meaning                                               |
//! |--------------------|----------------|-------------------------------------------------------|
//! | `0 .. 8`           | `magic`        | `"SLMANIFS"` ([`MANIFEST_MAGIC`])                     |
//! | `8 .. 10`          | `version`      | `u16` = 1 ([`MANIFEST_VERSION`])                      |
//! | `10 .. 12`         | `entry_count`  | `u16`, `1 ..= MANIFEST_ENTRY_COUNT_MAX`               |
//! | `12 .. 14`         | `entry_len`    | `u16` = [`MANIFEST_ENTRY_SIZE`] (40)                  |
//! | `14 .. 16`         | reserved       | zero                                                  |
//! | `16 + 40 i ..`     | entry `i`      | see below                                             |
//! | last 8             | trailer        | XXH3-64 of every byte before it                       |
//!
//! Entry: `kind` `u8` ([`ArtifactKind`] wire value), 7 zero bytes, `frontier_op` `u64`, `len`
//! `u64` (bytes of the artifact, at least 1), `checksum` `u128` (XXH3-128 of the artifact).
//!
//! Decode checks the trailer first ([`storage::codec::split_verified_trailer`]), then reads with
//! the shared [`Reader`] and refuses, each as its own [`ManifestError`] variant: bad magic,
//! unknown version, an entry count of 0 or above [`MANIFEST_ENTRY_COUNT_MAX`], an entry length
//! other than [`MANIFEST_ENTRY_SIZE`], non-zero reserved or padding bytes, an unknown kind, a
//! duplicate kind, a zero length, an artifact above its cap, a total above the total cap,
//! truncated input and trailing bytes.

use storage::codec::{DecodeError, NonZeroByte, Reader, Writer, split_verified_trailer};
use storage::limits::SNAPSHOT_FILE_SIZE_MAX;
use storage::snapshot::SNAPSHOT_FILE_SIZE_MIN;

use super::{ArtifactKind, Manifest, ManifestEntry, client_table_wire};

/// Most entries a manifest holds (one per artifact kind, with room for kinds added later).
pub const MANIFEST_ENTRY_COUNT_MAX: usize = 16;
/// The first 8 bytes of a manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"SLMANIFS";
/// Layout version; any other is refused.
pub const MANIFEST_VERSION: u16 = 1;
/// Bytes before the first entry: magic, version, entry count, entry length, reserved.
pub const MANIFEST_HEADER_SIZE: usize = 16;
/// Bytes of one entry: kind, 7 padding bytes, frontier op, length, checksum.
pub const MANIFEST_ENTRY_SIZE: usize = 40;
/// Zero bytes after an entry's kind.
const ENTRY_PADDING_SIZE: usize = 7;
/// Longest encoded manifest (bytes): header, the most entries, trailer.
pub const MANIFEST_ENCODED_LEN_MAX: usize = MANIFEST_HEADER_SIZE
    + MANIFEST_ENTRY_COUNT_MAX * MANIFEST_ENTRY_SIZE
    + storage::codec::TRAILER_SIZE;
/// Longest metadata artifact (bytes): the metadata is part of a snapshot payload, and no
/// snapshot file exceeds `SNAPSHOT_FILE_SIZE_MAX` (1 GiB) with its 64-byte header and 8-byte
/// trailer, so metadata a checkpoint can hold is never longer. `MetadataState` has no count
/// bounds of its own (streams and topics are bounded only by what a snapshot can hold).
pub const METADATA_ARTIFACT_LEN_MAX: u64 = SNAPSHOT_FILE_SIZE_MAX - SNAPSHOT_FILE_SIZE_MIN as u64;

const _: () = assert!(MANIFEST_ENTRY_SIZE == 1 + ENTRY_PADDING_SIZE + 8 + 8 + 16);
const _: () = assert!(MANIFEST_ENTRY_COUNT_MAX <= u16::MAX as usize);
const _: () = assert!(MANIFEST_ENTRY_COUNT_MAX >= ArtifactKind::ALL.len());

/// The receiver's bounds on what it accepts to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestCaps {
    /// Longest metadata artifact (bytes).
    pub metadata_len_max: u64,
    /// Longest client-table artifact (bytes).
    pub client_table_len_max: u64,
    /// Longest sum of all artifact lengths (bytes).
    pub total_len_max: u64,
}

impl ManifestCaps {
    /// The caps of a receiver whose `--clients-table-max` is `clients_table_max`: metadata
    /// [`METADATA_ARTIFACT_LEN_MAX`], client table
    /// [`client_table_wire::encoded_len_max`]`(clients_table_max)`, total their sum.
    pub fn for_receiver(clients_table_max: usize) -> ManifestCaps {
        let metadata_len_max = METADATA_ARTIFACT_LEN_MAX;
        let client_table_len_max = client_table_wire::encoded_len_max(clients_table_max);
        ManifestCaps {
            metadata_len_max,
            client_table_len_max,
            total_len_max: metadata_len_max.saturating_add(client_table_len_max),
        }
    }

    /// The cap of one artifact kind.
    pub fn len_max(&self, kind: ArtifactKind) -> u64 {
        match kind {
            ArtifactKind::Metadata => self.metadata_len_max,
            ArtifactKind::ClientTable => self.client_table_len_max,
        }
    }

    /// Checks a manifest (decoded by the wire with absolute caps, or built locally) against these
    /// caps and the manifest rules: 1 ..= [`MANIFEST_ENTRY_COUNT_MAX`] entries, each kind at most
    /// once, every length at least 1 and at most its kind's cap, the total at most
    /// `total_len_max` (issue 9 section 2).
    ///
    /// # Errors
    /// The first rule broken, in entry order.
    pub fn check(&self, manifest: &Manifest) -> Result<(), ManifestError> {
        check_entry_count(manifest.entries.len())?;
        let mut total: u64 = 0;
        for (index, entry) in manifest.entries.iter().enumerate() {
            if manifest.entries[..index]
                .iter()
                .any(|e| e.kind == entry.kind)
            {
                return Err(ManifestError::DuplicateKind { kind: entry.kind });
            }
            self.check_entry_len(entry)?;
            total = total.saturating_add(entry.len);
        }
        if total > self.total_len_max {
            return Err(ManifestError::TotalTooLong {
                total,
                total_len_max: self.total_len_max,
            });
        }
        Ok(())
    }

    fn check_entry_len(&self, entry: &ManifestEntry) -> Result<(), ManifestError> {
        if entry.len == 0 {
            return Err(ManifestError::ZeroLength { kind: entry.kind });
        }
        let len_max = self.len_max(entry.kind);
        if entry.len > len_max {
            return Err(ManifestError::ArtifactTooLong {
                kind: entry.kind,
                len: entry.len,
                len_max,
            });
        }
        Ok(())
    }
}

/// Why a manifest was refused (issue 9 section 2). Every variant is a damaged or hostile offer:
/// the receiver drops it and asks again (or another peer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Trailer mismatch, no trailer, truncated input or trailing bytes.
    #[error("manifest: {0}")]
    Decode(#[from] DecodeError),
    #[error("manifest: magic {found:?} is not {MANIFEST_MAGIC:?}")]
    Magic { found: [u8; 8] },
    #[error("manifest: version {found} is not {MANIFEST_VERSION}")]
    Version { found: u16 },
    #[error("manifest: {count} entries, must be 1 to {MANIFEST_ENTRY_COUNT_MAX}")]
    EntryCount { count: usize },
    #[error("manifest: entry length {found} is not {MANIFEST_ENTRY_SIZE}")]
    EntryLength { found: u16 },
    #[error("manifest: reserved or padding byte at {position} is {value:#04x}, must be zero")]
    NonZeroReserved { position: usize, value: u8 },
    #[error("manifest: entry {index} has unknown artifact kind {kind}")]
    UnknownKind { index: usize, kind: u8 },
    #[error("manifest: artifact {} appears twice", kind.name())]
    DuplicateKind { kind: ArtifactKind },
    #[error("manifest: artifact {} has length 0", kind.name())]
    ZeroLength { kind: ArtifactKind },
    #[error("manifest: artifact {} is {len} bytes, above the cap {len_max}", kind.name())]
    ArtifactTooLong {
        kind: ArtifactKind,
        len: u64,
        len_max: u64,
    },
    #[error("manifest: artifacts total {total} bytes, above the cap {total_len_max}")]
    TotalTooLong { total: u64, total_len_max: u64 },
}

impl ManifestError {
    /// The byte position in the encoding the error points at, when one field is to blame.
    pub fn position(&self) -> Option<usize> {
        match self {
            ManifestError::Decode(error) => Some(error.position()),
            ManifestError::Magic { .. } => Some(0),
            ManifestError::Version { .. } => Some(8),
            ManifestError::EntryCount { .. } => Some(10),
            ManifestError::EntryLength { .. } => Some(12),
            ManifestError::NonZeroReserved { position, .. } => Some(*position),
            ManifestError::UnknownKind { index, .. } => {
                Some(MANIFEST_HEADER_SIZE + index * MANIFEST_ENTRY_SIZE)
            }
            ManifestError::DuplicateKind { .. }
            | ManifestError::ZeroLength { .. }
            | ManifestError::ArtifactTooLong { .. }
            | ManifestError::TotalTooLong { .. } => None,
        }
    }
}

fn check_entry_count(count: usize) -> Result<(), ManifestError> {
    if count == 0 || count > MANIFEST_ENTRY_COUNT_MAX {
        return Err(ManifestError::EntryCount { count });
    }
    Ok(())
}

/// Encodes `manifest` (magic, version, count, entry length, entries, trailer; see the module
/// doc). The result is [`MANIFEST_HEADER_SIZE`] + 40 x entries + 8 bytes.
///
/// # Panics
/// If the manifest has more than [`MANIFEST_ENTRY_COUNT_MAX`] entries: a server builds one entry
/// per [`ArtifactKind`], far fewer.
pub fn encode(manifest: &Manifest) -> Vec<u8> {
    let count = manifest.entries.len();
    assert!(
        count <= MANIFEST_ENTRY_COUNT_MAX,
        "manifest of {count} entries, above {MANIFEST_ENTRY_COUNT_MAX}"
    );
    let mut writer = Writer::with_capacity(encoded_len(count));
    writer
        .bytes(&MANIFEST_MAGIC)
        .u16(MANIFEST_VERSION)
        .u16(count as u16)
        .u16(MANIFEST_ENTRY_SIZE as u16)
        .zeros(2);
    for entry in &manifest.entries {
        writer
            .u8(entry.kind as u8)
            .zeros(ENTRY_PADDING_SIZE)
            .u64(entry.frontier_op)
            .u64(entry.len)
            .u128(entry.checksum);
    }
    writer.seal()
}

/// Bytes of the encoding of a manifest of `entry_count` entries.
pub fn encoded_len(entry_count: usize) -> usize {
    MANIFEST_HEADER_SIZE + entry_count * MANIFEST_ENTRY_SIZE + storage::codec::TRAILER_SIZE
}

/// Decodes and checks a manifest against `caps`: the trailer first, then the layout, then
/// [`ManifestCaps::check`].
///
/// # Errors
/// The first rule the bytes break (see [`ManifestError`]). Never panics.
pub fn decode(bytes: &[u8], caps: &ManifestCaps) -> Result<Manifest, ManifestError> {
    let (body, _) = split_verified_trailer(bytes)?;
    let mut reader = Reader::new(body);
    let count = read_header(&mut reader)?;
    let mut entries = Vec::with_capacity(count);
    for index in 0..count {
        entries.push(read_entry(&mut reader, index)?);
    }
    reader.finish()?;
    let manifest = Manifest { entries };
    caps.check(&manifest)?;
    Ok(manifest)
}

/// Reads the 16-byte header; returns the entry count.
fn read_header(reader: &mut Reader<'_>) -> Result<usize, ManifestError> {
    let found = reader.array::<8>("magic")?;
    if found != MANIFEST_MAGIC {
        return Err(ManifestError::Magic { found });
    }
    let version = reader.u16("version")?;
    if version != MANIFEST_VERSION {
        return Err(ManifestError::Version { found: version });
    }
    let count = usize::from(reader.u16("entry_count")?);
    check_entry_count(count)?;
    let entry_len = reader.u16("entry_len")?;
    if usize::from(entry_len) != MANIFEST_ENTRY_SIZE {
        return Err(ManifestError::EntryLength { found: entry_len });
    }
    read_zeros(reader, "reserved", 2)?;
    Ok(count)
}

/// Reads entry `index` (40 bytes).
fn read_entry(reader: &mut Reader<'_>, index: usize) -> Result<ManifestEntry, ManifestError> {
    let kind_value = reader.u8("kind")?;
    read_zeros(reader, "entry padding", ENTRY_PADDING_SIZE)?;
    let kind = ArtifactKind::from_u8(kind_value).ok_or(ManifestError::UnknownKind {
        index,
        kind: kind_value,
    })?;
    Ok(ManifestEntry {
        kind,
        frontier_op: reader.u64("frontier_op")?,
        len: reader.u64("len")?,
        checksum: reader.u128("checksum")?,
    })
}

/// Reads `count` bytes of `field` that must be zero.
fn read_zeros(
    reader: &mut Reader<'_>,
    field: &'static str,
    count: usize,
) -> Result<(), ManifestError> {
    match reader.zeros(field, count)? {
        None => Ok(()),
        Some(NonZeroByte { position, value }) => {
            Err(ManifestError::NonZeroReserved { position, value })
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use storage::codec::{seal, split_verified_trailer};

    use super::*;

    const CAPS: ManifestCaps = ManifestCaps {
        metadata_len_max: 1000,
        client_table_len_max: 2000,
        total_len_max: 2500,
    };

    fn entry(kind: ArtifactKind, len: u64) -> ManifestEntry {
        ManifestEntry {
            kind,
            frontier_op: 64,
            len,
            checksum: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        }
    }

    fn sample() -> Manifest {
        Manifest {
            entries: vec![
                entry(ArtifactKind::Metadata, 900),
                entry(ArtifactKind::ClientTable, 1500),
            ],
        }
    }

    /// Re-seals `bytes` after `edit` changed its body, so the rule under test (not the trailer)
    /// is what refuses it.
    fn edited(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let (body, _) = split_verified_trailer(bytes).expect("sealed");
        let mut body = body.to_vec();
        edit(&mut body);
        seal(&mut body);
        body
    }

    fn sample_edited(edit: impl FnOnce(&mut Vec<u8>)) -> Result<Manifest, ManifestError> {
        decode(&edited(&encode(&sample()), edit), &CAPS)
    }

    #[test]
    fn round_trip_and_layout() {
        let bytes = encode(&sample());
        assert_eq!(bytes.len(), encoded_len(2));
        assert_eq!(&bytes[..8], b"SLMANIFS");
        assert_eq!(&bytes[8..10], &1u16.to_le_bytes());
        assert_eq!(&bytes[10..12], &2u16.to_le_bytes());
        assert_eq!(&bytes[12..14], &40u16.to_le_bytes());
        assert_eq!(bytes[16], ArtifactKind::Metadata as u8);
        assert_eq!(&bytes[24..32], &64u64.to_le_bytes());
        assert_eq!(&bytes[32..40], &900u64.to_le_bytes());
        assert_eq!(bytes[56], ArtifactKind::ClientTable as u8);
        assert_eq!(decode(&bytes, &CAPS), Ok(sample()));
    }

    #[test]
    fn issue9_manifest_trailer_checked_first() {
        let mut bytes = encode(&sample());
        bytes[0] ^= 0xff; // bad magic, but the trailer is what is reported
        assert!(matches!(
            decode(&bytes, &CAPS),
            Err(ManifestError::Decode(DecodeError::TrailerMismatch { .. }))
        ));
        assert!(matches!(
            decode(&bytes[..5], &CAPS),
            Err(ManifestError::Decode(DecodeError::NoTrailer { len: 5 }))
        ));
    }

    #[test]
    fn issue9_manifest_refuses_bad_magic() {
        assert_eq!(
            sample_edited(|body| body[0] = b'X'),
            Err(ManifestError::Magic {
                found: *b"XLMANIFS"
            })
        );
    }

    #[test]
    fn issue9_manifest_refuses_unknown_version() {
        assert_eq!(
            sample_edited(|body| body[8] = 2),
            Err(ManifestError::Version { found: 2 })
        );
    }

    #[test]
    fn issue9_manifest_refuses_entry_count_zero_or_over_max() {
        assert_eq!(
            sample_edited(|body| body[10..12].copy_from_slice(&0u16.to_le_bytes())),
            Err(ManifestError::EntryCount { count: 0 })
        );
        let over = MANIFEST_ENTRY_COUNT_MAX as u16 + 1;
        assert_eq!(
            sample_edited(|body| body[10..12].copy_from_slice(&over.to_le_bytes())),
            Err(ManifestError::EntryCount {
                count: usize::from(over)
            })
        );
        assert_eq!(
            CAPS.check(&Manifest {
                entries: Vec::new()
            }),
            Err(ManifestError::EntryCount { count: 0 })
        );
    }

    #[test]
    fn issue9_manifest_refuses_wrong_entry_length() {
        assert_eq!(
            sample_edited(|body| body[12..14].copy_from_slice(&48u16.to_le_bytes())),
            Err(ManifestError::EntryLength { found: 48 })
        );
    }

    #[test]
    fn issue9_manifest_refuses_nonzero_reserved_and_padding() {
        assert_eq!(
            sample_edited(|body| body[15] = 1),
            Err(ManifestError::NonZeroReserved {
                position: 15,
                value: 1
            })
        );
        assert_eq!(
            sample_edited(|body| body[16 + 40 + 3] = 9),
            Err(ManifestError::NonZeroReserved {
                position: 59,
                value: 9
            })
        );
    }

    #[test]
    fn issue9_manifest_refuses_unknown_kind() {
        assert_eq!(
            sample_edited(|body| body[56] = 3),
            Err(ManifestError::UnknownKind { index: 1, kind: 3 })
        );
        assert_eq!(
            sample_edited(|body| body[16] = 0),
            Err(ManifestError::UnknownKind { index: 0, kind: 0 })
        );
    }

    #[test]
    fn issue9_manifest_refuses_duplicate_kind() {
        assert_eq!(
            sample_edited(|body| body[56] = ArtifactKind::Metadata as u8),
            Err(ManifestError::DuplicateKind {
                kind: ArtifactKind::Metadata
            })
        );
    }

    #[test]
    fn issue9_manifest_refuses_zero_length() {
        let manifest = Manifest {
            entries: vec![entry(ArtifactKind::ClientTable, 0)],
        };
        assert_eq!(
            decode(&encode(&manifest), &CAPS),
            Err(ManifestError::ZeroLength {
                kind: ArtifactKind::ClientTable
            })
        );
    }

    #[test]
    fn issue9_manifest_refuses_artifact_over_its_cap() {
        let manifest = Manifest {
            entries: vec![entry(ArtifactKind::Metadata, 1001)],
        };
        assert_eq!(
            decode(&encode(&manifest), &CAPS),
            Err(ManifestError::ArtifactTooLong {
                kind: ArtifactKind::Metadata,
                len: 1001,
                len_max: 1000
            })
        );
        let at_cap = Manifest {
            entries: vec![entry(ArtifactKind::Metadata, 1000)],
        };
        assert_eq!(decode(&encode(&at_cap), &CAPS), Ok(at_cap));
    }

    #[test]
    fn issue9_manifest_refuses_total_over_cap() {
        let manifest = Manifest {
            entries: vec![
                entry(ArtifactKind::Metadata, 1000),
                entry(ArtifactKind::ClientTable, 1501),
            ],
        };
        assert_eq!(
            decode(&encode(&manifest), &CAPS),
            Err(ManifestError::TotalTooLong {
                total: 2501,
                total_len_max: 2500
            })
        );
    }

    #[test]
    fn issue9_manifest_refuses_truncated() {
        let bytes = edited(&encode(&sample()), |body| body.truncate(body.len() - 1));
        assert!(matches!(
            decode(&bytes, &CAPS),
            Err(ManifestError::Decode(DecodeError::Truncated {
                field: "checksum",
                ..
            }))
        ));
    }

    #[test]
    fn issue9_manifest_refuses_trailing_bytes() {
        assert_eq!(
            sample_edited(|body| body.push(0)),
            Err(ManifestError::Decode(DecodeError::TrailingBytes {
                position: 96,
                count: 1
            }))
        );
    }

    #[test]
    fn issue9_manifest_caps_for_receiver() {
        let caps = ManifestCaps::for_receiver(4096);
        assert_eq!(caps.metadata_len_max, METADATA_ARTIFACT_LEN_MAX);
        assert_eq!(
            caps.client_table_len_max,
            client_table_wire::encoded_len_max(4096)
        );
        assert_eq!(
            caps.total_len_max,
            caps.metadata_len_max + caps.client_table_len_max
        );
        assert!(
            ManifestCaps::for_receiver(8).client_table_len_max < caps.client_table_len_max,
            "the client-table cap follows the receiver's --clients-table-max"
        );
    }

    #[test]
    fn issue9_manifest_check_rechecks_with_tighter_caps() {
        let tight = ManifestCaps {
            client_table_len_max: 1499,
            ..CAPS
        };
        assert_eq!(CAPS.check(&sample()), Ok(()));
        assert_eq!(
            tight.check(&sample()),
            Err(ManifestError::ArtifactTooLong {
                kind: ArtifactKind::ClientTable,
                len: 1500,
                len_max: 1499
            })
        );
    }

    proptest! {
        #![proptest_config(crate::vsr::wire::proptest_config())]

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes, &CAPS);
            let mut sealed = bytes;
            seal(&mut sealed);
            let _ = decode(&sealed, &CAPS);
        }

        #[test]
        fn valid_manifests_round_trip(
            metadata_len in 1u64..=1000,
            client_table_len in 1u64..=1500,
            frontier_op in any::<u64>(),
            checksums in any::<(u128, u128)>(),
            reversed in any::<bool>(),
        ) {
            let mut entries = vec![
                ManifestEntry { kind: ArtifactKind::Metadata, frontier_op, len: metadata_len, checksum: checksums.0 },
                ManifestEntry { kind: ArtifactKind::ClientTable, frontier_op, len: client_table_len, checksum: checksums.1 },
            ];
            if reversed {
                entries.reverse();
            }
            let manifest = Manifest { entries };
            prop_assert_eq!(decode(&encode(&manifest), &CAPS), Ok(manifest));
        }
    }
}
