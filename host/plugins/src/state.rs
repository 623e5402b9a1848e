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
//! - A watch yields every current value (no deletions), then one
//!   end-of-current marker, then every change.
//! - The backend is a trait so the runtime can be served by the node's own
//!   coordination layer later; [`NatsState`] uses the caller's connection
//!   and never dials its own.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::catalogue::BucketSpec;

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

/// One step of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    Current(StoredEntry),
    EndOfCurrent,
    Put(StoredEntry),
    Deleted(String),
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

/// What the module runtime needs from a key-value store.
pub trait StateBackend: Send + Sync + 'static {
    /// Creates `spec`'s bucket if absent (and applies its options).
    fn ensure_bucket<'a>(&'a self, spec: &'a BucketSpec)
    -> BoxFuture<'a, Result<(), BackendError>>;
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
    /// Current values, the marker, then changes.
    #[allow(clippy::type_complexity)]
    fn watch<'a>(
        &'a self,
        bucket: &'a str,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<WatchItem, BackendError>>, BackendError>>;
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

/// Module state on NATS JetStream key-value buckets.
pub struct NatsState {
    js: jetstream::Context,
    stores: Mutex<HashMap<String, kv::Store>>,
}

impl NatsState {
    /// Uses the node's connection; never dials its own.
    pub fn new(client: async_nats::Client) -> NatsState {
        NatsState {
            js: jetstream::new(client),
            stores: Mutex::new(HashMap::new()),
        }
    }

    async fn store(&self, bucket: &str) -> Result<kv::Store, BackendError> {
        if let Some(s) = self
            .stores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(bucket)
        {
            return Ok(s.clone());
        }
        let store = self.js.get_key_value(bucket).await.map_err(|e| {
            if e.kind() == jetstream::context::KeyValueErrorKind::GetBucket {
                BackendError::NoBucket(bucket.to_string())
            } else {
                BackendError::Unavailable(e.to_string())
            }
        })?;
        self.stores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(bucket.to_string(), store.clone());
        Ok(store)
    }
}

fn unavailable(e: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable(e.to_string())
}

impl StateBackend for NatsState {
    fn ensure_bucket<'a>(
        &'a self,
        spec: &'a BucketSpec,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let decl = spec.decl.clone();
            let config = kv::Config {
                bucket: spec.name.clone(),
                description: format!("crewlet module {} bucket {}", spec.owner, spec.local),
                history: decl.as_ref().map_or(1, |d| d.history) as i64,
                max_age: decl.as_ref().and_then(|d| d.ttl).unwrap_or_default(),
                max_bytes: MAX_BUCKET_BYTES,
                max_value_size: MAX_VALUE_BYTES as i32,
                ..Default::default()
            };
            let store = if decl.is_some() {
                self.js.create_or_update_key_value(config).await
            } else {
                // A bucket only read so far: create it if absent, but never
                // overwrite the owner's options with the defaults.
                match self.js.get_key_value(&spec.name).await {
                    Ok(store) => Ok(store),
                    Err(_) => self.js.create_key_value(config).await,
                }
            }
            .map_err(unavailable)?;
            // Open only once a write through this connection reaches it.
            crewlet_coord::until_writable(
                &self.js,
                &format!("KV_{}", spec.name),
                &format!("$KV.{}._reach", spec.name),
                crewlet_coord::REACH_WITHIN,
            )
            .await
            .map_err(unavailable)?;
            self.stores
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(spec.name.clone(), store);
            Ok(())
        })
    }

    fn bucket_names(&self) -> BoxFuture<'_, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let mut names = self.js.stream_names();
            let mut out = Vec::new();
            while let Some(name) = names.next().await {
                let name = name.map_err(unavailable)?;
                if let Some(bucket) = name.strip_prefix("KV_") {
                    out.push(bucket.to_string());
                }
            }
            out.sort();
            Ok(out)
        })
    }

    fn get<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredEntry>, BackendError>> {
        Box::pin(async move {
            // A leader read (STREAM.MSG.GET, last by subject), never the
            // bucket's direct get: any replica answers a direct get, and one
            // behind an acknowledged write answers with the old value.
            self.store(bucket).await?;
            let stream = self
                .js
                .get_stream(format!("KV_{bucket}"))
                .await
                .map_err(unavailable)?;
            let subject = format!("$KV.{bucket}.{key}");
            let message = match stream.get_last_raw_message_by_subject(&subject).await {
                Ok(m) => m,
                Err(e)
                    if e.kind() == jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(unavailable(e)),
            };
            let removed = message
                .headers
                .get("KV-Operation")
                .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
            Ok((!removed).then(|| StoredEntry {
                key: key.to_string(),
                value: message.payload.to_vec(),
                revision: message.sequence,
            }))
        })
    }

    fn put<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
        value: Vec<u8>,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        Box::pin(async move {
            let store = self.store(bucket).await?;
            store.put(key, value.into()).await.map_err(|e| {
                let text = e.to_string();
                if text.contains("maximum bytes") || text.contains("resource limits") {
                    BackendError::Full(bucket.to_string())
                } else {
                    BackendError::Unavailable(text)
                }
            })
        })
    }

    fn delete<'a>(
        &'a self,
        bucket: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let store = self.store(bucket).await?;
            store.delete(key).await.map_err(unavailable)
        })
    }

    fn keys<'a>(&'a self, bucket: &'a str) -> BoxFuture<'a, Result<Vec<String>, BackendError>> {
        Box::pin(async move {
            let store = self.store(bucket).await?;
            let mut keys = store.keys().await.map_err(unavailable)?;
            let mut out = Vec::new();
            while let Some(key) = keys.next().await {
                out.push(key.map_err(unavailable)?);
            }
            Ok(out)
        })
    }

    fn watch<'a>(
        &'a self,
        bucket: &'a str,
    ) -> BoxFuture<'a, Result<BoxStream<'static, Result<WatchItem, BackendError>>, BackendError>>
    {
        Box::pin(async move {
            let store = self.store(bucket).await?;
            // The last sequence when the watch starts: entries up to it are
            // "current", anything after is a change.
            let mut stream = self
                .js
                .get_stream(format!("KV_{bucket}"))
                .await
                .map_err(unavailable)?;
            let info = stream.info().await.map_err(unavailable)?;
            let snapshot = info.state.last_sequence;
            let empty = info.state.messages == 0;
            let mut watch = store.watch_with_history(">").await.map_err(unavailable)?;
            let (tx, rx) = futures::channel::mpsc::unbounded();
            tokio::spawn(async move {
                let mut marker_sent = empty;
                if empty && tx.unbounded_send(Ok(WatchItem::EndOfCurrent)).is_err() {
                    return;
                }
                while let Some(next) = watch.next().await {
                    let entry = match next {
                        Ok(entry) => entry,
                        Err(e) => {
                            let _ = tx.unbounded_send(Err(unavailable(e)));
                            return;
                        }
                    };
                    let mut items = Vec::new();
                    let is_put = entry.operation == kv::Operation::Put;
                    let stored = StoredEntry {
                        key: entry.key.clone(),
                        value: entry.value.to_vec(),
                        revision: entry.revision,
                    };
                    if !marker_sent && entry.revision > snapshot {
                        items.push(WatchItem::EndOfCurrent);
                        marker_sent = true;
                    }
                    if marker_sent {
                        items.push(if is_put {
                            WatchItem::Put(stored)
                        } else {
                            WatchItem::Deleted(entry.key.clone())
                        });
                    } else {
                        if is_put {
                            items.push(WatchItem::Current(stored));
                        }
                        if entry.delta == 0 || entry.revision >= snapshot {
                            items.push(WatchItem::EndOfCurrent);
                            marker_sent = true;
                        }
                    }
                    for item in items {
                        if tx.unbounded_send(Ok(item)).is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(rx.boxed())
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

    #[test]
    fn keys_follow_the_bus_rules() {
        assert!(valid_key("machine-1/status=ok"));
        assert!(!valid_key(".hidden"));
        assert!(!valid_key("a b"));
        assert!(!valid_key(""));
    }
}
