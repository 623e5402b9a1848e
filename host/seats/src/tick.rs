//! One placement tick, and claiming a seat it chose.
//!
//! Rule: the tick reads the table ([`crate::placement`]'s inputs: live seat
//! nodes with their labels, the company's seats and pins, what this node
//! holds) and acts on the plan: gives back the surplus, then claims up to
//! the room in waves. The previous holders (the epochs bucket) are read
//! only when the plan holds a choice they could change, so a fleet at its
//! shares reads nothing more than membership. Why a module of its own: the
//! plan is pure and tested alone; this is the part that reads and writes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crewlet_company::Handle;
use crewlet_coord::{Answer, CoordError, ResourceName, Tenancy};
use futures::future::join_all;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::host::{SeatHost, SeatSpec};
use crate::placement::{self, Group, Inputs, Labels, Tenures, Wanted};
use crate::{ACQUIRE_WAVE, Phase, Shared, Slot, seat};

impl<H: SeatHost> Shared<H> {
    /// Live nodes that run seats and do not say they drain, with their
    /// labels, this one included (with its own); `Err` is unknown. A peer
    /// whose `draining` is not reported (an older build) counts as live:
    /// such a build left placement by dropping its presence.
    async fn live_seat_nodes(&self) -> Result<BTreeMap<String, Labels>, CoordError> {
        let mut nodes: BTreeMap<String, Labels> = self
            .leases
            .nodes
            .live()
            .await?
            .into_iter()
            .filter_map(|l| {
                let s = l.status?;
                (s.roles.iter().any(|r| r == "seats") && !s.says_draining())
                    .then(|| (l.name.id().to_owned(), s.labels))
            })
            .collect();
        nodes.insert(self.node_id.clone(), self.labels.clone());
        Ok(nodes)
    }

    /// Who held each seat's last two tenures, by node: a read up to a
    /// heartbeat old when `fresh` is false. Empty (no preference) when the
    /// epochs cannot be read — they order, never gate.
    async fn tenures(&self, fresh: bool) -> Arc<BTreeMap<Handle, Tenures>> {
        if !fresh
            && let Some((at, t)) = &*self.tenures.lock().expect("tenures cache")
            && at.elapsed() < self.heartbeat
        {
            return t.clone();
        }
        let read = match self.leases.seats.tenures().await {
            Ok(all) => all,
            Err(e) => {
                debug!(subsystem = "seats", error = %e,
                    "previous holders unknown; placing by rank alone this tick");
                return Arc::default();
            }
        };
        let by_node: Arc<BTreeMap<Handle, Tenures>> = Arc::new(
            read.into_iter()
                .filter_map(|(id, t)| {
                    let tenures = Tenures {
                        last: Some(t.last.node().to_owned()),
                        before: t.before.as_ref().map(|o| o.node().to_owned()),
                    };
                    Some((Handle::parse(&id).ok()?, tenures))
                })
                .collect(),
        );
        *self.tenures.lock().expect("tenures cache") = Some((Instant::now(), by_node.clone()));
        by_node
    }

    /// One placement tick.
    pub(crate) async fn tick(self: &Arc<Self>) {
        let active = self.active.current();
        let seats: BTreeMap<Handle, Group> = active
            .as_ref()
            .map(|a| {
                a.company
                    .seats
                    .values()
                    .map(|s| (s.handle.clone(), s.group.clone()))
                    .collect()
            })
            .unwrap_or_default();
        // Seats the company dropped, or whose seat changed under us (new
        // role or id): give them back; the changed ones are claimed afresh.
        let stale: Vec<Handle> = {
            let slots = self.slots.lock().expect("seat slots");
            slots
                .iter()
                .filter(|(_, s)| s.phase != Phase::Releasing)
                .filter(|(h, s)| {
                    let now = active.as_ref().and_then(|a| SeatSpec::of(a, h));
                    now.is_none_or(|n| n.role != s.spec.role || n.seat_id != s.spec.seat_id)
                })
                .map(|(h, _)| h.clone())
                .collect()
        };
        for h in &stale {
            self.request_release(h, "the seat left the company or changed");
        }
        let Some(active) = active else {
            return;
        };
        let nodes = match self.live_seat_nodes().await {
            Ok(n) => n,
            Err(e) => {
                debug!(subsystem = "seats", error = %e,
                    "fleet membership unknown; neither claiming nor giving back this tick");
                return;
            }
        };
        let (holding, acquired, unavailable) = {
            let slots = self.slots.lock().expect("seat slots");
            let acquired: BTreeMap<Handle, u64> = slots
                .iter()
                .filter(|(_, s)| s.phase != Phase::Releasing)
                .map(|(h, s)| (h.clone(), s.generation))
                .collect();
            let holding: BTreeSet<Handle> = acquired.keys().cloned().collect();
            let mut unavailable: BTreeSet<Handle> = slots.keys().cloned().collect();
            let now = Instant::now();
            let backoff = self.backoff.lock().expect("seat backoff");
            unavailable.extend(
                backoff
                    .iter()
                    .filter(|(_, b)| self.holds_back(b, now))
                    .map(|(h, _)| h.clone()),
            );
            (holding, acquired, unavailable)
        };
        let pins: BTreeMap<String, Labels> = active
            .company
            .placement
            .iter()
            .map(|(name, g)| (name.clone(), g.labels.clone()))
            .collect();
        let mut inputs = Inputs {
            node_id: &self.node_id,
            nodes: &nodes,
            own_labels: &self.labels,
            seats: &seats,
            pins: &pins,
            holding: &holding,
            acquired: &acquired,
            unavailable: &unavailable,
            tenures: &BTreeMap::new(),
        };
        let mut plan = placement::plan(&inputs);
        let tenures;
        let wanted = plan.wants_tenures();
        if wanted != Wanted::No {
            tenures = self.tenures(wanted == Wanted::Fresh).await;
            inputs.tenures = &*tenures;
            plan = placement::plan(&inputs);
        }
        for g in &plan.groups {
            let pinned_away =
                g.share == 0 && g.group.as_ref().is_some_and(|n| pins.contains_key(n));
            let why = if pinned_away {
                "its placement group is pinned to labels this node does not carry"
            } else {
                "over this node's share of its placement group"
            };
            for h in &g.surplus {
                self.request_release(h, why);
            }
        }
        for g in plan.groups.iter().filter(|g| g.room > 0) {
            let mut room = g.room;
            let mut candidates = g.candidates.iter();
            while room > 0 {
                let wave: Vec<&Handle> = candidates.by_ref().take(room.min(ACQUIRE_WAVE)).collect();
                if wave.is_empty() {
                    break;
                }
                let answers = join_all(wave.iter().map(|h| self.try_claim(&active, h))).await;
                room -= answers.into_iter().filter(|won| *won).count();
            }
        }
    }

    /// Acquires one seat and, if won, starts it. True if won.
    async fn try_claim(
        self: &Arc<Self>,
        active: &crewlet_company::Active,
        handle: &Handle,
    ) -> bool {
        let Some(spec) = SeatSpec::of(active, handle) else {
            return false;
        };
        let name = match ResourceName::seat(handle.as_str()) {
            Ok(n) => n,
            Err(e) => {
                warn!(subsystem = "seats", seat = %handle, error = %e, "seat has no lease name");
                return false;
            }
        };
        let terms = self.leases.seats.seat_terms(self.renew_grid);
        match self
            .leases
            .seats
            .acquire(&name, &self.owner, None, terms)
            .await
        {
            Ok(Answer::Yes(tenancy)) => {
                self.spawn_seat(Arc::new(spec), tenancy);
                true
            }
            Ok(Answer::No(held)) => {
                debug!(subsystem = "seats", seat = %handle, ?held, "seat held elsewhere");
                false
            }
            Err(e) => {
                debug!(subsystem = "seats", seat = %handle, error = %e,
                    "acquire answered unknown; asking again next tick");
                false
            }
        }
    }

    fn spawn_seat(self: &Arc<Self>, spec: Arc<SeatSpec>, tenancy: Tenancy) {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let fence = tenancy.fence().clone();
        let (release, release_rx) = watch::channel(false);
        let handle = spec.handle.clone();
        info!(subsystem = "seats", seat = %handle, epoch = %fence.epoch(), "seat acquired");
        let mut slots = self.slots.lock().expect("seat slots");
        let task = tokio::spawn(seat::run(
            self.clone(),
            spec.clone(),
            tenancy,
            generation,
            release_rx,
        ));
        let replaced = slots.insert(
            handle,
            Slot {
                generation,
                spec,
                phase: Phase::Equipping,
                epoch: fence.epoch(),
                since: fence.since(),
                fence,
                release,
                task: Some(task),
            },
        );
        // A slot still on its way out is not counted as serving any more.
        if let Some(mut old) = replaced {
            self.move_to(&mut old, Phase::Releasing);
        }
    }
}
