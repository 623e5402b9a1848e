//! The broker's clock, as this node can know it.
//!
//! Rule: a lease's deadline is its record's write instant — stamped by the
//! broker — plus its TTL, so whether it has passed is judged on the broker's
//! clock, never this node's. Judged on the node's own clock, a node whose
//! clock ran 40 s ahead took a live lease from its holder, and a holder whose
//! clock ran ahead judged its own live lease lapsed and let it go.
//!
//! The broker's time is the `ts` a `STREAM.INFO` answer carries, stamped by
//! the stream's leader (the server that stamps the stream's writes). What is
//! kept is a floor: that stamp plus the monotonic time elapsed here since
//! the answer arrived. It is never later than the broker's clock (the answer
//! was stamped before it arrived) and never goes backwards, and a check
//! costs no round trip: the floor is refreshed when a judgment asks for it
//! and it is older than [`REFRESH`]. A floor not refreshed within [`TRUST`]
//! is not used — the time is unknown, and so is every answer that rests on
//! it; unknown is never "expired".

use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{NatsKv, Opened};
use crate::kv::{KvResult, Unavailable};

/// A floor older than this is refreshed before it is used.
pub const REFRESH: Duration = Duration::from_secs(5);

/// A floor not refreshed for this long is not used (unknown). Monotonic
/// time keeps pace with the broker's to parts per million; this bounds
/// how long a step of the broker's own clock can go unseen.
pub const TRUST: Duration = Duration::from_secs(60);

/// One bucket's view of its broker's clock.
#[derive(Debug, Default)]
pub(super) struct BrokerClock {
    seen: std::sync::Mutex<Option<Seen>>,
    /// One refresh at a time; the others wait for its answer.
    refreshing: tokio::sync::Mutex<()>,
}

/// A stamp and when, here, it was known to be passed.
#[derive(Debug, Clone, Copy)]
struct Seen {
    stamp: SystemTime,
    at: Instant,
}

impl Seen {
    fn floor(&self, now: Instant) -> SystemTime {
        self.stamp + now.saturating_duration_since(self.at)
    }
}

impl BrokerClock {
    /// Takes in a stamp read from the broker, known passed at `at`. The
    /// floor only moves forward: a stamp behind it is dropped, but still
    /// counts as a refresh (the broker answered).
    pub(super) fn observe(&self, stamp: SystemTime, at: Instant) {
        let mut seen = self.seen.lock().expect("broker clock lock");
        let fresh = Seen { stamp, at };
        *seen = Some(match *seen {
            None => fresh,
            Some(old) => {
                let later = old.at.max(at);
                if fresh.floor(later) >= old.floor(later) {
                    fresh
                } else {
                    Seen {
                        stamp: old.floor(later),
                        at: later,
                    }
                }
            }
        });
    }

    /// The floor at `now`, if refreshed within `within`.
    pub(super) fn floor(&self, now: Instant, within: Duration) -> Option<SystemTime> {
        let seen = (*self.seen.lock().expect("broker clock lock"))?;
        (now.saturating_duration_since(seen.at) <= within).then(|| seen.floor(now))
    }
}

/// The part of a `STREAM.INFO` answer the clock reads.
#[derive(Deserialize)]
struct Stamped {
    ts: Option<String>,
}

fn parse_stamp(ts: &str) -> Result<SystemTime, String> {
    OffsetDateTime::parse(ts, &Rfc3339)
        .map(SystemTime::from)
        .map_err(|e| format!("the broker's time {ts:?} does not parse: {e}"))
}

impl NatsKv {
    /// The broker's time now for `o` (see the module docs).
    pub(super) async fn broker_now_in(&self, o: &Opened) -> KvResult<SystemTime> {
        if let Some(t) = o.clock.floor(Instant::now(), REFRESH) {
            return Ok(t);
        }
        let _one = o.clock.refreshing.lock().await;
        // Someone else's refresh may have answered while we waited.
        if let Some(t) = o.clock.floor(Instant::now(), REFRESH) {
            return Ok(t);
        }
        match self.stamp(o).await {
            Ok(()) => {}
            Err(e) => {
                tracing::debug!(bucket = %o.name, error = %e.0, "the broker's clock was not refreshed")
            }
        }
        o.clock.floor(Instant::now(), TRUST).ok_or_else(|| {
            Unavailable(format!(
                "the broker's clock for {} is not known (no STREAM.INFO answer within {TRUST:?})",
                o.name
            ))
        })
    }

    /// Asks the stream's leader for its time and takes it in.
    async fn stamp(&self, o: &Opened) -> KvResult<()> {
        let subject = format!("STREAM.INFO.KV_{}", o.name);
        let answer: async_nats::jetstream::response::Response<Stamped> = self
            .js
            .request(subject, &serde_json::json!({}))
            .await
            .map_err(|e| Unavailable(format!("STREAM.INFO for the broker's clock: {e}")))?;
        let ts = match answer {
            async_nats::jetstream::response::Response::Ok(Stamped { ts: Some(ts) }) => ts,
            async_nats::jetstream::response::Response::Ok(Stamped { ts: None }) => {
                return Err(Unavailable(
                    "the broker's STREAM.INFO carries no time (`ts`, nats-server 2.10 or later)"
                        .into(),
                ));
            }
            async_nats::jetstream::response::Response::Err { error } => {
                return Err(Unavailable(format!(
                    "STREAM.INFO for the broker's clock: {error}"
                )));
            }
        };
        let at = Instant::now();
        o.clock.observe(parse_stamp(&ts).map_err(Unavailable)?, at);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs_on_and_never_goes_back() {
        let c = BrokerClock::default();
        let t0 = Instant::now();
        assert_eq!(c.floor(t0, TRUST), None, "unknown before any stamp");
        let b = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        c.observe(b, t0);
        let later = t0 + Duration::from_secs(3);
        assert_eq!(c.floor(later, TRUST), Some(b + Duration::from_secs(3)));
        // A stamp behind the floor (a broker clock stepped back): kept.
        c.observe(b, later);
        assert_eq!(c.floor(later, TRUST), Some(b + Duration::from_secs(3)));
        // A stamp ahead of it: taken.
        c.observe(b + Duration::from_secs(10), later);
        assert_eq!(c.floor(later, TRUST), Some(b + Duration::from_secs(10)));
        // Not refreshed within the bound: unknown.
        assert_eq!(c.floor(later + TRUST + Duration::from_secs(1), TRUST), None);
    }

    #[test]
    fn reads_the_brokers_stamp() {
        let t = parse_stamp("2026-12-04T19:48:06.207252064Z").unwrap();
        let ms = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        assert_eq!(ms, 1_796_413_686_207);
    }
}
