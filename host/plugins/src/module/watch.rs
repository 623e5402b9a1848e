//! A module's watches, kept open while the module instance lives, and the
//! board `/plugins` reads them from.
//!
//! Rules, and why (ADR 202):
//! - A watch hands the module the certified current values (no
//!   deletions), one end-of-current, then every change.
//! - A watch whose bucket stops answering — its changes fail or end, or
//!   opening it fails — is re-opened, never ended: after 0.5 s, doubling to
//!   30 s between attempts ([`backoff`]), for as long as the instance lives.
//!   On a three-node fleet a bucket on one server that was killed ended the
//!   watches on the other nodes with a log line while `/health` reported
//!   nothing failed; every watch's state is now on the [`WatchBoard`].
//! - A re-opened watch resumes after what it delivered, without a second
//!   current pass: it lists the bucket again (certified, like the first
//!   time) and hands on only the difference from what it last delivered —
//!   a key whose revision moved as a put, a key that is gone as a deletion,
//!   sorted by key. The module sees what a watch that never broke would have
//!   shown, with the gap's changes coalesced to their latest value, and a
//!   value that aged out during the gap as a deletion. A key is unchanged
//!   when its revision and a hash of its value both are: a bucket deleted
//!   and created again restarts its revisions. The price is a key →
//!   (revision, hash) map of what was delivered, bounded by the bucket.
//! - A re-listing takes the module's listing permit like the first one (one
//!   listing of a module in memory at a time).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use crate::state::{Changed, StateBackend, StateWatch, StoredEntry, WatchItem};

/// The first wait before re-opening a watch.
pub const REOPEN_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two attempts.
pub const REOPEN_MAX: Duration = Duration::from_secs(30);

/// The wait before attempt `attempt` (1-based) to re-open a watch.
pub fn backoff(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    (REOPEN_FIRST * (1u32 << doublings)).min(REOPEN_MAX)
}

/// What a delivered value is remembered by: its revision and a hash of it.
fn mark(e: &StoredEntry) -> (u64, u64) {
    let mut h = DefaultHasher::new();
    e.value.hash(&mut h);
    (e.revision, h.finish())
}

/// Where a watch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchState {
    /// Its first listing is not yet handed on.
    Starting,
    /// Its changes are being delivered.
    Live,
    /// Its bucket stopped answering; attempts to re-open it run.
    Reopening,
}

impl WatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchState::Starting => "starting",
            WatchState::Live => "live",
            WatchState::Reopening => "reopening",
        }
    }
}

/// One watch, as `/plugins` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchView {
    /// The id `watch` returned to the module.
    pub id: u64,
    /// The bucket as the module names it.
    pub bucket: String,
    pub state: WatchState,
    /// Failed attempts since it was last live (0 while live).
    pub attempts: u32,
    /// How many times it was re-opened after its bucket stopped answering.
    pub reopened: u32,
    /// Why it last stopped or failed to re-open, if it ever did.
    pub last_error: Option<String>,
}

/// A module's watches, by registration.
#[derive(Debug, Default)]
pub struct WatchBoard {
    watches: Mutex<BTreeMap<u64, WatchView>>,
    next: AtomicU64,
}

impl WatchBoard {
    /// Every watch the module's live instance holds, oldest first.
    pub fn views(&self) -> Vec<WatchView> {
        self.lock().values().cloned().collect()
    }

    /// Registers a watch; it leaves the board when the entry is dropped
    /// (its task ended or was aborted with the instance).
    pub(super) fn register(self: &Arc<Self>, id: u64, bucket: &str) -> BoardEntry {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            key,
            WatchView {
                id,
                bucket: bucket.to_string(),
                state: WatchState::Starting,
                attempts: 0,
                reopened: 0,
                last_error: None,
            },
        );
        BoardEntry {
            board: self.clone(),
            key,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, WatchView>> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One watch's row on the board.
pub(super) struct BoardEntry {
    board: Arc<WatchBoard>,
    key: u64,
}

impl BoardEntry {
    fn update(&self, f: impl FnOnce(&mut WatchView)) {
        if let Some(view) = self.board.lock().get_mut(&self.key) {
            f(view);
        }
    }

    fn live(&self) {
        self.update(|v| {
            if v.state == WatchState::Reopening {
                v.reopened += 1;
            }
            v.state = WatchState::Live;
            v.attempts = 0;
        });
    }

    fn failed(&self, attempts: u32, error: &str) {
        self.update(|v| {
            v.state = WatchState::Reopening;
            v.attempts = attempts;
            v.last_error = Some(error.to_string());
        });
    }
}

impl Drop for BoardEntry {
    fn drop(&mut self) {
        self.board.lock().remove(&self.key);
    }
}

/// What one watch needs to run.
pub(super) struct WatchTask {
    pub(super) plugin: String,
    /// The bucket as the module names it (for logs).
    pub(super) local: String,
    /// The mesh-wide bucket name.
    pub(super) bucket: String,
    pub(super) backend: Arc<dyn StateBackend>,
    pub(super) listing: Arc<tokio::sync::Semaphore>,
    pub(super) entry: BoardEntry,
}

impl WatchTask {
    /// Runs the watch until `deliver` answers false (the module's queue is
    /// gone) or the task is aborted with its instance.
    pub(super) async fn run<F, Fut>(self, mut deliver: F)
    where
        F: FnMut(WatchItem) -> Fut,
        Fut: Future<Output = bool>,
    {
        let (plugin, local) = (self.plugin.as_str(), self.local.as_str());
        // Key → mark of what the module was handed; `None` until its
        // end-of-current was.
        let mut delivered: Option<HashMap<String, (u64, u64)>> = None;
        let mut attempts = 0u32;
        loop {
            if attempts > 0 {
                tokio::time::sleep(backoff(attempts)).await;
            }
            let Ok(permit) = self.listing.clone().acquire_owned().await else {
                return;
            };
            let StateWatch {
                current,
                mut changes,
            } = match self.backend.watch(&self.bucket).await {
                Ok(watch) => watch,
                Err(e) => {
                    drop(permit);
                    attempts += 1;
                    let wait = backoff(attempts);
                    tracing::warn!(
                        plugin,
                        bucket = local,
                        attempts,
                        ?wait,
                        "a state watch could not be opened; trying again: {e}"
                    );
                    self.entry.failed(attempts, &e.to_string());
                    continue;
                }
            };
            let mut known = HashMap::with_capacity(current.len());
            let steps = match delivered.take() {
                None => {
                    let mut steps = Vec::with_capacity(current.len() + 1);
                    for e in current {
                        known.insert(e.key.clone(), mark(&e));
                        steps.push(WatchItem::Current(e));
                    }
                    steps.push(WatchItem::EndOfCurrent);
                    steps
                }
                Some(before) => {
                    let mut steps = Vec::new();
                    for e in current {
                        let now = mark(&e);
                        known.insert(e.key.clone(), now);
                        if before.get(&e.key) != Some(&now) {
                            steps.push(WatchItem::Put(e));
                        }
                    }
                    let mut gone: Vec<String> = before
                        .into_keys()
                        .filter(|k| !known.contains_key(k))
                        .collect();
                    gone.sort();
                    steps.extend(gone.into_iter().map(WatchItem::Deleted));
                    steps
                }
            };
            for step in steps {
                // Waits while the module's queue is full: backpressure.
                if !deliver(step).await {
                    return;
                }
            }
            drop(permit);
            if attempts > 0 {
                tracing::info!(plugin, bucket = local, attempts, "state watch re-opened");
            }
            self.entry.live();
            let why = loop {
                let step = match changes.next().await {
                    Some(Ok(Changed::Put(e))) => {
                        known.insert(e.key.clone(), mark(&e));
                        WatchItem::Put(e)
                    }
                    Some(Ok(Changed::Deleted(k))) => {
                        known.remove(&k);
                        WatchItem::Deleted(k)
                    }
                    Some(Err(e)) => break e.to_string(),
                    None => break "the watch's subscription closed".to_string(),
                };
                if !deliver(step).await {
                    return;
                }
            };
            drop(changes);
            delivered = Some(known);
            attempts = 1;
            tracing::warn!(plugin, bucket = local, wait = ?backoff(attempts), "a state watch stopped answering; re-opening it: {why}");
            self.entry.failed(attempts, &why);
        }
    }
}

#[cfg(test)]
mod tests;
