//! What the node plugs into seat ownership: the [`SeatHost`].
//!
//! Rule: this crate decides *which* seats this node runs and *when* a seat
//! may take work; the host decides *what* running one means (the instance,
//! its budget, its MCP children, the turn). Why: the acquire → equip →
//! attach order and its mirror are the one behaviour none of the composed
//! parts can express alone, and keeping it free of MCP, models and HTTP lets
//! it be tested against a real broker with a host that only records calls.

use std::future::Future;
use std::time::Duration;

use crewlet_bus::Wake;
use crewlet_company::{Active, Handle};
use crewlet_coord::Fence;

/// The seat a host equips and runs: what the company says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatSpec {
    pub handle: Handle,
    pub seat_id: uuid::Uuid,
    pub role: String,
    /// Placement group; `None` is the default group.
    pub group: Option<String>,
}

impl SeatSpec {
    /// The spec of `handle` in `active`, if the company has that seat.
    pub fn of(active: &Active, handle: &Handle) -> Option<SeatSpec> {
        active.company.seats.get(handle).map(|s| SeatSpec {
            handle: s.handle.clone(),
            seat_id: s.id,
            role: s.role.clone(),
            group: s.group.clone(),
        })
    }
}

/// One turn's worth of work: the wakes of one conversation, in stream order.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The conversation the wakes share; `None` is a lone wake.
    pub conversation: Option<String>,
    /// At least one wake, in stream order.
    pub wakes: Vec<Wake>,
    /// The company as it was when the turn started; a change applies to
    /// the next turn.
    pub active: Active,
    /// Whether this node may still act for the seat: the seat lease's
    /// [`Fence`] — yes: act; unknown (the last renew older than a seat
    /// beat): finish what is under way, start nothing the seat's next owner
    /// could duplicate; no (lost, or released): stop.
    pub fence: Fence,
}

/// How a turn ended, which decides what happens to its wakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnVerdict {
    /// The work is done: every wake is acknowledged.
    Done,
    /// Try again later: every wake is handed back, to be delivered again
    /// after `after` (to this node or the seat's next owner).
    Retry { after: Duration, reason: String },
    /// The work can never succeed: every wake is terminated (not delivered
    /// again) and the reason logged.
    Poison { reason: String },
    /// The seat's budget has no room: every wake is handed back and the
    /// seat's mailbox takes nothing until [`SeatHost::room`] says there is
    /// room for `need` tokens — asked after `after` (when the full window
    /// turns over) and whenever the company changes.
    Park {
        after: Duration,
        need: u64,
        reason: String,
    },
}

/// What [`SeatHost::room`] found: whether a parked seat may take work again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Room {
    /// There is room: the seat takes its work again.
    Free,
    /// Still full: ask again after `after`.
    Full { after: Duration, reason: String },
    /// The counters did not answer: neither room nor full; ask again soon.
    Unknown(String),
}

/// The host: builds a seat's instance, tears it down, and runs its turns.
///
/// `equip` runs after the lease is won and before the mailbox is attached,
/// then `hydrate` (acquire → equip → hydrate → attach);
/// `unequip` after the mailbox is detached and before the lease is
/// released; `run` only between the two. Turns of different conversations
/// of one seat may run concurrently; one conversation's never do.
pub trait SeatHost: Send + Sync + 'static {
    /// What a seat needs to run turns (instance, budget, MCP children).
    type Equipped: Send + Sync + 'static;

    /// Builds the seat. An error is logged and the seat given back; the
    /// message should say what to fix.
    fn equip(
        &self,
        seat: &SeatSpec,
        active: &Active,
    ) -> impl Future<Output = Result<Self::Equipped, String>> + Send;

    /// Brings the seat's memory to this node, after `equip` and before the
    /// mailbox is attached. An error means the memory could not be read
    /// (unknown, never "empty"): the mailbox stays detached and `hydrate`
    /// is asked again with backoff while the lease holds. The message says
    /// what could not be read. A host without memory has nothing to bring.
    fn hydrate(&self, seat: &SeatSpec) -> impl Future<Output = Result<(), String>> + Send {
        let _ = seat;
        async { Ok(()) }
    }

    /// Tears the seat down (stops its children). Called once per equip that
    /// succeeded, after the last turn ended.
    fn unequip(&self, seat: &SeatSpec, equipped: Self::Equipped)
    -> impl Future<Output = ()> + Send;

    /// Runs one turn.
    fn run(
        &self,
        seat: &SeatSpec,
        equipped: &Self::Equipped,
        batch: Batch,
    ) -> impl Future<Output = TurnVerdict> + Send;

    /// Whether a parked seat has room for `need` tokens under `active` now:
    /// reads, never a model call. A host that never parks has room.
    fn room(
        &self,
        seat: &SeatSpec,
        active: &Active,
        need: u64,
    ) -> impl Future<Output = Room> + Send {
        let _ = (seat, active, need);
        async { Room::Free }
    }
}
