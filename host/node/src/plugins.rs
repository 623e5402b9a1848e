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

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_config::NodeConfig;
use crewlet_plugins::catalogue::Catalogue;
use crewlet_plugins::grant::Grant;
use crewlet_plugins::manifest::Permissions;
use crewlet_plugins::module::{ModulePlugin, WatchState, orphaned_buckets};
use crewlet_plugins::provider::ProviderPlugin;
use crewlet_plugins::state::{Ensured, KvState, StateBackend, ensure_all};
use crewlet_plugins::webhook::WebhookPlugin;
use crewlet_plugins::{HealthReport, Kind, Manifest, Runtime, RuntimeConfig};
use serde_json::{Value, json};
use tracing::{error, info, warn};

/// How long `GET /plugins` waits for one bucket's usage.
pub const USAGE_WITHIN: Duration = Duration::from_secs(2);

/// Plugins this node loaded, and those it could not.
pub struct Loaded {
    pub runtime: Arc<Runtime>,
    pub webhooks: Vec<Arc<WebhookPlugin>>,
    pub providers: Vec<Arc<ProviderPlugin>>,
    pub modules: Vec<Arc<ModulePlugin>>,
    /// Each module's `init`, as it stands.
    pub module_states: Arc<Mutex<BTreeMap<String, ModuleState>>>,
    pub failed: Vec<(String, String)>,
    pub orphaned: Vec<String>,
    /// What ensuring each module bucket found at start.
    pub buckets: Vec<Ensured>,
    pub catalogue: Catalogue,
    /// Module state, for the operator's read of a bucket.
    pub state: Arc<dyn StateBackend>,
    /// How each module subscription is doing on this node.
    pub board: Arc<crate::modules::Board>,
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
                max_body_bytes: g.max_body_bytes,
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

/// `crewlet plugins list --config FILE [DIR…]`: the plugins as the node
/// that file configures would load them, grants applied; the exit status.
pub fn list_granted(file: &Path, dirs: &[std::path::PathBuf]) -> i32 {
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
    let bus: Arc<dyn crewlet_plugins::module::ModuleBus> =
        Arc::new(crate::modules::bus::NodeBus(publisher));
    let (catalogue, invalid) = catalogue(dirs, config)?;
    let mut failed: Vec<(String, String)> = invalid
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

    let mut loaded = Loaded {
        runtime: runtime.clone(),
        webhooks: Vec::new(),
        providers: Vec::new(),
        modules: Vec::new(),
        module_states: Arc::default(),
        failed: Vec::new(),
        orphaned,
        buckets,
        catalogue: catalogue.clone(),
        state: backend.clone(),
        board: Arc::default(),
    };
    for manifest in catalogue.plugins.iter().cloned() {
        let name = manifest.name.clone();
        let outcome = match manifest.kind {
            Kind::Webhook => WebhookPlugin::load(&runtime, manifest)
                .map(|p| loaded.webhooks.push(Arc::new(p)))
                .map_err(|e| e.to_string()),
            Kind::Provider => ProviderPlugin::load(&runtime, manifest)
                .map(|p| loaded.providers.push(Arc::new(p)))
                .map_err(|e| e.to_string()),
            Kind::Module => {
                ModulePlugin::load(&runtime, manifest, &catalogue, backend.clone(), bus.clone())
                    .map(|p| loaded.modules.push(p))
                    .map_err(|e| e.to_string())
            }
        };
        match outcome {
            Ok(()) => info!(subsystem = "plugins", plugin = %name, "plugin loaded"),
            Err(e) => {
                error!(subsystem = "plugins", plugin = %name, error = %e, "plugin not loaded");
                failed.push((name, e));
            }
        }
    }
    loaded.failed = failed;
    for module in &loaded.modules {
        start_module(module.clone(), loaded.module_states.clone());
    }
    Ok(loaded)
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

/// What a plugin may touch, one line per grant; what the operator's
/// configuration added says so.
pub fn permissions(m: &Manifest) -> Vec<String> {
    let by_operator = format!(" ({})", m.granted);
    let mut out = vec![format!(
        "memory {} MiB, {} ms per call",
        m.limits.memory_bytes / (1024 * 1024),
        m.limits.deadline.as_millis()
    )];
    if m.scratch {
        out.push("a private scratch directory".into());
    }
    match &m.permissions {
        Permissions::Webhook { routes, secrets } => {
            out.extend(routes.iter().map(|r| format!("serves {r}")));
            out.extend(secrets.iter().map(|s| format!("secret {s}")));
            let whose = match m.granted.max_body_bytes {
                Some(_) => by_operator.as_str(),
                None => "",
            };
            out.push(format!(
                "bodies up to {} bytes{whose}",
                m.limits.max_body_bytes
            ));
        }
        Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } => {
            let whose = match &m.granted.base_url {
                Some(_) => by_operator.as_str(),
                None => "",
            };
            out.push(format!("base URL {base_url}{whose}"));
            out.extend(allowed_outbound_hosts.iter().map(|o| {
                let whose = match m.granted.outbound.contains(o) {
                    true => by_operator.as_str(),
                    false => "",
                };
                format!("outbound {o}{whose}")
            }));
        }
        Permissions::Module { state, reads, .. } => {
            out.extend(state.iter().map(|b| format!("owns bucket {}", b.local)));
            out.extend(reads.iter().map(|r| format!("reads bucket {r}")));
        }
    }
    out
}

impl Loaded {
    /// The body of `GET /plugins`.
    pub fn view(&self) -> Value {
        let entry = |m: &Manifest, health: HealthReport| {
            json!({
                "name": m.name,
                "version": m.version,
                "kind": m.kind.world(),
                "manifest": m.file.display().to_string(),
                "permissions": permissions(m),
                "degraded": health.degraded,
                "breaker": {
                    "state": health.breaker,
                    "retry_after_ms": health.retry_after.map(|d| d.as_millis() as u64),
                    "faults_in_window": health.faults_in_window,
                },
                "calls": health.total_calls,
                "faults": health.total_faults,
                "refused": health.refused_calls,
                "consecutive_faults": health.consecutive_faults,
                "last_fault": health.last_fault,
                "last_fault_kind": health.last_fault_kind,
            })
        };
        let states = self
            .module_states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut plugins: Vec<Value> = Vec::new();
        plugins.extend(
            self.webhooks
                .iter()
                .map(|p| entry(p.manifest(), p.health())),
        );
        plugins.extend(
            self.providers
                .iter()
                .map(|p| entry(p.manifest(), p.health())),
        );
        plugins.extend(self.modules.iter().map(|p| {
            let mut e = entry(p.manifest(), p.health());
            let (state, error) = match states.get(&p.manifest().name) {
                Some(ModuleState::Running) => ("running", None),
                Some(ModuleState::Failed(why)) => ("failed", Some(why.clone())),
                Some(ModuleState::Starting) | None => ("starting", None),
            };
            e["state"] = json!(state);
            if let (Value::Object(entry), Value::Object(more)) =
                (&mut e, crate::modules::view(p, &self.board))
            {
                entry.extend(more);
            }
            e["error"] = json!(error);
            e["watches"] = p
                .watches()
                .iter()
                .map(|w| {
                    json!({
                        "id": w.id,
                        "bucket": w.bucket,
                        "state": w.state.as_str(),
                        "attempts": w.attempts,
                        "reopened": w.reopened,
                        "last_error": w.last_error,
                    })
                })
                .collect::<Vec<_>>()
                .into();
            e
        }));
        json!({
            "plugins": plugins,
            "failed": self.failed.iter().map(|(name, error)| json!({ "name": name, "error": error })).collect::<Vec<_>>(),
            "orphaned_buckets": self.orphaned,
            "buckets": self.buckets.iter().map(|b| json!({
                "name": b.name,
                "created": b.created,
                "reconfigured": b.reconfigured,
                "replicas": b.replicas,
                "configured_replicas": b.wanted_replicas,
                "replicas_differ": b.replicas_differ(),
            })).collect::<Vec<_>>(),
        })
    }

    /// [`Loaded::view`] with what each module bucket holds, read now: live
    /// keys (a certified listing), bytes and cap. Each read is bounded by
    /// [`USAGE_WITHIN`]; a bucket that does not answer says so in its row.
    pub async fn view_with_usage(&self) -> Value {
        let mut view = self.view();
        let reads = self.buckets.iter().map(|b| {
            let state = self.state.clone();
            let name = b.name.clone();
            async move { tokio::time::timeout(USAGE_WITHIN, state.usage(&name)).await }
        });
        let usages = futures::future::join_all(reads).await;
        if let Some(rows) = view["buckets"].as_array_mut() {
            for (row, usage) in rows.iter_mut().zip(usages) {
                match usage {
                    Ok(Ok(u)) => {
                        row["keys"] = json!(u.keys);
                        row["bytes"] = json!(u.bytes);
                        row["max_bytes"] = json!(u.max_bytes);
                    }
                    Ok(Err(e)) => row["usage_error"] = json!(e.to_string()),
                    Err(_) => {
                        row["usage_error"] = json!(format!(
                            "the bus did not answer within {} s; ask again",
                            USAGE_WITHIN.as_secs()
                        ))
                    }
                }
            }
        }
        view
    }

    /// Module watches re-opening after their bucket stopped answering.
    pub fn watches_reopening(&self) -> usize {
        self.modules
            .iter()
            .flat_map(|m| m.watches())
            .filter(|w| w.state == WatchState::Reopening)
            .count()
    }
}

/// `crewlet plugins list --api URL`: what the running node reports, one
/// block per plugin (health; a module's subscriptions, tools and
/// publications), then every module bucket with what it holds.
pub fn render_live(view: &Value) -> String {
    let mut out = String::new();
    for p in view["plugins"].as_array().into_iter().flatten() {
        let s = |k: &str| p[k].as_str().unwrap_or("-").to_owned();
        let state = p["state"].as_str().unwrap_or("loaded");
        let degraded = if p["degraded"].as_bool() == Some(true) {
            " DEGRADED"
        } else {
            ""
        };
        out.push_str(&format!(
            "{} {} ({}) {state}{degraded}: calls {}, faults {}, breaker {}\n",
            s("name"),
            s("version"),
            s("kind"),
            p["calls"],
            p["faults"],
            p["breaker"]["state"].as_str().unwrap_or("-"),
        ));
        if let Some(subs) = p["subscriptions"].as_object() {
            for (kind, sub) in subs {
                out.push_str(&format!(
                    "  subscribes {kind} ({})\n",
                    sub["delivery"].as_str().unwrap_or("-")
                ));
            }
        }
        for t in p["tools"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  tool {}\n",
                t["offered_as"].as_str().unwrap_or("-")
            ));
        }
        for kind in p["publishes"].as_array().into_iter().flatten() {
            out.push_str(&format!("  publishes {}\n", kind.as_str().unwrap_or("-")));
        }
    }
    for b in view["buckets"].as_array().into_iter().flatten() {
        let name = b["name"].as_str().unwrap_or("-");
        let held = match b["usage_error"].as_str() {
            Some(e) => format!("usage unknown: {e}"),
            None => format!(
                "{} keys, {} bytes of {}",
                b["keys"],
                b["bytes"],
                b["max_bytes"]
                    .as_u64()
                    .map(|m| format!("{m}"))
                    .unwrap_or_else(|| "no cap".into())
            ),
        };
        out.push_str(&format!("bucket {name}: {held}, R{}\n", b["replicas"]));
    }
    for f in view["failed"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "FAILED {}: {}\n",
            f["name"].as_str().unwrap_or("-"),
            f["error"].as_str().unwrap_or("-")
        ));
    }
    out
}
