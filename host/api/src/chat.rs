//! The company chat's routes (`docs/chat.md`) over the node's [`ChatRoom`]:
//! read scope reads, write scope (or a seat's chat credential) posts.
//!
//! Rule: the author of a post is the [`Caller`] the guard put on the
//! request — an operator token or a seat's credential —, never a name the
//! body chooses; the body holds the text, the thread and an idempotency key
//! only (an unknown field is refused, so a client that sends `author`
//! learns it is not taken).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use axum::{Extension, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Caller;

/// The most messages one read answers.
pub const MAX_LIMIT: usize = 200;
/// A read's messages when it does not say.
pub const DEFAULT_LIMIT: usize = 50;

/// Why a chat call was not done (each with what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatRefusal {
    /// The request is wrong (a bad channel, an empty text): the caller's.
    Bad(String),
    /// No such thread in the channel.
    NotFound(String),
    /// The caller may not do this (a person's token named as a seat).
    Forbidden(String),
    /// Not now: the engine is starting, the module or its buckets cannot
    /// answer. Nothing was stored.
    Unavailable(String),
}

/// A read of one channel's messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    pub thread: Option<String>,
    pub limit: Option<usize>,
    pub before: Option<String>,
}

/// A post's body.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostBody {
    pub text: String,
    #[serde(default)]
    pub thread: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// A working indicator raised or cleared.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkingBody {
    #[serde(default)]
    pub thread: Option<String>,
    pub working: bool,
}

/// A post's answer: the message, and whether the key was used before.
#[derive(Debug, Clone, PartialEq)]
pub struct Posted {
    pub message: Value,
    pub duplicate: bool,
}

pub type ChatFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ChatRefusal>> + Send + 'a>>;

/// The company chat as the HTTP surface reaches it. Implemented by the node.
pub trait ChatRoom: Send + Sync + 'static {
    /// `{"channels":[{"name","messages","last_at_ms"}]}`.
    fn channels(&self) -> ChatFuture<'_, Value>;
    /// `{"messages":[…]}`, oldest first.
    fn messages(&self, channel: String, query: ReadQuery) -> ChatFuture<'_, Value>;
    /// Stores a post by `caller`, then hands it to the inbound edge.
    fn post(&self, caller: Caller, channel: String, body: PostBody) -> ChatFuture<'_, Posted>;
    /// `{"working":[{"seat","thread","since_ms"}]}`.
    fn working(&self, channel: String) -> ChatFuture<'_, Value>;
    /// Raises or clears `caller`'s working indicator.
    fn indicate(&self, caller: Caller, channel: String, body: WorkingBody)
    -> ChatFuture<'_, Value>;
}

/// The chat routes.
pub fn routes(room: Arc<dyn ChatRoom>) -> Router {
    Router::new()
        .route("/chat/channels", get(channels))
        .route(
            "/chat/channels/{channel}/messages",
            get(messages).post(post),
        )
        .route(
            "/chat/channels/{channel}/working",
            get(working).put(indicate),
        )
        .with_state(room)
}

fn refused(r: ChatRefusal) -> Response {
    let (status, error, detail) = match r {
        ChatRefusal::Bad(d) => (StatusCode::BAD_REQUEST, "bad_request", d),
        ChatRefusal::NotFound(d) => (StatusCode::NOT_FOUND, "not_found", d),
        ChatRefusal::Forbidden(d) => (StatusCode::FORBIDDEN, "forbidden", d),
        ChatRefusal::Unavailable(d) => {
            return crate::retry_later(crate::OPERATOR_RETRY_SECONDS, "chat_unavailable", d);
        }
    };
    (status, Json(json!({ "error": error, "detail": detail }))).into_response()
}

fn answer(r: Result<Value, ChatRefusal>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => refused(e),
    }
}

fn bad_body(e: impl std::fmt::Display) -> Response {
    refused(ChatRefusal::Bad(format!(
        "the body is not what this route takes ({e}); see docs/chat.md"
    )))
}

/// The guard puts a caller on every guarded request; a route mounted
/// without it refuses rather than guess an author.
fn who(caller: Option<Extension<Caller>>) -> Result<Caller, Response> {
    caller.map(|Extension(c)| c).ok_or_else(|| {
        refused(ChatRefusal::Forbidden(
            "the request carries no caller: the chat routes must sit behind the operator guard"
                .into(),
        ))
    })
}

async fn channels(State(room): State<Arc<dyn ChatRoom>>) -> Response {
    answer(room.channels().await)
}

async fn messages(
    State(room): State<Arc<dyn ChatRoom>>,
    Path(channel): Path<String>,
    query: Result<Query<ReadQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(q) => q,
        Err(e) => {
            return refused(ChatRefusal::Bad(format!(
                "the query takes `thread`, `limit` (1 to {MAX_LIMIT}) and `before` ({e})"
            )));
        }
    };
    if query.limit.is_some_and(|l| l == 0 || l > MAX_LIMIT) {
        return refused(ChatRefusal::Bad(format!(
            "`limit` must be 1 to {MAX_LIMIT}"
        )));
    }
    answer(room.messages(channel, query).await)
}

async fn post(
    State(room): State<Arc<dyn ChatRoom>>,
    caller: Option<Extension<Caller>>,
    Path(channel): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let caller = match who(caller) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let body: PostBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return bad_body(e),
    };
    match room.post(caller, channel, body).await {
        Ok(Posted {
            message,
            duplicate: false,
        }) => (StatusCode::CREATED, Json(message)).into_response(),
        Ok(Posted {
            mut message,
            duplicate: true,
        }) => {
            message["duplicate"] = Value::Bool(true);
            Json(message).into_response()
        }
        Err(e) => refused(e),
    }
}

async fn working(State(room): State<Arc<dyn ChatRoom>>, Path(channel): Path<String>) -> Response {
    answer(room.working(channel).await)
}

async fn indicate(
    State(room): State<Arc<dyn ChatRoom>>,
    caller: Option<Extension<Caller>>,
    Path(channel): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let caller = match who(caller) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match serde_json::from_slice::<WorkingBody>(&body) {
        Ok(b) => answer(room.indicate(caller, channel, b).await),
        Err(e) => bad_body(e),
    }
}
