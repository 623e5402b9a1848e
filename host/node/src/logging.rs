//! Logging: human-readable by default, JSON on request.
//!
//! Every event carries the node id (from the root span, or a field where an
//! event is emitted outside it) and the subsystem that emitted it (a
//! `subsystem` field), so a fleet's merged log can be cut by either.
//! `CREWLET_LOG` overrides the configured filter.
//!
//! Colour only when stderr is a terminal (and `NO_COLOR` is unset): a log
//! written to a file, a pipe or a journal is read by tools and by `grep`,
//! and escape codes in it are noise that breaks both.

use std::io::IsTerminal;

use crewlet_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

/// Why the logger was not installed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The operator's filter (`CREWLET_LOG` or `logging.level`) is wrong.
    #[error(
        "{origin} = {directives:?} is not a log filter (e.g. `info`, `crewlet_stream=debug,info`): {why}"
    )]
    BadFilter {
        origin: &'static str,
        directives: String,
        why: String,
    },
    /// Something in this process installed a logger first: a bug here.
    #[error("cannot install the logger: {0}")]
    Install(String),
}

/// Installs the global subscriber. Called once, after the config is valid.
pub fn init(config: &LoggingConfig) -> Result<(), LoggingError> {
    let (origin, directives) = match std::env::var("CREWLET_LOG") {
        Ok(d) => ("CREWLET_LOG", d),
        Err(_) => ("logging.level", config.level.clone()),
    };
    // The NATS client narrates each connect at info from its own task, with
    // no node id; the stream subsystem reports those events itself.
    let effective = if directives.contains("async_nats") {
        directives.clone()
    } else {
        format!("{directives},async_nats=warn")
    };
    let filter = EnvFilter::try_new(&effective).map_err(|e| LoggingError::BadFilter {
        origin,
        directives: directives.clone(),
        why: e.to_string(),
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
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
    result.map_err(|e| LoggingError::Install(e.to_string()))
}

/// Whether to colour the log: on a terminal, unless `NO_COLOR` is set to
/// anything non-empty (<https://no-color.org>).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }
}
