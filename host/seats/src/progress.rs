//! In-progress acks: a held wake is not handed to anyone else while its
//! seat works on it or waits to.
//!
//! Rule: **the wakes of one conversation lapse together.** Every wake a
//! mailbox holds — waiting for a turn or in a running one — is refreshed on
//! one shared clock (ticks at the mailbox's epoch plus whole periods, half
//! the consumer's ack wait), and a wake that joins a conversation already
//! holding wakes refreshes the others at once. Why: when a holder dies, the
//! broker redelivers each wake when its own ack wait lapses; wakes of one
//! thread refreshed at different moments (the running turn's on its start,
//! the waiting one's on its arrival) came back seconds apart to the next
//! holder, past the batch window, and ran as separate turns — the second
//! one answering a question its thread had already moved past.

use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};
use tokio::time::{Instant, Interval, MissedTickBehavior, interval_at};

/// The mailbox's one progress clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    epoch: Instant,
    every: Duration,
}

impl Clock {
    /// A clock that ticks every half of `ack_wait` (at least every 50 ms)
    /// from now.
    pub fn new(ack_wait: Duration) -> Clock {
        Clock {
            epoch: Instant::now(),
            every: (ack_wait / 2).max(Duration::from_millis(50)),
        }
    }

    /// The next tick strictly after `now`.
    fn next_after(&self, now: Instant) -> Instant {
        let periods = now.saturating_duration_since(self.epoch).as_nanos() / self.every.as_nanos();
        let periods = u32::try_from(periods + 1).unwrap_or(u32::MAX);
        self.epoch + self.every * periods
    }

    /// The clock's ticks from the next one on.
    pub fn ticks(&self) -> Interval {
        let mut i = interval_at(self.next_after(Instant::now()), self.every);
        i.set_missed_tick_behavior(MissedTickBehavior::Skip);
        i
    }
}

/// Refreshes `msgs` (fire and forget: a lost one is made good next tick,
/// well within the ack wait).
pub(crate) async fn refresh(msgs: &[&Message]) {
    for m in msgs {
        if let Err(e) = m.ack_with(AckKind::Progress).await {
            tracing::debug!(subsystem = "seats", error = %e, "in-progress ack not sent");
        }
    }
}

/// Refreshes `msgs` on `clock`'s ticks, for ever (a running turn's wakes:
/// its own task, so a busy mailbox loop cannot let them lapse).
pub(crate) async fn keep(msgs: &[Message], clock: Clock) -> std::convert::Infallible {
    let mut ticks = clock.ticks();
    loop {
        ticks.tick().await;
        refresh(&msgs.iter().collect::<Vec<_>>()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ticks_started_at_different_moments_fall_on_the_same_instants() {
        let clock = Clock::new(Duration::from_secs(10));
        tokio::time::advance(Duration::from_millis(1_300)).await;
        let mut early = clock.ticks();
        tokio::time::advance(Duration::from_millis(3_100)).await;
        let mut late = clock.ticks();
        let a = early.tick().await;
        let b = late.tick().await;
        assert_eq!(a, b);
        assert_eq!(a, clock.epoch + Duration::from_secs(5));
        assert_eq!(late.tick().await, clock.epoch + Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_started_on_a_tick_waits_for_the_next_one() {
        let clock = Clock::new(Duration::from_millis(40));
        assert_eq!(clock.every, Duration::from_millis(50), "at least 50 ms");
        tokio::time::advance(Duration::from_millis(50)).await;
        let mut t = clock.ticks();
        assert_eq!(t.tick().await, clock.epoch + Duration::from_millis(100));
    }
}
