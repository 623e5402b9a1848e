//! The integration tests of `crewlet-mcp` against real MCP server children:
//! one module per area, all in one test binary (one build and link instead
//! of one per file).

mod common;

mod everything;
mod recipes;
mod registry;
