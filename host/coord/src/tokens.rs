//! Operator tokens: the fleet's record of who may call the API.
//!
//! Rules, and why:
//! - **Only a hash is stored.** The record holds the SHA-256 of the token's
//!   value (hex), never the value: a reader of the bucket learns nothing it
//!   can present. The caller hashes; this layer never sees a value.
//! - **Revocation is a write, not a removal.** A revoked token keeps its
//!   record with `revoked_ms` set, so a listing still shows it and a mirror
//!   that missed the change refuses it on its next certified listing, not
//!   only once a removal marker reaches it.
//! - **One watch feeds every node's mirror**: the certified listing first,
//!   then each change, as the seat pauses are watched.
//!
//! Safe direction on unknown: the caller fails closed for a token it has
//! never seen (an unreadable store is never an accept).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::Bucket;
use crate::kv::Expect;
use crate::{Contention, Coord, decode, encode};

/// The record class of a token in the tokens bucket (`token.ID`).
pub const TOKEN_CLASS: &str = "token";

/// One operator token as the fleet knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Lowercase hex SHA-256 of the token's value.
    pub hash: String,
    /// `read`, `write` or `admin`.
    pub scope: String,
    /// What the operator called it (may be empty).
    #[serde(default)]
    pub name: String,
    pub created_ms: u64,
    /// When it stops being accepted; `None` never.
    #[serde(default)]
    pub expires_ms: Option<u64>,
    /// When it was revoked; `None` while it stands.
    #[serde(default)]
    pub revoked_ms: Option<u64>,
}

impl TokenRecord {
    /// Neither revoked nor expired at `now_ms`.
    pub fn live_at(&self, now_ms: u64) -> bool {
        self.revoked_ms.is_none() && self.expires_ms.is_none_or(|e| now_ms < e)
    }
}

/// The tokens bucket, watched: id → record.
pub type TokenWatch = crate::records::ClassWatch<TokenRecord>;

fn record(v: serde_json::Value, id: &str) -> Result<TokenRecord, CoordError> {
    serde_json::from_value(v).map_err(|e| CoordError::Corrupt {
        bucket: Bucket::Tokens.short().into(),
        key: format!("{TOKEN_CLASS}.{id}"),
        why: e.to_string(),
    })
}

impl Coord {
    /// Creates token `id` (create-only). Yes: its revision. No: the record
    /// already under that id.
    pub async fn create_token(&self, id: &str, rec: &TokenRecord) -> Reply<u64, TokenRecord> {
        let value = serde_json::to_value(rec).expect("token records serialize");
        match self
            .create_record(Bucket::Tokens, TOKEN_CLASS, id, &value)
            .await?
        {
            Answer::Yes(rev) => Ok(Answer::Yes(rev)),
            Answer::No(v) => Ok(Answer::No(record(v, id)?)),
        }
    }

    /// Revokes token `id` at `at_ms` by compare-and-swap (a token revoked
    /// already keeps its first revocation time). Yes: the record as
    /// revoked. No: no token has that id.
    pub async fn revoke_token(&self, id: &str, at_ms: u64) -> Reply<TokenRecord, ()> {
        let b = Bucket::Tokens;
        let key = crate::records::class_key(TOKEN_CLASS, id)?;
        let kv = self.kv(b);
        let mut tries = Contention::new();
        loop {
            if !tries.again().await {
                break;
            }
            let e = match kv.get(b, &key).await? {
                Some(e) if !e.removed => e,
                _ => return Ok(Answer::No(())),
            };
            let mut rec: TokenRecord = decode(b, &e)?;
            if rec.revoked_ms.is_some() {
                return Ok(Answer::Yes(rec));
            }
            rec.revoked_ms = Some(at_ms);
            if kv
                .put(b, &key, encode(&rec), Expect::Revision(e.revision))
                .await?
                .is_ok()
            {
                return Ok(Answer::Yes(rec));
            }
        }
        Err(CoordError::Contended {
            key,
            attempts: tries.made(),
        })
    }

    /// Every token, revoked and expired ones included (certified listing).
    pub async fn tokens(&self) -> Result<BTreeMap<String, TokenRecord>, CoordError> {
        let mut out = BTreeMap::new();
        for (id, v) in self.list_records(Bucket::Tokens, TOKEN_CLASS).await? {
            let rec = record(v, &id)?;
            out.insert(id, rec);
        }
        Ok(out)
    }

    /// The one watch on the tokens bucket, starting with the certified
    /// listing.
    pub async fn watch_tokens(&self) -> Result<TokenWatch, CoordError> {
        self.watch_class(Bucket::Tokens, TOKEN_CLASS).await
    }
}
