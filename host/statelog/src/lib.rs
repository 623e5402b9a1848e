//! The replicated estate and the state log it is derived from.
//!
//! A **domain** is a JetStream stream of [`Record`]s, one subject per
//! object, so two writers of one object contend at the broker and writers of
//! different objects never do. Every data node runs an [`applier`] per
//! domain that applies the records in the log's one order into
//! `replicated.sqlite3` ([`Estate`]), committing the rows and its own
//! position in one transaction; a record's operation id goes in the
//! estate's ledger, so a retried write applies once. Nothing else writes
//! the estate (`tests/statelog/only_the_applier_writes.rs` holds it).
//!
//! Each node publishes its position per domain in `positions`
//! ([`PositionBook`]); the trim ([`trim`]) deletes what every counted node
//! has applied, never by a clock; a node whose position fell below the
//! trim adopts a peer's snapshot whole ([`snapshot`]); a backup pins the
//! logs and copies the estate ([`backup`]). A log that diverged
//! from the rows (recreated, restored from an older copy) stops its
//! domain's applier ([`Diverged`]). The first domain is [`usage`].

pub mod applier;
pub mod backup;
mod checkpoint;
mod db;
mod domain;
mod estate;
mod local;
mod positions;
mod record;
pub mod snapshot;
pub mod trim;
pub mod usage;

use async_nats::jetstream;

pub use applier::{Applier, ApplierParts, DomainState, DomainStatus};
pub use domain::{Change, Domain, Writes};
pub use estate::{Cursor, ESTATE_FILE, Estate, Positions};
pub use local::{Diverged, LOCAL_FILE, Local};
pub use positions::{Eviction, PositionBook};
pub use record::{BARRIER_KIND, Incoming, RECORD_VERSION, Record, Undecodable, op_floor};

/// Why the estate or the node's observations file could not be read or
/// written (the node's disk, or a file from a newer build).
#[derive(Debug, thiserror::Error)]
pub enum EstateError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: rusqlite::Error,
    },
    #[error(
        "{path} is at schema {version}, newer than this build knows: run the newer build, or move the file away to have it rebuilt"
    )]
    Newer { path: String, version: i64 },
    #[error("cannot write a snapshot to {path}: {source}")]
    Snapshot {
        path: String,
        source: rusqlite::Error,
    },
    #[error("cannot install the adopted estate at {path}: {source}")]
    Install {
        path: String,
        source: std::io::Error,
    },
    #[error("the estate's database refused: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// Why a record could not be appended to its log (the broker's side).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(
        "the broker did not take the record on {subject}: {reason} (retry; the operation id makes a retry apply once)"
    )]
    Broker { subject: String, reason: String },
}

/// Appends `record` on `subject` and waits for the stream's ack; answers
/// the record's position. The operation id is the message id too, so the
/// stream's duplicate window drops a retry before the ledger has to.
pub async fn append(
    js: &jetstream::Context,
    subject: &str,
    record: &Record,
) -> Result<u64, PublishError> {
    let broker = |reason: String| PublishError::Broker {
        subject: subject.to_owned(),
        reason,
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(crewlet_bus::MSG_ID_HEADER, record.op.as_str());
    let ack = js
        .publish_with_headers(subject.to_owned(), headers, record.to_bytes().into())
        .await
        .map_err(|e| broker(e.to_string()))?
        .await
        .map_err(|e| broker(e.to_string()))?;
    Ok(ack.sequence)
}

/// Creates `domain`'s stream, or adopts it as it stands.
pub async fn ensure_stream(
    js: &jetstream::Context,
    domain: &dyn Domain,
    replicas: usize,
) -> Result<jetstream::stream::Stream, PublishError> {
    let config = jetstream::stream::Config {
        name: domain.stream().to_owned(),
        subjects: vec![format!("{}.>", domain.prefix())],
        max_messages_per_subject: if domain.compacted() { 1 } else { -1 },
        max_age: domain.max_age().unwrap_or_default(),
        num_replicas: replicas.max(1),
        ..Default::default()
    };
    js.get_or_create_stream(config)
        .await
        .map_err(|e| PublishError::Broker {
            subject: domain.prefix().to_owned(),
            reason: format!("cannot open stream {}: {e}", domain.stream()),
        })
}
