//! MCP tool servers: per-seat and shared children, each seat's own tool registry.
//!
//! Two lifetimes, and the difference is a security boundary:
//!
//! - A `shared = false` server is a *template*. Each seat gets its own child
//!   (or HTTP session), started with that seat's credentials, held in that
//!   seat's own [`SeatTools`]. Two children of one template publish the same
//!   tool names; in one registry one would shadow the other and a seat would
//!   act as somebody else. So a registry is never shared between seats.
//! - A `shared = true` server is one child per node, bound to the config
//!   epoch ([`SharedChildren`]); seats hold a reference to it, never a copy.
//!
//! `${NAME}` references in a stdio server's `args` and `env` values and in an
//! HTTP server's `headers` values are resolved when the child starts, through
//! a [`Resolver`] the caller builds (the seat's own credentials first, then
//! the company's). A resolved value is never logged, and is scrubbed from
//! every failure reason this crate records.
//!
//! A server that fails to start never fails its seat: it is recorded as
//! failed, with a reason of at most [`REASON_MAX`] bytes, and the seat runs
//! with the others. A credential not known yet is not a failure: the seat
//! is not equipped ([`CredentialUnknown`]) and no child runs without it.

mod connection;
mod policy;
mod seat;
mod shared;
mod status;
mod substitute;

pub mod chat;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

pub use policy::{Allowed, CommandPolicy, Refused};
pub use seat::{CredentialUnknown, SeatTools};
pub use shared::SharedChildren;
pub use status::{McpStatusRow, merge_status};
pub use substitute::{SubstituteError, substitute};

/// Resolves a `${NAME}` reference: the node's one secrets resolver (the
/// caller decides where names resolve, e.g. a seat's own credentials first).
pub use crewlet_secrets::Resolver;

/// The longest failure reason recorded, in bytes (clipped on a char boundary).
pub const REASON_MAX: usize = 240;

/// Bounds on starting and calling servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpOptions {
    /// Spawn (or connect) + handshake + `tools/list`, per server.
    pub start_timeout: Duration,
    /// One `tools/call`.
    pub call_timeout: Duration,
    /// How long a stopping child may take to exit after its stdin closes
    /// before it is killed (rmcp then sends SIGTERM, then SIGKILL).
    pub stop_timeout: Duration,
    /// Which programs stdio servers may be; checked at every spawn.
    pub policy: Arc<CommandPolicy>,
}

impl Default for McpOptions {
    fn default() -> Self {
        Self {
            start_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
            stop_timeout: Duration::from_secs(10),
            policy: Arc::new(CommandPolicy::builtin_only()),
        }
    }
}

/// One tool a server offers, from the `tools/list` done at start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub server: String,
    pub name: String,
    pub description: Option<String>,
    /// The tool's JSON Schema for its arguments (an object schema).
    pub input_schema: serde_json::Value,
}

/// What a tool answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolResult {
    /// Every text content block, joined with newlines.
    pub text: String,
    /// The tool reported failure (the call itself worked).
    pub is_error: bool,
    /// The tool's structured content, if it sent any.
    pub structured: Option<serde_json::Value>,
}

/// Whether a server of a registry is usable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ServerState {
    Started { tools: u32 },
    Failed { reason: String },
}

/// One server of a seat's registry, for an operator or a model's prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerSummary {
    pub name: String,
    pub shared: bool,
    #[serde(flatten)]
    pub state: ServerState,
    /// The server's own description (`serverInfo.description`), if any.
    pub description: Option<String>,
    /// The server's `instructions` from its initialize result, if any.
    pub instructions: Option<String>,
    /// The child's process id (stdio servers that started).
    pub pid: Option<u32>,
}

/// Why a tool could not be listed or called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error(
        "no MCP server `{server}` in this seat's registry (it has: {known}); check the role's `mcp` table"
    )]
    UnknownServer { server: String, known: String },
    #[error(
        "MCP server `{server}` has no tool `{tool}`; list the server's tools and use one of those names"
    )]
    UnknownTool { server: String, tool: String },
    #[error(
        "MCP server `{server}` did not start: {reason}; fix the server's spec or credentials, then restart the seat"
    )]
    NotStarted { server: String, reason: String },
    #[error(
        "MCP server `{server}` is gone ({reason}); restart the seat to start or connect it again"
    )]
    ServerGone { server: String, reason: String },
    #[error(
        "`{server}`.`{tool}` did not answer within {timeout:?}; the call was abandoned (the tool may still have acted)"
    )]
    CallTimeout {
        server: String,
        tool: String,
        timeout: Duration,
    },
    #[error("arguments for `{server}`.`{tool}` must be a JSON object, not {got}")]
    BadArguments {
        server: String,
        tool: String,
        got: &'static str,
    },
    #[error("`{server}`.`{tool}` was refused by the server: {reason}")]
    CallRefused {
        server: String,
        tool: String,
        reason: String,
    },
}

/// Clips `text` to at most [`REASON_MAX`] bytes, on a char boundary.
pub fn clip_reason(text: &str) -> String {
    clip(text, REASON_MAX)
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_keeps_short_text_and_cuts_long_text_on_a_char_boundary() {
        assert_eq!(clip_reason("short"), "short");
        let long = "é".repeat(300); // 600 bytes
        let clipped = clip_reason(&long);
        assert!(clipped.len() <= REASON_MAX, "{} bytes", clipped.len());
        assert!(clipped.ends_with('…'));
        assert!(clipped.starts_with("éé"));
        let exact = "a".repeat(REASON_MAX);
        assert_eq!(clip_reason(&exact), exact);
    }
}
