//! What [`crate::Seats::start`] is given: the configuration, its defaults,
//! the pause gate every seat reads, and why a configuration is refused.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use crewlet_company::ActiveCompany;
use crewlet_coord::{Coord, Leases, Owner, Roster};
use tokio::sync::watch;

use crate::host::SeatHost;

/// What [`Seats::start`] needs. Heartbeat and lease TTL are the seat
/// leases' (the options and the leases bucket in force).
pub struct SeatsConfig<H: SeatHost> {
    /// This node's stable id (its presence lease is `node:{node_id}`).
    pub node_id: String,
    /// This node's `[node] labels`: a seat of a group the company pins to
    /// labels runs here only if these hold every pair. Default: none.
    pub labels: std::collections::BTreeMap<String, String>,
    /// This process incarnation: the owner every seat lease is taken as.
    pub owner: Owner,
    pub leases: SeatLeases,
    pub js: jetstream::Context,
    pub active: ActiveCompany,
    pub host: Arc<H>,
    /// Turns running at once on this node, across every seat (≥ 1).
    pub max_concurrent_turns: usize,
    /// How long to wait for more wakes of one conversation before its turn
    /// starts. Default 50 ms.
    pub batch_window: Duration,
    /// How long one pull request waits for wakes (and so how long a detach
    /// may wait for the one in flight). Default 1 s.
    pub fetch_expiry: Duration,
    /// How often the node looks for mailbox work no wake announced
    /// ([`crate::sweep`]): the longest a redelivered wake waits. Default 30 s.
    pub idle_fetch: Duration,
    /// How long a detach lets running turns finish before cancelling them
    /// (their wakes are handed back). Default: the lease TTL.
    pub drain_bound: Option<Duration>,
    /// First pause after a seat failed to equip or attach; doubles per
    /// failure up to 64×. Default 10 s.
    pub equip_backoff: Duration,
    /// Longest an equip may take; past it the equip is dropped (what it
    /// started goes with it), counted as failed, and the lease given back.
    /// Default 60 s: a host that hangs must not keep a seat no one serves.
    pub equip_timeout: Duration,
    /// Longest an unequip may take before it is dropped and the lease is
    /// released anyway. Default 30 s.
    pub unequip_timeout: Duration,
    /// Wakes one seat holds fetched but unsettled at most. Default 256.
    pub max_outstanding: usize,
    /// Whether this node takes work off its seats' mailboxes at all: false
    /// while it sheds (its config posture), so the work waits for a peer
    /// or for this node to catch up. Default: always true.
    pub admission: watch::Receiver<bool>,
    /// The fleet's paused seats: a paused seat takes nothing off its
    /// mailbox (its wakes wait there) and launches no turn. `None` is
    /// unknown — the pauses were never read — and admits nothing: a seat
    /// an operator paused must not run because a read failed. Default:
    /// known, none paused.
    pub pauses: watch::Receiver<Option<Pauses>>,
    /// Moved by the host when what a failed equip lacked may be there now
    /// (the node: its secrets changed, so a credential not known may be):
    /// a seat backing off after a failed equip that began before the move
    /// is claimed again at once, not after its backoff. Default: never moves.
    pub retry_equip: watch::Receiver<u64>,
}

/// All of coordination seats may reach: the seat leases (won, held,
/// listed, who held them last) and who is present (the node leases, read
/// only) — no record bucket, no budget, no config pointer.
#[derive(Clone)]
pub struct SeatLeases {
    pub seats: Leases,
    pub nodes: Roster,
}

impl SeatLeases {
    /// The seat leases and the node roster of `coord`.
    pub fn of(coord: &Coord) -> SeatLeases {
        SeatLeases {
            seats: coord.leases("seat"),
            nodes: coord.roster("node"),
        }
    }
}

/// The handles of the paused seats, as the fleet's pause records say.
pub type Pauses = Arc<std::collections::BTreeSet<String>>;

/// Whether `handle` may take work under `pauses`: known and not paused.
pub fn admits(pauses: &Option<Pauses>, handle: &str) -> bool {
    pauses.as_ref().is_some_and(|p| !p.contains(handle))
}

impl<H: SeatHost> SeatsConfig<H> {
    /// A configuration with the defaults above.
    pub fn new(
        node_id: impl Into<String>,
        owner: Owner,
        leases: SeatLeases,
        js: jetstream::Context,
        active: ActiveCompany,
        host: Arc<H>,
    ) -> SeatsConfig<H> {
        SeatsConfig {
            node_id: node_id.into(),
            labels: Default::default(),
            owner,
            leases,
            js,
            active,
            host,
            max_concurrent_turns: 16,
            batch_window: Duration::from_millis(50),
            fetch_expiry: Duration::from_secs(1),
            idle_fetch: Duration::from_secs(30),
            drain_bound: None,
            equip_backoff: Duration::from_secs(10),
            equip_timeout: Duration::from_secs(60),
            unequip_timeout: Duration::from_secs(30),
            max_outstanding: 256,
            admission: watch::channel(true).1,
            pauses: watch::channel(Some(Pauses::default())).1,
            retry_equip: watch::channel(0).1,
        }
    }
}

/// Why [`Seats::start`] refused a configuration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SeatsError {
    #[error("max_concurrent_turns is 0: no turn could ever run; set it to at least 1")]
    NoTurns,
    #[error("max_outstanding is 0: no wake could ever be fetched; set it to at least 1")]
    NoOutstanding,
    #[error("{name} is {value:?}: it must be above zero")]
    ZeroDuration { name: &'static str, value: Duration },
    #[error("node_id is empty or not a valid lease segment ({0}); use the node's stable id")]
    NodeId(String),
}
