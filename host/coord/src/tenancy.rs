//! Holding a lease: the one acquire → renew → hold → release, used by
//! presence, the duties and the seats.
//!
//! Rule: a won lease is held by a [`Tenancy`]. A task of its own renews it
//! on its [`Cadence`], and every "may I still act?" is asked of its
//! [`Fence`], which answers from the holder's own clock ([`Admits`]): yes
//! until the "admit until" deadline (the last good renew plus a beat),
//! unknown after it (finish what runs, start nothing new), no after the TTL,
//! on the store's definite no, or once the tenure is released. An unknown
//! renew changes nothing; a no is final — the renewing stops, and a new
//! tenure starts with a new acquire. [`Tenancy::release`] gives the lease
//! back (the fence says no first); a tenancy dropped without it stops
//! renewing and lapses at its TTL, so no path leaves a lease renewed by
//! nobody's decision.
//! Why one: the loop was written three times with five names for the same
//! answer, and the copies drifted in what an unknown renew or a lost one
//! did; the holder's clock is counted from when a good renew was *sent*
//! ([`crate::holder`]), so network delay only makes it earlier.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, warn};

use crate::Coord;
use crate::answer::{Answer, CoordError, Reply};
use crate::epoch::FenceEpoch;
use crate::holder::{Admits, Holder};
use crate::lease::{Held, Lease, NodeStatus, NotHeld, Owner};
use crate::names::ResourceName;

/// When a held lease is renewed.
#[derive(Debug, Clone, Copy)]
pub enum Cadence {
    /// Half a beat after the last good renew, and every quarter beat while
    /// the answer is unknown; never more often than every 50 ms. Presence
    /// (a beat of one heartbeat) and the duties (a third of the TTL).
    HalfBeat,
    /// The seats': once every [`renew_every`] of the beat, moved onto the
    /// node's [`RenewGrid`] so the renews due together leave together; an
    /// unknown answer asked again after `retry`; a renew unanswered after
    /// `patience` is unknown.
    Grid {
        grid: RenewGrid,
        retry: Duration,
        patience: Duration,
    },
}

/// What every acquire and renew of a tenancy carries (presence: the
/// node's status, asked afresh each time).
pub type StatusFn = Arc<dyn Fn() -> NodeStatus + Send + Sync>;

/// What a tenancy is held with.
#[derive(Clone)]
pub struct Terms {
    /// How long after a good renew the holder still admits work.
    pub beat: Duration,
    pub cadence: Cadence,
    pub status: Option<StatusFn>,
    /// The subsystem the tenancy's log lines name.
    pub subsystem: &'static str,
}

impl Terms {
    /// A node's presence: admits for a heartbeat, renewed every half,
    /// carrying `status`.
    pub fn presence(coord: &Coord, status: StatusFn) -> Terms {
        Terms {
            beat: coord.heartbeat(),
            cadence: Cadence::HalfBeat,
            status: Some(status),
            subsystem: "presence",
        }
    }

    /// A duty on a lease of `ttl`: admits for a third of it, renewed every
    /// sixth.
    pub fn duty(ttl: Duration) -> Terms {
        Terms {
            beat: ttl / 3,
            cadence: Cadence::HalfBeat,
            status: None,
            subsystem: "duties",
        }
    }

    /// A seat: admits for a seat beat ([`Coord::seat_beat`]), renewed on
    /// the node's `grid`; an unknown asked again after a tenth of a
    /// heartbeat, a renew waited on for at most half of one.
    pub fn seat(coord: &Coord, grid: RenewGrid) -> Terms {
        let heartbeat = coord.heartbeat();
        Terms {
            beat: coord.seat_beat(),
            cadence: Cadence::Grid {
                grid,
                retry: renew_retry(heartbeat),
                patience: (heartbeat / 2).max(Duration::from_millis(10)),
            },
            status: None,
            subsystem: "seats",
        }
    }
}

/// How often a seat lease is renewed: once a beat, early by a margin for
/// the round trip (a tenth of the beat, at least a second and at most half
/// of it), so a holder whose renews are answered stays admitting even on a
/// loaded machine.
///
/// Why not every half beat, as presence and duties are: a node renews one
/// presence but every seat it holds. 10,000 idle seats renewed every
/// 7.5 s were 1,333 writes a second, most of the 10 % of a core that node
/// and nats-server spent doing nothing. An unknown answer is asked again
/// soon ([`renew_retry`]), so one lost reply does not leave a healthy seat
/// stale for a whole period.
pub fn renew_every(beat: Duration) -> Duration {
    let margin = (beat / 10).max(Duration::from_secs(1)).min(beat / 2);
    beat.saturating_sub(margin).max(Duration::from_millis(10))
}

/// How soon a seat renew that answered unknown is sent again.
pub fn renew_retry(heartbeat: Duration) -> Duration {
    (heartbeat / 10).max(Duration::from_millis(10))
}

/// The instants a node's seat renews are sent on: multiples of a tick from
/// one anchor, so the renews due within a tick leave together.
///
/// Why: each seat renews on its own timer, and 10,000 seats spread evenly
/// were 500 lone writes a second, each its own syscall and wake-up on both
/// sides of the connection. Sent in a burst per tick they share the writes
/// and the server's reads. A renew is only ever moved earlier, by less
/// than a tick.
#[derive(Debug, Clone, Copy)]
pub struct RenewGrid {
    anchor: tokio::time::Instant,
}

impl RenewGrid {
    pub fn new(anchor: tokio::time::Instant) -> RenewGrid {
        RenewGrid { anchor }
    }

    /// `t` moved back onto the grid whose tick is a tenth of `every`, at
    /// most a second.
    pub fn floor(&self, t: tokio::time::Instant, every: Duration) -> tokio::time::Instant {
        let tick = (every / 10).min(Duration::from_secs(1));
        if tick.is_zero() || t <= self.anchor {
            return t;
        }
        let since = (t - self.anchor).as_nanos();
        let back = since % tick.as_nanos();
        t - Duration::from_nanos(back as u64)
    }
}

/// A tenure's answer to "may I still act?", shared by everything that acts
/// under it (a seat's turns, a duty's work loop). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Fence {
    inner: Arc<FenceInner>,
}

#[derive(Debug)]
struct FenceInner {
    holder: Mutex<Holder>,
    epoch: FenceEpoch,
    since: SystemTime,
    released: AtomicBool,
}

impl Fence {
    fn new(holder: Holder, epoch: FenceEpoch) -> Fence {
        Fence {
            inner: Arc::new(FenceInner {
                holder: Mutex::new(holder),
                epoch,
                since: SystemTime::now(),
                released: AtomicBool::new(false),
            }),
        }
    }

    /// The answer now.
    pub fn admits(&self) -> Admits {
        self.admits_at(Instant::now())
    }

    /// The answer at `now`.
    pub fn admits_at(&self, now: Instant) -> Admits {
        if self.inner.released.load(Ordering::Acquire) {
            return Admits::No;
        }
        self.holder().state(now)
    }

    /// The epoch to write with when work may start now; `None` when the
    /// answer is unknown or no.
    pub fn admitted(&self) -> Option<FenceEpoch> {
        (self.admits() == Admits::Yes).then_some(self.inner.epoch)
    }

    /// Until when work may start ("admit until"): the last good renew plus
    /// a beat; `None` once the answer is no for good.
    pub fn admit_until(&self) -> Option<Instant> {
        if self.inner.released.load(Ordering::Acquire) {
            return None;
        }
        self.holder().admit_until()
    }

    /// The tenure's fencing epoch: a write made under it carries it.
    pub fn epoch(&self) -> FenceEpoch {
        self.inner.epoch
    }

    /// When this node won the tenure (its wall clock).
    pub fn since(&self) -> SystemTime {
        self.inner.since
    }

    /// From now on the answer is no (the holder is giving the tenure up).
    pub fn close(&self) {
        self.inner.released.store(true, Ordering::Release);
    }

    fn holder(&self) -> std::sync::MutexGuard<'_, Holder> {
        self.inner.holder.lock().expect("fence holder")
    }
}

/// What a tenancy's watchers see: the answer, and why the last renew was
/// unknown (`None` after a good one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub admits: Admits,
    pub unknown: Option<String>,
}

/// How a release ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Given back: a peer may take it at once.
    Yes,
    /// Nothing here was ours to give back: the store had refused a renew
    /// (`None`), or the release found no tenure of ours (why).
    NotOurs(Option<NotHeld>),
    /// The store did not answer (in time): the lease lapses at its TTL.
    Unknown(String),
}

/// One held lease: renewed by its own task until released, dropped, or
/// given up.
pub struct Tenancy {
    coord: Coord,
    name: ResourceName,
    fence: Fence,
    standing: watch::Receiver<Standing>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Kept>,
}

/// What the renew task hands back: the lease as last renewed, and whether
/// the store said it is not ours.
struct Kept {
    lease: Lease,
    refused: bool,
}

impl Tenancy {
    /// Acquires `name` for `owner` and holds it on `terms`. `ttl` as in
    /// [`Coord::acquire`]. No: held by another (or contended); unknown: the
    /// error.
    pub async fn acquire(
        coord: &Coord,
        name: &ResourceName,
        owner: &Owner,
        ttl: Option<Duration>,
        terms: Terms,
    ) -> Reply<Tenancy, Held> {
        let sent = Instant::now();
        let status = terms.status.as_ref().map(|s| s());
        Ok(match coord.acquire_with(name, owner, ttl, status).await? {
            Answer::Yes(lease) => Answer::Yes(Tenancy::hold(coord.clone(), lease, sent, terms)),
            Answer::No(held) => Answer::No(held),
        })
    }

    /// Holds `lease`, won by a request sent at `acquired_at`.
    pub fn hold(coord: Coord, lease: Lease, acquired_at: Instant, terms: Terms) -> Tenancy {
        let holder = Holder::new(acquired_at, terms.beat, lease.ttl);
        let fence = Fence::new(holder, lease.epoch);
        let (tx, standing) = watch::channel(Standing {
            admits: fence.admits(),
            unknown: None,
        });
        let (stop, stop_rx) = watch::channel(false);
        let name = lease.name.clone();
        let task = tokio::spawn(
            renew(coord.clone(), lease, fence.clone(), terms, tx, stop_rx).in_current_span(),
        );
        Tenancy {
            coord,
            name,
            fence,
            standing,
            stop,
            task,
        }
    }

    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    pub fn epoch(&self) -> FenceEpoch {
        self.fence.epoch()
    }

    pub fn name(&self) -> &ResourceName {
        &self.name
    }

    /// The answer as it changes.
    pub fn standing(&self) -> watch::Receiver<Standing> {
        self.standing.clone()
    }

    /// Returns once the answer is no: lost, past its TTL, or closed.
    /// Cancellation-safe.
    pub async fn ended(&self) {
        let mut rx = self.standing.clone();
        let _ = rx.wait_for(|s| s.admits == Admits::No).await;
    }

    /// Gives the lease back: the fence says no first, then the renewing
    /// stops, then the lease is released (owner + epoch predicated) within
    /// `within`, when given.
    pub async fn release(self, within: Option<Duration>) -> Released {
        self.fence.close();
        let _ = self.stop.send(true);
        let kept = match self.task.await {
            Ok(k) => k,
            Err(e) => return Released::Unknown(format!("the renew task failed: {e}")),
        };
        if kept.refused {
            return Released::NotOurs(None);
        }
        let call = self.coord.release(&kept.lease);
        let answer = match within {
            Some(bound) => match tokio::time::timeout(bound, call).await {
                Ok(a) => a,
                Err(_) => return Released::Unknown(format!("no answer within {bound:?}")),
            },
            None => call.await,
        };
        match answer {
            Ok(Answer::Yes(())) => Released::Yes,
            Ok(Answer::No(why)) => Released::NotOurs(Some(why)),
            Err(e) => Released::Unknown(e.to_string()),
        }
    }
}

/// The one renew loop: renews on the cadence until stopped or the answer is
/// no, publishing every change of the answer (also the ones time alone
/// makes).
async fn renew(
    coord: Coord,
    mut lease: Lease,
    fence: Fence,
    terms: Terms,
    tx: watch::Sender<Standing>,
    mut stop: watch::Receiver<bool>,
) -> Kept {
    let subsystem = terms.subsystem;
    let floor = Duration::from_millis(50);
    let mut next = match terms.cadence {
        Cadence::HalfBeat => tokio::time::Instant::from_std(fence.holder().next_renew()),
        Cadence::Grid { grid, .. } => {
            let every = renew_every(terms.beat);
            grid.floor(tokio::time::Instant::now() + every, every)
        }
    };
    let mut refused = false;
    let mut unknown: Option<String> = None;
    loop {
        let now = Instant::now();
        let held = fence.holder().state(now);
        let admits = fence.admits_at(now);
        tx.send_if_modified(|s| {
            let changed = s.admits != admits || s.unknown != unknown;
            if changed {
                s.admits = admits;
                s.unknown = unknown.clone();
            }
            changed
        });
        if held == Admits::No {
            // Final: a new tenure is a new acquire.
            fence.close();
            break;
        }
        let change = fence.holder().next_change(now);
        let wake = change.map_or(next, |c| next.min(tokio::time::Instant::from_std(c)));
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
        }
        if tokio::time::Instant::now() < next {
            continue;
        }
        if let Cadence::Grid { grid, .. } = terms.cadence {
            let every = renew_every(terms.beat);
            next = grid.floor(tokio::time::Instant::now() + every, every);
        }
        let sent = Instant::now();
        let renewing = async {
            match &terms.status {
                Some(status) => coord.renew_presence(&lease, status()).await,
                None => coord.renew(&lease).await,
            }
        };
        let call = match terms.cadence {
            Cadence::Grid { patience, .. } => tokio::time::timeout(patience, renewing)
                .await
                .unwrap_or_else(|_| {
                    Err(CoordError::Unavailable(format!(
                        "renew took longer than {patience:?}"
                    )))
                }),
            Cadence::HalfBeat => renewing.await,
        };
        fence.holder().on_renew(sent, &call);
        match call {
            Ok(Answer::Yes(l)) => {
                lease = l;
                unknown = None;
            }
            Ok(Answer::No(why)) => {
                refused = true;
                warn!(subsystem, lease = %lease.name, epoch = %lease.epoch, ?why,
                    "the lease is no longer ours; giving it up");
            }
            Err(e) => {
                debug!(subsystem, lease = %lease.name, error = %e,
                    "lease renew answered unknown; holding on the holder's clock and asking again");
                if let Cadence::Grid { retry, .. } = terms.cadence {
                    next = tokio::time::Instant::now() + retry;
                }
                unknown = Some(e.to_string());
            }
        }
        if let Cadence::HalfBeat = terms.cadence {
            let now = Instant::now();
            let holder = fence.holder();
            let due = match holder.state(now) {
                Admits::Yes => holder.next_renew(),
                _ => now + terms.beat / 4,
            };
            drop(holder);
            next = tokio::time::Instant::from_std(due.max(now + floor));
        }
    }
    Kept { lease, refused }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seat_renews_once_a_beat_early_by_its_margin() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // A tenth early: the default seat beat (45 s TTL) and a 15 s one.
        assert_eq!(renew_every(ms(22_500)), ms(20_250));
        assert_eq!(renew_every(s(15)), ms(13_500));
        // Shorter ones keep a second for the round trip...
        assert_eq!(renew_every(s(5)), s(4));
        // ...and never renew later than half a beat early.
        assert_eq!(renew_every(s(1)), ms(500));
        assert_eq!(renew_every(ms(400)), ms(200));
        assert_eq!(renew_retry(s(15)), ms(1_500));
    }

    #[test]
    fn renews_due_within_a_tick_leave_together_and_never_later() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let anchor = tokio::time::Instant::now();
        let grid = RenewGrid::new(anchor);
        let every = ms(20_250);
        // A second's tick: 12.3 s and 12.9 s past the anchor both go at 12 s.
        assert_eq!(grid.floor(anchor + ms(12_300), every), anchor + s(12));
        assert_eq!(grid.floor(anchor + ms(12_900), every), anchor + s(12));
        assert_eq!(grid.floor(anchor + s(13), every), anchor + s(13));
        // A short beat gets a tenth of it: 250 ms → 25 ms ticks.
        assert_eq!(grid.floor(anchor + ms(1_010), ms(250)), anchor + ms(1_000));
        // Nothing before the anchor moves.
        assert_eq!(grid.floor(anchor, every), anchor);
    }
}
