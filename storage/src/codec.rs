//! The one little-endian reader and trailer check every binary decoder of shardline's transfer
//! and snapshot formats uses (issue 9 section 2): the state-transfer manifest, the client table's
//! transfer encoding and the snapshot envelope (`FORMAT.md` sections 9 and 11).
//!
//! Rules: every read is bounds-checked and returns an error naming the field, never panics;
//! a trailer (XXH3-64 of every byte before it, little-endian) is verified before any other byte
//! of the input is parsed ([`split_verified_trailer`]), so a decoder never acts on damaged bytes.

/// Bytes of an XXH3-64 trailer.
pub const TRAILER_SIZE: usize = 8;

/// Why bytes did not decode. Every variant names the field or position, so a caller can report
/// the exact damage with the file or message it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A read of `field` needed `needed` bytes at byte `position`; only `remaining` were left.
    #[error("{field}: needs {needed} bytes at byte {position}, {remaining} left")]
    Truncated {
        field: &'static str,
        position: usize,
        needed: usize,
        remaining: usize,
    },
    /// The input is shorter than its trailer.
    #[error("{len} bytes is shorter than the {TRAILER_SIZE}-byte trailer")]
    NoTrailer { len: usize },
    /// The trailer at `position` is not XXH3-64 of the bytes before it.
    #[error(
        "checksum mismatch: trailer at byte {position} holds {stored:#018x}, bytes 0..{position} \
         hash to {computed:#018x}"
    )]
    TrailerMismatch {
        position: usize,
        stored: u64,
        computed: u64,
    },
    /// Bytes left over after the last field.
    #[error("{count} trailing bytes after the last field (at byte {position})")]
    TrailingBytes { position: usize, count: usize },
}

impl DecodeError {
    /// The byte position the error points at (for `NoTrailer`, 0).
    pub fn position(&self) -> usize {
        match *self {
            DecodeError::Truncated { position, .. }
            | DecodeError::TrailerMismatch { position, .. }
            | DecodeError::TrailingBytes { position, .. } => position,
            DecodeError::NoTrailer { .. } => 0,
        }
    }
}

/// A byte that should have been zero (reserved field, padding), as [`Reader::zeros`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonZeroByte {
    /// Its byte position in the input.
    pub position: usize,
    pub value: u8,
}

/// A bounds-checked little-endian cursor over a byte slice.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, position: 0 }
    }

    /// Bytes read so far (the position of the next read).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    /// The next `len` bytes of `field`.
    ///
    /// # Errors
    /// `Truncated` if fewer than `len` bytes are left (nothing is consumed then).
    pub fn bytes(&mut self, field: &'static str, len: usize) -> Result<&'a [u8], DecodeError> {
        if len > self.remaining() {
            return Err(DecodeError::Truncated {
                field,
                position: self.position,
                needed: len,
                remaining: self.remaining(),
            });
        }
        let taken = &self.bytes[self.position..self.position + len];
        self.position += len;
        Ok(taken)
    }

    /// The next `N` bytes as an array.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.bytes(field, N)?);
        Ok(array)
    }

    /// # Errors
    /// `Truncated`.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// # Errors
    /// `Truncated`.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    /// # Errors
    /// `Truncated`.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// # Errors
    /// `Truncated`.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// # Errors
    /// `Truncated`.
    pub fn u128(&mut self, field: &'static str) -> Result<u128, DecodeError> {
        Ok(u128::from_le_bytes(self.array(field)?))
    }

    /// Reads `count` bytes of `field` that must be zero (reserved fields, padding) and returns
    /// the first that is not, if any, for the caller to refuse with its own error.
    ///
    /// # Errors
    /// `Truncated`.
    pub fn zeros(
        &mut self,
        field: &'static str,
        count: usize,
    ) -> Result<Option<NonZeroByte>, DecodeError> {
        let start = self.position;
        let bytes = self.bytes(field, count)?;
        Ok(bytes
            .iter()
            .position(|&byte| byte != 0)
            .map(|offset| NonZeroByte {
                position: start + offset,
                value: bytes[offset],
            }))
    }

    /// Checks that every byte was read.
    ///
    /// # Errors
    /// `TrailingBytes` naming how many are left.
    pub fn finish(&self) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes {
                position: self.position,
                count,
            }),
        }
    }
}

/// The encoders' counterpart of [`Reader`]: appends little-endian fields to a buffer, then
/// [`Writer::seal`] appends the trailer. Writing cannot fail.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Writer {
        Writer {
            bytes: Vec::with_capacity(capacity),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Writer {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// `count` zero bytes (reserved fields, padding).
    pub fn zeros(&mut self, count: usize) -> &mut Writer {
        self.bytes.resize(self.bytes.len() + count, 0);
        self
    }

    pub fn u8(&mut self, value: u8) -> &mut Writer {
        self.bytes(&[value])
    }

    pub fn u16(&mut self, value: u16) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u32(&mut self, value: u32) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u64(&mut self, value: u64) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    pub fn u128(&mut self, value: u128) -> &mut Writer {
        self.bytes(&value.to_le_bytes())
    }

    /// The bytes written, followed by their XXH3-64 trailer ([`seal`]).
    pub fn seal(mut self) -> Vec<u8> {
        seal(&mut self.bytes);
        self.bytes
    }
}

/// XXH3-64 (seed 0) of `bytes`: the trailer value.
pub fn trailer_of(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// Appends the XXH3-64 trailer of everything in `bytes`.
pub fn seal(bytes: &mut Vec<u8>) {
    let trailer = trailer_of(bytes);
    bytes.extend_from_slice(&trailer.to_le_bytes());
}

/// Splits `bytes` into the body and its trailer after checking the trailer: XXH3-64 of the body,
/// little-endian, in the last [`TRAILER_SIZE`] bytes. Returns the body and the trailer value.
///
/// # Errors
/// `NoTrailer` (shorter than the trailer), `TrailerMismatch` (damaged or torn).
pub fn split_verified_trailer(bytes: &[u8]) -> Result<(&[u8], u64), DecodeError> {
    if bytes.len() < TRAILER_SIZE {
        return Err(DecodeError::NoTrailer { len: bytes.len() });
    }
    let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_SIZE);
    let stored = u64::from_le_bytes(trailer.try_into().expect("split at TRAILER_SIZE"));
    let computed = trailer_of(body);
    if stored != computed {
        return Err(DecodeError::TrailerMismatch {
            position: body.len(),
            stored,
            computed,
        });
    }
    Ok((body, stored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_refuses_short_input_without_consuming() {
        let mut bytes = vec![7u8];
        bytes.extend_from_slice(&0x0102u16.to_le_bytes());
        bytes.extend_from_slice(&0x0304_0506u32.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        bytes.extend_from_slice(&(u128::MAX - 1).to_le_bytes());
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.u8("a"), Ok(7));
        assert_eq!(reader.u16("b"), Ok(0x0102));
        assert_eq!(reader.u32("c"), Ok(0x0304_0506));
        assert_eq!(reader.u64("d"), Ok(u64::MAX));
        assert_eq!(reader.u128("e"), Ok(u128::MAX - 1));
        assert_eq!(reader.finish(), Ok(()));
        assert_eq!(
            reader.u32("f"),
            Err(DecodeError::Truncated {
                field: "f",
                position: 31,
                needed: 4,
                remaining: 0
            })
        );
        let mut short = Reader::new(&bytes[..3]);
        assert!(short.u64("g").is_err());
        assert_eq!(short.position(), 0, "a failed read consumes nothing");
        assert_eq!(short.bytes("h", 3), Ok(&bytes[..3]));
    }

    #[test]
    fn writer_output_reads_back_and_verifies() {
        let mut writer = Writer::with_capacity(64);
        writer
            .u8(7)
            .u16(0x0102)
            .zeros(1)
            .u32(3)
            .u64(u64::MAX)
            .u128(5)
            .bytes(b"ab");
        assert_eq!(writer.len(), 1 + 2 + 1 + 4 + 8 + 16 + 2);
        let sealed = writer.seal();
        let (body, _) = split_verified_trailer(&sealed).expect("sealed");
        let mut reader = Reader::new(body);
        assert_eq!(reader.u8("a"), Ok(7));
        assert_eq!(reader.u16("b"), Ok(0x0102));
        assert_eq!(reader.zeros("pad", 1), Ok(None));
        assert_eq!(reader.u32("c"), Ok(3));
        assert_eq!(reader.u64("d"), Ok(u64::MAX));
        assert_eq!(reader.u128("e"), Ok(5));
        assert_eq!(reader.bytes("f", 2), Ok(&b"ab"[..]));
        assert_eq!(reader.finish(), Ok(()));
    }

    #[test]
    fn zeros_names_the_first_non_zero_byte() {
        let mut reader = Reader::new(&[9, 0, 0, 5, 6]);
        assert_eq!(reader.u8("a"), Ok(9));
        assert_eq!(
            reader.zeros("pad", 4),
            Ok(Some(NonZeroByte {
                position: 3,
                value: 5
            }))
        );
        assert!(Reader::new(&[0]).zeros("pad", 2).is_err());
    }

    #[test]
    fn trailing_bytes_are_named() {
        let reader = Reader::new(&[1, 2, 3]);
        assert_eq!(
            reader.finish(),
            Err(DecodeError::TrailingBytes {
                position: 0,
                count: 3
            })
        );
    }

    #[test]
    fn trailer_is_checked_before_anything_else() {
        let mut bytes = b"payload".to_vec();
        seal(&mut bytes);
        let (body, trailer) = split_verified_trailer(&bytes).expect("sealed");
        assert_eq!(body, b"payload");
        assert_eq!(trailer, trailer_of(b"payload"));
        for index in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x10;
            assert!(
                matches!(
                    split_verified_trailer(&damaged),
                    Err(DecodeError::TrailerMismatch { position: 7, .. })
                ),
                "flip at byte {index}"
            );
        }
        assert_eq!(
            split_verified_trailer(&[1, 2, 3]),
            Err(DecodeError::NoTrailer { len: 3 })
        );
        let mut empty = Vec::new();
        seal(&mut empty);
        assert_eq!(split_verified_trailer(&empty).map(|(b, _)| b.len()), Ok(0));
    }
}
