//! A refused delivery is seen: a `delivery_refused` event row (source,
//! status, the host's sentence, the route's handle — never a header or the
//! body) and an INFO line. Refusals are what a hostile sender can make
//! cheaply, so their notes are rationed across the whole edge (a sender
//! varies the source as easily as anything else): [`BURST`] at once, then
//! one per [`EVERY`]; what the ration drops is counted into the next note
//! (`suppressed`), never lost silently.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crewlet_observe::Publisher;
use crewlet_store::Party;
use http::StatusCode;
use serde_json::json;
use tracing::{debug, info, warn};

/// Notes written at once before the ration applies.
pub const BURST: u32 = 20;
/// One more note per this much time past the burst.
pub const EVERY: Duration = Duration::from_millis(500);

/// The ration: a token bucket, and what it dropped since the last note.
pub struct Refusals {
    ration: Mutex<Ration>,
}

struct Ration {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            ration: Mutex::new(Ration {
                tokens: f64::from(BURST),
                at: Instant::now(),
                suppressed: 0,
            }),
        }
    }
}

impl Refusals {
    /// `Some(suppressed since the last note)` when a note may be written now.
    fn draw(&self, now: Instant) -> Option<u64> {
        let mut r = self.ration.lock().unwrap_or_else(|p| p.into_inner());
        let refill = now.saturating_duration_since(r.at).as_secs_f64() / EVERY.as_secs_f64();
        r.tokens = (r.tokens + refill).min(f64::from(BURST));
        r.at = now;
        if r.tokens >= 1.0 {
            r.tokens -= 1.0;
            Some(std::mem::take(&mut r.suppressed))
        } else {
            r.suppressed += 1;
            None
        }
    }

    /// Notes one refusal, if the ration allows.
    pub async fn note(
        &self,
        publisher: &Publisher,
        node_id: &str,
        source: &str,
        handle: Option<&str>,
        status: StatusCode,
        reason: &str,
    ) {
        let Some(suppressed) = self.draw(Instant::now()) else {
            debug!(subsystem = "ingress", source, status = status.as_u16(), %reason, "delivery refused (note rationed)");
            return;
        };
        info!(subsystem = "ingress", source, status = status.as_u16(), %reason, suppressed, "delivery refused");
        let mut event = publisher.event(
            "delivery_refused",
            json!({
                "source": source,
                "route_handle": handle,
                "status": status.as_u16(),
                "reason": reason,
                "suppressed": suppressed,
            }),
        );
        event.parties = vec![
            Party {
                party: format!("source:{source}"),
                role: "sender".into(),
            },
            Party {
                party: format!("node:{node_id}"),
                role: "edge".into(),
            },
        ];
        if let Err(e) = publisher.record(event).await {
            warn!(subsystem = "ingress", source, error = %e, "delivery_refused event not recorded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_burst_is_noted_then_one_per_interval_with_what_was_dropped() {
        let r = Refusals::default();
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(r.draw(t0), Some(0));
        }
        assert_eq!(r.draw(t0), None);
        assert_eq!(r.draw(t0 + EVERY / 2), None);
        assert_eq!(r.draw(t0 + EVERY), Some(2), "the two dropped are counted");
        assert_eq!(r.draw(t0 + EVERY), None);
        assert_eq!(r.draw(t0 + EVERY * 3), Some(1));
    }
}
