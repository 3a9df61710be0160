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
}

impl PrepareBody {
    pub fn new(client: u128, request: u64, operation: PrepareOperation) -> PrepareBody {
        let timestamp_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| {
                u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
            });
        PrepareBody {
            client: format!("{client:#034x}"),
            request,
            timestamp_us,
            operation,
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
        );
        let decoded = PrepareBody::decode(&body.encode()).unwrap();
        assert_eq!(decoded, body);
        assert_eq!(decoded.client_id().unwrap(), u128::MAX);
        let register = PrepareBody::new(5, 0, PrepareOperation::Register);
        assert_eq!(PrepareBody::decode(&register.encode()).unwrap(), register);
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
