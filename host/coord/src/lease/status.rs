//! What a node says about itself on its presence lease, and the rows in it.
//!
//! Rules:
//! - A key this build does not know is ignored (`serde(default)`), so a
//!   newer peer can add fields without an older one failing to read its
//!   presence.
//! - A field a peer did not send is "not reported" (`None`), never zero or
//!   false: a rolling upgrade mixes builds, and an older one that never
//!   sent `draining` is not thereby saying it is not draining. Each reader
//!   decides what "not reported" means for it and says so: placement (and
//!   `/agents`' reason a seat is unplaced) counts a peer whose `draining`
//!   is not reported as live, the way a build that did not send it meant
//!   it — such a build left placement by dropping its presence, the first
//!   thing its drain did; `/fleet` shows it as null (`crewlet fleet`: "not
//!   reported"). No decision reads a peer's `turns_in_flight`,
//!   `seats_held`, `posture` or `started_at_ms`; they are shown, never
//!   zero-filled. `roles` and `labels` were sent by every build since the
//!   lease carried a status, so their absence reads as none.
//! - This build always sends every field it knows (`Some`), and writes a
//!   `None` as an absent key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a node says about itself on its presence lease. Keys this build
/// does not know are ignored; keys a peer did not send are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeStatus {
    pub roles: Vec<String>,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub posture: Option<String>,
    /// Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<i64>,
    /// Seats this node serves (acquired, equipped and attached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seats_held: Option<u32>,
    /// One row per MCP server this node runs children of (`Some(empty)`:
    /// it started none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Vec<ServerRow>>,
    /// The singleton duties this node holds now (`Some(empty)`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duties: Option<Vec<DutyRow>>,
    /// The NATS server this node's one connection is on (absent from
    /// builds that did not say, and until the node is connected).
    pub broker: Option<BrokerRow>,
    /// Seats this node holds whose memory it could not read yet, with why:
    /// their mailboxes stay detached until it can (`Some(empty)`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_unread: Option<BTreeMap<String, String>>,
}

impl NodeStatus {
    /// Whether the node withdrew from placement by saying it drains; not
    /// reported counts as not draining (see the module docs).
    pub fn says_draining(&self) -> bool {
        self.draining == Some(true)
    }
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
    pub epoch: crate::FenceEpoch,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_a_peer_did_not_send_is_not_reported_never_zero() {
        let st: NodeStatus =
            serde_json::from_str(r#"{"roles":["seats"],"from_a_newer_build":{"x":1}}"#).unwrap();
        assert_eq!(st.roles, vec!["seats".to_owned()]);
        assert_eq!(
            (st.turns_in_flight, st.draining, st.seats_held),
            (None, None, None)
        );
        assert_eq!((st.posture, st.started_at_ms), (None, None));
        assert_eq!((st.mcp, st.duties), (None, None));
        assert!(!NodeStatus::default().says_draining());
        // What this build sends reads back the same, zeros included.
        let full = NodeStatus {
            turns_in_flight: Some(0),
            draining: Some(false),
            seats_held: Some(0),
            mcp: Some(Vec::new()),
            ..NodeStatus::default()
        };
        let back: NodeStatus =
            serde_json::from_str(&serde_json::to_string(&full).unwrap()).unwrap();
        assert_eq!(back, full);
        let unsent = serde_json::to_value(NodeStatus::default()).unwrap();
        assert!(unsent.get("draining").is_none(), "{unsent}");
    }
}
