//! The fleet's views against the in-memory coordination twin (presence,
//! statuses) and a real nats-server (the history read): every live node
//! named with what it said, unknown never shown as nothing.

use std::sync::Arc;
use std::time::Duration;

use crewlet_company::ActiveCompany;
use crewlet_coord::{Coord, CoordOptions, Faulty, NodeStatus, Owner};
use crewlet_fleet::{FleetError, View};
use crewlet_testkit::NatsServer;

fn twin(owner: &str) -> (Arc<Faulty>, Coord) {
    let mut o = CoordOptions::new(Owner::incarnation(owner));
    o.lease_ttl = Duration::from_secs(30);
    Coord::breakable_memory(o)
}

async fn view(coord: &Coord, server: &NatsServer, dir: &tempfile::TempDir) -> View {
    let client = async_nats::connect(server.url()).await.expect("connect");
    let store = Arc::new(crewlet_store::Store::open_in(dir.path()).unwrap());
    let history =
        crewlet_history::Reader::new("n1".into(), client.clone(), coord.roster("node"), store, 0);
    let (_tx, pauses) = tokio::sync::watch::channel(None);
    View::new(
        "n1".into(),
        coord.survey(),
        client,
        history,
        ActiveCompany::new(None),
        pauses,
    )
}

#[tokio::test]
async fn every_live_node_is_a_row_and_this_node_is_marked() {
    let server = NatsServer::start();
    let (_f, coord) = twin("n1");
    let me = coord.options().owner.clone();
    let status = NodeStatus {
        roles: vec!["seats".into()],
        seats_held: Some(2),
        ..NodeStatus::default()
    };
    assert!(
        coord
            .acquire_presence("n1", &me, status)
            .await
            .unwrap()
            .is_yes()
    );
    let peer = Owner::incarnation("n2");
    // n2 is an older build: it says nothing of its seats.
    let quiet = NodeStatus::default();
    assert!(
        coord
            .acquire_presence("n2", &peer, quiet)
            .await
            .unwrap()
            .is_yes()
    );
    coord
        .publish_status("n1", &serde_json::json!({"applied_epoch": 4}))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let v = view(&coord, &server, &dir)
        .await
        .fleet()
        .await
        .expect("presence lists");
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{v}");
    assert_eq!(nodes[0]["id"], "n1");
    assert_eq!(nodes[0]["this_node"], true);
    assert_eq!(nodes[0]["seats_held"], 2);
    assert_eq!(nodes[0]["applied_epoch"], 4);
    assert_eq!(nodes[1]["id"], "n2");
    assert_eq!(nodes[1]["this_node"], false);
    assert!(
        nodes[1]["seats_held"].is_null(),
        "not reported, never 0: {v}"
    );
    assert!(nodes[1]["applied_epoch"].is_null(), "{v}");
    let table = crewlet_fleet::render_fleet(&v);
    assert!(table.lines().nth(1).unwrap().starts_with("n1* "), "{table}");
    assert!(table.contains("not reported"), "{table}");
}

#[tokio::test]
async fn unlisted_presence_is_an_error_not_an_empty_fleet() {
    let server = NatsServer::start();
    let (faulty, coord) = twin("n1");
    let dir = tempfile::tempdir().unwrap();
    let view = view(&coord, &server, &dir).await;
    faulty.break_store();
    let err = view.fleet().await.expect_err("unknown is not empty");
    assert!(matches!(err, FleetError::Presence(_)), "{err}");
    assert_eq!(err.kind(), "presence_unknown");
    // No company served: the agents view says so, and what to do.
    let err = view.agents().await.expect_err("no company");
    assert!(matches!(err, FleetError::NoCompany), "{err}");
}
