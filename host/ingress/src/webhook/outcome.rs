//! How the edge answers a request, typed: what became of the delivery, and
//! when it went wrong, who is to blame ([`Blame`]) — the sender (a 4xx: a
//! [`Refusal`]), the plugin (500) or the host (503 + Retry-After: an
//! [`Outage`], or a plugin call the host failed). The HTTP response is
//! built from it in the HTTP crate (`crewlet-api`); here it is the status
//! the module docs promise and the sentence said to the sender.

use std::time::Duration;

use crewlet_observe::AckError;
use crewlet_plugins::Blame;
use crewlet_plugins::webhook::Unbounded;
use http::StatusCode;

use super::MAX_ROUTE_HANDLE;
use super::release::ReleaseError;

/// How a request was answered.
#[derive(Debug)]
pub enum Outcome {
    /// On the stream; the trace ids of its deliveries.
    Accepted(Vec<String>),
    /// Every delivery was already claimed elsewhere.
    Duplicate,
    /// Verified, nothing to deliver; answer with the source's reply.
    Reply { content_type: String, body: Vec<u8> },
    /// Verified, nothing to deliver, nothing to say.
    Ignored,
    /// The sender's fault.
    Refused(Refusal),
    /// Ours: the sender should retry.
    Unavailable(Outage),
    /// The plugin was not run (quarantined after repeated faults, or at its
    /// concurrency bound): retry after this long.
    NotRun {
        reason: String,
        retry_after: Duration,
    },
    /// The plugin's call failed: its own fault ([`Blame::Guest`], 500), or
    /// the host's ([`Blame::Host`], 503: retry).
    Fault { plugin: String, blame: Blame },
}

impl Outcome {
    /// The HTTP status this outcome answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Outcome::Accepted(_) => StatusCode::ACCEPTED,
            Outcome::Duplicate | Outcome::Reply { .. } | Outcome::Ignored => StatusCode::OK,
            Outcome::Refused(refusal) => refusal.status(),
            Outcome::Unavailable(_) | Outcome::NotRun { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Fault {
                blame: Blame::Host, ..
            } => StatusCode::SERVICE_UNAVAILABLE,
            Outcome::Fault { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// What became of the delivery, for the node's metrics.
    pub fn result(&self) -> &'static str {
        match self {
            Outcome::Accepted(_) => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::Reply { .. } => "reply",
            Outcome::Ignored => "ignored",
            Outcome::Refused(_) => "refused",
            Outcome::Unavailable(_) => "unavailable",
            Outcome::NotRun { .. } => "not_run",
            Outcome::Fault { .. } => "fault",
        }
    }

    /// The HTTP status and [`Outcome::result`] together.
    pub fn status_and_result(&self) -> (StatusCode, &'static str) {
        (self.status(), self.result())
    }

    /// Who a request that was not accepted is charged to; `None` when
    /// nothing went wrong.
    pub fn blame(&self) -> Option<Blame> {
        match self {
            Outcome::Accepted(_)
            | Outcome::Duplicate
            | Outcome::Reply { .. }
            | Outcome::Ignored => None,
            Outcome::Refused(_) => Some(Blame::Sender),
            Outcome::Unavailable(_) => Some(Blame::Host),
            // Quarantined by its own faults, or at its own bound.
            Outcome::NotRun { .. } => Some(Blame::Guest),
            Outcome::Fault { blame, .. } => Some(*blame),
        }
    }

    /// The sentence said to the sender when the delivery was not taken.
    pub fn reason(&self) -> Option<String> {
        match self {
            Outcome::Refused(refusal) => Some(refusal.to_string()),
            Outcome::Unavailable(outage) => Some(outage.to_string()),
            Outcome::NotRun { reason, .. } => Some(reason.clone()),
            Outcome::Fault {
                plugin,
                blame: Blame::Host,
            } => Some(format!(
                "webhook plugin {plugin} did not finish: the host failed its call; retry"
            )),
            Outcome::Fault { plugin, .. } => Some(format!("webhook plugin {plugin} failed")),
            _ => None,
        }
    }
}

/// Why a request was refused: the sender's fault, a 4xx the sender should
/// not retry unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No plugin serves the route; `denied_by` names the operator's key
    /// when a plugin declares it and the operator took it away (the key
    /// only: the sender is outside, the file is the operator's).
    #[error("no webhook plugin serves {route}{}", denied_note(denied_by.as_deref()))]
    NoPlugin {
        route: String,
        denied_by: Option<String>,
    },
    #[error(
        "the route's handle is not a seat handle (at most {MAX_ROUTE_HANDLE} bytes of A-Z a-z 0-9 - _ .)"
    )]
    NotAHandle,
    #[error("the body is larger than this route accepts ({cap} bytes)")]
    TooLarge { cap: u64 },
    #[error("unreadable body: {why}")]
    Unreadable { why: String },
    #[error("this company takes no deliveries from {from} (it has no [integrations.{from}])")]
    NoIntegration { from: String },
    /// The plugin's reason, scrubbed, in the host's sentence.
    #[error("not verified: {reason}")]
    NotVerified { reason: String },
    #[error("the body is not a JSON object")]
    NotAnObject,
    /// The plugin's reason, scrubbed, in the host's sentence.
    #[error("not parsed: {reason}")]
    NotParsed { reason: String },
    /// The plugin's answer outgrew the host's transfer bound: the delivery
    /// expanded past what the host takes, so refused like one past its
    /// bounds (a sender told 500 would retry it for ever).
    #[error("not accepted: the plugin's answer is past the host's transfer bound")]
    PastTransferBound,
    #[error("not accepted: {0}")]
    PastBounds(Unbounded),
}

impl Refusal {
    /// The 4xx this refusal answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::NoPlugin { .. } | Refusal::NoIntegration { .. } => StatusCode::NOT_FOUND,
            Refusal::TooLarge { .. }
            | Refusal::PastTransferBound
            | Refusal::PastBounds(Unbounded::TooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::NotVerified { .. } => StatusCode::UNAUTHORIZED,
            Refusal::NotAHandle
            | Refusal::Unreadable { .. }
            | Refusal::NotAnObject
            | Refusal::NotParsed { .. }
            | Refusal::PastBounds(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Why this node cannot take a delivery now: the host's side, 503 +
/// Retry-After, never the sender's fault.
#[derive(Debug, thiserror::Error)]
pub enum Outage {
    #[error("no active company")]
    NoCompany,
    #[error("secret {name} for {from} is not set")]
    SecretUnset { name: String, from: String },
    /// The secret's store could not say (unavailable, or not known yet):
    /// its own sentence.
    #[error("{0}")]
    Secret(String),
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
}

/// Why a delivery did not reach the stream (steps 4–5): the host's side.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("a claim on {key} could not be released yet: {why}")]
    Unreleased { key: String, why: ReleaseError },
    #[error("the stream did not take the delivery: {0}")]
    NotStored(#[source] AckError),
}

fn denied_note(key: Option<&str>) -> String {
    key.map(|k| {
        format!(" (the operator denies it: `{k}` in the node's configuration; remove it there to serve it)")
    })
    .unwrap_or_default()
}
