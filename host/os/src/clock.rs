//! The wall clock, in the unit Crewlet stores and publishes.
//!
//! Signed because SQLite integers and the bus messages' fields are; a clock
//! set before 1970 reads as 0 rather than failing, since a timestamp is a
//! record of when, never a decision.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch by this host's wall clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
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
}
