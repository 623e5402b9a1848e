//! `POST /backup` (admin scope, see `auth`) over the node's
//! [`BackupSource`]: `{"dir": "/abs/path"}` writes one artefact directory
//! on the node's machine and answers its manifest. A `dir` that is not
//! absolute is 400; a directory that cannot be written (not empty, not
//! writable) is 409; a node still starting or a broker that did not answer
//! is 503 with Retry-After.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::post;
use axum::{Router, extract::rejection::JsonRejection};
use serde::Deserialize;
use serde_json::{Value, json};

/// The body of `POST /backup`.
#[derive(Debug, Deserialize)]
struct BackupBody {
    dir: PathBuf,
}

/// Why a backup was not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupRefusal {
    /// The node's engine is not up yet: ask again in a moment.
    Starting,
    /// The artefact directory cannot be written (the operator's to fix).
    Write(String),
    /// The broker or the estate did not answer: retry.
    Unavailable(String),
}

/// The manifest written, or why not.
pub type BackupFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, BackupRefusal>> + Send + 'a>>;

/// What the node does for `POST /backup`.
pub trait BackupSource: Send + Sync + 'static {
    /// Writes the artefact into `dir` (absolute, checked here).
    fn back_up(&self, dir: PathBuf) -> BackupFuture<'_>;
}

pub fn routes(source: Arc<dyn BackupSource>) -> Router {
    Router::new()
        .route("/backup", post(back_up))
        .with_state(source)
}

async fn back_up(
    State(source): State<Arc<dyn BackupSource>>,
    body: Result<Json<BackupBody>, JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => return rejection.into_response(),
    };
    if !body.dir.is_absolute() {
        let e = "`dir` must be an absolute path on the node's machine";
        return (StatusCode::BAD_REQUEST, Json(json!({ "error": e }))).into_response();
    }
    match source.back_up(body.dir).await {
        Ok(manifest) => (StatusCode::OK, Json(manifest)).into_response(),
        Err(BackupRefusal::Starting) => crate::retry_later(
            crate::OPERATOR_RETRY_SECONDS,
            "the node is still starting",
            "ask again in a moment",
        ),
        Err(BackupRefusal::Write(e)) => {
            (StatusCode::CONFLICT, Json(json!({ "error": e }))).into_response()
        }
        Err(BackupRefusal::Unavailable(e)) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": e }))).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, header};
    use std::sync::Mutex;
    use tower::ServiceExt;

    /// Answers `answer` and keeps the dirs it was asked for.
    struct Source {
        answer: Result<Value, BackupRefusal>,
        asked: Mutex<Vec<PathBuf>>,
    }

    impl BackupSource for Source {
        fn back_up(&self, dir: PathBuf) -> BackupFuture<'_> {
            self.asked.lock().unwrap().push(dir);
            let answer = self.answer.clone();
            Box::pin(async move { answer })
        }
    }

    async fn post(answer: Result<Value, BackupRefusal>, dir: &str) -> (u16, bool, Vec<PathBuf>) {
        let source = Arc::new(Source {
            answer,
            asked: Mutex::new(Vec::new()),
        });
        let request = Request::post("/backup")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json!({ "dir": dir }).to_string()))
            .unwrap();
        let resp = routes(source.clone()).oneshot(request).await.unwrap();
        let retry = resp.headers().contains_key(header::RETRY_AFTER);
        let asked = source.asked.lock().unwrap().clone();
        (resp.status().as_u16(), retry, asked)
    }

    #[tokio::test]
    async fn each_answer_has_its_status_and_a_relative_dir_never_reaches_the_node() {
        let (status, _, asked) = post(Ok(json!({"files": []})), "relative/dir").await;
        assert_eq!((status, asked.len()), (400, 0));
        let (status, _, asked) = post(Ok(json!({"files": []})), "/abs/dir").await;
        assert_eq!((status, asked), (200, vec![PathBuf::from("/abs/dir")]));
        let (status, retry, _) = post(Err(BackupRefusal::Starting), "/abs/dir").await;
        assert_eq!((status, retry), (503, true));
        let (status, _, _) = post(Err(BackupRefusal::Write("full".into())), "/abs/dir").await;
        assert_eq!(status, 409);
        let (status, _, _) = post(Err(BackupRefusal::Unavailable("nats".into())), "/a").await;
        assert_eq!(status, 503);
    }
}
