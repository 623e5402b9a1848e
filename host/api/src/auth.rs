//! The operator guard: who may call which route.
//!
//! Rules, and why:
//! - **Default deny.** One middleware sits in front of every route; only
//!   the routes listed in [`exempt`] pass without a token — the probes
//!   (orchestrators call them with no credentials), the webhook routes
//!   (each verifies its sender's signature), the login itself and the
//!   dashboard's static files (they carry no data: every data call they
//!   make needs the session). A route added later is guarded without
//!   anyone remembering to guard it.
//! - **Scopes nest**: `read` < `write` < `admin`. A read is any GET/HEAD;
//!   anything else writes; `/tokens` needs `admin` whatever the method.
//! - **Credentials**: `Authorization: Bearer TOKEN` (API, CLI), or the
//!   session cookie `POST /login` sets (the dashboard, `/ws/stream`). The
//!   cookie holds the token itself, `HttpOnly` (no script reads it) and
//!   `SameSite=Strict` (no other site's page sends it), so revoking the
//!   token ends every session made from it.
//! - **Three answers.** The node's [`Authority`] says granted, refused, or
//!   unknown (its store has never answered, or is cut off and has never
//!   seen this token). Unknown is a 503 with `Retry-After`, never an
//!   accept and never a 401 a client would treat as final.
//! - **Refusals name the scope needed**: 401 for a missing, malformed,
//!   unknown, expired or revoked credential, 403 for a scope too small,
//!   each with `{"status","error","scope_needed"}`.
//! - **A seat's chat credential reaches the chat only**: the node may
//!   answer [`Verdict::Seat`] for a credential it minted for one seat
//!   (`docs/chat.md`); it passes on `/chat/` routes alone, and the route
//!   reads who is calling from the request's [`Caller`], never the body.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};
use serde::{Deserialize, Serialize};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "crewlet_session";
/// Seconds a client is told to wait while the token store cannot answer.
pub const UNKNOWN_RETRY_SECONDS: u64 = 2;

/// What a token lets its holder do; each scope includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Read,
    Write,
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

/// Why a presented token is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No token with this value exists in the fleet.
    Unknown,
    Expired,
    Revoked,
}

/// The node's answer about one presented token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Granted {
        id: String,
        scope: Scope,
    },
    Refused(Refused),
    /// The token store cannot say (the reason, for the 503's detail).
    Unknown(String),
    /// A seat's chat credential: good on the `/chat/` routes only, as
    /// that seat.
    Seat {
        handle: String,
    },
}

/// Who a guarded request comes from, put on the request by the guard for
/// the route to read (the author of a chat post, say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An operator token: its id and scope.
    Operator { id: String, scope: Scope },
    /// A seat, by its chat credential.
    Seat { handle: String },
}

/// The routes a seat's chat credential reaches.
pub const CHAT_PREFIX: &str = "/chat/";

/// Judges presented tokens. Implemented by the node over the fleet's
/// tokens bucket; read per request, so it must answer from memory.
pub trait Authority: Send + Sync + 'static {
    fn check(&self, token: &str) -> Verdict;
}

/// The scope a request needs.
pub fn scope_needed(method: &Method, path: &str) -> Scope {
    if path == "/tokens" || path.starts_with("/tokens/") {
        Scope::Admin
    } else if matches!(*method, Method::GET | Method::HEAD) {
        Scope::Read
    } else {
        Scope::Write
    }
}

/// The routes that pass without a token (module docs say why each).
pub fn exempt(path: &str) -> bool {
    matches!(path, "/health" | "/ready" | "/login" | "/logout" | "/")
        || path.starts_with("/webhooks/")
        || path.starts_with("/assets/")
}

/// The credential a request carries, as presented.
#[derive(Debug, PartialEq, Eq)]
enum Presented<'a> {
    None,
    Malformed(&'static str),
    Token(&'a str),
}

fn presented(headers: &HeaderMap) -> Presented<'_> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let Ok(v) = v.to_str() else {
            return Presented::Malformed("the Authorization header is not visible ASCII");
        };
        let Some((kind, token)) = v.split_once(' ') else {
            return Presented::Malformed("the Authorization header is not `Bearer TOKEN`");
        };
        if !kind.eq_ignore_ascii_case("bearer") {
            return Presented::Malformed("the Authorization header's scheme is not Bearer");
        }
        let token = token.trim();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Presented::Malformed("the Authorization header's token is empty or has spaces");
        }
        return Presented::Token(token);
    }
    match session_cookie(headers) {
        Some("") => Presented::Malformed("the session cookie is empty"),
        Some(token) => Presented::Token(token),
        None => Presented::None,
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == SESSION_COOKIE)
        .map(|(_, v)| v.trim())
}

fn refusal(status: StatusCode, error: String, needed: Scope) -> Response {
    let mut resp = (
        status,
        Json(serde_json::json!({
            "status": if status == StatusCode::FORBIDDEN { "forbidden" } else { "unauthorized" },
            "error": error,
            "scope_needed": needed.as_str(),
        })),
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"crewlet\""),
        );
    }
    resp
}

fn unauthorized(why: &str, needed: Scope) -> Box<Response> {
    Box::new(refusal(
        StatusCode::UNAUTHORIZED,
        format!(
            "{why}; send `Authorization: Bearer TOKEN` with an operator token of scope {} or above (`crewlet tokens create`), or log in on the dashboard",
            needed.as_str()
        ),
        needed,
    ))
}

/// Judges one request's credential for the scope its route needs.
pub fn judge(
    authority: &dyn Authority,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Scope, Box<Response>> {
    match caller(authority, method, path, headers)? {
        Caller::Operator { scope, .. } => Ok(scope),
        // A seat acts on the chat as a writer of its own messages.
        Caller::Seat { .. } => Ok(Scope::Write),
    }
}

/// Who one request's credential is, when it may call its route.
pub fn caller(
    authority: &dyn Authority,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Caller, Box<Response>> {
    let needed = scope_needed(method, path);
    let token = match presented(headers) {
        Presented::None => return Err(unauthorized("no operator token was sent", needed)),
        Presented::Malformed(why) => return Err(unauthorized(why, needed)),
        Presented::Token(t) => t,
    };
    match authority.check(token) {
        Verdict::Granted { scope, id } if scope >= needed => Ok(Caller::Operator { id, scope }),
        Verdict::Seat { handle } if path.starts_with(CHAT_PREFIX) => Ok(Caller::Seat { handle }),
        Verdict::Seat { handle } => Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            format!(
                "seat {handle}'s chat credential reaches only the {CHAT_PREFIX} routes; use an operator token for this call"
            ),
            needed,
        ))),
        Verdict::Granted { scope, id } => Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            format!(
                "token {id} has scope {}; this call needs {} — use a token of that scope",
                scope.as_str(),
                needed.as_str()
            ),
            needed,
        ))),
        Verdict::Refused(Refused::Unknown) => Err(unauthorized(
            "the operator token is not one this fleet issued",
            needed,
        )),
        Verdict::Refused(Refused::Expired) => {
            Err(unauthorized("the operator token has expired", needed))
        }
        Verdict::Refused(Refused::Revoked) => {
            Err(unauthorized("the operator token was revoked", needed))
        }
        Verdict::Unknown(why) => Err(Box::new(crate::retry_later(
            UNKNOWN_RETRY_SECONDS,
            "tokens_unavailable",
            format!("this node cannot check operator tokens yet ({why}); retry shortly"),
        ))),
    }
}

/// The guard middleware (module docs).
pub(crate) async fn guard(
    State(authority): State<Arc<dyn Authority>>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if exempt(path) {
        return next.run(req).await;
    }
    match caller(authority.as_ref(), req.method(), path, req.headers()) {
        Ok(who) => {
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        Err(refused) => *refused,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Login {
    token: String,
}

/// `POST /login` with `{"token": "…"}`: a valid token of any scope becomes
/// the session cookie.
pub(crate) async fn login(
    State(authority): State<Arc<dyn Authority>>,
    body: axum::body::Bytes,
) -> Response {
    let login: Login = match serde_json::from_slice(&body) {
        Ok(l) => l,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({
                    "status": "bad_request",
                    "error": "send a JSON body {\"token\": \"…\"} holding an operator token",
                })),
            )
                .into_response();
        }
    };
    let token = login.token.trim();
    if token.is_empty()
        || !token
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b';' && b != b',')
    {
        return *unauthorized(
            "the token is empty or holds characters no token has",
            Scope::Read,
        );
    }
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("checked above"),
    );
    let scope = match judge(authority.as_ref(), &Method::GET, "/login", &headers) {
        Ok(scope) => scope,
        Err(refused) => return *refused,
    };
    let cookie = format!("{SESSION_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    let mut resp =
        Json(serde_json::json!({ "status": "ok", "scope": scope.as_str() })).into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("checked above"),
    );
    resp
}

/// `GET /session` (read scope, so the guard has judged it): the scope of
/// the credential presented, for the dashboard to disable what it may not do.
pub(crate) async fn session(
    State(authority): State<Arc<dyn Authority>>,
    headers: HeaderMap,
) -> Response {
    match judge(authority.as_ref(), &Method::GET, "/session", &headers) {
        Ok(scope) => Json(serde_json::json!({ "scope": scope.as_str() })).into_response(),
        Err(refused) => *refused,
    }
}

/// `POST /logout`: the session cookie is cleared.
pub(crate) async fn logout() -> Response {
    let mut resp = Json(serde_json::json!({ "status": "ok" })).into_response();
    resp.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!(
            "{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        ))
        .expect("a fixed cookie"),
    );
    resp
}
