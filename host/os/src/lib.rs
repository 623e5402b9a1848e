//! What every crate asks of the operating system, asked one way.
//!
//! Two pieces the node, the MCP children, the embedded broker and the test
//! kit each needed, kept here so that there is one reading of each:
//! - [`now_ms`]: the wall clock as Unix milliseconds, the unit of every
//!   stored and published timestamp.
//! - [`DieWithParent`]: a child that gets SIGKILL when the thread that forked
//!   it ends, so a crashed or killed parent leaves no orphans behind.
//!
//! Depends on nothing of Crewlet, so the lowest crate may use it.

mod clock;
mod spawn;

pub use clock::now_ms;
pub use spawn::DieWithParent;
