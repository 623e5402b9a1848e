//! The webhook routes, `POST /webhooks/{source}` and
//! `POST /webhooks/{source}/{handle}`: the HTTP half of the webhook edge.
//!
//! The rule: the edge (the node's [`Webhooks`]) resolves a request's route
//! once and says what became of it; this module reads the body — at most
//! the route's cap, refused from its declared `Content-Length` before a
//! byte is read — and builds the response from the edge's answer
//! ([`WebhookAnswer`]), so the edge itself knows no HTTP server. Bodies:
//! `{"status": "accepted", "trace_ids": […]}` (202), `{"status":
//! "duplicate" | "ignored"}` (200), the source's own reply (200),
//! `{"status": "refused", "error": …}` (4xx), `{"status": "error", "error":
//! …}` (500), and every "retry later" as [`crate::retry_later`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::json;

/// The node's webhook edge, as the routes see it.
pub trait Webhooks: Send + Sync + 'static {
    /// One request's route, resolved once: everything the edge needs to
    /// serve it.
    type Route: Send + 'static;

    /// Resolves `/webhooks/{source}[/{handle}]`, or answers the request
    /// when it has no route (not served, a bad handle, not started).
    fn resolve(
        &self,
        source: &str,
        handle: Option<&str>,
    ) -> impl Future<Output = Result<Self::Route, WebhookAnswer>> + Send;

    /// The most bytes `route`'s body may hold.
    fn body_cap(route: &Self::Route) -> u64;

    /// Serves the request on `route`: its body as read, or why it could not be.
    fn deliver(
        &self,
        route: Self::Route,
        headers: HeaderMap,
        body: Result<Bytes, BodyRefusal>,
    ) -> impl Future<Output = WebhookAnswer> + Send;
}

/// Why a request's body was not read: the sender's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyRefusal {
    /// Longer than the route's cap (declared or read).
    TooLarge,
    /// The body could not be read: why.
    Unreadable(String),
}

/// What the edge answered a webhook request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookAnswer {
    /// The engine is not up yet: 503 + Retry-After.
    Starting,
    /// On the stream: 202 with the trace ids.
    Accepted { trace_ids: Vec<String> },
    /// Every delivery was already taken: 200.
    Duplicate,
    /// Verified, nothing to deliver: 200.
    Ignored,
    /// Verified, nothing to deliver, the source's own reply: 200.
    Reply { content_type: String, body: Vec<u8> },
    /// The sender's fault: this 4xx, and why.
    Refused { status: u16, reason: String },
    /// The node cannot take it now: 503 + Retry-After.
    Unavailable { reason: String },
    /// The plugin was not run (quarantined or busy): 503, retry after this.
    NotRun {
        reason: String,
        retry_after: Duration,
    },
    /// The plugin failed: 500.
    Fault { plugin: String },
}

impl IntoResponse for WebhookAnswer {
    fn into_response(self) -> Response {
        let body = |status: StatusCode, v: serde_json::Value| (status, Json(v)).into_response();
        match self {
            WebhookAnswer::Starting => crate::retry_later(
                crate::RETRY_AFTER_SECONDS,
                "starting",
                "the node is starting; retry in a few seconds",
            ),
            WebhookAnswer::Accepted { trace_ids } => body(
                StatusCode::ACCEPTED,
                json!({ "status": "accepted", "trace_ids": trace_ids }),
            ),
            WebhookAnswer::Duplicate => body(StatusCode::OK, json!({ "status": "duplicate" })),
            WebhookAnswer::Ignored => body(StatusCode::OK, json!({ "status": "ignored" })),
            WebhookAnswer::Reply { content_type, body } => {
                let mut r = Response::new(Body::from(body));
                if let Ok(v) = HeaderValue::from_str(&content_type) {
                    r.headers_mut().insert(header::CONTENT_TYPE, v);
                }
                r
            }
            WebhookAnswer::Refused { status, reason } => body(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
                json!({ "status": "refused", "error": reason }),
            ),
            WebhookAnswer::Unavailable { reason } => {
                crate::retry_later(crate::RETRY_AFTER_SECONDS, "unavailable", reason)
            }
            WebhookAnswer::NotRun {
                reason,
                retry_after,
            } => crate::retry_later(retry_after.as_secs().max(1), "not_run", reason),
            WebhookAnswer::Fault { plugin } => body(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({ "status": "error", "error": format!("webhook plugin {plugin} failed") }),
            ),
        }
    }
}

/// The two webhook routes over `edge`.
pub fn routes<W: Webhooks>(edge: Arc<W>) -> Router {
    let with_handle = edge.clone();
    Router::new()
        .route(
            "/webhooks/{source}",
            post(move |Path(source): Path<String>, req: Request| {
                let edge = edge.clone();
                async move { serve(&*edge, &source, None, req).await }
            }),
        )
        .route(
            "/webhooks/{source}/{handle}",
            post(
                move |Path((source, handle)): Path<(String, String)>, req: Request| {
                    let edge = with_handle.clone();
                    async move { serve(&*edge, &source, Some(&handle), req).await }
                },
            ),
        )
}

/// One request: its route resolved once, its body read within the route's
/// cap, then served.
async fn serve<W: Webhooks>(
    edge: &W,
    source: &str,
    handle: Option<&str>,
    req: Request,
) -> Response {
    let route = match edge.resolve(source, handle).await {
        Ok(route) => route,
        Err(answer) => return answer.into_response(),
    };
    let (parts, body) = req.into_parts();
    let body = read_capped(&parts.headers, body, W::body_cap(&route)).await;
    edge.deliver(route, parts.headers, body)
        .await
        .into_response()
}

/// Reads at most `cap` bytes of `body`: a declared `Content-Length` past
/// the cap is refused before a byte is read.
pub async fn read_capped(headers: &HeaderMap, body: Body, cap: u64) -> Result<Bytes, BodyRefusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(BodyRefusal::TooLarge);
    }
    axum::body::to_bytes(body, usize::try_from(cap).unwrap_or(usize::MAX))
        .await
        .map_err(|e| {
            // axum reports the cap as "length limit exceeded" in the chain.
            let too_big =
                format!("{e:#} {:?}", std::error::Error::source(&e)).contains("length limit");
            if too_big {
                BodyRefusal::TooLarge
            } else {
                BodyRefusal::Unreadable(e.to_string())
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_past_the_cap_is_refused_declared_or_read() {
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, HeaderValue::from(11u64));
        let read = read_capped(&declared, Body::from("hello world"), 10).await;
        assert_eq!(read, Err(BodyRefusal::TooLarge));
        let read = read_capped(&HeaderMap::new(), Body::from("hello world"), 10).await;
        assert_eq!(read, Err(BodyRefusal::TooLarge));
        let read = read_capped(&HeaderMap::new(), Body::from("hello"), 10).await;
        assert_eq!(read, Ok(Bytes::from("hello")));
    }

    #[test]
    fn each_answer_has_its_status() {
        let cases = [
            (WebhookAnswer::Starting, 503),
            (WebhookAnswer::Accepted { trace_ids: vec![] }, 202),
            (WebhookAnswer::Duplicate, 200),
            (WebhookAnswer::Ignored, 200),
            (
                WebhookAnswer::Refused {
                    status: 401,
                    reason: "not verified".into(),
                },
                401,
            ),
            (
                WebhookAnswer::Unavailable {
                    reason: "no active company".into(),
                },
                503,
            ),
            (
                WebhookAnswer::NotRun {
                    reason: "quarantined".into(),
                    retry_after: Duration::from_secs(7),
                },
                503,
            ),
            (WebhookAnswer::Fault { plugin: "p".into() }, 500),
        ];
        for (answer, status) in cases {
            let resp = answer.clone().into_response();
            assert_eq!(resp.status().as_u16(), status, "{answer:?}");
            if status == 503 {
                assert!(
                    resp.headers().contains_key(header::RETRY_AFTER),
                    "{answer:?}"
                );
            }
        }
    }
}
