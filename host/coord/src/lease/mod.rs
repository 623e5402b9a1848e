//! Leases and fencing epochs.
//!
//! Rules:
//! - A lease is named `class:id`. Seat and presence leases (`seat:`,
//!   `node:`) live in the leases bucket, whose age is the lease TTL: a node
//!   that stops renewing stops holding, with nobody having to notice. Every
//!   other lease (duties, tracker claims, any class) lives in duties and may
//!   ask for any TTL up to [`MAX_DUTY_TTL`], judged by the deadline its
//!   record carries (write instant + TTL), on every backend.
//! - Epochs come from the ageless epochs bucket: monotonic per resource,
//!   never reused, bumped on every new tenure (the same owner's too, after a
//!   lapse), kept across release. An epoch is minted by a compare-and-swap
//!   on the epochs key *after* the lease key was won, and the lease record is
//!   only believed when the epochs record names the same owner and epoch —
//!   so no epoch is ever handed to two owners, even when a lease lapses
//!   between its write and its mint.
//! - Renew and release are predicated on owner + epoch; a refused call
//!   writes nothing. A renew first tries a compare-and-swap on the revision
//!   of the holder's own last write (it lands only if the record is still
//!   that write), and otherwise reads the lease from the leader and judges;
//!   a swap lost to a write that kept its owner and epoch (its own earlier
//!   renew, answered unknown and landed late) reads and judges again. The
//!   owner is a process incarnation, not a host, so a restarted node is a
//!   new owner.
//! - An acquire whose answer was lost (unknown) is finished by the same
//!   owner asking again: it finds its own record and gets the same epoch.
//! - Whether a deadline has passed is judged on the broker's clock
//!   ([`crate::Kv::broker_now`]), the clock that stamped the record's write
//!   instant — never this node's, whose error would steal a live lease (a
//!   clock ahead) or lose one (a holder's clock ahead). Broker time unknown
//!   makes the answer unknown, never "expired".

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::{Bucket, MAX_DUTY_TTL};
use crate::epoch::FenceEpoch;
use crate::kv::{Entry, Expect};
use crate::names::{ResourceName, check_class};
use crate::{Coord, decode, encode};

mod status;
mod tenures;

pub use status::{BrokerRow, DutyRow, NodeStatus, ServerRow};
pub use tenures::Tenures;

/// A process incarnation: who holds a lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Owner(pub String);

impl Owner {
    /// A fresh incarnation of `node_id` (unique per process start).
    pub fn incarnation(node_id: &str) -> Owner {
        Owner(format!("{node_id}/{}", uuid::Uuid::new_v4().simple()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The node id of this incarnation (`NODE/INCARNATION`).
    pub fn node(&self) -> &str {
        self.0.split('/').next().unwrap_or_default()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaseRecord {
    owner: Owner,
    epoch: FenceEpoch,
    ttl_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<NodeStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct EpochRecord {
    epoch: FenceEpoch,
    owner: Owner,
    /// Who held the epoch before this one (absent: none, or minted by a
    /// build that did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous: Option<Owner>,
}

/// A tenure as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: ResourceName,
    pub owner: Owner,
    /// The fencing epoch.
    pub epoch: FenceEpoch,
    pub ttl: Duration,
    /// When the record lapses, on the broker's clock (its write instant +
    /// TTL; a holder's own is counted from before its write was sent).
    /// Compare it with the broker's time, never this node's wall clock.
    pub deadline: SystemTime,
    pub status: Option<NodeStatus>,
    /// The lease key's revision at the read or write that produced this.
    pub revision: u64,
    /// What this handle itself wrote (revision, owner, epoch): the renew
    /// fast path swaps only on a write it made, for the owner and epoch it
    /// made it with — never on fields a caller edited.
    proof: Option<(u64, Owner, FenceEpoch)>,
}

/// Why an acquire was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// Another owner's live tenure.
    By { owner: Owner, epoch: FenceEpoch },
    /// Claimants kept overtaking each other; nobody was refused by a holder.
    Contended,
}

/// Why a renew, release or get answered no.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotHeld {
    /// No live tenure on the resource.
    Free,
    /// A live tenure of another owner or another epoch.
    Other { owner: Owner, epoch: FenceEpoch },
}

fn bucket_for(class: &str) -> Bucket {
    match class {
        "seat" | "node" => Bucket::Leases,
        _ => Bucket::Duties,
    }
}

struct Read {
    /// The broker's time, a floor taken beside the reads (so no later than
    /// any instant they were answered at).
    now: SystemTime,
    /// The lease key's latest revision, a marker's included (0: nothing).
    lease_rev: u64,
    lease: Option<(Entry, LeaseRecord)>,
    epoch: Option<(Entry, EpochRecord)>,
}

impl Coord {
    fn lease_ttl_for(
        &self,
        name: &ResourceName,
        ttl: Option<Duration>,
    ) -> Result<Duration, CoordError> {
        match bucket_for(name.class()) {
            Bucket::Leases => {
                let age = self.lease_ttl();
                match ttl {
                    None => Ok(age),
                    Some(t) if t > age => Err(CoordError::TtlAboveBucketAge {
                        asked: t,
                        age,
                        bucket: "leases".into(),
                    }),
                    Some(t) if t.is_zero() => {
                        Err(CoordError::Invalid("a lease TTL must be above zero".into()))
                    }
                    Some(t) => Ok(t),
                }
            }
            _ => match ttl {
                None => Err(CoordError::Invalid(format!(
                    "{name} is a duty: name its TTL (at most {MAX_DUTY_TTL:?})"
                ))),
                Some(t) if t > MAX_DUTY_TTL => Err(CoordError::TtlAboveCeiling {
                    asked: t,
                    ceiling: MAX_DUTY_TTL,
                }),
                Some(t) if t.is_zero() => {
                    Err(CoordError::Invalid("a lease TTL must be above zero".into()))
                }
                Some(t) => Ok(t),
            },
        }
    }

    async fn read_tenure(&self, name: &ResourceName) -> Result<Read, CoordError> {
        let b = bucket_for(name.class());
        let key = name.key();
        let (now, l, e) = futures::join!(
            self.kv(b).broker_now(b),
            self.kv(b).get(b, &key),
            self.kv(Bucket::Epochs).get(Bucket::Epochs, &key)
        );
        let (now, l) = (now?, l?);
        let lease_rev = l.as_ref().map_or(0, |e| e.revision);
        let lease = match l {
            Some(e) if !e.removed => {
                let r: LeaseRecord = decode(b, &e)?;
                Some((e, r))
            }
            _ => None,
        };
        let epoch = match e? {
            Some(e) if !e.removed => {
                let r: EpochRecord = decode(Bucket::Epochs, &e)?;
                Some((e, r))
            }
            _ => None,
        };
        Ok(Read {
            now,
            lease_rev,
            lease,
            epoch,
        })
    }

    fn to_lease(name: &ResourceName, e: &Entry, r: &LeaseRecord) -> Lease {
        Lease {
            name: name.clone(),
            owner: r.owner.clone(),
            epoch: r.epoch,
            ttl: Duration::from_millis(r.ttl_ms),
            deadline: deadline(e, r),
            status: r.status.clone(),
            revision: e.revision,
            proof: None,
        }
    }

    /// Acquires `name` for `owner`. `ttl`: `None` for seat/presence leases
    /// takes the lease TTL in force; a duty names its own, at most
    /// [`MAX_DUTY_TTL`]. Yes carries the fencing epoch.
    pub async fn acquire(
        &self,
        name: &ResourceName,
        owner: &Owner,
        ttl: Option<Duration>,
    ) -> Reply<Lease, Held> {
        self.acquire_with(name, owner, ttl, None).await
    }

    /// Acquires this node's presence lease `node:{node_id}`, carrying its status.
    pub async fn acquire_presence(
        &self,
        node_id: &str,
        owner: &Owner,
        status: NodeStatus,
    ) -> Reply<Lease, Held> {
        let name = ResourceName::node(node_id)?;
        self.acquire_with(&name, owner, None, Some(status)).await
    }

    pub(crate) async fn acquire_with(
        &self,
        name: &ResourceName,
        owner: &Owner,
        ttl: Option<Duration>,
        status: Option<NodeStatus>,
    ) -> Reply<Lease, Held> {
        let ttl = self.lease_ttl_for(name, ttl)?;
        let b = bucket_for(name.class());
        let key = name.key();
        let kv = self.kv(b);
        let epochs = self.kv(Bucket::Epochs);
        for attempt in 0..8 {
            if attempt > 0 {
                crate::backoff(attempt - 1).await;
            }
            let read = self.read_tenure(name).await?;
            // The broker's time before any write below was sent.
            let sent = read.now;
            let (cur_epoch, epoch_rev, epoch_owner) = match &read.epoch {
                Some((e, r)) => (r.epoch, e.revision, Some(r.owner.clone())),
                None => (FenceEpoch(0), 0, None),
            };
            let lease_rev = read.lease_rev;
            if let Some((e, r)) = &read.lease
                && live(e, r, read.now)
            {
                {
                    if &r.owner != owner {
                        return Ok(Answer::No(Held::By {
                            owner: r.owner.clone(),
                            epoch: r.epoch,
                        }));
                    }
                    // Our own live record: the same tenure, finished or refreshed.
                    let minted = r.epoch == cur_epoch && epoch_owner.as_ref() == Some(owner);
                    let pending = r.epoch == cur_epoch.next();
                    if minted || pending {
                        let rec = LeaseRecord {
                            owner: owner.clone(),
                            epoch: r.epoch,
                            ttl_ms: ttl.as_millis() as u64,
                            status: status.clone().or_else(|| r.status.clone()),
                        };
                        let Ok(rev) = kv
                            .put(b, &key, encode(&rec), Expect::Revision(e.revision))
                            .await?
                        else {
                            continue;
                        };
                        if pending {
                            let er = EpochRecord {
                                epoch: r.epoch,
                                owner: owner.clone(),
                                previous: epoch_owner.clone(),
                            };
                            if epochs
                                .put(
                                    Bucket::Epochs,
                                    &key,
                                    encode(&er),
                                    Expect::Revision(epoch_rev),
                                )
                                .await?
                                .is_err()
                            {
                                let _ = kv.remove(b, &key, Expect::Revision(rev)).await;
                                continue;
                            }
                        }
                        return Ok(Answer::Yes(self.written(name, &rec, rev, ttl, sent)));
                    }
                    // A record of ours whose epoch was never minted to us: void.
                }
            }
            // A new tenure: win the lease key, then mint the next epoch.
            let epoch = cur_epoch.next();
            let rec = LeaseRecord {
                owner: owner.clone(),
                epoch,
                ttl_ms: ttl.as_millis() as u64,
                status: status.clone(),
            };
            let Ok(rev) = kv
                .put(b, &key, encode(&rec), Expect::Revision(lease_rev))
                .await?
            else {
                continue;
            };
            let er = EpochRecord {
                epoch,
                owner: owner.clone(),
                previous: epoch_owner.clone(),
            };
            match epochs
                .put(
                    Bucket::Epochs,
                    &key,
                    encode(&er),
                    Expect::Revision(epoch_rev),
                )
                .await?
            {
                Ok(_) => return Ok(Answer::Yes(self.written(name, &rec, rev, ttl, sent))),
                Err(_) => {
                    // Someone minted past us: our record names an epoch that
                    // is not ours. Take it back (only if still ours) and re-judge.
                    let _ = kv.remove(b, &key, Expect::Revision(rev)).await;
                }
            }
        }
        Ok(Answer::No(Held::Contended))
    }

    fn written(
        &self,
        name: &ResourceName,
        rec: &LeaseRecord,
        rev: u64,
        ttl: Duration,
        sent: SystemTime,
    ) -> Lease {
        Lease {
            name: name.clone(),
            owner: rec.owner.clone(),
            epoch: rec.epoch,
            ttl,
            // Counted from before the write was sent, so it is never later
            // than the deadline the store's own write instant gives.
            deadline: sent + ttl,
            status: rec.status.clone(),
            revision: rev,
            proof: Some((rev, rec.owner.clone(), rec.epoch)),
        }
    }

    /// Renews a tenure: predicated on owner + epoch (read from the leader);
    /// a refusal writes nothing. Unknown leaves the lease as it was — the
    /// holder keeps it, bounded by its clock ([`crate::Tenancy`]).
    pub async fn renew(&self, lease: &Lease) -> Reply<Lease, NotHeld> {
        let reply = self.renew_with(lease, None).await;
        self.inner.renewals.count(reply)
    }

    /// Renews a presence lease with a fresh status.
    pub async fn renew_presence(&self, lease: &Lease, status: NodeStatus) -> Reply<Lease, NotHeld> {
        let reply = self.renew_with(lease, Some(status)).await;
        self.inner.renewals.count(reply)
    }

    async fn renew_with(&self, lease: &Lease, status: Option<NodeStatus>) -> Reply<Lease, NotHeld> {
        let b = bucket_for(lease.name.class());
        let key = lease.name.key();
        let kv = self.kv(b);
        // The broker's time before either write below was sent.
        let mut sent = kv.broker_now(b).await?;
        // Fast path: a compare-and-swap on the revision of our own last
        // write. It lands only if nobody wrote the key since — so the record
        // there is still ours, at our epoch — and only while our own
        // (conservative) deadline has not passed; a lease the bucket's age
        // reaped holds no message, so the swap fails. Anything else takes
        // the read-then-write path below.
        let proven = lease.proof.as_ref().is_some_and(|(rev, owner, epoch)| {
            *rev == lease.revision && *owner == lease.owner && *epoch == lease.epoch
        });
        if proven && sent < lease.deadline {
            let rec = LeaseRecord {
                owner: lease.owner.clone(),
                epoch: lease.epoch,
                ttl_ms: lease.ttl.as_millis() as u64,
                status: status.clone().or_else(|| lease.status.clone()),
            };
            if let Ok(rev) = kv
                .put(b, &key, encode(&rec), Expect::Revision(lease.revision))
                .await?
            {
                return Ok(Answer::Yes(self.written(
                    &lease.name,
                    &rec,
                    rev,
                    lease.ttl,
                    sent,
                )));
            }
        }
        // Read, then swap on what was read. A swap that loses to a write
        // keeping our owner and epoch lost to ourselves — an earlier renew
        // that answered unknown and landed late — so the tenure is still
        // ours: read again and extend it from there, judged at a fresh
        // broker time.
        const ATTEMPTS: u32 = 3;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                sent = kv.broker_now(b).await?;
            }
            let Some(cur) = kv.get(b, &key).await? else {
                return Ok(Answer::No(NotHeld::Free));
            };
            if cur.removed {
                return Ok(Answer::No(NotHeld::Free));
            }
            let r: LeaseRecord = decode(b, &cur)?;
            if !live(&cur, &r, sent) {
                return Ok(Answer::No(NotHeld::Free));
            }
            if r.owner != lease.owner || r.epoch != lease.epoch {
                return Ok(Answer::No(NotHeld::Other {
                    owner: r.owner,
                    epoch: r.epoch,
                }));
            }
            let rec = LeaseRecord {
                status: status.clone().or(r.status),
                ..r
            };
            if let Ok(rev) = kv
                .put(b, &key, encode(&rec), Expect::Revision(cur.revision))
                .await?
            {
                return Ok(Answer::Yes(self.written(
                    &lease.name,
                    &rec,
                    rev,
                    lease.ttl,
                    sent,
                )));
            }
        }
        Err(CoordError::Contended {
            key: lease.name.to_string(),
            attempts: ATTEMPTS,
        })
    }

    /// Releases a tenure (owner + epoch predicated). The epoch is kept.
    pub async fn release(&self, lease: &Lease) -> Reply<(), NotHeld> {
        let b = bucket_for(lease.name.class());
        let key = lease.name.key();
        let kv = self.kv(b);
        let (now, cur) = futures::join!(kv.broker_now(b), kv.get(b, &key));
        let Some(cur) = cur? else {
            return Ok(Answer::No(NotHeld::Free));
        };
        if cur.removed {
            return Ok(Answer::No(NotHeld::Free));
        }
        let r: LeaseRecord = decode(b, &cur)?;
        if r.owner != lease.owner || r.epoch != lease.epoch {
            return Ok(Answer::No(NotHeld::Other {
                owner: r.owner,
                epoch: r.epoch,
            }));
        }
        if !live(&cur, &r, now?) {
            return Ok(Answer::No(NotHeld::Free));
        }
        match kv.remove(b, &key, Expect::Revision(cur.revision)).await? {
            Ok(_) => Ok(Answer::Yes(())),
            Err(_) => Ok(Answer::No(NotHeld::Free)),
        }
    }

    /// Who holds `name` now: Yes with the live tenure (its epoch minted to
    /// its owner), or No. Leader reads only.
    pub async fn get(&self, name: &ResourceName) -> Reply<Lease, NotHeld> {
        let read = self.read_tenure(name).await?;
        match read.lease {
            Some((e, r)) if live(&e, &r, read.now) => {
                let minted = read
                    .epoch
                    .as_ref()
                    .is_some_and(|(_, er)| er.epoch == r.epoch && er.owner == r.owner);
                if minted {
                    Ok(Answer::Yes(Coord::to_lease(name, &e, &r)))
                } else {
                    // A write whose epoch is not (or not yet) minted to it.
                    Ok(Answer::No(NotHeld::Free))
                }
            }
            _ => Ok(Answer::No(NotHeld::Free)),
        }
    }

    /// The current fencing epoch of a resource (0 if never leased).
    pub async fn epoch(&self, name: &ResourceName) -> Result<FenceEpoch, CoordError> {
        let key = name.key();
        match self.kv(Bucket::Epochs).get(Bucket::Epochs, &key).await? {
            Some(e) if !e.removed => Ok(decode::<EpochRecord>(Bucket::Epochs, &e)?.epoch),
            _ => Ok(FenceEpoch(0)),
        }
    }

    /// Every live lease of one class (`seat`, `node`, `worker`, ...), each
    /// with its epoch; a certified listing, or an error — never a short list.
    /// The empty class is refused: there is no all-classes listing.
    pub async fn list_live(&self, class: &str) -> Result<Vec<Lease>, CoordError> {
        check_class(class)?;
        let b = bucket_for(class);
        let (now, leases, epochs) = futures::join!(
            self.kv(b).broker_now(b),
            self.kv(b).list(b, Some(class)),
            self.kv(Bucket::Epochs).list(Bucket::Epochs, Some(class))
        );
        let epochs: HashMap<String, EpochRecord> = epochs?
            .iter()
            .map(|e| Ok((e.key.clone(), decode::<EpochRecord>(Bucket::Epochs, e)?)))
            .collect::<Result<_, CoordError>>()?;
        let now = now?;
        let mut out = Vec::new();
        for e in leases? {
            let r: LeaseRecord = decode(b, &e)?;
            let Some(name) = ResourceName::from_key(&e.key) else {
                continue;
            };
            let minted = epochs
                .get(&e.key)
                .is_some_and(|er| er.epoch == r.epoch && er.owner == r.owner);
            if minted && live(&e, &r, now) {
                out.push(Coord::to_lease(&name, &e, &r));
            }
        }
        Ok(out)
    }
}

fn deadline(e: &Entry, r: &LeaseRecord) -> SystemTime {
    e.written_at + Duration::from_millis(r.ttl_ms)
}

/// Whether a record's tenure runs at `broker_now` (the broker's time: the
/// clock that stamped `e.written_at`).
fn live(e: &Entry, r: &LeaseRecord, broker_now: SystemTime) -> bool {
    !e.removed && deadline(e, r) > broker_now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_status_ignores_keys_this_build_does_not_know() {
        let raw = r#"{"owner":"n/1","epoch":3,"ttl_ms":45000,
            "status":{"roles":["seats"],"turns_in_flight":2,"mcp":[{"server":"gh"}],"posture":"serve"}}"#;
        let r: LeaseRecord = serde_json::from_str(raw).unwrap();
        let st = r.status.unwrap();
        assert_eq!(
            (st.turns_in_flight, st.posture.as_deref()),
            (Some(2), Some("serve"))
        );
        assert_eq!(st.draining, None, "not sent: not reported");
        assert_eq!(st.roles, vec!["seats".to_owned()]);
    }
}
