//! The messages ingress puts on the stream. Both carry the trace id started
//! at the webhook edge, so every event of one delivery can be found by it.

use serde::{Deserialize, Serialize};

/// A verified, claimed delivery on `crewlet.notifications.inbound`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inbound {
    pub trace_id: String,
    /// `SOURCE:DELIVERY_ID`: the claim key, and the stream's message id.
    pub key: String,
    pub delivery_id: String,
    pub source: String,
    pub event_type: String,
    /// The handle in `/webhooks/SOURCE/HANDLE`, if the route named one.
    pub route_handle: Option<String>,
    pub mentions: Vec<String>,
    pub assignees: Vec<String>,
    pub reviewers: Vec<String>,
    pub channel: Option<String>,
    pub thread: Option<String>,
    pub text: Option<String>,
    /// The node whose edge accepted it.
    pub received_by: String,
    pub received_at_ms: i64,
}

/// A wake on `crewlet.agent.HANDLE.inbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wake {
    pub trace_id: String,
    pub delivery_id: String,
    pub source: String,
    pub event_type: String,
    pub handle: String,
    pub seat_id: String,
    /// Why this seat: `route`, `mention`, `assignee` or `reviewer`.
    pub reason: String,
    pub text: Option<String>,
    /// The conversation the delivery belongs to (`channel#thread`), if any.
    pub conversation: Option<String>,
    pub channel: Option<String>,
    pub thread: Option<String>,
}

pub(crate) use crewlet_os::now_ms;
