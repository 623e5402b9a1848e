//! The engine's own tools. From the model's side a builtin and an MCP tool
//! are the same thing: a function it asks the engine to call.
//!
//! Tools are discovered, not enumerated: the executor is shown server names
//! and promotes what it needs with `list_mcp_server_tools` then
//! `activate_tool`; an activated MCP tool is offered as `SERVER__TOOL`.

use serde::Deserialize;
use serde_json::json;

use crate::ports::ToolDef;

pub const LIST_TOOLS: &str = "list_mcp_server_tools";
pub const ACTIVATE: &str = "activate_tool";
pub const SUBMIT_WORK: &str = "submit_work";
pub const SUBMIT_REVIEW: &str = "submit_review";
pub const LEAVE_THREAD: &str = "leave_thread";
pub const REMEMBER: &str = "remember";
pub const RECALL: &str = "recall";

/// Separates a server from its tool in an offered name.
pub const SEPARATOR: &str = "__";

/// The name an MCP tool is offered under.
pub fn offered_name(server: &str, tool: &str) -> String {
    format!("{server}{SEPARATOR}{tool}")
}

/// Splits an offered name into server and tool.
pub fn split_offered(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
}

pub fn executor_builtins() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: LIST_TOOLS.into(),
            description: "List the tools of one of your MCP servers (name, description, parameters).".into(),
            parameters: json!({
                "type": "object",
                "properties": {"server": {"type": "string", "description": "The server's name."}},
                "required": ["server"],
            }),
        },
        ToolDef {
            name: ACTIVATE.into(),
            description: "Make one tool of an MCP server callable; it is then offered as SERVER__TOOL.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "server": {"type": "string"},
                    "tool": {"type": "string"},
                },
                "required": ["server", "tool"],
            }),
        },
        ToolDef {
            name: LEAVE_THREAD.into(),
            description: "Stop following a chat thread you posted in: a later message there wakes you only when it mentions you. Without arguments, the thread that woke you.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "channel": {"type": "string", "description": "The thread's channel."},
                    "thread": {"type": "string", "description": "The thread's id in that channel."},
                },
            }),
        },
        ToolDef {
            name: SUBMIT_WORK.into(),
            description: "End your work on this trigger. `delivered`: you did what was asked (a reply owed was posted); `no_action`: nothing was needed; `blocked`: you cannot do it (say why).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "outcome": {"type": "string", "enum": ["delivered", "no_action", "blocked"]},
                    "summary": {"type": "string", "description": "What you did, or why not."},
                },
                "required": ["outcome", "summary"],
            }),
        },
    ]
}

/// The seat's memory, offered when the node keeps one.
pub fn memory_builtins() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: REMEMBER.into(),
            description: "Keep one short fact in your memory, for later turns (yours, on any node). One fact per note; at most 8 KiB.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The fact to keep."}},
                "required": ["text"],
            }),
        },
        ToolDef {
            name: RECALL.into(),
            description: "Find notes you kept with remember: those nearest the query (the newest, when there are no embeddings).".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What you want to remember."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 8},
                },
                "required": ["query"],
            }),
        },
    ]
}

pub fn reviewer_builtins() -> Vec<ToolDef> {
    vec![ToolDef {
        name: SUBMIT_REVIEW.into(),
        description: "Your verdict on this round: `done` (the work is right and complete), `iterate` (say what to fix), `failed` (it cannot be done).".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "verdict": {"type": "string", "enum": ["done", "iterate", "failed"]},
                "feedback": {"type": "string"},
            },
            "required": ["verdict"],
        }),
    }]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Claimed {
    Delivered,
    NoAction,
    Blocked,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SubmitWork {
    pub outcome: Claimed,
    #[serde(default)]
    pub summary: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Done,
    Iterate,
    Failed,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SubmitReview {
    pub verdict: Verdict,
    #[serde(default)]
    pub feedback: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ServerArg {
    pub server: String,
}

/// `leave_thread`'s arguments: both absent, the thread that woke the turn.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ThreadArg {
    pub channel: Option<String>,
    pub thread: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolArg {
    pub server: String,
    pub tool: String,
}

/// A tool call whose arguments do not decode: the model that wrote them is
/// to blame, and the text (handed back to it as the call's answer) names
/// the tool and what is wrong, so it can call again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid arguments for {tool}: {why}")]
pub struct BadArguments {
    pub tool: String,
    pub why: String,
}

/// The model reads the refusal as the tool call's text answer.
impl From<BadArguments> for String {
    fn from(bad: BadArguments) -> String {
        bad.to_string()
    }
}

/// Decodes a call's JSON arguments; the error is written for the model.
pub fn decode<T: serde::de::DeserializeOwned>(
    name: &str,
    arguments: &str,
) -> Result<T, BadArguments> {
    let text = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    serde_json::from_str(text).map_err(|e| BadArguments {
        tool: name.to_owned(),
        why: e.to_string(),
    })
}
