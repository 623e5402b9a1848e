//! The webhook host: verify and parse deliveries in a webhook plugin.
//!
//! Rules, and why:
//! - The host passes the secrets the manifest declared (and only those) and
//!   the current time; the plugin has no other source of either.
//! - `verify` and `parse` are separate calls so a delivery that fails
//!   verification is never parsed.
//! - Secrets the manifest did not declare are removed from a request before
//!   the plugin sees it.
//! - Instances are reused only while their calls succeed; see [`crate::runtime`].
//! - The world's one import, `crypto`, is pure: a MAC computed natively,
//!   because SHA-256 in a guest costs several times what the host's SHA
//!   instructions do, on every delivery's whole body.

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::bindings::webhook::crewlet::plugin::crypto;
use crate::bindings::webhook::{Webhook, WebhookPre};
use crate::manifest::{Manifest, Permissions};
use crate::outbound::OutboundPolicy;
use crate::runtime::{
    CacheOutcome, CallError, Health, HealthReport, IdleInstances, LoadError, Runtime, Sandbox,
    prepare, settle, settle_instantiate, within,
};

pub use crate::bindings::webhook::crewlet::plugin::types::Header;
pub use crate::bindings::webhook::exports::crewlet::plugin::inbound::{
    Addressed, Delivery, ParseError, Parsed, Reply, Request, Secret, VerifyError,
};

/// The `crypto` import: a pure function of its arguments, so any plugin
/// may have it; computed by [`crate::crypto`].
impl crypto::Host for Sandbox {
    fn hmac_sha256(&mut self, key: Vec<u8>, data: Vec<u8>) -> Vec<u8> {
        crate::crypto::hmac_sha256(&key, &data).to_vec()
    }
}

/// Idle instances kept per webhook plugin.
const KEEP_IDLE: usize = 4;

/// A loaded webhook plugin.
pub struct WebhookPlugin {
    manifest: Manifest,
    runtime: Arc<Runtime>,
    pre: WebhookPre<Sandbox>,
    idle: IdleInstances<Webhook>,
    health: Health,
    cache: CacheOutcome,
}

impl WebhookPlugin {
    /// Loads and links the plugin `manifest` describes.
    pub fn load(runtime: &Arc<Runtime>, manifest: Manifest) -> Result<WebhookPlugin, LoadError> {
        let (component, cache) = runtime.load_component(&manifest)?;
        let mut linker: Linker<Sandbox> = Linker::new(runtime.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        crypto::add_to_linker::<Sandbox, HasSelf<Sandbox>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(WebhookPre::new)
            .map_err(|e| LoadError::Link {
                component: manifest.component.clone(),
                reason: format!("{e:#}"),
            })?;
        Ok(WebhookPlugin {
            manifest,
            runtime: runtime.clone(),
            pre,
            idle: IdleInstances::new(KEEP_IDLE),
            health: Health::default(),
            cache,
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

    /// The secret names the manifest declares.
    pub fn secret_names(&self) -> &[String] {
        match &self.manifest.permissions {
            Permissions::Webhook { secrets, .. } => secrets,
            _ => &[],
        }
    }

    /// Drops every idle instance, so the next call instantiates afresh.
    pub fn drop_idle(&self) {
        self.idle.clear();
    }

    /// The request with only the secrets the manifest declares: a plugin
    /// never sees a secret it did not ask for, whatever the caller passes.
    fn declared_only<'a>(&self, req: &'a Request) -> std::borrow::Cow<'a, Request> {
        let declared = self.secret_names();
        if req.secrets.iter().all(|s| declared.contains(&s.name)) {
            return std::borrow::Cow::Borrowed(req);
        }
        let mut filtered = req.clone();
        filtered.secrets.retain(|s| declared.contains(&s.name));
        std::borrow::Cow::Owned(filtered)
    }

    async fn instance(&self) -> Result<(Store<Sandbox>, Webhook), CallError> {
        if let Some(slot) = self.idle.take() {
            return Ok(slot);
        }
        let instantiate_error = |e: String| CallError::Instantiate {
            plugin: self.manifest.name.clone(),
            reason: e,
        };
        let mut store = self
            .runtime
            .new_store(&self.manifest, OutboundPolicy::deny_all())
            .map_err(|e| instantiate_error(e.to_string()))?;
        let deadline = self.manifest.limits.deadline;
        let outcome = within(deadline, self.pre.instantiate_async(&mut store)).await;
        let bindings = settle_instantiate(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut store,
            outcome,
        )?;
        Ok((store, bindings))
    }

    /// Checks a delivery's signature or token. `Ok(Err(_))` is a refusal
    /// the plugin decided; `Err(_)` is a fault of the plugin.
    pub async fn verify(&self, req: &Request) -> Result<Result<(), VerifyError>, CallError> {
        let req = self.declared_only(req);
        let req = req.as_ref();
        let (mut store, bindings) = self.instance().await?;
        let deadline = self.manifest.limits.deadline;
        prepare(&mut store, deadline);
        let outcome = within(
            deadline,
            bindings
                .crewlet_plugin_inbound()
                .call_verify(&mut store, req),
        )
        .await;
        let result = settle(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut store,
            outcome,
        )?;
        self.idle.give_back((store, bindings));
        Ok(result)
    }

    /// Parses a verified delivery.
    pub async fn parse(&self, req: &Request) -> Result<Result<Parsed, ParseError>, CallError> {
        let req = self.declared_only(req);
        let req = req.as_ref();
        let (mut store, bindings) = self.instance().await?;
        let deadline = self.manifest.limits.deadline;
        prepare(&mut store, deadline);
        let outcome = within(
            deadline,
            bindings
                .crewlet_plugin_inbound()
                .call_parse(&mut store, req),
        )
        .await;
        let result = settle(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut store,
            outcome,
        )?;
        self.idle.give_back((store, bindings));
        Ok(result)
    }

    /// Instantiates a fresh instance from the pool and drops it (for the
    /// benchmark: the cost of instantiation alone).
    pub async fn instantiate_fresh(&self) -> Result<(), CallError> {
        self.idle.clear();
        self.instance().await.map(drop)
    }

    /// Instantiates a fresh instance and parses once, never reusing it: the
    /// cost of a cold call from the pool (for the benchmark).
    pub async fn parse_fresh(
        &self,
        req: &Request,
    ) -> Result<Result<Parsed, ParseError>, CallError> {
        self.idle.clear();
        let (mut store, bindings) = self.instance().await?;
        let deadline = self.manifest.limits.deadline;
        prepare(&mut store, deadline);
        let outcome = within(
            deadline,
            bindings
                .crewlet_plugin_inbound()
                .call_parse(&mut store, req),
        )
        .await;
        settle(
            &self.manifest.name,
            &self.health,
            deadline,
            &mut store,
            outcome,
        )
    }
}

impl Request {
    /// A request for `route` with lower-cased header names.
    pub fn new(
        route: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        secrets: &[(&str, &[u8])],
        now_unix_seconds: i64,
    ) -> Request {
        Request {
            route: route.to_string(),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.to_ascii_lowercase(),
                    value: v.to_string(),
                })
                .collect(),
            body: body.to_vec(),
            secrets: secrets
                .iter()
                .map(|(n, v)| Secret {
                    name: n.to_string(),
                    value: v.to_vec(),
                })
                .collect(),
            now_unix_seconds,
        }
    }
}
