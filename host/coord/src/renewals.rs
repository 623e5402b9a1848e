//! How this handle's lease renewals were answered, counted for the node's
//! metrics: yes, no (the lease was not ours any more) and unknown (the
//! store did not say) apart — an unknown is never a no here either.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::answer::Reply;

/// Renewal answers since this handle opened.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    yes: AtomicU64,
    no: AtomicU64,
    unknown: AtomicU64,
}

/// A read of the renewal counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenewalCounts {
    pub yes: u64,
    pub no: u64,
    pub unknown: u64,
}

impl Renewals {
    /// Counts `reply` and hands it on.
    pub(crate) fn count<Y, N>(&self, reply: Reply<Y, N>) -> Reply<Y, N> {
        let slot = match &reply {
            Ok(a) if a.is_yes() => &self.yes,
            Ok(_) => &self.no,
            Err(_) => &self.unknown,
        };
        slot.fetch_add(1, Ordering::Relaxed);
        reply
    }

    pub(crate) fn read(&self) -> RenewalCounts {
        RenewalCounts {
            yes: self.yes.load(Ordering::Relaxed),
            no: self.no.load(Ordering::Relaxed),
            unknown: self.unknown.load(Ordering::Relaxed),
        }
    }
}
