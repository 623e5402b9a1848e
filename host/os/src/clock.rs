//! The wall clock, in the unit Crewlet stores and publishes.
//!
//! Signed because SQLite integers and the bus messages' fields are; a clock
//! set before 1970 reads as 0 rather than failing, since a timestamp is a
//! record of when, never a decision.
//!
//! Test-only: [`TEST_CLOCK_OFFSET_ENV`] (`CREWLET_TEST_CLOCK_OFFSET_MS`, a
//! signed count of milliseconds, read once per process) shifts this node's
//! wall clock and nothing else — the broker's clock, and every monotonic
//! interval, stay as they are. That is exactly a node whose clock is wrong,
//! which is what the clock-skew tests run: no decision shared with peers
//! may rest on this clock (a lease's liveness is judged on the broker's, see
//! `crewlet_coord::nats::clock`). Unset, empty or unparsable means no shift.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The test-only variable that shifts this node's wall clock (signed ms).
pub const TEST_CLOCK_OFFSET_ENV: &str = "CREWLET_TEST_CLOCK_OFFSET_MS";

fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var(TEST_CLOCK_OFFSET_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

fn shifted(t: SystemTime, offset_ms: i64) -> SystemTime {
    let by = Duration::from_millis(offset_ms.unsigned_abs());
    if offset_ms >= 0 {
        t.checked_add(by).unwrap_or(t)
    } else {
        // Never before 1970, like `now_ms`.
        t.checked_sub(by)
            .filter(|s| *s >= UNIX_EPOCH)
            .unwrap_or(UNIX_EPOCH)
    }
}

/// This host's wall clock (shifted by the test-only offset, if set).
pub fn wall_now() -> SystemTime {
    shifted(SystemTime::now(), offset_ms())
}

/// Milliseconds since the Unix epoch by this host's wall clock.
pub fn now_ms() -> i64 {
    wall_now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_present_in_milliseconds() {
        // 2024-01-01 and 2200-01-01: the present, in milliseconds, not seconds.
        let now = now_ms();
        assert!(now > 1_704_067_200_000, "{now}");
        assert!(now < 7_258_118_400_000, "{now}");
    }

    #[test]
    fn an_offset_shifts_either_way() {
        let t = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(shifted(t, 60_000), t + Duration::from_secs(60));
        assert_eq!(shifted(t, -60_000), t - Duration::from_secs(60));
        assert_eq!(shifted(t, -2_000_000), UNIX_EPOCH);
    }
}
