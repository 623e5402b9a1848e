//! A small fleet without external NATS: three `crewlet run` nodes, each
//! with its own supervised nats-server, clustered over loopback routes
//! (`[stream.cluster]`) with every stream and bucket at three replicas.
//! All three come up, `/health` shows the cluster and the seats spread;
//! one node and its nats-server are SIGKILLed; the other two stay ready,
//! take its seat within the lease TTL, and a mention to that seat is
//! answered.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::company::{SLACK_SECRET, scripted_company};
use common::*;
use crewlet_testkit::{PluginsDir, free_port};
use serde_json::Value;

const ROUTE_SECRET: &str = "route-secret-0123456789";
const IDS: [&str; 3] = ["ec-a", "ec-b", "ec-c"];
/// Short, so a dead holder's seats move within the test's budget.
const LEASE_TTL: Duration = Duration::from_secs(6);

/// Seat → holder node, as `node`'s `/agents` says (`-` for none), for the
/// seats that are held.
fn holders(node: &Node) -> Vec<(String, String)> {
    let Some(r) = node.get("/agents").filter(|r| r.status == 200) else {
        return Vec::new();
    };
    r.json()["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "held")
        .map(|a| {
            (
                a["handle"].as_str().unwrap_or("?").to_owned(),
                a["holder"]["node"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

#[test]
fn three_embedded_servers_cluster_and_two_take_over_from_a_killed_one() {
    let t0 = Instant::now();
    let sb = Sandbox::new();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    let chat_log = sb.path("chat.jsonl");
    let doc = sb.path("company.toml");
    let seats = "ada = { role = \"support\" }\nbob = { role = \"support\" }\ncyd = { role = \"support\" }\n";
    std::fs::write(&doc, scripted_company(seats, &chat_log)).unwrap();

    let route_ports: Vec<u16> = IDS.iter().map(|_| free_port()).collect();
    let routes = route_ports
        .iter()
        .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
        .collect::<Vec<_>>()
        .join(", ");
    // All three at once: each node's start waits for the cluster to form.
    let mut nodes: Vec<Node> = IDS
        .iter()
        .zip(&route_ports)
        .map(|(id, route_port)| {
            let api = free_port();
            let cfg = sb.path(&format!("{id}.toml"));
            std::fs::write(
                &cfg,
                format!(
                    "[api]\nport = {api}\n[node]\nid = \"{id}\"\n\
                     [stream]\nreplicas = 3\n\
                     [stream.cluster]\nname = \"ec\"\nlisten = \"127.0.0.1:{route_port}\"\n\
                     routes = [{routes}]\nsecret = \"${{ROUTE_SECRET}}\"\n\
                     [coordination]\nlease_ttl_seconds = {}\nheartbeat_seconds = 1\n",
                    LEASE_TTL.as_secs()
                ),
            )
            .unwrap();
            NodeBuilder::new(&sb, api)
                .arg("--config")
                .arg(&cfg)
                .arg("--data-dir")
                .arg(sb.path(&format!("data-{id}")))
                .arg("--company")
                .arg(&doc)
                .arg("--plugins")
                .arg(plugins.path())
                .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
                .env("ROUTE_SECRET", ROUTE_SECRET)
                .spawn()
        })
        .collect();
    for n in &mut nodes {
        n.wait_ready(Duration::from_secs(60));
    }
    eprintln!("three nodes ready after {:?}", t0.elapsed());

    // Each server routes to both peers and the meta group has a leader.
    for (n, id) in nodes.iter().zip(IDS) {
        let mut cluster = Value::Null;
        assert!(
            eventually(Duration::from_secs(10), || {
                cluster = n.health()["stream"]["server"]["cluster"].clone();
                cluster["peers_connected"].as_array().map(Vec::len) == Some(2)
                    && cluster["meta_leader"].is_string()
            }),
            "{id}: the cluster never showed two peers and a leader: {cluster}"
        );
        assert_eq!(cluster["name"], "ec", "{cluster}");
        assert_eq!(cluster["meta_cluster_size"], 3, "{cluster}");
        let conf = sb.path(&format!("data-{id}/stream/nats-server.conf"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&conf).unwrap().permissions(),
        );
        assert_eq!(
            mode & 0o777,
            0o600,
            "{}: holds the route secret",
            conf.display()
        );
    }

    // The seats spread: one per node.
    let mut seen = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            seen = holders(&nodes[0]);
            let on: BTreeSet<&str> = seen.iter().map(|(_, n)| n.as_str()).collect();
            seen.len() == 3 && on.len() == 3
        }),
        "the seats never spread over three nodes: {seen:?}"
    );
    let victim = 2;
    let victim_id = IDS[victim];
    let (orphan, _) = seen
        .iter()
        .find(|(_, n)| n == victim_id)
        .cloned()
        .expect("the victim holds a seat");
    eprintln!("seats spread after {:?}: {seen:?}", t0.elapsed());

    // SIGKILL the node and its nats-server: nothing of it is left to hand
    // its seat over or to answer for its replicas.
    let broker = nodes[victim].broker_pid();
    nodes[victim].signal(libc::SIGKILL);
    // SAFETY: the broker is the victim's child, named by its own /health.
    unsafe {
        libc::kill(broker, libc::SIGKILL);
    }
    nodes[victim].wait_exit(Duration::from_secs(5));
    assert!(
        eventually(Duration::from_secs(5), || !alive(broker)),
        "the victim's nats-server outlived a SIGKILL"
    );
    let killed = Instant::now();

    // The two others keep serving, and take the orphaned seat within the
    // lease TTL plus the re-elections the lost server forces (the meta
    // group's and every R3 stream's it led: seen 7 to 13 s in all here).
    let survivors = &nodes[..victim];
    let mut now_held = Vec::new();
    assert!(
        eventually(LEASE_TTL + Duration::from_secs(14), || {
            now_held = holders(&survivors[0]);
            now_held.len() == 3 && now_held.iter().all(|(_, n)| n != victim_id)
        }),
        "the survivors never took {orphan}: {now_held:?}\n{}",
        survivors[0].log_text()
    );
    eprintln!(
        "{orphan} taken over {:?} after the kill: {now_held:?}",
        killed.elapsed()
    );
    for n in survivors {
        assert_eq!(n.get("/ready").map(|r| r.status), Some(200));
        let cluster = n.health()["stream"]["server"]["cluster"].clone();
        assert!(cluster["meta_cluster_size"] == 3, "{cluster}");
    }

    // A mention to the orphaned seat, through the other survivor, is
    // answered by its new holder.
    slack_mention(
        &survivors[1],
        SLACK_SECRET,
        &orphan,
        "EvK",
        "C9",
        "9.1",
        "hi",
    );
    let said = format!("Hello from {orphan}!");
    assert!(
        eventually(Duration::from_secs(20), || {
            std::fs::read_to_string(&chat_log).is_ok_and(|t| t.contains(&said))
        }),
        "{orphan} never answered after the takeover; chat log: {:?}\n{}",
        std::fs::read_to_string(&chat_log).unwrap_or_default(),
        survivors[1].log_text()
    );
    eprintln!("answered {:?} after the start", t0.elapsed());
}
