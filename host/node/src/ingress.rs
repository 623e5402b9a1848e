//! Ingress glue: the webhook routes and the ingress subsystems, wired from
//! the engine. The logic is in `crewlet-ingress` (and the mailboxes in
//! `crewlet-stream`); this file only builds it from the node's context.
//!
//! Rules: the routes answer 503 + Retry-After until the engine is up (the
//! notification consumer must exist before a delivery is accepted: its
//! stream has interest retention). Webhook secrets are resolved through the
//! engine's [`crewlet_secrets::Secrets`] — the fleet's secrets bucket, then
//! this node's environment — by the name the company gives them.

use std::sync::Arc;

use bytes::Bytes;
use crewlet_api::webhooks::{BodyRefusal, WebhookAnswer, Webhooks};
use crewlet_company::Handle;
use crewlet_ingress::{Edge, EdgeConfig, NotifyService, Outcome, Refusal, Route};
use crewlet_plugins::Blame;
use crewlet_stream::ensure_mailboxes;
use crewlet_stream::streams::START_WITHIN;
use http::HeaderMap;
use tracing::warn;

use crate::engine::{EngineContext, Late, Started};

/// A webhook edge over the node's context: one per node, built once the
/// notification consumer exists.
fn edge_for(ctx: &EngineContext) -> Edge {
    let plugins = ctx
        .plugins
        .as_ref()
        .map(|p| p.installed.clone())
        .unwrap_or_default();
    Edge::new(EdgeConfig {
        node_id: ctx.node_id.clone(),
        client: ctx.client.clone(),
        deliveries: ctx.coord.deliveries(),
        publisher: ctx.publisher.clone(),
        active: ctx.active.clone(),
        plugins,
        secrets: ctx.secrets.resolver(),
        refused_log: refused_log(ctx),
    })
}

/// `[ingress] record_refused`: where refused requests are kept for
/// `crewlet plugins try` (none by default; a folder that cannot be made
/// is a WARN, never a stopped node).
fn refused_log(ctx: &EngineContext) -> Option<Arc<crewlet_ingress::webhook::RefusedLog>> {
    let keep = ctx.config.record_refused;
    if keep == 0 {
        return None;
    }
    let dir = ctx.config.data_dir.join("refused");
    match crewlet_ingress::webhook::RefusedLog::new(dir.clone(), keep) {
        Ok(log) => Some(Arc::new(log)),
        Err(e) => {
            tracing::warn!(subsystem = "ingress", dir = %dir.display(), error = %e,
                "refused requests are not recorded: the folder cannot be made");
            None
        }
    }
}

/// Runs `attempt` until it succeeds, with backoff (250 ms doubling to 5 s),
/// for up to [`START_WITHIN`]: at start a cluster still electing its
/// leaders answers consumer requests "timed out" for a while, as it does
/// stream requests, and the node waits with `/ready` 503 instead of
/// exiting. Past that the last error is the start's.
async fn patiently<T, E, F>(what: &str, mut attempt: impl FnMut() -> F) -> Result<T, String>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let started = std::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(250);
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() < START_WITHIN => {
                warn!(subsystem = "ingress", error = %e, retry_in = ?wait, "{what} not ready yet (a cluster still electing its leaders?); retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(5));
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

/// The node's one webhook edge under the HTTP crate's webhook routes:
/// 503 + Retry-After until the engine is up, then each request's route
/// resolved once by the edge and its answer handed back to be rendered
/// (bound with the HTTP surface, before the engine is up: `crate::surface`).
pub(crate) struct NodeWebhooks(pub(crate) Late);

impl Webhooks for NodeWebhooks {
    type Route = (Arc<Edge>, Route);

    async fn resolve(
        &self,
        source: &str,
        handle: Option<&str>,
    ) -> Result<Self::Route, WebhookAnswer> {
        let Some(edge) = self.0.edge() else {
            return Err(WebhookAnswer::Starting);
        };
        match edge.resolve(source, handle) {
            Ok(route) => Ok((edge.clone(), route)),
            Err(refusal) => Err(answer(edge.refuse(source, handle, refusal).await)),
        }
    }

    fn body_cap((_, route): &Self::Route) -> u64 {
        route.body_cap()
    }

    async fn deliver(
        &self,
        (edge, route): Self::Route,
        headers: HeaderMap,
        body: Result<Bytes, BodyRefusal>,
    ) -> WebhookAnswer {
        let body = body.map_err(|refused| match refused {
            BodyRefusal::TooLarge => Refusal::TooLarge {
                cap: route.body_cap(),
            },
            BodyRefusal::Unreadable(why) => Refusal::Unreadable { why },
        });
        answer(edge.serve(&route, &headers, body).await)
    }
}

/// The edge's outcome in the HTTP crate's words.
fn answer(outcome: Outcome) -> WebhookAnswer {
    let reason = outcome.reason().unwrap_or_default();
    match outcome {
        Outcome::Accepted(trace_ids) => WebhookAnswer::Accepted { trace_ids },
        Outcome::Duplicate => WebhookAnswer::Duplicate,
        Outcome::Ignored => WebhookAnswer::Ignored,
        Outcome::Reply { content_type, body } => WebhookAnswer::Reply { content_type, body },
        Outcome::Refused(refusal) => WebhookAnswer::Refused {
            status: refusal.status().as_u16(),
            reason,
        },
        Outcome::NotRun { retry_after, .. } => WebhookAnswer::NotRun {
            reason,
            retry_after,
        },
        Outcome::Fault {
            plugin,
            blame: Blame::Guest,
        } => WebhookAnswer::Fault { plugin },
        Outcome::Unavailable(_) | Outcome::Fault { .. } => WebhookAnswer::Unavailable { reason },
    }
}

/// Starts the ingress subsystems once the engine is up: every seat's
/// mailbox (and again whenever the company changes), then the notification
/// service; answers the node's webhook edge, which may accept deliveries
/// from then on.
pub(crate) async fn start(ctx: &EngineContext, started: &mut Started) -> Result<Arc<Edge>, String> {
    let js = async_nats::jetstream::new(ctx.client.clone());
    let records = ctx.coord.records(crewlet_coord::Bucket::Mailboxes);
    if let Some(active) = ctx.active.current() {
        patiently("the seats' mailboxes", || {
            ensure_mailboxes(&js, &records, active.company.handles().map(Handle::as_str))
        })
        .await?;
    }
    let mut changes = ctx.active.subscribe();
    let js2 = js.clone();
    let watcher = tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            let next = changes.borrow_and_update().clone();
            if let Some(active) = next
                && let Err(e) =
                    ensure_mailboxes(&js2, &records, active.company.handles().map(Handle::as_str))
                        .await
            {
                warn!(subsystem = "ingress", error = %e, "mailboxes for the new company not all created");
            }
        }
    });
    started.push("mailboxes", move || {
        Box::pin(async move {
            watcher.abort();
            let _ = watcher.await;
        })
    });
    // A shedding node takes no triggers: the service follows the posture.
    let (admitting, follower) = ctx.state.watch_admission();
    let service = match patiently("the notify-inbound consumer", || {
        NotifyService::start(crewlet_ingress::notify::NotifyConfig {
            client: ctx.client.clone(),
            valve: ctx.coord.valve(),
            follows: ctx.coord.follows(),
            publisher: ctx.publisher.clone(),
            active: ctx.active.clone(),
            admitting: admitting.clone(),
        })
    })
    .await
    {
        Ok(service) => service,
        Err(e) => {
            follower.abort();
            return Err(e);
        }
    };
    started.push("notify-inbound", move || {
        Box::pin(async move {
            service.stop().await;
            follower.abort();
            let _ = follower.await;
        })
    });
    Ok(Arc::new(edge_for(ctx)))
}
