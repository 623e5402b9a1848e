//! A backend that can be broken and healed.
//!
//! Rule: a broken store answers every primitive with [`Unavailable`], and a
//! store that "loses acks" applies each write and then answers unavailable
//! — the two shapes an outage takes. Why: the contracts' safe directions are
//! only proven by breaking a store under them, on every backend.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::bucket::Bucket;
use crate::kv::{Entry, Expect, Kv, KvResult, Unavailable, Watch, WriteResult};

const HEALTHY: u8 = 0;
const BROKEN: u8 = 1;
const LOSING_ACKS: u8 = 2;

/// Wraps any backend; healthy until told otherwise.
pub struct Faulty {
    inner: Arc<dyn Kv>,
    mode: AtomicU8,
    failing_keys: Mutex<Option<String>>,
}

impl Faulty {
    pub fn new(inner: Arc<dyn Kv>) -> Arc<Faulty> {
        Arc::new(Faulty {
            inner,
            mode: AtomicU8::new(HEALTHY),
            failing_keys: Mutex::new(None),
        })
    }
    /// Every call answers unavailable.
    pub fn break_store(&self) {
        self.mode.store(BROKEN, Ordering::SeqCst);
    }
    /// Writes land, but their answers are lost (unavailable); reads fail.
    pub fn lose_acks(&self) {
        self.mode.store(LOSING_ACKS, Ordering::SeqCst);
    }
    /// Writes to keys containing `needle` answer unavailable without
    /// landing (`None` heals them).
    pub fn fail_writes_to(&self, needle: Option<&str>) {
        *self.failing_keys.lock().expect("faulty lock") = needle.map(str::to_owned);
    }
    pub fn heal(&self) {
        self.mode.store(HEALTHY, Ordering::SeqCst);
        self.fail_writes_to(None);
    }
    fn key_fails(&self, key: &str) -> bool {
        self.failing_keys
            .lock()
            .expect("faulty lock")
            .as_deref()
            .is_some_and(|n| key.contains(n))
    }
    fn mode(&self) -> u8 {
        self.mode.load(Ordering::SeqCst)
    }
    fn down() -> Unavailable {
        Unavailable("store broken by the Faulty wrapper".into())
    }
    fn read_gate(&self) -> KvResult<()> {
        if self.mode() == HEALTHY {
            Ok(())
        } else {
            Err(Faulty::down())
        }
    }
    async fn write_gate(&self, w: impl std::future::Future<Output = WriteResult>) -> WriteResult {
        match self.mode() {
            HEALTHY => w.await,
            LOSING_ACKS => {
                let _ = w.await;
                Err(Faulty::down())
            }
            _ => Err(Faulty::down()),
        }
    }
}

impl Kv for Faulty {
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> BoxFuture<'a, KvResult<Option<Entry>>> {
        Box::pin(async move {
            self.read_gate()?;
            self.inner.get(bucket, key).await
        })
    }
    fn put<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        value: Bytes,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult> {
        Box::pin(async move {
            if self.key_fails(key) {
                return Err(Faulty::down());
            }
            self.write_gate(self.inner.put(bucket, key, value, expect))
                .await
        })
    }
    fn remove<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        expect: Expect,
    ) -> BoxFuture<'a, WriteResult> {
        Box::pin(async move {
            if self.key_fails(key) {
                return Err(Faulty::down());
            }
            self.write_gate(self.inner.remove(bucket, key, expect))
                .await
        })
    }
    fn purge_through<'a>(
        &'a self,
        bucket: Bucket,
        key: &'a str,
        revision: u64,
    ) -> BoxFuture<'a, KvResult<()>> {
        Box::pin(async move {
            self.read_gate()?;
            self.inner.purge_through(bucket, key, revision).await
        })
    }
    fn list<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        Box::pin(async move {
            self.read_gate()?;
            self.inner.list(bucket, filter).await
        })
    }
    fn markers<'a>(
        &'a self,
        bucket: Bucket,
        before: SystemTime,
    ) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        Box::pin(async move {
            self.read_gate()?;
            self.inner.markers(bucket, before).await
        })
    }
    fn watch<'a>(
        &'a self,
        bucket: Bucket,
        filter: Option<&'a str>,
    ) -> BoxFuture<'a, KvResult<Watch>> {
        Box::pin(async move {
            self.read_gate()?;
            self.inner.watch(bucket, filter).await
        })
    }
    fn age(&self, bucket: Bucket) -> Option<Duration> {
        self.inner.age(bucket)
    }
    fn now(&self) -> SystemTime {
        self.inner.now()
    }
    fn broker_now<'a>(&'a self, bucket: Bucket) -> BoxFuture<'a, KvResult<SystemTime>> {
        Box::pin(async move {
            self.read_gate()?;
            self.inner.broker_now(bucket).await
        })
    }
}
