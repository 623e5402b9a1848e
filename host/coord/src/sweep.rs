//! The removal-marker sweep.
//!
//! Rule: every ageless bucket except epochs (which never removes a record)
//! keeps each removal marker for the life of the deployment, and every
//! listing whose pass meets one reads it again from the leader; so the
//! maintenance duty sweeps markers older than [`MARKER_RETENTION`]. The set
//! of swept buckets is derived from each bucket's retention in force, not
//! listed by hand, so a new ageless bucket is covered without anyone
//! remembering it. Each key is purged *through the marker's own revision*:
//! a record created again after the sweep saw the marker has a later
//! revision and survives (a bare purge would take it with the marker).
//! Nothing takes a marker as an answer, so sweeping changes no answer.
//! A marker's age is counted on the broker's clock, which stamped it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::bucket::{Bucket, BucketSpec, swept};
use crate::{Coord, MARKER_RETENTION};

/// What one sweep did, per bucket.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Markers purged, per swept bucket.
    pub swept: BTreeMap<Bucket, usize>,
    /// Buckets that could not be swept this time (retried next tick).
    pub failed: BTreeMap<Bucket, String>,
}

impl Coord {
    /// The buckets the sweep covers, from their retention in force.
    pub fn swept_buckets(&self) -> Vec<Bucket> {
        Bucket::ALL
            .into_iter()
            .filter(|&b| {
                swept(&BucketSpec {
                    bucket: b,
                    age: self.kv(b).age(b),
                })
            })
            .collect()
    }

    /// Sweeps markers older than [`MARKER_RETENTION`].
    pub async fn sweep_markers(&self) -> SweepReport {
        self.sweep_markers_older_than(MARKER_RETENTION).await
    }

    /// Sweeps markers written at least `age` ago (tests sweep every marker
    /// with `Duration::ZERO`). A bucket that fails does not stop the others.
    pub async fn sweep_markers_older_than(&self, age: Duration) -> SweepReport {
        let mut report = SweepReport::default();
        for b in self.swept_buckets() {
            let kv = self.kv(b);
            let result = async {
                // A marker's write instant is the broker's: so is its age.
                let now = kv.broker_now(b).await?;
                let before = now.checked_sub(age).unwrap_or(std::time::UNIX_EPOCH);
                let markers = kv.markers(b, before).await?;
                for m in &markers {
                    kv.purge_through(b, &m.key, m.revision).await?;
                }
                Ok::<_, crate::kv::Unavailable>(markers.len())
            }
            .await;
            match result {
                Ok(n) => {
                    report.swept.insert(b, n);
                }
                Err(e) => {
                    tracing::warn!(bucket = b.short(), error = %e.0, "coordination_markers sweep failed; retrying next tick");
                    report.failed.insert(b, e.0);
                }
            }
        }
        report
    }
}
