//! Ingress: the webhook routes and the notification service (issue 5).
//!
//! Wiring point for the ingress stage; see `crate::engine` for what a
//! subsystem is started with.

use axum::Router;

use crate::engine::{EngineContext, Late, Started};

/// Routes bound with the HTTP surface, before the engine is up.
pub fn routes(_late: Late) -> Router {
    Router::new()
}

/// Starts the ingress subsystems once the engine is up.
pub async fn start(_ctx: &EngineContext, _started: &mut Started) -> Result<(), String> {
    Ok(())
}
