//! Narrow handles: what one subsystem may do with coordination.
//!
//! Rule: [`Coord`] owns the connection and the buckets and mints these; a
//! subsystem's constructor takes only the handles it uses, so what it
//! *can* touch is in its signature (the turn engine holds [`Budgets`] and
//! the [`Ledger`], and cannot move the config pointer). Each handle is a
//! small set of the contracts [`Coord`] documents, answered the same way
//! (yes / no / unknown) — a handle narrows, it never re-implements.
//! Why: with the whole `Coord` handed to eight crates, any subsystem could
//! call any contract; the host keeps its guests to least authority and now
//! itself too.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use crewlet_os::ConfigEpoch;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Coord;
use crate::answer::{CoordError, Reply};
use crate::bucket::Bucket;
use crate::budget::{BudgetView, Caps, Charged, Refusal, Scope, Windows};
use crate::claims::{Claimed, Unreleased};
use crate::lease::{Held, Lease, Owner, Tenures};
use crate::names::ResourceName;
use crate::records::{Cooldown, KeyHint, Pointer, PointerMoved, RateVerdict, SeatPauses};
use crate::sweep::SweepReport;
use crate::tenancy::{RenewGrid, StatusFn, Tenancy, Terms};
use crate::tokens::{TokenRecord, TokenWatch};
use crate::typed::Claims;

impl Coord {
    /// The budget windows, for what a turn spends.
    pub fn budgets(&self) -> Budgets {
        Budgets(self.clone())
    }

    /// The budget windows, read only.
    pub fn budget_reads(&self) -> BudgetReads {
        BudgetReads(self.clone())
    }

    /// What the fleet's views read, and nothing they could write.
    pub fn survey(&self) -> Survey {
        Survey(self.clone())
    }

    /// The operators' tokens: created, revoked, listed, watched.
    pub fn token_records(&self) -> TokenRecords {
        TokenRecords(self.clone())
    }

    /// The deliveries' claims: claimed once, released after a failed publish.
    pub fn deliveries(&self) -> Deliveries {
        Deliveries(self.clone())
    }

    /// The rate valve.
    pub fn valve(&self) -> Valve {
        Valve(self.clone())
    }

    /// The plain records of one bucket (any class in it, no other bucket).
    pub fn records(&self, bucket: Bucket) -> Records {
        Records {
            coord: self.clone(),
            bucket,
        }
    }

    /// The completion ledger and the records a trigger is owed.
    pub fn ledger(&self) -> Ledger {
        Ledger(self.clone())
    }

    /// The leases of one class (`seat`, `node`, `worker`), for their holders.
    pub fn leases(&self, class: &'static str) -> Leases {
        Leases {
            coord: self.clone(),
            class,
        }
    }

    /// The live leases of one class, read only: who is present.
    pub fn roster(&self, class: &'static str) -> Roster {
        Roster {
            coord: self.clone(),
            class,
        }
    }

    /// The seat pauses: set, cleared and watched.
    pub fn pauses(&self) -> PauseRecords {
        PauseRecords(self.clone())
    }

    /// The fleet's model-key cooldowns: benched and pulled.
    pub fn model_cooldowns(&self) -> Cooldowns {
        Cooldowns(self.clone())
    }

    /// The scheduler's fires and cursors.
    pub fn fires(&self) -> Fires {
        Fires(self.clone())
    }

    /// The maintenance duty's sweep, and the config pointer read only.
    pub fn upkeep(&self) -> Upkeep {
        Upkeep(self.clone())
    }

    /// The config pointer, the stored revisions it names and the nodes'
    /// statuses beside it.
    pub fn config_pointer(&self) -> ConfigPointer {
        ConfigPointer(self.clone())
    }
}

/// Token budgets as calendar windows ([`Coord::budget`], [`Coord::charge`],
/// [`Coord::refuse`], [`Coord::refuse_for`]).
#[derive(Clone)]
pub struct Budgets(Coord);

impl Budgets {
    /// What `scope` has spent in `windows`.
    pub async fn budget(&self, scope: &Scope, windows: &Windows) -> Result<BudgetView, CoordError> {
        self.0.budget(scope, windows).await
    }

    /// The same windows, read only.
    pub fn reads(&self) -> BudgetReads {
        BudgetReads(self.0.clone())
    }

    /// Charges `tokens` to the company and `seat`.
    pub async fn charge(
        &self,
        seat: &str,
        windows: &Windows,
        company_caps: &Caps,
        seat_caps: &Caps,
        tokens: u64,
    ) -> Reply<Charged, Refusal> {
        self.0
            .charge(seat, windows, company_caps, seat_caps, tokens)
            .await
    }

    /// Records the refusal a full window gives, once.
    pub async fn refuse(
        &self,
        seat: &str,
        windows: &Windows,
        company_caps: &Caps,
        seat_caps: &Caps,
    ) -> Reply<Refusal, ()> {
        self.0.refuse(seat, windows, company_caps, seat_caps).await
    }

    /// Records the refusal of a call needing `need` tokens, once.
    pub async fn refuse_for(
        &self,
        seat: &str,
        windows: &Windows,
        company_caps: &Caps,
        seat_caps: &Caps,
        need: u64,
    ) -> Reply<Refusal, ()> {
        self.0
            .refuse_for(seat, windows, company_caps, seat_caps, need)
            .await
    }
}

/// The budget windows, read only ([`Coord::budget`]): a reader of what was
/// spent (`GET /budgets`, a park's reason) cannot charge or refuse.
#[derive(Clone)]
pub struct BudgetReads(Coord);

impl BudgetReads {
    /// What `scope` has spent in `windows`.
    pub async fn budget(&self, scope: &Scope, windows: &Windows) -> Result<BudgetView, CoordError> {
        self.0.budget(scope, windows).await
    }
}

/// What the fleet's views read: live leases of any class, the nodes'
/// statuses, the budget windows, the seat beat and this node's owner —
/// every one a read.
#[derive(Clone)]
pub struct Survey(Coord);

impl Survey {
    /// The live leases of `class` ([`Coord::list_live`]).
    pub async fn live(&self, class: &str) -> Result<Vec<Lease>, CoordError> {
        self.0.list_live(class).await
    }

    /// Every node's status ([`Coord::statuses`]).
    pub async fn statuses(&self) -> Result<BTreeMap<String, serde_json::Value>, CoordError> {
        self.0.statuses().await
    }

    /// The budget windows, read only.
    pub fn budgets(&self) -> BudgetReads {
        BudgetReads(self.0.clone())
    }

    /// A seat's beat in force ([`Coord::seat_beat`]).
    pub fn seat_beat(&self) -> Duration {
        self.0.seat_beat()
    }

    /// This process incarnation, the owner of this node's leases.
    pub fn owner(&self) -> &Owner {
        &self.0.options().owner
    }
}

/// The ledger bucket: a trigger done ([`Coord::complete`],
/// [`Coord::completed`]) and the records of a class kept beside it (reply
/// keys, notices), nothing of any other bucket.
#[derive(Clone)]
pub struct Ledger(Coord);

impl Ledger {
    /// Records `trigger` done.
    pub async fn complete(&self, trigger: &str) -> Result<(), CoordError> {
        self.0.complete(trigger).await
    }

    /// Whether `trigger` was done (fails open: unknown is the error).
    pub async fn completed(&self, trigger: &str) -> Reply<(), ()> {
        self.0.completed(trigger).await
    }

    /// The ledger's records of `class`, typed as `R`.
    pub fn claims<R: Serialize + DeserializeOwned>(&self, class: &str) -> Claims<R> {
        self.0.claims(Bucket::Ledger, class)
    }

    /// Reads `class:id` ([`Coord::get_record`]).
    pub async fn get_record(&self, class: &str, id: &str) -> Reply<(serde_json::Value, u64), ()> {
        self.0.get_record(Bucket::Ledger, class, id).await
    }

    /// Creates `class:id` ([`Coord::create_record`]).
    pub async fn create_record(
        &self,
        class: &str,
        id: &str,
        value: &serde_json::Value,
    ) -> Reply<u64, serde_json::Value> {
        self.0.create_record(Bucket::Ledger, class, id, value).await
    }

    /// Replaces `class:id` at `revision` ([`Coord::replace_record`]).
    pub async fn replace_record(
        &self,
        class: &str,
        id: &str,
        value: &serde_json::Value,
        revision: u64,
    ) -> Reply<u64, ()> {
        self.0
            .replace_record(Bucket::Ledger, class, id, value, revision)
            .await
    }

    /// Removes `class:id` ([`Coord::remove_record`]).
    pub async fn remove_record(&self, class: &str, id: &str) -> Reply<(), ()> {
        self.0.remove_record(Bucket::Ledger, class, id).await
    }
}

/// The leases of one class: won and held through a [`Tenancy`], listed,
/// and who held them last — no other class, no record bucket.
#[derive(Clone)]
pub struct Leases {
    coord: Coord,
    class: &'static str,
}

impl Leases {
    /// The class these leases are of.
    pub fn class(&self) -> &'static str {
        self.class
    }

    /// Acquires `name` (of this class) for `owner` and holds it on `terms`
    /// ([`Tenancy::acquire`]). A name of another class is refused as
    /// [`CoordError::Invalid`]: a caller's mistake, nothing is written.
    pub async fn acquire(
        &self,
        name: &ResourceName,
        owner: &Owner,
        ttl: Option<Duration>,
        terms: Terms,
    ) -> Reply<Tenancy, Held> {
        if name.class() != self.class {
            return Err(CoordError::Invalid(format!(
                "{name} is not a {} lease; acquire it through the {} leases' handle",
                self.class,
                name.class()
            )));
        }
        Tenancy::acquire(&self.coord, name, owner, ttl, terms).await
    }

    /// The live leases of this class ([`Coord::list_live`]).
    pub async fn live(&self) -> Result<Vec<Lease>, CoordError> {
        self.coord.list_live(self.class).await
    }

    /// Who held each lease of this class last ([`Coord::tenures`]).
    pub async fn tenures(&self) -> Result<HashMap<String, Tenures>, CoordError> {
        self.coord.tenures(self.class).await
    }

    /// A node's presence terms, carrying `status` ([`Terms::presence`]).
    pub fn presence_terms(&self, status: StatusFn) -> Terms {
        Terms::presence(&self.coord, status)
    }

    /// A seat's terms on `grid` ([`Terms::seat`]).
    pub fn seat_terms(&self, grid: RenewGrid) -> Terms {
        Terms::seat(&self.coord, grid)
    }

    /// The heartbeat in force ([`Coord::heartbeat`]).
    pub fn heartbeat(&self) -> Duration {
        self.coord.heartbeat()
    }

    /// The lease TTL in force ([`Coord::lease_ttl`]).
    pub fn lease_ttl(&self) -> Duration {
        self.coord.lease_ttl()
    }
}

/// The live leases of one class, read only ([`Coord::list_live`]): a
/// reader of who is present cannot acquire, renew or release.
#[derive(Clone)]
pub struct Roster {
    coord: Coord,
    class: &'static str,
}

impl Roster {
    /// The class this roster reads.
    pub fn class(&self) -> &'static str {
        self.class
    }

    /// The live leases of this class.
    pub async fn live(&self) -> Result<Vec<Lease>, CoordError> {
        self.coord.list_live(self.class).await
    }
}

/// The seat pauses ([`Coord::pause_seat`], [`Coord::resume_seat`],
/// [`Coord::watch_seat_pauses`]).
#[derive(Clone)]
pub struct PauseRecords(Coord);

impl PauseRecords {
    /// Pauses `handle` with `record`.
    pub async fn pause(&self, handle: &str, record: &serde_json::Value) -> Result<(), CoordError> {
        self.0.pause_seat(handle, record).await
    }

    /// Resumes `handle`: yes if it was paused.
    pub async fn resume(&self, handle: &str) -> Reply<(), ()> {
        self.0.resume_seat(handle).await
    }

    /// Every pause now, then every change.
    pub async fn watch(&self) -> Result<SeatPauses, CoordError> {
        self.0.watch_seat_pauses().await
    }
}

/// The fleet's model-key cooldowns ([`Coord::bench`], [`Coord::cooldowns`]).
#[derive(Clone)]
pub struct Cooldowns(Coord);

impl Cooldowns {
    /// Benches `hint`'s key of `provider` until `until`, for the fleet.
    pub async fn bench(
        &self,
        provider: &str,
        hint: &KeyHint,
        until: SystemTime,
    ) -> Result<(), CoordError> {
        self.0.bench(provider, hint, until).await
    }

    /// Every cooldown standing.
    pub async fn cooldowns(&self) -> Result<Vec<Cooldown>, CoordError> {
        self.0.cooldowns().await
    }
}

/// The config pointer ([`Coord::active_config`], [`Coord::activate`]), the
/// revisions in the config bucket it names, and the nodes' statuses
/// ([`Coord::publish_status`], [`Coord::statuses`]) the postures are
/// decided from.
#[derive(Clone)]
pub struct ConfigPointer(Coord);

impl ConfigPointer {
    /// What the pointer names now.
    pub async fn active_config(&self) -> Result<Pointer, CoordError> {
        self.0.active_config().await
    }

    /// Moves the pointer to `revision` if it is still at `expected`.
    pub async fn activate(
        &self,
        revision: &str,
        expected: Option<ConfigEpoch>,
    ) -> Reply<ConfigEpoch, PointerMoved> {
        self.0.activate(revision, expected).await
    }

    /// Stores `class:id` in the config bucket (blind).
    pub async fn put_record(
        &self,
        class: &str,
        id: &str,
        value: &serde_json::Value,
    ) -> Result<u64, CoordError> {
        self.0.put_record(Bucket::Config, class, id, value).await
    }

    /// Reads `class:id` from the config bucket.
    pub async fn get_record(&self, class: &str, id: &str) -> Reply<(serde_json::Value, u64), ()> {
        self.0.get_record(Bucket::Config, class, id).await
    }

    /// Writes this node's status.
    pub async fn publish_status(
        &self,
        node_id: &str,
        status: &serde_json::Value,
    ) -> Result<(), CoordError> {
        self.0.publish_status(node_id, status).await
    }

    /// Every node's status.
    pub async fn statuses(&self) -> Result<BTreeMap<String, serde_json::Value>, CoordError> {
        self.0.statuses().await
    }
}

/// The operators' tokens bucket ([`Coord::create_token`],
/// [`Coord::revoke_token`], [`Coord::tokens`], [`Coord::watch_tokens`]).
#[derive(Clone)]
pub struct TokenRecords(Coord);

impl TokenRecords {
    /// Creates token `id` (create-only).
    pub async fn create_token(&self, id: &str, rec: &TokenRecord) -> Reply<u64, TokenRecord> {
        self.0.create_token(id, rec).await
    }

    /// Revokes token `id` at `at_ms`.
    pub async fn revoke_token(&self, id: &str, at_ms: u64) -> Reply<TokenRecord, ()> {
        self.0.revoke_token(id, at_ms).await
    }

    /// Every token.
    pub async fn tokens(&self) -> Result<BTreeMap<String, TokenRecord>, CoordError> {
        self.0.tokens().await
    }

    /// Every token now, then every change.
    pub async fn watch_tokens(&self) -> Result<TokenWatch, CoordError> {
        self.0.watch_tokens().await
    }
}

/// A delivery's claim, once fleet-wide ([`Coord::claim_delivery`],
/// [`Coord::release_claim`]): what the webhook edge holds.
#[derive(Clone)]
pub struct Deliveries(Coord);

impl Deliveries {
    /// Claims `delivery` for `claimant` for `ttl`.
    pub async fn claim_delivery(
        &self,
        delivery: &str,
        claimant: &str,
        ttl: Duration,
    ) -> Reply<(), Claimed> {
        self.0.claim_delivery(delivery, claimant, ttl).await
    }

    /// Releases `claimant`'s claim on `delivery`.
    pub async fn release_claim(&self, delivery: &str, claimant: &str) -> Reply<(), Unreleased> {
        self.0.release_claim(delivery, claimant).await
    }
}

/// The rate valve ([`Coord::admit`]): fails closed.
#[derive(Clone)]
pub struct Valve(Coord);

impl Valve {
    /// Admits one more of `scope` if fewer than `limit` passed in `window`.
    pub async fn admit(
        &self,
        scope: &str,
        limit: u64,
        window: Duration,
    ) -> Reply<RateVerdict, RateVerdict> {
        self.0.admit(scope, limit, window).await
    }
}

/// The plain records of one bucket ([`Coord::get_record`] and its kin,
/// the bucket fixed): the mailboxes' records for the stream.
#[derive(Clone)]
pub struct Records {
    coord: Coord,
    bucket: Bucket,
}

impl Records {
    /// Reads `class:id`.
    pub async fn get_record(&self, class: &str, id: &str) -> Reply<(serde_json::Value, u64), ()> {
        self.coord.get_record(self.bucket, class, id).await
    }

    /// Creates `class:id`.
    pub async fn create_record(
        &self,
        class: &str,
        id: &str,
        value: &serde_json::Value,
    ) -> Reply<u64, serde_json::Value> {
        self.coord
            .create_record(self.bucket, class, id, value)
            .await
    }

    /// Replaces `class:id` at `revision`.
    pub async fn replace_record(
        &self,
        class: &str,
        id: &str,
        value: &serde_json::Value,
        revision: u64,
    ) -> Reply<u64, ()> {
        self.coord
            .replace_record(self.bucket, class, id, value, revision)
            .await
    }

    /// Every live record of `class`, with its revision.
    pub async fn list_records_with_revisions(
        &self,
        class: &str,
    ) -> Result<BTreeMap<String, (serde_json::Value, u64)>, CoordError> {
        self.coord
            .list_records_with_revisions(self.bucket, class)
            .await
    }
}

/// The fires bucket's typed records ([`Coord::claims`] on
/// [`Bucket::Fires`]): the scheduler's fire claims and cursors, nothing of
/// any other bucket.
#[derive(Clone)]
pub struct Fires(Coord);

impl Fires {
    /// The records of `class` in the fires bucket, typed as `R`.
    pub fn claims<R: Serialize + DeserializeOwned>(&self, class: &str) -> Claims<R> {
        self.0.claims(Bucket::Fires, class)
    }
}

/// The maintenance duty's share of the stores: the removal-marker sweep
/// ([`Coord::sweep_markers_older_than`]) and the config pointer read, never
/// moved ([`Coord::active_config`]).
#[derive(Clone)]
pub struct Upkeep(Coord);

impl Upkeep {
    /// Purges removal markers older than `age` from every ageless bucket.
    pub async fn sweep_markers_older_than(&self, age: Duration) -> SweepReport {
        self.0.sweep_markers_older_than(age).await
    }

    /// What the pointer names now.
    pub async fn active_config(&self) -> Result<Pointer, CoordError> {
        self.0.active_config().await
    }
}
