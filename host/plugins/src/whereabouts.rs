//! Where a guest's call stands when its deadline cuts it, so the cut is
//! charged to whoever the guest was waiting on ([`Blame`]).
//!
//! The rule: the guest is to blame unless the cut found it parked inside a
//! host call (not at a tick's yield, where its own code was running) while
//! a wait of the host's on its behalf was in flight — a vendor's answer
//! over `wasi:http`, a bucket, the bus. A wait the guest chose (a timer)
//! is the guest's. Read while the cut task still stands: dropping it ends
//! the waits it was in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::fault::Blame;

/// Where one instance's call stands, shared by its store and the caller
/// that outlives a cut store.
#[derive(Debug, Default)]
pub(crate) struct Whereabouts {
    /// The guest is parked at a tick's yield: its own code was running.
    at_tick: AtomicBool,
    /// Waits of the host's in flight for this instance (see [`HostWait`]).
    host_waits: AtomicUsize,
}

impl Whereabouts {
    /// The guest parks at a tick's yield (`true`), or resumes from it.
    pub(crate) fn at_tick(&self, parked: bool) {
        self.at_tick.store(parked, Ordering::SeqCst);
    }

    /// A wait of the host's begins; it ends when the value is dropped.
    pub(crate) fn host_wait(self: &Arc<Self>) -> HostWait {
        self.host_waits.fetch_add(1, Ordering::SeqCst);
        HostWait(self.clone())
    }

    /// Who a deadline that cut the call now is charged to: the host when
    /// the guest was not at a tick (so inside a host call) while a wait of
    /// the host's was in flight; else the guest — its own code, or a wait
    /// it chose (a timer).
    pub(crate) fn blame_for_cut(&self) -> Blame {
        let in_host = !self.at_tick.load(Ordering::SeqCst);
        if in_host && self.host_waits.load(Ordering::SeqCst) > 0 {
            Blame::Host
        } else {
            Blame::Guest
        }
    }
}

/// A wait the host makes on a guest's behalf (a vendor's answer, a bucket,
/// the bus), counted while it lasts.
#[derive(Debug)]
pub(crate) struct HostWait(Arc<Whereabouts>);

impl Drop for HostWait {
    fn drop(&mut self) {
        self.0.host_waits.fetch_sub(1, Ordering::SeqCst);
    }
}
