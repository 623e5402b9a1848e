//! The state log's names: each domain's stream and subjects, the barrier a
//! linearizable read appends to, and where a node behind the trim asks a
//! peer for a snapshot of the replicated estate.

/// The usage domain's stream: one message per (kind, node, company day,
/// seat or schedule), each the object's whole cumulative value.
pub const USAGE_LOG_STREAM: &str = "CREWLET_USAGE_LOG";
/// Every subject of [`USAGE_LOG_STREAM`].
pub const USAGE_LOG_SUBJECTS: &str = "crewlet.usage.log.>";
/// The prefix every usage object's subject starts with.
pub const USAGE_LOG_PREFIX: &str = "crewlet.usage.log";

/// The subject one usage object rides. The node is part of the subject, so
/// each object has exactly one writer; `key` is one subject token (a hex
/// digest of the object's own fields).
///
/// ```
/// use crewlet_bus::{USAGE_LOG_SUBJECTS, usage_subject};
///
/// let s = usage_subject("tokens", "n1", "2026-12-06", "9f2c");
/// assert_eq!(s, "crewlet.usage.log.tokens.n1.2026-12-06.9f2c");
/// assert!(s.starts_with(USAGE_LOG_SUBJECTS.trim_end_matches('>')));
/// ```
pub fn usage_subject(kind: &str, node: &str, day: &str, key: &str) -> String {
    format!("{USAGE_LOG_PREFIX}.{kind}.{node}.{day}.{key}")
}

/// The subject a linearizable read of a domain whose subjects start with
/// `prefix` appends its barrier record to.
pub fn barrier_subject(prefix: &str) -> String {
    format!("{prefix}.barrier")
}

/// Where a data node behind the trim asks `node` (a peer it picked from
/// the published positions) for a snapshot of the replicated estate (core
/// request/reply; the answer names an object in [`SNAPSHOT_BUCKET`]).
pub fn snapshot_subject(node: &str) -> String {
    format!("crewlet.statelog.snapshot.{node}")
}

/// The object store bucket a donor puts a snapshot in for its asker.
pub const SNAPSHOT_BUCKET: &str = "crewlet_statelog_snapshots";
