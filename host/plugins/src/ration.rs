//! How many lines one plugin may put in the node's log: the one rationing
//! rule for everything a plugin causes to be logged (its faults, its `log`
//! lines, its stderr).
//!
//! Rule, and why: a plugin runs on every delivery, model call or event, so
//! a broken or chatty one could write the node's log full and hide
//! everything else. A [`Ration`] is a token bucket: `burst` lines at once,
//! then one more per `every`. A line over the ration is dropped and
//! counted; the next line that passes carries the count, so the log says
//! that (and how much) was left out rather than going quiet.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A token bucket over one plugin's log lines.
#[derive(Debug)]
pub struct Ration {
    burst: u32,
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Whole lines left, and the instant the next one is earned from.
    tokens: u32,
    earned_from: Instant,
    dropped: u64,
}

/// Whether a line may be written now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write it, saying how many lines were dropped since the last one
    /// written.
    Write { dropped: u64 },
    /// Drop it (it is counted).
    Drop,
}

impl Ration {
    /// `burst` lines at once (at least one), then one per `every`.
    pub fn new(burst: u32, every: Duration) -> Ration {
        Ration {
            burst: burst.max(1),
            every,
            state: Mutex::new(State {
                tokens: burst.max(1),
                earned_from: Instant::now(),
                dropped: 0,
            }),
        }
    }

    /// Takes one line's share at `now`.
    pub fn take(&self, now: Instant) -> Verdict {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.tokens < self.burst {
            let elapsed = now.saturating_duration_since(s.earned_from);
            let earned = if self.every.is_zero() {
                u128::from(self.burst)
            } else {
                elapsed.as_nanos() / self.every.as_nanos()
            };
            if earned > 0 {
                let room = u128::from(self.burst - s.tokens);
                s.tokens += earned.min(room) as u32;
                s.earned_from = if s.tokens == self.burst {
                    now
                } else {
                    s.earned_from + self.every * earned as u32
                };
            }
        } else {
            s.earned_from = now;
        }
        if s.tokens == 0 {
            s.dropped += 1;
            return Verdict::Drop;
        }
        s.tokens -= 1;
        Verdict::Write {
            dropped: std::mem::take(&mut s.dropped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_lines_are_dropped_and_the_next_one_counts_them() {
        let r = Ration::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(r.take(t0), Verdict::Write { dropped: 0 });
        }
        for _ in 0..5 {
            assert_eq!(r.take(t0 + Duration::from_millis(500)), Verdict::Drop);
        }
        assert_eq!(
            r.take(t0 + Duration::from_millis(1000)),
            Verdict::Write { dropped: 5 }
        );
        assert_eq!(r.take(t0 + Duration::from_millis(1100)), Verdict::Drop);
    }

    #[test]
    fn the_bucket_refills_at_its_rate_and_never_past_its_burst() {
        let r = Ration::new(2, Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(matches!(r.take(t0), Verdict::Write { .. }));
        assert!(matches!(r.take(t0), Verdict::Write { .. }));
        assert_eq!(r.take(t0), Verdict::Drop);
        // An hour idle earns the burst back, not an hour's worth of lines.
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(r.take(later), Verdict::Write { dropped: 1 });
        assert_eq!(r.take(later), Verdict::Write { dropped: 0 });
        assert_eq!(r.take(later), Verdict::Drop);
        // A partial period carries over: 150 ms earns one, the next 50 ms
        // completes the second.
        assert!(matches!(
            r.take(later + Duration::from_millis(150)),
            Verdict::Write { .. }
        ));
        assert_eq!(r.take(later + Duration::from_millis(150)), Verdict::Drop);
        assert!(matches!(
            r.take(later + Duration::from_millis(200)),
            Verdict::Write { .. }
        ));
    }

    #[test]
    fn one_line_a_period_is_the_fault_rule() {
        let r = Ration::new(1, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(r.take(t0), Verdict::Write { dropped: 0 });
        assert_eq!(r.take(t0 + Duration::from_millis(999)), Verdict::Drop);
        assert_eq!(
            r.take(t0 + Duration::from_millis(1000)),
            Verdict::Write { dropped: 1 }
        );
    }
}
