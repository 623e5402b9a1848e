//! A seat's memory follows the seat.
//!
//! Rule: every memory row a node writes to its own store is also published
//! to `CREWLET_MEMORY` on `crewlet.memory.HANDLE.TABLE.DIGEST` — one subject
//! per row, a stream keeping one message per subject and no age, so the
//! stream is a keyed table of every seat's newest rows. A node that
//! acquires a seat replays that seat's rows in one pass and applies them to
//! its own store before the seat's mailbox is attached ([`Memory::hydrate`]),
//! and while it holds the seat applies the rows other nodes write as they
//! come ([`Tail`]).
//! Deletes do not travel: the lifecycle re-converges, and a tombstone
//! protocol would be a second thing to keep correct for ever.
//!
//! Why here: seats decide *when* a seat may take work and turns write what
//! a seat said; neither learns how rows ride the broker. A memory table
//! registers how its rows are keyed, encoded and applied ([`Table`]);
//! conversation sessions ([`Sessions`]) are the first; the diary
//! ([`Diary`]), episodes ([`Episodes`]), counterparty profiles
//! ([`Profiles`]) and onboarding markers ([`Onboarding`]) ride the same
//! stream and the same pass.
//!
//! Three-valued: a hydration that cannot read the stream answers
//! [`MemoryError::Unreadable`] — never "no rows", which would attach a seat
//! that forgot what it said. A row that can never apply (a table this build
//! does not know, bytes it cannot decode) is skipped and counted, not an
//! outage.

/// A memory table over one table of the node's store: `$row` carried as
/// JSON, keyed within its seat by `$key`, written back by the store's
/// `$apply` (each store table's own newer-wins rule).
macro_rules! store_table {
    ($(#[$doc:meta])* $name:ident: $row:ty, $table:literal, |$r:ident| $key:expr, $apply:ident) => {
        $(#[$doc])*
        pub struct $name(pub std::sync::Arc<crewlet_store::Store>);

        impl crate::Table for $name {
            type Row = $row;
            const NAME: &'static str = $table;

            fn seat(row: &$row) -> &str {
                &row.seat
            }

            fn key($r: &$row) -> String {
                $key
            }

            fn encode(row: &$row) -> Result<Vec<u8>, String> {
                serde_json::to_vec(row).map_err(|e| e.to_string())
            }

            fn decode(bytes: &[u8]) -> Result<$row, String> {
                serde_json::from_slice(bytes).map_err(|e| e.to_string())
            }

            fn apply(&self, rows: Vec<$row>) -> Result<Vec<crate::Applied>, String> {
                crate::tables::applied(self.0.$apply(&rows))
            }
        }
    };
}

mod courier;
mod every;
mod hydrate;
mod sessions;
mod skills;
mod tables;
mod tail;
mod view;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_nats::jetstream;
use bytes::Bytes;
use crewlet_bus::{MEMORY_STREAM, memory_subject};
use sha2::{Digest, Sha256};

pub use courier::Changelog;
pub use every::memory_tables;
pub use hydrate::Hydrated;
pub use sessions::Sessions;
pub use skills::{ReflectionMarks, SkillVersions, Skills};
pub use tables::{Diary, Episodes, Onboarding, Profiles};
pub use tail::Tail;
pub use view::{ViewError, view};

/// What applying a replayed row did to this node's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Written: new here, or newer than this node's.
    Written,
    /// This node's row was newer and was kept.
    KeptLocal,
}

/// One table of a seat's memory: how its rows are keyed, encoded and
/// applied to the node's store.
pub trait Table: Send + Sync + 'static {
    /// A row of the table.
    type Row: Send;
    /// The `TABLE` subject token: lower-case letters, digits and `_`.
    const NAME: &'static str;
    /// The seat (handle) the row belongs to.
    fn seat(row: &Self::Row) -> &str;
    /// The row's key within its seat; digested into the subject, so one
    /// key is one message of the stream.
    fn key(row: &Self::Row) -> String;
    /// The row's bytes on the stream.
    fn encode(row: &Self::Row) -> Result<Vec<u8>, String>;
    /// A row back from its bytes.
    fn decode(bytes: &[u8]) -> Result<Self::Row, String>;
    /// Writes replayed rows (one batch of the pass, in stream order) into
    /// this node's store, in one transaction; answers per row, in order.
    fn apply(&self, rows: Vec<Self::Row>) -> Result<Vec<Applied>, String>;
}

/// What one batch of a replay did.
#[derive(Debug, Default)]
struct Replayed {
    written: u64,
    kept_local: u64,
    /// Bytes that are not a row of the table, with why (the first few).
    undecodable: Vec<String>,
    skipped: u64,
}

/// A registered table as the replay sees it: bytes in, applied or not; an
/// error is the store's refusal.
trait Replay: Send + Sync {
    fn replay(&self, batch: &[Bytes]) -> Result<Replayed, String>;
}

impl<T: Table> Replay for T {
    fn replay(&self, batch: &[Bytes]) -> Result<Replayed, String> {
        let mut out = Replayed::default();
        let mut rows = Vec::with_capacity(batch.len());
        for bytes in batch {
            match T::decode(bytes) {
                Ok(row) => rows.push(row),
                Err(why) => {
                    out.skipped += 1;
                    if out.undecodable.len() < 3 {
                        out.undecodable.push(why);
                    }
                }
            }
        }
        for applied in self.apply(rows)? {
            match applied {
                Applied::Written => out.written += 1,
                Applied::KeptLocal => out.kept_local += 1,
            }
        }
        Ok(out)
    }
}

/// What went wrong with a seat's memory, and whose it is to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error(
        "the memory row {table} {key:?} of seat {seat} is {bytes} bytes, past the memory stream's {limit}-byte limit: it stays in this node's store and does not follow the seat to another node; keep the row smaller (a bug in whatever wrote it) or raise {MEMORY_STREAM}'s max_msg_size"
    )]
    TooLarge {
        seat: String,
        table: &'static str,
        key: String,
        bytes: usize,
        limit: usize,
    },
    #[error(
        "seat handle {seat:?} is not one subject token (no '.', '*', '>' or whitespace); the company validates handles, so this is a bug in the caller"
    )]
    BadHandle { seat: String },
    #[error("cannot encode the memory row {table} of seat {seat}: {detail} (a bug in the table)")]
    Unencodable {
        seat: String,
        table: &'static str,
        detail: String,
    },
    #[error(
        "the memory stream did not take the row {table} of seat {seat}: {detail}; the row stays in this node's store and is published again with the next write of its key"
    )]
    Unpublished {
        seat: String,
        table: &'static str,
        detail: String,
    },
    #[error(
        "cannot read seat {seat}'s memory from {MEMORY_STREAM}: {detail}; the seat is not given work until its memory is read (is the broker up and the stream there?)"
    )]
    Unreadable { seat: String, detail: String },
    #[error(
        "this node's store refused seat {seat}'s memory row ({table}): {detail}; the seat is not given work until its memory is applied (check the data dir's disk)"
    )]
    StoreRefused {
        seat: String,
        table: String,
        detail: String,
    },
    #[error(
        "cannot open the memory stream {MEMORY_STREAM}: {detail}; the node makes it at start, so the broker went away since (is it up?)"
    )]
    Unopened { detail: String },
    #[error(
        "the memory changelog is closed (the node is stopping); the row stays in this node's store"
    )]
    Closed,
}

/// A row ready for the stream: its subject and bytes.
#[derive(Debug, Clone)]
pub struct Encoded {
    pub seat: String,
    pub table: &'static str,
    pub subject: String,
    pub payload: Bytes,
}

/// The memory stream as one node reads and writes it, with the tables it
/// knows.
#[derive(Clone)]
pub struct Memory {
    js: jetstream::Context,
    tables: Arc<BTreeMap<&'static str, Arc<dyn Replay>>>,
    limit: usize,
    /// Unique to this opening: stamped on every row it publishes
    /// ([`ORIGIN_HEADER`]), so its own tail knows the rows already in its
    /// store and does not write them again.
    origin: Arc<str>,
}

/// The header naming which opening of the memory stream published a row.
pub const ORIGIN_HEADER: &str = "Crewlet-Memory-Origin";

impl Memory {
    /// The memory stream on `js` (made at start by the node's streams),
    /// its row limit read once: the smaller of the stream's `max_msg_size`
    /// and the server's payload limit.
    pub async fn open(js: jetstream::Context) -> Result<Memory, MemoryError> {
        let stream = js
            .get_stream(MEMORY_STREAM)
            .await
            .map_err(|e| MemoryError::Unopened {
                detail: e.to_string(),
            })?;
        let configured = stream.cached_info().config.max_message_size;
        let payload = js.client().server_info().max_payload;
        let limit = match usize::try_from(configured) {
            Ok(n) if n > 0 => n.min(payload),
            _ => payload,
        };
        let origin = js.client().new_inbox().into();
        Ok(Memory {
            js,
            tables: Arc::new(BTreeMap::new()),
            limit,
            origin,
        })
    }

    /// Registers `table`: its rows are replayed into it.
    pub fn with<T: Table>(mut self, table: T) -> Memory {
        Arc::make_mut(&mut self.tables).insert(T::NAME, Arc::new(table));
        self
    }

    /// The largest row the stream takes, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// `row` as the stream would carry it; refused when too large.
    pub fn encode<T: Table>(&self, row: &T::Row) -> Result<Encoded, MemoryError> {
        let seat = T::seat(row);
        if !is_token(seat) {
            return Err(MemoryError::BadHandle { seat: seat.into() });
        }
        let bytes = T::encode(row).map_err(|detail| MemoryError::Unencodable {
            seat: seat.into(),
            table: T::NAME,
            detail,
        })?;
        if bytes.len() > self.limit {
            return Err(MemoryError::TooLarge {
                seat: seat.into(),
                table: T::NAME,
                key: T::key(row),
                bytes: bytes.len(),
                limit: self.limit,
            });
        }
        Ok(Encoded {
            seat: seat.into(),
            table: T::NAME,
            subject: memory_subject(seat, T::NAME, &digest(&T::key(row))),
            payload: bytes.into(),
        })
    }

    /// Publishes `row` and waits for the stream to store it.
    pub async fn publish<T: Table>(&self, row: &T::Row) -> Result<(), MemoryError> {
        let encoded = self.encode::<T>(row)?;
        self.send(&encoded).await
    }

    /// Publishes an encoded row and waits for the stream to store it.
    pub async fn send(&self, row: &Encoded) -> Result<(), MemoryError> {
        let unpublished = |detail: String| MemoryError::Unpublished {
            seat: row.seat.clone(),
            table: row.table,
            detail,
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ORIGIN_HEADER, &*self.origin);
        self.js
            .publish_with_headers(row.subject.clone(), headers, row.payload.clone())
            .await
            .map_err(|e| unpublished(e.to_string()))?
            .await
            .map_err(|e| unpublished(e.to_string()))?;
        Ok(())
    }
}

/// A row's key as one subject token: 128 bits of its SHA-256, in hex.
fn digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_subject_token_of_fixed_length() {
        for key in ["C1#17.1", "a.b.c", "", "* > spaces"] {
            let d = digest(key);
            assert_eq!(d.len(), 32, "{key:?}");
            assert!(is_token(&d), "{key:?} -> {d}");
        }
        assert_ne!(digest("C1#1"), digest("C1#2"));
        assert!(!is_token("ada.x") && !is_token("") && is_token("ada"));
    }
}
