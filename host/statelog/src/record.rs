//! A state-log record: an operation id, a kind and the kind's body, under a
//! format version. A record this build cannot read (a newer version, an
//! unknown kind, a body of the wrong shape) is `Undecodable` — kept and
//! counted by the applier, never applied half.
//!
//! Written as a [`Record`]; read as an [`Incoming`]: its head decoded, its
//! body read straight into the domain's own type when the domain applies
//! it. Why: a body read as a JSON tree first was a dozen allocations per
//! record, made on the reader's thread and freed on the committer's — a
//! fifth of what the applier spent (BENCHMARKS.md, "The replicated
//! estate").

use std::borrow::Cow;

use bytes::Bytes;
use compact_str::CompactString;
use serde::de::DeserializeOwned;
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
    /// The operation id, a UUIDv7 (time first, so ids sort by when they
    /// were made): a retried write carries the same one, and the operation
    /// ledger applies it once, and ages it out by the time in it.
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
}

/// The least operation id made at or after `ms` (Unix milliseconds): the
/// ledger's age-out deletes the ids below it. A UUIDv7 starts with its
/// 48-bit millisecond time, so byte order is time order.
///
/// ```
/// use crewlet_statelog::{Record, op_floor};
/// let op: uuid::Uuid = Record::new("tokens", serde_json::Value::Null).op.parse().unwrap();
/// let now = std::time::SystemTime::now()
///     .duration_since(std::time::UNIX_EPOCH)
///     .unwrap()
///     .as_millis() as i64;
/// assert!(op_floor(now - 1_000) < op);
/// assert!(op < op_floor(now + 1_000));
/// ```
pub fn op_floor(ms: i64) -> uuid::Uuid {
    let ms = (ms.max(0) as u64 & 0xffff_ffff_ffff).to_be_bytes();
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms[2..]);
    uuid::Uuid::from_bytes(bytes)
}

/// A record as read off the log: the head decoded, the body left in the
/// payload until [`Incoming::body`] reads it as the domain's type.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub v: u32,
    /// The operation id, read as the UUID it must be (the ledger keeps its
    /// 16 bytes).
    pub op: uuid::Uuid,
    pub kind: CompactString,
    payload: Bytes,
}

/// The head alone: serde skips the body unread (`Incoming::body` reads it).
#[derive(Deserialize)]
struct Head<'a> {
    v: u32,
    #[serde(borrow)]
    op: Cow<'a, str>,
    kind: CompactString,
}

#[derive(Deserialize)]
struct Body<T> {
    body: T,
}

impl Incoming {
    /// Reads a record's head off the log; `Err` says why this build cannot.
    pub fn decode(payload: Bytes) -> Result<Incoming, Undecodable> {
        let head: Head = serde_json::from_slice(&payload)
            .map_err(|e| Undecodable(format!("not a state-log record: {e}")))?;
        if head.v > RECORD_VERSION {
            return Err(Undecodable(format!(
                "record format {} is newer than this build's {RECORD_VERSION}: upgrade this node",
                head.v
            )));
        }
        if head.op.is_empty() {
            return Err(Undecodable("record has no operation id".into()));
        }
        let op = uuid::Uuid::try_parse(&head.op).map_err(|e| {
            Undecodable(format!(
                "the record's operation id `{}` is not a UUID ({e}); records are written with UUIDv7 ids",
                head.op
            ))
        })?;
        Ok(Incoming {
            v: head.v,
            op,
            kind: head.kind,
            payload,
        })
    }

    /// The body, read as `T`; `Err` when it has another shape.
    pub fn body<T: DeserializeOwned>(&self) -> Result<T, Undecodable> {
        serde_json::from_slice::<Body<T>>(&self.payload)
            .map(|b| b.body)
            .map_err(|e| Undecodable(format!("a `{}` record of another shape: {e}", self.kind)))
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
        let read = Incoming::decode(ok.to_bytes().into()).unwrap();
        assert_eq!(
            (read.v, read.op.to_string(), read.kind.as_str()),
            (1, ok.op.clone(), "tokens")
        );
        assert_eq!(read.body::<Value>().unwrap(), ok.body);
        let decode = |b: &'static [u8]| Incoming::decode(Bytes::from_static(b));
        let newer = br#"{"v":2,"op":"x","kind":"tokens","body":{}}"#;
        assert!(decode(newer).unwrap_err().0.contains("newer"));
        assert!(decode(b"\xff\x00").is_err());
        let no_op = br#"{"v":1,"op":"","kind":"tokens"}"#;
        assert!(decode(no_op).is_err());
        let not_a_uuid = br#"{"v":1,"op":"op-7","kind":"tokens","body":{}}"#;
        assert!(
            decode(not_a_uuid)
                .unwrap_err()
                .0
                .contains("`op-7` is not a UUID")
        );
        // An id with an escape in it is read all the same (and refused).
        let escaped = br#"{"v":1,"op":"op\u002d7","kind":"tokens","body":{}}"#;
        assert!(
            decode(escaped)
                .unwrap_err()
                .0
                .contains("`op-7` is not a UUID")
        );
    }

    #[test]
    fn a_body_of_another_shape_is_undecodable_and_names_the_kind() {
        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        struct Tokens {
            calls: u64,
        }
        let wrong = Record::new("tokens", serde_json::json!({"calls": "many"}));
        let read = Incoming::decode(wrong.to_bytes().into()).unwrap();
        let e = read.body::<Tokens>().unwrap_err();
        assert!(e.0.contains("a `tokens` record of another shape"), "{e}");
        let right = Record::new("tokens", serde_json::json!({"calls": 3, "more": true}));
        let read = Incoming::decode(right.to_bytes().into()).unwrap();
        assert_eq!(read.body::<Tokens>().unwrap().calls, 3);
    }
}
