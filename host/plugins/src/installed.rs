//! The plugins a node serves right now, by name.
//!
//! Rule: a caller takes an `Arc` of one plugin for one call and lets it go
//! after. A reload replaces the entry whole, so a call in flight finishes
//! on the instance it started on and the next call meets the new version;
//! nothing is ever patched in place. A version that could not be loaded
//! never reaches the shelf: the old one keeps serving and the refusal is
//! kept beside it (what `GET /plugins` and the log say), until a later
//! version of that plugin loads or it is removed.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::breaker::HealthReport;
use crate::manifest::{Kind, Manifest, Permission, Permissions};
use crate::module::ModulePlugin;
use crate::provider::ProviderPlugin;
use crate::webhook::WebhookPlugin;

/// One loaded plugin of any world.
#[derive(Clone)]
pub enum Plugin {
    Webhook(Arc<WebhookPlugin>),
    Provider(Arc<ProviderPlugin>),
    Module(Arc<ModulePlugin>),
}

impl Plugin {
    pub fn manifest(&self) -> &Manifest {
        match self {
            Plugin::Webhook(p) => p.manifest(),
            Plugin::Provider(p) => p.manifest(),
            Plugin::Module(p) => p.manifest(),
        }
    }

    pub fn kind(&self) -> Kind {
        self.manifest().kind
    }

    /// How its calls have gone (breaker, faults), as `GET /plugins` shows.
    pub fn health(&self) -> HealthReport {
        match self {
            Plugin::Webhook(p) => p.health(),
            Plugin::Provider(p) => p.health(),
            Plugin::Module(p) => p.health(),
        }
    }
}

/// Why the newest version of a plugin is not the one serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What was wrong with it, as an operator fixes it.
    pub reason: String,
    /// When it was refused (ms since the Unix epoch).
    pub at_ms: u64,
}

#[derive(Default)]
struct Shelf {
    plugins: BTreeMap<String, Plugin>,
    refused: BTreeMap<String, Refusal>,
    /// How many times each plugin was replaced since the node started.
    reloads: BTreeMap<String, u64>,
}

/// The node's plugins, swapped one by one as their files change.
#[derive(Default)]
pub struct Installed {
    shelf: RwLock<Shelf>,
}

impl Installed {
    /// A shelf holding `plugins` (a later one of the same name wins).
    pub fn new(plugins: impl IntoIterator<Item = Plugin>) -> Arc<Installed> {
        let installed = Installed::default();
        for p in plugins {
            installed.put(p);
        }
        Arc::new(installed)
    }

    /// A shelf of webhook plugins only (for an edge under test).
    pub fn webhooks_only(webhooks: Vec<Arc<WebhookPlugin>>) -> Arc<Installed> {
        Installed::new(webhooks.into_iter().map(Plugin::Webhook))
    }

    /// A shelf of provider plugins only (for a model layer under test).
    pub fn providers_only(providers: Vec<Arc<ProviderPlugin>>) -> Arc<Installed> {
        Installed::new(providers.into_iter().map(Plugin::Provider))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Shelf> {
        self.shelf.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Shelf> {
        self.shelf.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Installs `plugin`, replacing the one of its name; answers the one it
    /// replaced. A refusal on record for the name is cleared.
    pub fn put(&self, plugin: Plugin) -> Option<Plugin> {
        let name = plugin.manifest().name.clone();
        let mut shelf = self.write();
        shelf.refused.remove(&name);
        let old = shelf.plugins.insert(name.clone(), plugin);
        if old.is_some() {
            *shelf.reloads.entry(name).or_default() += 1;
        }
        old
    }

    /// Takes `name` off the shelf (its manifest is gone).
    pub fn remove(&self, name: &str) -> Option<Plugin> {
        let mut shelf = self.write();
        shelf.refused.remove(name);
        shelf.plugins.remove(name)
    }

    /// Records that the newest version of `name` was refused; whatever
    /// serves under that name keeps serving.
    pub fn refuse(&self, name: &str, refusal: Refusal) {
        self.write().refused.insert(name.to_string(), refusal);
    }

    /// The refusal on record for `name`, if its newest version was refused.
    pub fn refusal(&self, name: &str) -> Option<Refusal> {
        self.read().refused.get(name).cloned()
    }

    /// Every refusal on record, by plugin name.
    pub fn refusals(&self) -> BTreeMap<String, Refusal> {
        self.read().refused.clone()
    }

    /// How many times `name` was replaced since start.
    pub fn reloads(&self, name: &str) -> u64 {
        self.read().reloads.get(name).copied().unwrap_or(0)
    }

    /// The plugin serving under `name`.
    pub fn get(&self, name: &str) -> Option<Plugin> {
        self.read().plugins.get(name).cloned()
    }

    /// Every plugin, by name.
    pub fn all(&self) -> Vec<Plugin> {
        self.read().plugins.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().plugins.len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().plugins.is_empty()
    }

    /// The webhook plugin whose manifest serves `route`.
    pub fn webhook_serving(&self, route: &str) -> Option<Arc<WebhookPlugin>> {
        self.read().plugins.values().find_map(|p| match p {
            Plugin::Webhook(w) => match &w.manifest().permissions {
                Permissions::Webhook { routes, .. } if routes.iter().any(|r| r == route) => {
                    Some(w.clone())
                }
                _ => None,
            },
            _ => None,
        })
    }

    /// The operator's key that denies `route` to the webhook plugin whose
    /// manifest declares it (`plugins.grants.NAME.denied_routes[i]`), if any.
    pub fn webhook_route_denied(&self, route: &str) -> Option<String> {
        let denied = Permission::Route(route.to_string());
        self.read().plugins.values().find_map(|p| match p {
            Plugin::Webhook(w) => w.manifest().granted.denied_by(&denied).map(str::to_owned),
            _ => None,
        })
    }

    /// The provider plugin named `name`.
    pub fn provider(&self, name: &str) -> Option<Arc<ProviderPlugin>> {
        match self.read().plugins.get(name) {
            Some(Plugin::Provider(p)) => Some(p.clone()),
            _ => None,
        }
    }

    /// The module named `name`.
    pub fn module(&self, name: &str) -> Option<Arc<ModulePlugin>> {
        match self.read().plugins.get(name) {
            Some(Plugin::Module(m)) => Some(m.clone()),
            _ => None,
        }
    }

    pub fn webhooks(&self) -> Vec<Arc<WebhookPlugin>> {
        self.each(|p| match p {
            Plugin::Webhook(w) => Some(w.clone()),
            _ => None,
        })
    }

    pub fn providers(&self) -> Vec<Arc<ProviderPlugin>> {
        self.each(|p| match p {
            Plugin::Provider(w) => Some(w.clone()),
            _ => None,
        })
    }

    pub fn modules(&self) -> Vec<Arc<ModulePlugin>> {
        self.each(|p| match p {
            Plugin::Module(w) => Some(w.clone()),
            _ => None,
        })
    }

    fn each<T>(&self, pick: impl Fn(&Plugin) -> Option<T>) -> Vec<T> {
        self.read().plugins.values().filter_map(pick).collect()
    }
}
