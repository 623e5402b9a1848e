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
//! - Embeddings are the world's second export (WIT 0.4.2). A component of
//!   0.4.1 or 0.4.0 has none: it loads and completes as before, and every
//!   embedding it is asked for answers [`EmbedError::Unsupported`] without
//!   running it. So the exports are looked up one by one (semver-matched,
//!   as wasmtime matches `@0.4.1` to `@0.4.2`), not as the whole world.

use std::sync::{Arc, Mutex};

use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use wasmtime_wasi_http::WasiHttpCtx;

use crate::HealthReport;
use crate::bindings::module::crewlet::plugin::log;
use crate::bindings::provider::exports::crewlet::plugin::{completions, embeddings};
use crate::manifest::{Granted, Manifest, Origin, Permissions};
use crate::outbound::OutboundPolicy;
use crate::pool::Connections;
use crate::runtime::{CacheOutcome, CallError, LoadError, Runtime};
use crate::sandbox::{ProviderCtx, Sandbox};
use crate::scrub::Scrub;
use crate::shell::{Shell, World};

pub use crate::bindings::provider::exports::crewlet::plugin::completions::{
    Completion, Credential, ErrorKind, Message, ProviderError, Request, Role, Tool, ToolCall,
    ToolChoice, Usage,
};
pub use crate::bindings::provider::exports::crewlet::plugin::embeddings::{
    EmbedError, EmbedRequest, Embedded,
};

/// The WIT version that gave providers `embeddings`.
const EMBEDDINGS_SINCE: &str = "crewlet:plugin@0.4.2";

/// A component linked for calls: its `completions` export, and its
/// `embeddings` export when it has one.
#[derive(Clone)]
pub(crate) struct Exports {
    pre: InstancePre<Sandbox<ProviderCtx>>,
    completions: completions::GuestIndices,
    embeddings: Option<embeddings::GuestIndices>,
    /// The WIT package its `completions` export came from, e.g.
    /// `crewlet:plugin@0.4.1` (named when it cannot embed).
    package: String,
}

/// The provider world: outbound HTTP (`wasi:http`, checked by the
/// outbound policy) and `log`; its exports looked up one by one.
pub(crate) struct ProviderWorld;

impl World for ProviderWorld {
    type Ctx = ProviderCtx;
    type Pre = Exports;

    fn link(linker: &mut Linker<Sandbox<ProviderCtx>>) -> wasmtime::Result<()> {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
        log::add_to_linker::<Sandbox<ProviderCtx>, HasSelf<Sandbox<ProviderCtx>>>(linker, |s| s)
    }

    fn pre(
        pre: InstancePre<Sandbox<ProviderCtx>>,
        component: &Component,
        engine: &wasmtime::Engine,
    ) -> wasmtime::Result<Exports> {
        let package = component
            .component_type()
            .exports(engine)
            .find_map(|(name, _)| {
                let version = name.strip_prefix("crewlet:plugin/completions@")?;
                Some(format!("crewlet:plugin@{version}"))
            })
            .unwrap_or_else(|| "crewlet:plugin@?".to_string());
        Ok(Exports {
            completions: completions::GuestIndices::new(&pre)?,
            embeddings: embeddings::GuestIndices::new(&pre).ok(),
            package,
            pre,
        })
    }
}

/// What one call asks of the guest.
enum Ask {
    Complete(Request),
    Embed(EmbedRequest),
}

/// What the guest answered.
enum Answer {
    Completion(Result<Completion, ProviderError>),
    Embedded(Result<Embedded, EmbedError>),
}

/// A loaded provider plugin.
pub struct ProviderPlugin {
    shell: Shell<ProviderWorld>,
    denied: Arc<Mutex<Vec<String>>>,
    /// What the operator's grant did, for the refusals that name it.
    granted: Arc<Granted>,
    /// Connections to the vendor, kept between calls (not the instance).
    connections: Connections,
}

impl ProviderPlugin {
    /// Loads and links the plugin `manifest` describes.
    pub fn load(runtime: &Arc<Runtime>, manifest: Manifest) -> Result<ProviderPlugin, LoadError> {
        let shell = Shell::<ProviderWorld>::load(runtime, manifest)?;
        Ok(ProviderPlugin {
            granted: Arc::new(shell.manifest.granted.clone()),
            shell,
            denied: Arc::default(),
            connections: Connections::new(),
        })
    }

    /// The plugin's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.shell.manifest
    }

    /// Whether the component came from the artifact cache.
    pub fn cache_outcome(&self) -> &CacheOutcome {
        &self.shell.cache
    }

    /// The plugin's health.
    pub fn health(&self) -> HealthReport {
        self.shell.health()
    }

    /// The plugin's voice in the log ([`crate::voice`]).
    pub(crate) fn speaker(&self) -> Arc<crate::voice::Speaker> {
        self.shell.guard.speaker()
    }

    /// Every origin this plugin was refused, oldest first.
    pub fn denied_origins(&self) -> Vec<String> {
        self.denied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the component exports `embeddings` (WIT 0.4.2 on); one that
    /// does may still answer [`EmbedError::Unsupported`].
    pub fn embeds(&self) -> bool {
        self.shell.pre.embeddings.is_some()
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
        req.base_url = self.base_url().to_string();
        let key = req.credential.api_key.clone();
        match self.invoke(&key, Ask::Complete(req)).await? {
            (Answer::Completion(answer), said) => Ok((answer, said)),
            (Answer::Embedded(_), _) => unreachable!("a completion is answered as one"),
        }
    }

    /// Embeds one batch of texts. `Ok(Err(_))` is the plugin's answer (a
    /// classified vendor failure, or [`EmbedError::Unsupported`] — also
    /// what a component older than 0.4.2 answers, without running);
    /// `Err(_)` is a fault of the plugin.
    pub async fn embed(
        &self,
        req: EmbedRequest,
    ) -> Result<Result<Embedded, EmbedError>, CallError> {
        self.embed_said(req).await.map(|(answer, _)| answer)
    }

    /// [`ProviderPlugin::embed`], with what the plugin wrote to stderr.
    pub(crate) async fn embed_said(
        &self,
        mut req: EmbedRequest,
    ) -> Result<(Result<Embedded, EmbedError>, String), CallError> {
        if self.shell.pre.embeddings.is_none() {
            return Ok((
                Err(EmbedError::Unsupported(format!(
                    "this provider does not embed: plugin `{}` targets {}, and embeddings came with {EMBEDDINGS_SINCE}; rebuild it against this release's wit/, or name another provider's model in `[memory] embedding`",
                    self.shell.manifest.name, self.shell.pre.package
                ))),
                String::new(),
            ));
        }
        req.base_url = self.base_url().to_string();
        let key = req.credential.api_key.clone();
        match self.invoke(&key, Ask::Embed(req)).await? {
            (Answer::Embedded(answer), said) => Ok((answer, said)),
            (Answer::Completion(_), _) => unreachable!("an embedding is answered as one"),
        }
    }

    /// The manifest's base URL: set on every request by the host.
    fn base_url(&self) -> &str {
        let Permissions::Provider { base_url, .. } = &self.shell.manifest.permissions else {
            unreachable!("a ProviderPlugin is only loaded from a provider manifest");
        };
        base_url
    }

    /// Runs one export on a fresh instance; a vendor failure's message
    /// names where the call went (and the host's refusal, when it refused).
    async fn invoke(&self, key: &str, ask: Ask) -> Result<(Answer, String), CallError> {
        let Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } = &self.shell.manifest.permissions
        else {
            unreachable!("a ProviderPlugin is only loaded from a provider manifest");
        };
        // A failure names where it went: the one thing the plugin's
        // redacted message never says, and the first an operator asks.
        let tried = Origin::parse(base_url)
            .map(|o| o.to_string())
            .unwrap_or_else(|_| base_url.clone());
        let policy = OutboundPolicy::new(
            &self.shell.manifest.name,
            &self.shell.manifest.file,
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
        let store = self.shell.store(world)?;
        // A provider's fault text may quote what it was given: the key.
        let scrub = Scrub::of(vec![key.as_bytes()]);
        let exports = self.shell.pre.clone();
        let deadline = self.shell.manifest.limits.deadline;
        let (_store, result) = self
            .shell
            .guard
            .call(store, deadline, &scrub, move |mut store| async move {
                let r = async {
                    let instance = exports.pre.instantiate_async(&mut store).await?;
                    match ask {
                        Ask::Complete(req) => exports
                            .completions
                            .load(&mut store, &instance)?
                            .call_complete(&mut store, &req)
                            .await
                            .map(Answer::Completion),
                        Ask::Embed(req) => {
                            let Some(indices) = &exports.embeddings else {
                                wasmtime::bail!("the component exports no embeddings");
                            };
                            indices
                                .load(&mut store, &instance)?
                                .call_embed(&mut store, &req)
                                .await
                                .map(Answer::Embedded)
                        }
                    }
                }
                .await;
                let said = store.data().said();
                (store, r.map(|answer| (answer, said)))
            })
            .await?;
        let (answer, said) = result;
        let refusal = refused.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The host knows why it refused a request; the guest only that it was.
        let place = |mut e: ProviderError| {
            e.message = match &refusal {
                Some(why) if e.kind == ErrorKind::RequestDenied => {
                    format!("{why} (calling {tried})")
                }
                _ => format!("{} (calling {tried})", e.message),
            };
            e
        };
        let answer = match answer {
            Answer::Completion(a) => Answer::Completion(a.map_err(place)),
            Answer::Embedded(a) => Answer::Embedded(a.map_err(|e| match e {
                EmbedError::Failed(e) => EmbedError::Failed(place(e)),
                unsupported => unsupported,
            })),
        };
        Ok((answer, said))
    }
}
