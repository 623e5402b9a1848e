//! [`Standing`]: whether this node knows the fleet's secrets, and since
//! when — what `/health` shows and `crewlet doctor` says of a running node.
//!
//! Rules, and why:
//! - **Three answers, never collapsed.** `unknown` until the first certified
//!   listing (every name not written here answers [`Lookup::Unknown`]);
//!   `known` from then on, for the process's life: a listing is the store's
//!   answer, and a later outage leaves it standing as the last answer,
//!   which [`Basis::LastListing`] says (the snapshot is served, its age
//!   shown), rather than pretending the names became unknown again.
//! - **Since when.** `since_ms` is when the standing shown began (this
//!   node's clock): an operator reads "unknown for 40 s" or "known since
//!   09:12", not a bare flag.
//! - **The reason, never a value.** `error` is the last reason the bucket
//!   is not followed (a broker's refusal, a deleted bucket), as the mirror
//!   logged it.
//!
//! [`Lookup::Unknown`]: crate::Lookup::Unknown

use serde::Serialize;
use tokio::sync::watch;

/// Whether this node knows the fleet's secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knowledge {
    /// The bucket has answered this node (a certified listing landed).
    Known,
    /// Not yet: every name not written here is unknown.
    Unknown,
}

/// What this node's answers rest on now (`/health`'s `secrets.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// A watch follows the bucket: a change anywhere reaches this node.
    Bucket,
    /// The bucket is being opened again; names answer from the last
    /// certified listing (and this node's own writes since).
    LastListing,
    /// No listing yet: nothing to answer from.
    None,
}

/// What `/health` shows under `secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Standing {
    pub state: Knowledge,
    /// When this standing began, Unix ms on this node's clock.
    pub since_ms: i64,
    pub source: Basis,
    /// Why the bucket is not followed now; `None` while it is (or before
    /// the first attempt answered).
    pub error: Option<String>,
}

/// The mirror's side: moves the standing as the bucket answers or fails.
pub(crate) struct Standings(watch::Sender<Standing>);

impl Standings {
    pub(crate) fn new() -> Standings {
        Standings(watch::Sender::new(Standing {
            state: Knowledge::Unknown,
            since_ms: crewlet_os::now_ms(),
            source: Basis::None,
            error: None,
        }))
    }

    pub(crate) fn now(&self) -> Standing {
        self.0.borrow().clone()
    }

    /// A watch follows the bucket (its listing just replaced the snapshot).
    pub(crate) fn following(&self) {
        self.set(Knowledge::Known, Basis::Bucket, None);
    }

    /// The bucket is not followed now, for `why`; `listed` says whether a
    /// certified listing ever landed.
    pub(crate) fn lost(&self, listed: bool, why: &str) {
        match listed {
            true => self.set(Knowledge::Known, Basis::LastListing, Some(why)),
            false => self.set(Knowledge::Unknown, Basis::None, Some(why)),
        }
    }

    /// `since_ms` moves only when state or source does: a new reason for
    /// the same outage is not a new outage.
    fn set(&self, state: Knowledge, source: Basis, why: Option<&str>) {
        self.0.send_if_modified(|s| {
            let moved = s.state != state || s.source != source;
            if moved {
                s.since_ms = crewlet_os::now_ms();
            }
            let error = why.map(str::to_owned);
            let changed = moved || s.error != error;
            (s.state, s.source, s.error) = (state, source, error);
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_until_listed_then_known_for_good_with_its_source_and_since() {
        let s = Standings::new();
        let start = s.now();
        assert_eq!(
            (start.state, start.source),
            (Knowledge::Unknown, Basis::None)
        );
        s.lost(false, "refused");
        let refused = s.now();
        assert_eq!(refused.state, Knowledge::Unknown);
        assert_eq!(refused.error.as_deref(), Some("refused"));
        s.lost(false, "refused again, in other words");
        assert_eq!(s.now().since_ms, refused.since_ms, "the same outage");
        s.following();
        let known = s.now();
        assert_eq!(
            (known.state, known.source),
            (Knowledge::Known, Basis::Bucket)
        );
        assert!(known.since_ms >= refused.since_ms);
        assert_eq!(known.error, None);
        // An outage after a listing: still known, from the last listing.
        s.lost(true, "the watch ended");
        let stale = s.now();
        assert_eq!(
            (stale.state, stale.source),
            (Knowledge::Known, Basis::LastListing)
        );
        let json = serde_json::to_value(&stale).unwrap();
        assert_eq!(json["state"], "known");
        assert_eq!(json["source"], "last_listing");
        assert_eq!(json["error"], "the watch ended");
    }
}
