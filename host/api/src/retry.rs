//! 503 + `Retry-After`: the one answer for "not now, come back".
//!
//! The rule: a request the node cannot serve *yet* — the engine is starting,
//! the bus or a bucket is unreachable, the node drains — is answered 503 with
//! `Retry-After` in whole seconds and one body,
//! `{"status": "unavailable", "error": KIND, "detail": TEXT}`: `error` a
//! short kind a program can match, `detail` what happened and what to do. A
//! sender, the CLI and the dashboard then treat every such refusal the same
//! way. The delay is the caller's, because how soon each cause passes
//! differs (a reconnect in seconds, a drain only on a peer).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};

/// 503 with `Retry-After: retry_after_secs` and the one body (module docs).
pub fn retry_later(retry_after_secs: u64, error: &str, detail: impl Into<String>) -> Response {
    let body = serde_json::json!({
        "status": "unavailable",
        "error": error,
        "detail": detail.into(),
    });
    let mut resp = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_503_with_the_delay_and_the_one_body() {
        let resp = retry_later(2, "starting", "the node's engine is not up yet");
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "status": "unavailable",
                "error": "starting",
                "detail": "the node's engine is not up yet",
            })
        );
    }
}
