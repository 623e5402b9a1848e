//! The `data` role through the real binary: two nodes on one nats-server,
//! `keeper` with `data` and `edge` without it, the seat on `edge`. Alone,
//! `edge` says on `/health` that no live node keeps the fleet's events, and
//! its history reads say so rather than answering empty; once `keeper`
//! runs, `edge`'s turn events are read from both nodes' `/events`,
//! `/events?node=edge` and `/turns/{id}` — kept in `keeper`'s log, read
//! from there, never from `edge`'s own.

use crate::common;

use std::time::Duration;

use common::company::{SCRIPTED_COMPANY, SLACK_SECRET, fill};
use common::*;
use crewlet_testkit::{NatsServer, PluginsDir};
use serde_json::Value;

fn node(sb: &Sandbox, id: &str, roles: &str, nats: &str) -> Node {
    let port = crewlet_testkit::free_port();
    let cfg = sb.path(&format!("{id}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[api]\nport = {port}\n[node]\nid = \"{id}\"\nroles = {roles}\n[stream]\nurl = \"{nats}\"\n[coordination]\nlease_ttl_seconds = 10\nheartbeat_seconds = 1\n"
        ),
    )
    .unwrap();
    let mut node = NodeBuilder::new(sb, port)
        .arg("--config")
        .arg(cfg)
        .arg("--data-dir")
        .arg(sb.path(&format!("data-{id}")))
        .slack_company(sb)
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

fn custody(node: &Node) -> Value {
    node.health()["custody"].clone()
}

fn get(node: &Node, path: &str) -> Value {
    let r = node.get(path).unwrap_or_else(|| panic!("GET {path}"));
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    r.json()
}

#[test]
fn a_stateless_nodes_turns_are_kept_by_a_data_node_and_read_from_both() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    PluginsDir::new(sb.path("plugins"))
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    std::fs::write(
        sb.path("company.toml"),
        fill(SCRIPTED_COMPANY, &sb.path("chat.jsonl")),
    )
    .unwrap();

    // Alone, the stateless node says nobody keeps its events.
    let edge = node(&sb, "edge", r#"["ingress", "seats"]"#, &server.url());
    let mut seen = Value::Null;
    assert!(
        eventually(Duration::from_secs(15), || {
            seen = custody(&edge);
            seen["state"] == "known"
        }),
        "custody never known: {seen}"
    );
    assert_eq!(seen["data"], false);
    assert_eq!(seen["data_nodes"], 0);
    assert!(
        seen["warning"]
            .as_str()
            .is_some_and(|w| w.contains("no live node has the `data` role")),
        "{seen}"
    );
    // Its history reads say nobody keeps its events: not an empty answer
    // that reads as "nothing happened".
    for path in ["/events?node=edge", "/turns/t-none"] {
        let read = get(&edge, path);
        let coverage = &read["coverage"];
        assert_eq!(coverage["complete"], false, "{path}: {read}");
        assert_eq!(coverage["keepers"], serde_json::json!([]), "{path}: {read}");
        assert!(
            coverage["warning"]
                .as_str()
                .is_some_and(|w| w.contains("no live node has the `data` role")),
            "{path}: {read}"
        );
    }

    let keeper = node(
        &sb,
        "keeper",
        r#"["data", "ingress", "workers"]"#,
        &server.url(),
    );
    assert!(
        eventually(Duration::from_secs(15), || {
            seen = custody(&edge);
            seen["data_nodes"] == 1 && seen["warning"].is_null()
        }),
        "edge never saw the data node: {seen}"
    );
    assert_eq!(seen["data_node_ids"], serde_json::json!(["keeper"]));
    assert_eq!(custody(&keeper)["data"], true);

    // A mention: ada's turn runs on edge, the only node with seats.
    let r = post_slack_mention(
        &edge.api,
        SLACK_SECRET,
        "ada",
        "Ev1",
        "C1",
        "100.1",
        "<@ada> hi",
    )
    .unwrap();
    assert_accepted(&edge, &r);
    let ended = wait_events(&keeper, "turn_ended", 1);
    assert_eq!(ended[0]["node_id"], "edge", "{}", ended[0]);
    let turn_id = ended[0]["payload"]["turn_id"].as_str().unwrap().to_owned();

    for reader in [&edge, &keeper] {
        let ended = events(reader, "turn_ended");
        assert!(
            ended
                .iter()
                .any(|e| e["payload"]["turn_id"] == turn_id.as_str()),
            "{ended:?}"
        );
        let turn = get(reader, &format!("/turns/{turn_id}"));
        assert_eq!(turn["found"], true, "{turn}");
        assert_eq!(turn["nodes"], serde_json::json!(["edge"]), "{turn}");
        let kinds: Vec<&str> = turn["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["type"].as_str())
            .collect();
        assert!(
            kinds.contains(&"turn_started") && kinds.contains(&"turn_ended"),
            "{kinds:?}"
        );
    }
    // Edge keeps no log: its events, asked of it by name on either node,
    // are read from keeper's log, which keeps them.
    for reader in [&edge, &keeper] {
        let own = get(reader, "/events?node=edge&type=turn_started&limit=1000");
        assert_eq!(
            own["coverage"]["answered"],
            serde_json::json!(["keeper"]),
            "{own}"
        );
        assert_eq!(own["coverage"]["complete"], true, "{own}");
        let rows = own["events"].as_array().unwrap();
        assert!(
            !rows.is_empty() && rows.iter().all(|e| e["node_id"] == "edge"),
            "{own}"
        );
    }
    let kept = get(&keeper, "/events?node=keeper&type=turn_started&limit=1000");
    assert!(
        kept["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["node_id"] == "edge"),
        "{kept}"
    );
    let stats = &custody(&keeper)["keeper"];
    assert!(stats["batches_kept"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(stats["unsettled"], 0, "{stats}");
}
