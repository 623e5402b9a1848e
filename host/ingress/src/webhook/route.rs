//! A request's route, resolved once: the plugin that serves
//! `/webhooks/{source}`, and the company's integration and secret for the
//! source. Every later step of the request — the body cap, verify, parse,
//! the metric label, the refused capture — reads this one value, so a
//! plugin reloaded (or a company applied) mid-request serves the next
//! request whole, never half of this one.
//!
//! The company and its secret are read with the plugin, but a problem with
//! them is answered only after the body is read (step 2 of the module
//! docs), so the order of the answers does not change.

use std::sync::Arc;

use crewlet_plugins::Blame;
use crewlet_plugins::scrub::Scrub;
use crewlet_plugins::webhook::{
    Delivery, Header, Parsed, Request, Secret, WebhookPlugin, check_bounds,
};
use crewlet_plugins::{CallError, Fault};
use crewlet_secrets::Lookup;
use http::HeaderMap;
use tracing::{debug, warn};

use super::outcome::{Outage, Outcome, Refusal};
use super::{Edge, MAX_ROUTE_HANDLE};

/// One request's route: its source, handle, plugin and secret.
pub struct Route {
    source: String,
    handle: Option<String>,
    plugin: Arc<WebhookPlugin>,
    /// The integration's secret, or why the company cannot take the source
    /// now (answered after the body is read).
    secret: Result<String, Unresolved>,
}

/// Why the company cannot take a served source now.
#[derive(Debug, Clone)]
enum Unresolved {
    NoCompany,
    NoIntegration,
    SecretUnset {
        name: String,
    },
    /// The secret's store could not say: unavailable, or not known yet.
    SecretUnknown {
        name: String,
        why: String,
    },
}

impl Route {
    /// The source, as the route and the metric label name it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The route's `{handle}`, if it has one.
    pub fn handle(&self) -> Option<&str> {
        self.handle.as_deref()
    }

    /// The plugin serving it, the same one for every step of the request.
    pub fn plugin(&self) -> &Arc<WebhookPlugin> {
        &self.plugin
    }

    /// The most bytes the body may hold: the plugin's `limits.max_body_bytes`.
    pub fn body_cap(&self) -> u64 {
        self.plugin.manifest().limits.max_body_bytes
    }

    /// The integration's secret, when the company has one for the source.
    pub(super) fn found_secret(&self) -> Option<&str> {
        self.secret.as_deref().ok()
    }

    /// The path the request came in on.
    pub(super) fn path(&self) -> String {
        match &self.handle {
            Some(h) => format!("/webhooks/{}/{h}", self.source),
            None => format!("/webhooks/{}", self.source),
        }
    }

    /// Step 2: the secret, or the answer when the company cannot take the
    /// source (503 for our outage, 404 for no integration).
    fn secret(&self) -> Result<&str, Outcome> {
        let source = self.source.as_str();
        let unresolved = match &self.secret {
            Ok(secret) => return Ok(secret.as_str()),
            Err(unresolved) => unresolved,
        };
        Err(match unresolved {
            Unresolved::NoCompany => Outcome::Unavailable(Outage::NoCompany),
            Unresolved::NoIntegration => Outcome::Refused(Refusal::NoIntegration {
                from: source.to_owned(),
            }),
            Unresolved::SecretUnset { name } => {
                warn!(subsystem = "ingress", source, secret = %name, "webhook secret not set on this node");
                Outcome::Unavailable(Outage::SecretUnset {
                    name: name.clone(),
                    from: source.to_owned(),
                })
            }
            // Not known yet, or unreadable: the sender retries (503 +
            // Retry-After); the delivery is neither verified against a
            // guess nor refused.
            Unresolved::SecretUnknown { name, why } => {
                warn!(subsystem = "ingress", source, secret = %name, reason = %why,
                    "webhook secret unavailable or not known yet on this node");
                Outcome::Unavailable(Outage::Secret(why.clone()))
            }
        })
    }

    /// The request the plugin is handed: the headers (names lower-cased by
    /// the HTTP layer), the body, and the secret under each name its
    /// manifest declares — and no other.
    fn request(&self, headers: &HeaderMap, body: &[u8], secret: &str) -> Arc<Request> {
        self.plugin.declared_only(Request {
            route: self.path(),
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.as_str().to_owned(),
                    value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
                })
                .collect(),
            body: body.to_vec(),
            secrets: self
                .plugin
                .secret_names()
                .iter()
                .map(|n| Secret {
                    name: n.clone(),
                    value: secret.as_bytes().to_vec(),
                })
                .collect(),
            now_unix_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
        })
    }

    /// A failed plugin call's answer: not run (503 + Retry-After), or a
    /// fault charged as the plugin host blamed it. The plugin host has
    /// logged the fault (rate-limited, scrubbed).
    fn failed(&self, e: CallError, step: &str) -> Outcome {
        let plugin = self.plugin.manifest().name.clone();
        if let Some(retry_after) = e.retry_after() {
            debug!(subsystem = "ingress", %plugin, error = %e, step, "webhook plugin not run");
            return Outcome::NotRun {
                reason: e.to_string(),
                retry_after,
            };
        }
        let blame = e.blame();
        debug!(subsystem = "ingress", %plugin, step, ?blame, "webhook plugin fault");
        Outcome::Fault { plugin, blame }
    }

    /// Step 3a: verify in the plugin (401).
    async fn verify(&self, req: &Arc<Request>, scrub: &Scrub) -> Result<(), Outcome> {
        match self.plugin.verify_shared(req.clone()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => {
                let refusal = Refusal::NotVerified {
                    reason: why.sentence(scrub),
                };
                debug!(subsystem = "ingress", source = %self.source, reason = %refusal, "delivery refused");
                Err(Outcome::Refused(refusal))
            }
            Err(e) => Err(self.failed(e, "verify")),
        }
    }

    /// Step 3b: parse in the plugin (400; 413 for an answer past the
    /// host's transfer bound).
    async fn parse(&self, req: Arc<Request>, scrub: &Scrub) -> Result<Parsed, Outcome> {
        match self.plugin.parse_shared(req).await {
            Ok(Ok(parsed)) => Ok(parsed),
            Ok(Err(why)) => {
                let refusal = Refusal::NotParsed {
                    reason: why.sentence(scrub),
                };
                debug!(subsystem = "ingress", source = %self.source, reason = %refusal, "delivery refused");
                Err(Outcome::Refused(refusal))
            }
            Err(
                e @ CallError::Fault {
                    fault: Fault::Oversized { .. },
                    ..
                },
            ) => {
                // The plugin host has logged the fault (rate-limited).
                debug!(subsystem = "ingress", source = %self.source, error = %e, "delivery refused: past the host's transfer bound");
                Err(Outcome::Refused(Refusal::PastTransferBound))
            }
            Err(e) => Err(self.failed(e, "parse")),
        }
    }

    /// Step 3c: what parse returned, held to the host's bounds (400/413),
    /// then the deliveries — or, with none, the source's reply or nothing.
    fn bounded(&self, parsed: Parsed, scrub: &Scrub) -> Result<Vec<Delivery>, Outcome> {
        if let Err(e) = check_bounds(&parsed) {
            let plugin = &self.plugin.manifest().name;
            warn!(subsystem = "ingress", source = %self.source, %plugin, error = %e, "delivery refused: past the host's bounds");
            return Err(Outcome::Refused(Refusal::PastBounds(e)));
        }
        if !parsed.deliveries.is_empty() {
            return Ok(parsed.deliveries);
        }
        Err(match parsed.reply.map(|r| r.scrubbed(scrub)) {
            Some(Some(r)) => Outcome::Reply {
                content_type: r.content_type,
                body: r.body,
            },
            Some(None) => {
                let plugin = self.plugin.manifest().name.clone();
                warn!(subsystem = "ingress", %plugin, "reply withheld: too large, or binary and carrying a secret");
                Outcome::Fault {
                    plugin,
                    blame: Blame::Guest,
                }
            }
            None => Outcome::Ignored,
        })
    }

    /// Steps 2–3 on a body read within [`Route::body_cap`]: the secret,
    /// verify, the body's shape, parse, the bounds. `Ok`: the deliveries
    /// the request carries (at least one); `Err`: the answer, when there is
    /// nothing to deliver.
    pub(super) async fn admit(
        &self,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Vec<Delivery>, Outcome> {
        let secret = self.secret()?;
        let req = self.request(headers, body, secret);
        let scrub = WebhookPlugin::scrub_for(&req);
        self.verify(&req, &scrub).await?;
        json_object(headers, body)?;
        let parsed = self.parse(req, &scrub).await?;
        self.bounded(parsed, &scrub)
    }
}

/// Only the body's shape is checked here (an object, not an array or
/// text) when it says it is JSON or says nothing; the plugin parses it and
/// answers 400 for one it cannot read, so a 15 KB payload is not parsed
/// twice on the host's cores.
fn json_object(headers: &HeaderMap, body: &[u8]) -> Result<(), Outcome> {
    let json_body = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|ct| ct.contains("json"));
    if json_body && body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(Outcome::Refused(Refusal::NotAnObject));
    }
    Ok(())
}

impl Edge {
    /// Step 1: the route of `/webhooks/{source}[/{handle}]`, resolved once
    /// for the whole request — the plugin that claims it (404 otherwise),
    /// a handle that is a seat handle (400), and the company's integration
    /// and secret for the source.
    pub fn resolve(&self, source: &str, handle: Option<&str>) -> Result<Route, Refusal> {
        let route = format!("/webhooks/{source}");
        let Some(plugin) = self.cfg.plugins.webhook_serving(&route) else {
            let denied_by = self.cfg.plugins.webhook_route_denied(&route);
            return Err(Refusal::NoPlugin { route, denied_by });
        };
        if let Some(h) = handle
            && (h.len() > MAX_ROUTE_HANDLE
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        {
            return Err(Refusal::NotAHandle);
        }
        Ok(Route {
            source: source.to_owned(),
            handle: handle.map(str::to_owned),
            plugin,
            secret: self.secret_for(source, handle),
        })
    }

    /// The secret the active company names for the route, looked up once:
    /// the route's seat's own for `source` (a vendor that signs each app
    /// with its own secret), else the integration's.
    fn secret_for(&self, source: &str, handle: Option<&str>) -> Result<String, Unresolved> {
        let active = self.cfg.active.current().ok_or(Unresolved::NoCompany)?;
        let name = active
            .company
            .route_secret(source, handle)
            .ok_or(Unresolved::NoIntegration)?
            .name_str()
            .to_owned();
        match self.cfg.secrets.lookup(&name) {
            Lookup::Found(secret) => Ok(secret),
            Lookup::Unset => Err(Unresolved::SecretUnset { name }),
            Lookup::Unavailable(why) | Lookup::Unknown(why) => {
                Err(Unresolved::SecretUnknown { name, why })
            }
        }
    }
}
