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

/// What the holder may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderState {
    /// Renewed within one beat: admit work.
    Admitting,
    /// Last good renew older than a beat: finish what runs, admit nothing new.
    Stale,
    /// Last good renew older than the TTL, or the store said no: give it up.
    GiveUp,
}

/// The state machine; drive it with [`Holder::on_renew`] and ask [`Holder::state`].
#[derive(Debug, Clone)]
pub struct Holder {
    beat: Duration,
    ttl: Duration,
    last_ok: Instant,
    lost: bool,
}

impl Holder {
    /// A holder whose tenure was won by a request sent at `acquired_at`.
    pub fn new(acquired_at: Instant, beat: Duration, ttl: Duration) -> Holder {
        Holder {
            beat,
            ttl,
            last_ok: acquired_at,
            lost: false,
        }
    }

    /// Records the outcome of a renew sent at `sent_at`.
    pub fn on_renew<Y, N>(&mut self, sent_at: Instant, outcome: &Result<Answer<Y, N>, CoordError>) {
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

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> HolderState {
        let age = now.saturating_duration_since(self.last_ok);
        if self.lost || age >= self.ttl {
            HolderState::GiveUp
        } else if age >= self.beat {
            HolderState::Stale
        } else {
            HolderState::Admitting
        }
    }

    /// When the next renew is due.
    pub fn next_renew(&self) -> Instant {
        self.last_ok + self.beat / 2
    }

    pub fn beat(&self) -> Duration {
        self.beat
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
        assert_eq!(
            h.state(t0 + Duration::from_secs(14)),
            HolderState::Admitting
        );
        let unknown: Result<Answer<(), ()>, _> = Err(CoordError::Unavailable("x".into()));
        h.on_renew(t0 + Duration::from_secs(10), &unknown);
        assert_eq!(h.state(t0 + Duration::from_secs(15)), HolderState::Stale);
        assert_eq!(h.state(t0 + Duration::from_secs(44)), HolderState::Stale);
        assert_eq!(h.state(t0 + Duration::from_secs(45)), HolderState::GiveUp);
        h.on_renew(
            t0 + Duration::from_secs(40),
            &Ok::<_, CoordError>(Answer::<(), ()>::Yes(())),
        );
        assert_eq!(
            h.state(t0 + Duration::from_secs(45)),
            HolderState::Admitting
        );
        h.on_renew(
            t0 + Duration::from_secs(46),
            &Ok::<_, CoordError>(Answer::<(), ()>::No(())),
        );
        assert_eq!(h.state(t0 + Duration::from_secs(46)), HolderState::GiveUp);
    }
}
