//! Crewlet's plugin host: sandboxed WebAssembly components, loaded from a
//! plugins directory, each touching exactly what its manifest declares.
//!
//! - [`manifest`]: `plugin.toml`, validated field by field.
//! - [`catalogue`]: every manifest under a directory, checked together;
//!   [`check`] and [`list`] are what `crewlet plugins check|list` print.
//! - [`runtime`]: the engine (pooling, epoch deadlines, memory caps, the
//!   artifact cache), typed faults and plugin health.
//! - [`webhook`], [`provider`], [`module`]: one host per world.
//! - [`state`]: module state on NATS JetStream key-value buckets (ADR 202).
//! - [`scaffold`]: `crewlet plugins new`.

pub mod bindings;
pub mod catalogue;
pub mod cli;
pub mod crypto;
pub mod manifest;
pub mod module;
pub mod outbound;
pub mod pool;
pub mod provider;
pub mod runtime;
pub mod scaffold;
pub mod state;
pub mod webhook;

pub use catalogue::{Catalogue, CheckReport, PluginList};
pub use cli::{PluginsError, check, list};
pub use manifest::{Kind, Manifest, ManifestError};
pub use runtime::{CallError, Fault, HealthReport, LoadError, Runtime, RuntimeConfig};
pub use scaffold::{ScaffoldReport, scaffold};
