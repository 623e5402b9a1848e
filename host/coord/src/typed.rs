//! Claim once, typed: the records of one class in one bucket, each read
//! back as the type it was written as.
//!
//! Rule: a claim is a create — the first writer of `class:id` wins, every
//! later one is answered no with the record already there (and its
//! revision, to replace it at). A record that does not decode is
//! [`CoordError::Corrupt`] naming the bucket and key, never a default.
//! Why: fires and reply keys were `json!` records read back field by
//! field, and a claim whose epoch did not parse read as epoch 0 — any
//! holder could take it over.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::Bucket;
use crate::kv::Expect;
use crate::records::class_key;
use crate::{Coord, decode, encode};

/// The records `R` of one class in one bucket ([`Coord::claims`]).
pub struct Claims<R> {
    coord: Coord,
    bucket: Bucket,
    class: String,
    record: PhantomData<fn() -> R>,
}

impl Coord {
    /// The records of `class` in `bucket`, typed as `R`.
    pub fn claims<R>(&self, bucket: Bucket, class: &str) -> Claims<R>
    where
        R: Serialize + DeserializeOwned,
    {
        Claims {
            coord: self.clone(),
            bucket,
            class: class.to_owned(),
            record: PhantomData,
        }
    }
}

impl<R: Serialize + DeserializeOwned> Claims<R> {
    /// Claims `id` with `record` (create-only). Yes: this caller won, at
    /// that revision. No: the record already there, and its revision.
    pub async fn claim(&self, id: &str, record: &R) -> Reply<u64, (R, u64)> {
        let key = class_key(&self.class, id)?;
        match self
            .coord
            .create(self.bucket, &key, encode(record), None)
            .await?
        {
            Ok(rev) => Ok(Answer::Yes(rev)),
            Err(e) => Ok(Answer::No((decode(self.bucket, &e)?, e.revision))),
        }
    }

    /// Reads `id`: Yes with (record, revision), or No.
    pub async fn get(&self, id: &str) -> Reply<(R, u64), ()> {
        let key = class_key(&self.class, id)?;
        let kv = self.coord.kv(self.bucket);
        Ok(match kv.get(self.bucket, &key).await? {
            Some(e) if !e.removed => Answer::Yes((decode(self.bucket, &e)?, e.revision)),
            _ => Answer::No(()),
        })
    }

    /// Writes `id` whatever is there (blind). Returns the revision.
    pub async fn put(&self, id: &str, record: &R) -> Result<u64, CoordError> {
        let key = class_key(&self.class, id)?;
        self.coord
            .kv(self.bucket)
            .put(self.bucket, &key, encode(record), Expect::Any)
            .await?
            .map_err(|_| CoordError::Contended { key, attempts: 1 })
    }

    /// Replaces `id` by compare-and-set at `revision` (one a read or a
    /// claim answered). Yes: the new revision; No: the record moved since,
    /// or is gone. Safe direction: on unknown nothing is assumed written.
    pub async fn replace(&self, id: &str, record: &R, revision: u64) -> Reply<u64, ()> {
        let key = class_key(&self.class, id)?;
        if revision == 0 {
            return Err(CoordError::Invalid(format!(
                "replacing {key:?} at revision 0 would create it; claim it first, replace at a revision a read answered"
            )));
        }
        Ok(
            match self
                .coord
                .kv(self.bucket)
                .put(
                    self.bucket,
                    &key,
                    encode(record),
                    Expect::Revision(revision),
                )
                .await?
            {
                Ok(rev) => Answer::Yes(rev),
                Err(_) => Answer::No(()),
            },
        )
    }

    /// Removes `id` (a marker, swept later). Yes if it was live.
    pub async fn remove(&self, id: &str) -> Reply<(), ()> {
        let key = class_key(&self.class, id)?;
        let kv = self.coord.kv(self.bucket);
        match kv.get(self.bucket, &key).await? {
            Some(e) if !e.removed => {
                match kv
                    .remove(self.bucket, &key, Expect::Revision(e.revision))
                    .await?
                {
                    Ok(_) => Ok(Answer::Yes(())),
                    Err(_) => Ok(Answer::No(())),
                }
            }
            _ => Ok(Answer::No(())),
        }
    }
}
