//! The filter a history read carries on [`crate::history_subject`]: the
//! HTTP surface parses it from `GET /events` and the dashboard socket, the
//! reading node sends it to every peer, and each peer reads its own log
//! with it. One type on every hop, so a field cannot be lost between them.

use serde::{Deserialize, Serialize};

/// A filter over the fleet's event logs, newest first.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventFilter {
    /// Only this node's log (its `before_seq` positions are its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub seat: Option<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub party: Option<String>,
    pub trace_id: Option<String>,
    pub before_seq: Option<i64>,
    pub limit: Option<usize>,
}
