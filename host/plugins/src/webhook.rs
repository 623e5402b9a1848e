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
//! - The world's `crypto` import is pure: a MAC computed natively,
//!   because SHA-256 in a guest costs several times what the host's SHA
//!   instructions do, on every delivery's whole body. Its `log` import
//!   writes to the node's log ([`crate::voice`]).
//! - Whether a delivery is owed a reply, and where, is the plugin's to say
//!   (`owed`); the host bounds it with the rest of the delivery.
//! - A 0.4.0 component still loads ([`v0_4_0`]): its deliveries name no
//!   sender and wake as every delivery did before 0.4.1.

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

use crate::bindings::module::crewlet::plugin::log;
use crate::bindings::webhook::crewlet::plugin::crypto;
use crate::bindings::webhook::{Webhook, WebhookPre};
use crate::call::IdleInstances;
use crate::manifest::{Manifest, Permissions};
use crate::runtime::{CacheOutcome, CallError, LoadError, Runtime};
use crate::sandbox::Sandbox;
use crate::scrub::Scrub;
use crate::shell::{Shell, World};
use crate::{HealthReport, scrub};

mod v0_4_0;

pub use crate::bindings::webhook::crewlet::plugin::types::Header;
pub use crate::bindings::webhook::exports::crewlet::plugin::inbound::{
    Addressed, Delivery, ParseError, Parsed, Reply, ReplyTo, Request, Secret, VerifyError, Wakes,
};

/// A component linked for calls, by the WIT version it speaks.
#[derive(Clone)]
pub(crate) enum Pre {
    Current(WebhookPre<Sandbox<()>>),
    V0_4_0(v0_4_0::WebhookPre<Sandbox<()>>),
}

/// One instance's bindings, by the WIT version it speaks.
pub(crate) enum Bindings {
    Current(Webhook),
    V0_4_0(v0_4_0::Webhook),
}

impl Pre {
    async fn instantiate(&self, store: &mut WebhookStore) -> wasmtime::Result<Bindings> {
        Ok(match self {
            Pre::Current(pre) => Bindings::Current(pre.instantiate_async(store).await?),
            Pre::V0_4_0(pre) => Bindings::V0_4_0(pre.instantiate_async(store).await?),
        })
    }
}

impl Bindings {
    pub(crate) async fn verify(
        &self,
        store: &mut WebhookStore,
        req: &Request,
    ) -> wasmtime::Result<Result<(), VerifyError>> {
        match self {
            Bindings::Current(b) => b.crewlet_plugin_inbound().call_verify(store, req).await,
            Bindings::V0_4_0(b) => Ok(b
                .crewlet_plugin_inbound()
                .call_verify(store, &v0_4_0::request(req))
                .await?
                .map_err(v0_4_0::verify_error)),
        }
    }

    pub(crate) async fn parse(
        &self,
        store: &mut WebhookStore,
        req: &Request,
    ) -> wasmtime::Result<Result<Parsed, ParseError>> {
        match self {
            Bindings::Current(b) => b.crewlet_plugin_inbound().call_parse(store, req).await,
            Bindings::V0_4_0(b) => Ok(v0_4_0::parsed(
                b.crewlet_plugin_inbound()
                    .call_parse(store, &v0_4_0::request(req))
                    .await?,
            )),
        }
    }
}

/// A webhook store's world part: nothing beyond WASI, `crypto` and `log`.
type WebhookStore = Store<Sandbox<()>>;

/// The webhook world: `crypto` and `log` beyond WASI; a 0.4.0 component
/// linked as it speaks.
pub(crate) struct WebhookWorld;

impl World for WebhookWorld {
    type Ctx = ();
    type Pre = Pre;

    fn link(linker: &mut Linker<Sandbox<()>>) -> wasmtime::Result<()> {
        crypto::add_to_linker::<Sandbox<()>, HasSelf<Sandbox<()>>>(linker, |s| s)?;
        log::add_to_linker::<Sandbox<()>, HasSelf<Sandbox<()>>>(linker, |s| s)
    }

    fn pre(
        pre: InstancePre<Sandbox<()>>,
        component: &Component,
        engine: &wasmtime::Engine,
    ) -> wasmtime::Result<Pre> {
        let speaks_0_4_0 = component
            .component_type()
            .exports(engine)
            .any(|(name, _)| name == v0_4_0::EXPORT);
        Ok(if speaks_0_4_0 {
            Pre::V0_4_0(v0_4_0::WebhookPre::new(pre)?)
        } else {
            Pre::Current(WebhookPre::new(pre)?)
        })
    }
}

/// The `crypto` import: a pure function of its arguments, so any plugin
/// may have it; computed by [`crate::crypto`].
impl crypto::Host for Sandbox<()> {
    async fn hmac_sha256(&mut self, key: Vec<u8>, data: Vec<u8>) -> Vec<u8> {
        crate::crypto::hmac_sha256(&key, &data).to_vec()
    }
}

/// Idle instances kept per webhook plugin.
const KEEP_IDLE: usize = 4;

/// The most deliveries one request may carry; past it the request is
/// refused (400) and nothing is published.
pub const MAX_DELIVERIES: usize = 100;
/// The most bytes one delivery may carry (its text, payload and fields);
/// past it the request is refused (413) and nothing is published. The
/// stream's message limit is 1 MiB and a delivery is stored with its
/// envelope.
pub const MAX_DELIVERY_BYTES: usize = 512 * 1024;
/// The longest delivery id: it becomes part of a claim key and a message id.
pub const MAX_DELIVERY_ID: usize = 256;

/// Why a parsed request is refused before anything of it is published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unbounded {
    #[error(
        "the request carries {count} deliveries; at most {MAX_DELIVERIES} are accepted per request"
    )]
    TooMany { count: usize },
    #[error(
        "delivery {index} is {bytes} bytes; at most {MAX_DELIVERY_BYTES} are accepted per delivery"
    )]
    TooLarge { index: usize, bytes: usize },
    #[error("delivery {index} has an empty delivery id; the source must name each delivery")]
    EmptyId { index: usize },
    #[error(
        "delivery {index} has a delivery id of {bytes} bytes; at most {MAX_DELIVERY_ID} are accepted"
    )]
    LongId { index: usize, bytes: usize },
    #[error(
        "delivery {index} has a delivery id with characters outside A-Z a-z 0-9 - _ . : @ + = /"
    )]
    BadId { index: usize },
}

/// Checks what `parse` returned against the host's bounds: how many
/// deliveries, how large each, and that every delivery id is non-empty,
/// short and of a safe charset.
pub fn check_bounds(parsed: &Parsed) -> Result<(), Unbounded> {
    if parsed.deliveries.len() > MAX_DELIVERIES {
        return Err(Unbounded::TooMany {
            count: parsed.deliveries.len(),
        });
    }
    for (index, d) in parsed.deliveries.iter().enumerate() {
        let id = &d.delivery_id;
        if id.is_empty() {
            return Err(Unbounded::EmptyId { index });
        }
        if id.len() > MAX_DELIVERY_ID {
            return Err(Unbounded::LongId {
                index,
                bytes: id.len(),
            });
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@+=/".contains(&b))
        {
            return Err(Unbounded::BadId { index });
        }
        let a = &d.addressed;
        let strings = [&d.source, &d.event_type, id]
            .into_iter()
            .chain(&a.mentions)
            .chain(&a.assignees)
            .chain(&a.reviewers)
            .chain(a.channel.as_ref())
            .chain(a.thread.as_ref())
            .chain(
                d.owed
                    .iter()
                    .flat_map(|o| [Some(&o.channel), o.thread.as_ref()])
                    .flatten(),
            )
            .chain(d.text.as_ref())
            .chain(&d.sender)
            .chain(match &d.wakes {
                Wakes::Nobody(why) => Some(why),
                Wakes::RouteAndNamed | Wakes::Named => None,
            });
        let bytes = d.payload.len() + strings.map(String::len).sum::<usize>();
        if bytes > MAX_DELIVERY_BYTES {
            return Err(Unbounded::TooLarge { index, bytes });
        }
    }
    Ok(())
}

impl VerifyError {
    /// The host's sentence for this refusal, with the plugin's own words
    /// scrubbed of `scrub`'s secrets and bounded.
    pub fn sentence(&self, scrub: &Scrub) -> String {
        match self {
            VerifyError::MissingHeader(h) => format!("the header {} is missing", scrub.text(h)),
            VerifyError::MalformedHeader(h) => {
                format!("the header {} is not in the scheme's format", scrub.text(h))
            }
            VerifyError::Mismatch => "the signature or token does not match".to_string(),
            VerifyError::StaleTimestamp(t) => {
                format!("the signed timestamp {t} is outside the accepted window")
            }
            VerifyError::MissingSecret(n) => {
                format!("the secret {} is not set on this node", scrub.text(n))
            }
        }
    }
}

impl ParseError {
    /// The host's sentence for this refusal, as [`VerifyError::sentence`].
    pub fn sentence(&self, scrub: &Scrub) -> String {
        match self {
            ParseError::MalformedBody(why) => {
                format!(
                    "the body is not in the source's format: {}",
                    scrub.text(why)
                )
            }
            ParseError::MissingField(path) => {
                format!("a required field is missing: {}", scrub.text(path))
            }
        }
    }
}

/// A loaded webhook plugin.
pub struct WebhookPlugin {
    shell: Shell<WebhookWorld>,
    idle: IdleInstances<(), Bindings>,
}

impl WebhookPlugin {
    /// Loads and links the plugin `manifest` describes.
    pub fn load(runtime: &Arc<Runtime>, manifest: Manifest) -> Result<WebhookPlugin, LoadError> {
        Ok(WebhookPlugin {
            shell: Shell::load(runtime, manifest)?,
            idle: IdleInstances::new(KEEP_IDLE),
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

    /// The secret names the manifest declares.
    pub fn secret_names(&self) -> &[String] {
        match &self.shell.manifest.permissions {
            Permissions::Webhook { secrets, .. } => secrets,
            _ => &[],
        }
    }

    /// Drops every idle instance, so the next call instantiates afresh.
    pub fn drop_idle(&self) {
        self.idle.clear();
    }

    /// `req` with only the secrets the manifest declares: a plugin never
    /// sees a secret it did not ask for, whatever the caller passes.
    pub fn declared_only(&self, mut req: Request) -> Arc<Request> {
        let declared = self.secret_names();
        req.secrets.retain(|s| declared.contains(&s.name));
        Arc::new(req)
    }

    /// What a call must never repeat: the secrets handed to it.
    pub fn scrub_for(req: &Request) -> Scrub {
        Scrub::of(req.secrets.iter().map(|s| s.value.as_slice()))
    }

    /// One call: an idle instance (or a fresh one, instantiated inside the
    /// call's deadline), `step` run on it through the plugin's guard, the
    /// instance kept for reuse only when the call succeeded and `reuse`.
    pub(crate) async fn run<R, F, Fut>(
        &self,
        req: Arc<Request>,
        reuse: bool,
        step: F,
    ) -> Result<R, CallError>
    where
        R: Send + 'static,
        F: FnOnce(Bindings, WebhookStore, Arc<Request>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (WebhookStore, Bindings, wasmtime::Result<R>)>
            + Send
            + 'static,
    {
        let (store, bindings) = match self.idle.take() {
            Some((store, bindings)) => (store, Some(bindings)),
            None => (self.shell.store(())?, None),
        };
        let pre = self.shell.pre.clone();
        let scrub = WebhookPlugin::scrub_for(&req);
        let deadline = self.shell.manifest.limits.deadline;
        let (store, (bindings, value)) = self
            .shell
            .guard
            .call(store, deadline, &scrub, move |mut store| async move {
                let bindings = match bindings {
                    Some(b) => b,
                    None => match pre.instantiate(&mut store).await {
                        Ok(b) => b,
                        Err(e) => return (store, Err(e)),
                    },
                };
                let (store, bindings, result) = step(bindings, store, req).await;
                (store, result.map(|value| (bindings, value)))
            })
            .await?;
        if reuse {
            self.idle.give_back((store, bindings));
        }
        Ok(value)
    }

    /// Checks a delivery's signature or token. `Ok(Err(_))` is a refusal
    /// the plugin decided; `Err(_)` is a fault of the plugin, or the plugin
    /// was not run (quarantined, busy).
    pub async fn verify(&self, req: &Request) -> Result<Result<(), VerifyError>, CallError> {
        self.verify_shared(self.declared_only(req.clone())).await
    }

    /// [`WebhookPlugin::verify`] of a request already passed through
    /// [`WebhookPlugin::declared_only`], shared with the parse that follows.
    pub async fn verify_shared(
        &self,
        req: Arc<Request>,
    ) -> Result<Result<(), VerifyError>, CallError> {
        self.run(req, true, |bindings, mut store, req| async move {
            let r = bindings.verify(&mut store, &req).await;
            (store, bindings, r)
        })
        .await
    }

    /// Parses a verified delivery.
    pub async fn parse(&self, req: &Request) -> Result<Result<Parsed, ParseError>, CallError> {
        self.parse_shared(self.declared_only(req.clone())).await
    }

    /// [`WebhookPlugin::parse`] of a shared request.
    pub async fn parse_shared(
        &self,
        req: Arc<Request>,
    ) -> Result<Result<Parsed, ParseError>, CallError> {
        self.run(req, true, parse_step).await
    }

    /// Instantiates a fresh instance from the pool and drops it (for the
    /// benchmark: the cost of instantiation alone).
    pub async fn instantiate_fresh(&self) -> Result<(), CallError> {
        self.idle.clear();
        let empty = Arc::new(Request::new("/", &[], b"", &[], 0));
        self.run(empty, false, |bindings, store, _| async move {
            (store, bindings, Ok(()))
        })
        .await
    }

    /// Instantiates a fresh instance and parses once, never reusing it: the
    /// cost of a cold call from the pool (for the benchmark).
    pub async fn parse_fresh(
        &self,
        req: &Request,
    ) -> Result<Result<Parsed, ParseError>, CallError> {
        self.idle.clear();
        self.run(self.declared_only(req.clone()), false, parse_step)
            .await
    }
}

async fn parse_step(
    bindings: Bindings,
    mut store: WebhookStore,
    req: Arc<Request>,
) -> (
    WebhookStore,
    Bindings,
    wasmtime::Result<Result<Parsed, ParseError>>,
) {
    let r = bindings.parse(&mut store, &req).await;
    (store, bindings, r)
}

/// Bounds a reply body the plugin asked the host to send.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

impl Reply {
    /// The reply with every secret form of the call removed, or `None`
    /// when it cannot be sent safely (too large, or binary and carrying a
    /// raw secret).
    pub fn scrubbed(self, scrub: &Scrub) -> Option<Reply> {
        if self.body.len() > MAX_REPLY_BYTES {
            return None;
        }
        let body = scrub.body(self.body)?;
        Some(Reply {
            content_type: scrub::bound(&scrub.replace(&self.content_type), 128),
            body,
        })
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
