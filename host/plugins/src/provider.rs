//! The provider host: one model call in a provider plugin.
//!
//! Rules, and why:
//! - The base URL is the manifest's, set by the host on every request, so a
//!   caller cannot point a plugin elsewhere; the plugin's outbound requests
//!   are checked against its effective `allowed_outbound_hosts` anyway
//!   ([`crate::outbound`]). A call refused there fails `request-denied`
//!   with the host's reason: the manifest that does not declare the
//!   origin, or the operator's key that denies it.
//! - The credential is passed in the call and lives only in that call's
//!   instance: a provider instance is never reused, so no key outlives the
//!   call that leased it. The plugin's connections to the vendor are kept
//!   between calls ([`crate::pool`]): they carry no key of their own.
//! - The plugin classifies failures and never retries (Architecture §2).

use std::sync::{Arc, Mutex};

use wasmtime::component::{HasSelf, Linker};

use wasmtime_wasi_http::WasiHttpCtx;

use crate::HealthReport;
use crate::bindings::module::crewlet::plugin::log;
use crate::bindings::provider::ProviderPre;
use crate::call::Guard;
use crate::manifest::{Granted, Manifest, Origin, Permissions};
use crate::outbound::OutboundPolicy;
use crate::pool::Connections;
use crate::runtime::{CacheOutcome, CallError, LoadError, Runtime};
use crate::sandbox::{ProviderCtx, Sandbox};
use crate::scrub::Scrub;

pub use crate::bindings::provider::exports::crewlet::plugin::completions::{
    Completion, Credential, ErrorKind, Message, ProviderError, Request, Role, Tool, ToolCall,
    ToolChoice, Usage,
};

/// A loaded provider plugin.
pub struct ProviderPlugin {
    manifest: Manifest,
    runtime: Arc<Runtime>,
    pre: ProviderPre<Sandbox<ProviderCtx>>,
    guard: Guard,
    cache: CacheOutcome,
    denied: Arc<Mutex<Vec<String>>>,
    /// What the operator's grant did, for the refusals that name it.
    granted: Arc<Granted>,
    /// Connections to the vendor, kept between calls (not the instance).
    connections: Connections,
}

impl ProviderPlugin {
    /// Loads and links the plugin `manifest` describes.
    pub fn load(runtime: &Arc<Runtime>, manifest: Manifest) -> Result<ProviderPlugin, LoadError> {
        let (component, cache) = runtime.load_component(&manifest)?;
        let mut linker: Linker<Sandbox<ProviderCtx>> = Linker::new(runtime.engine());
        let engine_error = |e: wasmtime::Error| LoadError::Engine(format!("{e:#}"));
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_error)?;
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(engine_error)?;
        log::add_to_linker::<Sandbox<ProviderCtx>, HasSelf<Sandbox<ProviderCtx>>>(
            &mut linker,
            |s| s,
        )
        .map_err(engine_error)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(ProviderPre::new)
            .map_err(|e| LoadError::Link {
                component: manifest.component.clone(),
                reason: format!("{e:#}"),
            })?;
        Ok(ProviderPlugin {
            guard: runtime.guard(&manifest),
            granted: Arc::new(manifest.granted.clone()),
            manifest,
            runtime: runtime.clone(),
            pre,
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
        self.guard.health().report()
    }

    /// The plugin's voice in the log ([`crate::voice`]).
    pub(crate) fn speaker(&self) -> Arc<crate::voice::Speaker> {
        self.guard.speaker()
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
        req: Request,
    ) -> Result<Result<Completion, ProviderError>, CallError> {
        self.call(req).await.map(|(answer, _)| answer)
    }

    /// [`ProviderPlugin::complete`], with what the plugin wrote to stderr
    /// (scrubbed of the call's credential, bounded).
    pub(crate) async fn call(
        &self,
        mut req: Request,
    ) -> Result<(Result<Completion, ProviderError>, String), CallError> {
        let Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } = &self.manifest.permissions
        else {
            unreachable!("a ProviderPlugin is only loaded from a provider manifest");
        };
        req.base_url = base_url.clone();
        // A failure names where it went: the one thing the plugin's
        // redacted message never says, and the first an operator asks.
        let tried = Origin::parse(base_url)
            .map(|o| o.to_string())
            .unwrap_or_else(|_| base_url.clone());
        let policy = OutboundPolicy::new(
            &self.manifest.name,
            &self.manifest.file,
            allowed_outbound_hosts.clone(),
            self.denied.clone(),
        )
        .with_grant(self.granted.clone())
        .with_connections(self.connections.clone());
        let refused = policy.refused();
        let world = ProviderCtx {
            http: WasiHttpCtx::new(),
            outbound: policy,
        };
        let store = self
            .runtime
            .new_store(&self.manifest, self.guard.speaker(), world)
            .map_err(|e| CallError::Instantiate {
                plugin: self.manifest.name.clone(),
                reason: e.to_string(),
            })?;
        // A provider's fault text may quote what it was given: the key.
        let scrub = Scrub::of(req.credentials_for_scrub());
        let pre = self.pre.clone();
        let deadline = self.manifest.limits.deadline;
        let (_store, result) = self
            .guard
            .call(store, deadline, &scrub, move |mut store| async move {
                let r = async {
                    let bindings = pre.instantiate_async(&mut store).await?;
                    bindings
                        .crewlet_plugin_completions()
                        .call_complete(&mut store, &req)
                        .await
                }
                .await;
                let said = store.data().said();
                (store, r.map(|answer| (answer, said)))
            })
            .await?;
        let (answer, said) = result;
        let refusal = refused.lock().unwrap_or_else(|p| p.into_inner()).take();
        let answer = answer.map_err(|mut e| {
            // The host knows why it refused a request; the guest only
            // that it was.
            e.message = match refusal {
                Some(why) if e.kind == ErrorKind::RequestDenied => {
                    format!("{why} (calling {tried})")
                }
                _ => format!("{} (calling {tried})", e.message),
            };
            e
        });
        Ok((answer, said))
    }
}

impl Request {
    /// The secret material this request carries, for scrubbing.
    fn credentials_for_scrub(&self) -> Vec<&[u8]> {
        vec![self.credential.api_key.as_bytes()]
    }
}
