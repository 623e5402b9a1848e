//! A fleet read through real request/reply on a real nats-server, with
//! presence on the in-memory coordination twin: every live node's rows
//! merged, a silent node named, an unreadable presence said as unknown; a
//! node without `data` read from the data nodes that keep its events, and
//! said to be kept nowhere while no data node is live.

use std::sync::Arc;
use std::time::Duration;

use crewlet_bus::EventFilter;
use crewlet_coord::{Coord, CoordOptions, Faulty, NodeStatus, Owner};
use crewlet_history::{Ask, Reader, Responder};
use crewlet_store::{EventRecord, Store};
use crewlet_testkit::NatsServer;

fn options() -> CoordOptions {
    let mut o = CoordOptions::new(Owner::incarnation("history-test"));
    o.lease_ttl = Duration::from_secs(30);
    o
}

fn twin() -> (Arc<Faulty>, Coord) {
    Coord::breakable_memory(options())
}

/// A node's own log in a temporary dir, holding `rows` (event id, time).
fn log(node: &str, rows: &[(&str, i64)]) -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in(dir.path()).unwrap();
    for (id, at) in rows {
        let mut e = EventRecord::new(
            *id,
            "turn_started",
            node,
            serde_json::json!({"turn_id": id}),
        );
        e.at_ms = *at;
        e.seat = Some("ada".into());
        store.append_event(&e).unwrap();
    }
    (dir, Arc::new(store))
}

/// `node` in presence as a data node (it keeps its own log).
async fn present(coord: &Coord, node: &str) {
    present_as(coord, node, &["data"]).await;
}

async fn present_as(coord: &Coord, node: &str, roles: &[&str]) {
    let owner = Owner::incarnation(node);
    let status = NodeStatus {
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        ..NodeStatus::default()
    };
    let held = coord
        .acquire_presence(node, &owner, status)
        .await
        .expect("the twin answers");
    assert!(held.is_yes(), "{node} in presence");
}

/// The event ids of a read's rows, in its order.
fn ids(read: &serde_json::Value) -> Vec<&str> {
    read["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect()
}

async fn connect(server: &NatsServer) -> async_nats::Client {
    async_nats::connect(server.url()).await.expect("connect")
}

#[tokio::test]
async fn every_live_node_is_read_and_a_silent_one_is_named() {
    let server = NatsServer::start();
    let (_faulty, coord) = twin();
    let (_da, a) = log("a", &[("a1", 10), ("a2", 30)]);
    let (_db, b) = log("b", &[("b1", 20)]);
    for node in ["a", "b", "c"] {
        present(&coord, node).await;
    }
    // b answers for itself; c is in presence and answers nobody.
    let responder = Responder::start(connect(&server).await, "b".into(), b, 0)
        .await
        .expect("subscribe");
    let reader = Reader::new(
        "a".into(),
        connect(&server).await,
        coord.roster("node"),
        a,
        0,
    );

    let read = reader.events(EventFilter::default()).await;
    let ids = ids(&read);
    assert_eq!(ids, ["a2", "b1", "a1"], "newest first, both logs: {read}");
    let coverage = &read["coverage"];
    assert_eq!(coverage["complete"], false, "{coverage}");
    assert_eq!(coverage["membership"], "presence");
    assert_eq!(coverage["answered"], serde_json::json!(["a", "b"]));
    assert_eq!(coverage["missing"][0]["node"], "c");
    assert_eq!(coverage["missing"][0]["reason"], "no_responders");

    // One node alone: b's rows only, and nobody else asked.
    let only_b = reader
        .events(EventFilter {
            node: Some("b".into()),
            ..EventFilter::default()
        })
        .await;
    assert_eq!(only_b["events"].as_array().unwrap().len(), 1, "{only_b}");
    assert_eq!(only_b["coverage"]["complete"], true, "{only_b}");

    // A turn's detail finds the node it ran on.
    let turn = reader.turn("b1").await;
    assert_eq!(turn["found"], true, "{turn}");
    assert_eq!(turn["nodes"], serde_json::json!(["b"]), "{turn}");

    // Once b stops answering it is named, never dropped silently.
    responder.stop().await;
    let gathered = reader.gather(Ask::OpenTurns, Some("b")).await;
    assert!(gathered.told.is_empty());
    assert_eq!(gathered.coverage.missing[0].node, "b");
}

#[tokio::test]
async fn unreadable_presence_is_unknown_membership_not_a_fleet_of_one() {
    let server = NatsServer::start();
    let (faulty, coord) = twin();
    let (_da, a) = log("a", &[("a1", 10)]);
    present(&coord, "a").await;
    faulty.break_store();
    let reader = Reader::new(
        "a".into(),
        connect(&server).await,
        coord.roster("node"),
        a,
        0,
    );
    let read = reader.events(EventFilter::default()).await;
    assert_eq!(read["events"][0]["event_id"], "a1", "its own rows: {read}");
    let coverage = &read["coverage"];
    assert_eq!(coverage["complete"], false, "{coverage}");
    assert_eq!(coverage["membership"], "unknown", "{coverage}");
    assert!(coverage["membership_error"].is_string(), "{coverage}");
}

#[tokio::test]
async fn before_the_engine_the_own_log_says_the_fleet_was_not_asked() {
    let (_da, a) = log("a", &[("a1", 10), ("a2", 20)]);
    let read = crewlet_history::own_log(
        a,
        "a".into(),
        0,
        EventFilter {
            limit: Some(1),
            ..EventFilter::default()
        },
    )
    .await
    .expect("the log reads");
    assert_eq!(read["events"][0]["event_id"], "a2", "{read}");
    assert_eq!(read["truncated"], true, "the limit cut a row: {read}");
    assert_eq!(read["coverage"]["membership"], "unknown", "{read}");
    assert_eq!(read["coverage"]["answered"], serde_json::json!(["a"]));
}

#[tokio::test]
async fn a_stateless_nodes_events_are_read_from_the_data_node_that_keeps_them() {
    let server = NatsServer::start();
    let (_faulty, coord) = twin();
    // k's log keeps what s (no `data`) published, beside a row of its own.
    let (_dk, k) = log("s", &[("s1", 10), ("s2", 20)]);
    k.append_event(&EventRecord::new(
        "k1",
        "turn_started",
        "k",
        serde_json::json!({}),
    ))
    .unwrap();
    let (_ds, s) = log("s", &[]);
    present(&coord, "k").await;
    present_as(&coord, "s", &["seats"]).await;
    let keeper = Responder::start(connect(&server).await, "k".into(), k, 0)
        .await
        .expect("subscribe");
    let reader = Reader::new(
        "s".into(),
        connect(&server).await,
        coord.roster("node"),
        s,
        0,
    );
    let only_s = EventFilter {
        node: Some("s".into()),
        ..EventFilter::default()
    };
    let read = reader.events(only_s.clone()).await;
    let ids = ids(&read);
    assert_eq!(
        ids,
        ["s2", "s1"],
        "s's rows from k's log, not k's own: {read}"
    );
    let coverage = &read["coverage"];
    assert_eq!(coverage["answered"], serde_json::json!(["k"]), "{coverage}");
    assert_eq!(coverage["keepers"], serde_json::json!(["k"]), "{coverage}");
    assert_eq!(coverage["complete"], true, "{coverage}");

    // k stops and leaves presence: nobody keeps s's events, and the answer
    // says so rather than reading as "nothing happened".
    keeper.stop().await;
    let (_faulty, coord) = twin();
    present_as(&coord, "s", &["seats"]).await;
    let (_ds, s) = log("s", &[]);
    let reader = Reader::new(
        "s".into(),
        connect(&server).await,
        coord.roster("node"),
        s,
        0,
    );
    for read in [reader.events(only_s).await, reader.turn("s1").await] {
        let coverage = &read["coverage"];
        assert_eq!(read["events"], serde_json::json!([]), "{read}");
        assert_eq!(coverage["complete"], false, "{coverage}");
        assert_eq!(coverage["keepers"], serde_json::json!([]), "{coverage}");
        assert!(
            coverage["warning"]
                .as_str()
                .is_some_and(|w| w.contains("no live node has the `data` role")),
            "{coverage}"
        );
    }
}
