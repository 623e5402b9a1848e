//! `PUT /config` and `GET /config` over the node's [`ConfigPlane`]: bound
//! with the HTTP surface before the engine is up, answering 503 with
//! Retry-After until it is. A document is validated first (400 with every
//! error and its path), stored, then activated (201; 200 when it already
//! was); an unreadable pointer is unknown, answered 503, never "unset".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::json;

/// Largest company document `PUT /config` accepts.
pub const MAX_DOCUMENT_BYTES: usize = 512 * 1024;

pub type ConfigFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A revision activated through the pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activated {
    pub epoch: u64,
    pub digest: String,
    /// False when the pointer already named this document.
    pub moved: bool,
}

/// Why a config request was not done.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigRefusal {
    /// The node's engine is not up yet.
    Starting,
    /// The document is refused: every error with its path (`[{path, message}]`).
    Invalid(serde_json::Value),
    /// No revision was ever activated.
    NoActiveRevision,
    /// The pointer cannot be read or moved right now (what happened).
    PointerUnavailable(String),
    /// Another operator activated on every attempt (what happened).
    PointerContended(String),
    /// Coordination refused otherwise, or the stored revision is unusable.
    Failed(String),
}

/// The config plane as the HTTP surface reaches it. Implemented by the node.
pub trait ConfigPlane: Send + Sync + 'static {
    /// Validates `document` for this node, stores it, activates it.
    fn put(&self, document: String) -> ConfigFuture<'_, Result<Activated, ConfigRefusal>>;
    /// The active revision and the fleet's word on it (`GET /config`'s body).
    fn active(&self) -> ConfigFuture<'_, Result<serde_json::Value, ConfigRefusal>>;
}

/// `PUT /config` and `GET /config`.
pub fn routes(plane: Arc<dyn ConfigPlane>) -> Router {
    Router::new()
        .route("/config", get(get_config).put(put_config))
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES))
        .with_state(plane)
}

fn refused(r: ConfigRefusal) -> Response {
    let later = |error: &str, detail: String| {
        crate::retry_later(crate::OPERATOR_RETRY_SECONDS, error, detail)
    };
    match r {
        ConfigRefusal::Starting => later(
            "starting",
            "the node's engine is not up yet; retry in a few seconds".into(),
        ),
        ConfigRefusal::PointerUnavailable(detail) => later("pointer_unavailable", detail),
        ConfigRefusal::PointerContended(detail) => later("pointer_contended", detail),
        ConfigRefusal::Invalid(errors) => {
            (StatusCode::BAD_REQUEST, Json(json!({ "errors": errors }))).into_response()
        }
        ConfigRefusal::NoActiveRevision => (
            StatusCode::NOT_FOUND,
            Json(json!({
                "error": "no_active_revision",
                "detail": "no company revision has been activated; PUT /config with a company document",
            })),
        )
            .into_response(),
        ConfigRefusal::Failed(detail) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({ "error": "config_plane", "detail": detail })),
        )
            .into_response(),
    }
}

async fn put_config(State(plane): State<Arc<dyn ConfigPlane>>, body: Bytes) -> Response {
    let Ok(document) = String::from_utf8(body.to_vec()) else {
        return refused(ConfigRefusal::Invalid(json!([{
            "path": "",
            "message": "the body is not UTF-8 text; send the company document as TOML",
        }])));
    };
    match plane.put(document).await {
        Ok(a) => {
            let status = if a.moved {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let body = json!({ "epoch": a.epoch, "digest": a.digest, "activated": a.moved });
            (status, Json(body)).into_response()
        }
        Err(r) => refused(r),
    }
}

async fn get_config(State(plane): State<Arc<dyn ConfigPlane>>) -> Response {
    match plane.active().await {
        Ok(body) => Json(body).into_response(),
        Err(r) => refused(r),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::http::{Request, header};

    use super::*;

    /// Answers every request with the next refusal in line (or activates);
    /// records the documents it was handed.
    struct Scripted {
        next: Mutex<Vec<ConfigRefusal>>,
        handed: Mutex<Vec<String>>,
    }

    impl ConfigPlane for Scripted {
        fn put(&self, document: String) -> ConfigFuture<'_, Result<Activated, ConfigRefusal>> {
            self.handed.lock().unwrap().push(document);
            let next = self.next.lock().unwrap().pop();
            Box::pin(async move {
                match next {
                    Some(r) => Err(r),
                    None => Ok(Activated {
                        epoch: 3,
                        digest: "d".into(),
                        moved: true,
                    }),
                }
            })
        }

        fn active(&self) -> ConfigFuture<'_, Result<serde_json::Value, ConfigRefusal>> {
            let next = self.next.lock().unwrap().pop();
            Box::pin(async move { next.map_or_else(|| Ok(json!({"epoch": 3})), Err) })
        }
    }

    async fn send(
        app: &Router,
        method: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Option<String>, serde_json::Value) {
        let req = Request::builder()
            .method(method)
            .uri("/config")
            .body(axum::body::Body::from(body))
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
        (status, retry, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn each_refusal_is_its_status_and_unknown_is_retry_later() {
        let refusals = vec![
            ConfigRefusal::Failed("broken".into()),
            ConfigRefusal::NoActiveRevision,
            ConfigRefusal::Invalid(json!([{"path": "org", "message": "missing"}])),
            ConfigRefusal::PointerContended("raced".into()),
            ConfigRefusal::PointerUnavailable("cut off".into()),
            ConfigRefusal::Starting,
        ];
        let plane = Arc::new(Scripted {
            next: Mutex::new(refusals),
            handed: Mutex::new(Vec::new()),
        });
        let app = routes(plane.clone());
        let expected = [
            (StatusCode::SERVICE_UNAVAILABLE, Some("2"), "starting"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("2"),
                "pointer_unavailable",
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("2"),
                "pointer_contended",
            ),
        ];
        for (status, retry, error) in expected {
            let got = send(&app, "GET", Vec::new()).await;
            assert_eq!((got.0, got.1.as_deref()), (status, retry), "{}", got.2);
            assert_eq!(got.2["error"], error);
        }
        let invalid = send(&app, "PUT", b"[org]".to_vec()).await;
        assert_eq!(invalid.0, StatusCode::BAD_REQUEST);
        assert_eq!(invalid.2["errors"][0]["path"], "org");
        let none = send(&app, "GET", Vec::new()).await;
        assert_eq!(none.0, StatusCode::NOT_FOUND);
        assert_eq!(none.2["error"], "no_active_revision");
        let failed = send(&app, "GET", Vec::new()).await;
        assert_eq!(failed.0, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.2["error"], "config_plane");
        let made = send(&app, "PUT", b"[org]".to_vec()).await;
        assert_eq!(made.0, StatusCode::CREATED, "a move is 201");
        assert_eq!(made.2["activated"], true);
    }

    #[tokio::test]
    async fn a_body_that_is_not_text_is_refused_before_the_plane_is_asked() {
        let plane = Arc::new(Scripted {
            next: Mutex::new(Vec::new()),
            handed: Mutex::new(Vec::new()),
        });
        let app = routes(plane.clone());
        let (status, _, body) = send(&app, "PUT", vec![0xff, 0xfe]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("UTF-8")
        );
        assert!(plane.handed.lock().unwrap().is_empty());
    }
}
