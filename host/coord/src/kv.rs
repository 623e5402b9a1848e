//! The backend seam: the few primitives every contract is built from.
//!
//! Rule: a backend answers single-key reads from the stream leader, lists
//! with a certified listing, and reports a stale compare-and-swap as
//! [`Conflict`] — distinct from [`Unavailable`]. Every contract above this
//! seam is written once, so the memory twin and the real store cannot
//! disagree by construction on anything but these primitives, which the
//! contract suite holds both to.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::bucket::Bucket;

/// One key's latest record as the leader holds it (a removal is a marker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Bytes,
    /// The stream sequence of this record: the key's revision.
    pub revision: u64,
    /// When the store received it (the broker's clock: judge it only
    /// against [`Kv::broker_now`]).
    pub written_at: SystemTime,
    /// True for a delete/purge marker.
    pub removed: bool,
}

/// The store could not answer: the unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable(pub String);

impl From<Unavailable> for crate::answer::CoordError {
    fn from(u: Unavailable) -> Self {
        crate::answer::CoordError::Unavailable(u.0)
    }
}

/// A compare-and-swap whose expected revision was not the key's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict;

/// What a write expects the key's latest revision to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No expectation (a blind put).
    Any,
    /// The key's latest revision is exactly this; `0` means the key holds
    /// nothing at all (not even a marker).
    Revision(u64),
}

/// A change delivered by a watch after its first (certified) answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put(Entry),
    Removed { key: String, revision: u64 },
}

/// A watch: the certified first answer, then the changes after it — every
/// key's latest revision, in revision order, never an older one after a
/// newer. A revision the key lost to a later write before the store read it
/// for the watch may be skipped (a bucket keeps one revision per key).
pub struct Watch {
    pub initial: Vec<Entry>,
    pub changes: BoxStream<'static, Result<Change, Unavailable>>,
}

pub type KvResult<T> = Result<T, Unavailable>;
pub type WriteResult = Result<Result<u64, Conflict>, Unavailable>;

/// The primitives. Keys are already encoded; `filter` is a key prefix of
/// whole tokens (`"seat"` addresses `seat.*` and deeper) or `None` for the
/// whole bucket.
pub trait Kv: Send + Sync + 'static {
    /// Leader read of a key's latest record, marker included. No leader,
    /// timeout, unreachable: `Err`, never `Ok(None)`.
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> BoxFuture<'a, KvResult<Option<Entry>>>;

    /// Writes a value, predicated on `expect`. Returns the new revision.
    fn put<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult>;

    /// Writes a removal marker, predicated on `expect`.
    fn remove<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult>;

    /// Purges a key through `revision` inclusive; a later record survives.
    fn purge_through<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: u64,
    ) -> BoxFuture<'a, KvResult<()>>;

    /// Certified listing of live records: every key live throughout the
    /// call is present exactly once, or the answer is `Err`.
    fn list<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>>;

    /// Removal markers written at or before `before`, from an uncertified
    /// pass (the sweep owes nobody a complete answer).
    fn markers<'a>(
        &'a self,
        bucket: Bucket,
        before: SystemTime,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>>;

    /// A watch whose first answer is the certified listing.
    fn watch<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Watch>>;

    /// The age in force for a bucket (as adopted), `None` for no age.
    fn age(&self, bucket: Bucket) -> Option<Duration>;

    /// This node's wall clock: for what the design judges on the reader's
    /// own clock (a valve's window, budget windows, cooldowns). Never a
    /// deadline counted from a record's write instant (a lease's, a delivery
    /// claim's): see [`Kv::broker_now`].
    fn now(&self) -> SystemTime;

    /// The broker's time now, as a floor (never later than the clock that
    /// stamps `bucket`'s writes, never going backwards): what a deadline
    /// counted from a record's `written_at` — a lease's, a delivery claim's — is
    /// judged against.
    /// `Err` when it cannot be established: unknown, never "expired".
    fn broker_now<'a>(&'a self, bucket: Bucket) -> BoxFuture<'a, KvResult<SystemTime>>;
}
