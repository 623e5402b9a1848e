//! Shared test setup: a real nats-server for coordination and events, the
//! repo's provider components loaded through crewlet-plugins, and helpers to
//! build chains and requests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_nats::jetstream;
use crewlet_company::{ModelRef, SecretRef};
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_models::{Models, ModelsOptions, Resolve};
use crewlet_observe::Publisher;
use crewlet_plugins::manifest::Manifest;
use crewlet_plugins::provider::ProviderPlugin;
use crewlet_plugins::runtime::{Runtime, RuntimeConfig};
use crewlet_store::{EventQuery, EventRecord, Store};
use crewlet_testkit::{NatsServer, ScriptedOpenAi};
use crewlet_turns::{CallSite, Msg, Phase, Prompt, ToolDef};

pub const BUILD: &str =
    "cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml";

pub fn plugins_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../plugins")
        .canonicalize()
        .expect("plugins/ exists")
}

pub fn component(file: &str) -> PathBuf {
    let p = plugins_dir()
        .join("target/wasm32-wasip2/release")
        .join(file);
    assert!(
        p.is_file(),
        "{} is missing: build the guests first: {BUILD}",
        p.display()
    );
    p
}

/// `target` as a path relative to `dir` (the manifest loader takes only
/// relative component paths): up to the root, then down.
pub fn relative_from(dir: &Path, target: &Path) -> String {
    let up = "../".repeat(dir.components().count() - 1);
    format!("{up}{}", target.strip_prefix("/").unwrap().display())
}

/// A wasmtime runtime with its own artifact cache.
pub struct Host {
    pub runtime: Arc<Runtime>,
    pub dir: tempfile::TempDir,
}

impl Host {
    pub fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(RuntimeConfig {
            data_dir: Some(dir.path().join("data")),
            max_instances: 64,
            ..RuntimeConfig::default()
        })
        .expect("engine");
        Host { runtime, dir }
    }

    /// The real openai guest, from a temp plugins dir whose manifest points
    /// at `server` (component path absolute).
    pub fn openai(&self, server: &ScriptedOpenAi) -> Arc<ProviderPlugin> {
        let dir = self.dir.path().join("plugins/openai");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plugin.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"openai\"\nversion = \"0.1.0\"\nkind = \"provider\"\ncomponent = {:?}\n[limits]\ndeadline_ms = 10000\n[provider]\nbase_url = \"{}\"\nallowed_outbound_hosts = [\"{}\"]\n",
                relative_from(&dir, &component("crewlet_provider_openai.wasm")),
                server.base_url(),
                server.origin()
            ),
        )
        .unwrap();
        let m = Manifest::load(&file).unwrap_or_else(|e| panic!("{e}"));
        Arc::new(ProviderPlugin::load(&self.runtime, m).unwrap_or_else(|e| panic!("{e}")))
    }

    /// The shipped scripted provider, from its own manifest.
    pub fn scripted(&self) -> Arc<ProviderPlugin> {
        let m = Manifest::load(&plugins_dir().join("providers/scripted/plugin.toml"))
            .unwrap_or_else(|e| panic!("{e}"));
        component("crewlet_provider_scripted.wasm");
        Arc::new(ProviderPlugin::load(&self.runtime, m).unwrap_or_else(|e| panic!("{e}")))
    }
}

/// One node's view of the fleet: its own NATS connection, coordination
/// handle, event log and publisher.
pub struct Node {
    pub coord: Coord,
    pub store: Arc<Store>,
    pub publisher: Publisher,
    _dir: tempfile::TempDir,
}

impl Node {
    pub async fn join(server: &NatsServer, name: &str) -> Node {
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        js.get_or_create_stream(jetstream::stream::Config {
            name: crewlet_bus::EVENTS_STREAM.into(),
            subjects: vec![crewlet_bus::EVENTS_SUBJECTS.into()],
            ..Default::default()
        })
        .await
        .unwrap();
        let coord = Coord::open(client, CoordOptions::new(Owner::incarnation(name)))
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in(dir.path()).unwrap());
        let publisher = Publisher::new(name, store.clone(), js);
        Node {
            coord,
            store,
            publisher,
            _dir: dir,
        }
    }

    pub async fn models(
        &self,
        providers: Vec<Arc<ProviderPlugin>>,
        secrets: &[(&str, &str)],
    ) -> Models {
        Models::new(
            crewlet_plugins::Installed::providers_only(providers),
            self.coord.model_cooldowns(),
            Some(self.publisher.clone()),
            resolver(secrets),
            ModelsOptions::default(),
        )
        .await
    }

    /// This node's log rows of one event type, oldest first.
    pub fn events(&self, kind: &str) -> Vec<EventRecord> {
        let mut rows = self
            .store
            .events(&EventQuery {
                kind: Some(kind.into()),
                ..Default::default()
            })
            .unwrap();
        rows.sort_by_key(|r| r.seq);
        rows
    }
}

pub fn resolver(secrets: &[(&str, &str)]) -> Resolve {
    let map: BTreeMap<String, String> = secrets
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Resolve::new(move |name: &str| match map.get(name) {
        Some(v) => crewlet_secrets::Lookup::Found(v.clone()),
        None => crewlet_secrets::Lookup::Unset,
    })
}

pub fn model(provider: &str, model: &str, keys: &[&str]) -> ModelRef {
    ModelRef {
        provider: provider.into(),
        model: model.into(),
        credentials: keys.iter().map(|k| SecretRef::name(k).unwrap()).collect(),
        options: BTreeMap::new(),
    }
}

pub fn scripted(model: &str, options: serde_json::Value) -> ModelRef {
    let serde_json::Value::Object(map) = options else {
        panic!("options must be an object");
    };
    ModelRef {
        provider: "scripted".into(),
        model: model.into(),
        credentials: vec![],
        options: map.into_iter().collect(),
    }
}

pub fn request(messages: Vec<Msg>) -> Prompt {
    Prompt {
        messages,
        tools: vec![ToolDef {
            name: "lookup".into(),
            description: "look something up".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        }],
        must_call_tool: false,
        max_tokens: 128,
    }
}

pub fn site(turn: &str) -> CallSite {
    CallSite {
        turn_id: turn.into(),
        seat: "ada".into(),
        phase: Phase::Executor,
        iteration: 2,
        trace_id: Some(format!("trace-{turn}")),
    }
}
