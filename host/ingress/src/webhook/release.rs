//! Releasing a delivery claim: compare-and-delete of this attempt's own
//! claim, in the background with a backoff until the store answers or the
//! claim lapses (the rules are in [`super`]'s docs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_coord::{Answer, Coord, CoordError};
use tracing::{Instrument, debug, info, warn};

use super::{ACK_TIMEOUT, CLAIM_TTL};

/// Forgets `key`'s unreleased claim if it is still `claimant`'s.
pub(super) fn forget(unreleased: &Mutex<HashMap<String, String>>, key: &str, claimant: &str) {
    let mut map = unreleased.lock().expect("lock");
    if map.get(key).is_some_and(|c| c == claimant) {
        map.remove(key);
    }
}

/// Releases delivery claims through [`Coord::release_claim`]:
/// compare-and-delete of this attempt's claim at the revision it was read
/// at, so a claim another attempt took over is never removed.
#[derive(Clone)]
pub(super) struct Releaser {
    pub(super) coord: Coord,
}

/// Longest a background release keeps trying between attempts.
const RELEASE_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Releaser {
    /// Removes the claim on `key` if `claimant` holds it. Ok when it is
    /// gone or another claimant's; Err when the store did not answer.
    pub(super) async fn release(&self, key: &str, claimant: &str) -> Result<(), String> {
        let answer = tokio::time::timeout(ACK_TIMEOUT, self.coord.release_claim(key, claimant))
            .await
            .map_err(|_| format!("no answer within {ACK_TIMEOUT:?}"))?;
        match answer {
            Ok(Answer::Yes(())) => Ok(()),
            // Gone already, lapsed, or another attempt's: not ours to remove.
            Ok(Answer::No(why)) => {
                debug!(subsystem = "ingress", %key, ?why, "claim not ours to release");
                Ok(())
            }
            // The store answered with a record that does not decode: it
            // cannot be shown to be this attempt's, so it is left alone.
            Err(e @ CoordError::Corrupt { .. }) => {
                warn!(subsystem = "ingress", %key, error = %e, "claim not released: its record does not decode");
                Ok(())
            }
            // Unknown (or contended): ask again.
            Err(e) => Err(e.to_string()),
        }
    }

    /// Releases in a task of its own, retrying with a backoff until the
    /// store answers or the claim has lapsed on its own.
    pub(super) fn spawn(
        &self,
        key: String,
        claimant: String,
        unreleased: Arc<Mutex<HashMap<String, String>>>,
    ) {
        let releaser = self.clone();
        tokio::spawn(
            async move {
                let deadline = tokio::time::Instant::now() + CLAIM_TTL;
                let mut wait = Duration::from_millis(500);
                loop {
                    match releaser.release(&key, &claimant).await {
                        Ok(()) => {
                            info!(subsystem = "ingress", %key, "claim released");
                            break;
                        }
                        Err(e) if tokio::time::Instant::now() + wait < deadline => {
                            debug!(subsystem = "ingress", %key, error = %e, "claim release failed; retrying");
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(RELEASE_BACKOFF_MAX);
                        }
                        Err(e) => {
                            warn!(subsystem = "ingress", %key, error = %e, "claim never released; it has lapsed at its deadline");
                            break;
                        }
                    }
                }
                forget(&unreleased, &key, &claimant);
            }
            .in_current_span(),
        );
    }
}
