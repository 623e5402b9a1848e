//! The module world's store data ([`ModuleCtx`]): the buckets issued to
//! the module, resolved once at load from its effective permissions (the
//! operator's grant applied), the one choke point every state call passes
//! ([`ModuleCtx::authorize`]), and the `state` host calls (the rules are
//! in [`super`]'s docs).

use std::collections::HashMap;
use std::sync::Arc;

use crate::bindings::module::crewlet::plugin::state::{self, Entry, StateError};
use crate::bindings::module::exports::crewlet::plugin::handlers::{StateChange, StateEvent};
use crate::manifest::{Manifest, NotHeld, Permission, Permissions, bucket_name};
use crate::sandbox::{OutOfTime, Sandbox};
use crate::state::{
    BackendError, MAX_VALUE_BYTES, StateBackend, StoredEntry, WatchItem, credential_field,
    valid_key,
};

use super::watch::{WatchBoard, WatchTask};
use super::{MAX_WATCHES, ModuleBus};

/// What a state call wants of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// One bucket issued to a module (the operator's word for what a plugin
/// may touch is a *grant*; a bucket is *issued*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedBucket {
    /// The mesh-wide bucket name.
    pub bucket: String,
    pub writable: bool,
}

/// The buckets issued to `manifest`'s module, by the name the module
/// uses: those it owns, and the reads it holds (the operator's grant
/// already applied to the manifest).
pub fn issued_buckets(manifest: &Manifest) -> HashMap<String, IssuedBucket> {
    let mut out = HashMap::new();
    if let Permissions::Module { state, reads, .. } = &manifest.permissions {
        for b in state {
            out.insert(
                b.local.clone(),
                IssuedBucket {
                    bucket: bucket_name(&manifest.name, &b.local),
                    writable: true,
                },
            );
        }
        for r in reads {
            out.insert(
                r.to_string(),
                IssuedBucket {
                    bucket: bucket_name(&r.module, &r.bucket),
                    writable: false,
                },
            );
        }
    }
    out
}

/// The reads the operator denies `manifest`'s module, by the name the
/// module would use, each with its refusal (naming the key).
pub(super) fn denied_reads(manifest: &Manifest) -> HashMap<String, NotHeld> {
    let denied = manifest.granted.denied.iter();
    denied
        .filter_map(|d| match &d.permission {
            Permission::Read(read) => Some((
                read.to_string(),
                manifest
                    .granted
                    .refusal(d.permission.clone(), &manifest.file),
            )),
            _ => None,
        })
        .collect()
}

impl ModuleCtx {
    /// Takes the denied read met since the last take (see `denied_met`).
    pub(super) fn take_denied(&self) -> Option<NotHeld> {
        self.denied_met
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// `reason`, naming the operator's deny when the module met one: a module
/// refusing because a read was denied says only `not-issued`.
pub(super) fn naming_deny(reason: String, denied: Option<NotHeld>) -> String {
    match denied {
        Some(why) => format!("{reason} ({why})"),
        None => reason,
    }
}

pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) struct Queued {
    pub(super) generation: u64,
    pub(super) event: StateEvent,
}

/// The module world's part of an instance's store.
pub(crate) struct ModuleCtx {
    pub(super) plugin: String,
    pub(super) generation: u64,
    pub(super) issued: Arc<HashMap<String, IssuedBucket>>,
    /// The reads the operator denies, refused like an unissued bucket.
    pub(super) denied: Arc<HashMap<String, NotHeld>>,
    /// The last denied read this instance asked for, so the host's answer
    /// to whoever the module then refuses names the operator's key (the
    /// guest itself is told `not-issued`, as for any unissued bucket).
    pub(super) denied_met: std::sync::Mutex<Option<NotHeld>>,
    pub(super) backend: Arc<dyn StateBackend>,
    pub(super) events: tokio::sync::mpsc::Sender<Queued>,
    /// One listing of this module's watches at a time.
    pub(super) listing: Arc<tokio::sync::Semaphore>,
    pub(super) watches: Vec<AbortOnDrop>,
    /// Where this module's watches show how they stand.
    pub(super) board: Arc<WatchBoard>,
    pub(super) next_watch: u64,
    /// Where the `bus` import publishes (`super::bus`).
    pub(super) bus: Arc<dyn ModuleBus>,
    /// The local topics the manifest declares.
    pub(super) publishes: Arc<[String]>,
}

impl ModuleCtx {
    /// The one choke point of every state call: the bucket must be issued
    /// to this module, and writable for a write. Each refusal is logged
    /// with its reason and returned as a value the guest can handle.
    fn authorize(&self, name: &str, access: Access) -> Result<&IssuedBucket, StateError> {
        let Some(issued) = self.issued.get(name) else {
            match self.denied.get(name) {
                Some(why) => {
                    tracing::warn!(plugin = %self.plugin, bucket = name, ?access, "state refused: {why}");
                    *self.denied_met.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                }
                None => {
                    tracing::warn!(plugin = %self.plugin, bucket = name, ?access, "state refused: the bucket is not issued to this module (declare it in `state` or `reads`)")
                }
            }
            return Err(StateError::NotIssued(name.to_string()));
        };
        if access == Access::Write && !issued.writable {
            tracing::warn!(plugin = %self.plugin, bucket = name, "state refused: a write to a bucket this module only reads");
            return Err(StateError::ReadOnly(name.to_string()));
        }
        Ok(issued)
    }

    fn key(key: &str) -> Result<(), StateError> {
        if valid_key(key) {
            Ok(())
        } else {
            Err(StateError::InvalidKey(key.to_string()))
        }
    }
}

/// A bucket that did not answer in the time the call had left.
fn out_of_time(plugin: &str, bucket: &str, why: OutOfTime) -> StateError {
    tracing::warn!(plugin, bucket, "state call given up: the bucket gave {why}");
    StateError::Unavailable(format!("the bucket gave {why}"))
}

fn backend_error(e: BackendError) -> StateError {
    match e {
        BackendError::Full(b) => StateError::BucketFull(b),
        other => StateError::Unavailable(other.to_string()),
    }
}

fn entry(e: StoredEntry) -> Entry {
    Entry {
        key: e.key,
        value: e.value,
        revision: e.revision,
    }
}

impl state::Host for Sandbox<ModuleCtx> {
    async fn get(&mut self, bucket: String, key: String) -> Result<Option<Entry>, StateError> {
        let waits = self.host_waits();
        let ctx = &self.world;
        let issued = ctx.authorize(&bucket, Access::Read)?;
        ModuleCtx::key(&key)?;
        let found = waits
            .wait_for(ctx.backend.get(&issued.bucket, &key))
            .await
            .map_err(|why| out_of_time(&ctx.plugin, &bucket, why))?
            .map_err(backend_error)?;
        Ok(found.map(entry))
    }

    async fn put(
        &mut self,
        bucket: String,
        key: String,
        value: Vec<u8>,
    ) -> Result<u64, StateError> {
        let waits = self.host_waits();
        let ctx = &self.world;
        let issued = ctx.authorize(&bucket, Access::Write)?;
        ModuleCtx::key(&key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(StateError::ValueTooLarge(value.len() as u64));
        }
        if let Some(path) = credential_field(&value) {
            tracing::warn!(plugin = %ctx.plugin, bucket, field = %path, "state refused: a credential field");
            return Err(StateError::CredentialField(path));
        }
        waits
            .wait_for(ctx.backend.put(&issued.bucket, &key, value))
            .await
            .map_err(|why| out_of_time(&ctx.plugin, &bucket, why))?
            .map_err(backend_error)
    }

    async fn delete(&mut self, bucket: String, key: String) -> Result<(), StateError> {
        let waits = self.host_waits();
        let ctx = &self.world;
        let issued = ctx.authorize(&bucket, Access::Write)?;
        ModuleCtx::key(&key)?;
        waits
            .wait_for(ctx.backend.delete(&issued.bucket, &key))
            .await
            .map_err(|why| out_of_time(&ctx.plugin, &bucket, why))?
            .map_err(backend_error)
    }

    async fn keys(&mut self, bucket: String) -> Result<Vec<String>, StateError> {
        let waits = self.host_waits();
        let ctx = &self.world;
        let issued = ctx.authorize(&bucket, Access::Read)?;
        waits
            .wait_for(ctx.backend.keys(&issued.bucket))
            .await
            .map_err(|why| out_of_time(&ctx.plugin, &bucket, why))?
            .map_err(backend_error)
    }

    async fn watch(&mut self, bucket: String) -> Result<u64, StateError> {
        let ctx = &mut self.world;
        let issued = ctx.authorize(&bucket, Access::Read)?.clone();
        if ctx.watches.len() >= MAX_WATCHES {
            tracing::warn!(plugin = %ctx.plugin, bucket, "state refused: the module holds {MAX_WATCHES} watches already");
            return Err(StateError::Unavailable(format!(
                "a module instance may hold at most {MAX_WATCHES} watches"
            )));
        }
        ctx.next_watch += 1;
        let watch_id = ctx.next_watch;
        let generation = ctx.generation;
        let events = ctx.events.clone();
        let watch = WatchTask {
            plugin: ctx.plugin.clone(),
            local: bucket.clone(),
            bucket: issued.bucket,
            backend: ctx.backend.clone(),
            listing: ctx.listing.clone(),
            entry: ctx.board.register(watch_id, &bucket),
        };
        let task = tokio::spawn(watch.run(move |step| {
            let queued = Queued {
                generation,
                event: StateEvent {
                    watch_id,
                    bucket: bucket.clone(),
                    change: match step {
                        WatchItem::Current(e) => StateChange::Current(entry(e)),
                        WatchItem::EndOfCurrent => StateChange::EndOfCurrent,
                        WatchItem::Put(e) => StateChange::Put(entry(e)),
                        WatchItem::Deleted(k) => StateChange::Deleted(k),
                    },
                },
            };
            let events = events.clone();
            async move { events.send(queued).await.is_ok() }
        }));
        ctx.watches.push(AbortOnDrop(task));
        Ok(watch_id)
    }
}
