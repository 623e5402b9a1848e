//! The tools a chat server offers the turn itself, not the model: reading
//! the thread back before the first model call, and raising and clearing
//! the surface's working indicator while the seat thinks.
//!
//! Rule: they run through the seat's own MCP server, with its own
//! credentials — the engine never calls a vendor on its own account. Each
//! is mapped per server (`[roles.R.mcp.X] read_thread = …`) to one of the
//! server's tools and an arguments template whose strings may hold
//! `{channel}` and `{thread}` (the wake's). Unset, a key means the server's
//! tool of the key's own name (what `crewlet mcp chat` offers), with
//! `{ channel = "{channel}", thread = "{thread}" }`; `false` turns it off.
//! The turn's own notices (a budget park's "out of budget until …") are
//! posted the same way (`notice`): unset, through the server's first reply
//! tool with `{ channel, thread, text = "{text}" }`. `docs/surfaces.md` says
//! how a real server's tools are mapped.

use std::collections::BTreeMap;

use serde::Serialize;

/// The key, and the chat server's tool, that reads a thread back.
pub const READ_THREAD: &str = "read_thread";
/// The key, and the chat server's tool, that raises the working indicator.
pub const RAISE_WORKING: &str = "raise_working";
/// The key, and the chat server's tool, that clears it.
pub const CLEAR_WORKING: &str = "clear_working";
/// The key of the call that posts the turn's own notices; unset, the
/// server's first reply tool.
pub const NOTICE: &str = "notice";

/// The placeholder for the wake's channel in an arguments template.
pub const CHANNEL_PLACEHOLDER: &str = "{channel}";
/// The placeholder for the wake's thread in an arguments template.
pub const THREAD_PLACEHOLDER: &str = "{thread}";
/// The placeholder for a notice's text in the `notice` template.
pub const TEXT_PLACEHOLDER: &str = "{text}";

/// One of the turn's own calls, as a server maps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SurfaceTool {
    /// Not mapped: the server's tool of the key's name, if it lists one,
    /// with [`default_arguments`].
    #[default]
    ByName,
    /// `false`: never called on this server.
    Off,
    /// A tool of the server and its arguments template.
    Tool {
        tool: String,
        arguments: BTreeMap<String, serde_json::Value>,
    },
}

/// A server's mapping of the turn's own calls (all unset by default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SurfaceTools {
    pub read_thread: SurfaceTool,
    pub raise_working: SurfaceTool,
    pub clear_working: SurfaceTool,
    /// How the turn posts its own notices ([`NOTICE`]).
    pub notice: SurfaceTool,
    /// The webhook sources whose wakes this server reads back and shows
    /// working for (`sources = ["slack"]`); empty: every source.
    pub sources: Vec<String>,
}

impl SurfaceTools {
    /// Whether a wake from `source` is this server's to read and indicate.
    pub fn serves(&self, source: &str) -> bool {
        self.sources.is_empty() || self.sources.iter().any(|s| s == source)
    }
}

/// The arguments of a call mapped by a tool name alone:
/// `{ channel = "{channel}", thread = "{thread}" }`.
pub fn default_arguments() -> BTreeMap<String, serde_json::Value> {
    BTreeMap::from([
        ("channel".to_owned(), CHANNEL_PLACEHOLDER.into()),
        ("thread".to_owned(), THREAD_PLACEHOLDER.into()),
    ])
}

/// The arguments of a notice mapped by a tool name alone (or not mapped):
/// [`default_arguments`] and `text = "{text}"`.
pub fn notice_arguments() -> BTreeMap<String, serde_json::Value> {
    let mut args = default_arguments();
    args.insert("text".to_owned(), TEXT_PLACEHOLDER.into());
    args
}
