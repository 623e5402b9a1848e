//! The messages that cross a subject. Inbound deliveries and wakes carry
//! the trace id started at the webhook edge, so every event of one delivery
//! can be found by it.

use serde::{Deserialize, Serialize};

/// A verified, claimed delivery on [`crate::INBOUND_SUBJECT`].
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
    /// Set when the source's plugin said a person waits for an answer, and
    /// where (absent in deliveries published before WIT 0.4.0).
    #[serde(default)]
    pub owed: Option<ReplyTo>,
    /// Every id the vendor gave the author, as sent (WIT 0.4.1; empty from
    /// a 0.4.0 plugin, and in deliveries published before): a seat's own
    /// message wakes nobody, by mention or by follow.
    #[serde(default)]
    pub sender: Vec<String>,
    /// Whom it may wake, as its plugin read it (WIT 0.4.1).
    #[serde(default)]
    pub wakes: Wakes,
    /// The message this delivery is one copy of, when the vendor sends one
    /// message as several deliveries (WIT 0.4.1): its seats' wakes are keyed
    /// by it, so a seat is woken once per message.
    #[serde(default)]
    pub message: Option<String>,
    /// The node whose edge accepted it.
    pub received_by: String,
    pub received_at_ms: i64,
}

/// A wake on a seat's [`crate::inbox_subject`].
///
/// ```
/// use crewlet_bus::{ReplyTo, Wake};
///
/// // A wake published before WIT 0.4.0 has no `owed`: it still reads, as
/// // "nobody is owed a reply" — an older node's wakes are never lost.
/// let old = r#"{"trace_id": "t1", "delivery_id": "Ev1", "source": "slack",
///     "event_type": "app_mention", "handle": "ada", "seat_id": "0f8e…",
///     "reason": "mention", "text": "hi", "conversation": "C1#17.1",
///     "channel": "C1", "thread": "17.1"}"#;
/// let mut wake: Wake = serde_json::from_str(old)?;
/// assert_eq!((wake.handle.as_str(), wake.owed.as_ref()), ("ada", None));
///
/// // What a node publishes today carries where the answer is owed.
/// wake.owed = Some(ReplyTo { channel: "C1".into(), thread: Some("17.1".into()) });
/// let again: Wake = serde_json::from_str(&serde_json::to_string(&wake)?)?;
/// assert_eq!(again, wake);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Wake {
    pub trace_id: String,
    pub delivery_id: String,
    pub source: String,
    pub event_type: String,
    pub handle: String,
    pub seat_id: String,
    /// Why this seat: `route`, `mention`, `assignee`, `reviewer` or `follow`
    /// (a message in a thread the seat posted in, which owes no reply).
    pub reason: String,
    pub text: Option<String>,
    /// The conversation the delivery belongs to (`channel#thread`), if any.
    pub conversation: Option<String>,
    pub channel: Option<String>,
    pub thread: Option<String>,
    /// Where the delivery's plugin said a person waits for an answer
    /// (absent in wakes published before WIT 0.4.0, and for schedules,
    /// whose `channel` says where their result goes).
    #[serde(default)]
    pub owed: Option<ReplyTo>,
    /// Who wrote what woke the seat (absent when its source names nobody).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<Sender>,
}

/// Whom a delivery may wake, as its source's plugin read the event (WIT
/// `delivery.wakes`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "why")]
pub enum Wakes {
    /// Its route's seat and whom it names: what every delivery was before
    /// WIT 0.4.1.
    #[default]
    RouteAndNamed,
    /// Only whom it names: seen in a channel, not sent to the route's seat.
    Named,
    /// Nobody (an edit, a join, a reaction), and why.
    Nobody(String),
}

/// Who wrote a delivery: the ids its vendor gave, and who that is in the
/// company, in words a prompt can carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    pub ids: Vec<String>,
    /// `Grace Hopper (person grace)`, `seat linus`, or the ids when no
    /// seat or person claims them.
    pub who: String,
}

/// Where a person waits for an answer: a channel and, within it, a thread
/// (in the source's vocabulary). The webhook plugin decides it (WIT
/// `delivery.owed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyTo {
    pub channel: String,
    pub thread: Option<String>,
}

/// A delivery `notify-inbound` gave up on, on [`crate::NOTIFY_DLQ_SUBJECT`]:
/// why, and what it still owed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub reason: String,
    /// Real failures counted (delays never count).
    pub failures: i64,
    /// How many times the server delivered this copy.
    pub delivered: i64,
    /// The handles still owed a wake; `None`: every seat it resolves to.
    pub owed: Option<Vec<String>>,
    /// The subject the delivery arrived on.
    pub subject: String,
    pub trace_id: Option<String>,
    /// The delivery's body as it arrived (lossy UTF-8: it may not parse).
    pub original: String,
}
