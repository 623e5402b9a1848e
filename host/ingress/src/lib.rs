//! Ingress: from a webhook to a seat's mailbox.
//!
//! Rules, and why:
//! - **Nothing is answered 2xx before the stream has it.** The edge verifies
//!   in the plugin, claims the delivery fleet-wide, publishes to
//!   `crewlet.notifications.inbound` and waits for the JetStream ack; only
//!   then does it write the event row and answer. A sender that got 2xx never
//!   has to send again, so the stream is the only copy that matters.
//! - **Unknown never drops.** A claim the store cannot answer fails open (a
//!   duplicate turn is bounded and visible; a dropped delivery is not). A
//!   publish that fails releases the claim and answers 503 + Retry-After, so
//!   the sender's retry is accepted.
//! - **Never 200 or 4xx for our own outage.** No active company or no secret
//!   answers 503: senders drop (4xx) or forget (200) on the others. A
//!   company with no integration for the source is not an outage: 404.
//! - **One service, fleet-wide.** Every node runs the notification service
//!   as one competing durable consumer (`notify-inbound`); the rate valve
//!   fails closed by delaying (nak with delay), and a message that keeps
//!   failing goes to `dlq.notify-inbound` after [`notify::MAX_DELIVER`]
//!   real failures (a delay never counts), with the reason.
//! - **Every seat has a mailbox**, whether or not it runs anywhere
//!   (`crewlet_stream::ensure_mailboxes`, called by the node), so the
//!   interest-retention stream keeps a wake for a seat that is not attached
//!   yet.
//!
//! Every subject, stream and header named here, and the messages
//! ([`crewlet_bus::Inbound`], [`crewlet_bus::Wake`]), come from `crewlet-bus`.
//!
//! Secrets: the company names a secret per integration
//! (`[integrations.SOURCE] secret = "NAME"`); its value is resolved through
//! [`crewlet_secrets::Resolver`] — the fleet's sealed secrets bucket first, then the node's
//! environment variable `NAME`. The plugin receives it under the name its
//! manifest declares.

pub mod notify;
pub mod sign;
pub mod webhook;

pub use notify::{NotifyError, NotifyService};
pub use webhook::{Edge, EdgeConfig, Outage, Outcome, Refusal, Route};
