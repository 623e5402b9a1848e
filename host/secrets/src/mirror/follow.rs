//! The mirror task: opens the bucket (again) when it is not open, watches
//! it, replaces the snapshot with each certified listing and follows the
//! changes, checked against a fresh listing every [`RESYNC`]; on any
//! failure it backs off and goes round again (the rules are the parent
//! module's).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crewlet_coord::kv::Watch;
use crewlet_coord::{Bucket, Change, Kv};
use futures::StreamExt;
use tokio::sync::watch;
use tracing::{info, warn};

use super::{
    BACKOFF, Opened, Opener, RESYNC, SECRET_CLASS, Slot, Snapshot, Standings, held, name_of,
};
use crate::keyring::Keyring;

/// What the mirror task holds.
pub(super) struct Mirror {
    pub(super) opener: Opener,
    pub(super) opened: Arc<Opened>,
    pub(super) keyring: Arc<RwLock<Keyring>>,
    pub(super) snapshot: Arc<Snapshot>,
    pub(super) first: watch::Sender<bool>,
    pub(super) standing: Arc<Standings>,
}

/// The mirror loop: open the bucket (again) if it is not open, watch, load
/// the listing, follow changes; on a failure or an end, back off and go
/// round again. Ends when `stop` is set.
pub(super) async fn mirror(m: Mirror, mut stop: watch::Receiver<bool>) {
    let mut backoff = BACKOFF.0;
    let mut down = false;
    loop {
        let kv = match m.opened.get() {
            Some(kv) => Some(kv),
            None => {
                let opening = tokio::select! {
                    o = (m.opener)() => o,
                    _ = stop.wait_for(|s| *s) => return,
                };
                match opening {
                    Ok(kv) => {
                        info!(subsystem = "secrets", "secrets bucket open");
                        m.opened.set(Some(kv.clone()));
                        Some(kv)
                    }
                    Err(why) => {
                        m.standing.lost(m.snapshot.listed(), &why);
                        if !std::mem::replace(&mut down, true) {
                            warn!(subsystem = "secrets", error = %why, listed = m.snapshot.listed(),
                                "secrets bucket not opened; opening it again with a backoff (names this node has no listing for are unknown meanwhile)");
                        }
                        None
                    }
                }
            }
        };
        if let Some(kv) = kv {
            let watching = tokio::select! {
                w = kv.watch(Bucket::Secrets, Some(SECRET_CLASS)) => w,
                _ = stop.wait_for(|s| *s) => return,
            };
            match watching {
                Ok(w) => {
                    backoff = BACKOFF.0;
                    if std::mem::take(&mut down) {
                        info!(subsystem = "secrets", "secrets bucket readable again");
                    }
                    match follow(w, &kv, &m, &mut stop).await {
                        None => return,
                        Some(why) => {
                            m.standing.lost(m.snapshot.listed(), &why);
                            warn!(subsystem = "secrets", reason = %why,
                                "secrets watch interrupted; opening the bucket and its watch again (the snapshot stays as it was)");
                            m.opened.set(None);
                        }
                    }
                }
                Err(u) => {
                    m.standing.lost(m.snapshot.listed(), &u.0);
                    if !std::mem::replace(&mut down, true) {
                        warn!(subsystem = "secrets", error = %u.0,
                            "secrets bucket unreadable; keeping the snapshot and opening the bucket again");
                    }
                    // Opened again before the next watch: a bucket deleted
                    // under this node is created anew.
                    m.opened.set(None);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// Loads a watch's listing and follows its changes, checking them against
/// a fresh listing every [`RESYNC`]. `None`: stopped; `Some(why)`: the
/// watch failed or ended, or the check failed or differed.
async fn follow(
    w: Watch,
    kv: &Arc<dyn Kv>,
    m: &Mirror,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let mut listed = HashMap::new();
    for e in &w.initial {
        let Some(name) = name_of(&e.key) else {
            continue;
        };
        let value = Some(held(&name, e, &m.keyring));
        listed.insert(
            name,
            Slot {
                value,
                revision: e.revision,
            },
        );
    }
    m.snapshot.replace(listed);
    m.standing.following();
    m.first.send_replace(true);
    let mut changes = w.changes;
    let mut check = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            n = changes.next() => Some(n),
            _ = check.tick() => None,
            _ = stop.wait_for(|s| *s) => return None,
        };
        let Some(next) = next else {
            match kv.list(Bucket::Secrets, Some(SECRET_CLASS)).await {
                Err(u) => return Some(format!("the bucket did not answer its check: {}", u.0)),
                Ok(entries) if !m.snapshot.matches(&entries) => {
                    return Some(
                        "the bucket no longer holds what its watch showed (deleted or re-created?)"
                            .into(),
                    );
                }
                Ok(_) => continue,
            }
        };
        match next {
            None => return Some("the watch ended".into()),
            Some(Err(u)) => return Some(u.0),
            Some(Ok(Change::Put(e))) => {
                let Some(name) = name_of(&e.key) else {
                    continue;
                };
                let value = held(&name, &e, &m.keyring);
                m.snapshot.apply(name, Some(value), e.revision);
            }
            Some(Ok(Change::Removed { key, revision })) => {
                if let Some(name) = name_of(&key) {
                    m.snapshot.apply(name, None, revision);
                }
            }
        }
    }
}
