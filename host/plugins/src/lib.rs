//! Crewlet's plugin host: sandboxed WebAssembly components, loaded from a
//! plugins directory, each touching exactly what its manifest declares.
//!
//! - [`manifest`]: `plugin.toml`, validated field by field.
//! - [`catalogue`]: every manifest under a directory, checked together;
//!   [`check`] and [`list`] are what `crewlet plugins check|list` print.
//! - [`runtime`]: the engine (pooling, memory caps, the artifact cache) and
//!   typed faults; [`sandbox`]: what one instance's store holds, per world.
//! - [`call`]: the one way into a guest (breaker, concurrency bound, guest
//!   threads, deadline; [`whereabouts`]: who a call its deadline cut is
//!   charged to); [`breaker`]: health and quarantine; [`scrub`]:
//!   what a plugin says, made safe to repeat; [`voice`]: its `log` lines
//!   and stderr in the node's log, rationed by [`ration`].
//! - [`webhook`], [`provider`], [`module`]: one host per world, each
//!   around the one shell (`shell.rs`: manifest, component, linker, guard);
//!   [`installed`]: the ones a node serves now, swapped whole on reload.
//! - [`state`]: module state on NATS JetStream key-value buckets (ADR 202).
//! - [`grant`]: the operator's grants, resolved once into the manifests
//!   (held = declared + added − denied); [`effective`]: each permission
//!   with where it came from.
//! - [`scaffold`]: `crewlet plugins new`.

pub mod bindings;
pub mod breaker;
pub mod call;
pub mod catalogue;
pub mod cli;
pub mod crypto;
pub mod effective;
pub mod fault;
pub mod grant;
pub mod installed;
pub mod latency;
pub mod manifest;
pub mod module;
pub mod outbound;
pub mod pool;
pub mod provider;
pub mod ration;
pub mod runtime;
pub mod sandbox;
pub mod scaffold;
pub mod scrub;
mod shell;
pub mod state;
pub mod state_view;
pub mod trial;
pub mod voice;
pub mod webhook;
pub mod whereabouts;

pub use breaker::{BreakerState, HealthReport};
pub use call::GuestThreads;
pub use catalogue::{Catalogue, CheckReport, DirError, PluginList};
pub use cli::{PluginsError, check, list};
pub use fault::Blame;
pub use installed::{Installed, Plugin};
pub use latency::Latency;
pub use manifest::{Kind, Manifest, ManifestError};
pub use runtime::{CallError, Fault, LoadError, Runtime, RuntimeConfig};
pub use scaffold::{ScaffoldReport, scaffold};
