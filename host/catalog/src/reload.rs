//! Hot reload: a plugin whose manifest or component changed on disk is
//! validated and swapped in while the node runs (`[plugins] reload`, on by
//! default).
//!
//! Rules, and why:
//! - The folders are polled every [`POLL_EVERY`]: a stat of each component
//!   and a read of each `plugin.toml`. Polling follows symbolic links and
//!   several folders the way the catalogue does, and costs little; a file
//!   watcher would need both rebuilt by hand.
//! - A change is acted on once it held still for one poll, so a component
//!   caught half-written by `cargo build` is never loaded.
//! - The first poll is compared with the folders as stamped just before
//!   the node read them ([`Loaded`]), not with itself: a plugin edited
//!   while the node loaded was otherwise taken for what was loaded, and
//!   the old version served until the next edit.
//! - A new version is loaded whole (compiled, linked; a webhook is
//!   instantiated once; a module runs `init`) **before** it replaces the
//!   old one. If anything fails, the old version keeps serving and the
//!   refusal is kept beside it (`GET /plugins` → `reload_refused`, an
//!   ERROR line) until a later version loads.
//! - The swap is one entry of [`Installed`]: calls in flight finish on the
//!   instance they started on. A module's consumers are stopped (an event
//!   in hand is offered again by its durable) and started on the new
//!   version; its old watches end with the old instance.
//! - A plugin whose manifest is gone is taken off (its routes answer 404);
//!   a new one is loaded like at start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crewlet_plugins::catalogue::{CatalogueError, manifest_files};
use crewlet_plugins::state::ensure_all;
use crewlet_plugins::{Installed, Kind, Manifest, Plugin};
use tokio::sync::watch as signal;
use tracing::{error, info};

use super::{Loaded, ModuleState, load_one, refusal};
use crate::modules::Consumers;

/// How often the plugin folders are looked at.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// What one `plugin.toml` and its component look like on disk: enough to
/// see that either changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    manifest: Vec<u8>,
    component: Option<(u64, SystemTime)>,
}

/// Every manifest's stamp, by file.
pub type Stamps = BTreeMap<PathBuf, Stamp>;

/// Blocks until the files under `dirs` differ from `last` and then held
/// still for one poll; answers what they are now (`crewlet plugins check
/// --watch`).
pub fn wait_for_change(dirs: &[PathBuf], last: &Stamps) -> Stamps {
    let mut seen = last.clone();
    loop {
        std::thread::sleep(POLL_EVERY);
        let now = stamp_all(dirs);
        if now == seen && now != *last {
            return now;
        }
        seen = now;
    }
}

pub fn stamp_all(dirs: &[PathBuf]) -> Stamps {
    let mut out = Stamps::new();
    for dir in dirs {
        for file in manifest_files(dir).unwrap_or_default() {
            let Ok(text) = std::fs::read(&file) else {
                continue;
            };
            let component = Manifest::load(&file)
                .ok()
                .and_then(|m| std::fs::metadata(&m.component).ok())
                .and_then(|md| Some((md.len(), md.modified().ok()?)));
            out.insert(
                file,
                Stamp {
                    manifest: text,
                    component,
                },
            );
        }
    }
    out
}

/// The reload loop, until `stop` turns true.
pub async fn watch(
    loaded: Arc<Loaded>,
    consumers: Option<Arc<Consumers>>,
    mut stop: signal::Receiver<bool>,
) {
    let dirs = loaded.dirs.clone();
    let stamp = move || {
        let dirs = dirs.clone();
        tokio::task::spawn_blocking(move || stamp_all(&dirs))
    };
    // From what was loaded, not from the first poll: a change made before
    // it is a change.
    let mut applied = loaded.stamps.clone();
    let mut seen = applied.clone();
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(POLL_EVERY) => {}
        }
        let Ok(now) = stamp().await else { return };
        let settled = now == seen;
        seen = now;
        if !settled || seen == applied {
            continue;
        }
        apply(&loaded, consumers.as_deref(), &applied, &seen).await;
        applied = seen.clone();
    }
}

/// Brings the shelf to what the folders hold now; `before` is what was
/// applied last.
async fn apply(loaded: &Loaded, consumers: Option<&Consumers>, before: &Stamps, now: &Stamps) {
    let (catalogue, invalid) = match super::catalogue(&loaded.dirs, &loaded.config) {
        Ok(read) => read,
        Err(e) => {
            error!(subsystem = "plugins", error = %e, "plugin folders changed but cannot be read; every plugin keeps serving as it was");
            return;
        }
    };
    let installed = &loaded.installed;
    // A manifest that no longer parses keeps its plugin serving.
    let mut still_invalid = Vec::new();
    for e in &invalid {
        let serving = installed
            .all()
            .into_iter()
            .find(|p| p.manifest().file == e.file);
        match serving {
            Some(p) => {
                let name = p.manifest().name.clone();
                error!(subsystem = "plugins", plugin = %name, error = %e, "new manifest refused; the running version keeps serving");
                installed.refuse(&name, refusal(e.to_string()));
            }
            None => still_invalid.push((e.file.display().to_string(), e.to_string())),
        }
    }
    let changed: Vec<&Manifest> = catalogue
        .plugins
        .iter()
        .filter(|m| before.get(&m.file) != now.get(&m.file) || installed.get(&m.name).is_none())
        .collect();
    if changed.iter().any(|m| m.kind == Kind::Module)
        && let Err(e) = ensure_all(&catalogue, loaded.state.as_ref()).await
    {
        error!(subsystem = "plugins", error = %e, "module buckets could not be ensured; changed modules keep their running versions");
    }
    let problems = catalogue.problems();
    for manifest in changed {
        // A name or route another plugin already has: refused, never
        // guessed between.
        let clash = problems.iter().find(|p| match p {
            CatalogueError::DuplicateName { file, other, .. }
            | CatalogueError::DuplicateRoute { file, other, .. } => {
                *file == manifest.file || *other == manifest.file
            }
            _ => false,
        });
        match clash {
            Some(clash) => {
                error!(subsystem = "plugins", plugin = %manifest.name, error = %clash, "new version refused; the running version keeps serving");
                installed.refuse(&manifest.name, refusal(clash.to_string()));
            }
            None => swap_in(loaded, consumers, manifest.clone(), &catalogue).await,
        }
    }
    // Plugins whose manifest is gone.
    let invalid_files: Vec<&PathBuf> = invalid.iter().map(|e| &e.file).collect();
    for p in installed.all() {
        let m = p.manifest();
        if catalogue.get(&m.name).is_none() && !invalid_files.contains(&&m.file) {
            let name = m.name.clone();
            installed.remove(&name);
            if let (Plugin::Module(_), Some(c)) = (&p, consumers) {
                c.stop(&name).await;
            }
            info!(subsystem = "plugins", plugin = %name, "plugin removed: its manifest is gone");
        }
    }
    *loaded.invalid.write().unwrap_or_else(|p| p.into_inner()) = still_invalid;
    *loaded.catalogue.write().unwrap_or_else(|p| p.into_inner()) = catalogue;
}

/// Loads `manifest`'s plugin whole and, when it is sound, puts it in the
/// place of the running version; otherwise records why and keeps the old.
async fn swap_in(
    loaded: &Loaded,
    consumers: Option<&Consumers>,
    manifest: Manifest,
    catalogue: &crewlet_plugins::Catalogue,
) {
    let name = manifest.name.clone();
    let installed: &Installed = &loaded.installed;
    let was = installed.get(&name).map(|p| p.manifest().version.clone());
    let ready = match load_one(
        &loaded.runtime,
        manifest,
        catalogue,
        &loaded.state,
        &loaded.bus,
    ) {
        Ok(p) => prove(p).await,
        Err(e) => Err(e),
    };
    let plugin = match ready {
        Ok(p) => p,
        Err(reason) => {
            match &was {
                Some(_) => {
                    error!(subsystem = "plugins", plugin = %name, error = %reason, "new version refused; the running version keeps serving")
                }
                None => {
                    error!(subsystem = "plugins", plugin = %name, error = %reason, "plugin not loaded")
                }
            }
            installed.refuse(&name, refusal(reason));
            return;
        }
    };
    let version = plugin.manifest().version.clone();
    if let (Plugin::Module(m), Some(c)) = (&plugin, consumers) {
        c.stop(&name).await;
        installed.put(plugin.clone());
        start_module_running(loaded, m);
        c.start(m).await;
    } else {
        installed.put(plugin);
    }
    match was {
        Some(old) => {
            info!(subsystem = "plugins", plugin = %name, from = %old, to = %version, "plugin reloaded")
        }
        None => info!(subsystem = "plugins", plugin = %name, %version, "plugin loaded"),
    }
}

/// Runs what proves a loaded version sound before it serves: a webhook
/// instantiates once; a module runs `init` (within its deadline).
async fn prove(plugin: Plugin) -> Result<Plugin, String> {
    match &plugin {
        Plugin::Webhook(w) => w.instantiate_fresh().await.map_err(|e| e.to_string())?,
        Plugin::Module(m) => m.init().await.map_err(|e| e.to_string())?,
        Plugin::Provider(_) => {}
    }
    Ok(plugin)
}

/// Records a reloaded module as running (its `init` already passed).
fn start_module_running(loaded: &Loaded, module: &Arc<crewlet_plugins::module::ModulePlugin>) {
    loaded
        .module_states
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(module.manifest().name.clone(), ModuleState::Running);
}
