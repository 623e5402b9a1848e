//! Shared test helpers: the repo's plugins, built by
//! `cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crewlet_plugins::manifest::Manifest;
use crewlet_plugins::module::{ModuleBus, NotTaken, ToolCaller};
use crewlet_plugins::runtime::{Runtime, RuntimeConfig};

pub const BUILD: &str =
    "cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml";

/// `plugins/` at the repository root.
pub fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins")
}

/// Fails with the fix when a component has not been built.
pub fn require_built(manifest: &Manifest) {
    assert!(
        manifest.component.is_file(),
        "the component {} is missing: run the plugin build first: {BUILD}",
        manifest.component.display()
    );
}

/// The manifest at `plugins/<rel>/plugin.toml`, its component built.
pub fn manifest(rel: &str) -> Manifest {
    let m = Manifest::load(&plugins_dir().join(rel).join("plugin.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    require_built(&m);
    m
}

/// `text` parsed as if it were `plugins/<rel>/plugin.toml`.
pub fn manifest_text(rel: &str, text: &str) -> Manifest {
    let m = Manifest::parse(&plugins_dir().join(rel).join("plugin.toml"), text)
        .unwrap_or_else(|e| panic!("{e}"));
    require_built(&m);
    m
}

/// A runtime with a throwaway data dir (the artifact cache lives there).
pub fn runtime() -> (Arc<Runtime>, tempfile::TempDir) {
    let data = tempfile::tempdir().expect("temp data dir");
    let rt = Runtime::new(RuntimeConfig {
        data_dir: Some(data.path().to_path_buf()),
        max_instances: 64,
        ..RuntimeConfig::default()
    })
    .expect("engine");
    (rt, data)
}

/// HMAC-SHA256 as lower-case hex, computed by the host, not the plugins.
pub fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    crewlet_plugins::crypto::hmac_sha256(key, &parts.concat())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the node does with a module's publish, on a real nats-server: the
/// payload on the kind's event subject (`crewlet_bus::event_subject`),
/// flushed before it answers.
pub struct NatsBus(pub async_nats::Client);

impl ModuleBus for NatsBus {
    fn publish<'a>(
        &'a self,
        kind: &'a str,
        payload: Vec<u8>,
    ) -> futures::future::BoxFuture<'a, Result<(), NotTaken>> {
        let not_taken = |e: &dyn std::fmt::Display| NotTaken { why: e.to_string() };
        Box::pin(async move {
            self.0
                .publish(crewlet_bus::event_subject(kind), payload.into())
                .await
                .map_err(|e| not_taken(&e))?;
            self.0.flush().await.map_err(|e| not_taken(&e))
        })
    }
}

/// The bus over `client`, as the trait object `ModulePlugin` takes.
pub fn nats_bus(client: &async_nats::Client) -> Arc<dyn ModuleBus> {
    Arc::new(NatsBus(client.clone()))
}

/// A seat calling a tool in a test.
pub fn caller() -> ToolCaller {
    ToolCaller {
        seat: "ada".to_string(),
        turn_id: "turn-1".to_string(),
    }
}
