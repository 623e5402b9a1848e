//! [`Secrets`]: the fleet's secrets bucket, mirrored in memory.
//!
//! Rules, and why:
//! - **Sealed in the bucket, opened at use.** The snapshot holds envelopes;
//!   a lookup opens one with the node's keyring ([`crate::Keyring`]). An
//!   envelope this node cannot open (key missing, corrupt) makes that one
//!   secret [`Lookup::Unavailable`] — never empty, never the environment's
//!   value — while every other secret is served.
//! - **The bucket is the source; this node holds a snapshot.** A watch
//!   answers the certified listing first, then every change after it, so a
//!   secret set through any node's API reaches every node without a restart
//!   and a read on the webhook path costs a map lookup, not a round trip.
//! - **Lookup order: the bucket, then this node's environment.** A name in
//!   the bucket wins; a name the bucket does not hold falls back to the
//!   process environment variable of that name, so a single-node dev setup
//!   (`GITHUB_WEBHOOK_SECRET=… crewlet run`) works with no bucket write. The
//!   bucket wins because it is what an operator changes at run time; an
//!   environment variable cannot be rotated without a restart.
//! - **Reconnect-safe.** A watch that fails or ends is opened again (with a
//!   backoff), and its fresh certified listing *replaces* the snapshot, so a
//!   removal made while this node was cut off is not kept alive. Until the
//!   first listing lands the snapshot is empty and the environment answers.
//! - **Never logged.** Values never reach a log line, an error message or a
//!   listing: [`Secrets::list`] answers names and update times only.
//! - **Ordered by revision.** Each name keeps the revision it was last set
//!   or removed at, and an older change never overwrites a newer one — so
//!   this node's own writes can land in the snapshot at once (the API's
//!   caller may deliver a webhook in the next instant) without a late watch
//!   event undoing them.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use std::time::Duration;

use crewlet_coord::kv::{Entry, Expect, Watch};
use crewlet_coord::names::{decode_token, encode_token};
use crewlet_coord::{Bucket, Change, Kv};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, warn};

use crate::keyring::{Envelope, Keyring, OpenError};
use crate::record::check_value;
pub use crate::record::{Listed, MAX_SECRET_BYTES, Record, SECRET_CLASS, SecretsError, check_name};
use crate::resolver::{Lookup, Resolver};

/// Longest a node waits for the first listing at start before it serves
/// from the environment alone (the watch keeps trying behind it).
pub const FIRST_LISTING: Duration = Duration::from_secs(5);
/// Backoff between watch attempts: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(8));

/// A snapshot entry: the envelope, or why the record could not be read.
type Held = Result<Envelope, String>;

/// One name in the snapshot: what it holds (None once removed) at a revision.
#[derive(Debug, Clone)]
struct Slot {
    value: Option<Held>,
    revision: u64,
}

#[derive(Default)]
struct Snapshot {
    slots: RwLock<HashMap<String, Slot>>,
}

impl Snapshot {
    fn get(&self, name: &str) -> Option<Held> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.get(name).and_then(|s| s.value.clone())
    }

    /// Applies one change unless the snapshot already holds a newer one.
    fn apply(&self, name: String, value: Option<Held>, revision: u64) {
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        match slots.get(&name) {
            Some(s) if s.revision >= revision => {}
            _ => {
                slots.insert(name, Slot { value, revision });
            }
        }
    }

    /// Replaces everything with a certified listing: a name it lacks is gone.
    fn replace(&self, listed: HashMap<String, Slot>) {
        *self.slots.write().unwrap_or_else(|p| p.into_inner()) = listed;
    }

    fn len(&self) -> usize {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.values().filter(|s| s.value.is_some()).count()
    }
}

fn key_of(name: &str) -> String {
    format!("{SECRET_CLASS}.{}", encode_token(name))
}

pub(crate) fn name_of(key: &str) -> Option<String> {
    key.strip_prefix(SECRET_CLASS)?
        .strip_prefix('.')
        .and_then(decode_token)
}

fn decode(name: &str, e: &Entry) -> Result<Record, SecretsError> {
    Record::from_bytes(name, &e.value)
}

/// A record as the snapshot holds it. One this node cannot read or open is
/// logged as it lands (by name, never its value); lookups answer it as
/// unavailable.
fn held(name: &str, e: &Entry, keyring: &RwLock<Keyring>) -> Held {
    let held = decode(name, e)
        .map(|r| r.envelope)
        .map_err(|err| err.to_string());
    let problem = match &held {
        Err(why) => Some(why.clone()),
        Ok(env) => keyring
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .open_envelope(name, env)
            .err()
            .map(|e| e.to_string()),
    };
    if let Some(why) = problem {
        warn!(subsystem = "secrets", secret = name, error = %why, "secret unavailable on this node");
    }
    held
}

fn unavailable(e: impl std::fmt::Display) -> SecretsError {
    SecretsError::Unavailable(e.to_string())
}

/// This node's view of the secrets bucket. Cheap to share behind an `Arc`;
/// stop it with [`Secrets::stop`].
pub struct Secrets {
    pub(crate) kv: Option<Arc<dyn Kv>>,
    pub(crate) keyring: Option<Arc<RwLock<Keyring>>>,
    snapshot: Arc<Snapshot>,
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Secrets {
    /// Opens the secrets bucket on the node's one connection (never a second
    /// dial) and starts mirroring it.
    pub async fn open(
        client: async_nats::Client,
        coord: &crewlet_coord::Coord,
        keyring: Keyring,
    ) -> Result<Secrets, SecretsError> {
        let opts = coord.options();
        let retentions = crewlet_coord::bucket::Retentions {
            lease_ttl: opts.lease_ttl,
            status: opts.status_age,
            rate: opts.rate_age,
        };
        let kv = crewlet_coord::NatsKv::open(
            client,
            &opts.namespace,
            &[Bucket::Secrets],
            &retentions,
            opts.replicas,
            opts.request_timeout,
        )
        .await
        .map_err(unavailable)?;
        Ok(Secrets::start(Arc::new(kv), keyring).await)
    }

    /// Starts mirroring the secrets bucket of `kv`: waits up to
    /// [`FIRST_LISTING`] for the first certified listing, then keeps the
    /// snapshot current until [`Secrets::stop`].
    pub async fn start(kv: Arc<dyn Kv>, keyring: Keyring) -> Secrets {
        let snapshot = Arc::new(Snapshot::default());
        let keyring = Arc::new(RwLock::new(keyring));
        let (stop, stop_rx) = watch::channel(false);
        let (first_tx, mut first_rx) = watch::channel(false);
        let task = tokio::spawn(
            mirror(
                kv.clone(),
                keyring.clone(),
                snapshot.clone(),
                stop_rx,
                first_tx,
            )
            .instrument(tracing::info_span!("secrets", subsystem = "secrets")),
        );
        let first = tokio::time::timeout(FIRST_LISTING, first_rx.wait_for(|ready| *ready)).await;
        if !matches!(first, Ok(Ok(_))) {
            warn!(
                subsystem = "secrets",
                "the secrets bucket did not answer at start; serving secrets from this node's environment until it does"
            );
        }
        Secrets {
            kv: Some(kv),
            keyring: Some(keyring),
            snapshot,
            stop,
            task: std::sync::Mutex::new(Some(task)),
        }
    }

    /// No bucket: the environment alone (tools and benchmarks).
    pub fn environment_only() -> Secrets {
        let (stop, _) = watch::channel(false);
        Secrets {
            kv: None,
            keyring: None,
            snapshot: Arc::default(),
            stop,
            task: std::sync::Mutex::new(None),
        }
    }

    /// The value of `name`: the bucket's, else this node's environment
    /// variable `name` (see the module docs for why in that order).
    pub fn get(&self, name: &str) -> Lookup {
        lookup(&self.snapshot, self.keyring.as_deref(), name)
    }

    /// The resolver every reader of secrets on this node holds.
    pub fn resolver(&self) -> Resolver {
        let snapshot = self.snapshot.clone();
        let keyring = self.keyring.clone();
        Resolver::new(move |name: &str| lookup(&snapshot, keyring.as_deref(), name))
    }

    /// How many secrets the snapshot holds (never which values).
    pub fn held(&self) -> usize {
        self.snapshot.len()
    }

    pub(crate) fn kv(&self) -> Result<&Arc<dyn Kv>, SecretsError> {
        self.kv
            .as_ref()
            .ok_or_else(|| unavailable("this node has no secrets bucket open"))
    }

    /// Sets `name` in the bucket (and in this node's snapshot at once).
    pub async fn set(&self, name: &str, value: &str) -> Result<u64, SecretsError> {
        check_value(name, value)?;
        let record = {
            let keyring = self
                .keyring
                .as_ref()
                .ok_or_else(|| SecretsError::NoKeyring(name.to_owned()))?
                .read()
                .unwrap_or_else(|p| p.into_inner());
            Record::seal(&keyring, name, value)?
        };
        self.put_record(name, &record, Expect::Any).await
    }

    /// Writes an already sealed record (a stopped node's pending row, a
    /// re-sealed value) to the bucket and this node's snapshot.
    pub async fn put_record(
        &self,
        name: &str,
        record: &Record,
        expect: Expect,
    ) -> Result<u64, SecretsError> {
        check_name(name)?;
        let kv = self.kv()?;
        let revision = kv
            .put(Bucket::Secrets, &key_of(name), record.to_bytes(), expect)
            .await
            .map_err(|u| unavailable(u.0))?
            .map_err(|_| unavailable(format!("{name} changed while it was being written")))?;
        self.snapshot
            .apply(name.to_owned(), Some(Ok(record.envelope.clone())), revision);
        Ok(revision)
    }

    /// The record the bucket holds for `name` now (leader read) and its
    /// revision; `None` when unset.
    pub async fn record(&self, name: &str) -> Result<Option<(Record, u64)>, SecretsError> {
        check_name(name)?;
        match self.kv()?.get(Bucket::Secrets, &key_of(name)).await {
            Ok(Some(e)) if !e.removed => Ok(Some((decode(name, &e)?, e.revision))),
            Ok(_) => Ok(None),
            Err(u) => Err(unavailable(u.0)),
        }
    }

    /// Removes `name`. Answers whether it was set.
    pub async fn remove(&self, name: &str) -> Result<bool, SecretsError> {
        check_name(name)?;
        let kv = self.kv()?;
        let key = key_of(name);
        for _ in 0..8 {
            let live = match kv.get(Bucket::Secrets, &key).await {
                Ok(Some(e)) if !e.removed => e,
                Ok(_) => return Ok(false),
                Err(u) => return Err(unavailable(u.0)),
            };
            match kv
                .remove(Bucket::Secrets, &key, Expect::Revision(live.revision))
                .await
            {
                Ok(Ok(marker)) => {
                    self.snapshot.apply(name.to_owned(), None, marker);
                    return Ok(true);
                }
                // Set again in between: read it again and remove that.
                Ok(Err(_conflict)) => continue,
                Err(u) => return Err(unavailable(u.0)),
            }
        }
        Err(unavailable(format!(
            "{name} kept changing while it was being removed"
        )))
    }

    /// Every secret's name and update time, from the bucket (certified
    /// listing), sorted by name. Never a value.
    pub async fn list(&self) -> Result<Vec<Listed>, SecretsError> {
        let kv = self.kv()?;
        let entries = kv
            .list(Bucket::Secrets, Some(SECRET_CLASS))
            .await
            .map_err(|u| unavailable(u.0))?;
        let keyring = self
            .keyring
            .as_ref()
            .map(|k| k.read().unwrap_or_else(|p| p.into_inner()));
        let mut out = Vec::new();
        for e in entries.iter().filter(|e| !e.removed) {
            let Some(name) = name_of(&e.key) else {
                continue;
            };
            out.push(match decode(&name, e) {
                Ok(rec) => Listed {
                    problem: match &keyring {
                        Some(k) => k
                            .open_envelope(&name, &rec.envelope)
                            .err()
                            .map(|e| e.to_string()),
                        None => Some("this node has no keyring open".into()),
                    },
                    name,
                    updated_ms: rec.updated_ms,
                    key: Some(rec.envelope.key),
                },
                Err(err) => Listed {
                    name,
                    updated_ms: 0,
                    key: None,
                    problem: Some(err.to_string()),
                },
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Stops the watch.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

fn lookup(snapshot: &Snapshot, keyring: Option<&RwLock<Keyring>>, name: &str) -> Lookup {
    match snapshot.get(name) {
        None => match std::env::var(name) {
            Ok(v) => Lookup::Found(v),
            Err(_) => Lookup::Unset,
        },
        Some(Err(why)) => Lookup::Unavailable(why),
        Some(Ok(envelope)) => {
            let Some(keyring) = keyring else {
                return Lookup::Unavailable(format!(
                    "secret {name} is sealed and this node has no keyring open"
                ));
            };
            let keyring = keyring.read().unwrap_or_else(|p| p.into_inner());
            match keyring.open_envelope(name, &envelope) {
                Ok(v) => Lookup::Found(v),
                Err(e @ (OpenError::NoKey { .. } | OpenError::Corrupt { .. })) => {
                    Lookup::Unavailable(e.to_string())
                }
            }
        }
    }
}

/// The mirror loop: watch, load the listing, follow changes; on a failure
/// or an end, back off and watch again. Ends when `stop` is set.
async fn mirror(
    kv: Arc<dyn Kv>,
    keyring: Arc<RwLock<Keyring>>,
    snapshot: Arc<Snapshot>,
    mut stop: watch::Receiver<bool>,
    first: watch::Sender<bool>,
) {
    let mut backoff = BACKOFF.0;
    let mut down = false;
    loop {
        let opened = tokio::select! {
            w = kv.watch(Bucket::Secrets, Some(SECRET_CLASS)) => w,
            _ = stop.wait_for(|s| *s) => return,
        };
        match opened {
            Ok(w) => {
                backoff = BACKOFF.0;
                if std::mem::take(&mut down) {
                    info!(subsystem = "secrets", "secrets bucket readable again");
                }
                let why = follow(w, &keyring, &snapshot, &first, &mut stop).await;
                match why {
                    None => return,
                    Some(why) => {
                        warn!(subsystem = "secrets", reason = %why,
                            "secrets watch interrupted; watching again (the snapshot stays as it was)");
                    }
                }
            }
            Err(u) => {
                if !down {
                    warn!(subsystem = "secrets", error = %u.0,
                        "secrets bucket unreadable; keeping the snapshot and retrying");
                }
                down = true;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        backoff = (backoff * 2).min(BACKOFF.1);
    }
}

/// Loads a watch's listing and follows its changes. `None`: stopped;
/// `Some(why)`: the watch failed or ended.
async fn follow(
    w: Watch,
    keyring: &RwLock<Keyring>,
    snapshot: &Snapshot,
    first: &watch::Sender<bool>,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    let mut listed = HashMap::new();
    for e in &w.initial {
        let Some(name) = name_of(&e.key) else {
            continue;
        };
        let value = Some(held(&name, e, keyring));
        listed.insert(
            name,
            Slot {
                value,
                revision: e.revision,
            },
        );
    }
    snapshot.replace(listed);
    first.send_replace(true);
    let mut changes = w.changes;
    loop {
        let next = tokio::select! {
            n = changes.next() => n,
            _ = stop.wait_for(|s| *s) => return None,
        };
        match next {
            None => return Some("the watch ended".into()),
            Some(Err(u)) => return Some(u.0),
            Some(Ok(Change::Put(e))) => {
                let Some(name) = name_of(&e.key) else {
                    continue;
                };
                let value = held(&name, &e, keyring);
                snapshot.apply(name, Some(value), e.revision);
            }
            Some(Ok(Change::Removed { key, revision })) => {
                if let Some(name) = name_of(&key) {
                    snapshot.apply(name, None, revision);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
