//! Crewlet's guest SDK: the bindings of one plugin world plus the few
//! helpers every plugin of that world would otherwise write again.
//!
//! Enable exactly one feature, matching the manifest's `kind`:
//! - `webhook`: [`webhook`] — export with `crewlet_plugin_sdk::webhook::export_webhook!(T)`;
//!   say where a reply is owed with `Delivery::owed`.
//! - `provider`: [`provider`] — export with `provider::export_provider!(T)`; send
//!   requests with [`provider::http::send`], which follows redirects and
//!   reports a host refusal as [`provider::http::HttpFailure::Denied`];
//!   turn a failed response into a `ProviderError` with
//!   [`provider::classify::classify`] — one classifier for every vendor, so
//!   the same failure gets the same kind from every provider.
//! - Every world: write to the node's log with `<world>::log::write`.
//! - `module`: [`module`] — export with `module::export_module!(T)`; the state,
//!   log and bus imports are in [`module::state`], [`module::log`] and
//!   [`module::bus`]; publish JSON with [`module::publish`], dispatch tool
//!   calls with [`module::Tools`].
//!
//! One feature per plugin because the world a component targets is decided
//! by the bindings linked into it; two worlds in one component is a
//! component the host refuses.
//!
//! # Out of tree
//!
//! `crewlet plugins new` ships this crate and the WIT beside a new plugin,
//! as `crewlet-sdk/plugins/sdk/` and `crewlet-sdk/wit/` — the repository's
//! own layout, so the bindings' `path: "../../wit"` holds in both places —
//! and the plugin depends on it by path with its version. That is why the
//! manifest inherits nothing from the guest workspace: it is copied as it
//! is, and builds with only `cargo build --target wasm32-wasip2`. The
//! repository's plugins use this same crate.

#[cfg(feature = "webhook")]
pub mod webhook;

#[cfg(feature = "provider")]
pub mod provider;

#[cfg(feature = "module")]
pub mod module;

/// The JSON crate the SDK reads and writes with, so a plugin needs no
/// dependency of its own for it.
#[cfg(any(feature = "provider", feature = "module"))]
pub use serde_json;
