//! `/ready` row by row through the real binary (the table is in
//! `crewlet_node::state`): starting, serving and draining; a broker outage
//! shared by two nodes, which keeps both in rotation while it is shorter
//! than the heartbeat and takes them out once it is longer; isolated. The
//! config postures wait, shed and stuck are driven in `config_plane`.
//! `/health` answers 200 in every row.

use std::time::Duration;

use crate::common::*;
use crewlet_testkit::nats::ServerSpec;
use crewlet_testkit::{NatsServer, free_port};
use serde_json::Value;

const WITHIN: Duration = Duration::from_secs(30);

/// `/ready`'s status and body, `/health`'s status.
fn probe(node: &Node) -> Option<(u16, Value, u16)> {
    let ready = node.get("/ready")?;
    let health = node.get("/health")?;
    Some((ready.status, ready.json(), health.status))
}

fn ready_state(node: &Node) -> Option<String> {
    let (status, body, _) = probe(node)?;
    (status == 200).then(|| body["state"].as_str().unwrap_or_default().to_owned())
}

#[test]
fn starting_is_not_ready_serving_is_and_a_drain_is_not_while_health_stays_200() {
    let sb = Sandbox::new();
    // The broker is not up yet: the node binds its HTTP surface and waits.
    let port = free_port();
    let mut node = sb
        .fleet_node(
            "ready-start",
            &[format!("nats://127.0.0.1:{port}")],
            "[shutdown]\ndrain_notice_seconds = 3\n",
        )
        .spawn();
    assert!(
        eventually(WITHIN, || node.get("/health").is_some()),
        "the HTTP surface binds first: {}",
        node.log_text()
    );
    let (status, body, health) = probe(&node).unwrap();
    assert_eq!((status, health), (503, 200), "{body}");
    assert_eq!(body["reason"], "starting", "{body}");
    assert_eq!(node.health()["phase"], "starting");

    let _server = NatsServer::spawn(ServerSpec {
        name: format!("ready-{port}"),
        port,
        monitor_port: free_port(),
        store_dir: sb.path("nats"),
        extra_args: Vec::new(),
    });
    node.wait_ready(Duration::from_secs(60));
    assert!(
        eventually(WITHIN, || ready_state(&node).as_deref() == Some("serving")),
        "{:?}",
        probe(&node)
    );

    node.signal(libc::SIGTERM);
    assert!(
        eventually(Duration::from_secs(2), || probe(&node)
            .is_some_and(|(s, b, _)| s == 503 && b["reason"] == "draining")),
        "a drain is not ready: {:?}",
        probe(&node)
    );
    let health = node.get("/health").unwrap();
    assert_eq!(health.status, 200, "health stays 200 through the drain");
    assert_eq!(health.json()["draining"], true);
    assert_eq!(health.json()["posture"], "serve", "{}", health.text());
    assert_eq!(node.wait_exit(WITHIN).code(), Some(0));
}

/// What one node answered while its broker was away.
#[derive(Default)]
struct Seen {
    disconnected_ready: usize,
    stepped_out: usize,
}

/// Checks one answer against the rule: 200 while the stream has been down
/// less than the bound, 503 `stream_disconnected` from it on, `/health` 200.
fn judge(node: &Node, seen: &mut Seen) {
    let Some((status, body, health)) = probe(node) else {
        return;
    };
    assert_eq!(health, 200, "/health stays 200: {body}");
    let down_and_bound = || {
        let field = |k: &str| body[k].as_u64().unwrap_or_else(|| panic!("no {k}: {body}"));
        (field("down_ms"), field("steps_out_after_ms"))
    };
    match status {
        200 if body["state"] == "disconnected" => {
            let (down, bound) = down_and_bound();
            assert!(down < bound, "ready past the bound: {body}");
            seen.disconnected_ready += 1;
        }
        200 => {}
        _ => {
            assert_eq!(body["reason"], "stream_disconnected", "{body}");
            let (down, bound) = down_and_bound();
            assert!(down >= bound, "out of rotation within the bound: {body}");
            // `/health` shows the outage too.
            let stream = &node.health()["stream"];
            assert_eq!(stream["connected"], false, "{stream}");
            assert!(stream["down_ms"].is_u64(), "{stream}");
            seen.stepped_out += 1;
        }
    }
}

#[test]
fn a_broker_blip_shared_by_two_nodes_keeps_both_ready_and_a_long_outage_steps_them_out() {
    let mut server = NatsServer::start();
    let sb = Sandbox::new();
    // The bound is the heartbeat: 5 s here.
    let extra = "[coordination]\nlease_ttl_seconds = 15\nheartbeat_seconds = 5\n";
    let mut nodes: Vec<Node> = ["blip-a", "blip-b"]
        .iter()
        .map(|id| sb.fleet_node(id, &[server.url()], extra).spawn())
        .collect();
    for node in &mut nodes {
        node.wait_ready(Duration::from_secs(60));
        assert!(
            eventually(WITHIN, || ready_state(node).as_deref() == Some("serving")),
            "{:?}",
            probe(node)
        );
    }

    // A blip: both nodes see the broker go, both stay in rotation saying
    // so, and both serve again once it is back.
    server.kill();
    let mut seen: Vec<Seen> = nodes.iter().map(|_| Seen::default()).collect();
    assert!(
        eventually(WITHIN, || {
            for (node, seen) in nodes.iter().zip(&mut seen) {
                judge(node, seen);
            }
            seen.iter().all(|s| s.disconnected_ready > 0)
        }),
        "both nodes stay ready while disconnected"
    );
    server.restart();
    server.wait_healthy(WITHIN);
    assert!(
        eventually(WITHIN, || {
            for (node, seen) in nodes.iter().zip(&mut seen) {
                judge(node, seen);
            }
            nodes
                .iter()
                .all(|n| ready_state(n).as_deref() == Some("serving"))
        }),
        "both serve again after the blip: {:?}",
        nodes.iter().map(probe).collect::<Vec<_>>()
    );

    // An outage longer than the bound: each steps out at it, never before.
    server.kill();
    let mut seen: Vec<Seen> = nodes.iter().map(|_| Seen::default()).collect();
    assert!(
        eventually(WITHIN, || {
            for (node, seen) in nodes.iter().zip(&mut seen) {
                judge(node, seen);
            }
            seen.iter().all(|s| s.stepped_out > 0)
        }),
        "both step out past the bound: {:?}",
        nodes.iter().map(probe).collect::<Vec<_>>()
    );
    assert!(
        seen.iter().all(|s| s.disconnected_ready > 0),
        "ready first, while the outage was shorter than the bound"
    );
    server.restart();
    server.wait_healthy(WITHIN);
    assert!(
        eventually(WITHIN, || nodes
            .iter()
            .all(|n| ready_state(n).as_deref() == Some("serving"))),
        "both back in rotation: {:?}",
        nodes.iter().map(probe).collect::<Vec<_>>()
    );
}

#[test]
fn isolated_stays_ready() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let mut node = sb.fleet_node("iso-1", &[server.url()], "").spawn();
    node.wait_ready(Duration::from_secs(60));
    assert!(eventually(WITHIN, || ready_state(&node).as_deref() == Some("serving")));
    // The config pointer's bucket goes away under a connected node: the
    // pointer cannot be read, so the node is isolated and serves on.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = async_nats::connect(server.url()).await.unwrap();
        async_nats::jetstream::new(client)
            .delete_stream("KV_crewlet_config")
            .await
            .unwrap();
    });
    assert!(
        eventually(WITHIN, || node.health()["posture"] == "isolated"),
        "{}",
        node.health()
    );
    let (status, body, health) = probe(&node).unwrap();
    assert_eq!((status, health), (200, 200), "{body}");
    assert_eq!(body["state"], "isolated", "{body}");
}
