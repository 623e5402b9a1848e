//! A crewlet node: the command line, the lifecycle and the wiring.
//!
//! This crate is the one place that knows every subsystem; each of them
//! knows only what it needs. The lifecycle is the rule that matters here:
//! the HTTP surface binds first, then subsystems start in order; a signal
//! turns `/ready` to 503 at once, subsystems stop in the reverse order, and
//! the stream (with its embedded nats-server) stops last.

pub mod budgets;
pub mod cli;
pub mod client;
pub mod company;
pub mod configplane;
pub mod descriptors;
pub mod doctor;
pub mod duties;
pub mod engine;
pub mod fleet;
pub mod history;
pub mod identity;
pub mod ingress;
pub mod local_guard;
pub mod logging;
pub mod metrics;
pub mod module_state;
pub mod modules;
pub mod operator;
pub mod pauses;
pub mod plugin_try;
pub mod plugins;
pub mod presence;
pub mod run;
pub mod sample;
pub mod seat_tools;
pub mod seats;
pub mod secrets;
pub mod start;
pub mod state;
pub mod tokens;

/// The version this binary reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
