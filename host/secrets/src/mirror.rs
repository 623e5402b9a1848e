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
//! - **Unknown until the bucket answers.** Until this node holds a
//!   certified listing, a name it has not written itself is
//!   [`Lookup::Unknown`] — not unset, and not the environment's value: the
//!   bucket may hold a newer value (a rotated key) than a stale variable.
//!   Readers wait or retry on unknown; none goes on without the secret.
//! - **Precedence, one rule: the bucket, then this node's environment.**
//!   Once listed, a name the bucket holds answers from the bucket (even if
//!   the environment has it too); a name the bucket does not hold answers
//!   from the process environment variable of that name, so a single-node
//!   dev setup (`GITHUB_WEBHOOK_SECRET=… crewlet run`) works with no bucket
//!   write; else it is unset. The bucket wins because it is what an
//!   operator changes at run time; an environment variable cannot be
//!   rotated without a restart. [`Secrets::source`] says which one answers.
//! - **Opened again, never environment-only.** A bucket that cannot be
//!   opened at start is opened again with a backoff (names stay unknown
//!   meanwhile); a watch that fails or ends is opened again the same way,
//!   and when the watch itself cannot be opened the bucket is opened again
//!   first — so a bucket deleted under a running node is created anew and
//!   its (empty) listing replaces the snapshot. A fresh certified listing
//!   always *replaces* the snapshot, so a removal made while this node was
//!   cut off is not kept alive; between listings the snapshot stays as it
//!   was (the store's last answer, not unknown).
//! - **Never logged.** Values never reach a log line, an error message or a
//!   listing: [`Secrets::list`] answers names and update times only.
//! - **Ordered by revision.** Each name keeps the revision it was last set
//!   or removed at, and an older change never overwrites a newer one — so
//!   this node's own writes can land in the snapshot at once (the API's
//!   caller may deliver a webhook in the next instant) without a late watch
//!   event undoing them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use std::time::Duration;

use crewlet_coord::kv::{Entry, Expect};
use crewlet_coord::names::{decode_token, encode_token};
use crewlet_coord::{Bucket, Kv};
use futures::future::BoxFuture;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, warn};

use crate::keyring::{Envelope, Keyring, OpenError};
use crate::record::check_value;
pub use crate::record::{Listed, MAX_SECRET_BYTES, Record, SECRET_CLASS, SecretsError, check_name};
use crate::resolver::{Lookup, Resolver};

/// Longest a node waits at start for the first listing; after it, names
/// answer [`Lookup::Unknown`] until the listing lands (the mirror keeps
/// trying behind it).
pub const FIRST_LISTING: Duration = Duration::from_secs(5);
/// How often a followed watch is checked against a fresh certified listing
/// of the bucket. The watch alone never notices its bucket deleted (the
/// client re-creates its consumer for ever) nor re-created under the same
/// name; a listing that fails or differs from the snapshot opens the bucket
/// and its watch again.
const RESYNC: Duration = Duration::from_secs(15);
/// Backoff between attempts to open the bucket or its watch: doubles from
/// the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(8));

/// Opens the secrets bucket (again): on the node's connection, or a fixed
/// store in tests. The error says why, never a value.
pub type Opener =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Kv>, String>> + Send + Sync + 'static>;

/// Where a name answers from on this node (see the module docs' one rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The fleet's bucket holds it (it wins over the environment).
    Bucket,
    /// The bucket does not hold it; this node's environment variable does.
    Environment,
    /// Neither holds it.
    Unset,
    /// The bucket has not answered this node yet.
    Unknown,
}

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
    /// A certified listing has landed: a name it lacks is not in the bucket.
    listed: AtomicBool,
    /// Counts every change to what a lookup may answer ([`Secrets::changes`]).
    changed: watch::Sender<u64>,
}

impl Snapshot {
    /// `None`: not a name the snapshot knows; `Some(None)`: removed.
    fn get(&self, name: &str) -> Option<Option<Held>> {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.get(name).map(|s| s.value.clone())
    }

    fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Applies one change unless the snapshot already holds a newer one.
    fn apply(&self, name: String, value: Option<Held>, revision: u64) {
        let mut slots = self.slots.write().unwrap_or_else(|p| p.into_inner());
        match slots.get(&name) {
            Some(s) if s.revision >= revision => {}
            _ => {
                slots.insert(name, Slot { value, revision });
                drop(slots);
                self.changed.send_modify(|n| *n += 1);
            }
        }
    }

    /// Replaces everything with a certified listing: a name it lacks is
    /// gone, and from now on names are known.
    fn replace(&self, listed: HashMap<String, Slot>) {
        *self.slots.write().unwrap_or_else(|p| p.into_inner()) = listed;
        self.listed.store(true, Ordering::Release);
        self.changed.send_modify(|n| *n += 1);
    }

    fn len(&self) -> usize {
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        slots.values().filter(|s| s.value.is_some()).count()
    }

    /// Whether a certified listing holds exactly the names and revisions
    /// the snapshot holds (a change in flight may make it differ: then the
    /// watch is merely opened again).
    fn matches(&self, entries: &[Entry]) -> bool {
        let listed: HashMap<String, u64> = entries
            .iter()
            .filter(|e| !e.removed)
            .filter_map(|e| Some((name_of(&e.key)?, e.revision)))
            .collect();
        let slots = self.slots.read().unwrap_or_else(|p| p.into_inner());
        let held = slots.values().filter(|s| s.value.is_some()).count();
        held == listed.len()
            && listed.iter().all(|(name, revision)| {
                slots
                    .get(name)
                    .is_some_and(|s| s.value.is_some() && s.revision == *revision)
            })
    }
}

/// The bucket as currently opened (none until opened, and again while it is
/// being opened anew), shared by the mirror and the writers.
#[derive(Default)]
struct Opened(RwLock<Option<Arc<dyn Kv>>>);

impl Opened {
    fn get(&self) -> Option<Arc<dyn Kv>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, kv: Option<Arc<dyn Kv>>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = kv;
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
    opened: Arc<Opened>,
    pub(crate) keyring: Option<Arc<RwLock<Keyring>>>,
    snapshot: Arc<Snapshot>,
    listed: watch::Receiver<bool>,
    standing: Arc<Standings>,
    stop: watch::Sender<bool>,
    task: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl Secrets {
    /// Mirrors the secrets bucket on the node's one connection (never a
    /// second dial). Never fails: a bucket that cannot be opened now is
    /// opened again with a backoff, and until it is listed every name this
    /// node has not written is [`Lookup::Unknown`]. `opts`: the ones
    /// coordination runs with (the bucket's namespace, replicas, timeout) —
    /// plain values, no coordination contract.
    pub async fn open(
        client: async_nats::Client,
        opts: &crewlet_coord::CoordOptions,
        keyring: Keyring,
    ) -> Secrets {
        let opts = opts.clone();
        let opener: Opener = Arc::new(move || {
            let (client, opts) = (client.clone(), opts.clone());
            Box::pin(async move {
                let retentions = crewlet_coord::bucket::Retentions {
                    lease_ttl: opts.lease_ttl,
                    status: opts.status_age,
                    rate: opts.rate_age,
                };
                crewlet_coord::NatsKv::open(
                    client,
                    &opts.namespace,
                    &[Bucket::Secrets],
                    &retentions,
                    opts.replicas,
                    opts.request_timeout,
                )
                .await
                .map(|kv| Arc::new(kv) as Arc<dyn Kv>)
                .map_err(|e| e.to_string())
            })
        });
        Secrets::with_opener(opener, keyring, FIRST_LISTING).await
    }

    /// Mirrors the secrets bucket of `kv` (tests and tools): see
    /// [`Secrets::with_opener`].
    pub async fn start(kv: Arc<dyn Kv>, keyring: Keyring) -> Secrets {
        let opener: Opener = Arc::new(move || {
            let kv = kv.clone();
            Box::pin(async move { Ok(kv) })
        });
        Secrets::with_opener(opener, keyring, FIRST_LISTING).await
    }

    /// Starts mirroring the bucket `opener` opens (again, when it fails):
    /// waits up to `first` for the first certified listing, then keeps the
    /// snapshot current until [`Secrets::stop`].
    pub async fn with_opener(opener: Opener, keyring: Keyring, first: Duration) -> Secrets {
        let snapshot = Arc::new(Snapshot::default());
        let opened = Arc::new(Opened::default());
        let keyring = Arc::new(RwLock::new(keyring));
        let (stop, stop_rx) = watch::channel(false);
        let (first_tx, mut listed) = watch::channel(false);
        let standing = Arc::new(Standings::new());
        let task = tokio::spawn(
            mirror(
                Mirror {
                    opener,
                    opened: opened.clone(),
                    keyring: keyring.clone(),
                    snapshot: snapshot.clone(),
                    first: first_tx,
                    standing: standing.clone(),
                },
                stop_rx,
            )
            .instrument(tracing::info_span!("secrets", subsystem = "secrets")),
        );
        let answered = tokio::time::timeout(first, listed.wait_for(|ready| *ready))
            .await
            .is_ok_and(|r| r.is_ok());
        if !answered {
            warn!(
                subsystem = "secrets",
                "the secrets bucket has not answered at start; secrets are unknown on this node until it does (webhooks answer 503, seats wait, turns are retried)"
            );
        }
        Secrets {
            opened,
            keyring: Some(keyring),
            snapshot,
            listed,
            standing,
            stop,
            task: std::sync::Mutex::new(Some(task)),
        }
    }

    /// Whether this node knows the fleet's secrets, since when, and what
    /// its answers rest on (`/health`'s `secrets`).
    pub fn standing(&self) -> Standing {
        self.standing.now()
    }

    /// A counter that moves whenever what a lookup may answer changed (a
    /// listing landed, a name was set or removed): a reader that waits on
    /// a secret not known yet (a seat's equip) tries again when it moves.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.snapshot.changed.subscribe()
    }

    /// The value of `name`: the bucket's, else this node's environment
    /// variable `name` — once the bucket has answered; unknown before (see
    /// the module docs).
    pub fn get(&self, name: &str) -> Lookup {
        lookup(&self.snapshot, self.keyring.as_deref(), name)
    }

    /// Where `name` answers from on this node now (never its value).
    pub fn source(&self, name: &str) -> Source {
        match self.snapshot.get(name) {
            Some(Some(_)) => Source::Bucket,
            None if !self.snapshot.listed() => Source::Unknown,
            _ if std::env::var_os(name).is_some() => Source::Environment,
            _ => Source::Unset,
        }
    }

    /// Whether the bucket has answered this node (a certified listing
    /// landed): until then names are unknown.
    pub fn is_listed(&self) -> bool {
        self.snapshot.listed()
    }

    /// Waits until the bucket has answered this node: true, or false when
    /// the mirror stopped first.
    pub async fn until_listed(&self) -> bool {
        let mut listed = self.listed.clone();
        listed.wait_for(|ready| *ready).await.is_ok()
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

    pub(crate) fn kv(&self) -> Result<Arc<dyn Kv>, SecretsError> {
        self.opened.get().ok_or_else(|| {
            unavailable(
                "the secrets bucket is not open on this node yet (it is being opened again)",
            )
        })
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

    /// Sets `name` only if the bucket holds no value for it (create-only,
    /// so two nodes making one value at once agree on the first). Answers
    /// whether this call made it.
    pub async fn create(&self, name: &str, value: &str) -> Result<bool, SecretsError> {
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
        let kv = self.kv()?;
        let expect = match kv
            .get(Bucket::Secrets, &key_of(name))
            .await
            .map_err(|u| unavailable(u.0))?
        {
            Some(e) if !e.removed => return Ok(false),
            // A removed value's marker holds the key's revision.
            Some(e) => Expect::Revision(e.revision),
            None => Expect::Revision(0),
        };
        match self.put_record(name, &record, expect).await {
            Ok(_) => Ok(true),
            // Another node made it between the read and the write.
            Err(_) if self.record(name).await?.is_some() => Ok(false),
            Err(e) => Err(e),
        }
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
        None if !snapshot.listed() => Lookup::Unknown(format!(
            "the secrets bucket has not answered this node yet, so {name} is neither known to be set nor unset; retry in a few seconds"
        )),
        // Not in the bucket (never, or removed): the environment's, if any.
        None | Some(None) => match std::env::var(name) {
            Ok(v) => Lookup::Found(v),
            Err(_) => Lookup::Unset,
        },
        Some(Some(Err(why))) => Lookup::Unavailable(why),
        Some(Some(Ok(envelope))) => {
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

mod follow;
mod standing;
use follow::{Mirror, mirror};
use standing::Standings;
pub use standing::{Basis, Knowledge, Standing};

#[cfg(test)]
pub(crate) mod tests;
