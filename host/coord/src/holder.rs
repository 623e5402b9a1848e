//! The holder side of a lease: stop early, hand over late.
//!
//! Rule: a holder renews on its beat — the heartbeat for presence, the
//! seat beat (half the TTL, [`crate::Coord::seat_beat`]) for a seat. It
//! stops admitting new work once its last successful renew is older than
//! that beat, and gives the resource up once that renew is older than the
//! TTL. An unknown renew
//! changes nothing (ambiguity is not loss); a definite "no" is loss at once.
//! Why: treating unknown as loss tears a healthy company down over a store
//! blip, and trusting it unboundedly lets a partitioned holder run work a
//! peer has taken over. The holder's own clock bounds it, counted from when
//! the last good renew was *sent*, so network delay only makes it earlier.

use std::time::{Duration, Instant};

use crate::answer::{Answer, CoordError};

/// The fencing answer to "may the holder still act?": yes, no, or unknown —
/// never a bare bool, so a stale holder is not mistaken for a lost one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admits {
    /// Renewed within one beat: admit work.
    Yes,
    /// Last good renew older than a beat: whether the lease is still ours is
    /// unknown — finish what runs, admit nothing new.
    Unknown,
    /// Last good renew older than the TTL, the store said no, or the tenure
    /// was released: give it up.
    No,
}

/// The state machine; drive it with [`Holder::on_renew`] and ask [`Holder::state`].
#[derive(Debug, Clone)]
pub(crate) struct Holder {
    beat: Duration,
    ttl: Duration,
    last_ok: Instant,
    lost: bool,
}

impl Holder {
    /// A holder whose tenure was won by a request sent at `acquired_at`.
    pub(crate) fn new(acquired_at: Instant, beat: Duration, ttl: Duration) -> Holder {
        Holder {
            beat,
            ttl,
            last_ok: acquired_at,
            lost: false,
        }
    }

    /// Records the outcome of a renew sent at `sent_at`.
    pub(crate) fn on_renew<Y, N>(
        &mut self,
        sent_at: Instant,
        outcome: &Result<Answer<Y, N>, CoordError>,
    ) {
        match outcome {
            Ok(Answer::Yes(_)) => {
                if sent_at > self.last_ok {
                    self.last_ok = sent_at;
                }
            }
            Ok(Answer::No(_)) => self.lost = true,
            // Unknown (or any error that is not the store's "no"): hold.
            Err(_) => {}
        }
    }

    /// The answer at `now`.
    pub(crate) fn state(&self, now: Instant) -> Admits {
        let age = now.saturating_duration_since(self.last_ok);
        if self.lost || age >= self.ttl {
            Admits::No
        } else if age >= self.beat {
            Admits::Unknown
        } else {
            Admits::Yes
        }
    }

    /// Until when the answer is yes: the "admit until" deadline (`None`
    /// once the store said no).
    pub(crate) fn admit_until(&self) -> Option<Instant> {
        (!self.lost).then_some(self.last_ok + self.beat)
    }

    /// When the answer changes next without a renew (yes → unknown →
    /// no), if it still can.
    pub(crate) fn next_change(&self, now: Instant) -> Option<Instant> {
        match self.state(now) {
            Admits::Yes => Some(self.last_ok + self.beat),
            Admits::Unknown => Some(self.last_ok + self.ttl),
            Admits::No => None,
        }
    }

    /// Half a beat after the last good renew: when a renew is due on the
    /// plain cadence.
    pub(crate) fn next_renew(&self) -> Instant {
        self.last_ok + self.beat / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_early_and_hands_over_late() {
        let t0 = Instant::now();
        let hb = Duration::from_secs(15);
        let ttl = Duration::from_secs(45);
        let mut h = Holder::new(t0, hb, ttl);
        assert_eq!(h.state(t0 + Duration::from_secs(14)), Admits::Yes);
        let unknown: Result<Answer<(), ()>, _> = Err(CoordError::Unavailable("x".into()));
        h.on_renew(t0 + Duration::from_secs(10), &unknown);
        assert_eq!(h.state(t0 + Duration::from_secs(15)), Admits::Unknown);
        assert_eq!(h.state(t0 + Duration::from_secs(44)), Admits::Unknown);
        assert_eq!(h.state(t0 + Duration::from_secs(45)), Admits::No);
        h.on_renew(
            t0 + Duration::from_secs(40),
            &Ok::<_, CoordError>(Answer::<(), ()>::Yes(())),
        );
        assert_eq!(h.state(t0 + Duration::from_secs(45)), Admits::Yes);
        h.on_renew(
            t0 + Duration::from_secs(46),
            &Ok::<_, CoordError>(Answer::<(), ()>::No(())),
        );
        assert_eq!(h.state(t0 + Duration::from_secs(46)), Admits::No);
    }
}
