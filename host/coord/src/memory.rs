//! The memory twin: an in-process store with the real one's semantics.
//!
//! Rule: the twin is not a lesser implementation — one revision per key, a
//! removal is a marker that replaces the value, an expected revision of 0
//! means "holds nothing, not even a marker", a bucket's age reaps records
//! against its clock, and purge-through leaves a later record. It is held to
//! the same contract suite as the real backends, because a twin that agrees
//! only with itself proves nothing. Its clock can be advanced by tests.
//!
//! It serves buckets opened by name too ([`NamedKv`]): the spec in force
//! (the creator's, or the last one that reconfigured it), its byte and value
//! caps (a record weighs its key and value), no bucket until one is opened.
//! Its [`NamedKv::names`] are the named buckets only: the twin has no
//! namespace to name the coordination buckets by.
//!
//! A seat lease on the twin, under a clock the example moves, and the
//! store broken under it ([`Faulty`](crate::Faulty)):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use crewlet_coord::bucket::Retentions;
//! use crewlet_coord::{Answer, Coord, CoordError, CoordOptions, Faulty, Held, Kv};
//! use crewlet_coord::{ManualClock, MemoryKv, Owner, ResourceName};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let (a, b) = (Owner::incarnation("node-a"), Owner::incarnation("node-b"));
//! let opts = CoordOptions::new(a.clone());
//! let clock = ManualClock::new();
//! let ages = Retentions { lease_ttl: opts.lease_ttl, status: opts.status_age, rate: opts.rate_age };
//! let twin: Arc<dyn Kv> = Arc::new(MemoryKv::new(Arc::new(clock.clone()), &ages));
//! let store = Faulty::new(twin);
//! let coord = Coord::with_backends(store.clone(), store.clone(), opts.clone());
//!
//! let seat = ResourceName::seat("ada")?;
//! let held = coord.acquire(&seat, &a, None).await?.yes().expect("a free seat is won");
//! // No, with who holds it, while the lease lives.
//! let refused = coord.acquire(&seat, &b, None).await?;
//! assert!(matches!(refused, Answer::No(Held::By { ref owner, .. }) if *owner == a));
//!
//! // The store out of reach: the answer is unknown, an error, never "no".
//! store.break_store();
//! assert!(matches!(coord.renew(&held).await, Err(CoordError::Unavailable(_))));
//! store.heal();
//!
//! // Unrenewed past its TTL the lease lapses; the next holder's fencing
//! // epoch is higher, and the old holder's renew is a plain no.
//! clock.advance(opts.lease_ttl + Duration::from_secs(1));
//! let next = coord.acquire(&seat, &b, None).await?.yes().expect("a lapsed seat is won");
//! assert!(next.epoch > held.epoch);
//! assert!(coord.renew(&held).await?.is_no());
//! # Ok::<(), CoordError>(())
//! # }).unwrap();
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::broadcast;

use crate::bucket::{Bucket, Retentions};
use crate::kv::{Change, Conflict, Entry, Expect, Kv, KvResult, Unavailable, Watch, WriteResult};
use crate::named::{
    BucketName, Existing, NamedError, NamedKv, NamedOpened, NamedResult, NamedSpec, NamedUsage,
    NamedWrite, Refused,
};
use crate::open::OpenError;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// This node's wall clock (`crewlet_os::wall_now`, which a test may shift).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        crewlet_os::wall_now()
    }
}

/// A clock that moves only when a test advances it.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// Starts at a fixed instant (2026-01-01T00:00:00Z).
    pub fn new() -> ManualClock {
        ManualClock::at(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
    }
    pub fn at(t: SystemTime) -> ManualClock {
        ManualClock {
            now: Arc::new(Mutex::new(t)),
        }
    }
    pub fn advance(&self, d: Duration) {
        *self.now.lock().expect("clock lock") += d;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().expect("clock lock")
    }
}

/// Where a record lives: a coordination bucket or a bucket opened by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Slot {
    Fixed(Bucket),
    Named(BucketName),
}

#[derive(Default)]
struct Space {
    seq: u64,
    keys: BTreeMap<String, Entry>,
    /// A named bucket's spec in force (`None` for a coordination bucket).
    spec: Option<NamedSpec>,
}

/// What a record weighs against a bucket's byte cap.
fn weight(e: &Entry) -> u64 {
    (e.key.len() + e.value.len()) as u64
}

/// The in-process twin. Clone handles share one store (one "fleet").
#[derive(Clone)]
pub struct MemoryKv {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    ages: HashMap<Bucket, Option<Duration>>,
    spaces: Mutex<HashMap<Slot, Space>>,
    changes: broadcast::Sender<(Slot, Change)>,
}

impl MemoryKv {
    pub fn new(clock: Arc<dyn Clock>, retentions: &Retentions) -> MemoryKv {
        let ages = Bucket::ALL
            .iter()
            .map(|b| (*b, retentions.spec(*b).age))
            .collect();
        let (changes, _) = broadcast::channel(65_536);
        MemoryKv {
            inner: Arc::new(Inner {
                clock,
                ages,
                spaces: Mutex::new(HashMap::new()),
                changes,
            }),
        }
    }

    /// Runs `f` on a slot's records, reaped to its age. A coordination
    /// bucket always exists; a named one only once opened.
    fn in_slot<T>(
        &self,
        slot: &Slot,
        f: impl FnOnce(&mut Space, SystemTime) -> T,
    ) -> NamedResult<T> {
        let now = self.inner.clock.now();
        let mut spaces = self.inner.spaces.lock().expect("memory kv lock");
        let (space, age) = match slot {
            Slot::Fixed(b) => (
                spaces.entry(slot.clone()).or_default(),
                self.inner.ages.get(b).copied().flatten(),
            ),
            Slot::Named(n) => {
                let space = spaces
                    .get_mut(slot)
                    .ok_or_else(|| NamedError::NoBucket(n.clone()))?;
                let age = space.spec.as_ref().and_then(|s| s.age);
                (space, age)
            }
        };
        if let Some(age) = age {
            space.keys.retain(|_, e| e.written_at + age > now);
        }
        Ok(f(space, now))
    }

    fn with_space<T>(&self, bucket: Bucket, f: impl FnOnce(&mut Space, SystemTime) -> T) -> T {
        self.in_slot(&Slot::Fixed(bucket), f)
            .expect("a coordination bucket always exists in the twin")
    }

    fn write(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> WriteResult {
        let out = self
            .write_slot(&Slot::Fixed(bucket), key, value, removed, expect)
            .expect("a coordination bucket always exists in the twin");
        Ok(out.map_err(|_| Conflict))
    }

    fn write_slot(
        &self,
        slot: &Slot,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> NamedWrite {
        let out = self.in_slot(slot, |space, now| {
            let current = space.keys.get(key).map(|e| e.revision).unwrap_or(0);
            if let Expect::Revision(r) = expect
                && r != current
            {
                return Err(Refused::Conflict);
            }
            if let Some(spec) = &space.spec {
                if value.len() as u64 > u64::from(spec.max_value_size) {
                    return Err(Refused::TooLarge);
                }
                let held: u64 = space.keys.values().map(weight).sum();
                let replaced = space.keys.get(key).map(weight).unwrap_or(0);
                let added = (key.len() + value.len()) as u64;
                if spec.max_bytes > 0 && held - replaced + added > spec.max_bytes {
                    return Err(Refused::Full);
                }
            }
            space.seq += 1;
            let entry = Entry {
                key: key.to_owned(),
                value,
                revision: space.seq,
                written_at: now,
                removed,
            };
            space.keys.insert(key.to_owned(), entry.clone());
            Ok(entry)
        })?;
        Ok(out.map(|entry| {
            let rev = entry.revision;
            let change = if removed {
                Change::Removed {
                    key: entry.key,
                    revision: rev,
                }
            } else {
                Change::Put(entry)
            };
            let _ = self.inner.changes.send((slot.clone(), change));
            rev
        }))
    }

    fn list_slot(&self, slot: &Slot, filter: Option<&str>) -> NamedResult<Vec<Entry>> {
        self.in_slot(slot, |s, _| {
            s.keys
                .values()
                .filter(|e| !e.removed && matches(&e.key, filter))
                .cloned()
                .collect()
        })
    }

    fn watch_slot(&self, slot: Slot, filter: Option<&str>) -> NamedResult<Watch> {
        // Subscribe before reading so no change falls between the two.
        let rx = self.inner.changes.subscribe();
        let initial = self.list_slot(&slot, filter)?;
        let seen: HashMap<String, u64> = initial
            .iter()
            .map(|e| (e.key.clone(), e.revision))
            .collect();
        let filter = filter.map(str::to_owned);
        let changes = tokio_stream_from(rx).filter_map(move |item| {
            let out = match item {
                Err(e) => Some(Err(e)),
                Ok((s, change)) => {
                    let (key, rev) = match &change {
                        Change::Put(e) => (e.key.clone(), e.revision),
                        Change::Removed { key, revision } => (key.clone(), *revision),
                    };
                    let fresh = seen.get(&key).is_none_or(|r| rev > *r);
                    (s == slot && matches(&key, filter.as_deref()) && fresh).then_some(Ok(change))
                }
            };
            futures::future::ready(out)
        });
        Ok(Watch {
            initial,
            changes: changes.boxed(),
        })
    }
}

fn matches(key: &str, filter: Option<&str>) -> bool {
    match filter {
        None => true,
        Some(f) => key.len() > f.len() && key.starts_with(f) && key.as_bytes()[f.len()] == b'.',
    }
}

impl Kv for MemoryKv {
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> BoxFuture<'a, KvResult<Option<Entry>>> {
        Box::pin(async move { Ok(self.with_space(bucket, |s, _| s.keys.get(key).cloned())) })
    }

    fn put<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult> {
        Box::pin(async move { self.write(bucket, key, value, false, expect) })
    }

    fn remove<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult> {
        Box::pin(async move { self.write(bucket, key, Bytes::new(), true, expect) })
    }

    fn purge_through<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: u64,
    ) -> BoxFuture<'a, KvResult<()>> {
        Box::pin(async move {
            self.with_space(bucket, |s, _| {
                if s.keys.get(key).is_some_and(|e| e.revision <= revision) {
                    s.keys.remove(key);
                }
            });
            Ok(())
        })
    }

    fn list<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        Box::pin(async move {
            Ok(self
                .list_slot(&Slot::Fixed(bucket), filter)
                .expect("a coordination bucket always exists in the twin"))
        })
    }

    fn markers<'a>(
        &'a self,
        bucket: Bucket,
        before: SystemTime,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        Box::pin(async move {
            Ok(self.with_space(bucket, |s, _| {
                s.keys
                    .values()
                    .filter(|e| e.removed && e.written_at <= before)
                    .cloned()
                    .collect()
            }))
        })
    }

    fn watch<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Watch>> {
        Box::pin(async move {
            Ok(self
                .watch_slot(Slot::Fixed(bucket), filter)
                .expect("a coordination bucket always exists in the twin"))
        })
    }

    fn age(&self, bucket: Bucket) -> Option<Duration> {
        self.inner.ages.get(&bucket).copied().flatten()
    }

    fn now(&self) -> SystemTime {
        self.inner.clock.now()
    }

    /// The twin is its own broker: its clock stamps its writes.
    fn broker_now<'a>(&'a self, _bucket: Bucket) -> BoxFuture<'a, KvResult<SystemTime>> {
        Box::pin(async move { Ok(self.inner.clock.now()) })
    }
}

fn tokio_stream_from(
    rx: broadcast::Receiver<(Slot, Change)>,
) -> impl futures::Stream<Item = Result<(Slot, Change), Unavailable>> {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(v) => Some((Ok(v), rx)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some((
                Err(Unavailable(format!(
                    "watch fell {n} changes behind; re-open it"
                ))),
                rx,
            )),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}

impl NamedKv for MemoryKv {
    fn open<'a>(&'a self, spec: &'a NamedSpec) -> BoxFuture<'a, Result<NamedOpened, OpenError>> {
        Box::pin(async move {
            let mut spaces = self.inner.spaces.lock().expect("memory kv lock");
            let space = spaces.entry(Slot::Named(spec.name.clone())).or_default();
            let held = match &mut space.spec {
                Some(held) => held,
                none => {
                    *none = Some(spec.clone());
                    return Ok(NamedOpened {
                        created: true,
                        reconfigured: Vec::new(),
                        replicas: spec.replicas.max(1),
                    });
                }
            };
            let mut reconfigured = Vec::new();
            if spec.existing == Existing::Reconfigure {
                if held.history != spec.history {
                    held.history = spec.history;
                    reconfigured.push("history");
                }
                if held.age != spec.age {
                    held.age = spec.age;
                    reconfigured.push("age");
                }
                if held.max_bytes != spec.max_bytes {
                    held.max_bytes = spec.max_bytes;
                    reconfigured.push("max_bytes");
                }
                if held.max_value_size != spec.max_value_size {
                    held.max_value_size = spec.max_value_size;
                    reconfigured.push("max_value_size");
                }
            }
            Ok(NamedOpened {
                created: false,
                reconfigured,
                replicas: held.replicas.max(1),
            })
        })
    }

    fn names(&self) -> BoxFuture<'_, NamedResult<Vec<BucketName>>> {
        Box::pin(async move {
            let spaces = self.inner.spaces.lock().expect("memory kv lock");
            let mut out: Vec<BucketName> = spaces
                .keys()
                .filter_map(|s| match s {
                    Slot::Named(n) => Some(n.clone()),
                    Slot::Fixed(_) => None,
                })
                .collect();
            out.sort();
            Ok(out)
        })
    }

    fn get<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
    ) -> BoxFuture<'a, NamedResult<Option<Entry>>> {
        Box::pin(async move {
            self.in_slot(&Slot::Named(bucket.clone()), |s, _| {
                s.keys.get(key).cloned()
            })
        })
    }

    fn put<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite> {
        Box::pin(
            async move { self.write_slot(&Slot::Named(bucket.clone()), key, value, false, expect) },
        )
    }

    fn remove<'a>(
        &'a self,
        bucket: &'a BucketName,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, NamedWrite> {
        Box::pin(async move {
            self.write_slot(
                &Slot::Named(bucket.clone()),
                key,
                Bytes::new(),
                true,
                expect,
            )
        })
    }

    fn list<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Vec<Entry>>> {
        Box::pin(async move { self.list_slot(&Slot::Named(bucket.clone()), filter) })
    }

    fn watch<'a>(
        &'a self,
        bucket: &'a BucketName,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, NamedResult<Watch>> {
        Box::pin(async move { self.watch_slot(Slot::Named(bucket.clone()), filter) })
    }

    fn usage<'a>(&'a self, bucket: &'a BucketName) -> BoxFuture<'a, NamedResult<NamedUsage>> {
        Box::pin(async move {
            self.in_slot(&Slot::Named(bucket.clone()), |s, _| NamedUsage {
                bytes: s.keys.values().map(weight).sum(),
                max_bytes: s.spec.as_ref().map(|p| p.max_bytes).filter(|b| *b > 0),
            })
        })
    }
}
