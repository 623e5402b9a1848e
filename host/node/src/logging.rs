//! Logging: human-readable by default, JSON on request.
//!
//! Every event carries the node id (from the root span) and the subsystem
//! that emitted it (a `subsystem` field), so a fleet's merged log can be cut
//! by either. `CREWLET_LOG` overrides the configured filter.

use crewlet_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Called once, after the config is valid.
pub fn init(config: &LoggingConfig) -> Result<(), String> {
    let filter = match std::env::var("CREWLET_LOG") {
        Ok(directives) => EnvFilter::try_new(&directives)
            .map_err(|e| format!("CREWLET_LOG={directives:?} is not a log filter: {e}"))?,
        Err(_) => EnvFilter::try_new(&config.level).map_err(|e| {
            format!(
                "logging.level = {:?} is not a log filter (e.g. `info`, `crewlet=debug,info`): {e}",
                config.level
            )
        })?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match config.format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    };
    result.map_err(|e| format!("cannot install the logger: {e}"))
}
