//! The module host: a long-lived module instance, the buckets issued to
//! it and its watches.
//!
//! Rules, and why (ADR 202):
//! - A module is issued its buckets by the names it uses: owned ones
//!   (`state`) read-write, `reads` ones read-only. Anything else is refused
//!   as a [`StateError`] the guest can handle, never a trap, naming the
//!   bucket and the reason: the server enforces only the union of every
//!   module's rights, so the runtime's refusal is what keeps a module to
//!   its own.
//! - The buckets issued are resolved once, when the module is loaded,
//!   from its effective permissions (a read the operator denies is not
//!   issued, and its refusal names the operator's key), and every state
//!   call passes one choke point, [`ModuleCtx::authorize`] (issued, then
//!   writable for a write), which logs each refusal with its reason; then
//!   key, size, credential. The first check that fails is the answer.
//! - One instance serves all of a module's calls, one at a time. If a call
//!   faults, the instance (and every watch it started) is dropped, and a
//!   new one is started (`init` again, so its watches too) after a backoff
//!   — one second, doubling to [`MAX_REVIVAL_WAIT`], or the breaker's own
//!   wait while it is open — or sooner by the next call. Why: a module
//!   driven only by its watches has no next call, and would otherwise stay
//!   dead while `/plugins` said it ran. Watch steps queued for the dropped
//!   instance are discarded, never delivered to the new one.
//! - Watches are bounded: at most [`MAX_WATCHES`] per instance, and their
//!   steps queue in a channel of [`WATCH_QUEUE`] per module. A full queue
//!   stops the watch reading (the stream's flow control holds the rest on
//!   the server), so a slow `on-state` slows its own watch, never the
//!   node's memory. A watch lists its bucket's current values in a task of
//!   its own, after `watch` returns, and a module's watches list one at a
//!   time (the next once the last one's current values were handed on):
//!   eight watches of a full bucket hold one listing, not eight.
//! - A module publishes only the topics its manifest declares, through the
//!   node's [`ModuleBus`] (the host crate never names a subject for it):
//!   `module/bus.rs`. A tool call's arguments are checked against the
//!   tool's schema, compiled once at load, before the module runs:
//!   `module/tools.rs`.
//! - A watch whose bucket stops answering is re-opened with backoff and
//!   resumes after what it delivered, never ended in silence; each watch's
//!   state is on [`ModulePlugin::watches`] (the rules are in [`watch`]'s
//!   docs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::HealthReport;
use crate::bindings::module::exports::crewlet::plugin::handlers::Event;
use crate::bindings::module::{Module, ModulePre};
use crate::catalogue::Catalogue;
use crate::manifest::{Manifest, Permissions, Subscription, ToolDecl, compile_schema};
use crate::runtime::{CallError, LoadError, Runtime};
use crate::sandbox::Sandbox;
use crate::scrub::Scrub;
use crate::shell::{Shell, World};
use crate::state::{BackendError, StateBackend};

mod bus;
mod ctx;
mod tools;
pub mod watch;

pub use bus::MAX_PUBLISH_BYTES;
use ctx::{AbortOnDrop, ModuleCtx, Queued, denied_reads, naming_deny};
pub use ctx::{IssuedBucket, issued_buckets};
pub use tools::{MAX_ARGUMENTS_BYTES, MAX_TOOL_ANSWER_BYTES, ToolCaller, ToolError};

/// Where a module's published events go: the node records each as an event
/// row of kind `kind` (`module.<name>.<topic>`) and broadcasts it. The
/// host crate checks the topic and the size first and never names a
/// subject; an `Err` carries why the event was not taken, for the guest.
pub trait ModuleBus: Send + Sync + 'static {
    fn publish<'a>(
        &'a self,
        kind: &'a str,
        payload: Vec<u8>,
    ) -> futures::future::BoxFuture<'a, Result<(), NotTaken>>;
}

/// Why the node's bus did not take a module's event. The host is to blame
/// (its log or the events stream), never the module: nothing was
/// published, and the module may publish it again once the bus answers.
/// The text is what the guest is told (`unavailable: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct NotTaken {
    pub why: String,
}

/// A module's own "no", as a value: the call reached the module (or its
/// `init`) and the module refused. The module is to blame, or the caller
/// whose input it refused; its words are passed on as they are (bounded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModuleRefusal {
    /// The module answered the call with an error of its own.
    #[error("{0}")]
    Refused(String),
    /// The module's `init` refused, so the call never ran: its author or
    /// its state is to blame; it is tried again on the next call.
    #[error("init refused: {0}")]
    Init(String),
}
pub use watch::{WatchBoard, WatchState, WatchView};

/// Watch steps queued per module before its watches stop reading.
pub const WATCH_QUEUE: usize = 64;
/// Watches one module instance may hold.
pub const MAX_WATCHES: usize = 8;
/// The first wait before a module whose instance a fault dropped is
/// started again.
pub const FIRST_REVIVAL_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between two attempts to start it again.
pub const MAX_REVIVAL_WAIT: Duration = Duration::from_secs(300);

type ModuleStore = Store<Sandbox<ModuleCtx>>;

/// The module world: its imports (`state`, `bus`, `log`) beside WASI.
struct ModuleWorld;

impl World for ModuleWorld {
    type Ctx = ModuleCtx;
    type Pre = ModulePre<Sandbox<ModuleCtx>>;

    fn link(linker: &mut Linker<Sandbox<ModuleCtx>>) -> wasmtime::Result<()> {
        Module::add_to_linker::<Sandbox<ModuleCtx>, HasSelf<Sandbox<ModuleCtx>>>(linker, |s| s)
    }

    fn pre(
        pre: InstancePre<Sandbox<ModuleCtx>>,
        _component: &Component,
        _engine: &wasmtime::Engine,
    ) -> wasmtime::Result<Self::Pre> {
        ModulePre::new(pre)
    }
}

struct Live {
    store: ModuleStore,
    bindings: Module,
    generation: u64,
}

/// The denied read the live instance met in its last call, if any.
fn denied_met(live: &Option<Live>) -> Option<crate::manifest::NotHeld> {
    live.as_ref()
        .and_then(|l| l.store.data().world.take_denied())
}

/// A running module.
pub struct ModulePlugin {
    shell: Shell<ModuleWorld>,
    backend: Arc<dyn StateBackend>,
    issued: Arc<HashMap<String, IssuedBucket>>,
    denied: Arc<HashMap<String, crate::manifest::NotHeld>>,
    live: tokio::sync::Mutex<Option<Live>>,
    generation: Mutex<u64>,
    events: tokio::sync::mpsc::Sender<Queued>,
    listing: Arc<tokio::sync::Semaphore>,
    watch_board: Arc<WatchBoard>,
    dispatcher: Mutex<Option<AbortOnDrop>>,
    /// Starts the instance again after a fault dropped it.
    revival: Mutex<Option<AbortOnDrop>>,
    /// Set by [`ModulePlugin::stop`]: no revival after it.
    stopped: AtomicBool,
    this: Weak<ModulePlugin>,
    bus: Arc<dyn ModuleBus>,
    publishes: Arc<[String]>,
    subscriptions: Vec<Subscription>,
    tools: Vec<ToolDecl>,
    /// Each tool's arguments schema, compiled at load.
    validators: HashMap<String, jsonschema::Validator>,
}

impl ModulePlugin {
    /// [`ModulePlugin::load`], then `init` ([`ModulePlugin::init`]).
    pub async fn start(
        runtime: &Arc<Runtime>,
        manifest: Manifest,
        catalogue: &Catalogue,
        backend: Arc<dyn StateBackend>,
        bus: Arc<dyn ModuleBus>,
    ) -> Result<Arc<ModulePlugin>, LoadError> {
        let plugin = ModulePlugin::load(runtime, manifest, catalogue, backend, bus)?;
        plugin.init().await?;
        Ok(plugin)
    }

    /// Loads and links the module, refusing it if the catalogue finds one
    /// of its `reads` or `topic` subscriptions undeclared by a present
    /// owner; its grants are resolved and its tools' schemas compiled here,
    /// once. Nothing of it runs yet. The catalogue's buckets must already
    /// exist ([`ensure_buckets`]); what it publishes goes to `bus`.
    pub fn load(
        runtime: &Arc<Runtime>,
        manifest: Manifest,
        catalogue: &Catalogue,
        backend: Arc<dyn StateBackend>,
        bus: Arc<dyn ModuleBus>,
    ) -> Result<Arc<ModulePlugin>, LoadError> {
        if let Some(problem) = catalogue.problems_of(&manifest.file).first() {
            return Err(LoadError::Init {
                plugin: manifest.name.clone(),
                reason: problem.to_string(),
            });
        }
        let (publishes, subscriptions, tools) = match &manifest.permissions {
            Permissions::Module {
                publishes,
                subscribes,
                tools,
                ..
            } => (publishes.clone(), subscribes.clone(), tools.clone()),
            _ => Default::default(),
        };
        let mut validators = HashMap::new();
        for tool in &tools {
            let validator = compile_schema(&tool.arguments).map_err(|why| LoadError::Init {
                plugin: manifest.name.clone(),
                reason: format!("field `module.tools.{}.arguments` {why}", tool.name),
            })?;
            validators.insert(tool.name.clone(), validator);
        }
        let shell = Shell::<ModuleWorld>::load(runtime, manifest)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Queued>(WATCH_QUEUE);
        let plugin = Arc::new_cyclic(|this| ModulePlugin {
            issued: Arc::new(issued_buckets(&shell.manifest)),
            denied: Arc::new(denied_reads(&shell.manifest)),
            shell,
            backend,
            live: tokio::sync::Mutex::new(None),
            generation: Mutex::new(0),
            events: tx,
            listing: Arc::new(tokio::sync::Semaphore::new(1)),
            watch_board: Arc::default(),
            dispatcher: Mutex::new(None),
            revival: Mutex::new(None),
            stopped: AtomicBool::new(false),
            this: this.clone(),
            bus,
            publishes: publishes.into(),
            subscriptions,
            tools,
            validators,
        });
        let weak: Weak<ModulePlugin> = Arc::downgrade(&plugin);
        let task = tokio::spawn(async move {
            while let Some(queued) = rx.recv().await {
                let Some(plugin) = weak.upgrade() else { return };
                plugin.deliver(queued).await;
            }
        });
        *plugin.dispatcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(AbortOnDrop(task));
        Ok(plugin)
    }

    /// Instantiates the module and runs `init`, within its deadline.
    pub async fn init(&self) -> Result<(), LoadError> {
        let mut live = self.live.lock().await;
        self.ensure_live(&mut live).await.map_err(|e| match e {
            StartError::Refused(reason) => LoadError::Init {
                plugin: self.shell.manifest.name.clone(),
                reason,
            },
            StartError::Call(CallError::Fault { fault, .. }) => LoadError::InitFault {
                plugin: self.shell.manifest.name.clone(),
                fault,
            },
            StartError::Call(other) => LoadError::Init {
                plugin: self.shell.manifest.name.clone(),
                reason: other.to_string(),
            },
        })
    }

    /// Ends the live instance and with it every watch it holds, for a node
    /// that stops. Why: a watch left open past the broker's stop reads as
    /// a bucket that stopped answering (a WARN, and re-open attempts) on
    /// every clean shutdown. Steps still queued are dropped (their
    /// instance is gone); a later call would start a new instance.
    pub async fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let revival = self
            .revival
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(revival);
        let ended = self.live.lock().await.take();
        drop(ended);
    }

    /// The module's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.shell.manifest
    }

    /// The module's health.
    pub fn health(&self) -> HealthReport {
        self.shell.health()
    }

    /// The tools the manifest declares.
    pub fn tools(&self) -> &[ToolDecl] {
        &self.tools
    }

    /// The events the module subscribes to.
    pub fn subscriptions(&self) -> &[Subscription] {
        &self.subscriptions
    }

    /// The local topics the module may publish.
    pub fn publishes(&self) -> &[String] {
        &self.publishes
    }

    /// The watches the module's live instance holds, and how each stands.
    pub fn watches(&self) -> Vec<WatchView> {
        self.watch_board.views()
    }

    /// The module's recent `log` lines, oldest first.
    pub fn logs(&self) -> Vec<String> {
        self.shell.guard.speaker().logged_since(0)
    }

    async fn ensure_live(&self, live: &mut Option<Live>) -> Result<(), StartError> {
        if live.is_some() {
            return Ok(());
        }
        // Boxed: a call on a live instance (nearly every call) then carries
        // a pointer, not the start's large future.
        Box::pin(self.start_live(live)).await
    }

    async fn start_live(&self, live: &mut Option<Live>) -> Result<(), StartError> {
        let generation = {
            let mut g = self.generation.lock().unwrap_or_else(|p| p.into_inner());
            *g += 1;
            *g
        };
        let world = ModuleCtx {
            plugin: self.shell.manifest.name.clone(),
            generation,
            issued: self.issued.clone(),
            denied: self.denied.clone(),
            denied_met: std::sync::Mutex::new(None),
            backend: self.backend.clone(),
            events: self.events.clone(),
            listing: self.listing.clone(),
            watches: Vec::new(),
            board: self.watch_board.clone(),
            next_watch: 0,
            bus: self.bus.clone(),
            publishes: self.publishes.clone(),
        };
        let store = self.shell.store(world).map_err(StartError::Call)?;
        let pre = self.shell.pre.clone();
        let (store, (bindings, init)) = self
            .shell
            .guard
            .call(
                store,
                self.shell.manifest.limits.deadline,
                &Scrub::none(),
                move |mut store| async move {
                    let r = async {
                        let bindings = pre.instantiate_async(&mut store).await?;
                        let init = bindings
                            .crewlet_plugin_handlers()
                            .call_init(&mut store)
                            .await?;
                        Ok((bindings, init))
                    }
                    .await;
                    (store, r)
                },
            )
            .await
            .map_err(StartError::Call)?;
        let denied = store.data().world.take_denied();
        init.map_err(|reason| StartError::Refused(naming_deny(reason, denied)))?;
        *live = Some(Live {
            store,
            bindings,
            generation,
        });
        Ok(())
    }

    /// One call on the live instance; a failed call drops it (and its
    /// watches).
    async fn on_live<R, F, Fut>(&self, live: &mut Option<Live>, step: F) -> Result<R, CallError>
    where
        R: Send + 'static,
        F: FnOnce(Module, ModuleStore) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (ModuleStore, Module, wasmtime::Result<R>)>
            + Send
            + 'static,
    {
        let Some(current) = live.take() else {
            return Err(CallError::Instantiate {
                plugin: self.shell.manifest.name.clone(),
                reason: "the module has no live instance".to_string(),
            });
        };
        let generation = current.generation;
        let bindings = current.bindings;
        let (store, (bindings, value)) = self
            .shell
            .guard
            .call(
                current.store,
                self.shell.manifest.limits.deadline,
                &Scrub::none(),
                move |store| async move {
                    let (store, bindings, r) = step(bindings, store).await;
                    (store, r.map(|v| (bindings, v)))
                },
            )
            .await
            .inspect_err(|_| self.revive_later())?;
        *live = Some(Live {
            store,
            bindings,
            generation,
        });
        Ok(value)
    }

    /// Delivers an event of `kind` (a company event kind, or another
    /// module's `module.<name>.<topic>`) with its JSON `payload`;
    /// `Ok(Err(_))` is the module's own refusal.
    pub async fn on_event(
        &self,
        kind: &str,
        payload: &[u8],
    ) -> Result<Result<(), ModuleRefusal>, CallError> {
        let mut live = self.live.lock().await;
        match self.ensure_live(&mut live).await {
            Ok(()) => {}
            Err(StartError::Call(e)) => return Err(e),
            Err(StartError::Refused(reason)) => return Ok(Err(ModuleRefusal::Init(reason))),
        }
        let event = Event {
            topic: kind.to_string(),
            payload: payload.to_vec(),
        };
        denied_met(&live); // a deny met between calls (a watch step) is not this call's
        let answer = self
            .on_live(&mut live, move |bindings, mut store| async move {
                let r = bindings
                    .crewlet_plugin_handlers()
                    .call_on_event(&mut store, &event)
                    .await;
                (store, bindings, r)
            })
            .await?;
        let denied = denied_met(&live);
        Ok(answer.map_err(|why| ModuleRefusal::Refused(naming_deny(why, denied))))
    }

    async fn deliver(&self, queued: Queued) {
        let mut live = self.live.lock().await;
        if live
            .as_ref()
            .is_none_or(|l| l.generation != queued.generation)
        {
            return;
        }
        let event = queued.event;
        let result = self
            .on_live(&mut live, move |bindings, mut store| async move {
                let r = bindings
                    .crewlet_plugin_handlers()
                    .call_on_state(&mut store, &event)
                    .await;
                (store, bindings, r)
            })
            .await;
        if let Ok(Err(reason)) = result {
            tracing::warn!(plugin = %self.shell.manifest.name, "on-state refused a watch step: {reason}")
        }
    }
}

impl ModulePlugin {
    /// Starts a new instance once a backoff has passed, unless a call did
    /// first or the module was stopped (one revival at a time; a later
    /// fault replaces it).
    fn revive_later(&self) {
        if self.stopped.load(Ordering::SeqCst) {
            return;
        }
        let this = self.this.clone();
        let task = tokio::spawn(async move {
            let mut wait = FIRST_REVIVAL_WAIT;
            loop {
                tokio::time::sleep(wait).await;
                let Some(plugin) = this.upgrade() else { return };
                if plugin.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let mut live = plugin.live.lock().await;
                if live.is_some() {
                    return;
                }
                let name = &plugin.shell.manifest.name;
                wait = match plugin.ensure_live(&mut live).await {
                    Ok(()) => {
                        tracing::info!(plugin = %name, "module started again after a fault dropped its instance");
                        return;
                    }
                    Err(StartError::Call(CallError::Quarantined { retry_after, .. })) => {
                        retry_after
                    }
                    Err(StartError::Call(e)) => {
                        tracing::warn!(plugin = %name, "module could not be started again after a fault: {e}; next try in {:?}", wait * 2);
                        (wait * 2).min(MAX_REVIVAL_WAIT)
                    }
                    Err(StartError::Refused(why)) => {
                        tracing::warn!(plugin = %name, "module's init refused when started again after a fault: {why}; next try in {:?}", wait * 2);
                        (wait * 2).min(MAX_REVIVAL_WAIT)
                    }
                };
            }
        });
        *self.revival.lock().unwrap_or_else(|p| p.into_inner()) = Some(AbortOnDrop(task));
    }
}

enum StartError {
    Call(CallError),
    Refused(String),
}

/// Creates every bucket of the catalogue, idempotently (ADR 202: on every
/// raise, from the catalogue, before any module runs), and names them;
/// [`crate::state::ensure_all`] answers what each one found.
pub async fn ensure_buckets(
    catalogue: &Catalogue,
    backend: &dyn StateBackend,
) -> Result<Vec<String>, BackendError> {
    let ensured = crate::state::ensure_all(catalogue, backend).await?;
    Ok(ensured.into_iter().map(|e| e.name).collect())
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
