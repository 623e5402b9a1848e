//! Crewlet's coordination layer: the fleet's shared slots.
//!
//! Everything that must be true for the company rather than for one process
//! lives here — which node holds which seat, whether a delivery was already
//! seen, whether a budget has room — on JetStream KV, opened on the node's
//! one NATS connection (a second dial could keep renewing leases over one
//! connection while the one carrying the inbox has dropped: alive to peers,
//! deaf to work).
//!
//! Every call answers yes, no, or unknown ([`Answer`], with unknown as the
//! error [`CoordError::Unavailable`]); each contract documents its safe
//! direction on an unreachable store:
//!
//! | contract | on unknown |
//! |---|---|
//! | [`Coord::admit`] (rate valve) | fails closed: refuse |
//! | [`Coord::claim`] (delivery dedupe) | fails open: do not suppress |
//! | [`Coord::completed`] (completion ledger) | fails open: do the work |
//! | [`Coord::renew`] (lease) | holds, bounded by the holder's clock ([`Tenancy`], [`Fence`]) |
//! | [`Coord::charge`] (budget) | fails closed with an error that is not a refusal |
//! | [`Follows::followers`] (who follows a thread) | an error, never "nobody": the delivery waits |
//!
//! Open it with [`Coord::open`] on the node's client. Tests use
//! [`Coord::memory`] over the [`MemoryKv`] twin, whose clock they advance.

pub mod answer;
pub mod bucket;
pub mod budget;
pub mod claims;
pub mod custody;
pub mod epoch;
pub mod faulty;
pub mod follows;
pub mod handles;
pub mod holder;
pub mod kv;
pub mod lease;
pub mod memory;
pub mod named;
pub mod names;
pub mod nats;
pub mod open;
pub mod reach;
pub mod records;
mod renewals;
pub mod sweep;
pub mod tenancy;
pub mod tokens;
pub mod typed;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

pub use answer::{Answer, CoordError, Reply};
pub use bucket::{Bucket, CUSTODY_AGE, FOLLOW_AGE, MARKER_RETENTION, MAX_DUTY_TTL};
pub use budget::{BudgetSlot, BudgetView, Caps, Charged, Period, Refusal, Scope, Windows};
pub use claims::{Claimed, MAX_CLAIM_KEY_LEN, Unreleased};
pub use custody::Custody;
pub use epoch::FenceEpoch;
pub use faulty::Faulty;
pub use follows::{ChatThread, Following, Follows};
pub use handles::{
    BudgetReads, Budgets, ConfigPointer, Cooldowns, Deliveries, Fires, Leases, Ledger,
    PauseRecords, Records, Roster, Survey, TokenRecords, Upkeep, Valve,
};
pub use holder::Admits;
pub use kv::{Change, Kv};
pub use lease::{BrokerRow, DutyRow, Held, Lease, NodeStatus, NotHeld, Owner, ServerRow, Tenures};
pub use memory::{Clock, ManualClock, MemoryKv, SystemClock};
pub use named::{
    BucketName, Existing, InvalidBucketName, NamedError, NamedKv, NamedOpened, NamedSpec,
    NamedUsage, NamedWrite, Refused,
};
pub use names::ResourceName;
pub use nats::NatsKv;
pub use open::OpenError;
pub use reach::{REACH_WITHIN, Unreachable, until_writable};
pub use records::{
    ClassWatch, Cooldown, KeyHint, Pointer, PointerMoved, RateVerdict, SeatPauses, key_hint,
    merge_cooldowns,
};
pub use renewals::RenewalCounts;
pub use sweep::SweepReport;
pub use tenancy::{Cadence, Fence, Released, RenewGrid, Standing, Tenancy, Terms};
pub use tokens::{TokenRecord, TokenWatch};
pub use typed::Claims;

use bucket::Retentions;
use kv::{Entry, Expect};
use renewals::Renewals;

/// Where leases live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CoordKind {
    /// Leases in the JetStream KV, like every shared record.
    #[default]
    Nats,
    /// Leases in this process only (one node, no peer to fence against).
    /// Every other record still lives in the KV.
    Local,
}

/// Plain values the node opens coordination with.
#[derive(Debug, Clone)]
pub struct CoordOptions {
    pub kind: CoordKind,
    /// Replicas every bucket must have (stream.replicas). Default 1.
    pub replicas: usize,
    /// Seat and presence lease TTL, and the leases bucket's age. Default 45 s.
    pub lease_ttl: Duration,
    /// Holder heartbeat. Default 15 s.
    pub heartbeat: Duration,
    /// This process incarnation.
    pub owner: Owner,
    /// Bucket name prefix (`{namespace}_{bucket}`). Default `crewlet`.
    pub namespace: String,
    /// Age of the status bucket (~4 reconcile intervals). Default 60 s.
    pub status_age: Duration,
    /// Age of the rate bucket (a few valve windows). Default 60 s.
    pub rate_age: Duration,
    /// Timeout of one store request. Default 5 s.
    pub request_timeout: Duration,
}

impl CoordOptions {
    /// Defaults for a node whose process incarnation is `owner`.
    pub fn new(owner: Owner) -> CoordOptions {
        CoordOptions {
            kind: CoordKind::Nats,
            replicas: 1,
            lease_ttl: Duration::from_secs(45),
            heartbeat: Duration::from_secs(15),
            owner,
            namespace: "crewlet".into(),
            status_age: Duration::from_secs(60),
            rate_age: Duration::from_secs(60),
            request_timeout: Duration::from_secs(5),
        }
    }

    fn retentions(&self) -> Retentions {
        Retentions {
            lease_ttl: self.lease_ttl,
            status: self.status_age,
            rate: self.rate_age,
        }
    }
}

/// The coordination handle. Cheap to clone.
#[derive(Clone)]
pub struct Coord {
    inner: Arc<Inner>,
}

struct Inner {
    leases: Arc<dyn Kv>,
    records: Arc<dyn Kv>,
    opts: CoordOptions,
    renewals: Renewals,
}

impl Coord {
    /// Opens every bucket on the node's one connection (adopting buckets
    /// that exist). With [`CoordKind::Local`] leases stay in this process.
    pub async fn open(client: async_nats::Client, opts: CoordOptions) -> Result<Coord, OpenError> {
        let ret = opts.retentions();
        let wanted: Vec<Bucket> = Bucket::ALL
            .into_iter()
            .filter(|b| opts.kind == CoordKind::Nats || !b.is_lease_store())
            .collect();
        let nats = Arc::new(
            NatsKv::open(
                client,
                &opts.namespace,
                &wanted,
                &ret,
                opts.replicas,
                opts.request_timeout,
            )
            .await?,
        );
        let leases: Arc<dyn Kv> = match opts.kind {
            CoordKind::Nats => nats.clone(),
            CoordKind::Local => Arc::new(MemoryKv::new(Arc::new(SystemClock), &ret)),
        };
        Ok(Coord::with_backends(leases, nats, opts))
    }

    /// Everything on one in-process twin (tests).
    pub fn memory(kv: MemoryKv, opts: CoordOptions) -> Coord {
        let kv: Arc<dyn Kv> = Arc::new(kv);
        Coord::with_backends(kv.clone(), kv, opts)
    }

    /// Everything on one in-process twin on the system clock, behind a
    /// [`Faulty`] switch a test breaks and heals (crate tests of the
    /// subsystems that use coordination).
    pub fn breakable_memory(opts: CoordOptions) -> (Arc<Faulty>, Coord) {
        let kv = MemoryKv::new(Arc::new(SystemClock), &opts.retentions());
        let faulty = Faulty::new(Arc::new(kv));
        let backend: Arc<dyn Kv> = faulty.clone();
        (faulty, Coord::with_backends(backend.clone(), backend, opts))
    }

    /// Any backends: one for leases/duties/epochs, one for every record.
    pub fn with_backends(leases: Arc<dyn Kv>, records: Arc<dyn Kv>, opts: CoordOptions) -> Coord {
        Coord {
            inner: Arc::new(Inner {
                leases,
                records,
                opts,
                renewals: Renewals::default(),
            }),
        }
    }

    /// The options this handle runs with.
    pub fn options(&self) -> &CoordOptions {
        &self.inner.opts
    }

    /// How this handle's lease renewals were answered so far.
    pub fn renewals(&self) -> RenewalCounts {
        self.inner.renewals.read()
    }

    /// The seat/presence lease TTL in force: the leases bucket's age, which
    /// the first node to create it decided.
    pub fn lease_ttl(&self) -> Duration {
        self.inner
            .leases
            .age(Bucket::Leases)
            .unwrap_or(self.inner.opts.lease_ttl)
    }

    /// The heartbeat in force: the configured one, but never more than a
    /// third of the lease TTL in force. Why: the TTL is the bucket's, which
    /// the first node decided; a node configured for a longer TTL would
    /// otherwise beat too slowly to keep its leases (3 beats fit in one).
    pub fn heartbeat(&self) -> Duration {
        self.inner.opts.heartbeat.min(self.lease_ttl() / 3)
    }

    /// A seat's beat: how long a seat lease stays admitting after its last
    /// good renew — half the lease TTL in force (22.5 s at the default
    /// 45 s), where presence and duties use the heartbeat.
    ///
    /// Why longer than the heartbeat: a node renews one presence but every
    /// seat it holds, and each renew is a write to the leases bucket (about
    /// 80 µs of node and nats-server CPU). 10,000 idle seats renewed once a
    /// heartbeat were 740 writes a second, 6 % of a core spent doing
    /// nothing. Renewed once a seat beat they are 490. What the beat does
    /// not change: a lease still lapses a TTL after its last renew (so a
    /// dead holder's seats move as soon as before, or sooner), and a seat
    /// still stops taking new work half a TTL before it could be lost.
    pub fn seat_beat(&self) -> Duration {
        self.lease_ttl() / 2
    }

    pub(crate) fn kv(&self, b: Bucket) -> &dyn Kv {
        if b.is_lease_store() {
            self.inner.leases.as_ref()
        } else {
            self.inner.records.as_ref()
        }
    }

    /// Create-only write: a live value is the key existing (`Err(entry)`), a
    /// marker is the revision to write over, nothing at all is a key never
    /// written. `lapsed`, when given, may declare an existing live record
    /// lapsed (its deadline passed) at the broker's time, read beside the
    /// record only when the create found one; a lapsed record is written over
    /// at its revision. The broker's time unknown is the answer unknown.
    pub(crate) async fn create(
        &self,
        b: Bucket,
        key: &str,
        value: Bytes,
        lapsed: Option<Lapsed<'_>>,
    ) -> Result<Result<u64, Entry>, CoordError> {
        let kv = self.kv(b);
        let mut expect = Expect::Revision(0);
        for _ in 0..8 {
            if let Ok(rev) = kv.put(b, key, value.clone(), expect).await? {
                return Ok(Ok(rev));
            }
            let found = match lapsed {
                None => kv.get(b, key).await?.map(|e| (e, false)),
                Some(judge) => {
                    let (now, e) = futures::join!(kv.broker_now(b), kv.get(b, key));
                    match e? {
                        Some(e) if !e.removed => {
                            let over = judge(&e, now?);
                            Some((e, over))
                        }
                        other => other.map(|e| (e, false)),
                    }
                }
            };
            match found {
                None => expect = Expect::Revision(0),
                Some((e, over)) if e.removed || over => expect = Expect::Revision(e.revision),
                Some((e, _)) => return Ok(Err(e)),
            }
        }
        Err(CoordError::Contended {
            key: key.to_owned(),
            attempts: 8,
        })
    }
}

/// Judges whether a record found by a create has lapsed at the broker's time.
pub(crate) type Lapsed<'a> = &'a (dyn Fn(&Entry, SystemTime) -> bool + Sync);

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    b: Bucket,
    e: &Entry,
) -> Result<T, CoordError> {
    serde_json::from_slice(&e.value).map_err(|err| CoordError::Corrupt {
        bucket: b.short().into(),
        key: e.key.clone(),
        why: err.to_string(),
    })
}

pub(crate) fn encode<T: serde::Serialize>(v: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("records serialize"))
}

/// Contended compare-and-swap waits a jittered 1 ms, doubling to 32 ms,
/// across at least [`CAS_ATTEMPTS`] attempts and at least [`CAS_PATIENCE`]
/// before the call fails closed. Retried at once, 32 concurrent charges on
/// one record ran out of attempts in four runs of ten.
pub const CAS_ATTEMPTS: u32 = 16;

/// The least time a contended compare-and-swap keeps trying. A record many
/// callers write at once (the company's budget) is won by one of them per
/// round, and a loaded machine makes rounds slow: an attempt count alone
/// ran out on 32 concurrent charges while the record was still moving
/// (every loss is someone else's win), failing a call that only had to
/// wait its turn.
pub const CAS_PATIENCE: Duration = Duration::from_secs(2);

/// The attempts of one compare-and-swap loop ([`CAS_ATTEMPTS`],
/// [`CAS_PATIENCE`]).
pub(crate) struct Contention {
    started: std::time::Instant,
    made: u32,
}

impl Contention {
    pub(crate) fn new() -> Contention {
        Contention {
            started: std::time::Instant::now(),
            made: 0,
        }
    }

    /// Whether to make another attempt; waits its backoff first when one
    /// was already made.
    pub(crate) async fn again(&mut self) -> bool {
        if self.made > 0 {
            if self.made >= CAS_ATTEMPTS && self.started.elapsed() >= CAS_PATIENCE {
                return false;
            }
            backoff(self.made - 1).await;
        }
        self.made += 1;
        true
    }

    /// Attempts made so far.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }
}

async fn backoff(attempt: u32) {
    let cap_ms = 1u64 << attempt.min(5); // 1, 2, 4, 8, 16, 32
    let r = uuid::Uuid::new_v4().as_u128() as u64;
    // Jitter in [cap/2, cap] ms, at microsecond grain.
    let us = cap_ms * 500 + r % (cap_ms * 500 + 1);
    tokio::time::sleep(Duration::from_micros(us)).await;
}
