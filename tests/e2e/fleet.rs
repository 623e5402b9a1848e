//! A node in the fleet: its presence lease (membership), its plugins.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use crewlet_coord::{Coord, CoordOptions, Owner};
use crewlet_testkit::{NatsServer, free_port};

fn node_on(server: &NatsServer, id: &str, extra: &[&str]) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let port = free_port();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\nlabels = {{ zone = \"eu\" }}\n[stream]\nurl = \"{}\"\n",
            server.url()
        ),
    );
    let mut builder = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir());
    for a in extra {
        builder = builder.arg(a);
    }
    let mut node = builder.spawn();
    node.wait_ready(Duration::from_secs(60));
    (sb, node)
}

fn members(
    rt: &tokio::runtime::Runtime,
    coord: &Coord,
) -> Vec<(String, Vec<String>, Option<bool>)> {
    rt.block_on(coord.list_live("node"))
        .expect("membership read answers")
        .into_iter()
        .map(|l| {
            let status = l.status.unwrap_or_default();
            (l.name.to_string(), status.roles, status.draining)
        })
        .collect()
}

#[test]
fn presence_is_fleet_membership_and_a_drain_leaves_it_first() {
    let server = NatsServer::start();
    let (_sb, mut node) = node_on(&server, "member-1", &[]);
    assert!(
        eventually(
            Duration::from_secs(10),
            || node.health()["presence"]["state"] == "admitting"
        ),
        "{}",
        node.health()
    );
    assert!(node.health()["presence"]["epoch"].as_u64() >= Some(1));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let coord = rt
        .block_on(Coord::open(
            client,
            CoordOptions::new(Owner::incarnation("observer")),
        ))
        .unwrap();
    let live = members(&rt, &coord);
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].0, "node:member-1");
    assert_eq!(live[0].1, ["data", "ingress", "seats", "workers"]);
    assert_eq!(live[0].2, Some(false), "this build says it is not draining");

    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(20)).code(), Some(0));
    assert!(
        members(&rt, &coord).is_empty(),
        "the drain released node:member-1"
    );
}

#[test]
fn plugins_load_at_start_with_their_grants_and_buckets() {
    let server = NatsServer::start();
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins");
    let (_sb, node) = node_on(
        &server,
        "plugged",
        &["--plugins", plugins.to_str().unwrap()],
    );
    let view = node.get("/plugins").unwrap().json();
    let list = view["plugins"].as_array().unwrap();
    let github = list
        .iter()
        .find(|p| p["name"] == "github")
        .expect("github loaded");
    assert_eq!(github["kind"], "webhook");
    assert!(
        github["permissions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "serves /webhooks/github"),
        "{github}"
    );
    assert_eq!(github["degraded"], false);
    assert!(
        list.iter()
            .any(|p| p["name"] == "openai" && p["kind"] == "provider")
    );
    assert!(
        list.iter()
            .any(|p| p["name"] == "presence-board" && p["kind"] == "module")
    );
    assert!(view["failed"].as_array().unwrap().is_empty(), "{view}");
    assert!(
        !list
            .iter()
            .any(|p| p["name"].as_str().unwrap().contains("hostile"))
    );

    // The module buckets the catalogue declares exist on the stream.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
        js.get_key_value("mod_presence_seen")
            .await
            .expect("module bucket created at start");
    });
    assert_eq!(node.health()["plugins"]["failed"], 0);
}
