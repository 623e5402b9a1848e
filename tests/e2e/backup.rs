//! Backup and restore through the real binary: a one-node company (its
//! embedded broker in the data dir) runs a turn, holds a sealed secret and
//! spends budget, and a module (the `relay` test module) holds state;
//! `crewlet backup` writes the artefact; the node stops and
//! its data dir — broker and store — is deleted; `crewlet restore` and a
//! fresh start bring the same company back with its history, budget spend,
//! secret, module state and usage history (the replicated estate's copy,
//! its position moved onto the restored usage log, which the applier goes
//! on applying), and it answers again. An altered artefact and one of a newer
//! format are refused with the reason, writing nothing.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::company::{SCRIPTED_COMPANY, SLACK_SECRET, fill};
use common::*;
use crewlet_testkit::PluginsDir;
use serde_json::Value;

fn start(sb: &Sandbox) -> Node {
    let extra = format!(
        "[node]\nid = \"solo\"\n[secrets]\nkeyring = \"{}\"\n",
        sb.path("keyring").display()
    );
    let mut node = sb.node(&extra).slack_company(sb).spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

fn company_day_spent(node: &Node) -> u64 {
    let b = node.get("/budgets").expect("GET /budgets").json();
    b["scopes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["scope"] == "company")
        .and_then(|s| s["windows"]["day"]["spent"].as_u64())
        .unwrap_or_else(|| panic!("no company day window: {b}"))
}

/// Writes `key` into the relay module's bucket from outside, on the node's
/// embedded broker (its login from `/health`).
fn put_module_state(node: &Node, key: &str, value: &str) {
    let health = node.health();
    let url = health["stream"]["urls"][0].as_str().unwrap().to_owned();
    let login = broker_login(&health);
    let (key, value) = (key.to_owned(), value.to_owned());
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let js = async_nats::jetstream::new(login.connect(url).await.unwrap());
            let kv = js.get_key_value("mod_relay_seen").await.unwrap();
            kv.put(key, value.into_bytes().into()).await.unwrap();
        });
}

fn mention(node: &Node, event: &str, thread: &str) {
    let r = post_slack_mention(
        &node.api,
        SLACK_SECRET,
        "ada",
        event,
        "C1",
        thread,
        "<@ada> hi",
    )
    .unwrap();
    assert_accepted(node, &r);
}

/// `GET /usage` by seat over months: (key, turns, output tokens) per row.
fn usage_rows(node: &Node) -> Vec<(String, u64, u64)> {
    let Some(r) = node.get("/usage?period=month&by=seat") else {
        return Vec::new();
    };
    let v = r.json();
    v["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            let n = |f: &str| row[f].as_u64().unwrap_or(0);
            (
                row["key"].as_str().unwrap_or("").to_owned(),
                n("turns"),
                n("output_tokens"),
            )
        })
        .collect()
}

/// The usage domain's applier state on `/health`.
fn estate_state(node: &Node) -> Value {
    node.health()["estate"]["domains"][0].clone()
}

fn restore(art: &Path, data_dir: &Path) -> (bool, String) {
    let (status, out) = run_to_exit(
        &[
            "restore",
            art.to_str().unwrap(),
            "--data-dir",
            data_dir.to_str().unwrap(),
        ],
        &[],
    );
    (status.success(), out)
}

#[test]
fn a_company_backed_up_and_restored_answers_with_its_history_budgets_secrets_and_module_state() {
    let sb = Sandbox::new();
    PluginsDir::new(sb.path("plugins"))
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml")
        .add("relay", "plugins/testdata/state-relay/plugin.toml");
    let doc = SCRIPTED_COMPANY
        .replace(
            "[org]\nname = \"Acme\"\n",
            "[org]\nname = \"Acme\"\nbudget = { day = 100000 }\n",
        )
        .replace(
            "{ call = \"chat__post_message\",",
            "{ usage = { input = 120, output = 30 }, call = \"chat__post_message\",",
        );
    std::fs::write(sb.path("company.toml"), fill(&doc, &sb.path("chat.jsonl"))).unwrap();

    let mut node = start(&sb);
    let r = http::request(&node.api, "PUT", "/secrets/TEAM_NOTE", &[], b"kept sealed").unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    mention(&node, "Ev1", "100.1");
    let ended = wait_events(&node, "turn_ended", 1);
    let turn_id = ended[0]["payload"]["turn_id"].as_str().unwrap().to_owned();
    let spent = company_day_spent(&node);
    put_module_state(&node, "note", "before the backup");
    assert!(spent >= 150, "the turn's tokens are charged: {spent}");
    let mut usage = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            usage = usage_rows(&node);
            usage.iter().any(|(k, t, _)| k == "ada" && *t == 1)
        }),
        "the turn reaches the usage history: {usage:?}"
    );

    let art = sb.path("backup-1");
    let api = format!("http://{}", node.api);
    let (status, out) = run_to_exit(&["backup", art.to_str().unwrap(), "--api", &api], &[]);
    assert!(status.success(), "{out}");
    let manifest: Value = serde_json::from_str(&out).expect("the manifest is printed");
    assert_eq!(manifest["format"], 1, "{manifest}");
    let at = manifest["estate"]["positions"]["usage"].as_u64();
    assert!(at.is_some_and(|p| p >= 1), "the estate's copy: {manifest}");
    let files = manifest["files"].to_string();
    assert!(
        files.contains("replicated.sqlite3") && files.contains("CREWLET_USAGE_LOG"),
        "the estate and the usage log are in the artefact: {files}"
    );

    node.signal(libc::SIGTERM);
    assert!(node.wait_exit(Duration::from_secs(30)).success());
    std::fs::remove_dir_all(sb.data_dir()).unwrap();

    let (ok, out) = restore(&art, &sb.data_dir());
    assert!(ok, "{out}");
    let node = start(&sb);
    let ended = events(&node, "turn_ended");
    assert!(
        ended
            .iter()
            .any(|e| e["payload"]["turn_id"] == turn_id.as_str()),
        "history: {ended:?}"
    );
    assert_eq!(company_day_spent(&node), spent, "budget spend");
    let secrets = node.get("/secrets").expect("GET /secrets");
    assert_eq!(secrets.status, 200, "{}", secrets.text());
    assert!(secrets.text().contains("TEAM_NOTE"), "{}", secrets.text());
    assert!(!sb.data_dir().join("restore-pending").exists());
    let state = node
        .get("/plugins/relay/state/seen")
        .expect("GET the module's bucket");
    assert_eq!(state.status, 200, "{}", state.text());
    assert!(
        state.text().contains("note") && state.text().contains("before the backup"),
        "module state: {}",
        state.text()
    );
    let mut after = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            after = usage_rows(&node);
            after == usage && estate_state(&node)["state"] == "applying"
        }),
        "usage reads the same after the restore: {after:?} against {usage:?}; {}",
        estate_state(&node)
    );
    // The same company answers again, and the applier goes on applying
    // the restored usage log.
    mention(&node, "Ev2", "200.1");
    wait_events(&node, "turn_ended", 2);
    assert!(
        eventually(Duration::from_secs(30), || {
            after = usage_rows(&node);
            after.iter().any(|(k, t, _)| k == "ada" && *t == 2)
        }),
        "the second turn is applied on the restored log: {after:?}; {}",
        estate_state(&node)
    );

    // An altered artefact, then one of a newer format: refused, nothing
    // written into the target data dir.
    let target = sb.path("other-data");
    let store = art.join("node.sqlite3");
    let mut bytes = std::fs::read(&store).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&store, &bytes).unwrap();
    let (ok, out) = restore(&art, &target);
    assert!(!ok && out.contains("does not match its checksum"), "{out}");
    assert!(!target.exists());
    bytes[at] ^= 0xff;
    std::fs::write(&store, &bytes).unwrap();
    let file = art.join("manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    m["format"] = serde_json::json!(2);
    std::fs::write(&file, serde_json::to_vec(&m).unwrap()).unwrap();
    let (ok, out) = restore(&art, &target);
    assert!(!ok && out.contains("newer than this build reads"), "{out}");
    assert!(!target.exists());
}
