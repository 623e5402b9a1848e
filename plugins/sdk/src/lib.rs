//! Crewlet's guest SDK: the bindings of one plugin world plus the few
//! helpers every plugin of that world would otherwise write again.
//!
//! Enable exactly one feature, matching the manifest's `kind`:
//! - `webhook`: [`webhook`] — export with `crewlet_plugin_sdk::webhook::export_webhook!(T)`;
//!   say where a reply is owed with `Delivery::owed`.
//! - `provider`: [`provider`] — export with `provider::export_provider!(T)`; send
//!   requests with [`provider::http::send`], which follows redirects and
//!   reports a host refusal as [`provider::http::HttpFailure::Denied`];
//!   turn a failure into a `ProviderError` with [`provider::classify`].
//! - Every world: write to the node's log with `<world>::log::write`.
//! - `module`: [`module`] — export with `module::export_module!(T)`; the state,
//!   log and bus imports are in [`module::state`], [`module::log`] and
//!   [`module::bus`]; publish JSON with [`module::publish`], dispatch tool
//!   calls with [`module::Tools`].
//!
//! One feature per plugin because the world a component targets is decided
//! by the bindings linked into it; two worlds in one component is a
//! component the host refuses.

#[cfg(feature = "webhook")]
pub mod webhook;

#[cfg(feature = "provider")]
pub mod provider;

#[cfg(feature = "module")]
pub mod module;
