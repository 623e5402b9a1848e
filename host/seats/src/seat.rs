//! One held seat, from a won lease to a released one.
//!
//! Rule: acquire → equip → hydrate → attach, and release in reverse: detach
//! → unequip → release. The mailbox is attached only after `equip`
//! succeeded and the seat's memory is on this node (`hydrate`), and
//! detached before `unequip`, so a seat never consumes work it cannot run,
//! no longer owns, or would answer having forgotten what it said. A
//! hydration that cannot read the memory is asked again with backoff
//! (`HYDRATE_FIRST_RETRY` doubling to `HYDRATE_MAX_RETRY`) while the lease
//! holds: the wakes wait in the mailbox, which is durable, and giving the
//! seat back would only bounce it between nodes that read the same stream.
//! The lease is held by a [`Tenancy`] all along (during equip, hydration
//! and while turns drain too), on the seat terms (`Terms::seat`: the
//! node's renew grid; stop admitting after a seat beat without a good
//! renew, give up after the TTL or on a definite no).
//! Why: a seat whose lease lapsed mid-teardown could be taken by a peer
//! while this node still ran its turns. Equip and unequip are each bounded
//! (`SeatsConfig::equip_timeout`, `unequip_timeout`): a host that hangs
//! would otherwise hold a seat nobody serves, or never give it back.

use std::sync::Arc;
use std::time::Duration;

use crewlet_bus::{AGENT_STREAM, mailbox_durable};
use crewlet_coord::{Admits, Released, Standing, Tenancy};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::host::{SeatHost, SeatSpec};
use crate::mailbox::{self, SeatCtx};
use crate::{Phase, Shared};

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

/// The wait after a hydration that could not read the seat's memory;
/// doubled after each, up to [`HYDRATE_MAX_RETRY`].
const HYDRATE_FIRST_RETRY: Duration = Duration::from_millis(250);
const HYDRATE_MAX_RETRY: Duration = Duration::from_secs(5);

/// Hydrates the seat until its memory is on this node (`true`), or the
/// seat is released or its lease lost first (`false`).
async fn hydrate<H: SeatHost>(
    shared: &Shared<H>,
    spec: &SeatSpec,
    release: &mut watch::Receiver<bool>,
    state_rx: &mut watch::Receiver<Standing>,
) -> bool {
    let mut wait = HYDRATE_FIRST_RETRY;
    loop {
        let tried = tokio::time::timeout(shared.equip_timeout, shared.host.hydrate(spec))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "hydration did not finish within {:?}",
                    shared.equip_timeout
                ))
            });
        match tried {
            Ok(()) => return true,
            Err(why) => {
                warn!(subsystem = "seats", seat = %spec.handle, reason = %why, retry_in = ?wait,
                    "the seat's memory could not be read; its mailbox stays detached until it is")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = release.wait_for(|r| *r) => return false,
            _ = state_rx.wait_for(|s| s.admits == Admits::No) => return false,
        }
        wait = (wait * 2).min(HYDRATE_MAX_RETRY);
    }
}

/// Runs one seat whose lease was just won, until it is released.
pub(crate) async fn run<H: SeatHost>(
    shared: Arc<Shared<H>>,
    spec: Arc<SeatSpec>,
    tenancy: Tenancy,
    generation: u64,
    mut release: watch::Receiver<bool>,
) {
    let handle = spec.handle.clone();
    let fence = tenancy.fence().clone();
    let epoch = fence.epoch().get();
    let mut state_rx = tenancy.standing();

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

    // Hydrate, then attach, serve, detach.
    if let Some(equipped) = &equipped
        && hydrate(&shared, &spec, &mut release, &mut state_rx).await
    {
        let given_up = state_rx.borrow().admits == Admits::No;
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
                        _ = state_rx.wait_for(|s| s.admits == Admits::No) => {}
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
    fence.close();
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
    match tenancy.release(None).await {
        Released::Yes => {
            info!(subsystem = "seats", seat = %handle, epoch, "seat released");
            shared.announce_release(&handle).await;
        }
        Released::NotOurs(None) => {
            debug!(subsystem = "seats", seat = %handle, "lease already lost; nothing to release")
        }
        Released::NotOurs(Some(why)) => {
            info!(subsystem = "seats", seat = %handle, epoch, ?why,
                "seat given up; its lease was no longer ours to release")
        }
        Released::Unknown(e) => warn!(subsystem = "seats", seat = %handle, epoch, error = %e,
            "releasing the seat lease answered unknown; it lapses within the lease TTL"),
    }
    if failed {
        shared.back_off(&handle, seen);
    }
    shared.remove_slot(&handle, generation);
}
