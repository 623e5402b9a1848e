//! Seat ownership: placement, leases, acquire then equip then attach,
//! release in reverse.
//!
//! [`Seats`] decides which seats of the active company this node runs and
//! drives a [`SeatHost`] that knows what running one means:
//!
//! - **Placement** ([`placement`]), every heartbeat, whenever the company
//!   changes and whenever a peer says it gave a seat back: each node claims
//!   up to its fair share per placement group, gives back what is over it,
//!   and gives back seats the company dropped. A node that releases a lease
//!   tells the fleet at once (a core publish), so a peer with room claims
//!   it within milliseconds rather than on its next tick.
//!   A seat another node holds is skipped; an unknown answer is neither
//!   held nor free — it is asked again on the next tick. A group the
//!   company pins to node labels is shared only among the nodes whose
//!   labels match, and the previous holder (the epochs bucket) orders
//!   which seats a node claims and gives back first (`tick.rs`).
//! - **A held seat** (`seat.rs`): acquire → equip → hydrate (the host
//!   brings the seat's memory; unreadable: the mailbox waits, asked again
//!   with backoff) → attach, release in reverse; the lease is renewed
//!   once a seat beat (half the TTL) and judged by the holder's two clocks
//!   (stop admitting early, give up late). A failed equip backs off (doubling), unless the host's
//!   `retry_equip` moves after that equip began (a secret became known):
//!   then the seat is claimed on the tick the move starts.
//! - **The mailbox** (`mailbox.rs`): the seat's durable pull consumer,
//!   fetched only while admitting, wakes grouped per conversation, turns
//!   under a node-wide limit, every wake settled by the turn's verdict; a
//!   parked seat (`park.rs`) takes nothing until its budget has room.
//!
//! Why one crate drives all three: the ordering between lease, instance and
//! mailbox is the one behaviour none of the parts can express alone.

mod config;
pub mod host;
mod mailbox;
mod park;
pub mod pauses;
pub mod placement;
mod progress;
mod seat;
mod serving;
mod sweep;
mod tick;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::jetstream;
use crewlet_company::{ActiveCompany, Handle};
use crewlet_coord::{Admits, Fence, FenceEpoch, Owner, RenewGrid, ResourceName};
use futures::future::join_all;
use futures::{FutureExt, StreamExt};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use crate::config::{Pauses, SeatLeases, SeatsConfig, SeatsError, admits};
pub use crate::host::{Batch, Room, SeatHost, SeatSpec, TurnVerdict};
pub use crate::pauses::{PauseError, PauseMirror, SeatPauses};

use crate::mailbox::Pace;

/// The previous holders of every seat, as one read answered them.
type Previous = Arc<BTreeMap<Handle, placement::Tenures>>;

/// How many acquires one placement tick sends at once.
const ACQUIRE_WAVE: usize = 16;

/// A seat this node holds and serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSeat {
    pub handle: Handle,
    pub state: SeatState,
    /// The lease's fencing epoch.
    pub epoch: FenceEpoch,
    /// When the lease was won.
    pub since: SystemTime,
}

/// Whether a held seat takes new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatState {
    /// Renewed within a seat beat: fetching and starting turns.
    Admitting,
    /// Last good renew older than a seat beat: running turns finish,
    /// nothing new is fetched.
    Stale,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Equipping,
    Serving,
    Releasing,
}

struct Slot {
    generation: u64,
    spec: Arc<SeatSpec>,
    /// Changed only through [`Shared::move_to`], which keeps the count of
    /// serving seats.
    phase: Phase,
    epoch: FenceEpoch,
    since: SystemTime,
    fence: Fence,
    release: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

struct Backoff {
    until: Instant,
    next: Duration,
    /// [`SeatsConfig::retry_equip`] when the failed equip began: once it
    /// has moved, the backoff no longer holds the seat back.
    seen: u64,
}

pub(crate) struct Shared<H: SeatHost> {
    node_id: String,
    /// This node's `[node] labels`, matched against the company's pins.
    labels: placement::Labels,
    owner: Owner,
    pub(crate) leases: SeatLeases,
    pub(crate) js: jetstream::Context,
    pub(crate) active: ActiveCompany,
    pub(crate) host: Arc<H>,
    pub(crate) heartbeat: Duration,
    /// When this node's seat renews are sent ([`RenewGrid`]).
    pub(crate) renew_grid: RenewGrid,
    pub(crate) pace: Pace,
    equip_backoff: Duration,
    pub(crate) equip_timeout: Duration,
    pub(crate) unequip_timeout: Duration,
    pub(crate) turns: Arc<Semaphore>,
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) admission: watch::Receiver<bool>,
    pub(crate) pauses: watch::Receiver<Option<Pauses>>,
    pub(crate) retry_equip: watch::Receiver<u64>,
    /// What the mailboxes' last sweep found ([`sweep`]).
    pub(crate) swept: watch::Receiver<Arc<sweep::Swept>>,
    slots: Mutex<BTreeMap<Handle, Slot>>,
    backoff: Mutex<BTreeMap<Handle, Backoff>>,
    /// How many slots are [`Phase::Serving`]; changed under the slots lock.
    serving: serving::Serving,
    generations: AtomicU64,
    /// The last read of the previous holders, and when it was made.
    tenures: Mutex<Option<(Instant, Previous)>>,
}

/// Seat ownership on one node. Stop it with [`Seats::stop`].
///
/// Dropping it without [`Seats::stop`] stops claiming and gives every seat
/// back in the background, in the same order, without waiting.
pub struct Seats<H: SeatHost> {
    shared: Arc<Shared<H>>,
    stop: watch::Sender<bool>,
    placement: Option<JoinHandle<()>>,
    sweeper: Option<JoinHandle<()>>,
}

impl<H: SeatHost> Drop for Seats<H> {
    fn drop(&mut self) {
        // The placement loop gives every seat back as it ends.
        let _ = self.stop.send(true);
    }
}

impl<H: SeatHost> Seats<H> {
    /// Starts the placement loop (its first tick runs at once). Call it
    /// inside a tokio runtime; every task it starts lives on that runtime.
    pub fn start(cfg: SeatsConfig<H>) -> Result<Seats<H>, SeatsError> {
        if cfg.max_concurrent_turns == 0 {
            return Err(SeatsError::NoTurns);
        }
        if cfg.max_outstanding == 0 {
            return Err(SeatsError::NoOutstanding);
        }
        for (name, value) in [
            ("fetch_expiry", cfg.fetch_expiry),
            ("idle_fetch", cfg.idle_fetch),
            ("equip_backoff", cfg.equip_backoff),
            ("equip_timeout", cfg.equip_timeout),
            ("unequip_timeout", cfg.unequip_timeout),
        ] {
            if value.is_zero() {
                return Err(SeatsError::ZeroDuration { name, value });
            }
        }
        if let Some(d) = cfg.drain_bound.filter(|d| d.is_zero()) {
            return Err(SeatsError::ZeroDuration {
                name: "drain_bound",
                value: d,
            });
        }
        ResourceName::node(&cfg.node_id).map_err(|e| SeatsError::NodeId(e.to_string()))?;
        let heartbeat = cfg.leases.seats.heartbeat();
        let ttl = cfg.leases.seats.lease_ttl();
        let (swept_tx, swept_rx) = watch::channel(Arc::new(sweep::Swept::Nothing));
        let shared = Arc::new(Shared {
            node_id: cfg.node_id,
            labels: cfg.labels,
            owner: cfg.owner,
            leases: cfg.leases,
            js: cfg.js,
            active: cfg.active,
            host: cfg.host,
            heartbeat,
            renew_grid: RenewGrid::new(tokio::time::Instant::now()),
            pace: Pace {
                batch_window: cfg.batch_window,
                fetch_expiry: cfg.fetch_expiry,
                drain_bound: cfg.drain_bound.unwrap_or(ttl),
                max_outstanding: cfg.max_outstanding,
                retry_without_company: heartbeat,
            },
            equip_backoff: cfg.equip_backoff,
            equip_timeout: cfg.equip_timeout,
            unequip_timeout: cfg.unequip_timeout,
            turns: Arc::new(Semaphore::new(cfg.max_concurrent_turns)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            admission: cfg.admission,
            pauses: cfg.pauses,
            retry_equip: cfg.retry_equip,
            swept: swept_rx,
            slots: Mutex::new(BTreeMap::new()),
            backoff: Mutex::new(BTreeMap::new()),
            serving: serving::Serving::new(),
            generations: AtomicU64::new(0),
            tenures: Mutex::new(None),
        });
        let (stop, stop_rx) = watch::channel(false);
        let sweeper = tokio::spawn(sweep::sweep_loop(
            shared.js.clone(),
            cfg.idle_fetch,
            swept_tx,
            stop_rx.clone(),
        ));
        let placement = tokio::spawn(placement_loop(shared.clone(), stop_rx));
        Ok(Seats {
            shared,
            stop,
            placement: Some(placement),
            sweeper: Some(sweeper),
        })
    }

    /// The seats this node holds and serves (attached mailbox), by handle.
    pub fn held(&self) -> Vec<HeldSeat> {
        let slots = self.shared.slots.lock().expect("seat slots");
        slots
            .iter()
            .filter(|(_, s)| s.phase == Phase::Serving)
            .filter_map(|(h, s)| {
                let state = match s.fence.admits() {
                    Admits::Yes => SeatState::Admitting,
                    Admits::Unknown => SeatState::Stale,
                    Admits::No => return None,
                };
                Some(HeldSeat {
                    handle: h.clone(),
                    state,
                    epoch: s.epoch,
                    since: s.since,
                })
            })
            .collect()
    }

    /// How many seats are served now, kept current (for the node's status).
    pub fn watch_held(&self) -> watch::Receiver<usize> {
        self.shared.serving.watch()
    }

    /// Turns running now on this node (all seats).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Stops claiming, then gives every seat back in reverse order of how it
    /// was taken: detach its mailbox (running turns finish within the drain
    /// bound), unequip, release the lease. Returns when all are released.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(p) = self.placement.take() {
            let _ = p.await;
        }
        if let Some(s) = self.sweeper.take() {
            let _ = s.await;
        }
        let tasks: Vec<JoinHandle<()>> = {
            let mut slots = self.shared.slots.lock().expect("seat slots");
            slots
                .values_mut()
                .filter_map(|s| {
                    self.shared.move_to(s, Phase::Releasing);
                    let _ = s.release.send(true);
                    s.task.take()
                })
                .collect()
        };
        info!(
            subsystem = "seats",
            seats = tasks.len(),
            "giving every seat back"
        );
        for r in join_all(tasks).await {
            if let Err(e) = r {
                warn!(subsystem = "seats", error = %e, "a seat task failed while stopping");
            }
        }
        self.shared.update_held();
    }
}

impl<H: SeatHost> Shared<H> {
    /// Moves `slot` to `phase`, keeping the serving count. Call with the
    /// slots lock held. Why a count: a scan per change was quadratic —
    /// 10,000 seats attaching scanned 10,000 slots each.
    pub(crate) fn move_to(&self, slot: &mut Slot, phase: Phase) {
        match (slot.phase == Phase::Serving, phase == Phase::Serving) {
            (false, true) => {
                self.serving.up();
            }
            (true, false) => {
                self.serving.down();
            }
            _ => {}
        }
        slot.phase = phase;
    }

    fn update_held(&self) {
        self.serving.publish();
    }

    pub(crate) fn set_phase(&self, handle: &Handle, generation: u64, phase: Phase) {
        {
            let mut slots = self.slots.lock().expect("seat slots");
            if let Some(s) = slots.get_mut(handle).filter(|s| s.generation == generation)
                && s.phase != Phase::Releasing
            {
                self.move_to(s, phase);
            }
        }
        self.update_held();
    }

    pub(crate) fn remove_slot(&self, handle: &Handle, generation: u64) {
        {
            let mut slots = self.slots.lock().expect("seat slots");
            if let Some(s) = slots.get_mut(handle).filter(|s| s.generation == generation) {
                self.move_to(s, Phase::Releasing);
                slots.remove(handle);
            }
        }
        self.update_held();
    }

    /// Holds `handle` back after a failed equip that began when
    /// [`SeatsConfig::retry_equip`] read `seen`.
    pub(crate) fn back_off(&self, handle: &Handle, seen: u64) {
        let mut b = self.backoff.lock().expect("seat backoff");
        let base = self.equip_backoff;
        let wait = b.get(handle).map_or(base, |prev| prev.next);
        b.insert(
            handle.clone(),
            Backoff {
                until: Instant::now() + wait,
                next: (wait * 2).min(base * 64),
                seen,
            },
        );
    }

    /// Whether a backoff still holds its seat back at `now`.
    fn holds_back(&self, b: &Backoff, now: Instant) -> bool {
        b.until > now && b.seen == *self.retry_equip.borrow()
    }

    pub(crate) fn clear_backoff(&self, handle: &Handle) {
        self.backoff.lock().expect("seat backoff").remove(handle);
    }

    /// Asks a held seat to be given back (no-op if already on its way).
    fn request_release(&self, handle: &Handle, why: &str) {
        let mut slots = self.slots.lock().expect("seat slots");
        if let Some(s) = slots.get_mut(handle)
            && s.phase != Phase::Releasing
        {
            info!(subsystem = "seats", seat = %handle, why, "giving the seat back");
            self.move_to(s, Phase::Releasing);
            let _ = s.release.send(true);
        }
        drop(slots);
        self.update_held();
    }

    /// Tells the fleet a seat's lease was given back. A hint: lost, it
    /// costs a peer one heartbeat.
    pub(crate) async fn announce_release(&self, handle: &Handle) {
        let client = self.js.client();
        let said = client
            .publish(
                crewlet_bus::SEAT_RELEASED_SUBJECT,
                handle.as_str().to_owned().into(),
            )
            .await;
        if let Err(e) = said {
            debug!(subsystem = "seats", seat = %handle, error = %e, "could not announce the release; peers claim on their next tick");
        }
    }
}

async fn placement_loop<H: SeatHost>(shared: Arc<Shared<H>>, mut stop: watch::Receiver<bool>) {
    let mut company = shared.active.subscribe();
    let mut released = releases(&shared).await;
    let mut retry_equip = Some(shared.retry_equip.clone());
    loop {
        shared.tick().await;
        tokio::select! {
            _ = tokio::time::sleep(shared.heartbeat) => {}
            _ = next_retry(&mut retry_equip) => {
                debug!(subsystem = "seats", "what a failed equip lacked may be there now; seats backing off are claimed again");
            }
            _ = next_release(&mut released) => {
                // One tick for every release that came meanwhile.
                while let Some(Some(_)) = released.as_mut().map(|r| r.next().now_or_never()) {}
            }
            r = company.changed() => {
                if r.is_err() {
                    // The company handle is gone: tick on the heartbeat only.
                    tokio::time::sleep(shared.heartbeat).await;
                }
            }
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
    }
    // Claiming has stopped: nothing this node holds is kept any longer.
    let held: Vec<Handle> = shared
        .slots
        .lock()
        .expect("seat slots")
        .keys()
        .cloned()
        .collect();
    for h in &held {
        shared.request_release(h, "seat ownership is stopping");
    }
}

/// The fleet's release announcements; `None` (ticks on the heartbeat only)
/// when the subscription cannot be made.
async fn releases<H: SeatHost>(shared: &Shared<H>) -> Option<async_nats::Subscriber> {
    match shared
        .js
        .client()
        .subscribe(crewlet_bus::SEAT_RELEASED_SUBJECT)
        .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(subsystem = "seats", error = %e, "cannot hear peers' seat releases; claiming on the heartbeat only");
            None
        }
    }
}

/// The next move of [`SeatsConfig::retry_equip`]; never once its sender
/// is gone.
async fn next_retry(retry: &mut Option<watch::Receiver<u64>>) {
    match retry {
        Some(r) => {
            if r.changed().await.is_err() {
                *retry = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// The next announcement; never, without a subscription (or once it ends).
async fn next_release(released: &mut Option<async_nats::Subscriber>) {
    match released {
        Some(s) => {
            if s.next().await.is_none() {
                *released = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}
