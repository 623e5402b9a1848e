//! The observability edge across two nodes: rows where an event was
//! published, live pushes everywhere, queries on the same socket.

use crate::common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use crewlet_testkit::{NatsServer, free_port};
use tungstenite::{Message, WebSocket};

fn node_on(server: &NatsServer, id: &str) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let port = free_port();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\n[stream]\nurl = \"{}\"\n",
            server.url()
        ),
    );
    let mut node = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .spawn();
    node.wait_ready(Duration::from_secs(30));
    (sb, node)
}

fn connect(node: &Node) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(&node.api).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (ws, _) = tungstenite::client(common::ws_stream_request(&node.api), stream).unwrap();
    ws
}

fn next_json(ws: &mut WebSocket<TcpStream>) -> serde_json::Value {
    loop {
        match ws.read().expect("socket open") {
            Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// Reads frames until `pred` matches one, within `within`.
fn wait_for(
    ws: &mut WebSocket<TcpStream>,
    within: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let frame = next_json(ws);
        if pred(&frame) {
            return frame;
        }
    }
    panic!("no matching frame within {within:?}");
}

#[test]
fn a_tab_on_node_b_sees_node_a_events_while_rows_stay_where_published() {
    let server = NatsServer::start();
    let (_sb_b, node_b) = node_on(&server, "node-b");
    let mut ws = connect(&node_b);
    assert_eq!(next_json(&mut ws)["kind"], "hello");

    let (_sb_a, node_a) = node_on(&server, "node-a");
    let pushed = wait_for(&mut ws, Duration::from_secs(10), |f| {
        f["kind"] == "event" && f["event"]["node_id"] == "node-a"
    });
    assert_eq!(pushed["event"]["type"], "node_started");
    assert!(pushed["event"]["seq"].as_i64().unwrap() > 0);

    // The query channel on the same socket reads the fleet's logs, each
    // row from the node that published it, and says who answered.
    ws.send(Message::Text(
        r#"{"id":7,"query":"events","type":"node_started","limit":10}"#.into(),
    ))
    .unwrap();
    let result = wait_for(&mut ws, Duration::from_secs(10), |f| f["kind"] == "result");
    assert_eq!(result["id"], 7);
    let rows = result["events"].as_array().unwrap();
    let mut from: Vec<&str> = rows
        .iter()
        .map(|r| r["node_id"].as_str().unwrap())
        .collect();
    from.sort();
    assert_eq!(from, ["node-a", "node-b"], "{result}");
    assert_eq!(result["coverage"]["complete"], true, "{result}");
    // `node` reads one node's log.
    ws.send(Message::Text(
        r#"{"id":9,"query":"events","type":"node_started","node":"node-b"}"#.into(),
    ))
    .unwrap();
    let result = wait_for(&mut ws, Duration::from_secs(10), |f| f["kind"] == "result");
    let rows = result["events"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{result}");
    assert_eq!(rows[0]["node_id"], "node-b");

    // The socket carries no writes.
    ws.send(Message::Text(
        r#"{"id":8,"query":"publish","type":"x"}"#.into(),
    ))
    .unwrap();
    let refused = wait_for(&mut ws, Duration::from_secs(10), |f| f["kind"] == "error");
    assert_eq!(refused["id"], 8);
    assert!(refused["error"].as_str().unwrap().contains("no writes"));

    // Node A's row is in node A's log, read over REST.
    let rows = node_a
        .get("/events?type=node_started&node=node-a")
        .unwrap()
        .json();
    let rows = rows["events"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["node_id"], "node-a");
    assert_eq!(rows[0]["parties"][0]["party"], "node:node-a");
}
