//! The bus vocabulary: every subject, stream name, durable name and header
//! name the node's crates publish or consume on, and the messages that
//! cross a subject.
//!
//! The rule: **one home for the wire**. A crate that publishes or consumes
//! on the bus names the subject, stream, durable or header from here and
//! never spells it itself, so the publisher and its consumers cannot drift
//! apart, and a crate that only reads a message (seats and turns read
//! [`Wake`]) depends on this crate alone, not on the one that publishes it.
//! This crate holds names and plain serde types only: no I/O, no wasmtime,
//! no axum, no SQLite.
//!
//! | subject | stream | published by | consumed by |
//! | --- | --- | --- | --- |
//! | [`INBOUND_SUBJECT`] ([`Inbound`]) | [`NOTIFICATIONS_STREAM`] | the webhook edge; `notify-inbound` passing a delivery on | `notify-inbound` ([`NOTIFY_DURABLE`]) |
//! | [`inbox_subject`] ([`Wake`]) | [`AGENT_STREAM`] | `notify-inbound` | the seat's mailbox ([`mailbox_durable`]), in `crewlet-seats` |
//! | [`event_subject`] (an event row) | [`EVENTS_STREAM`] | `crewlet-observe`'s publisher | every node's live feed, the operator MCP |
//! | [`NOTIFY_DLQ_SUBJECT`] ([`DeadLetter`]) | [`DLQ_STREAM`] | `notify-inbound` | operators |
//! | [`event_subject`] of `module.NAME.TOPIC` | [`EVENTS_STREAM`] | a module's `publish`, as an event row | modules subscribed to it ([`module_durable`] for `once`, an ordered consumer per node for `each-node`) |
//! | [`module_dlq_subject`] ([`DeadLetter`]) | [`DLQ_STREAM`] | a module's subscription, for an event it refused past its retries | operators |
//! | [`history_subject`] (core request/reply, no stream) | — | a node reading the fleet's history (`crewlet-history`; an [`EventFilter`] in the ask) | the named node, answering from its own event log |
//! | [`LOCAL_COORDINATION_SUBJECT`] (core request/reply, no stream) | — | a node with `coordination.type = "local"`, at start | every other such node on the broker, whose answer refuses the start |
//! | [`SEAT_RELEASED_SUBJECT`] (core publish, no stream; the seat's handle) | — | a node that gave a seat lease back (`crewlet-seats`) | every node's placement, which claims at once if it has room |
//! | [`memory_subject`] (one memory row, the table's own encoding) | [`MEMORY_STREAM`] | `crewlet-memory`, after the row is in the node's store | the node that acquires the seat, one pass over [`memory_filter`] before its mailbox is attached |
//! | [`custody_subject`] (a batch of a stateless node's event rows, `crewlet_store::CustodyBatch`) | [`CUSTODY_STREAM`] | `crewlet-observe`'s publisher on a node without `data` | one data node per batch ([`CUSTODY_DURABLE`], `crewlet-history`'s keeper) |
//! | [`CONFIG_ACTIVATED_SUBJECT`] (core publish, no stream; the new epoch) | — | a node that moved the config pointer (`PUT /config`) | every node's config reconciler, which polls the pointer at once |
//! | [`usage_subject`] (one usage object's whole cumulative value, a state-log record) | [`USAGE_LOG_STREAM`] | every node, for its own days (`crewlet-statelog`) | every data node's applier, into the replicated estate |
//! | [`barrier_subject`] (a state-log barrier record) | the domain's stream | a linearizable read | the reader's own applier, which it waits on |
//! | [`snapshot_subject`] (core request/reply) | — | a data node behind the log's trim | the peer it asked, answering with a snapshot in [`SNAPSHOT_BUCKET`] |
//!
//! Every message the ingress publishes carries [`TRACE_HEADER`] and a
//! [`MSG_ID_HEADER`] the stream deduplicates on; a delivery `notify-inbound`
//! passes on also carries [`FAILURES_HEADER`], [`NOT_BEFORE_HEADER`] and
//! [`OWED_HEADER`].
//!
//! ## Event kinds
//!
//! Every kind of event row the node records ([`EVENT_KINDS`]; broadcast on
//! [`event_subject`] of the kind). A module subscribes to them by these
//! names, so a kind recorded anywhere in `host/` must be listed here: the
//! end-to-end suite scans the source for kinds missing from the list.
//!
//! | kind | recorded by | when |
//! | --- | --- | --- |
//! | `webhook_received` | the webhook edge | a verified delivery was accepted |
//! | `delivery_refused` | the webhook edge | a delivery was refused (4xx; source, status, reason) |
//! | `wake_published` | `notify-inbound` | a delivery's wake was published on a seat's inbox (the seat by handle; its id in `seat_id`) |
//! | `delivery_unrouted` | `notify-inbound` | a delivery addressed no seat of the company |
//! | `delivery_quiet` | `notify-inbound` | a delivery woke a seat it reached no turn for: not a conversation (an edit, a join, a reaction), or the seat's own message; `reason` says which |
//! | `delivery_dead_lettered` | `notify-inbound` | a delivery failed too often and went to the dead letters |
//! | `turn_started` | the turn | a seat's turn began |
//! | `prefetch` | the turn | the turn-start prefetch rendered its blocks (each block's bytes, or why it was skipped; recall by meaning or by recency, and why; `us`) |
//! | `turn_ended` | the turn | a seat's turn ended (its outcome in the payload) |
//! | `model_call` | the turn | one model call of a turn answered (tokens, model) |
//! | `tool_call` | the turn | one tool call of a turn was answered (`ok`; a failed one's reason in `error`) |
//! | `thread_read` | the turn | the thread a turn was woken in was read back for its prompt, or why not (`status`: `read`, `failed`, `timed_out`, `not_offered`) |
//! | `working_indicator` | the turn | the surface's working indicator was raised or cleared, or why not (`state`: `raised`, `cleared`, `failed`, `not_offered`) |
//! | `review` | the turn | the reviewer gave a verdict on an iteration |
//! | `review_overturned` | the turn | a `done` verdict was overturned (an owed reply was not posted) |
//! | `budget_exhausted` | the turn | a budget refused the turn's next model call |
//! | `budget_parked` | the turn | a budget stopped the turn; its work waits in the mailbox until the window (scope, period, `until`) has room |
//! | `reply_posted` | the turn | the turn posted a reply where its trigger asked for one |
//! | `reply_uncertain` | the turn | a reply begun by an earlier run (a crash between its intent and its completion) on a surface that cannot be asked: not posted again; the turn ends `reply_uncertain` |
//! | `provider_fallback` | the model pool | a model failed and the chain fell back to the next |
//! | `llm_unavailable` | the model pool | no model of the chain answered |
//! | `credential_benched` | the model pool | a credential was benched (rate limit, refusal) |
//! | `credential_cooled_by_peer` | the model pool | a peer node's bench of a credential was adopted |
//! | `schedule_fired` | `worker:scheduler` | a schedule's fire woke its seat |
//! | `schedule_missed` | `worker:scheduler` | fires were skipped (catch-up policy, or past its ceiling) |
//! | `maintenance_pass` | `worker:maintenance` | a maintenance pass finished |
//! | `learning_pass` | `worker:learning` | a learning pass finished: skills induced, declined, failed, aged, promoted |
//! | `config_activated` | the config plane | a company revision was activated (the pointer moved) |
//! | `config_applied` | the config plane | this node applied a company revision |
//! | `node_started` | the node | the node finished its start |
//! | `node_evicted` | the node (`POST /estate/evict`) | an operator evicted a data node gone for good from the state log's trim |
//! | `node_readmitted` | the node (`POST /estate/readmit`) | an operator ended an eviction: the node applies the state log again |
//!
//! A module's own topics are kinds too, built by [`module_topic_kind`]:
//! `module.<module>.<topic>`, never in [`EVENT_KINDS`].

mod history;
mod message;
mod statelog;

pub use history::EventFilter;
pub use message::{DeadLetter, Inbound, ReplyTo, Sender, Wake, Wakes};
pub use statelog::{
    SNAPSHOT_BUCKET, USAGE_LOG_PREFIX, USAGE_LOG_STREAM, USAGE_LOG_SUBJECTS, barrier_subject,
    snapshot_subject, usage_subject,
};

/// Stream of the event batches of nodes without `data` (interest
/// retention: a batch lives until a data node took it).
pub const CUSTODY_STREAM: &str = "CREWLET_CUSTODY";
/// The subjects [`CUSTODY_STREAM`] holds: outside `crewlet.events.>`,
/// whose broadcast every dashboard streams.
pub const CUSTODY_SUBJECTS: &str = "crewlet.custody.>";
/// The one fleet-wide durable every data node takes custody batches from.
pub const CUSTODY_DURABLE: &str = "custody";
/// What [`CUSTODY_DURABLE`] covers: the batches, and not the stream's
/// reach probe (which a durable over the whole stream would keep).
pub const CUSTODY_BATCHES: &str = "crewlet.custody.batch.>";

/// The subject node `node_id` (a node without `data`) publishes its event
/// batches on. A node id is one subject token (see [`history_subject`]).
pub fn custody_subject(node_id: &str) -> String {
    format!("{}.{node_id}", CUSTODY_BATCHES.trim_end_matches(".>"))
}

/// Stream of seat mailboxes (interest retention).
pub const AGENT_STREAM: &str = "CREWLET_AGENT";
/// The subjects [`AGENT_STREAM`] holds.
pub const AGENT_SUBJECTS: &str = "crewlet.agent.>";
/// Stream of inbound deliveries awaiting `notify-inbound` (interest retention).
pub const NOTIFICATIONS_STREAM: &str = "CREWLET_NOTIFICATIONS";
/// The subjects [`NOTIFICATIONS_STREAM`] holds.
pub const NOTIFICATIONS_SUBJECTS: &str = "crewlet.notifications.>";
/// Stream of the live event broadcast (limits retention).
pub const EVENTS_STREAM: &str = "CREWLET_EVENTS";
/// The subjects [`EVENTS_STREAM`] holds.
pub const EVENTS_SUBJECTS: &str = "crewlet.events.>";
/// Stream of dead letters, deliberately outside `crewlet.*` (limits retention).
pub const DLQ_STREAM: &str = "CREWLET_DLQ";
/// The subjects [`DLQ_STREAM`] holds.
pub const DLQ_SUBJECTS: &str = "dlq.>";

/// Stream of every seat's memory rows: a keyed table (one message per
/// subject, no age), not a log.
pub const MEMORY_STREAM: &str = "CREWLET_MEMORY";
/// The subjects [`MEMORY_STREAM`] holds.
pub const MEMORY_SUBJECTS: &str = "crewlet.memory.>";

/// The subject every verified delivery is published to.
pub const INBOUND_SUBJECT: &str = "crewlet.notifications.inbound";
/// The dead-letter subject of the notification service.
pub const NOTIFY_DLQ_SUBJECT: &str = "dlq.notify-inbound";
/// Subject prefix of the event broadcast: an event of type `T` is on
/// `crewlet.events.T` ([`event_subject`]).
pub const EVENTS_PREFIX: &str = "crewlet.events";

/// The fleet-wide durable consumer (and queue group) of [`INBOUND_SUBJECT`].
pub const NOTIFY_DURABLE: &str = "notify-inbound";

/// JetStream's deduplication header: a second publish with the same id
/// inside the stream's duplicate window is acknowledged and dropped.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";
/// The trace id started at the webhook edge, on every message ingress publishes.
pub const TRACE_HEADER: &str = "Crewlet-Trace-Id";
/// A passed-on delivery's real failures so far.
pub const FAILURES_HEADER: &str = "Crewlet-Failures";
/// When a passed-on delivery is due, in ms since the epoch.
pub const NOT_BEFORE_HEADER: &str = "Crewlet-Not-Before";
/// The handles a passed-on delivery still owes a wake, comma-separated
/// (absent: every seat the delivery resolves to).
pub const OWED_HEADER: &str = "Crewlet-Owed";

/// The subject a seat's wakes are published to. `handle` is a company
/// handle (`crewlet_company::Handle`), which is a valid subject token.
///
/// ```
/// use crewlet_bus::{AGENT_SUBJECTS, inbox_subject, mailbox_durable};
///
/// // Ada's wakes go to her inbox, a subject the mailboxes' stream holds,
/// // and wait there for her mailbox, the durable named after her.
/// let subject = inbox_subject("ada");
/// assert_eq!(subject, "crewlet.agent.ada.inbox");
/// assert!(subject.starts_with(AGENT_SUBJECTS.trim_end_matches('>')));
/// assert_eq!(mailbox_durable("ada"), "inbox-ada");
/// ```
pub fn inbox_subject(handle: &str) -> String {
    format!("crewlet.agent.{handle}.inbox")
}

/// The durable name of `handle`'s mailbox on [`AGENT_STREAM`].
pub fn mailbox_durable(handle: &str) -> String {
    format!("inbox-{handle}")
}

/// The subject one memory row of `handle` rides: `table` names the node
/// store's table, `digest` the row's key within the seat (a hex digest, so
/// one subject token whatever the key holds).
///
/// ```
/// use crewlet_bus::{MEMORY_SUBJECTS, memory_filter, memory_subject};
///
/// let subject = memory_subject("ada", "sessions", "9f2c");
/// assert_eq!(subject, "crewlet.memory.ada.sessions.9f2c");
/// assert!(subject.starts_with(MEMORY_SUBJECTS.trim_end_matches('>')));
/// assert_eq!(memory_filter("ada"), "crewlet.memory.ada.>");
/// ```
pub fn memory_subject(handle: &str, table: &str, digest: &str) -> String {
    format!("crewlet.memory.{handle}.{table}.{digest}")
}

/// The filter covering every memory row of `handle`, of every table.
pub fn memory_filter(handle: &str) -> String {
    format!("crewlet.memory.{handle}.>")
}

/// The subject node `node_id` answers history reads on (core NATS
/// request/reply: no stream holds it, so an answer is never replayed).
/// A node id is letters, digits, `-` and `_`, so it is one subject token.
pub fn history_subject(node_id: &str) -> String {
    format!("{HISTORY_PREFIX}.{node_id}")
}

/// Subject prefix of the history reads ([`history_subject`]); outside
/// every stream's subjects.
pub const HISTORY_PREFIX: &str = "crewlet.history";

/// Where nodes with local coordination find each other (core NATS
/// request/reply; the payload is the node id): there must be one.
pub const LOCAL_COORDINATION_SUBJECT: &str = "crewlet.coordination.local";

/// Where a node says it gave a seat back (core NATS; the payload is the
/// handle). A hint only: a peer that misses it claims on its next tick.
pub const SEAT_RELEASED_SUBJECT: &str = "crewlet.seats.released";

/// Where a node says it moved the config pointer (core NATS; the payload is
/// the new epoch). A hint only: a node that misses it applies the epoch on
/// its next poll.
pub const CONFIG_ACTIVATED_SUBJECT: &str = "crewlet.config.activated";

/// The subject an event of type `kind` is broadcast on.
pub fn event_subject(kind: &str) -> String {
    format!("{EVENTS_PREFIX}.{kind}")
}

/// The fleet-wide durable on [`EVENTS_STREAM`] of `module`'s `once`
/// subscription to events of `kind` (a module topic's dots become `_`:
/// durable names have none).
pub fn module_durable(module: &str, kind: &str) -> String {
    format!("module-{module}-{}", kind.replace('.', "_"))
}

/// The dead-letter subject of `module`'s subscriptions: an event the module
/// refused past its retries, with the reason ([`DeadLetter`]).
pub fn module_dlq_subject(module: &str) -> String {
    format!("dlq.module.{module}")
}

/// Every kind of event row the node records (the table in the module docs).
pub const EVENT_KINDS: &[&str] = &[
    "webhook_received",
    "delivery_refused",
    "wake_published",
    "delivery_unrouted",
    "delivery_quiet",
    "delivery_dead_lettered",
    "turn_started",
    "prefetch",
    "turn_ended",
    "model_call",
    "tool_call",
    "thread_read",
    "working_indicator",
    "review",
    "review_overturned",
    "budget_exhausted",
    "budget_parked",
    "reply_posted",
    "reply_uncertain",
    "provider_fallback",
    "llm_unavailable",
    "credential_benched",
    "credential_cooled_by_peer",
    "schedule_fired",
    "schedule_missed",
    "maintenance_pass",
    "learning_pass",
    "config_activated",
    "config_applied",
    "node_started",
    "node_evicted",
    "node_readmitted",
];

/// The first part of a module topic's kind ([`module_topic_kind`]).
pub const MODULE_TOPIC_PREFIX: &str = "module";

/// The event kind of `module`'s topic `topic`: `module.<module>.<topic>`
/// (both parts plugin names, `a-z 0-9 -`, so the kind is three subject
/// tokens); broadcast on [`event_subject`] of it.
pub fn module_topic_kind(module: &str, topic: &str) -> String {
    format!("{MODULE_TOPIC_PREFIX}.{module}.{topic}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_seat_names() {
        assert_eq!(inbox_subject("a"), "crewlet.agent.a.inbox");
        assert_eq!(mailbox_durable("ada"), "inbox-ada");
        assert_eq!(
            module_durable("notebook", "module.presence.seen"),
            "module-notebook-module_presence_seen"
        );
        assert_eq!(
            event_subject("turn_finished"),
            "crewlet.events.turn_finished"
        );
        assert_eq!(
            event_subject(&module_topic_kind("notebook", "changed")),
            "crewlet.events.module.notebook.changed"
        );
    }

    /// A kind is one subject token (a module topic's three), and no
    /// company kind can be mistaken for a module's topic.
    #[test]
    fn event_kinds_are_single_tokens_outside_the_module_prefix() {
        for kind in EVENT_KINDS {
            assert!(
                !kind.is_empty() && kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{kind}"
            );
            assert!(!kind.starts_with(MODULE_TOPIC_PREFIX), "{kind}");
        }
        let mut sorted = EVENT_KINDS.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), EVENT_KINDS.len(), "a kind is listed twice");
    }

    /// Each subject is held by the stream named beside it: a publish a
    /// stream's filter misses is refused as "no stream found".
    #[test]
    fn every_subject_is_in_its_stream() {
        let covered =
            |filter: &str, subject: &str| subject.starts_with(filter.trim_end_matches('>'));
        assert!(covered(AGENT_SUBJECTS, &inbox_subject("ada")));
        assert!(covered(NOTIFICATIONS_SUBJECTS, INBOUND_SUBJECT));
        assert!(covered(EVENTS_SUBJECTS, &event_subject("node_started")));
        assert!(covered(DLQ_SUBJECTS, NOTIFY_DLQ_SUBJECT));
        assert!(covered(DLQ_SUBJECTS, &module_dlq_subject("notebook")));
        assert!(covered(
            EVENTS_SUBJECTS,
            &event_subject("module.notebook.changed")
        ));
        assert!(!covered(EVENTS_SUBJECTS, NOTIFY_DLQ_SUBJECT));
        // Custody batches are never on the broadcast dashboards stream.
        assert!(covered(CUSTODY_SUBJECTS, &custody_subject("edge-1")));
        assert!(covered(CUSTODY_BATCHES, &custody_subject("edge-1")));
        assert!(covered(CUSTODY_SUBJECTS, CUSTODY_BATCHES));
        assert!(!covered(EVENTS_SUBJECTS, &custody_subject("edge-1")));
        // History reads are request/reply: no stream may hold them.
        for stream in [
            AGENT_SUBJECTS,
            NOTIFICATIONS_SUBJECTS,
            EVENTS_SUBJECTS,
            DLQ_SUBJECTS,
            CUSTODY_SUBJECTS,
        ] {
            assert!(!covered(stream, &history_subject("n1")), "{stream}");
            assert!(!covered(stream, SEAT_RELEASED_SUBJECT), "{stream}");
            assert!(!covered(stream, CONFIG_ACTIVATED_SUBJECT), "{stream}");
            assert!(!covered(stream, LOCAL_COORDINATION_SUBJECT), "{stream}");
        }
    }
}
