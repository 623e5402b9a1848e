//! The shell every world's plugin lives in, written once: the manifest,
//! the compiled component (and whether the artifact cache had it), the
//! linker every world starts from (WASI p2 and nothing else), the guard
//! (breaker, concurrency, deadline) and its health, and a fresh store.
//!
//! What differs between the worlds is a [`World`]: the store's world part,
//! the imports it adds beyond WASI, and the typed view it keeps of the
//! pre-instantiated component. Why: the three hosts ([`crate::webhook`],
//! [`crate::provider`], [`crate::module`]) used to write this part each;
//! one shell keeps a change to loading, linking or health the same for
//! every world.

use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::{Component, InstancePre, Linker};

use crate::HealthReport;
use crate::call::Guard;
use crate::manifest::Manifest;
use crate::runtime::{CacheOutcome, CallError, LoadError, Runtime};
use crate::sandbox::Sandbox;

/// What one world adds to the shell.
pub(crate) trait World {
    /// The store's world part (`Sandbox<Self::Ctx>`).
    type Ctx: Send + 'static;
    /// The component as the world calls it: its typed pre-instance.
    type Pre: Clone + Send + Sync + 'static;

    /// Adds the world's imports beyond WASI p2.
    fn link(linker: &mut Linker<Sandbox<Self::Ctx>>) -> wasmtime::Result<()>;

    /// The world's typed view of `pre`, which `component` was linked into.
    fn pre(
        pre: InstancePre<Sandbox<Self::Ctx>>,
        component: &Component,
        engine: &wasmtime::Engine,
    ) -> wasmtime::Result<Self::Pre>;
}

/// A loaded plugin of world `W`, before anything of it runs.
pub(crate) struct Shell<W: World> {
    pub(crate) manifest: Manifest,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) pre: W::Pre,
    pub(crate) guard: Guard,
    pub(crate) cache: CacheOutcome,
}

impl<W: World> Shell<W> {
    /// Compiles (or takes from the cache) and links the component
    /// `manifest` names; a link failure names the component.
    pub(crate) fn load(runtime: &Arc<Runtime>, manifest: Manifest) -> Result<Shell<W>, LoadError> {
        let (component, cache) = runtime.load_component(&manifest)?;
        let mut linker: Linker<Sandbox<W::Ctx>> = Linker::new(runtime.engine());
        let engine_error = |e: wasmtime::Error| LoadError::Engine(format!("{e:#}"));
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_error)?;
        W::link(&mut linker).map_err(engine_error)?;
        let pre = linker
            .instantiate_pre(&component)
            .and_then(|pre| W::pre(pre, &component, runtime.engine()))
            .map_err(|e| LoadError::Link {
                component: manifest.component.clone(),
                reason: format!("{e:#}"),
            })?;
        Ok(Shell {
            guard: runtime.guard(&manifest),
            manifest,
            runtime: runtime.clone(),
            pre,
            cache,
        })
    }

    /// The plugin's health.
    pub(crate) fn health(&self) -> HealthReport {
        self.guard.health().report()
    }

    /// A fresh store holding `world`, limited as the manifest says.
    pub(crate) fn store(&self, world: W::Ctx) -> Result<Store<Sandbox<W::Ctx>>, CallError> {
        self.runtime
            .new_store(&self.manifest, self.guard.speaker(), world)
            .map_err(|e| CallError::Instantiate {
                plugin: self.manifest.name.clone(),
                reason: e.to_string(),
            })
    }
}
