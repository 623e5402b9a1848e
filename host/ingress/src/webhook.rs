//! The webhook edge: `/webhooks/{source}` and `/webhooks/{source}/{handle}`.
//!
//! Order (each step decides before the next runs, and why):
//! 1. engine up, a plugin claims the route (404 otherwise): the route is
//!    resolved once ([`Edge::resolve`] → [`Route`]: the plugin, and the
//!    company's integration and secret for the source) and that one value
//!    serves every later step, so a hot reload never mixes two versions in
//!    one request. The body is read by the HTTP layer at most to the
//!    plugin's `limits.max_body_bytes` ([`Route::body_cap`], 413): 1 MiB
//!    unless the operator granted more (a large GitHub push parses to a
//!    small delivery) — nothing is read past the cap;
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
//! Every answer is typed ([`Outcome`]) and says who is to blame when the
//! delivery was not taken ([`crewlet_plugins::Blame`]): the sender (a
//! [`Refusal`], 4xx), the plugin (500) or the host (an [`Outage`], or a
//! plugin call the host failed: 503 + Retry-After). The HTTP response is
//! built from it by the HTTP crate; this crate knows no HTTP server.
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
use bytes::Bytes;
use crewlet_company::ActiveCompany;
use crewlet_coord::Deliveries;
use crewlet_observe::Publisher;
use crewlet_plugins::Installed;
use crewlet_plugins::webhook::Delivery;
use crewlet_secrets::Resolver;
use crewlet_store::Party;
use http::HeaderMap;
use serde_json::json;
use tracing::{info, warn};

mod captures;
mod dispatch;
mod outcome;
mod refusals;
mod release;
mod route;

pub use captures::RefusedLog;
pub use dispatch::Published;
pub use outcome::{DispatchError, Outage, Outcome, Refusal};
pub use release::ReleaseError;
pub use route::Route;

use refusals::Refusals;
use release::Releaser;

/// How long a delivery claim holds: longer than any sender's retry burst.
pub const CLAIM_TTL: Duration = Duration::from_secs(5 * 60);
/// How long the edge waits for the stream's ack (the node's one bound,
/// [`crewlet_observe::ACK_TIMEOUT`]).
pub const ACK_TIMEOUT: Duration = crewlet_observe::ACK_TIMEOUT;
/// The longest `{handle}` of `/webhooks/{source}/{handle}` (a seat handle).
pub const MAX_ROUTE_HANDLE: usize = 64;

/// What the edge is built from.
pub struct EdgeConfig {
    pub node_id: String,
    pub client: async_nats::Client,
    pub deliveries: Deliveries,
    pub publisher: Publisher,
    pub active: ActiveCompany,
    /// The plugins the node serves now; each request resolves its route
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

impl Edge {
    pub fn new(cfg: EdgeConfig) -> Edge {
        let js = jetstream::new(cfg.client.clone());
        Edge {
            releaser: Releaser {
                deliveries: cfg.deliveries.clone(),
            },
            js,
            cfg,
            unreleased: Arc::default(),
            abandoned: Mutex::default(),
            refusals: Refusals::default(),
        }
    }

    /// Serves one request on its resolved route: `body` is what the HTTP
    /// layer read within [`Route::body_cap`], or why it could not. A
    /// refusal is noted (an event and a log line, rationed) and kept for
    /// replay when the node keeps them; every answer is counted in the
    /// node's metrics under the route's source.
    pub async fn serve(
        &self,
        route: &Route,
        headers: &HeaderMap,
        body: Result<Bytes, Refusal>,
    ) -> Outcome {
        let outcome = match &body {
            Ok(body) => self.deliver(route, headers, body.clone()).await,
            Err(refusal) => Outcome::Refused(refusal.clone()),
        };
        self.settle(route.source(), route.handle(), route.source(), &outcome)
            .await;
        if let (Outcome::Refused(refusal), Some(log), Ok(body)) =
            (&outcome, &self.cfg.refused_log, &body)
        {
            self.keep_refused(log, route, headers, body, &refusal.to_string());
        }
        outcome
    }

    /// Answers a request whose route did not resolve ([`Edge::resolve`]),
    /// noted and counted as [`Edge::serve`] does — a source no plugin serves
    /// as `unserved`, so a sender cannot mint label values.
    pub async fn refuse(&self, source: &str, handle: Option<&str>, refusal: Refusal) -> Outcome {
        let label = match refusal {
            Refusal::NoPlugin { .. } => crewlet_observe::UNSERVED,
            _ => source,
        };
        let outcome = Outcome::Refused(refusal);
        self.settle(source, handle, label, &outcome).await;
        outcome
    }

    /// Counts `outcome` under `label`, and notes it when it is a refusal.
    async fn settle(&self, source: &str, handle: Option<&str>, label: &str, outcome: &Outcome) {
        let (status, result) = outcome.status_and_result();
        self.cfg
            .publisher
            .meter()
            .delivery(label, status.as_u16(), result);
        if let Outcome::Refused(refusal) = outcome {
            self.refusals
                .note(
                    &self.cfg.publisher,
                    &self.cfg.node_id,
                    source,
                    handle,
                    status,
                    &refusal.to_string(),
                )
                .await;
        }
    }

    /// The steps after the body is read within [`Route::body_cap`] (see the
    /// module docs): admit, then each delivery dispatched and recorded in
    /// turn.
    pub async fn deliver(&self, route: &Route, headers: &HeaderMap, body: Bytes) -> Outcome {
        let started = std::time::Instant::now();
        let deliveries = match self.admit(route, headers, &body).await {
            Ok(deliveries) => deliveries,
            Err(answer) => return answer,
        };
        let mut accepted = Vec::new();
        for d in deliveries {
            match self.dispatch(route.source(), route.handle(), d).await {
                Ok(Some(published)) => {
                    self.record(&published, started).await;
                    accepted.push(published.inbound.trace_id);
                }
                Ok(None) => {}
                Err(e) => return Outcome::Unavailable(e.into()),
            }
        }
        if accepted.is_empty() {
            Outcome::Duplicate
        } else {
            Outcome::Accepted(accepted)
        }
    }

    /// Steps 2–3 on `route`: the company's secret for it, verify and parse
    /// in its plugin, the host's bounds. `Ok`: the deliveries the request
    /// carries (at least one); `Err`: the answer, when there is nothing to
    /// deliver.
    pub async fn admit(
        &self,
        route: &Route,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Vec<Delivery>, Outcome> {
        route.admit(headers, body).await
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
                "sender": inbound.sender,
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
}
