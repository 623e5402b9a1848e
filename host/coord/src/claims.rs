//! Delivery claims and the completion ledger: who works an inbound
//! delivery, and whether a trigger has been worked. A claim is create-only
//! with a deadline in its record; a release is a compare-and-delete of this
//! attempt's own claim, so a lapsed or foreign claim is never removed.
//!
//! Whether a claim has lapsed is judged on the broker's clock
//! ([`crate::Kv::broker_now`]), the clock that stamped its write instant,
//! never this node's: judged on a clock running ahead by more than the claim
//! TTL, every live claim looked lapsed and a redelivery was worked twice;
//! on one running behind, a lapsed claim kept refusing a retry. The broker's
//! time is only read when a create meets a record or a release finds its
//! own, so an uncontended claim costs one write.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::Bucket;
use crate::kv::{Entry, Expect};
use crate::names::encode_token;
use crate::records::ms;
use crate::{Coord, decode, encode};

/// A delivery claim's holder and when it lapses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub claimant: String,
    pub deadline: SystemTime,
}

/// Why a release removed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreleased {
    /// The key holds no claim: never claimed, released already, or aged
    /// out of the bucket.
    Absent,
    /// This claimant's claim lapsed at its deadline: the key is claimable
    /// already, so nothing is written.
    Lapsed(Claimed),
    /// Another claimant (another delivery attempt) holds the key, or held
    /// it last: not this attempt's to remove.
    Other(Claimed),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClaimRecord {
    claimant: String,
    ttl_ms: u64,
}

/// The claim an entry of the claims bucket holds.
fn claimed(e: &Entry) -> Result<Claimed, CoordError> {
    let r: ClaimRecord = decode(Bucket::Claims, e)?;
    Ok(Claimed {
        deadline: e.written_at + Duration::from_millis(r.ttl_ms),
        claimant: r.claimant,
    })
}

/// Yes when `claimant` holds the claim, no when another does.
fn held_by(c: Claimed, claimant: &str) -> Answer<Claimed, Claimed> {
    if c.claimant == claimant {
        Answer::Yes(c)
    } else {
        Answer::No(c)
    }
}

impl Coord {
    // ---- delivery claims -------------------------------------------------

    /// Claims an inbound delivery for `ttl` (create-only; the deadline is in
    /// the record). Yes: this claimant holds it (a repeat by the same
    /// claimant is a yes). No: another claimant's live claim.
    ///
    /// Safe direction: fails open — on unknown, do NOT suppress the delivery
    /// (a claim that cannot be read has suppressed nothing, and nothing
    /// redelivers a dropped delivery).
    pub async fn claim(
        &self,
        delivery: &str,
        claimant: &str,
        ttl: Duration,
    ) -> Reply<Claimed, Claimed> {
        let b = Bucket::Claims;
        let key = claim_key(delivery)?;
        let kv = self.kv(b);
        match self.create_claim(&key, claimant, ttl).await? {
            Ok(()) => {
                // Read our own write back (from the leader) to learn the
                // store's deadline.
                match kv.get(b, &key).await? {
                    Some(e) if !e.removed => Ok(held_by(claimed(&e)?, claimant)),
                    _ => Err(CoordError::Unavailable(
                        "the claim was written but reads back as absent".into(),
                    )),
                }
            }
            Err(c) => Ok(held_by(c, claimant)),
        }
    }

    /// [`Coord::claim`] for a caller that does not need the deadline (the
    /// webhook edge): one create, no read-back of our own write. Yes: this
    /// claimant holds it. No: another claimant's live claim, with its
    /// deadline. Fails open on unknown, like `claim`.
    pub async fn claim_delivery(
        &self,
        delivery: &str,
        claimant: &str,
        ttl: Duration,
    ) -> Reply<(), Claimed> {
        Ok(
            match self
                .create_claim(&claim_key(delivery)?, claimant, ttl)
                .await?
            {
                Ok(()) => Answer::Yes(()),
                Err(c) if c.claimant == claimant => Answer::Yes(()),
                Err(c) => Answer::No(c),
            },
        )
    }

    /// Releases this attempt's claim on a delivery: compare-and-delete. The
    /// claim is removed only if the key still holds `claimant`'s live
    /// record, predicated on the revision it was read at; a record written
    /// over in between is judged again. Yes: removed, the key is claimable.
    /// No: nothing was `claimant`'s to remove ([`Unreleased`]) — in
    /// particular a claim another attempt took over is left alone.
    ///
    /// Safe direction: on unknown nothing is known removed — ask again
    /// until the store answers (a retry after a lost answer finds the key
    /// [`Unreleased::Absent`]); the claim lapses at its deadline anyway.
    pub async fn release_claim(&self, delivery: &str, claimant: &str) -> Reply<(), Unreleased> {
        let b = Bucket::Claims;
        let key = claim_key(delivery)?;
        let kv = self.kv(b);
        const ATTEMPTS: u32 = 8;
        for _ in 0..ATTEMPTS {
            let e = match kv.get(b, &key).await? {
                Some(e) if !e.removed => e,
                _ => return Ok(Answer::No(Unreleased::Absent)),
            };
            let c = claimed(&e)?;
            if c.claimant != claimant {
                return Ok(Answer::No(Unreleased::Other(c)));
            }
            if c.deadline <= kv.broker_now(b).await? {
                return Ok(Answer::No(Unreleased::Lapsed(c)));
            }
            if kv
                .remove(b, &key, Expect::Revision(e.revision))
                .await?
                .is_ok()
            {
                return Ok(Answer::Yes(()));
            }
            // Written over since the read: the record there now decides.
        }
        Err(CoordError::Contended {
            key,
            attempts: ATTEMPTS,
        })
    }

    /// Creates the claim `key` for `claimant` (create-only; a lapsed claim
    /// counts as absent). `Ok(Err(_))`: the live claim already there.
    async fn create_claim(
        &self,
        key: &str,
        claimant: &str,
        ttl: Duration,
    ) -> Result<Result<(), Claimed>, CoordError> {
        let b = Bucket::Claims;
        if let Some(age) = self.kv(b).age(b)
            && ttl > age
        {
            return Err(CoordError::TtlAboveBucketAge {
                asked: ttl,
                age,
                bucket: "claims".into(),
            });
        }
        let rec = ClaimRecord {
            claimant: claimant.to_owned(),
            ttl_ms: ttl.as_millis() as u64,
        };
        let lapsed = |e: &Entry, broker_now: SystemTime| {
            serde_json::from_slice::<ClaimRecord>(&e.value)
                .map(|r| e.written_at + Duration::from_millis(r.ttl_ms) <= broker_now)
                .unwrap_or(true)
        };
        match self.create(b, key, encode(&rec), Some(&lapsed)).await? {
            Ok(_) => Ok(Ok(())),
            Err(e) => Ok(Err(claimed(&e)?)),
        }
    }

    // ---- completion ledger -----------------------------------------------

    /// Records that a trigger has been worked.
    pub async fn complete(&self, trigger: &str) -> Result<(), CoordError> {
        let b = Bucket::Ledger;
        let v = encode(&serde_json::json!({ "at_ms": ms(self.kv(b).now()) }));
        let _blind = self
            .kv(b)
            .put(b, &encode_token(trigger), v, Expect::Any)
            .await?;
        Ok(())
    }

    /// Has this trigger been worked? Safe direction: fails open — on
    /// unknown, do the work (the redundant turn is bounded and visible).
    pub async fn completed(&self, trigger: &str) -> Reply<(), ()> {
        let b = Bucket::Ledger;
        Ok(match self.kv(b).get(b, &encode_token(trigger)).await? {
            Some(e) if !e.removed => Answer::Yes(()),
            _ => Answer::No(()),
        })
    }
}

/// Longest encoded claim key. A claim is written to
/// `$KV.<bucket>.<key>`, and a subject past nats-server's control-line
/// limit (4 KiB) makes the server drop the connection that sent it — the
/// node's only one. 1 KiB holds `SOURCE:ID` for any delivery id the
/// webhook edge admits (at most 256 bytes, each at most 3 once encoded).
pub const MAX_CLAIM_KEY_LEN: usize = 1024;

/// The key of `delivery`'s claim, refused when it would be too long.
fn claim_key(delivery: &str) -> Result<String, CoordError> {
    let key = encode_token(delivery);
    if delivery.is_empty() || key.len() > MAX_CLAIM_KEY_LEN {
        return Err(CoordError::InvalidName {
            name: crate::names::preview(delivery),
            why: "a claim key is non-empty and at most 1 KiB once encoded",
        });
    }
    Ok(key)
}
