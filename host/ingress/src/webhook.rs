//! The webhook edge: `/webhooks/{source}` and `/webhooks/{source}/{handle}`.
//!
//! Order (each step decides before the next runs, and why):
//! 1. engine up, a plugin claims the route (404 otherwise), body at most
//!    the plugin's `limits.max_body_bytes` (413): 1 MiB unless the
//!    operator granted more (a large GitHub push parses to a small
//!    delivery) — nothing is read past the cap;
//! 2. an active company and a resolvable secret for the source, else 503 +
//!    Retry-After (our outage, never the sender's fault); a company that
//!    has no integration for the source is 404 (not an outage: a sender
//!    would retry a 503 for ever);
//! 3. verify in the plugin (401), then parse (400, and 400 for a JSON body
//!    that is not an object); a plugin fault is 500 and nothing is claimed
//!    (the plugin host logs it, rate-limited); a quarantined or busy plugin
//!    is not run: 503 + Retry-After. What parse returned is held to the
//!    host's bounds before anything of it is used
//!    ([`crewlet_plugins::webhook::check_bounds`]: at most 100 deliveries,
//!    512 KiB each, delivery ids non-empty, at most 256 bytes of
//!    `A-Z a-z 0-9 - _ . : @ + = /`; else 400 or 413, nothing claimed or
//!    published). Whatever the plugin says (a refusal's reason, a reply
//!    body) is scrubbed of the secrets the host handed it and bounded; a
//!    refusal's body is the host's sentence around it;
//! 4. claim `SOURCE:DELIVERY_ID` for [`CLAIM_TTL`] (unknown fails open).
//!    Another live claim is another attempt's, which may have failed to
//!    publish: a claim says somebody tried, not that the stream has it (a
//!    sender told `duplicate` while that attempt's 503 was on its way never
//!    retries — a mention lost in a route cut). So when the claim is young
//!    enough for the stream's duplicate window to remember its message id,
//!    the delivery is published again under that id (once the claim is a
//!    second old: a live claimant has published by then, and is not
//!    overtaken) and the ack says: a duplicate → 200 `duplicate`, stored
//!    now → 202. An older claim → 200 `duplicate`, nothing published. The
//!    claimant itself answers 202 whatever the ack says: the delivery is
//!    its to record;
//! 5. publish to [`INBOUND_SUBJECT`] with the claim key as the
//!    stream's message id and wait for the ack — a failure releases the
//!    claim and answers 503 + Retry-After;
//! 6. only then the `webhook_received` row (written inline) and its
//!    broadcast (sent, its ack not awaited: the 2xx rests on step 5), 202.
//!
//! Every refusal (4xx) is noted: a `delivery_refused` row and an INFO line,
//! rationed across the edge ([`refusals`]).
//!
//! A failed publish does not wait for the release: the 503 goes out at once
//! and a task of its own releases the claim, retrying until the store
//! answers (at most [`CLAIM_TTL`], after which the claim has lapsed anyway).
//! Until it has, the key is remembered, and the next delivery of it on this
//! node releases it first — so the sender's retry is not mistaken for a
//! duplicate of a delivery nobody has. The release is also attempted when
//! the claim's answer was unknown: a claim write that timed out against a
//! stalled broker is still in the connection and lands when the broker
//! resumes. A release removes only a claim whose claimant is this delivery
//! attempt (compare-and-delete at its revision), so a late release never
//! takes a peer's claim on the retry. A publish that timed out may also
//! land late: the retry's publish carries the same `Nats-Msg-Id`, so the
//! stream keeps one copy (its duplicate window is 2 minutes). And a claim
//! write whose answer was unknown can land *after* its release found
//! nothing: its release keeps looking (with the backoff, until the claim
//! would lapse) so a retry reaching a peer is not answered `duplicate`; and
//! the edge remembers the claims of its attempts that never published, so
//! a retry on this node that meets one releases it and claims afresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use crewlet_company::ActiveCompany;
use crewlet_coord::{Answer, Coord};
use crewlet_observe::Publisher;
use crewlet_plugins::Installed;
use crewlet_plugins::webhook::{
    Delivery, Header, Request, Secret, Unbounded, WebhookPlugin, check_bounds,
};
use crewlet_store::Party;
use serde_json::json;
use tracing::{debug, info, warn};

use crewlet_bus::{INBOUND_SUBJECT, Inbound, MSG_ID_HEADER, TRACE_HEADER};
use crewlet_os::now_ms;
use crewlet_secrets::{Lookup, Resolver};

mod captures;
mod refusals;
mod release;

pub use captures::RefusedLog;

use refusals::Refusals;
use release::{Releaser, forget};

/// The 413's sentence for a route whose body limit is `cap` bytes.
fn too_large(cap: u64) -> String {
    format!("the body is larger than this route accepts ({cap} bytes)")
}

/// How long a delivery claim holds: longer than any sender's retry burst.
pub const CLAIM_TTL: Duration = Duration::from_secs(5 * 60);
/// How long the edge waits for the stream's ack.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest `{handle}` of `/webhooks/{source}/{handle}` (a seat handle).
pub const MAX_ROUTE_HANDLE: usize = 64;

/// What the edge is built from.
pub struct EdgeConfig {
    pub node_id: String,
    pub client: async_nats::Client,
    pub coord: Coord,
    pub publisher: Publisher,
    pub active: ActiveCompany,
    /// The plugins the node serves now; each request looks its route up
    /// afresh, so a reloaded plugin serves the next request.
    pub plugins: Arc<Installed>,
    /// Resolves an integration's secret by the name the company gives it
    /// ([`crewlet_secrets::Secrets::resolver`]).
    pub secrets: Resolver,
    /// Where refused requests are kept for replay (`None`: nowhere).
    pub refused_log: Option<Arc<RefusedLog>>,
}

/// The webhook edge of one node.
pub struct Edge {
    cfg: EdgeConfig,
    js: jetstream::Context,
    /// Claims this node took and has not released yet: key → claimant.
    unreleased: Arc<Mutex<HashMap<String, String>>>,
    /// Claims of this node's attempts that never reached the stream, kept
    /// until they would lapse: key → (claimant, lapse). A claim write whose
    /// answer was unknown may land after its release found nothing, and
    /// the sender's retry must not take it for a peer's delivery.
    abandoned: Mutex<HashMap<String, (String, tokio::time::Instant)>>,
    releaser: Releaser,
    refusals: Refusals,
}

/// What the stream's ack said of a publish.
enum Stored {
    /// Stored by this publish.
    Now,
    /// Its message id was stored within the duplicate window already.
    Already,
}

/// Whether the stream still remembers the message id of the delivery
/// `held` claims: the claim was written within the stream's duplicate
/// window, less [`CLOCK_MARGIN`] (the deadline is the broker's clock).
fn stream_remembers(held: &crewlet_coord::Claimed) -> bool {
    let written = held.deadline.checked_sub(CLAIM_TTL);
    let age = written.and_then(|w| crewlet_os::wall_now().duration_since(w).ok());
    // A claim written "after now" is younger than any age.
    let age = age.unwrap_or(Duration::ZERO);
    written.is_some() && age + CLOCK_MARGIN < crewlet_stream::streams::DUPLICATE_WINDOW
}

/// How long after its claim a live claimant has published, on any broker
/// that answers at all (a publish takes milliseconds; one that takes
/// longer is failing, and the claimant answers 503).
const CLAIMANT_HEAD_START: Duration = Duration::from_secs(1);

/// What is left of [`CLAIMANT_HEAD_START`] for the claim `held`.
fn head_start_left(held: &crewlet_coord::Claimed) -> Option<Duration> {
    let written = held.deadline.checked_sub(CLAIM_TTL)?;
    let due = written + CLAIMANT_HEAD_START;
    due.duration_since(crewlet_os::wall_now())
        .ok()
        .map(|d| d.min(CLAIMANT_HEAD_START))
}

/// What the edge allows for its clock and the broker's to differ when it
/// ages a claim against the stream's duplicate window.
const CLOCK_MARGIN: Duration = Duration::from_secs(30);

/// A delivery on the stream: what was published, and whether this attempt
/// holds its claim (`false`: the claim's answer was unknown and failed open).
#[derive(Debug, Clone)]
pub struct Published {
    pub inbound: Inbound,
    pub claimed: bool,
}

/// How a delivery was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// On the stream; the trace ids of its deliveries.
    Accepted(Vec<String>),
    /// Every delivery was already claimed elsewhere.
    Duplicate,
    /// Verified, nothing to deliver; answer with the source's reply if any.
    Reply {
        content_type: String,
        body: Vec<u8>,
    },
    Ignored,
    /// The sender's fault.
    Refused {
        status: StatusCode,
        reason: String,
    },
    /// Ours: the sender should retry.
    Unavailable(String),
    /// The plugin was not run (quarantined after repeated faults, or at its
    /// concurrency bound): retry after this long.
    NotRun {
        reason: String,
        retry_after: Duration,
    },
    /// The plugin faulted.
    Fault {
        plugin: String,
    },
}

impl Outcome {
    /// The HTTP status this outcome answers with, and what became of the
    /// delivery, for the node's metrics.
    pub fn status_and_result(&self) -> (StatusCode, &'static str) {
        match self {
            Outcome::Accepted(_) => (StatusCode::ACCEPTED, "accepted"),
            Outcome::Duplicate => (StatusCode::OK, "duplicate"),
            Outcome::Reply { .. } => (StatusCode::OK, "reply"),
            Outcome::Ignored => (StatusCode::OK, "ignored"),
            Outcome::Refused { status, .. } => (*status, "refused"),
            Outcome::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Outcome::NotRun { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_run"),
            Outcome::Fault { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "fault"),
        }
    }
}

impl IntoResponse for Outcome {
    fn into_response(self) -> Response {
        let body =
            |status: StatusCode, v: serde_json::Value| (status, axum::Json(v)).into_response();
        match self {
            Outcome::Accepted(traces) => body(
                StatusCode::ACCEPTED,
                json!({ "status": "accepted", "trace_ids": traces }),
            ),
            Outcome::Duplicate => body(StatusCode::OK, json!({ "status": "duplicate" })),
            Outcome::Reply { content_type, body } => {
                let mut r = Response::new(Body::from(body));
                if let Ok(v) = HeaderValue::from_str(&content_type) {
                    r.headers_mut().insert(header::CONTENT_TYPE, v);
                }
                r
            }
            Outcome::Ignored => body(StatusCode::OK, json!({ "status": "ignored" })),
            Outcome::Refused { status, reason } => {
                body(status, json!({ "status": "refused", "error": reason }))
            }
            Outcome::Unavailable(reason) => unavailable(&reason),
            Outcome::NotRun {
                reason,
                retry_after,
            } => crewlet_api::retry_later(retry_after.as_secs().max(1), "not_run", reason),
            Outcome::Fault { plugin } => body(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({ "status": "error", "error": format!("webhook plugin {plugin} failed") }),
            ),
        }
    }
}

/// 503 + Retry-After with a reason: the node cannot take the delivery now.
pub fn unavailable(reason: &str) -> Response {
    crewlet_api::retry_later(crewlet_api::RETRY_AFTER_SECONDS, "unavailable", reason)
}

fn refused(status: StatusCode, reason: impl Into<String>) -> Outcome {
    Outcome::Refused {
        status,
        reason: reason.into(),
    }
}

impl Edge {
    pub fn new(cfg: EdgeConfig) -> Edge {
        let js = jetstream::new(cfg.client.clone());
        Edge {
            releaser: Releaser {
                coord: cfg.coord.clone(),
            },
            js,
            cfg,
            unreleased: Arc::default(),
            abandoned: Mutex::default(),
            refusals: Refusals::default(),
        }
    }

    /// The plugin whose manifest claims `/webhooks/{source}`.
    pub fn plugin_for(&self, source: &str) -> Option<Arc<WebhookPlugin>> {
        self.cfg
            .plugins
            .webhook_serving(&format!("/webhooks/{source}"))
    }

    /// Serves one request: reads at most the plugin's body limit of `body`. A refusal
    /// is noted (an event and a log line, rationed); every answer is
    /// counted in the node's metrics (a source no plugin serves as
    /// `unserved`, so a sender cannot mint label values).
    pub async fn serve(
        &self,
        source: &str,
        handle: Option<&str>,
        headers: &HeaderMap,
        body: Body,
    ) -> Outcome {
        let (outcome, read) = self.read_and_deliver(source, handle, headers, body).await;
        let (status, result) = outcome.status_and_result();
        let counted = match self.plugin_for(source) {
            Some(_) => source,
            None => crewlet_observe::UNSERVED,
        };
        self.cfg
            .publisher
            .meter()
            .delivery(counted, status.as_u16(), result);
        if let Outcome::Refused { status, reason } = &outcome {
            self.refusals
                .note(
                    &self.cfg.publisher,
                    &self.cfg.node_id,
                    source,
                    handle,
                    *status,
                    reason,
                )
                .await;
            if let (Some(log), Some(body), Some(_)) =
                (&self.cfg.refused_log, &read, self.plugin_for(source))
            {
                self.keep_refused(log, source, handle, headers, body, reason);
            }
        }
        outcome
    }

    async fn read_and_deliver(
        &self,
        source: &str,
        handle: Option<&str>,
        headers: &HeaderMap,
        body: Body,
    ) -> (Outcome, Option<Bytes>) {
        let Some(plugin) = self.plugin_for(source) else {
            let why = format!("no webhook plugin serves /webhooks/{source}");
            return (refused(StatusCode::NOT_FOUND, why), None);
        };
        let cap = plugin.manifest().limits.max_body_bytes;
        if let Some(h) = handle
            && (h.len() > MAX_ROUTE_HANDLE
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
        {
            let why = format!(
                "the route's handle is not a seat handle (at most {MAX_ROUTE_HANDLE} bytes of A-Z a-z 0-9 - _ .)"
            );
            return (refused(StatusCode::BAD_REQUEST, why), None);
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > cap) {
            return (refused(StatusCode::PAYLOAD_TOO_LARGE, too_large(cap)), None);
        }
        let body = match axum::body::to_bytes(body, cap as usize).await {
            Ok(b) => b,
            Err(e) => {
                // axum reports the cap as "length limit exceeded" in the chain.
                let too_big =
                    format!("{e:#} {:?}", std::error::Error::source(&e)).contains("length limit");
                let answer = if too_big {
                    refused(StatusCode::PAYLOAD_TOO_LARGE, too_large(cap))
                } else {
                    refused(StatusCode::BAD_REQUEST, format!("unreadable body: {e}"))
                };
                return (answer, None);
            }
        };
        let outcome = self.deliver(source, handle, headers, body.clone()).await;
        (outcome, Some(body))
    }

    /// The steps after the body is read (see the module docs): admit,
    /// then each delivery dispatched and recorded in turn.
    pub async fn deliver(
        &self,
        source: &str,
        handle: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Outcome {
        let started = std::time::Instant::now();
        let deliveries = match self.admit(source, handle, headers, &body).await {
            Ok(deliveries) => deliveries,
            Err(answer) => return answer,
        };
        let mut accepted = Vec::new();
        for d in deliveries {
            match self.dispatch(source, handle, d).await {
                Ok(Some(published)) => {
                    self.record(&published, started).await;
                    accepted.push(published.inbound.trace_id);
                }
                Ok(None) => {}
                Err(reason) => return Outcome::Unavailable(reason),
            }
        }
        if accepted.is_empty() {
            Outcome::Duplicate
        } else {
            Outcome::Accepted(accepted)
        }
    }

    /// Steps 1–3: the route, the company and its secret, verify and parse
    /// in the plugin. `Ok`: the deliveries the request carries (at least
    /// one); `Err`: the answer, when there is nothing to deliver.
    pub async fn admit(
        &self,
        source: &str,
        handle: Option<&str>,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Vec<Delivery>, Outcome> {
        let Some(plugin) = self.plugin_for(source) else {
            return Err(refused(
                StatusCode::NOT_FOUND,
                format!("no webhook plugin serves /webhooks/{source}"),
            ));
        };
        let cap = plugin.manifest().limits.max_body_bytes;
        if body.len() as u64 > cap {
            return Err(refused(StatusCode::PAYLOAD_TOO_LARGE, too_large(cap)));
        }
        let Some(active) = self.cfg.active.current() else {
            return Err(Outcome::Unavailable("no active company".into()));
        };
        let Some(integration) = active.company.integrations.get(source) else {
            return Err(refused(
                StatusCode::NOT_FOUND,
                format!(
                    "this company takes no deliveries from {source} (it has no [integrations.{source}])"
                ),
            ));
        };
        let secret_name = integration.secret.name_str();
        let secret = match self.cfg.secrets.lookup(secret_name) {
            Lookup::Found(secret) => secret,
            Lookup::Unset => {
                warn!(
                    subsystem = "ingress",
                    source,
                    secret = secret_name,
                    "webhook secret not set on this node"
                );
                return Err(Outcome::Unavailable(format!(
                    "secret {secret_name} for {source} is not set"
                )));
            }
            Lookup::Unavailable(why) => {
                warn!(subsystem = "ingress", source, secret = secret_name, reason = %why,
                    "webhook secret unavailable on this node");
                return Err(Outcome::Unavailable(why));
            }
            // Not yet known: the sender retries (503 + Retry-After); the
            // delivery is neither verified against a guess nor refused.
            Lookup::Unknown(why) => {
                warn!(subsystem = "ingress", source, secret = secret_name, reason = %why,
                    "webhook secret not known yet on this node");
                return Err(Outcome::Unavailable(why));
            }
        };
        let req = plugin.declared_only(Request {
            route: match handle {
                Some(h) => format!("/webhooks/{source}/{h}"),
                None => format!("/webhooks/{source}"),
            },
            // Names arrive lower-cased from the HTTP layer.
            headers: headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.as_str().to_owned(),
                    value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
                })
                .collect(),
            body: body.to_vec(),
            secrets: plugin
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
        });
        let scrub = WebhookPlugin::scrub_for(&req);
        let fault = |e: crewlet_plugins::CallError, step: &str| {
            let plugin = plugin.manifest().name.clone();
            if let Some(retry_after) = e.retry_after() {
                debug!(subsystem = "ingress", %plugin, error = %e, step, "webhook plugin not run");
                return Outcome::NotRun {
                    reason: e.to_string(),
                    retry_after,
                };
            }
            // The plugin host has logged the fault (rate-limited, scrubbed).
            debug!(subsystem = "ingress", %plugin, step, "webhook plugin fault");
            Outcome::Fault { plugin }
        };
        match plugin.verify_shared(req.clone()).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                let reason = format!("not verified: {}", why.sentence(&scrub));
                debug!(subsystem = "ingress", source, %reason, "delivery refused");
                return Err(refused(StatusCode::UNAUTHORIZED, reason));
            }
            Err(e) => return Err(fault(e, "verify")),
        }
        let json_body = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_none_or(|ct| ct.contains("json"));
        // Only the shape is checked here (an object, not an array or text);
        // the plugin parses the body and answers 400 for one it cannot read,
        // so a 15 KB payload is not parsed twice on the host's cores.
        if json_body && body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(refused(
                StatusCode::BAD_REQUEST,
                "the body is not a JSON object",
            ));
        }
        let parsed = match plugin.parse_shared(req).await {
            Ok(Ok(p)) => p,
            Ok(Err(why)) => {
                let reason = format!("not parsed: {}", why.sentence(&scrub));
                debug!(subsystem = "ingress", source, %reason, "delivery refused");
                return Err(refused(StatusCode::BAD_REQUEST, reason));
            }
            // An answer past the transfer bound is the plugin's fault, but
            // the delivery is what expanded past the host's bounds: refused
            // like one past them, so the sender does not retry it for ever.
            Err(
                e @ crewlet_plugins::CallError::Fault {
                    fault: crewlet_plugins::Fault::Oversized { .. },
                    ..
                },
            ) => {
                // The plugin host has logged the fault (rate-limited).
                debug!(subsystem = "ingress", source, error = %e, "delivery refused: past the host's transfer bound");
                return Err(refused(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "not accepted: the plugin's answer is past the host's transfer bound",
                ));
            }
            Err(e) => return Err(fault(e, "parse")),
        };
        if let Err(e) = check_bounds(&parsed) {
            let status = match e {
                Unbounded::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                _ => StatusCode::BAD_REQUEST,
            };
            let plugin = &plugin.manifest().name;
            warn!(subsystem = "ingress", source, %plugin, error = %e, "delivery refused: past the host's bounds");
            return Err(refused(status, format!("not accepted: {e}")));
        }
        if parsed.deliveries.is_empty() {
            return Err(match parsed.reply.map(|r| r.scrubbed(&scrub)) {
                Some(Some(r)) => Outcome::Reply {
                    content_type: r.content_type,
                    body: r.body,
                },
                Some(None) => {
                    let plugin = plugin.manifest().name.clone();
                    warn!(subsystem = "ingress", %plugin, "reply withheld: too large, or binary and carrying a secret");
                    Outcome::Fault { plugin }
                }
                None => Outcome::Ignored,
            });
        }
        Ok(parsed.deliveries)
    }

    /// Steps 4–5 for one delivery: claim, publish, wait for the ack.
    /// `Ok(Some(_))` on the stream, `Ok(None)` a duplicate, `Err` our
    /// outage (the claim released in the background).
    pub async fn dispatch(
        &self,
        source: &str,
        handle: Option<&str>,
        d: Delivery,
    ) -> Result<Option<Published>, String> {
        // Time-ordered, like event ids: the log indexes trace ids too.
        let trace_id = uuid::Uuid::now_v7().to_string();
        let key = format!("{source}:{}", d.delivery_id);
        let claimant = format!("{}/{trace_id}", self.cfg.node_id);
        // A claim of ours not released yet still stands in the way of this
        // retry: release it first.
        let stale = self.unreleased.lock().expect("lock").get(&key).cloned();
        if let Some(stale) = stale {
            if let Err(e) = self.releaser.release(&key, &stale).await {
                return Err(format!("a claim on {key} could not be released yet: {e}"));
            }
            forget(&self.unreleased, &key, &stale);
        }
        let mut claim = self
            .cfg
            .coord
            .claim_delivery(&key, &claimant, CLAIM_TTL)
            .await;
        if let Ok(Answer::No(held)) = &claim
            && self.was_abandoned(&key, &held.claimant)
        {
            // Our own earlier attempt's claim, landed late: it published
            // nothing, so it is released and this attempt claims afresh.
            info!(subsystem = "ingress", %key, trace_id, "a claim of an earlier attempt that never published landed late; releasing it");
            if let Err(e) = self.releaser.release(&key, &held.claimant).await {
                return Err(format!("a claim on {key} could not be released yet: {e}"));
            }
            claim = self
                .cfg
                .coord
                .claim_delivery(&key, &claimant, CLAIM_TTL)
                .await;
        }
        let (claimed, held) = match claim {
            Ok(Answer::Yes(_)) => (true, None),
            Ok(Answer::No(held)) if !stream_remembers(&held) => return Ok(None),
            Ok(Answer::No(held)) => (false, Some(held)),
            Err(e) => {
                warn!(subsystem = "ingress", %key, trace_id, error = %e, "claim unknown; failing open");
                (false, None)
            }
        };
        let inbound = Inbound {
            trace_id,
            key,
            delivery_id: d.delivery_id,
            source: d.source,
            event_type: d.event_type,
            route_handle: handle.map(str::to_owned),
            mentions: d.addressed.mentions,
            assignees: d.addressed.assignees,
            reviewers: d.addressed.reviewers,
            channel: d.addressed.channel,
            thread: d.addressed.thread,
            text: d.text,
            owed: d.owed.map(|o| crewlet_bus::ReplyTo {
                channel: o.channel,
                thread: o.thread,
            }),
            received_by: self.cfg.node_id.clone(),
            received_at_ms: now_ms(),
        };
        if let Some(held) = held {
            // Another attempt's claim: whether its delivery is on the stream
            // is the stream's to say. Published again under the same message
            // id, the stream keeps one copy and its ack tells which. A claim
            // younger than [`CLAIMANT_HEAD_START`] is waited out first, so a
            // claimant still publishing is not overtaken (two 202s).
            if let Some(wait) = head_start_left(&held) {
                tokio::time::sleep(wait).await;
            }
            return match self.publish(&inbound).await {
                Ok(Stored::Already) => Ok(None),
                Ok(Stored::Now) => {
                    let (key, trace_id) = (&inbound.key, &inbound.trace_id);
                    info!(subsystem = "ingress", %key, trace_id, claimant = %held.claimant,
                        "a claimed delivery was not on the stream (its attempt never published); published it");
                    Ok(Some(Published {
                        inbound,
                        claimed: false,
                    }))
                }
                // Nothing of ours to release: the claim is the other attempt's.
                Err(e) => Err(format!("the stream did not take the delivery: {e}")),
            };
        }
        // The claimant answers 202 even when the stream had the message
        // id already (an earlier attempt's publish that timed out and
        // landed late): it holds the claim, so the delivery is its to
        // record.
        if let Err(e) = self.publish(&inbound).await {
            // Claimed, or unknown (a timed-out claim write may still land):
            // released off the answer's path, remembered until it is.
            let why = if claimed { "claimed" } else { "claim unknown" };
            let (key, trace_id) = (&inbound.key, &inbound.trace_id);
            warn!(subsystem = "ingress", %key, trace_id, why, "publish failed; releasing the claim in the background");
            self.unreleased
                .lock()
                .expect("lock")
                .insert(key.clone(), claimant.clone());
            self.abandon(key, &claimant);
            self.releaser
                .spawn(key.clone(), claimant, !claimed, self.unreleased.clone());
            return Err(format!("the stream did not take the delivery: {e}"));
        }
        Ok(Some(Published { inbound, claimed }))
    }

    /// Remembers that `claimant`'s claim on `key` published nothing.
    fn abandon(&self, key: &str, claimant: &str) {
        let now = tokio::time::Instant::now();
        let mut map = self.abandoned.lock().expect("lock");
        map.retain(|_, (_, lapse)| *lapse > now);
        map.insert(key.to_owned(), (claimant.to_owned(), now + CLAIM_TTL));
    }

    /// Whether `claimant`'s claim on `key` is one this node abandoned.
    fn was_abandoned(&self, key: &str, claimant: &str) -> bool {
        let now = tokio::time::Instant::now();
        self.abandoned
            .lock()
            .expect("lock")
            .get(key)
            .is_some_and(|(c, lapse)| c == claimant && *lapse > now)
    }

    /// Step 6: the `webhook_received` row, written inline, and its
    /// broadcast, sent but not awaited — the 2xx rests on the acknowledged
    /// publish (see `crewlet_observe::Publisher::record`). A failure here
    /// is logged and leaves the delivery accepted: it is on the stream.
    /// `ms` is the time since `started` (the body read): the delivery's
    /// verify, parse, claim and publish.
    pub async fn record(&self, published: &Published, started: std::time::Instant) {
        let inbound = &published.inbound;
        let mut event = self.cfg.publisher.event(
            "webhook_received",
            json!({
                "source": inbound.source,
                "event_type": inbound.event_type,
                "delivery_id": inbound.delivery_id,
                "route_handle": inbound.route_handle,
                "mentions": inbound.mentions,
                "claimed": published.claimed,
                "ms": started.elapsed().as_millis() as u64,
            }),
        );
        event.trace_id = Some(inbound.trace_id.clone());
        event.parties = vec![
            Party {
                party: format!("source:{}", inbound.source),
                role: "sender".into(),
            },
            Party {
                party: format!("node:{}", self.cfg.node_id),
                role: "edge".into(),
            },
        ];
        let (key, trace_id) = (&inbound.key, &inbound.trace_id);
        if let Err(e) = self.cfg.publisher.record(event).await {
            warn!(subsystem = "ingress", trace_id, error = %e, "webhook_received event not recorded");
        }
        info!(subsystem = "ingress", %key, trace_id, "delivery accepted");
    }

    async fn publish(&self, inbound: &Inbound) -> Result<Stored, String> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(MSG_ID_HEADER, inbound.key.as_str());
        headers.insert(TRACE_HEADER, inbound.trace_id.as_str());
        let body = serde_json::to_vec(inbound).expect("inbound serialises");
        let ack = self
            .js
            .publish_with_headers(INBOUND_SUBJECT, headers, body.into())
            .await
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(ACK_TIMEOUT, ack).await {
            Ok(Ok(a)) if a.duplicate => Ok(Stored::Already),
            Ok(Ok(_)) => Ok(Stored::Now),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no ack within {ACK_TIMEOUT:?}")),
        }
    }
}
