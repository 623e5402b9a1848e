//! The config plane (`crewlet-configplane`): one company, agreed by pointer.
//!
//! Rule: a company document becomes active only by a compare-and-set on the
//! fleet's config pointer, whose own revision is the epoch; every node polls
//! the pointer and applies what it names. Why: two operators activating at
//! once get two revisions in order rather than one overwriting the other,
//! and every node can tell from one number whether it serves what the fleet
//! agreed on.
//!
//! - A revision's document is stored in the config bucket before the pointer
//!   names it (record `company_revision:{digest}`), so any node can read it.
//! - `PUT /config` validates first (400 with every error and its path),
//!   stores, then activates. `GET /config` answers the active revision.
//! - The reconciler polls every [`POLL_INTERVAL`]; applying an epoch sets the
//!   node's [`crewlet_company::ActiveCompany`], records it in the node store
//!   and writes this node's status in the status bucket.
//! - Unknown is never no: an unreadable pointer keeps the company the node
//!   serves, and the HTTP routes answer 503 with Retry-After.
//! - Postures ([`decide`]): after every poll the reconciler picks one from
//!   what it sees of the pointer and of its peers' statuses, shows it on
//!   `/health`, carries it on the presence lease and writes it with its
//!   status. `serve`: applied the pointer's epoch (or nothing is activated).
//!   `isolated`: the pointer (or the revision it names) cannot be read —
//!   keep serving the last applied epoch. Behind the pointer: `shed` when a
//!   peer has applied the epoch and this node has been behind for
//!   [`SHED_GRACE`]; else `stuck` when this node has failed to apply the
//!   revision (missing, malformed or refused document) for [`STUCK_AFTER`];
//!   else `wait`. Lag alone never sheds (a peer must have the epoch *and*
//!   the grace must pass: every rollout has lag, and shedding on it would
//!   make the first node to apply the cause of an outage), and a node with
//!   no peer ahead of it waits rather than sheds (stepping out when nobody
//!   has the epoch is stopping, not shedding). An unreadable peer listing
//!   is unknown, never "no peer", and so never sheds either; a peer whose
//!   status does not report `applied_epoch` (an older build) is not counted
//!   as having the epoch, so a node never sheds on a peer's silence.
//!   `/ready` fails on shed and stuck (the table is in `crewlet-node`'s
//!   `state`);
//!   a shedding node stops consuming
//!   `notify-inbound`.
//! - At start, a node holding an offline import (`crewlet config import`
//!   with the node stopped) publishes it through the pointer from wherever
//!   the pointer is (it is the operator's latest word). A node started with
//!   `--company` activates that document only if the pointer is unset, so
//!   the first node of a fleet seeds it and a restarted or joining node
//!   follows the fleet instead of overwriting it (saying so at WARN and in
//!   `/health`); `--activate-company` publishes it like an import.
//!
//! One job per file: [`activation`] (the compare-and-set protocol),
//! [`requests`] (what `PUT`/`GET /config` ask of it; the routes are
//! `crewlet-api`'s), [`posture`] (the pure rule), [`reconciler`] (the poll
//! loop every node runs). The CLI's `config import` is `crewlet-node`'s.
//! It knows nothing of HTTP, plugins or MCP: how a document is accepted
//! and where the posture is shown are handed in by the node.

pub mod activation;
pub mod posture;
pub mod reconciler;
pub mod requests;

pub use activation::{Activation, ConfigError, activate};
pub use posture::{Posture, PostureReport, SHED_GRACE, STUCK_AFTER, decide};
pub use reconciler::{
    Accept, POLL_INTERVAL, Parts, Postures, Running, STATUS_REFRESH, Seed, start,
};
pub use requests::Plane;
