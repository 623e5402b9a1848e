//! Releasing a delivery claim: compare-and-delete of this attempt's own
//! claim, in the background with a backoff until the store answers or the
//! claim lapses (the rules are in [`super`]'s docs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crewlet_coord::{Answer, CoordError, Deliveries, Unreleased};
use tracing::{Instrument, debug, info, warn};

use super::{ACK_TIMEOUT, CLAIM_TTL};

/// Why a release did not settle: the claims bucket gave no answer, so the
/// claim may still stand (the host's side; asked again).
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    #[error(transparent)]
    Store(CoordError),
}

/// Forgets `key`'s unreleased claim if it is still `claimant`'s.
pub(super) fn forget(unreleased: &Mutex<HashMap<String, String>>, key: &str, claimant: &str) {
    let mut map = unreleased.lock().unwrap_or_else(PoisonError::into_inner);
    if map.get(key).is_some_and(|c| c == claimant) {
        map.remove(key);
    }
}

/// Releases delivery claims through [`Coord::release_claim`]:
/// compare-and-delete of this attempt's claim at the revision it was read
/// at, so a claim another attempt took over is never removed.
#[derive(Clone)]
pub(super) struct Releaser {
    pub(super) deliveries: Deliveries,
}

/// Longest a background release keeps trying between attempts.
const RELEASE_BACKOFF_MAX: Duration = Duration::from_secs(10);

impl Releaser {
    /// Removes the claim on `key` if `claimant` holds it. Ok when it is
    /// gone or another claimant's; Err when the store did not answer.
    pub(super) async fn release(&self, key: &str, claimant: &str) -> Result<(), ReleaseError> {
        self.release_once(key, claimant).await.map(|_| ())
    }

    /// As [`Releaser::release`], saying whether the key held nothing.
    async fn release_once(&self, key: &str, claimant: &str) -> Result<Found, ReleaseError> {
        let answer =
            tokio::time::timeout(ACK_TIMEOUT, self.deliveries.release_claim(key, claimant))
                .await
                .map_err(|_| ReleaseError::NoAnswer(ACK_TIMEOUT))?;
        match answer {
            Ok(Answer::Yes(())) => Ok(Found::Settled),
            Ok(Answer::No(Unreleased::Absent)) => Ok(Found::Nothing),
            // Lapsed, or another attempt's: not ours to remove.
            Ok(Answer::No(why)) => {
                debug!(subsystem = "ingress", %key, ?why, "claim not ours to release");
                Ok(Found::Settled)
            }
            // The store answered with a record that does not decode: it
            // cannot be shown to be this attempt's, so it is left alone.
            Err(e @ CoordError::Corrupt { .. }) => {
                warn!(subsystem = "ingress", %key, error = %e, "claim not released: its record does not decode");
                Ok(Found::Settled)
            }
            // Unknown (or contended): ask again.
            Err(e) => Err(ReleaseError::Store(e)),
        }
    }

    /// Releases in a task of its own, retrying with a backoff until the
    /// store answers or the claim has lapsed on its own. A claim whose
    /// write answered unknown (`landing`) may land after the store first
    /// answers "nothing there": the broker takes a write and a read of one
    /// connection on different queues. Such a key is looked at again, with
    /// the backoff, until it is found and removed or would have lapsed —
    /// else a retry reaching a peer would be answered `duplicate` of a
    /// delivery nobody has.
    pub(super) fn spawn(
        &self,
        key: String,
        claimant: String,
        landing: bool,
        unreleased: Arc<Mutex<HashMap<String, String>>>,
    ) {
        let releaser = self.clone();
        tokio::spawn(
            async move {
                let deadline = tokio::time::Instant::now() + CLAIM_TTL;
                let mut wait = Duration::from_millis(500);
                loop {
                    match releaser.release_once(&key, &claimant).await {
                        Ok(Found::Nothing) if landing && tokio::time::Instant::now() + wait < deadline => {
                            debug!(subsystem = "ingress", %key, "no claim there yet; its write may still land, looking again");
                            tokio::time::sleep(wait).await;
                            wait = (wait * 2).min(RELEASE_BACKOFF_MAX);
                        }
                        Ok(_) => {
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

/// What a release found.
enum Found {
    /// Removed, lapsed, or another attempt's: nothing left to do.
    Settled,
    /// The key held no claim.
    Nothing,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crewlet_coord::bucket::Retentions;
    use crewlet_coord::{Coord, CoordOptions, Kv, MemoryKv, Owner, SystemClock};

    fn coord() -> Coord {
        let opts = CoordOptions::new(Owner::incarnation("edge"));
        let kv: Arc<dyn Kv> = Arc::new(MemoryKv::new(
            Arc::new(SystemClock),
            &Retentions {
                lease_ttl: opts.lease_ttl,
                status: opts.status_age,
                rate: opts.rate_age,
            },
        ));
        Coord::with_backends(kv.clone(), kv, opts)
    }

    /// A claim whose write answered unknown lands after its release first
    /// found nothing: the release looks again and removes it.
    #[tokio::test]
    async fn a_claim_landing_after_its_release_looked_is_released_too() {
        let coord = coord();
        let releaser = Releaser {
            deliveries: coord.deliveries(),
        };
        let unreleased: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let (key, claimant) = ("github:late", "edge/t1");
        unreleased
            .lock()
            .unwrap()
            .insert(key.into(), claimant.into());
        releaser.spawn(key.into(), claimant.into(), true, unreleased.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            coord
                .claim_delivery(key, claimant, CLAIM_TTL)
                .await
                .unwrap()
                .is_yes(),
            "the late write lands"
        );
        let released = tokio::time::timeout(Duration::from_secs(10), async {
            while unreleased.lock().unwrap().contains_key(key) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(released.is_ok(), "the release never came back for it");
        assert!(
            coord
                .claim_delivery(key, "edge/t2", CLAIM_TTL)
                .await
                .unwrap()
                .is_yes(),
            "the key is free for the retry"
        );
    }
}
