//! The provider host: one model call in a provider plugin.
//!
//! Rules, and why:
//! - The base URL is the manifest's, set by the host on every request, so a
//!   caller cannot point a plugin elsewhere; the plugin's outbound requests
//!   are checked against `allowed_outbound_hosts` anyway
//!   ([`crate::outbound`]).
//! - The credential is passed in the call and lives only in that call's
//!   instance: a provider instance is never reused, so no key outlives the
//!   call that leased it. The plugin's connections to the vendor are kept
//!   between calls ([`crate::pool`]): they carry no key of their own.
//! - The plugin classifies failures and never retries (Architecture §2).

use std::sync::{Arc, Mutex};

use wasmtime::component::Linker;

use crate::bindings::provider::ProviderPre;
use crate::manifest::{Manifest, Permissions};
use crate::outbound::OutboundPolicy;
use crate::pool::Connections;
use crate::runtime::{
    CacheOutcome, CallError, Health, HealthReport, LoadError, Runtime, Sandbox, prepare, settle,
    within,
};

pub use crate::bindings::provider::exports::crewlet::plugin::completions::{
    Completion, Credential, ErrorKind, Message, ProviderError, Request, Role, Tool, ToolCall,
    ToolChoice, Usage,
};

/// A loaded provider plugin.
pub struct ProviderPlugin {
    manifest: Manifest,
    runtime: Arc<Runtime>,
    pre: ProviderPre<Sandbox>,
    health: Health,
    cache: CacheOutcome,
    denied: Arc<Mutex<Vec<String>>>,
    /// Connections to the vendor, kept between calls (not the instance).
    connections: Connections,
}

impl ProviderPlugin {
    /// Loads and links the plugin `manifest` describes.
    pub fn load(runtime: &Arc<Runtime>, manifest: Manifest) -> Result<ProviderPlugin, LoadError> {
        let (component, cache) = runtime.load_component(&manifest)?;
        let mut linker: Linker<Sandbox> = Linker::new(runtime.engine());
        let engine_error = |e: wasmtime::Error| LoadError::Engine(format!("{e:#}"));
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_error)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(engine_error)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(ProviderPre::new)
            .map_err(|e| LoadError::Link {
                component: manifest.component.clone(),
                reason: format!("{e:#}"),
            })?;
        Ok(ProviderPlugin {
            manifest,
            runtime: runtime.clone(),
            pre,
            health: Health::default(),
            cache,
            denied: Arc::default(),
            connections: Connections::new(),
        })
    }

    /// The plugin's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether the component came from the artifact cache.
    pub fn cache_outcome(&self) -> &CacheOutcome {
        &self.cache
    }

    /// The plugin's health.
    pub fn health(&self) -> HealthReport {
        self.health.report()
    }

    /// Every origin this plugin was refused, oldest first.
    pub fn denied_origins(&self) -> Vec<String> {
        self.denied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Performs one model call. `Ok(Err(_))` is a classified vendor
    /// failure; `Err(_)` is a fault of the plugin.
    pub async fn complete(
        &self,
        mut req: Request,
    ) -> Result<Result<Completion, ProviderError>, CallError> {
        let Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
        } = &self.manifest.permissions
        else {
            unreachable!("a ProviderPlugin is only loaded from a provider manifest");
        };
        req.base_url = base_url.clone();
        let policy = OutboundPolicy::new(
            &self.manifest.name,
            &self.manifest.file.display().to_string(),
            allowed_outbound_hosts.clone(),
            self.denied.clone(),
        )
        .with_connections(self.connections.clone());
        let mut store = self
            .runtime
            .new_store(&self.manifest, policy)
            .map_err(|e| CallError::Instantiate {
                plugin: self.manifest.name.clone(),
                reason: e.to_string(),
            })?;
        let deadline = self.manifest.limits.deadline;
        prepare(&mut store, deadline);
        let name = &self.manifest.name;
        let outcome = within(deadline, async {
            let bindings = self.pre.instantiate_async(&mut store).await?;
            bindings
                .crewlet_plugin_completions()
                .call_complete(&mut store, &req)
                .await
        })
        .await;
        settle(name, &self.health, deadline, &mut store, outcome)
    }
}
