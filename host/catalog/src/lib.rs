//! The node's plugins: [`load`] reads and loads them at start, then
//! [`start`] sets them to work ([`Running`]: each module's consumers, the
//! reload loop) until [`Running::stop`]; [`Loaded::view`] is `GET /plugins`.
//! The node only wires these; the HTTP route is `crewlet-api`'s.
//!
//! Plugins at start: the catalogue read from `--plugins DIR`, every declared
//! module bucket created (idempotently, before any module runs), each
//! plugin loaded into the one runtime, and the view `GET /plugins` answers.
//!
//! Module buckets are created at the node's `stream.replicas`, like its
//! streams and coordination buckets, and adopted when they exist. A bucket
//! whose replica count differs from the node's is reported — a warning
//! naming the fix, and `replicas_differ` in the view's `buckets` — and kept
//! as it is: moving a bucket's data is an operator's gesture, and one
//! module's bucket does not stop a node (a coordination bucket or stream on
//! fewer replicas does, because the company's work would sit on fewer
//! disks than the node reports). Each module's watches are in the view as
//! `watches`, and `/health` counts those re-opening.
//!
//! One broken plugin does not stop a node: it is reported (log and view)
//! and whatever it would have served answers as absent. A store that cannot
//! create the buckets does stop the start, as any store failure does.
//!
//! Modules are loaded (compiled, linked, grants resolved) at start, and
//! their `init` runs beside the engine's start, all at once, each bounded
//! by its deadline (at most the module world's ceiling): a stuck module is
//! reported failed and the node is ready without it.

pub mod modules;
pub mod reload;
mod running;
mod view;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crewlet_config::NodeConfig;
use crewlet_plugins::catalogue::Catalogue;
use crewlet_plugins::effective::PluginRows;
use crewlet_plugins::grant::Grant;
use crewlet_plugins::installed::Refusal;
use crewlet_plugins::module::{ModuleBus, ModulePlugin, WatchState, orphaned_buckets};
use crewlet_plugins::provider::ProviderPlugin;
use crewlet_plugins::state::{Ensured, KvState, StateBackend, ensure_all};
use crewlet_plugins::webhook::WebhookPlugin;
use crewlet_plugins::{Installed, Kind, Manifest, Plugin, Runtime, RuntimeConfig};
use tracing::{error, info, warn};

pub use reload::watch;
pub use running::{Parts, Running, start};
pub use view::{render_effective, render_live};

/// How long `GET /plugins` waits for one bucket's usage.
pub const USAGE_WITHIN: Duration = Duration::from_secs(2);

/// Plugins this node serves, and those it could not load.
pub struct Loaded {
    pub runtime: Arc<Runtime>,
    /// What serves now; a reload swaps one plugin at a time
    /// ([`reload`]). A plugin that could not be loaded (at start or since)
    /// has its refusal on record there.
    pub installed: Arc<Installed>,
    /// Each module's `init`, as it stands.
    pub module_states: Arc<Mutex<BTreeMap<String, ModuleState>>>,
    /// Manifests refused as written, by file: they name no plugin yet.
    pub invalid: RwLock<Vec<(String, String)>>,
    pub orphaned: Vec<String>,
    /// What ensuring each module bucket found at start.
    pub buckets: Vec<Ensured>,
    catalogue: RwLock<Catalogue>,
    /// Module state, for the operator's read of a bucket.
    pub state: Arc<dyn StateBackend>,
    bus: Arc<dyn ModuleBus>,
    /// How each module subscription is doing on this node.
    pub board: Arc<crate::modules::Board>,
    /// Where the plugins are read from, and the grants applied to them.
    dirs: Vec<PathBuf>,
    config: NodeConfig,
    /// The folders as they were stamped just before they were read: what
    /// the reload loop compares against first, so a change made while the
    /// node was loading (or before the loop's first poll) is not taken
    /// for what was loaded.
    stamps: reload::Stamps,
}

/// Where a module's `init` stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleState {
    Starting,
    Running,
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Dir(#[source] crewlet_plugins::DirError),
    #[error("{0}")]
    Grant(#[source] crewlet_plugins::grant::GrantError),
    #[error("the plugin engine could not start: {0}")]
    Engine(String),
    #[error("cannot create the module buckets the catalogue declares: {0}")]
    Buckets(String),
}

/// The catalogue under `dirs` with the operator's grants applied: the one
/// way the node (its start check, its load, `doctor`) reads its plugins.
pub fn catalogue(
    dirs: &[std::path::PathBuf],
    config: &NodeConfig,
) -> Result<(Catalogue, Vec<crewlet_plugins::ManifestError>), StartError> {
    let (mut catalogue, invalid) = Catalogue::load_dirs(dirs).map_err(StartError::Dir)?;
    let grants: BTreeMap<String, Grant> = config
        .plugin_grants
        .iter()
        .map(|(name, g)| {
            let grant = Grant {
                base_url: g.base_url.clone(),
                allowed_outbound_hosts: g.allowed_outbound_hosts.clone(),
                denied_outbound_hosts: g.denied_outbound_hosts.clone(),
                routes: g.routes.clone(),
                denied_routes: g.denied_routes.clone(),
                max_body_bytes: g.max_body_bytes,
                reads: g.reads.clone(),
                denied_reads: g.denied_reads.clone(),
            };
            (name.clone(), grant)
        })
        .collect();
    let source = config.source.as_ref().map_or_else(
        || "the node's configuration".to_string(),
        |p| p.display().to_string(),
    );
    catalogue
        .apply_grants(&grants, &source)
        .map_err(StartError::Grant)?;
    Ok((catalogue, invalid))
}

/// `crewlet plugins list --config FILE [--effective] [DIR…]`: the plugins
/// as the node that file configures would load them, grants applied
/// (with `effective`, each permission and where it came from); the exit
/// status.
pub fn list_granted(file: &Path, dirs: &[std::path::PathBuf], effective: bool) -> i32 {
    let env = |name: &str| std::env::var(name).ok();
    let config = match NodeConfig::load(Some(file), &Default::default(), &env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return 2;
        }
    };
    let dirs: Vec<std::path::PathBuf> = config.plugin_dirs.iter().chain(dirs).cloned().collect();
    match catalogue(&dirs, &config) {
        Ok((catalogue, _)) if effective => {
            let rows: Vec<_> = catalogue.plugins.iter().map(PluginRows::of).collect();
            print!("{}", crewlet_plugins::effective::render(&rows));
            0
        }
        Ok((catalogue, invalid)) => {
            let list = crewlet_plugins::PluginList {
                dirs,
                catalogue,
                invalid,
            };
            print!("{list}");
            0
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            1
        }
    }
}

/// Loads the catalogue under `dir`; module buckets are created with
/// `replicas` copies (`stream.replicas`).
pub async fn load(
    dirs: &[std::path::PathBuf],
    config: &NodeConfig,
    client: async_nats::Client,
    publisher: crewlet_observe::Publisher,
) -> Result<Loaded, StartError> {
    let data_dir = &config.data_dir;
    let replicas = config.stream.replicas;
    let bus: Arc<dyn ModuleBus> = Arc::new(crate::modules::bus::NodeBus(publisher));
    let stamps = reload::stamp_all(dirs);
    let (catalogue, invalid) = catalogue(dirs, config)?;
    let invalid: Vec<(String, String)> = invalid
        .into_iter()
        .map(|e| {
            error!(subsystem = "plugins", error = %e, "plugin manifest refused");
            (e.file.display().to_string(), e.to_string())
        })
        .collect();
    let runtime = Runtime::new(RuntimeConfig {
        data_dir: Some(data_dir.to_path_buf()),
        ..measurement_knobs(RuntimeConfig::default())
    })
    .map_err(|e| StartError::Engine(e.to_string()))?;
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client).with_replicas(replicas));
    let buckets = ensure_all(&catalogue, backend.as_ref())
        .await
        .map_err(|e| StartError::Buckets(e.to_string()))?;
    buckets.iter().for_each(report_bucket);
    let orphaned = orphaned_buckets(&catalogue, backend.as_ref())
        .await
        .unwrap_or_default();
    for bucket in &orphaned {
        info!(
            subsystem = "plugins",
            bucket, "module bucket no longer declared by any plugin; kept, not removed"
        );
    }

    let mut plugins = Vec::new();
    let refusals: Vec<(String, String)> = catalogue
        .plugins
        .iter()
        .filter_map(|manifest| {
            let name = manifest.name.clone();
            match load_one(&runtime, manifest.clone(), &catalogue, &backend, &bus) {
                Ok(p) => {
                    info!(subsystem = "plugins", plugin = %name, "plugin loaded");
                    plugins.push(p);
                    None
                }
                Err(e) => {
                    error!(subsystem = "plugins", plugin = %name, error = %e, "plugin not loaded");
                    Some((name, e))
                }
            }
        })
        .collect();
    let installed = Installed::new(plugins);
    for (name, reason) in refusals {
        installed.refuse(&name, refusal(reason));
    }
    let loaded = Loaded {
        runtime,
        installed,
        module_states: Arc::default(),
        invalid: RwLock::new(invalid),
        orphaned,
        buckets,
        catalogue: RwLock::new(catalogue),
        state: backend,
        bus,
        board: Arc::default(),
        dirs: dirs.to_vec(),
        config: config.clone(),
        stamps,
    };
    for module in loaded.installed.modules() {
        start_module(module, loaded.module_states.clone());
    }
    Ok(loaded)
}

/// Loads one plugin of any world (compiled, linked, grants resolved);
/// `Err` is the reason, as the operator fixes it.
fn load_one(
    runtime: &Arc<Runtime>,
    manifest: Manifest,
    catalogue: &Catalogue,
    backend: &Arc<dyn StateBackend>,
    bus: &Arc<dyn ModuleBus>,
) -> Result<Plugin, String> {
    match manifest.kind {
        Kind::Webhook => {
            WebhookPlugin::load(runtime, manifest).map(|p| Plugin::Webhook(Arc::new(p)))
        }
        Kind::Provider => {
            ProviderPlugin::load(runtime, manifest).map(|p| Plugin::Provider(Arc::new(p)))
        }
        Kind::Module => {
            ModulePlugin::load(runtime, manifest, catalogue, backend.clone(), bus.clone())
                .map(Plugin::Module)
        }
    }
    .map_err(|e| e.to_string())
}

/// A refusal recorded now.
fn refusal(reason: String) -> Refusal {
    Refusal {
        reason,
        at_ms: u64::try_from(crewlet_os::now_ms()).unwrap_or(0),
    }
}

impl Loaded {
    /// The catalogue as last read (grants applied).
    pub fn catalogue(&self) -> Catalogue {
        self.catalogue
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Plugins that do not serve: a manifest refused as written, or a
    /// plugin whose every version so far was refused.
    pub fn failed(&self) -> Vec<(String, String)> {
        let mut out = self
            .invalid
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        out.extend(
            self.installed
                .refusals()
                .into_iter()
                .filter(|(name, _)| self.installed.get(name).is_none())
                .map(|(name, r)| (name, r.reason)),
        );
        out
    }

    /// Module watches re-opening after their bucket stopped answering.
    pub fn watches_reopening(&self) -> usize {
        self.installed
            .modules()
            .iter()
            .flat_map(|m| m.watches())
            .filter(|w| w.state == WatchState::Reopening)
            .count()
    }
}

/// Logs what ensuring a module bucket found.
fn report_bucket(b: &Ensured) {
    let bucket = b.name.as_str();
    if b.created {
        info!(
            subsystem = "plugins",
            bucket,
            replicas = b.replicas,
            "module bucket created"
        );
    } else if !b.reconfigured.is_empty() {
        info!(subsystem = "plugins", bucket, changed = ?b.reconfigured, "module bucket adopted; the owner's options that differed were applied");
    }
    if b.replicas_differ() {
        warn!(
            subsystem = "plugins",
            event = "module_bucket_replicas_differ",
            bucket,
            replicas = b.replicas,
            configured = b.wanted_replicas,
            "module bucket {bucket} has {} replica(s) but this node is configured for {} (stream.replicas); kept as it is — change it with `nats stream update KV_{bucket} --replicas={}`",
            b.replicas,
            b.wanted_replicas,
            b.wanted_replicas
        );
    }
}

/// Two knobs for the sandbox benchmark (`benches/sandbox.rs`), not for
/// production: `CREWLET_GUEST_THREADS=shared` runs guest code on the node's
/// I/O workers (yielding every tick) instead of its own threads, and
/// `CREWLET_BREAKER_FAULTS=0` never opens a breaker, so a hostile plugin's
/// cost can be measured without the quarantine that would stop it.
fn measurement_knobs(mut config: RuntimeConfig) -> RuntimeConfig {
    if let Ok(threads) = std::env::var("CREWLET_GUEST_THREADS") {
        config.guest_threads = match threads.parse::<usize>() {
            Ok(n) if n > 0 => crewlet_plugins::GuestThreads::Dedicated(n),
            _ => crewlet_plugins::GuestThreads::Shared,
        };
    }
    if std::env::var("CREWLET_BREAKER_FAULTS").is_ok_and(|v| v == "0") {
        config.breaker.faults_to_open = u32::MAX;
    }
    config
}

/// Runs `module`'s `init` in a task of its own, recording how it went.
fn start_module(module: Arc<ModulePlugin>, states: Arc<Mutex<BTreeMap<String, ModuleState>>>) {
    let name = module.manifest().name.clone();
    let set = move |state: ModuleState| {
        states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), state);
    };
    set(ModuleState::Starting);
    tokio::spawn(async move {
        let name = module.manifest().name.clone();
        match module.init().await {
            Ok(()) => {
                info!(subsystem = "plugins", plugin = %name, "module started");
                set(ModuleState::Running);
            }
            Err(e) => {
                error!(subsystem = "plugins", plugin = %name, error = %e, "module did not start");
                set(ModuleState::Failed(e.to_string()));
            }
        }
    });
}
