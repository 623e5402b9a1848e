//! `/operator/mcp`: the operator's MCP catalogue (`crewlet-operator`),
//! mounted like every route, so the node's HTTP guard covers it.
//!
//! Rule: this crate never reaches the MCP library (`scripts/check-deps.sh`).
//! The catalogue's transport is its own HTTP service (streamable HTTP,
//! stateless), so the node hands it in whole and this file mounts it as an
//! opaque tower service: the route's one trait is `Service` itself.

use std::convert::Infallible;

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use tower::Service;

/// The route the catalogue is served at.
pub const ROUTE: &str = "/operator/mcp";

/// [`ROUTE`], answered by `service`.
pub fn routes<S>(service: S) -> Router
where
    S: Service<Request, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Response: IntoResponse + 'static,
    S::Future: Send + 'static,
{
    Router::new().route_service(ROUTE, service)
}
