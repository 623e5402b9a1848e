//! A state-log record: an operation id, a kind and the kind's body, under a
//! format version. A record this build cannot read (a newer version, an
//! unknown kind, a body of the wrong shape) is `Undecodable` — kept and
//! counted by the applier, never applied half.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The newest record format this build reads and the one it writes.
pub const RECORD_VERSION: u32 = 1;

/// The record a barrier append carries (a linearizable read).
pub const BARRIER_KIND: &str = "barrier";

/// One record on a domain's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The format version the writer used.
    pub v: u32,
    /// The operation id: a retried write carries the same one, and the
    /// operation ledger applies it once.
    pub op: String,
    /// What the body is (the domain's own vocabulary).
    pub kind: String,
    #[serde(default)]
    pub body: Value,
}

impl Record {
    /// A record of this build's format with a fresh operation id.
    pub fn new(kind: &str, body: Value) -> Record {
        Record {
            v: RECORD_VERSION,
            op: uuid::Uuid::now_v7().to_string(),
            kind: kind.to_owned(),
            body,
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a record off the log; `Err` says why this build cannot.
    pub fn decode(bytes: &[u8]) -> Result<Record, Undecodable> {
        let record: Record = serde_json::from_slice(bytes)
            .map_err(|e| Undecodable(format!("not a state-log record: {e}")))?;
        if record.v > RECORD_VERSION {
            return Err(Undecodable(format!(
                "record format {} is newer than this build's {RECORD_VERSION}: upgrade this node",
                record.v
            )));
        }
        if record.op.is_empty() {
            return Err(Undecodable("record has no operation id".into()));
        }
        Ok(record)
    }
}

/// Why a record cannot be applied by this build (kept, counted in
/// `statelog_ops_lost`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Undecodable(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_format_or_a_foreign_payload_is_undecodable() {
        let ok = Record::new("tokens", serde_json::json!({"a": 1}));
        assert_eq!(Record::decode(&ok.to_bytes()).unwrap(), ok);
        let newer = br#"{"v":2,"op":"x","kind":"tokens","body":{}}"#;
        assert!(Record::decode(newer).unwrap_err().0.contains("newer"));
        assert!(Record::decode(b"\xff\x00").is_err());
        let no_op = br#"{"v":1,"op":"","kind":"tokens"}"#;
        assert!(Record::decode(no_op).is_err());
    }
}
