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
//!
//! Depends on nothing of Crewlet, so the lowest crate may use it.

mod clock;
mod priority;
mod spawn;

pub use clock::{TEST_CLOCK_OFFSET_ENV, now_ms, wall_now};
pub use priority::lower_thread_priority;
pub use spawn::DieWithParent;
