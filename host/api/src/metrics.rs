//! `GET /metrics` (scope `read`, on every node whatever its roles) over the
//! node's [`MetricsSource`]: 503 with Retry-After until the engine is up.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::Unavailable;

/// One scrape's text and its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scraped {
    pub content_type: &'static str,
    pub body: String,
}

/// The node's metrics as the HTTP surface reaches them. Implemented by the node.
pub trait MetricsSource: Send + Sync + 'static {
    /// Renders every metric now.
    fn scrape(&self) -> Result<Scraped, Unavailable>;
}

/// `GET /metrics`.
pub fn routes(source: Arc<dyn MetricsSource>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .with_state(source)
}

async fn scrape(State(source): State<Arc<dyn MetricsSource>>) -> Response {
    match source.scrape() {
        Ok(s) => ([(header::CONTENT_TYPE, s.content_type)], s.body).into_response(),
        Err(u) => crate::retry_later(crate::OPERATOR_RETRY_SECONDS, u.error, u.detail),
    }
}
