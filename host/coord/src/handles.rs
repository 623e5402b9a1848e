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

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::answer::{CoordError, Reply};
use crate::bucket::Bucket;
use crate::budget::{BudgetView, Caps, Charged, Refusal, Scope, Windows};
use crate::lease::{Held, Lease, Owner, Tenures};
use crate::names::ResourceName;
use crate::records::SeatPauses;
use crate::tenancy::{RenewGrid, Tenancy, Terms};
use crate::typed::Claims;
use crate::Coord;

impl Coord {
    /// The budget windows, for what a turn spends.
    pub fn budgets(&self) -> Budgets {
        Budgets(self.clone())
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
    pub async fn get_record(
        &self,
        class: &str,
        id: &str,
    ) -> Reply<(serde_json::Value, u64), ()> {
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
