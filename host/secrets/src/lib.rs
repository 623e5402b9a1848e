//! The company's secrets: where they live, how they are sealed, and the one
//! way the node reads them.
//!
//! - [`Secrets`] mirrors the fleet's secrets bucket in memory (a watch keeps
//!   it current) and writes it; values are [`Record`]s holding an
//!   [`Envelope`] sealed by this node's [`Keyring`] — plaintext never
//!   reaches the broker, its files or its history.
//! - [`Keyring`] is the node's Tier A key file (default
//!   `<data dir>/keyring`, mode 0600 or the node refuses to start).
//! - [`Resolver`] is what the webhook edge, MCP launch templates and model
//!   credentials hold: a name answers [`Lookup::Found`], [`Lookup::Unset`],
//!   [`Lookup::Unavailable`] (set but not openable here: a 503, never an
//!   empty value) or [`Lookup::Unknown`] (the bucket has not answered this
//!   node yet: wait or retry, never "unset").
//! - `rotate` re-seals every value under a new key and retires the keys no
//!   envelope names any more.
//!
//! No wasmtime, no axum: the crate sits below every reader.

pub mod admin;
pub mod forms;
pub use forms::forms;
pub mod keyring;
pub mod mirror;
pub mod record;
pub mod resolver;
mod rotate;

pub use keyring::{Envelope, Keyring, KeyringError, OpenError};
pub use mirror::{
    Basis, FIRST_LISTING, Knowledge, Listed, MAX_SECRET_BYTES, Opener, Record, SECRET_CLASS,
    Secrets, SecretsError, Source, Standing, check_name,
};
pub use resolver::{Lookup, Resolver};
pub use rotate::Rotation;
