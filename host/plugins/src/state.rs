//! Module state (ADR 202): key-value buckets a module declares, reached
//! only through the runtime.
//!
//! Rules, and why:
//! - The host creates every bucket of the catalogue at start, idempotently,
//!   named mesh-wide per module and local name ([`crate::manifest::bucket_name`]);
//!   a module never creates one. A bucket only read so far is created too,
//!   so a reader can watch before the owner is ever loaded.
//! - A bucket is capped at [`MAX_BUCKET_BYTES`] and a value at
//!   [`MAX_VALUE_BYTES`]; the server enforces both as well.
//! - No secret goes into a bucket: a JSON value with a field whose name says
//!   it is a credential, at any depth, is refused ([`credential_field`]).
//!   Non-JSON values are opaque and not inspected — this catches the
//!   ordinary mistake, not a determined one (ADR 202 §5).
//! - A watch's first answer is the certified listing of the current values
//!   (no deletions), then every change after it. A watch that has handed
//!   on nothing for [`WATCH_PROBE`] asks its bucket's leader for a key, and
//!   ends with an error if the bucket does not answer: the client re-creates
//!   a lost watch consumer by itself, retrying for ever without a word
//!   while the bucket's only server is down, so silence alone never says
//!   the bucket is gone. Keeping a watch open across a bucket that stops
//!   answering is the module host's (`module::watch`), not the store's.
//! - A bucket is never removed. It is created at the node's replica count
//!   (`stream.replicas`) and adopted when it exists: the owner's options
//!   are applied only where they differ from the bucket's, a bucket only
//!   read so far is never reconfigured (the owner's options are the
//!   owner's), and a replica count that differs from the node's is
//!   reported ([`Ensured`]), never changed — moving a bucket onto more or
//!   fewer servers is an operator's gesture, and one module's bucket must
//!   not stop a node's start.
//! - The store is the coordination layer's seam ([`crewlet_coord::NamedKv`]),
//!   not a client of its own: module state gets the same leader reads,
//!   certified listings and error kinds (a full bucket is the broker's error
//!   code, not its text) as every coordination record, and the memory twin
//!   for tests that need no broker. [`KvState`] is only the adapter: names,
//!   caps and the shape of a watch. On NATS it uses the caller's connection
//!   and never dials its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crewlet_coord::kv::{Entry, Expect};
use crewlet_coord::{
    BucketName, Change, Existing, MemoryKv, NamedError, NamedKv, NamedSpec, NatsKv, Refused,
};
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::catalogue::{BucketSpec, Catalogue};

/// The largest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 256 * 1024;
/// The largest bucket, in bytes.
pub const MAX_BUCKET_BYTES: i64 = 64 * 1024 * 1024;

/// A boxed future, so the backend trait is object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    pub key: String,
    pub value: Vec<u8>,
    pub revision: u64,
}

/// One step of a watch as a module sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    Current(StoredEntry),
    EndOfCurrent,
    Put(StoredEntry),
    Deleted(String),
}

/// A change after a watch's first answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Put(StoredEntry),
    Deleted(String),
}

/// A watch from the store: the certified current values, then the changes
/// after them. An `Err` (or the end) of `changes` is the bucket no longer
/// answering this watch.
pub struct StateWatch {
    pub current: Vec<StoredEntry>,
    pub changes: BoxStream<'static, Result<Changed, BackendError>>,
}

/// What ensuring one bucket found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ensured {
    /// The mesh-wide bucket name.
    pub name: String,
    pub created: bool,
    /// The owner's options applied because they differed.
    pub reconfigured: Vec<&'static str>,
    /// The replicas the bucket has.
    pub replicas: usize,
    /// The replicas this node creates buckets with (`stream.replicas`).
    pub wanted_replicas: usize,
}

impl Ensured {
    /// Whether the bucket holds its data on another number of servers than
    /// the node is configured for.
    pub fn replicas_differ(&self) -> bool {
        self.replicas != self.wanted_replicas
    }
}

/// A backend failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("bucket `{0}` does not exist; the host creates every bucket of the catalogue at start")]
    NoBucket(String),
    #[error("bucket `{0}` is at its 64 MiB cap; delete keys or move data elsewhere")]
    Full(String),
    #[error("the bus did not answer: {0}")]
    Unavailable(String),
}

/// What a module bucket holds, for the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketUsage {
    pub keys: usize,
    /// Stored bytes, removal markers and the store's framing included.
    pub bytes: u64,
    /// The byte cap (`None`: none).
    pub max_bytes: Option<u64>,
}

/// What the module runtime needs from a key-value store.
pub trait StateBackend: Send + Sync + 'static {
    /// Creates `spec`'s bucket if absent, or adopts it (applying the
    /// owner's options where they differ).
    fn ensure_bucket<'a>(
        &'a self,
        spec: &'a BucketSpec,
    ) -> BoxFuture<'a, Result<Ensured, BackendError>>;
    /// Every key-value bucket that exists.
    fn bucket_names(&self) -> BoxFuture<'_, Result<Vec<String>, BackendError>>;
    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredEntry>, BackendError>>;
    fn put<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        value: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, BackendError>>;
    fn delete<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>>;
    fn keys<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>>;
    /// Live keys (a certified listing) and bytes held against the cap.
    fn usage<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<BucketUsage, BackendError>>;
    /// The certified current values, then changes.
    fn watch<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<StateWatch, BackendError>>;
}

/// Ensures every bucket of the catalogue, in its order (ADR 202: on every
/// raise, from the catalogue, before any module runs).
pub async fn ensure_all(
    catalogue: &Catalogue,
    backend: &dyn StateBackend,
) -> Result<Vec<Ensured>, BackendError> {
    let mut out = Vec::new();
    for spec in catalogue.buckets() {
        out.push(backend.ensure_bucket(&spec).await?);
    }
    Ok(out)
}

/// Whether `key` is a valid key: `A-Z a-z 0-9 - _ = . /`, not starting or
/// ending with `.`, at most 1024 bytes.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 1024
        && !key.starts_with('.')
        && !key.ends_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_=./".contains(&b))
}

/// The path of the first field, at any depth of a JSON value, whose name
/// says it holds a credential; `None` if there is none or the value is not
/// JSON.
///
/// A name is split into words (at `_`, `-`, `.`, spaces and camelCase) and
/// matches when a word is one of password, passwd, secret, token,
/// authorization, credential(s), passphrase, or two adjacent words are
/// api+key, private+key, access+key or client+secret. `max_tokens` does not
/// match (`tokens` is not `token`), `access_token` does.
pub fn credential_field(value: &[u8]) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(value).ok()?;
    find_credential(&json, String::new())
}

fn find_credential(value: &serde_json::Value, path: String) -> Option<String> {
    match value {
        serde_json::Value::Object(map) => {
            for (name, inner) in map {
                let here = format!("{path}/{name}");
                if names_credential(name) {
                    return Some(here);
                }
                if let Some(found) = find_credential(inner, here) {
                    return Some(found);
                }
            }
            None
        }
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| find_credential(item, format!("{path}/{i}"))),
        _ => None,
    }
}

fn words(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        current.extend(c.to_lowercase());
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn names_credential(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "password",
        "passwd",
        "secret",
        "token",
        "authorization",
        "credential",
        "credentials",
        "passphrase",
        "apikey",
        "privatekey",
    ];
    const PAIRS: &[(&str, &str)] = &[
        ("api", "key"),
        ("private", "key"),
        ("access", "key"),
        ("client", "secret"),
    ];
    let w = words(name);
    w.iter().any(|x| WORDS.contains(&x.as_str()))
        || w.windows(2)
            .any(|p| PAIRS.contains(&(p[0].as_str(), p[1].as_str())))
}

/// How long one state request may take on NATS (the JetStream default).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a watch goes without a change before it asks whether its
/// bucket still answers (the broker's idle heartbeat for a watch).
pub const WATCH_PROBE: Duration = Duration::from_secs(5);

/// The key a watch's probe reads (a read, so nothing is ever written).
const PROBE_KEY: &str = "_watch-probe";

/// `changes`, ended with an error once its bucket stops answering a
/// leader read after a quiet [`WATCH_PROBE`].
fn probed(
    changes: BoxStream<'static, Result<Changed, BackendError>>,
    kv: Arc<dyn NamedKv>,
    bucket: BucketName,
) -> BoxStream<'static, Result<Changed, BackendError>> {
    futures::stream::unfold(Some(changes), move |changes| {
        let (kv, bucket) = (kv.clone(), bucket.clone());
        async move {
            let mut changes = changes?;
            loop {
                let next = tokio::select! {
                    next = changes.next() => Some(next),
                    () = tokio::time::sleep(WATCH_PROBE) => None,
                };
                if let Some(next) = next {
                    return next.map(|item| (item, Some(changes)));
                }
                if let Err(e) = kv.get(&bucket, PROBE_KEY).await {
                    let why = format!("bucket `{bucket}` stopped answering its watch: {e}");
                    return Some((Err(BackendError::Unavailable(why)), None));
                }
            }
        }
    })
    .boxed()
}

/// Module state on the coordination layer's named buckets.
pub struct KvState {
    kv: Arc<dyn NamedKv>,
    replicas: usize,
}

impl KvState {
    /// On NATS, over the node's connection; never dials its own. Buckets
    /// are created with one replica unless [`KvState::with_replicas`].
    pub fn nats(client: async_nats::Client) -> KvState {
        KvState::new(Arc::new(NatsKv::named_only(client, REQUEST_TIMEOUT)))
    }

    /// On the in-process twin (tests that need no broker).
    pub fn memory(kv: MemoryKv) -> KvState {
        KvState::new(Arc::new(kv))
    }

    /// On any backend of the seam.
    pub fn new(kv: Arc<dyn NamedKv>) -> KvState {
        KvState { kv, replicas: 1 }
    }

    /// Buckets created with `replicas` copies: the node's `stream.replicas`,
    /// like its streams and coordination buckets.
    pub fn with_replicas(mut self, replicas: usize) -> KvState {
        self.replicas = replicas.max(1);
        self
    }
}

/// The seam's name for a module bucket; a name no bucket can have is no
/// bucket.
fn name(bucket: &str) -> Result<BucketName, BackendError> {
    BucketName::new(bucket).map_err(|_| BackendError::NoBucket(bucket.to_string()))
}

fn backend(e: NamedError) -> BackendError {
    match e {
        NamedError::NoBucket(b) => BackendError::NoBucket(b.to_string()),
        NamedError::Unavailable(why) => BackendError::Unavailable(why),
    }
}

fn stored(e: Entry) -> StoredEntry {
    StoredEntry {
        key: e.key,
        value: e.value.to_vec(),
        revision: e.revision,
    }
}

/// A blind write's answer (no expected revision, so no conflict).
fn written(bucket: &str, w: crewlet_coord::NamedWrite) -> Result<u64, BackendError> {
    match w.map_err(backend)? {
        Ok(revision) => Ok(revision),
        Err(Refused::Full) => Err(BackendError::Full(bucket.to_string())),
        Err(refused) => Err(BackendError::Unavailable(format!(
            "bucket `{bucket}` refused the write ({refused:?}); values are checked against {MAX_VALUE_BYTES} bytes before they reach it"
        ))),
    }
}

impl StateBackend for KvState {
    fn ensure_bucket<'a>(
        &'a self,
        spec: &'a BucketSpec,
    ) -> BoxFuture<'a, Result<Ensured, BackendError>> {
        Box::pin(async move {
            let decl = spec.decl.as_ref();
            let named = NamedSpec {
                name: name(&spec.name)?,
                description: format!("crewlet module {} bucket {}", spec.owner, spec.local),
                history: decl.map_or(1, |d| d.history),
                age: decl.and_then(|d| d.ttl),
                max_bytes: MAX_BUCKET_BYTES as u64,
                max_value_size: MAX_VALUE_BYTES as u32,
                replicas: self.replicas,
                // The owner's options are applied where they differ; a
                // bucket only read so far is created if absent, never
                // overwritten with the defaults.
                existing: if decl.is_some() {
                    Existing::Reconfigure
                } else {
                    Existing::Adopt
                },
            };
            // Open only once a write through this connection reaches it.
            let opened = self
                .kv
                .open(&named)
                .await
                .map_err(|e| BackendError::Unavailable(e.to_string()))?;
            Ok(Ensured {
                name: spec.name.clone(),
                created: opened.created,
                reconfigured: opened.reconfigured,
                replicas: opened.replicas,
                wanted_replicas: self.replicas,
            })
        })
    }

    fn bucket_names(&self) -> BoxFuture<'_, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let names = self.kv.names().await.map_err(backend)?;
            Ok(names.iter().map(|n| n.to_string()).collect())
        })
    }

    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredEntry>, BackendError>> {
        Box::pin(async move {
            // A leader read, never the bucket's direct get (which a replica
            // behind an acknowledged write answers with the old value).
            let found = self.kv.get(&name(bucket)?, key).await.map_err(backend)?;
            Ok(found.filter(|e| !e.removed).map(stored))
        })
    }

    fn put<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        value: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let w = self
                .kv
                .put(&name(bucket)?, key, value.into(), Expect::Any)
                .await;
            written(bucket, w)
        })
    }

    fn delete<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let w = self.kv.remove(&name(bucket)?, key, Expect::Any).await;
            written(bucket, w).map(|_| ())
        })
    }

    fn keys<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let listed = self.kv.list(&name(bucket)?, None).await.map_err(backend)?;
            let mut keys: Vec<String> = listed.into_iter().map(|e| e.key).collect();
            keys.sort();
            Ok(keys)
        })
    }

    fn usage<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<BucketUsage, BackendError>> {
        Box::pin(async move {
            let b = name(bucket)?;
            let (listed, usage) = futures::join!(self.kv.list(&b, None), self.kv.usage(&b));
            let usage = usage.map_err(backend)?;
            Ok(BucketUsage {
                keys: listed.map_err(backend)?.len(),
                bytes: usage.bytes,
                max_bytes: usage.max_bytes,
            })
        })
    }

    fn watch<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<StateWatch, BackendError>> {
        Box::pin(async move {
            // The certified listing is "current"; the changes after it come
            // from the same pass, so none falls between the two.
            let bucket = name(bucket)?;
            let watch = self.kv.watch(&bucket, None).await.map_err(backend)?;
            let changes = watch.changes.map(|c| match c {
                Ok(Change::Put(e)) => Ok(Changed::Put(stored(e))),
                Ok(Change::Removed { key, .. }) => Ok(Changed::Deleted(key)),
                Err(u) => Err(BackendError::Unavailable(u.0)),
            });
            Ok(StateWatch {
                current: watch.initial.into_iter().map(stored).collect(),
                changes: probed(changes.boxed(), self.kv.clone(), bucket),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_names_are_found_at_any_depth() {
        let found = |v: &str| credential_field(v.as_bytes());
        assert_eq!(
            found(r#"{"a":{"b":[{"c":1},{"Authorization":"x"}]}}"#),
            Some("/a/b/1/Authorization".to_string())
        );
        assert_eq!(found(r#"{"apiKey":"x"}"#), Some("/apiKey".to_string()));
        assert_eq!(
            found(r#"{"private_key":"x"}"#),
            Some("/private_key".to_string())
        );
        assert_eq!(
            found(r#"{"github-token":"x"}"#),
            Some("/github-token".to_string())
        );
        assert_eq!(found(r#"{"max_tokens":3,"keyboard":"x","monkey":1}"#), None);
        assert_eq!(found("not json password"), None);
    }

    fn twin() -> KvState {
        let retentions = crewlet_coord::bucket::Retentions {
            lease_ttl: Duration::from_secs(45),
            status: Duration::from_secs(60),
            rate: Duration::from_secs(60),
        };
        KvState::memory(MemoryKv::new(
            Arc::new(crewlet_coord::SystemClock),
            &retentions,
        ))
    }

    fn spec(owned: bool) -> BucketSpec {
        BucketSpec {
            name: "mod_presence_seen".into(),
            owner: "presence".into(),
            local: "seen".into(),
            decl: owned.then(|| crate::manifest::BucketDecl {
                local: "seen".into(),
                history: 1,
                ttl: None,
            }),
        }
    }

    /// The adapter on the memory twin, no broker: an unopened bucket is
    /// named as absent, reads see writes, a deletion hides a key, and a
    /// watch is current values, then changes.
    #[tokio::test]
    async fn module_state_on_the_twin() {
        let state = twin();
        assert_eq!(
            state.get("mod_presence_seen", "alice").await,
            Err(BackendError::NoBucket("mod_presence_seen".into()))
        );
        assert_eq!(
            state.get("not a bucket", "k").await,
            Err(BackendError::NoBucket("not a bucket".into()))
        );
        let read_first = state.ensure_bucket(&spec(false)).await.unwrap();
        assert!(read_first.created && !read_first.replicas_differ());
        let owned = state.ensure_bucket(&spec(true)).await.unwrap();
        assert!(!owned.created, "{owned:?}");
        assert_eq!(
            state.bucket_names().await.unwrap(),
            vec!["mod_presence_seen".to_string()]
        );
        let rev = state
            .put("mod_presence_seen", "alice", b"lab".to_vec())
            .await
            .unwrap();
        let got = state.get("mod_presence_seen", "alice").await.unwrap();
        assert_eq!(
            got,
            Some(StoredEntry {
                key: "alice".into(),
                value: b"lab".to_vec(),
                revision: rev,
            })
        );
        let mut watch = state.watch("mod_presence_seen").await.unwrap();
        state
            .put("mod_presence_seen", "bob", b"desk".to_vec())
            .await
            .unwrap();
        state.delete("mod_presence_seen", "alice").await.unwrap();
        assert_eq!(state.get("mod_presence_seen", "alice").await.unwrap(), None);
        assert_eq!(
            state.keys("mod_presence_seen").await.unwrap(),
            vec!["bob".to_string()]
        );
        let usage = state.usage("mod_presence_seen").await.unwrap();
        assert_eq!(usage.keys, 1, "{usage:?}");
        assert!(usage.bytes >= "bobdesk".len() as u64, "{usage:?}");
        assert_eq!(usage.max_bytes, Some(MAX_BUCKET_BYTES as u64));
        let mut steps: Vec<String> = watch
            .current
            .iter()
            .map(|e| format!("current {}", e.key))
            .collect();
        for _ in 0..2 {
            steps.push(match watch.changes.next().await.unwrap().unwrap() {
                Changed::Put(e) => format!("put {}", e.key),
                Changed::Deleted(k) => format!("deleted {k}"),
            });
        }
        assert_eq!(steps, ["current alice", "put bob", "deleted alice"]);
    }

    /// A bucket at its 64 MiB cap answers `Full` (a kind from the store,
    /// not a reading of its text), and the write that was refused is not
    /// there.
    #[tokio::test]
    async fn a_full_bucket_is_refused_as_full() {
        let state = twin();
        state.ensure_bucket(&spec(true)).await.unwrap();
        let value = vec![b'x'; MAX_VALUE_BYTES];
        let mut refused = None;
        for i in 0..=(MAX_BUCKET_BYTES as usize / MAX_VALUE_BYTES) {
            match state
                .put("mod_presence_seen", &format!("k{i}"), value.clone())
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    refused = Some((i, e));
                    break;
                }
            }
        }
        let (i, e) = refused.expect("a 64 MiB bucket took 65 MiB");
        assert_eq!(e, BackendError::Full("mod_presence_seen".into()));
        assert_eq!(
            state
                .get("mod_presence_seen", &format!("k{i}"))
                .await
                .unwrap(),
            None
        );
    }

    #[test]
    fn keys_follow_the_bus_rules() {
        assert!(valid_key("machine-1/status=ok"));
        assert!(!valid_key(".hidden"));
        assert!(!valid_key("a b"));
        assert!(!valid_key(""));
    }
}
