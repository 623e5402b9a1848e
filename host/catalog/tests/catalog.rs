//! The catalogue on a real nats-server with the repo's real components
//! (built into `plugins/target` by `scripts/bootstrap.sh`): a module's
//! `once` subscription consumes events from the events stream and answers
//! them through the module, a refused event is dead-lettered with the
//! module's reason, and the reload loop swaps a changed plugin in — and
//! keeps it serving when a newer version cannot load.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use crewlet_catalog::{Loaded, Parts, Running};
use crewlet_config::NodeConfig;
use crewlet_plugins::module::ToolCaller;
use crewlet_testkit::NatsServer;
use futures::StreamExt;
use serde_json::{Value, json};

/// The notebook's component, built by the plugin build.
fn notebook_component() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let wasm = repo.join("plugins/target/wasm32-wasip2/release/crewlet_module_notebook.wasm");
    assert!(
        wasm.is_file(),
        "{} is missing: run `bash scripts/bootstrap.sh` first",
        wasm.display()
    );
    wasm
}

/// The notebook's manifest at `version`, its component at `component`
/// (relative to the manifest's folder).
fn notebook_manifest(version: &str, component: &str) -> String {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/modules/notebook/plugin.toml");
    let text = std::fs::read_to_string(&manifest).expect("the notebook's manifest");
    text.replace("version = \"0.1.0\"", &format!("version = \"{version}\""))
        .replace(
            "component = \"../../target/wasm32-wasip2/release/crewlet_module_notebook.wasm\"",
            &format!("component = {component:?}"),
        )
}

/// A node's worth of the catalogue: a server with the node's streams, the
/// plugins under `dir` loaded, and their consumers started.
struct Node {
    _server: NatsServer,
    _data: tempfile::TempDir,
    client: async_nats::Client,
    loaded: Arc<Loaded>,
    running: Running,
}

async fn start_node(dir: &Path, reload: bool) -> Node {
    start_node_then(dir, reload, || {}).await
}

/// [`start_node`], running `between` after the catalogue is loaded and
/// before its consumers and reload loop start.
async fn start_node_then(dir: &Path, reload: bool, between: impl FnOnce()) -> Node {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.expect("connect");
    let js = jetstream::new(client.clone());
    crewlet_stream::streams::ensure_streams(&js, 1)
        .await
        .expect("the node's streams");
    let data = tempfile::tempdir().expect("data dir");
    let text = format!(
        "[node]\ndata_dir = {:?}\n",
        data.path().display().to_string()
    );
    let config = NodeConfig::from_toml("test", &text, data.path(), &Default::default(), &|_| None)
        .expect("config");
    let publisher = crewlet_observe::Publisher::stateless("node-test", js.clone());
    let loaded = Arc::new(
        crewlet_catalog::load(&[dir.to_path_buf()], &config, client.clone(), publisher)
            .await
            .expect("the catalogue loads"),
    );
    between();
    let running = crewlet_catalog::start(Parts {
        loaded: loaded.clone(),
        js,
        reload,
    })
    .await;
    Node {
        _server: server,
        _data: data,
        client,
        loaded,
        running,
    }
}

/// Waits (60 s at most: a loaded machine compiles slowly) until `check` holds for `/plugins`' entry of `name`;
/// answers that entry.
async fn entry_when(loaded: &Loaded, name: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = loaded.view();
        let entry = view["plugins"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or(Value::Null);
        if check(&entry) {
            return entry;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never reached the state awaited: {entry:#}; failed: {:#}",
            view["failed"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes `row` as an event of kind `turn_ended`, acked by the stream.
async fn publish_turn_ended(client: &async_nats::Client, row: &Value) {
    jetstream::new(client.clone())
        .publish(
            crewlet_bus::event_subject("turn_ended"),
            serde_json::to_vec(row).unwrap().into(),
        )
        .await
        .expect("publish")
        .await
        .expect("the stream took it");
}

fn plugins_dir_with_notebook(version: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("plugins dir");
    let notebook = dir.path().join("notebook");
    std::fs::create_dir(&notebook).unwrap();
    std::fs::copy(notebook_component(), notebook.join("notebook.wasm")).unwrap();
    std::fs::write(
        notebook.join("plugin.toml"),
        notebook_manifest(version, "notebook.wasm"),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_once_subscription_hands_stream_events_to_the_module() {
    let plugins = plugins_dir_with_notebook("0.1.0");
    let node = start_node(plugins.path(), false).await;
    assert!(!node.running.reloading());
    entry_when(&node.loaded, "notebook", |e| {
        e["state"] == "running" && e["subscriptions"]["turn_ended"]["state"] == "consuming"
    })
    .await;

    let row = json!({
        "seat": "ada",
        "at_ms": 1,
        "conversation": "c-1",
        "payload": { "turn_id": "t-1", "outcome": "replied" },
    });
    publish_turn_ended(&node.client, &row).await;
    let entry = entry_when(&node.loaded, "notebook", |e| {
        e["subscriptions"]["turn_ended"]["handled"] == 1
    })
    .await;
    assert_eq!(entry["subscriptions"]["turn_ended"]["delivery"], "once");
    assert_eq!(entry["subscriptions"]["turn_ended"]["refused"], 0);

    // What the module made of it, through its own tool.
    let notebook = node
        .loaded
        .installed
        .modules()
        .into_iter()
        .find(|m| m.manifest().name == "notebook")
        .expect("the notebook serves");
    let caller = ToolCaller {
        seat: "ada".into(),
        turn_id: "t-2".into(),
    };
    let worked = notebook
        .call_tool_json("worked", "{}", &caller)
        .await
        .expect("the tool ran")
        .expect("the tool answered");
    assert!(
        worked.contains("t-1") && worked.contains("replied"),
        "{worked}"
    );
    node.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_module_keeps_refusing_is_dead_lettered_with_its_reason() {
    let plugins = plugins_dir_with_notebook("0.1.0");
    let node = start_node(plugins.path(), false).await;
    entry_when(&node.loaded, "notebook", |e| {
        e["subscriptions"]["turn_ended"]["state"] == "consuming"
    })
    .await;
    let dlq = node
        .client
        .subscribe(crewlet_bus::module_dlq_subject("notebook"))
        .await
        .unwrap();
    // No seat: the notebook refuses it each time it is offered.
    publish_turn_ended(&node.client, &json!({ "payload": {} })).await;
    let letter = tokio::time::timeout(Duration::from_secs(40), dlq.take(1).next())
        .await
        .expect("dead-lettered after its retries (1 + 2 + 4 + 8 s of backoff)")
        .expect("a dead letter");
    let letter: Value = serde_json::from_slice(&letter.payload).unwrap();
    let reason = letter["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("module notebook refused it") && reason.contains("names its seat"),
        "{letter:#}"
    );
    assert_eq!(letter["failures"], 5);
    let entry = entry_when(&node.loaded, "notebook", |e| {
        e["subscriptions"]["turn_ended"]["dead_lettered"] == 1
    })
    .await;
    assert_eq!(entry["subscriptions"]["turn_ended"]["refused"], 5);
    assert_eq!(entry["subscriptions"]["turn_ended"]["handled"], 0);
    node.running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_a_changed_module_in_and_keeps_it_when_the_next_cannot_load() {
    let plugins = plugins_dir_with_notebook("0.1.0");
    let node = start_node(plugins.path(), true).await;
    assert!(node.running.reloading());
    entry_when(&node.loaded, "notebook", |e| e["state"] == "running").await;
    let manifest = plugins.path().join("notebook/plugin.toml");

    std::fs::write(&manifest, notebook_manifest("0.2.0", "notebook.wasm")).unwrap();
    let entry = entry_when(&node.loaded, "notebook", |e| e["version"] == "0.2.0").await;
    assert_eq!(entry["reloads"], 1, "{entry:#}");
    assert_eq!(entry["reload_refused"], Value::Null);
    // The new version consumes: an event reaches it.
    entry_when(&node.loaded, "notebook", |e| {
        e["subscriptions"]["turn_ended"]["state"] == "consuming"
    })
    .await;
    let row = json!({ "seat": "ada", "payload": { "turn_id": "t-9", "outcome": "replied" } });
    publish_turn_ended(&node.client, &row).await;
    entry_when(&node.loaded, "notebook", |e| {
        e["subscriptions"]["turn_ended"]["handled"] == 1
    })
    .await;

    // A version whose component is gone is refused; 0.2.0 keeps serving.
    std::fs::write(&manifest, notebook_manifest("0.3.0", "gone.wasm")).unwrap();
    let entry = entry_when(&node.loaded, "notebook", |e| {
        e["reload_refused"]["reason"].is_string()
    })
    .await;
    assert_eq!(entry["version"], "0.2.0", "{entry:#}");
    let reason = entry["reload_refused"]["reason"].as_str().unwrap();
    assert!(reason.contains("gone.wasm"), "{reason}");
    node.running.stop().await;
}

/// A plugin edited after the node read it and before the reload loop's
/// first poll is reloaded: the loop starts from what was loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_the_node_loads_is_reloaded() {
    let plugins = plugins_dir_with_notebook("0.1.0");
    let manifest = plugins.path().join("notebook/plugin.toml");
    let node = start_node_then(plugins.path(), true, || {
        std::fs::write(&manifest, notebook_manifest("0.2.0", "notebook.wasm")).unwrap();
    })
    .await;
    let entry = entry_when(&node.loaded, "notebook", |e| e["version"] == "0.2.0").await;
    assert_eq!(entry["reloads"], 1, "{entry:#}");
    node.running.stop().await;
}
