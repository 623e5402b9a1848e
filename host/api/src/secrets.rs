//! `PUT`/`DELETE /secrets/{name}`, `GET /secrets` and
//! `POST /secrets/rotate-key` (write scope; reads too) over the node's
//! [`SecretsAdmin`]. A value is never echoed or listed: the answers hold
//! names and update times only. A bad name is 400, a value past the cap
//! 413 (naming the secret), an unreachable bucket 503 with Retry-After
//! (nothing changed).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post, put};
use serde_json::{Value, json};

/// Why a secrets request was not done (each with what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRefusal {
    /// The node's engine is not up yet.
    Starting,
    /// 400: a bad name, or a value that is not text.
    BadRequest(String),
    /// 413: the value is past the cap.
    TooLarge(String),
    /// 404: no secret of that name is set.
    NoSuchSecret(String),
    /// 503: the bucket or the keyring cannot serve now.
    Unavailable(String),
    /// 500: a stored value or the keyring is broken.
    Failed(String),
}

pub type SecretFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, SecretRefusal>> + Send + 'a>>;

/// The company's secrets as the HTTP surface reaches them. Implemented by
/// the node.
pub trait SecretsAdmin: Send + Sync + 'static {
    /// Whether `name` follows the rule for secret names (checked first,
    /// engine or not).
    fn check_name(&self, name: &str) -> Result<(), SecretRefusal>;
    fn set(&self, name: String, value: Bytes) -> SecretFuture<'_, ()>;
    /// Whether a secret of that name was set.
    fn remove(&self, name: String) -> SecretFuture<'_, bool>;
    /// `{"secrets": […], "outside_bucket": […], "precedence": …}`.
    fn list(&self) -> SecretFuture<'_, Value>;
    /// What the rotation did.
    fn rotate_key(&self) -> SecretFuture<'_, Value>;
}

/// The secrets routes; a body past `max_value_bytes` is refused by the
/// handler (413 naming the secret), one byte past it by the layer.
pub fn routes(admin: Arc<dyn SecretsAdmin>, max_value_bytes: usize) -> Router {
    Router::new()
        .route("/secrets", get(list))
        .route("/secrets/rotate-key", post(rotate_key))
        .route("/secrets/{name}", put(set).delete(remove))
        .layer(DefaultBodyLimit::max(max_value_bytes + 1))
        .with_state(admin)
}

fn refused(r: SecretRefusal) -> Response {
    let (status, kind, detail) = match r {
        SecretRefusal::Starting => (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting",
            "the node's engine is not up yet; retry in a few seconds".to_owned(),
        ),
        SecretRefusal::BadRequest(d) => (StatusCode::BAD_REQUEST, "secrets", d),
        SecretRefusal::TooLarge(d) => (StatusCode::PAYLOAD_TOO_LARGE, "secrets", d),
        SecretRefusal::NoSuchSecret(d) => (StatusCode::NOT_FOUND, "no_such_secret", d),
        SecretRefusal::Unavailable(d) => (StatusCode::SERVICE_UNAVAILABLE, "secrets", d),
        SecretRefusal::Failed(d) => (StatusCode::INTERNAL_SERVER_ERROR, "secrets", d),
    };
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return crate::retry_later(crate::OPERATOR_RETRY_SECONDS, kind, detail);
    }
    (status, Json(json!({ "error": kind, "detail": detail }))).into_response()
}

async fn set(
    State(admin): State<Arc<dyn SecretsAdmin>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = admin.check_name(&name) {
        return refused(r);
    }
    match admin.set(name, body).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(r) => refused(r),
    }
}

async fn remove(State(admin): State<Arc<dyn SecretsAdmin>>, Path(name): Path<String>) -> Response {
    if let Err(r) = admin.check_name(&name) {
        return refused(r);
    }
    match admin.remove(name.clone()).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => refused(SecretRefusal::NoSuchSecret(format!(
            "no secret named {name} is set; `crewlet secrets list` shows the names"
        ))),
        Err(r) => refused(r),
    }
}

async fn rotate_key(State(admin): State<Arc<dyn SecretsAdmin>>) -> Response {
    match admin.rotate_key().await {
        Ok(done) => Json(json!({ "rotation": done })).into_response(),
        Err(r) => refused(r),
    }
}

async fn list(State(admin): State<Arc<dyn SecretsAdmin>>) -> Response {
    match admin.list().await {
        Ok(v) => Json(v).into_response(),
        Err(r) => refused(r),
    }
}
