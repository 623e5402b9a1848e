//! A crewlet node: the command line, the lifecycle and the wiring.
//!
//! This crate is the one place that knows every subsystem; each of them
//! knows only what it needs. The lifecycle is the rule that matters here:
//! the HTTP surface binds first, then subsystems start in order; a signal
//! turns `/ready` to 503 at once, subsystems stop in the reverse order, and
//! the stream (with its embedded nats-server) stops last.
//!
//! Every module is the crate's own (`pub(crate)`): the binary reaches the
//! node through [`main`] alone, so rustc's dead-code lint sees all of it.
//! A feature lives in a crate of its own (`crewlet-configplane`,
//! `crewlet-history`, …) and this crate wires it.

pub(crate) mod cli;
pub(crate) mod client;
pub(crate) mod company;
pub(crate) mod config_import;
pub(crate) mod descriptors;
pub(crate) mod doctor;
pub(crate) mod engine;
pub(crate) mod identity;
pub(crate) mod ingress;
pub(crate) mod local_guard;
pub(crate) mod logging;
pub(crate) mod plugin_try;
pub(crate) mod run;
pub(crate) mod sample;
pub(crate) mod seat_tools;
pub(crate) mod seats;
pub(crate) mod secrets_cli;
pub(crate) mod start;
pub(crate) mod state;
pub(crate) mod surface;

pub use cli::main;

/// The version this binary reports.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
