//! The HTTP surface of a node.
//!
//! It binds before the engine starts, so probes (and later the dashboard,
//! the REST plane and every webhook route) answer while the engine is still
//! coming up. Two probes answer two different questions: `/health` says how
//! the node is, and stays 200 through a drain so an orchestrator does not kill
//! the turns the drain exists to finish; `/ready` says whether to send it
//! work, and names the state it answered from (`state` on a 200, `reason`
//! on a 503; the node's table of states is in `crewlet_node::state`): 503
//! while starting, from the first moment of a drain, on the config
//! postures `shed` and `stuck`, and once the stream has been down longer
//! than its bound — never on `wait`, `isolated` or a short stream outage,
//! since failing readiness on what the whole fleet shares (rollout lag, a
//! broker blip) takes every node out of rotation at once. While draining,
//! every webhook and every write answers 503 with `Retry-After` (new work
//! goes to a peer); reads go on.
//!
//! `/ws/stream` is the dashboard's one read channel: live events pushed
//! from the fleet-wide broadcast, and a query channel on the same socket. It
//! carries no write.

pub mod auth;
pub mod backup;
pub mod chat;
pub mod config;
mod dashboard;
pub mod edge;
pub mod fleet;
pub mod hosts;
pub mod memory;
pub mod metrics;
pub mod module_state;
pub mod operator;
pub mod pauses;
mod retry;
pub mod secrets;
pub mod stream;
pub mod tokens;
pub mod usage;
pub mod webhooks;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::sync::watch;

pub use auth::{Authority, Caller, Refused, Scope, Verdict};
pub use backup::{BackupRefusal, BackupSource};
pub use chat::{ChatRefusal, ChatRoom};
pub use config::{Activated, ConfigPlane, ConfigRefusal};
pub use edge::{EdgeLimits, RefusalPace};
pub use fleet::{FleetView, Unavailable};
pub use hosts::AllowedHosts;
pub use memory::{MemoryRefusal, SeatMemory};
pub use metrics::{MetricsSource, Scraped};
pub use module_state::{ModuleStates, StateRefusal};
pub use pauses::{PauseRefusal, SeatPausing};
pub use retry::retry_later;
pub use stream::{EventFilter, EventSource};
pub use tokens::{TokenAdmin, TokenFailure};

/// Seconds a webhook sender (or any caller of a draining node) is told to
/// wait before retrying: senders retry on schedules of their own, and a
/// node that is starting, draining or cannot reach its store is rarely
/// back within less.
pub const RETRY_AFTER_SECONDS: u64 = 5;
/// Seconds an operator's request (config, secrets, budgets) is told to
/// wait: the engine comes up, or coordination answers again, within
/// seconds, and a person is waiting.
pub const OPERATOR_RETRY_SECONDS: u64 = 2;

/// What the node tells its probes. Implemented by the node, read per request.
pub trait Probe: Send + Sync + 'static {
    /// The body of `/health`: the node's posture, as JSON.
    fn health(&self) -> serde_json::Value;
    /// Whether to route work here: the state it takes work in, or the
    /// reason it does not.
    fn ready(&self) -> Result<Ready, NotReady>;
    /// True from the first moment of a drain.
    fn draining(&self) -> bool;
}

/// The state a node that answers `/ready` 200 is in (the body's `state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum Ready {
    /// Connected, serving the fleet's active epoch (or nothing is active).
    Serving,
    /// Config posture `wait`: behind the pointer while no peer has its
    /// epoch (or not for long); serving what it applied.
    Wait,
    /// Config posture `isolated`: the pointer cannot be read; serving what
    /// it applied.
    Isolated,
    /// The stream connection has been down for `down_ms`, less than the
    /// `steps_out_after_ms` bound: a blip the whole fleet may share.
    Disconnected {
        down_ms: u64,
        steps_out_after_ms: u64,
    },
}

/// Why `/ready` answers 503 (the body's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum NotReady {
    /// The engine is still coming up.
    Starting,
    /// The stream connection has been down for `down_ms`, at least the
    /// `steps_out_after_ms` bound.
    StreamDisconnected {
        down_ms: u64,
        steps_out_after_ms: u64,
    },
    /// The node is draining and takes no new work.
    Draining,
    /// Config posture `shed`: peers hold the active epoch this node cannot
    /// apply, so its work goes to them.
    Shed,
    /// Config posture `stuck`: this node has failed to apply the active
    /// revision for longer than the reconciler's bound.
    Stuck,
}

/// Read-only views of the company and the node's catalogue.
pub trait Catalog: Send + Sync + 'static {
    /// The org, its roles and seats; `None` while no company is loaded.
    fn org(&self) -> Option<serde_json::Value>;
    /// Loaded plugins with their grants and health, those that failed, and
    /// module buckets with what they hold; `None` while no plugins are
    /// loaded.
    fn plugins(&self) -> PluginsFuture<'_>;
}

/// What [`Catalog::plugins`] answers (it reads the buckets' usage).
pub type PluginsFuture<'a> =
    std::pin::Pin<Box<dyn Future<Output = Option<serde_json::Value>> + Send + 'a>>;

/// What the HTTP surface reads the node through.
#[derive(Clone)]
pub struct Surface {
    pub probe: Arc<dyn Probe>,
    pub events: Arc<dyn EventSource>,
    pub catalog: Arc<dyn Catalog>,
    /// Flips to `true` when the listener is closing: long-lived sockets end.
    pub closing: watch::Receiver<bool>,
    /// Further routes (webhooks, the config plane), served under the same
    /// drain gate and the same guard.
    pub routes: Router,
    /// Routes every node serves whatever its roles (`/metrics`), behind
    /// the guard — beside the probes on a node without `ingress`.
    pub every_node: Router,
    /// Judges operator tokens for every route but the exempt ones.
    pub authority: Arc<dyn Authority>,
    /// The `Host` names this node answers to.
    pub allowed_hosts: AllowedHosts,
}

#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) probe: Arc<dyn Probe>,
    pub(crate) events: Arc<dyn EventSource>,
    pub(crate) catalog: Arc<dyn Catalog>,
    pub(crate) closing: watch::Receiver<bool>,
}

/// The router: probes, the read channel, the login, and — outermost
/// first — the `Host` allow-list, the operator guard and the drain gate.
pub fn router(surface: Surface) -> Router {
    let surface_routes = surface.routes.merge(surface.every_node);
    let authority = surface.authority;
    let allowed_hosts = Arc::new(surface.allowed_hosts);
    let shared = Shared {
        probe: surface.probe,
        events: surface.events,
        catalog: surface.catalog,
        closing: surface.closing,
    };
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/events", get(stream::list_events))
        .route("/org", get(org))
        .route("/plugins", get(plugins))
        .route("/", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::asset))
        .route("/ws/stream", get(stream::ws_stream))
        .fallback(not_found)
        .with_state(shared.clone())
        .merge(
            Router::new()
                .route("/login", axum::routing::post(auth::login))
                .route("/logout", axum::routing::post(auth::logout))
                .route("/session", get(auth::session))
                .with_state(authority.clone()),
        )
        .merge(surface_routes)
        .layer(middleware::from_fn_with_state(shared, drain_gate))
        .layer(middleware::from_fn_with_state(authority, auth::guard))
        .layer(middleware::from_fn_with_state(allowed_hosts, hosts::gate))
}

/// The router of a node without the `ingress` role: `/health` and
/// `/ready`, and the guarded `every_node` routes (behind the `Host`
/// allow-list); every other path answers
/// 404 naming the reason, so an operator pointed at the wrong node learns
/// it at once.
pub fn probes_router(surface: Surface) -> Router {
    let allowed_hosts = Arc::new(surface.allowed_hosts);
    let shared = Shared {
        probe: surface.probe,
        events: surface.events,
        catalog: surface.catalog,
        closing: surface.closing,
    };
    let every_node = surface
        .every_node
        .route_layer(middleware::from_fn_with_state(
            surface.authority,
            auth::guard,
        ));
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(not_served)
        .with_state(shared)
        .merge(every_node)
        .layer(middleware::from_fn_with_state(allowed_hosts, hosts::gate))
}

async fn not_served() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": "no such route",
            "detail": "this node has no `ingress` role (node.roles): it serves only /health and /ready; send webhooks and operator requests to an ingress node"
        })),
    )
        .into_response()
}

/// Serves `router` on `listener` under `limits` until `shutdown`
/// resolves, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: EdgeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    edge::serve(listener, router, limits, shutdown).await
}

async fn health(State(s): State<Shared>) -> Json<serde_json::Value> {
    Json(s.probe.health())
}

async fn ready(State(s): State<Shared>) -> Response {
    // `{"ready": …}` beside the answer's own fields (its tag included).
    let body = |ready: bool, answer: serde_json::Value| {
        let mut body = serde_json::Map::from_iter([("ready".to_owned(), ready.into())]);
        if let serde_json::Value::Object(fields) = answer {
            body.extend(fields);
        }
        Json(serde_json::Value::Object(body))
    };
    match s.probe.ready() {
        Ok(state) => body(true, serde_json::json!(state)).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            body(false, serde_json::json!(reason)),
        )
            .into_response(),
    }
}

async fn org(State(s): State<Shared>) -> Response {
    match s.catalog.org() {
        Some(org) => Json(org).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({
                "error": "no company is active on this node",
                "detail": "start the node with --company FILE"
            })),
        )
            .into_response(),
    }
}

async fn plugins(State(s): State<Shared>) -> Response {
    match s.catalog.plugins().await {
        Some(view) => Json(view).into_response(),
        None => Json(serde_json::json!({
            "plugins": [],
            "failed": [],
            "orphaned_buckets": [],
            "detail": "no plugins directory on this node (start it with --plugins DIR)"
        }))
        .into_response(),
    }
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({ "error": "no such route" })),
    )
        .into_response()
}

/// From the first moment of a drain, new work is refused: every webhook and
/// every write. Reads (probes, the dashboard, queries) go on being answered
/// while the turns in flight finish.
async fn drain_gate(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let read =
        matches!(*req.method(), Method::GET | Method::HEAD) && !path.starts_with("/webhooks/");
    if s.probe.draining() && !read {
        return retry_later(
            RETRY_AFTER_SECONDS,
            "draining",
            "this node is shutting down and takes no new work; retry against a peer",
        );
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// 0 starting, 1 ready, 2 draining, 3 a short stream outage, 4 a long one.
    struct Fixed(AtomicU8);

    impl Probe for Fixed {
        fn health(&self) -> serde_json::Value {
            serde_json::json!({ "status": "ok" })
        }
        fn ready(&self) -> Result<Ready, NotReady> {
            match self.0.load(Ordering::SeqCst) {
                0 => Err(NotReady::Starting),
                1 => Ok(Ready::Serving),
                3 => Ok(Ready::Disconnected {
                    down_ms: 700,
                    steps_out_after_ms: 15_000,
                }),
                4 => Err(NotReady::StreamDisconnected {
                    down_ms: 15_000,
                    steps_out_after_ms: 15_000,
                }),
                _ => Err(NotReady::Draining),
            }
        }
        fn draining(&self) -> bool {
            self.0.load(Ordering::SeqCst) == 2
        }
    }

    /// `admin-t`, `write-t`, `read-t` by scope; `gone-t` revoked; `old-t`
    /// expired; `later-t` unknown (the store cannot say); anything else
    /// unknown to the fleet.
    struct Tokens;

    impl Authority for Tokens {
        fn check(&self, token: &str) -> Verdict {
            let granted = |scope| Verdict::Granted {
                id: token.into(),
                scope,
            };
            match token {
                "admin-t" => granted(Scope::Admin),
                "write-t" => granted(Scope::Write),
                "read-t" => granted(Scope::Read),
                "gone-t" => Verdict::Refused(Refused::Revoked),
                "old-t" => Verdict::Refused(Refused::Expired),
                "later-t" => Verdict::Unknown("the tokens bucket is unreachable".into()),
                "seat-t" => Verdict::Seat {
                    handle: "grace".into(),
                },
                _ => Verdict::Refused(Refused::Unknown),
            }
        }
    }

    fn app(probe: Arc<dyn Probe>) -> Router {
        app_with(router, probe)
    }

    fn app_with(serve: fn(Surface) -> Router, probe: Arc<dyn Probe>) -> Router {
        let (_closing_tx, closing) = watch::channel(false);
        serve(Surface {
            probe,
            events: Arc::new(NoEvents),
            catalog: Arc::new(NoEvents),
            closing,
            routes: Router::new()
                .route("/secrets/{name}", axum::routing::put(|| async { "set" }))
                .route("/tokens", get(|| async { "tokens" }))
                .route(
                    "/chat/who",
                    get(|axum::Extension(who): axum::Extension<Caller>| async move {
                        serde_json::to_string(&format!("{who:?}")).unwrap()
                    }),
                ),
            every_node: Router::new().route("/metrics", get(|| async { "\"metrics\"" })),
            authority: Arc::new(Tokens),
            allowed_hosts: AllowedHosts::new(std::net::IpAddr::from([127, 0, 0, 1]), &[]),
        })
    }

    async fn send(
        app: &Router,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp =
            tower::ServiceExt::oneshot(app.clone(), req.body(axum::body::Body::empty()).unwrap())
                .await
                .unwrap();
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    #[tokio::test]
    async fn a_node_without_ingress_serves_every_node_routes_behind_the_guard() {
        const HOST: (&str, &str) = ("host", "127.0.0.1:7420");
        let probes = app_with(probes_router, Arc::new(Fixed(AtomicU8::new(1))));
        let (status, _) = send(&probes, "GET", "/metrics", &[HOST]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, body) = send(
            &probes,
            "GET",
            "/metrics",
            &[HOST, ("authorization", "Bearer read-t")],
        )
        .await;
        assert_eq!(
            (status, body),
            (StatusCode::OK, serde_json::json!("metrics"))
        );
        let (status, _) = send(
            &probes,
            "GET",
            "/tokens",
            &[HOST, ("authorization", "Bearer admin-t")],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "only the every-node routes");
        let (status, _) = send(&probes, "GET", "/health", &[HOST]).await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = send(
            &app(Arc::new(Fixed(AtomicU8::new(1)))),
            "GET",
            "/metrics",
            &[HOST, ("authorization", "Bearer read-t")],
        )
        .await;
        assert_eq!(
            (status, body),
            (StatusCode::OK, serde_json::json!("metrics"))
        );
    }

    #[tokio::test]
    async fn every_route_but_the_exempt_ones_needs_a_token_of_its_scope() {
        let app = app(Arc::new(Fixed(AtomicU8::new(1))));
        let host = ("host", "127.0.0.1:7420");
        // Exempt: probes, static dashboard files, webhooks (404 here: none mounted).
        assert_eq!(
            send(&app, "GET", "/health", &[host]).await.0,
            StatusCode::OK
        );
        assert_eq!(send(&app, "GET", "/", &[host]).await.0, StatusCode::OK);
        assert_eq!(
            send(&app, "POST", "/webhooks/github", &[host]).await.0,
            StatusCode::NOT_FOUND
        );
        // A route nobody listed is guarded too, unknown paths included.
        for path in ["/org", "/events", "/nowhere", "/operator/mcp"] {
            let (status, body) = send(&app, "GET", path, &[host]).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
            assert_eq!(body["scope_needed"], "read", "{path}");
        }
        for bad in ["Bearer", "Basic abc", "Bearer a b", "token read-t"] {
            let (status, body) = send(&app, "GET", "/org", &[host, ("authorization", bad)]).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{bad}: {body}");
            assert_eq!(body["status"], "unauthorized");
        }
        for (token, says) in [
            ("nope", "not one this fleet"),
            ("gone-t", "revoked"),
            ("old-t", "expired"),
        ] {
            let auth = format!("Bearer {token}");
            let (status, body) = send(&app, "GET", "/org", &[host, ("authorization", &auth)]).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(body["error"].as_str().unwrap().contains(says), "{body}");
        }
        let (status, _) = send(
            &app,
            "GET",
            "/org",
            &[host, ("authorization", "Bearer later-t")],
        )
        .await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "unknown is never an accept"
        );

        let read = ("authorization", "Bearer read-t");
        // The dashboard learns what its session may do; its files need none.
        let (status, body) = send(&app, "GET", "/session", &[host, read]).await;
        assert_eq!(
            (status, body["scope"].as_str()),
            (StatusCode::OK, Some("read"))
        );
        assert_eq!(
            send(&app, "GET", "/session", &[host]).await.0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            send(&app, "GET", "/assets/org.js", &[host]).await.0,
            StatusCode::OK
        );
        assert_eq!(
            send(&app, "GET", "/assets/none.js", &[host]).await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            send(&app, "GET", "/org", &[host, read]).await.0,
            StatusCode::SERVICE_UNAVAILABLE,
            "passes the guard; no company here"
        );
        let (status, body) = send(&app, "PUT", "/secrets/X", &[host, read]).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert_eq!(body["scope_needed"], "write");
        let write = ("authorization", "Bearer write-t");
        assert_eq!(
            send(&app, "PUT", "/secrets/X", &[host, write]).await.0,
            StatusCode::OK
        );
        let (status, body) = send(&app, "GET", "/tokens", &[host, write]).await;
        assert_eq!(
            (status, body["scope_needed"].as_str()),
            (StatusCode::FORBIDDEN, Some("admin"))
        );
        let admin = ("authorization", "Bearer admin-t");
        assert_eq!(
            send(&app, "GET", "/tokens", &[host, admin]).await.0,
            StatusCode::OK
        );
        // The session cookie stands for the bearer header.
        let cookie = ("cookie", "theme=dark; crewlet_session=write-t");
        assert_eq!(
            send(&app, "PUT", "/secrets/X", &[host, cookie]).await.0,
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn a_seats_chat_credential_reaches_the_chat_routes_alone_as_that_seat() {
        const HOST: (&str, &str) = ("host", "127.0.0.1:7420");
        let app = app(Arc::new(Fixed(AtomicU8::new(1))));
        let seat = [HOST, ("authorization", "Bearer seat-t")];
        let (status, who) = send(&app, "GET", "/chat/who", &seat).await;
        assert_eq!(
            (status, who),
            (
                StatusCode::OK,
                serde_json::json!("Seat { handle: \"grace\" }")
            )
        );
        for path in ["/tokens", "/metrics", "/events"] {
            let (status, body) = send(&app, "GET", path, &seat).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
            assert!(body["error"].as_str().unwrap().contains("/chat/"), "{body}");
        }
        let reader = [HOST, ("authorization", "Bearer read-t")];
        let (_, who) = send(&app, "GET", "/chat/who", &reader).await;
        assert_eq!(
            who,
            serde_json::json!("Operator { id: \"read-t\", scope: Read }")
        );
    }

    #[tokio::test]
    async fn login_turns_a_valid_token_into_a_strict_http_only_cookie() {
        let app = app(Arc::new(Fixed(AtomicU8::new(1))));
        let post = |body: &'static str| {
            Request::builder()
                .method("POST")
                .uri("/login")
                .header("host", "localhost")
                .body(axum::body::Body::from(body))
                .unwrap()
        };
        let resp = tower::ServiceExt::oneshot(app.clone(), post(r#"{"token":"read-t"}"#))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let cookie = resp.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(cookie.starts_with("crewlet_session=read-t;"), "{cookie}");
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        for (body, status) in [
            (r#"{"token":"gone-t"}"#, StatusCode::UNAUTHORIZED),
            (r#"{"token":"nope"}"#, StatusCode::UNAUTHORIZED),
            (r#"{"token":"a;b"}"#, StatusCode::UNAUTHORIZED),
            ("token=read-t", StatusCode::BAD_REQUEST),
        ] {
            let resp = tower::ServiceExt::oneshot(app.clone(), post(body))
                .await
                .unwrap();
            assert_eq!(resp.status(), status, "{body}");
            assert!(resp.headers().get(header::SET_COOKIE).is_none(), "{body}");
        }
    }

    #[tokio::test]
    async fn a_foreign_host_is_refused_naming_the_header_but_webhooks_pass() {
        let app = app(Arc::new(Fixed(AtomicU8::new(1))));
        let evil = ("host", "evil.example.com");
        let admin = ("authorization", "Bearer admin-t");
        for path in ["/health", "/tokens", "/"] {
            let (status, body) = send(&app, "GET", path, &[evil, admin]).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
            assert_eq!(body["header"], "host");
        }
        assert_eq!(
            send(&app, "POST", "/webhooks/github", &[evil]).await.0,
            StatusCode::NOT_FOUND,
            "webhooks prove themselves by signature"
        );
    }

    async fn call(app: &Router, method: &str, path: &str) -> (StatusCode, Option<String>, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("authorization", "Bearer admin-t")
            .body(axum::body::Body::empty())
            .unwrap();
        let resp = tower::ServiceExt::oneshot(app.clone(), req).await.unwrap();
        let status = resp.status();
        let retry = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, retry, String::from_utf8(body.to_vec()).unwrap())
    }

    struct NoEvents;

    impl Catalog for NoEvents {
        fn org(&self) -> Option<serde_json::Value> {
            None
        }
        fn plugins(&self) -> PluginsFuture<'_> {
            Box::pin(async { None })
        }
    }

    impl EventSource for NoEvents {
        fn live(&self) -> Option<tokio::sync::broadcast::Receiver<Arc<str>>> {
            None
        }
        fn query(&self, _: EventFilter) -> stream::QueryFuture {
            Box::pin(async { Ok(serde_json::json!([])) })
        }
    }

    #[tokio::test]
    async fn probes_follow_the_node_and_drain_refuses_work() {
        let probe = Arc::new(Fixed(AtomicU8::new(0)));
        let app = app(probe.clone());

        assert_eq!(call(&app, "GET", "/health").await.0, StatusCode::OK);
        let (status, _, body) = call(&app, "GET", "/ready").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("starting"), "{body}");

        probe.0.store(1, Ordering::SeqCst);
        let (status, _, body) = call(&app, "GET", "/ready").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"ready": true, "state": "serving"})
        );
        // The answer names its state and carries its facts.
        probe.0.store(3, Ordering::SeqCst);
        let (status, _, body) = call(&app, "GET", "/ready").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"ready": true, "state": "disconnected",
                "down_ms": 700, "steps_out_after_ms": 15_000})
        );
        probe.0.store(4, Ordering::SeqCst);
        let (status, _, body) = call(&app, "GET", "/ready").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"ready": false, "reason": "stream_disconnected",
                "down_ms": 15_000, "steps_out_after_ms": 15_000})
        );
        probe.0.store(1, Ordering::SeqCst);
        assert_eq!(
            call(&app, "POST", "/webhooks/github").await.0,
            StatusCode::NOT_FOUND
        );

        probe.0.store(2, Ordering::SeqCst);
        assert_eq!(call(&app, "GET", "/health").await.0, StatusCode::OK);
        assert_eq!(
            call(&app, "GET", "/ready").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let (status, retry, _) = call(&app, "POST", "/webhooks/github").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry.as_deref(), Some("5"));
        assert_eq!(
            call(&app, "GET", "/webhooks/github").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // Reads go on while the turns in flight finish.
        let (status, _, page) = call(&app, "GET", "/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            page.contains("/ws/stream") || page.contains("app.js"),
            "{page}"
        );
    }
}
