//! Buckets by name: the seam's face for buckets outside the fixed
//! coordination set — module state (ADR 202), whose buckets a plugin
//! catalogue names at run time.
//!
//! Rules, and why:
//! - Same primitives, same backends. A named bucket is read from the stream
//!   leader, written with a predicate, listed with the certified listing and
//!   watched from it, by the code that serves the fourteen coordination
//!   buckets ([`crate::NatsKv`]), with the memory twin ([`crate::MemoryKv`])
//!   beside it. A second copy of "JetStream KV as a store" would have to
//!   relearn every rule `nats.rs` states (a direct get answered by a replica
//!   behind, a listing short by a lost delivery, the clustered conflict
//!   code) and would drift from them.
//! - [`Bucket`](crate::Bucket) stays the closed set it is (retentions, the
//!   sweep and `local` coordination are decided per variant). A dynamic
//!   bucket is a [`BucketName`], checked once, so no name the broker would
//!   refuse or read as several subject tokens reaches a request.
//! - A named bucket is opened by a [`NamedSpec`] that carries its caps.
//!   An existing bucket is adopted, not rewritten on every start: the
//!   owner's spec ([`Existing::Reconfigure`]) is applied only to the
//!   options that differ from what the bucket has (history, age, byte and
//!   value caps), and anyone else's spec only creates a bucket that is
//!   absent. The replica count is never changed on an existing bucket —
//!   moving a bucket's data onto more or fewer servers is an operator's
//!   gesture — so a count that differs from the spec's is answered in the
//!   [`NamedOpened`] report for the caller to report. A bucket is open
//!   only once a write through this connection reaches it
//!   ([`crate::until_writable`]). One never opened here is adopted as it is
//!   on first use; one that does not exist is [`NamedError::NoBucket`].
//! - The store's refusals are kinds ([`Refused`]) decided from the broker's
//!   error codes, never from its text: a stale predicate, a bucket at its
//!   byte cap, a value over the bucket's value cap. Whatever else fails is
//!   [`NamedError::Unavailable`]: the unknown, never a refusal.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::kv::{Entry, Expect, Unavailable, Watch};
use crate::open::OpenError;

/// The name of a bucket outside the coordination set: 1–255 of
/// `A-Z a-z 0-9 _ -` (what the broker accepts as a bucket name, and a
/// single subject token).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketName(String);

/// A string that cannot name a bucket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} cannot name a bucket; use 1–255 of A-Z, a-z, 0-9, `_` and `-` (module buckets are `mod_<module>_<local>`)"
)]
pub struct InvalidBucketName(pub String);

impl BucketName {
    pub fn new(name: impl Into<String>) -> Result<BucketName, InvalidBucketName> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= 255
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(BucketName(name))
        } else {
            Err(InvalidBucketName(name))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BucketName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What opening does to a bucket that already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Keep it as it is (a reader's spec: create if absent, never rewrite
    /// the owner's options with defaults).
    Adopt,
    /// Apply the options of this spec that differ from the bucket's (the
    /// owner's spec; never the replica count).
    Reconfigure,
}

/// A named bucket and the caps it is created (or reconfigured) with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSpec {
    pub name: BucketName,
    pub description: String,
    /// Values kept per key (at least 1).
    pub history: u8,
    /// The stream's `max_age`; `None` is "no age".
    pub age: Option<Duration>,
    /// The bucket's byte cap; writes past it are [`Refused::Full`].
    pub max_bytes: u64,
    /// The largest value; a larger one is [`Refused::TooLarge`].
    pub max_value_size: u32,
    pub replicas: usize,
    pub existing: Existing,
}

/// What opening a named bucket found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedOpened {
    /// The bucket did not exist and was created with the spec.
    pub created: bool,
    /// The spec's options applied to an existing bucket because they
    /// differed (`history`, `age`, `max_bytes`, `max_value_size`); empty
    /// when nothing was rewritten.
    pub reconfigured: Vec<&'static str>,
    /// The replicas the bucket has, which may differ from the spec's on an
    /// existing bucket (never changed by opening).
    pub replicas: usize,
}

impl NamedOpened {
    /// Whether the bucket's replica count is not the one the spec asked for.
    pub fn replicas_differ(&self, spec: &NamedSpec) -> bool {
        self.replicas != spec.replicas.max(1)
    }
}

/// What a named bucket holds, as its store counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedUsage {
    /// Bytes stored, removal markers and the store's framing included.
    pub bytes: u64,
    /// The byte cap; `None` when the bucket has none.
    pub max_bytes: Option<u64>,
}

/// A write the store refused: it answered, and the answer is no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The expected revision was not the key's.
    Conflict,
    /// The bucket is at its byte cap (nothing was written).
    Full,
    /// The value is over the bucket's value cap (nothing was written).
    TooLarge,
}

/// A named-bucket call that got no yes or no.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamedError {
    /// The bucket does not exist (it was never opened with its spec).
    #[error("bucket {0} does not exist; open it with its spec first")]
    NoBucket(BucketName),
    /// The store could not answer: unknown, not no.
    #[error("the store did not answer ({0}); the answer is unknown, not no — ask again later")]
    Unavailable(String),
}

impl From<Unavailable> for NamedError {
    fn from(u: Unavailable) -> Self {
        NamedError::Unavailable(u.0)
    }
}

pub type NamedResult<T> = Result<T, NamedError>;
/// The new revision, a refusal, or no answer.
pub type NamedWrite = Result<Result<u64, Refused>, NamedError>;

/// The [`crate::Kv`] primitives for buckets opened by name. Keys are
/// already encoded; `filter` is a key prefix of whole tokens or `None`.
pub trait NamedKv: Send + Sync + 'static {
    /// Creates the bucket if absent; on an existing one applies the
    /// options that differ only when the spec says [`Existing::Reconfigure`]
    /// and never its replica count; returns once a write through this
    /// connection reaches it, with what it found and did.
    fn open<'a>(&'a self, spec: &'a NamedSpec) -> BoxFuture<'a, Result<NamedOpened, OpenError>>;

    /// Every key-value bucket the store holds (named or not), sorted.
    fn names(&self) -> BoxFuture<'_, NamedResult<Vec<BucketName>>>;

    /// Leader read of a key's latest record, marker included.
    fn get<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
    ) -> BoxFuture<'a, NamedResult<Option<Entry>>>;

    /// Writes a value, predicated on `expect`.
    fn put<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite>;

    /// Writes a removal marker, predicated on `expect`.
    fn remove<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite>;

    /// Certified listing of live records.
    fn list<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Vec<Entry>>>;

    /// A watch whose first answer is the certified listing.
    fn watch<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Watch>>;

    /// What the bucket holds against its cap (the stream leader's count).
    fn usage<'a>(&'a self, bucket: &'a BucketName) -> BoxFuture<'a, NamedResult<NamedUsage>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_name_is_one_token_the_broker_accepts() {
        assert!(BucketName::new("mod_hostile-module_own").is_ok());
        for bad in ["", "a.b", "a b", "a*", "a>", "ä", &"x".repeat(256)] {
            assert!(BucketName::new(bad).is_err(), "{bad:?}");
        }
    }
}
