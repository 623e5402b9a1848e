//! The config plane (issue 5, first cut): company revisions activated by
//! compare-and-set on the fleet's pointer, and each node applying them.
//!
//! Wiring point for that stage; see `crate::engine`.

use axum::Router;

use crate::engine::{EngineContext, Late, Started};

/// Routes bound with the HTTP surface, before the engine is up.
pub fn routes(_late: Late) -> Router {
    Router::new()
}

/// Starts the config reconciler once the engine is up.
pub async fn start(_ctx: &EngineContext, _started: &mut Started) -> Result<(), String> {
    Ok(())
}
