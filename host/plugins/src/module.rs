//! The module host: a long-lived module instance, its grants and watches.
//!
//! Rules, and why (ADR 202):
//! - A module is issued its buckets by the names it uses: owned ones
//!   (`state`) read-write, `reads` ones read-only. Anything else is refused
//!   as a [`StateError`] the guest can handle, never a trap, naming the
//!   bucket and the reason: the server enforces only the union of every
//!   module's rights, so the runtime's refusal is what keeps a module to
//!   its own.
//! - Checks run in order: issued, writable, key, size, credential; the
//!   first that fails is the answer.
//! - One instance serves all of a module's calls, one at a time. If a call
//!   faults, the instance (and every watch it started) is dropped; the next
//!   call instantiates afresh and runs `init` again. Watch steps queued for
//!   the dropped instance are discarded, never delivered to the new one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use futures::StreamExt;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::bindings::module::crewlet::plugin::log::{self, Level};
use crate::bindings::module::crewlet::plugin::state::{self, Entry, StateError};
use crate::bindings::module::exports::crewlet::plugin::handlers::{Event, StateChange, StateEvent};
use crate::bindings::module::{Module, ModulePre};
use crate::catalogue::{Catalogue, CatalogueError};
use crate::manifest::{Manifest, Permissions, bucket_name};
use crate::outbound::OutboundPolicy;
use crate::runtime::{
    CallError, Health, HealthReport, LoadError, Runtime, Sandbox, prepare, settle, within,
};
use crate::state::{
    BackendError, MAX_VALUE_BYTES, StateBackend, StoredEntry, WatchItem, credential_field,
    valid_key,
};

/// Log lines kept per module for [`ModulePlugin::logs`].
const KEEP_LOG_LINES: usize = 1000;
/// The longest log line kept, in bytes.
const MAX_LOG_LINE: usize = 4096;

/// One bucket issued to a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The mesh-wide bucket name.
    pub bucket: String,
    pub writable: bool,
}

/// The grants of `manifest`, by the name the module uses.
pub fn grants(manifest: &Manifest) -> HashMap<String, Grant> {
    let mut out = HashMap::new();
    if let Permissions::Module { state, reads } = &manifest.permissions {
        for b in state {
            out.insert(
                b.local.clone(),
                Grant {
                    bucket: bucket_name(&manifest.name, &b.local),
                    writable: true,
                },
            );
        }
        for r in reads {
            out.insert(
                r.to_string(),
                Grant {
                    bucket: bucket_name(&r.module, &r.bucket),
                    writable: false,
                },
            );
        }
    }
    out
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Queued {
    generation: u64,
    event: StateEvent,
}

/// The module runtime's part of an instance's store.
pub(crate) struct ModuleCtx {
    plugin: String,
    generation: u64,
    grants: HashMap<String, Grant>,
    backend: Arc<dyn StateBackend>,
    events: futures::channel::mpsc::UnboundedSender<Queued>,
    watches: Vec<AbortOnDrop>,
    next_watch: u64,
    logs: Arc<Mutex<Vec<String>>>,
}

impl ModuleCtx {
    fn issued(&self, name: &str) -> Result<Grant, StateError> {
        self.grants.get(name).cloned().ok_or_else(|| {
            tracing::warn!(plugin = %self.plugin, bucket = name, "state refused: bucket not issued");
            StateError::NotIssued(name.to_string())
        })
    }

    fn key(key: &str) -> Result<(), StateError> {
        if valid_key(key) {
            Ok(())
        } else {
            Err(StateError::InvalidKey(key.to_string()))
        }
    }
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

fn ctx(sandbox: &mut Sandbox) -> &mut ModuleCtx {
    sandbox
        .module
        .as_mut()
        .expect("a module store always carries its ModuleCtx")
}

impl state::Host for Sandbox {
    async fn get(&mut self, bucket: String, key: String) -> Result<Option<Entry>, StateError> {
        let ctx = ctx(self);
        let grant = ctx.issued(&bucket)?;
        ModuleCtx::key(&key)?;
        let found = ctx
            .backend
            .get(&grant.bucket, &key)
            .await
            .map_err(backend_error)?;
        Ok(found.map(entry))
    }

    async fn put(
        &mut self,
        bucket: String,
        key: String,
        value: Vec<u8>,
    ) -> Result<u64, StateError> {
        let ctx = ctx(self);
        let grant = ctx.issued(&bucket)?;
        if !grant.writable {
            tracing::warn!(plugin = %ctx.plugin, bucket, "state refused: write to a read-only bucket");
            return Err(StateError::ReadOnly(bucket));
        }
        ModuleCtx::key(&key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(StateError::ValueTooLarge(value.len() as u64));
        }
        if let Some(path) = credential_field(&value) {
            tracing::warn!(plugin = %ctx.plugin, bucket, field = %path, "state refused: a credential field");
            return Err(StateError::CredentialField(path));
        }
        ctx.backend
            .put(&grant.bucket, &key, value)
            .await
            .map_err(backend_error)
    }

    async fn delete(&mut self, bucket: String, key: String) -> Result<(), StateError> {
        let ctx = ctx(self);
        let grant = ctx.issued(&bucket)?;
        if !grant.writable {
            return Err(StateError::ReadOnly(bucket));
        }
        ModuleCtx::key(&key)?;
        ctx.backend
            .delete(&grant.bucket, &key)
            .await
            .map_err(backend_error)
    }

    async fn keys(&mut self, bucket: String) -> Result<Vec<String>, StateError> {
        let ctx = ctx(self);
        let grant = ctx.issued(&bucket)?;
        ctx.backend.keys(&grant.bucket).await.map_err(backend_error)
    }

    async fn watch(&mut self, bucket: String) -> Result<u64, StateError> {
        let ctx = ctx(self);
        let grant = ctx.issued(&bucket)?;
        let mut stream = ctx
            .backend
            .watch(&grant.bucket)
            .await
            .map_err(backend_error)?;
        ctx.next_watch += 1;
        let watch_id = ctx.next_watch;
        let generation = ctx.generation;
        let events = ctx.events.clone();
        let plugin = ctx.plugin.clone();
        let task = tokio::spawn(async move {
            while let Some(item) = stream.next().await {
                let change = match item {
                    Ok(WatchItem::Current(e)) => StateChange::Current(entry(e)),
                    Ok(WatchItem::EndOfCurrent) => StateChange::EndOfCurrent,
                    Ok(WatchItem::Put(e)) => StateChange::Put(entry(e)),
                    Ok(WatchItem::Deleted(k)) => StateChange::Deleted(k),
                    Err(e) => {
                        tracing::warn!(plugin, bucket, "a state watch ended: {e}");
                        return;
                    }
                };
                let queued = Queued {
                    generation,
                    event: StateEvent {
                        watch_id,
                        bucket: bucket.clone(),
                        change,
                    },
                };
                if events.unbounded_send(queued).is_err() {
                    return;
                }
            }
        });
        ctx.watches.push(AbortOnDrop(task));
        Ok(watch_id)
    }
}

impl log::Host for Sandbox {
    async fn write(&mut self, level: Level, message: String) {
        let ctx = ctx(self);
        let mut line = message;
        if line.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        let plugin = ctx.plugin.as_str();
        match level {
            Level::Debug => tracing::debug!(plugin, "{line}"),
            Level::Info => tracing::info!(plugin, "{line}"),
            Level::Warn => tracing::warn!(plugin, "{line}"),
            Level::Error => tracing::error!(plugin, "{line}"),
        }
        let mut logs = ctx.logs.lock().unwrap_or_else(|p| p.into_inner());
        if logs.len() >= KEEP_LOG_LINES {
            logs.remove(0);
        }
        logs.push(line);
    }
}

struct Live {
    store: Store<Sandbox>,
    bindings: Module,
    generation: u64,
}

/// A running module.
pub struct ModulePlugin {
    manifest: Manifest,
    runtime: Arc<Runtime>,
    pre: ModulePre<Sandbox>,
    backend: Arc<dyn StateBackend>,
    live: tokio::sync::Mutex<Option<Live>>,
    generation: Mutex<u64>,
    events: futures::channel::mpsc::UnboundedSender<Queued>,
    health: Health,
    logs: Arc<Mutex<Vec<String>>>,
    dispatcher: Mutex<Option<AbortOnDrop>>,
}

impl ModulePlugin {
    /// Loads the module, refuses it if the catalogue finds one of its
    /// `reads` undeclared by a present owner, then instantiates it and runs
    /// `init`. The catalogue's buckets must already exist
    /// ([`ensure_buckets`]).
    pub async fn start(
        runtime: &Arc<Runtime>,
        manifest: Manifest,
        catalogue: &Catalogue,
        backend: Arc<dyn StateBackend>,
    ) -> Result<Arc<ModulePlugin>, LoadError> {
        for problem in catalogue.problems() {
            if let CatalogueError::UndeclaredRead { file, .. } = &problem
                && *file == manifest.file
            {
                return Err(LoadError::Init {
                    plugin: manifest.name.clone(),
                    reason: problem.to_string(),
                });
            }
        }
        let (component, _cache) = runtime.load_component(&manifest)?;
        let mut linker: Linker<Sandbox> = Linker::new(runtime.engine());
        let engine_error = |e: wasmtime::Error| LoadError::Engine(format!("{e:#}"));
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_error)?;
        Module::add_to_linker::<Sandbox, HasSelf<Sandbox>>(&mut linker, |s| s)
            .map_err(engine_error)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(ModulePre::new)
            .map_err(|e| LoadError::Link {
                component: manifest.component.clone(),
                reason: format!("{e:#}"),
            })?;
        let (tx, mut rx) = futures::channel::mpsc::unbounded::<Queued>();
        let plugin = Arc::new(ModulePlugin {
            manifest,
            runtime: runtime.clone(),
            pre,
            backend,
            live: tokio::sync::Mutex::new(None),
            generation: Mutex::new(0),
            events: tx,
            health: Health::default(),
            logs: Arc::default(),
            dispatcher: Mutex::new(None),
        });
        {
            let mut live = plugin.live.lock().await;
            plugin.ensure_live(&mut live).await.map_err(|e| match e {
                StartError::Refused(reason) => LoadError::Init {
                    plugin: plugin.manifest.name.clone(),
                    reason,
                },
                StartError::Call(CallError::Fault { fault, .. }) => LoadError::InitFault {
                    plugin: plugin.manifest.name.clone(),
                    fault,
                },
                StartError::Call(other) => LoadError::Init {
                    plugin: plugin.manifest.name.clone(),
                    reason: other.to_string(),
                },
            })?;
        }
        let weak: Weak<ModulePlugin> = Arc::downgrade(&plugin);
        let task = tokio::spawn(async move {
            while let Some(queued) = rx.next().await {
                let Some(plugin) = weak.upgrade() else { return };
                plugin.deliver(queued).await;
            }
        });
        *plugin.dispatcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(AbortOnDrop(task));
        Ok(plugin)
    }

    /// The module's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The module's health.
    pub fn health(&self) -> HealthReport {
        self.health.report()
    }

    /// The module's recent log lines, oldest first.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn ensure_live(&self, live: &mut Option<Live>) -> Result<(), StartError> {
        if live.is_some() {
            return Ok(());
        }
        let generation = {
            let mut g = self.generation.lock().unwrap_or_else(|p| p.into_inner());
            *g += 1;
            *g
        };
        let instantiate_error = |reason: String| {
            StartError::Call(CallError::Instantiate {
                plugin: self.manifest.name.clone(),
                reason,
            })
        };
        let mut store = self
            .runtime
            .new_store(&self.manifest, OutboundPolicy::deny_all())
            .map_err(|e| instantiate_error(e.to_string()))?;
        store.data_mut().module = Some(ModuleCtx {
            plugin: self.manifest.name.clone(),
            generation,
            grants: grants(&self.manifest),
            backend: self.backend.clone(),
            events: self.events.clone(),
            watches: Vec::new(),
            next_watch: 0,
            logs: self.logs.clone(),
        });
        let deadline = self.manifest.limits.deadline;
        prepare(&mut store, deadline);
        let outcome = within(deadline, async {
            let bindings = self.pre.instantiate_async(&mut store).await?;
            let init = bindings
                .crewlet_plugin_handlers()
                .call_init(&mut store)
                .await?;
            Ok((bindings, init))
        })
        .await;
        let (bindings, init) = settle(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut store,
            outcome,
        )
        .map_err(StartError::Call)?;
        init.map_err(StartError::Refused)?;
        *live = Some(Live {
            store,
            bindings,
            generation,
        });
        Ok(())
    }

    /// Delivers an event; `Ok(Err(_))` is the module's own refusal.
    pub async fn on_event(
        &self,
        topic: &str,
        payload: &[u8],
    ) -> Result<Result<Vec<u8>, String>, CallError> {
        let mut live = self.live.lock().await;
        match self.ensure_live(&mut live).await {
            Ok(()) => {}
            Err(StartError::Call(e)) => return Err(e),
            Err(StartError::Refused(reason)) => return Ok(Err(format!("init refused: {reason}"))),
        }
        let event = Event {
            topic: topic.to_string(),
            payload: payload.to_vec(),
        };
        let current = live.as_mut().expect("ensured above");
        let deadline = self.manifest.limits.deadline;
        prepare(&mut current.store, deadline);
        let outcome = within(
            deadline,
            current
                .bindings
                .crewlet_plugin_handlers()
                .call_on_event(&mut current.store, &event),
        )
        .await;
        let result = settle(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut current.store,
            outcome,
        );
        if result.is_err() {
            *live = None;
        }
        result
    }

    async fn deliver(&self, queued: Queued) {
        let mut live = self.live.lock().await;
        let Some(current) = live.as_mut() else {
            return;
        };
        if current.generation != queued.generation {
            return;
        }
        let deadline = self.manifest.limits.deadline;
        prepare(&mut current.store, deadline);
        let outcome = within(
            deadline,
            current
                .bindings
                .crewlet_plugin_handlers()
                .call_on_state(&mut current.store, &queued.event),
        )
        .await;
        match settle(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut current.store,
            outcome,
        ) {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => {
                tracing::warn!(plugin = %self.manifest.name, "on-state refused a watch step: {reason}")
            }
            Err(_) => *live = None,
        }
    }
}

enum StartError {
    Call(CallError),
    Refused(String),
}

/// Creates every bucket of the catalogue, idempotently (ADR 202: on every
/// raise, from the catalogue, before any module runs).
pub async fn ensure_buckets(
    catalogue: &Catalogue,
    backend: &dyn StateBackend,
) -> Result<Vec<String>, BackendError> {
    let mut created = Vec::new();
    for spec in catalogue.buckets() {
        backend.ensure_bucket(&spec).await?;
        created.push(spec.name);
    }
    Ok(created)
}

/// Module buckets that exist but left the catalogue: reported, never
/// removed (ADR 202 §6).
pub async fn orphaned_buckets(
    catalogue: &Catalogue,
    backend: &dyn StateBackend,
) -> Result<Vec<String>, BackendError> {
    let existing = backend.bucket_names().await?;
    Ok(catalogue.orphaned_buckets(existing.iter().map(String::as_str)))
}
