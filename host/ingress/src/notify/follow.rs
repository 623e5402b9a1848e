//! Wakes by follow: a message in a thread a seat follows wakes that seat
//! without a mention ([`crewlet_coord::follows`]).
//!
//! Rules, and why:
//! - **One read, only for a threaded delivery.** A delivery with a channel
//!   and a thread costs one read of that thread's key; any other, none.
//! - **A seat's own message wakes nobody by follow.** A delivery whose
//!   sender ids a seat claims (its identities on the source) is not read for
//!   followers at all: a seat's reply delivered back must not wake it, and
//!   two seats following one thread must not wake each other in a loop.
//!   (A seat mentioning another still wakes it: that is a mention.)
//! - **A follower that left the company is skipped**, not an error: its
//!   entry ages out of the bucket with the thread.
//! - **Unknown waits.** A read the store could not answer delays the whole
//!   delivery (a nak, redelivered, never dead-lettered) before any seat is
//!   woken. Taken as "nobody follows", the delivery would be acked and the
//!   follower never hear the reply: a loss nobody sees. A delay costs only
//!   latency, and the valve on the same store already delays on the same
//!   outage.
//! - **A record this build cannot read** (written by a newer build) wakes
//!   nobody by follow and is logged: delaying would hold the delivery for
//!   ever, since a delay is never counted towards the dead-letter queue.

use crewlet_bus::Inbound;
use crewlet_company::{Claimant, Company, Handle};
use crewlet_coord::{ChatThread, CoordError, Follows};
use tracing::{debug, warn};

/// Why a seat woken by follow was woken (the wake's `reason`).
pub const REASON: &str = "follow";

/// What following says about a delivery.
#[derive(Debug, Default)]
pub(super) struct ByFollow {
    /// The seats following its thread, in the company, not its author.
    pub(super) seats: Vec<Handle>,
    /// The seat that wrote it, when a seat did: it wakes nobody by follow.
    pub(super) authored_by: Option<Handle>,
}

impl ByFollow {
    /// Adds the followers not already woken for another reason.
    pub(super) fn add_to(self, seats: &mut Vec<(Handle, &'static str)>) {
        for h in self.seats {
            if !seats.iter().any(|(o, _)| o == &h) {
                seats.push((h, REASON));
            }
        }
    }
}

/// The seats following `inbound`'s thread. `Err` only for unknown (the
/// store did not answer): the caller delays the delivery.
pub(super) async fn by_follow(
    follows: &Follows,
    company: &Company,
    inbound: &Inbound,
) -> Result<ByFollow, CoordError> {
    let (Some(channel), Some(thread)) = (&inbound.channel, &inbound.thread) else {
        return Ok(ByFollow::default());
    };
    let authored_by =
        inbound
            .sender
            .iter()
            .find_map(|id| match company.claimant(&inbound.source, id) {
                Some(Claimant::Seat { handle }) => Some(handle.clone()),
                _ => None,
            });
    if authored_by.is_some() {
        return Ok(ByFollow {
            seats: Vec::new(),
            authored_by,
        });
    }
    let at = ChatThread::new(&inbound.source, channel, thread);
    let followers = match follows.followers(&at).await {
        Ok(f) => f,
        Err(e) if e.is_unavailable() => return Err(e),
        Err(e) => {
            warn!(subsystem = "notify", thread = %at, error = %e,
                "who follows the thread cannot be read; nobody is woken by follow");
            return Ok(ByFollow::default());
        }
    };
    let mut seats = Vec::new();
    for handle in followers {
        match Handle::parse(&handle)
            .ok()
            .filter(|h| company.seats.contains_key(h))
        {
            Some(h) => seats.push(h),
            None => {
                debug!(subsystem = "notify", thread = %at, seat = %handle,
                    "a follower that is not in the company is skipped");
            }
        }
    }
    Ok(ByFollow {
        seats,
        authored_by: None,
    })
}
