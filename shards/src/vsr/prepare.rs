//! The body of a metadata prepare as the journal stores it (`storage/FORMAT.md` section 8.1):
//! which client asked, its request number, and the operation. JSON, so `shardline inspect wal`
//! can show it and a later version can add fields.
//!
//! Decoding is strict (unknown fields refuse): a body this build cannot read must stop boot,
//! never be skipped.

use crate::metadata::MetadataOp;

/// What one prepare does when it commits.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum PrepareOperation {
    /// Open (or restart) the session of the prepare's client.
    Register,
    /// A change of the metadata state machine.
    Metadata(MetadataOp),
}

/// One prepare body.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareBody {
    /// Client id, `0x`-prefixed hex (u128 does not fit a JSON number readers agree on).
    pub client: String,
    /// The client's request number (0 for Register).
    pub request: u64,
    /// Wall-clock time the primary prepared it, microseconds since the Unix epoch.
    pub timestamp_us: u64,
    pub operation: PrepareOperation,
    /// The checksum of the prepare at the op below (its journal record header checksum),
    /// `0x`-prefixed hex: the chain a backup checks to detect a gap or a fork (issue 8 section
    /// 2). Absent in records written before prepares were chained (single replica, view 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

impl PrepareBody {
    /// A body stamped with `timestamp_us` (the caller's clock: the core never reads one) and
    /// chained to `parent` (the checksum of the prepare below; 0 for op 1).
    pub fn new(
        client: u128,
        request: u64,
        operation: PrepareOperation,
        timestamp_us: u64,
        parent: u128,
    ) -> PrepareBody {
        PrepareBody {
            client: format!("{client:#034x}"),
            request,
            timestamp_us,
            operation,
            parent: Some(format!("{parent:#034x}")),
        }
    }

    /// The parent checksum, 0 when the record predates chaining.
    ///
    /// # Errors
    /// The field is present but not `0x`-prefixed hex of a u128.
    pub fn parent_checksum(&self) -> Result<u128, String> {
        match &self.parent {
            None => Ok(0),
            Some(text) => text
                .strip_prefix("0x")
                .and_then(|hex| u128::from_str_radix(hex, 16).ok())
                .ok_or_else(|| format!("parent {text:?} is not 0x-prefixed hex")),
        }
    }

    /// The client id as a number.
    ///
    /// # Errors
    /// The id is not `0x`-prefixed hex of a non-zero u128.
    pub fn client_id(&self) -> Result<u128, String> {
        self.client
            .strip_prefix("0x")
            .and_then(|hex| u128::from_str_radix(hex, 16).ok())
            .filter(|&id| id != 0)
            .ok_or_else(|| {
                format!(
                    "client id {:?} is not 0x-prefixed non-zero hex",
                    self.client
                )
            })
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("prepare body serializes: plain data")
    }

    /// # Errors
    /// The bytes are not a prepare body of this version (the serde message).
    pub fn decode(bytes: &[u8]) -> Result<PrepareBody, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_unknown_fields() {
        let body = PrepareBody::new(
            u128::MAX,
            3,
            PrepareOperation::Metadata(MetadataOp::CreateStream {
                stream_id: 1,
                name: "orders".to_owned(),
            }),
            7,
            0xfeed,
        );
        let decoded = PrepareBody::decode(&body.encode()).unwrap();
        assert_eq!(decoded, body);
        assert_eq!(decoded.client_id().unwrap(), u128::MAX);
        let register = PrepareBody::new(5, 0, PrepareOperation::Register, 0, 0);
        assert_eq!(PrepareBody::decode(&register.encode()).unwrap(), register);
        assert_eq!(decoded.parent_checksum().unwrap(), 0xfeed);
        // A record written before chaining has no parent: "unknown", read as 0.
        let legacy = PrepareBody::decode(
            br#"{"client":"0x5","request":0,"timestamp_us":0,"operation":"Register"}"#,
        )
        .unwrap();
        assert_eq!(legacy.parent_checksum().unwrap(), 0);
        let error = PrepareBody::decode(
            br#"{"client":"0x5","request":0,"timestamp_us":0,"operation":"Register","x":1}"#,
        )
        .unwrap_err();
        assert!(error.contains("unknown field"), "{error}");
        // Nested too: a field a newer build added must not be dropped silently.
        let error = PrepareBody::decode(
            br#"{"client":"0x5","request":1,"timestamp_us":0,"operation":{"Metadata":{"CreateStream":{"stream_id":1,"name":"a","retention":7}}}}"#,
        )
        .unwrap_err();
        assert!(error.contains("unknown field"), "{error}");
        let zero = PrepareBody {
            client: "0x0".to_owned(),
            ..register
        };
        assert!(zero.client_id().is_err());
    }
}
