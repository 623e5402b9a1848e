//! What a node says about itself on its presence lease, and the rows in it.
//!
//! Rule: every type here reads keys it does not know as absent and ignores
//! the rest (`serde(default)`), so a newer peer can add fields without an
//! older one failing to read its presence.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a node says about itself on its presence lease. Keys this build
/// does not know are ignored, so a newer peer can add fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeStatus {
    pub roles: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub turns_in_flight: u32,
    pub draining: bool,
    pub posture: String,
    /// Unix milliseconds.
    pub started_at_ms: i64,
    /// Seats this node serves (acquired, equipped and attached).
    pub seats_held: u32,
    /// One row per MCP server this node runs children of.
    pub mcp: Vec<ServerRow>,
    /// The singleton duties this node holds now.
    pub duties: Vec<DutyRow>,
    /// The NATS server this node's one connection is on (absent from
    /// builds that did not say, and until the node is connected).
    pub broker: Option<BrokerRow>,
}

/// The NATS server a node is connected to, from the server's INFO, and
/// the URLs it was given (credentials stripped).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BrokerRow {
    pub server_name: String,
    pub server_id: String,
    /// The server's cluster, when it is in one.
    pub cluster: Option<String>,
    pub version: String,
    /// `host:port` as the server advertises itself.
    pub advertised: String,
    pub urls: Vec<String>,
}

/// A singleton duty a node holds: its `worker:` lease's epoch, and since
/// when (Unix milliseconds) this node has held it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DutyRow {
    pub duty: String,
    pub epoch: u64,
    pub since_ms: i64,
}

/// One MCP server on a node: children started and failed (over its seats,
/// or one shared child), tools it offers, and the last failure's reason
/// (at most 240 bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerRow {
    pub server: String,
    pub shared: bool,
    pub started: u32,
    pub failed: u32,
    pub tools: u32,
    pub last_failure: Option<String>,
}
