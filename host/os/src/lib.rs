//! What every crate asks of the operating system, asked one way.
//!
//! Pieces the node, the MCP children, the embedded broker, the plugin host and the test
//! kit each needed, kept here so that there is one reading of each:
//! - [`now_ms`] / [`wall_now`]: the wall clock as Unix milliseconds, the
//!   unit of every stored and published timestamp (shifted, in tests only,
//!   by [`TEST_CLOCK_OFFSET_ENV`]).
//! - [`DieWithParent`]: a child that gets SIGKILL when the thread that forked
//!   it ends, so a crashed or killed parent leaves no orphans behind.
//! - [`lower_thread_priority`]: a thread the kernel serves after the node's
//!   own (the plugin guest threads).
//! - [`ConfigEpoch`]: the config pointer's epoch, a type every crate that
//!   carries it can see (the company, the store, the MCP children, the
//!   config plane and coordination, which mints it).
//! - [`Vector`] / [`Episode`] / [`Said`]: the memory rows the turn engine and the
//!   node store both speak, defined once.
//! - [`Stoppable`]: a background loop with an explicit stop that waits for
//!   it to end.
//!
//! Depends on nothing of Crewlet, so the lowest crate may use it.

mod clock;
mod config_epoch;
mod memory_rows;
mod priority;
mod spawn;
mod task;

pub use clock::{TEST_CLOCK_OFFSET_ENV, now_ms, wall_now};
pub use config_epoch::ConfigEpoch;
pub use memory_rows::{Episode, Said, Vector};
pub use priority::lower_thread_priority;
pub use spawn::DieWithParent;
pub use task::Stoppable;
