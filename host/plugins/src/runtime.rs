//! The plugin runtime: one wasmtime engine, its artifact cache, and the
//! sandbox every call runs in.
//!
//! Rules, and why:
//! - **Pooling allocator**: instance slots are reserved once, so a fresh
//!   instance per call costs microseconds and instances never share memory.
//! - **Guest code never runs on the node's I/O threads**: calls run on the
//!   runtime's guest threads and yield every epoch tick
//!   ([`crate::call`], [`crate::sandbox`]).
//! - **Deadline per call, host calls included**: the tick budget stops a
//!   guest spinning in its own code; a `tokio` timeout around the whole call
//!   stops one waiting in a host call (a slow vendor, a slow bus).
//! - **A trapped instance is never re-entered**: an instance whose call
//!   failed in any way (trap, timeout, dropped future) is dropped; only an
//!   instance whose last call succeeded goes back to the idle list.
//! - **Quarantine**: every plugin has a circuit breaker over its faults
//!   ([`crate::breaker`]).
//! - **Artifact cache** in `<data dir>/plugin-cache`, keyed by the
//!   component's SHA-256 and a fingerprint of wasmtime's version and engine
//!   configuration. An artifact is loaded only if its own SHA-256 matches the
//!   digest this host recorded beside it and wasmtime accepts its header;
//!   anything else — stale, foreign, truncated — is recompiled, never trusted.

use std::hash::Hasher;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{FsPerms, WasiCtx};

use crate::call::{GuestThreads, Guests};
pub use crate::fault::{CallError, Fault};
use crate::manifest::{Kind, Manifest};
use crate::sandbox::{Bounds, EPOCH_TICK, Sandbox, ZeroClock};
use crate::voice::{Speaker, Voice};

/// The wasmtime this host embeds; part of every artifact's key.
pub const WASMTIME_VERSION: &str = "48.0.8";
/// The WIT package this host implements, and the versions it loads: any
/// 0.4.x (a 0.4.0 webhook through its own bindings, `webhook/v0_4_0.rs`; a
/// 0.4.1 or 0.4.0 provider without `embeddings`, `provider.rs`); a
/// component of any other minor version (0.3.x included: its webhook
/// `delivery` had no `owed`) is refused naming them.
pub const SUPPORTED_PACKAGE: &str = "crewlet:plugin@0.4.2";
/// Every version this host loads, as a refusal names them.
pub const SUPPORTED_VERSIONS: &str =
    "crewlet:plugin@0.4.2, crewlet:plugin@0.4.1 and crewlet:plugin@0.4.0";
/// The version prefix of [`SUPPORTED_PACKAGE`] a component must carry.
const SUPPORTED_PREFIX: &str = "0.4.";

/// Why a plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "{}: field `component`: cannot read {}: {source}; build the plugin (for the repo's plugins: cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml)",
        manifest.display(), component.display()
    )]
    MissingComponent {
        manifest: PathBuf,
        component: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: the component is not a valid WebAssembly component: {reason}", component.display())]
    Invalid { component: PathBuf, reason: String },
    #[error("{}: the component targets {found}, a version this host does not support; it supports {SUPPORTED_VERSIONS} (worlds webhook, provider, module). Rebuild it against wit/ of this release", component.display())]
    UnsupportedVersion { component: PathBuf, found: String },
    #[error("{}: the component exports no world this host knows (its exports: {exports}); it supports {SUPPORTED_VERSIONS} (worlds webhook, provider, module)", component.display())]
    UnknownWorld { component: PathBuf, exports: String },
    #[error("{}: field `kind`: the manifest says {expected} but the component targets the {found} world; fix `kind` or rebuild the component", manifest.display())]
    WorldMismatch {
        manifest: PathBuf,
        expected: Kind,
        found: Kind,
    },
    #[error("{}: the component needs imports its world does not grant: {reason}", component.display())]
    Link { component: PathBuf, reason: String },
    #[error("plugin `{plugin}`: cannot prepare its scratch directory {}: {source}", dir.display())]
    Scratch {
        plugin: String,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin `{plugin}`: `init` refused to start: {reason}")]
    Init { plugin: String, reason: String },
    #[error("plugin `{plugin}`: `init` failed: {fault}")]
    InitFault { plugin: String, fault: Fault },
    #[error("the plugin engine could not start: {0}")]
    Engine(String),
}

/// Where an artifact came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache.
    Hit,
    /// Not in the cache (or no cache): compiled, and stored if there is one.
    Compiled,
    /// In the cache but refused (carries why); recompiled and replaced.
    Recompiled(String),
}

/// Options for a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The data directory: the artifact cache and scratch directories live
    /// under it. `None` disables both (scratch requests are then refused).
    pub data_dir: Option<PathBuf>,
    /// Instances the pool holds at once, across all plugins.
    pub max_instances: u32,
    /// Where guest code runs.
    pub guest_threads: GuestThreads,
    /// When a plugin's breaker opens, and for how long.
    pub breaker: crate::breaker::BreakerPolicy,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            data_dir: None,
            max_instances: 128,
            guest_threads: GuestThreads::default_dedicated(),
            breaker: crate::breaker::BreakerPolicy::default(),
        }
    }
}

struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The engine all plugins share.
pub struct Runtime {
    engine: Engine,
    config: RuntimeConfig,
    fingerprint: String,
    guests: Arc<Guests>,
    _ticker: Ticker,
}

struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        // Only the digest is used; `finish` is never part of a key.
        0
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Runtime {
    /// Builds the engine and starts its epoch ticker.
    pub fn new(config: RuntimeConfig) -> Result<Arc<Runtime>, LoadError> {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(config.max_instances)
            .total_core_instances(config.max_instances * 4)
            .total_memories(config.max_instances * 2)
            .total_tables(config.max_instances * 4)
            .total_stacks(config.max_instances)
            .max_memory_size((crate::manifest::MAX_MEMORY_MIB * 1024 * 1024) as usize)
            .max_memories_per_component(4)
            .max_core_instances_per_component(16)
            .max_tables_per_component(16);
        let mut wasm = Config::new();
        wasm.wasm_component_model(true)
            .epoch_interruption(true)
            .max_wasm_stack(512 * 1024)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        // `CREWLET_WASM_PERFMAP=1`: guest code named in /tmp/perf-PID.map,
        // so `perf report` shows plugin functions rather than bare addresses.
        if std::env::var_os("CREWLET_WASM_PERFMAP").is_some() {
            wasm.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&wasm).map_err(|e| LoadError::Engine(format!("{e:#}")))?;

        let mut hasher = ShaHasher(Sha256::new());
        hasher.write(WASMTIME_VERSION.as_bytes());
        std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
        let fingerprint = hex(&hasher.0.finalize()[..8]);

        let guests = Guests::new(config.guest_threads)
            .map_err(|e| LoadError::Engine(format!("cannot start the guest threads: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let ticking = engine.clone();
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("plugin-epoch".to_string())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticking.increment_epoch();
                }
            })
            .map_err(|e| LoadError::Engine(format!("cannot start the epoch ticker: {e}")))?;
        Ok(Arc::new(Runtime {
            engine,
            config,
            fingerprint,
            guests: Arc::new(guests),
            _ticker: Ticker { stop },
        }))
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The way in for one plugin's calls ([`crate::call`]).
    pub(crate) fn guard(&self, manifest: &Manifest) -> crate::call::Guard {
        crate::call::Guard::new(
            &manifest.name,
            manifest.kind,
            manifest.limits.concurrency,
            self.config.breaker,
            self.guests.clone(),
        )
    }

    /// The artifact cache directory, if there is a data dir.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        self.config
            .data_dir
            .as_ref()
            .map(|d| d.join("plugin-cache"))
    }

    /// Loads `manifest`'s component (from the cache when it can), checks
    /// its world against the manifest's kind.
    pub fn load_component(
        &self,
        manifest: &Manifest,
    ) -> Result<(Component, CacheOutcome), LoadError> {
        let bytes =
            std::fs::read(&manifest.component).map_err(|source| LoadError::MissingComponent {
                manifest: manifest.file.clone(),
                component: manifest.component.clone(),
                source,
            })?;
        let (component, outcome) = self.compile_cached(&manifest.component, &bytes)?;
        let found = world_of(&self.engine, &component, &manifest.component)?;
        if found != manifest.kind {
            return Err(LoadError::WorldMismatch {
                manifest: manifest.file.clone(),
                expected: manifest.kind,
                found,
            });
        }
        Ok((component, outcome))
    }

    fn compile_cached(
        &self,
        path: &Path,
        bytes: &[u8],
    ) -> Result<(Component, CacheOutcome), LoadError> {
        let compile = || {
            Component::new(&self.engine, bytes).map_err(|e| LoadError::Invalid {
                component: path.to_path_buf(),
                reason: format!("{e:#}"),
            })
        };
        let Some(dir) = self.cache_dir() else {
            return Ok((compile()?, CacheOutcome::Compiled));
        };
        let key = format!("{}-{}", hex(&Sha256::digest(bytes)), self.fingerprint);
        let artifact = dir.join(format!("{key}.cwasm"));
        let digest_file = dir.join(format!("{key}.sha256"));
        let refused = match (
            std::fs::read(&artifact),
            std::fs::read_to_string(&digest_file),
        ) {
            (Ok(code), Ok(recorded)) => {
                if hex(&Sha256::digest(&code)) != recorded.trim() {
                    Some("its digest does not match the one recorded".to_string())
                } else {
                    // SAFETY: the bytes are an artifact this host serialized
                    // (their digest matches the one it recorded), and wasmtime
                    // checks the header against this engine's version and
                    // configuration before using them.
                    match unsafe { Component::deserialize(&self.engine, &code) } {
                        Ok(c) => return Ok((c, CacheOutcome::Hit)),
                        Err(e) => Some(format!("wasmtime refused it: {e}")),
                    }
                }
            }
            (Err(_), _) => None,
            (Ok(_), Err(_)) => Some("no digest was recorded for it".to_string()),
        };
        if let Some(reason) = &refused {
            tracing::warn!(artifact = %artifact.display(), "recompiling a cached plugin artifact: {reason}");
        }
        let component = compile()?;
        if let Err(e) = store_artifact(&dir, &artifact, &digest_file, &component) {
            tracing::warn!(dir = %dir.display(), "cannot write the plugin artifact cache: {e}");
        }
        Ok((
            component,
            refused.map_or(CacheOutcome::Compiled, CacheOutcome::Recompiled),
        ))
    }

    /// A fresh store for one instance of `manifest`'s plugin, with its
    /// memory cap, no ambient authority and the world's own part.
    pub(crate) fn new_store<W: Send + 'static>(
        &self,
        manifest: &Manifest,
        speaker: Arc<Speaker>,
        world: W,
    ) -> Result<Store<Sandbox<W>>, LoadError> {
        let voice = Voice::new(speaker);
        let mut wasi = WasiCtx::builder();
        wasi.stderr(voice.stderr())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .socket_addr_check(|_, _| Box::pin(async { false }))
            .wall_clock(ZeroClock)
            .monotonic_clock(ZeroClock);
        if manifest.scratch {
            let dir = self.scratch_dir(&manifest.name)?;
            wasi.preopened_dir(&dir, "/scratch", FsPerms::ReadWrite)
                .map_err(|e| LoadError::Scratch {
                    plugin: manifest.name.clone(),
                    dir: dir.clone(),
                    source: std::io::Error::other(format!("{e:#}")),
                })?;
        }
        let bounds = Bounds {
            memory: manifest.limits.memory_bytes as usize,
            transfer: manifest.kind.ceiling().transfer_bytes(),
        };
        let sandbox = Sandbox::new(wasi.build(), voice, bounds, world);
        let mut store = Store::new(&self.engine, sandbox);
        Sandbox::install(&mut store);
        Ok(store)
    }

    /// The plugin's private scratch directory, created if needed.
    fn scratch_dir(&self, plugin: &str) -> Result<PathBuf, LoadError> {
        let Some(data) = &self.config.data_dir else {
            return Err(LoadError::Scratch {
                plugin: plugin.to_string(),
                dir: PathBuf::from("(no data dir)"),
                source: std::io::Error::other("the host has no data dir"),
            });
        };
        let dir = data.join("plugin-scratch").join(plugin);
        std::fs::create_dir_all(&dir).map_err(|source| LoadError::Scratch {
            plugin: plugin.to_string(),
            dir: dir.clone(),
            source,
        })?;
        Ok(dir)
    }
}

fn store_artifact(
    dir: &Path,
    artifact: &Path,
    digest_file: &Path,
    component: &Component,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let code = component
        .serialize()
        .map_err(|e| std::io::Error::other(format!("{e:#}")))?;
    let tmp = artifact.with_extension("tmp");
    std::fs::write(&tmp, &code)?;
    std::fs::rename(&tmp, artifact)?;
    std::fs::write(digest_file, hex(&Sha256::digest(&code)))
}

/// Which world a component targets, from its exports.
pub fn world_of(engine: &Engine, component: &Component, path: &Path) -> Result<Kind, LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let mut found = None;
    for name in &exports {
        let Some(rest) = name.strip_prefix("crewlet:plugin/") else {
            continue;
        };
        let (interface, version) = rest.split_once('@').unwrap_or((rest, ""));
        if !version.starts_with(SUPPORTED_PREFIX) {
            return Err(LoadError::UnsupportedVersion {
                component: path.to_path_buf(),
                found: format!(
                    "crewlet:plugin@{}",
                    if version.is_empty() { "?" } else { version }
                ),
            });
        }
        found = match interface {
            "inbound" => Some(Kind::Webhook),
            "completions" => Some(Kind::Provider),
            "handlers" => Some(Kind::Module),
            _ => found,
        };
    }
    found.ok_or_else(|| LoadError::UnknownWorld {
        component: path.to_path_buf(),
        exports: if exports.is_empty() {
            "none".to_string()
        } else {
            exports.join(", ")
        },
    })
}
