//! Hot reload through the real binary: a webhook plugin's component and
//! manifest rewritten under a running node serve the next delivery with the
//! new behaviour; a broken rebuild is refused (with its reason in
//! `/plugins` and the log) while the version before it keeps serving; a
//! manifest taken away takes its route with it.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use crewlet_testkit::{NatsServer, PluginsDir};

const WITHIN: Duration = Duration::from_secs(30);

/// What `/webhooks/hostile` answers a body the hostile plugin turns into
/// one delivery (the GitHub plugin, swapped in under the same name, wants
/// a signature and refuses it).
fn post_one(node: &Node) -> u16 {
    http::post(
        &node.api,
        "/webhooks/hostile",
        &[("Content-Type", "text/plain")],
        b"one",
    )
    .map(|r| r.status)
    .unwrap_or(0)
}

fn plugin_row(node: &Node, name: &str) -> serde_json::Value {
    let view = node.get("/plugins").expect("/plugins answers").json();
    view["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

fn built(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("plugins/target/wasm32-wasip2/release")
        .join(rel)
}

/// Rewrites the plugin's manifest with `version` (its component line kept).
fn set_version(manifest: &Path, version: &str) {
    let text = std::fs::read_to_string(manifest).unwrap();
    let text: Vec<String> = text
        .lines()
        .map(|l| match l.starts_with("version") {
            true => format!("version = {version:?}"),
            false => l.to_owned(),
        })
        .collect();
    std::fs::write(manifest, text.join("\n")).unwrap();
}

#[test]
fn a_rebuilt_webhook_serves_the_next_delivery_and_a_broken_one_leaves_the_old_serving() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let plugins_tmp = tempfile::tempdir().unwrap();
    let plugins = PluginsDir::new(plugins_tmp.path());
    plugins
        .add("hostile", "plugins/testdata/hostile-webhook/plugin.toml")
        .add("github", "plugins/webhooks/github/plugin.toml")
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml")
        .add("notebook", "plugins/modules/notebook/plugin.toml")
        .add("chat", "plugins/modules/chat/plugin.toml")
        .add("chat-webhook", "plugins/webhooks/chat/plugin.toml");
    let node = hostile_route_node(
        &sb,
        "reload-1",
        &server.url(),
        plugins.path(),
        ("reload-gh-secret", "reload-hostile-secret"),
    );
    let dir = plugins.path().join("hostile");
    let component = dir.join("component.wasm");
    let manifest = dir.join("plugin.toml");

    // Version 1: the hostile plugin accepts the body as one delivery.
    let first = post_one(&node);
    assert!((200..300).contains(&first), "v1 accepts: {first}");
    assert_eq!(plugin_row(&node, "hostile-webhook")["reloads"], 0);

    // Version 2: another component under the same name and route.
    std::fs::copy(built("crewlet_webhook_github.wasm"), &component).unwrap();
    set_version(&manifest, "0.2.0");
    assert!(
        eventually(WITHIN, || plugin_row(&node, "hostile-webhook")["version"]
            == "0.2.0"),
        "the new version is swapped in: {}\n{}",
        plugin_row(&node, "hostile-webhook"),
        node.log_text()
    );
    assert_eq!(
        post_one(&node),
        401,
        "the next delivery meets the new behaviour"
    );
    let row = plugin_row(&node, "hostile-webhook");
    assert_eq!(row["reloads"], 1, "{row}");
    assert!(row["reload_refused"].is_null(), "{row}");
    assert!(
        node.log_text().contains("plugin reloaded"),
        "{}",
        node.log_text()
    );

    // Version 3 is broken: refused, version 2 keeps serving.
    std::fs::write(&component, b"this is not a component").unwrap();
    set_version(&manifest, "0.3.0");
    assert!(
        eventually(WITHIN, || {
            !plugin_row(&node, "hostile-webhook")["reload_refused"].is_null()
        }),
        "the broken version is refused: {}\n{}",
        plugin_row(&node, "hostile-webhook"),
        node.log_text()
    );
    let row = plugin_row(&node, "hostile-webhook");
    assert_eq!(row["version"], "0.2.0", "the old version serves: {row}");
    let reason = row["reload_refused"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("component"),
        "the reason names the component: {reason}"
    );
    assert_eq!(post_one(&node), 401, "still the old behaviour");
    assert!(
        node.log_text()
            .contains("new version refused; the running version keeps serving"),
        "{}",
        node.log_text()
    );
    let health = node.health();
    assert_eq!(
        health["plugins"]["failed"], 0,
        "a refused reload is not a failed plugin: {health}"
    );

    // Mended: version 4 (the hostile component again) serves; the refusal is gone.
    std::fs::copy(built("crewlet_test_hostile_webhook.wasm"), &component).unwrap();
    set_version(&manifest, "0.4.0");
    assert!(
        eventually(WITHIN, || plugin_row(&node, "hostile-webhook")["version"]
            == "0.4.0"),
        "the mended version is swapped in: {}",
        plugin_row(&node, "hostile-webhook")
    );
    let back = post_one(&node);
    assert!((200..300).contains(&back), "v4 accepts again: {back}");
    assert!(plugin_row(&node, "hostile-webhook")["reload_refused"].is_null());

    // The manifest taken away: the route goes with it.
    std::fs::remove_file(&manifest).unwrap();
    assert!(
        eventually(WITHIN, || plugin_row(&node, "hostile-webhook").is_null()),
        "the plugin is taken off"
    );
    assert_eq!(post_one(&node), 404, "no plugin serves the route any more");
    assert!(
        node.log_text().contains("plugin removed"),
        "{}",
        node.log_text()
    );
}

/// `crewlet plugins check --watch`: a report at once, another when a
/// manifest changes, until interrupted.
#[test]
fn check_watch_reports_again_when_a_manifest_changes() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let plugins_tmp = tempfile::tempdir().unwrap();
    let plugins = PluginsDir::new(plugins_tmp.path());
    plugins.add("github", "plugins/webhooks/github/plugin.toml");
    let mut child = Command::new(crewlet_bin())
        .args(["plugins", "check", "--watch"])
        .arg(plugins.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    // Reads lines until one contains `needle`; answers everything read.
    let read_until = |needle: &str| -> String {
        let mut seen = String::new();
        let deadline = std::time::Instant::now() + WITHIN;
        while std::time::Instant::now() < deadline {
            if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(needle) {
                    return seen;
                }
            }
        }
        panic!("no line with {needle:?} within {WITHIN:?}; read:\n{seen}");
    };
    let first = read_until("all plugins pass");
    assert!(first.contains("--- checked at"), "{first}");
    let manifest = plugins.path().join("github/plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("kind = \"webhook\"", "kind = \"gadget\""),
    )
    .unwrap();
    let second = read_until("--- checked at");
    let report = second + &read_until("kind");
    assert!(
        report.contains("plugin.toml"),
        "the problem names the file: {report}"
    );
    child.kill().unwrap();
    let _ = child.wait();
}
