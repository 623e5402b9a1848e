//! The memory twin: an in-process store with the real one's semantics.
//!
//! Rule: the twin is not a lesser implementation — one revision per key, a
//! removal is a marker that replaces the value, an expected revision of 0
//! means "holds nothing, not even a marker", a bucket's age reaps records
//! against its clock, and purge-through leaves a later record. It is held to
//! the same contract suite as the real backends, because a twin that agrees
//! only with itself proves nothing. Its clock can be advanced by tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::broadcast;

use crate::bucket::{Bucket, Retentions};
use crate::kv::{Change, Conflict, Entry, Expect, Kv, KvResult, Unavailable, Watch, WriteResult};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
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

#[derive(Default)]
struct Space {
    seq: u64,
    keys: BTreeMap<String, Entry>,
}

/// The in-process twin. Clone handles share one store (one "fleet").
#[derive(Clone)]
pub struct MemoryKv {
    inner: Arc<Inner>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    ages: HashMap<Bucket, Option<Duration>>,
    spaces: Mutex<HashMap<Bucket, Space>>,
    changes: broadcast::Sender<(Bucket, Change)>,
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

    fn with_space<T>(&self, bucket: Bucket, f: impl FnOnce(&mut Space, SystemTime) -> T) -> T {
        let now = self.inner.clock.now();
        let age = self.inner.ages.get(&bucket).copied().flatten();
        let mut spaces = self.inner.spaces.lock().expect("memory kv lock");
        let space = spaces.entry(bucket).or_default();
        if let Some(age) = age {
            space.keys.retain(|_, e| e.written_at + age > now);
        }
        f(space, now)
    }

    fn write(
        &self,
        bucket: Bucket,
        key: &str,
        value: Bytes,
        removed: bool,
        expect: Expect,
    ) -> WriteResult {
        let out = self.with_space(bucket, |space, now| {
            let current = space.keys.get(key).map(|e| e.revision).unwrap_or(0);
            if let Expect::Revision(r) = expect
                && r != current
            {
                return Err(Conflict);
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
        });
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
            let _ = self.inner.changes.send((bucket, change));
            rev
        }))
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
            Ok(self.with_space(bucket, |s, _| {
                s.keys
                    .values()
                    .filter(|e| !e.removed && matches(&e.key, filter))
                    .cloned()
                    .collect()
            }))
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
            // Subscribe before reading so no change falls between the two.
            let rx = self.inner.changes.subscribe();
            let initial = self.list(bucket, filter).await?;
            let seen: HashMap<String, u64> = initial
                .iter()
                .map(|e| (e.key.clone(), e.revision))
                .collect();
            let filter = filter.map(str::to_owned);
            let changes = tokio_stream_from(rx).filter_map(move |item| {
                let out = match item {
                    Err(e) => Some(Err(e)),
                    Ok((b, change)) => {
                        let (key, rev) = match &change {
                            Change::Put(e) => (e.key.clone(), e.revision),
                            Change::Removed { key, revision } => (key.clone(), *revision),
                        };
                        let fresh = seen.get(&key).is_none_or(|r| rev > *r);
                        (b == bucket && matches(&key, filter.as_deref()) && fresh)
                            .then_some(Ok(change))
                    }
                };
                futures::future::ready(out)
            });
            Ok(Watch {
                initial,
                changes: changes.boxed(),
            })
        })
    }

    fn age(&self, bucket: Bucket) -> Option<Duration> {
        self.inner.ages.get(&bucket).copied().flatten()
    }

    fn now(&self) -> SystemTime {
        self.inner.clock.now()
    }
}

fn tokio_stream_from(
    rx: broadcast::Receiver<(Bucket, Change)>,
) -> impl futures::Stream<Item = Result<(Bucket, Change), Unavailable>> {
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
