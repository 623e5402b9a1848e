//! How long a plugin's calls take: a fixed-bucket histogram of atomics,
//! recorded by [`crate::call::Guard::call`] for every call that ran (a
//! refused call never reached the guest and is not timed), read into
//! [`crate::HealthReport`] for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets: 100 µs doubling to ~6.6 s (a webhook's
/// deadline ceiling is 5 s; past the last bound is the overflow).
const BOUNDS: usize = 17;

fn bound(i: usize) -> Duration {
    Duration::from_micros(100 << i)
}

/// A plugin's call times since the node started.
#[derive(Debug, Default)]
pub(crate) struct Timings {
    /// Calls per bucket (not cumulative); the last is past every bound.
    counts: [AtomicU64; BOUNDS + 1],
    sum_us: AtomicU64,
}

/// A read of [`Timings`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Latency {
    /// `(upper bound, calls over the previous bound and at or under this
    /// one)`, ascending.
    pub buckets: Vec<(Duration, u64)>,
    /// Calls past the last bound.
    pub overflow: u64,
    pub sum: Duration,
}

impl Latency {
    /// Every call timed.
    pub fn count(&self) -> u64 {
        self.overflow + self.buckets.iter().map(|(_, n)| n).sum::<u64>()
    }
}

impl Timings {
    pub(crate) fn record(&self, took: Duration) {
        let i = (0..BOUNDS).find(|&i| took <= bound(i)).unwrap_or(BOUNDS);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    pub(crate) fn read(&self) -> Latency {
        Latency {
            buckets: (0..BOUNDS)
                .map(|i| (bound(i), self.counts[i].load(Ordering::Relaxed)))
                .collect(),
            overflow: self.counts[BOUNDS].load(Ordering::Relaxed),
            sum: Duration::from_micros(self.sum_us.load(Ordering::Relaxed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_land_in_their_buckets_and_the_overflow_counts() {
        let t = Timings::default();
        t.record(Duration::from_micros(50));
        t.record(Duration::from_micros(100));
        t.record(Duration::from_millis(3));
        t.record(Duration::from_secs(60));
        let l = t.read();
        assert_eq!(l.count(), 4);
        assert_eq!(l.buckets[0], (Duration::from_micros(100), 2));
        let at = l
            .buckets
            .iter()
            .position(|(b, _)| *b >= Duration::from_millis(3))
            .unwrap();
        assert_eq!(l.buckets[at], (Duration::from_micros(3_200), 1));
        assert_eq!(l.overflow, 1);
        assert_eq!(l.sum, Duration::from_micros(50 + 100 + 3_000 + 60_000_000));
    }
}
