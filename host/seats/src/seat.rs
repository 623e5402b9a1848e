//! One held seat, from a won lease to a released one.
//!
//! Rule: acquire → equip → attach, and release in reverse: detach → unequip
//! → release. The mailbox is attached only after `equip` succeeded, and
//! detached before `unequip`, so a seat never consumes work it cannot run or
//! no longer owns. The lease is renewed all along (during equip and while
//! turns drain too), by the holder's two clocks: stop admitting after a
//! seat beat (half the TTL, `Coord::seat_beat`) without a good renew, give
//! up after the TTL or on a definite no.
//! Why: a seat whose lease lapsed mid-teardown could be taken by a peer
//! while this node still ran its turns. Equip and unequip are each bounded
//! (`SeatsConfig::equip_timeout`, `unequip_timeout`): a host that hangs
//! would otherwise hold a seat nobody serves, or never give it back.

use std::sync::Arc;
use std::time::Duration;

use crewlet_bus::{AGENT_STREAM, mailbox_durable};
use crewlet_coord::{Answer, Coord, HolderState, Lease};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::host::{Fence, SeatHost, SeatSpec};
use crate::mailbox::{self, SeatCtx};
use crate::{Phase, Shared};

/// What the renew loop ends with.
struct Renewed {
    lease: Lease,
    /// The store said definitely not ours.
    refused: bool,
}

/// How often a seat lease is renewed: once a seat beat
/// ([`crewlet_coord::Coord::seat_beat`], half the lease TTL), early by a
/// margin for the round trip (a tenth of the beat, at least a second and at
/// most half of it), so a holder whose renews are answered stays admitting
/// even on a loaded machine.
///
/// Why not every half heartbeat, as presence and duties are: a node renews
/// one presence but every seat it holds. 10,000 idle seats renewed every
/// 7.5 s were 1,333 writes a second, most of the 10 % of a core that
/// node and nats-server spent doing nothing. An unknown answer is asked
/// again soon ([`renew_retry`]), so one lost reply does not leave a healthy
/// seat stale for a whole period.
pub(crate) fn renew_every(beat: Duration) -> Duration {
    let margin = (beat / 10).max(Duration::from_secs(1)).min(beat / 2);
    beat.saturating_sub(margin).max(Duration::from_millis(10))
}

/// The instants a node's seat renews are sent on: multiples of a tick
/// from one anchor, so the renews due within a tick leave together.
///
/// Why: each seat renews on its own timer, and 10,000 seats spread evenly
/// were 500 lone writes a second, each its own syscall and wake-up on
/// both sides of the connection. Sent in a burst per tick they share the
/// writes and the server's reads. A renew is only ever moved earlier, by
/// less than a tick.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenewGrid {
    anchor: Instant,
}

impl RenewGrid {
    pub(crate) fn new(anchor: Instant) -> RenewGrid {
        RenewGrid { anchor }
    }

    /// `t` moved back onto the grid whose tick is a tenth of `every`, at
    /// most a second.
    pub(crate) fn floor(&self, t: Instant, every: Duration) -> Instant {
        let tick = (every / 10).min(Duration::from_secs(1));
        if tick.is_zero() || t <= self.anchor {
            return t;
        }
        let since = (t - self.anchor).as_nanos();
        let tick_ns = tick.as_nanos();
        let back = since % tick_ns;
        t - Duration::from_nanos(back as u64)
    }
}

/// How soon a renew that answered unknown is sent again.
pub(crate) fn renew_retry(heartbeat: Duration) -> Duration {
    (heartbeat / 10).max(Duration::from_millis(10))
}

/// Renews `lease` on [`renew_every`] until told to stop, publishing the
/// holder state after every beat.
async fn renew_loop(
    coord: Coord,
    mut lease: Lease,
    fence: Fence,
    heartbeat: Duration,
    grid: RenewGrid,
    state_tx: watch::Sender<HolderState>,
    mut stop: watch::Receiver<bool>,
) -> Renewed {
    let every = renew_every(coord.seat_beat());
    let patience = (heartbeat / 2).max(Duration::from_millis(10));
    let mut next = grid.floor(Instant::now() + every, every);
    let mut refused = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
        }
        next = grid.floor(Instant::now() + every, every);
        if !refused {
            let sent = std::time::Instant::now();
            let outcome = match tokio::time::timeout(patience, coord.renew(&lease)).await {
                Ok(r) => r,
                Err(_) => Err(crewlet_coord::CoordError::Unavailable(format!(
                    "renew took longer than {patience:?}"
                ))),
            };
            fence.with_holder(|h| h.on_renew(sent, &outcome));
            match outcome {
                Ok(Answer::Yes(l)) => lease = l,
                Ok(Answer::No(why)) => {
                    refused = true;
                    warn!(subsystem = "seats", seat = %lease.name, epoch = lease.epoch, ?why,
                        "the seat lease is no longer ours; giving the seat up");
                }
                Err(e) => {
                    next = Instant::now() + renew_retry(heartbeat);
                    debug!(subsystem = "seats", seat = %lease.name, error = %e,
                        "lease renew answered unknown; holding on the holder's clock and asking again soon");
                }
            }
        }
        state_tx.send_if_modified(|s| {
            let now = fence.state();
            let changed = *s != now;
            *s = now;
            changed
        });
    }
    Renewed { lease, refused }
}

/// A core subscription on the subject `consumer` reads, which hears every
/// wake published to the mailbox; `None` (the mailbox pulls back to back)
/// if the server refused it.
async fn doorbell(
    js: &async_nats::jetstream::Context,
    handle: &crewlet_company::Handle,
    consumer: &async_nats::jetstream::consumer::PullConsumer,
) -> Option<async_nats::Subscriber> {
    let subject = consumer.cached_info().config.filter_subject.clone();
    match js.client().subscribe(subject).await {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(subsystem = "seats", seat = %handle, error = %e,
                "cannot subscribe to the mailbox's subject; its mailbox pulls back to back");
            None
        }
    }
}

/// Runs one seat whose lease was just won, until it is released.
pub(crate) async fn run<H: SeatHost>(
    shared: Arc<Shared<H>>,
    spec: Arc<SeatSpec>,
    lease: Lease,
    fence: Fence,
    generation: u64,
    mut release: watch::Receiver<bool>,
) {
    let handle = spec.handle.clone();
    let epoch = lease.epoch;
    let (state_tx, mut state_rx) = watch::channel(fence.state());
    let (stop_renew, stop_renew_rx) = watch::channel(false);
    let renewer = tokio::spawn(renew_loop(
        shared.coord.clone(),
        lease,
        fence.clone(),
        shared.heartbeat,
        shared.renew_grid,
        state_tx,
        stop_renew_rx,
    ));

    // Equip.
    let seen = *shared.retry_equip.borrow();
    let equipped = match shared.active.current() {
        None => Err("no company is active on this node".to_owned()),
        Some(active) => {
            tokio::time::timeout(shared.equip_timeout, shared.host.equip(&spec, &active))
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "equip did not finish within {:?}; dropped",
                        shared.equip_timeout
                    ))
                })
        }
    };
    let mut failed = false;
    let equipped = match equipped {
        Ok(e) => Some(Arc::new(e)),
        Err(why) => {
            warn!(subsystem = "seats", seat = %handle, epoch, reason = %why,
                "equipping the seat failed; giving its lease back and backing off");
            failed = true;
            None
        }
    };

    // Attach, serve, detach.
    if let Some(equipped) = &equipped {
        let given_up = *state_rx.borrow() == HolderState::GiveUp;
        if !*release.borrow() && !given_up {
            let durable = mailbox_durable(handle.as_str());
            match shared
                .js
                .get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                    &durable,
                    AGENT_STREAM,
                )
                .await
            {
                Err(e) => {
                    warn!(subsystem = "seats", seat = %handle, durable, error = %e,
                        "cannot attach the seat's mailbox (is it created?); giving the seat back and backing off");
                    failed = true;
                }
                Ok(consumer) => {
                    let ctx = Arc::new(SeatCtx {
                        host: shared.host.clone(),
                        spec: spec.clone(),
                        equipped: equipped.clone(),
                        fence: fence.clone(),
                        active: shared.active.clone(),
                        turns: shared.turns.clone(),
                        in_flight: shared.in_flight.clone(),
                        admission: shared.admission.clone(),
                        pauses: shared.pauses.clone(),
                        swept: shared.swept.clone(),
                    });
                    let (detach, detach_rx) = watch::channel(false);
                    let doorbell = doorbell(&shared.js, &handle, &consumer).await;
                    let mut mb = tokio::spawn(mailbox::serve(
                        ctx,
                        shared.pace,
                        consumer,
                        doorbell,
                        state_rx.clone(),
                        detach_rx,
                    ));
                    shared.set_phase(&handle, generation, Phase::Serving);
                    shared.clear_backoff(&handle);
                    info!(subsystem = "seats", seat = %handle, epoch, "seat attached");
                    let mut mailbox_ended = false;
                    tokio::select! {
                        _ = release.wait_for(|r| *r) => {}
                        _ = state_rx.wait_for(|s| *s == HolderState::GiveUp) => {}
                        r = &mut mb => {
                            mailbox_ended = true;
                            if let Err(e) = r {
                                error!(subsystem = "seats", seat = %handle, error = %e,
                                    "the mailbox stopped unexpectedly; giving the seat back");
                            }
                        }
                    }
                    shared.set_phase(&handle, generation, Phase::Releasing);
                    let _ = detach.send(true);
                    if !mailbox_ended {
                        let _ = (&mut mb).await;
                    }
                }
            }
        }
    }

    // Unequip: every turn has ended, so this is the last reference.
    fence.mark_released();
    if let Some(equipped) = equipped {
        match Arc::try_unwrap(equipped) {
            Ok(e) => {
                let bound = shared.unequip_timeout;
                if tokio::time::timeout(bound, shared.host.unequip(&spec, e))
                    .await
                    .is_err()
                {
                    warn!(subsystem = "seats", seat = %handle, ?bound,
                        "unequip did not finish in time; dropped, releasing the lease anyway");
                }
            }
            Err(_) => error!(subsystem = "seats", seat = %handle,
                "the equipped seat is still shared after its turns ended; not unequipped (a bug)"),
        }
    }

    // Release the lease, if still ours.
    let _ = stop_renew.send(true);
    let renewed = match renewer.await {
        Ok(r) => Some(r),
        Err(e) => {
            error!(subsystem = "seats", seat = %handle, error = %e, "the renew loop failed");
            None
        }
    };
    if let Some(Renewed { lease, refused }) = renewed {
        if refused {
            debug!(subsystem = "seats", seat = %handle, "lease already lost; nothing to release");
        } else {
            match shared.coord.release(&lease).await {
                Ok(Answer::Yes(())) => {
                    info!(subsystem = "seats", seat = %handle, epoch, "seat released");
                    shared.announce_release(&handle).await;
                }
                Ok(Answer::No(why)) => {
                    info!(subsystem = "seats", seat = %handle, epoch, ?why,
                        "seat given up; its lease was no longer ours to release")
                }
                Err(e) => warn!(subsystem = "seats", seat = %handle, epoch, error = %e,
                    "releasing the seat lease answered unknown; it lapses within the lease TTL"),
            }
        }
    }
    if failed {
        shared.back_off(&handle, seen);
    }
    shared.remove_slot(&handle, generation);
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
        let anchor = Instant::now();
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
