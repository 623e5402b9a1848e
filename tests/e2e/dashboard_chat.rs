//! The dashboard's chat in a real browser (tests/browser/chat.mjs), two
//! tabs on the two nodes of a fleet running the example company: "@grace
//! hello" typed in tab A is answered in its thread by grace within 2 s, tab
//! B on the other node sees the conversation and grace's working indicator
//! live, and a follow-up in the thread without a mention is answered.
//! Screenshots go under the test's output dir. The figure in BENCHMARKS.md
//! ("Chat: a reply seen in another tab") is the ignored test below.

use crate::common;
use crate::dashboard::{browser_dir, node_on, read_token, wait_two_nodes_holding_every_seat};

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use crewlet_testkit::NatsServer;
use serde_json::Value;

/// Two nodes of one fleet running the example company (its seats answer
/// in the company chat), every seat held; and a read-scope token.
fn fleet(server: &NatsServer) -> (Vec<(Sandbox, Node)>, String) {
    let nodes = vec![
        node_on(server, "chat-a", true),
        node_on(server, "chat-b", true),
    ];
    wait_two_nodes_holding_every_seat(&nodes[0].1);
    let read = read_token(&nodes[0].1, "watcher");
    (nodes, read)
}

/// Runs chat.mjs (tab A on `a`, tab B on `b`); its JSON lines, once it said OK.
fn drive(a: &Node, b: &Node, read_token: &str, out: &Path, figure: usize) -> Vec<Value> {
    let browser_dir = browser_dir();
    let run = Command::new("node")
        .arg(browser_dir.join("chat.mjs"))
        .arg(format!("http://{}", a.api))
        .arg(format!("http://{}", b.api))
        .arg(http::OPERATOR_TOKEN)
        .arg(read_token)
        .arg(out)
        .arg(figure.to_string())
        .current_dir(&browser_dir)
        .output()
        .expect("run node (Node.js)");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.lines().last() == Some("OK"),
        "{stdout}\n{}\nnode a:\n{}\nnode b:\n{}",
        String::from_utf8_lossy(&run.stderr),
        a.log_text(),
        b.log_text()
    );
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The test's output dir, emptied: the screenshots.
fn out_dir(name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    out
}

#[test]
fn a_mention_typed_in_one_tab_is_answered_live_in_a_tab_on_the_other_node() {
    let server = NatsServer::start();
    let out = out_dir("dashboard-chat");
    let (nodes, read) = fleet(&server);
    let (a, b) = (&nodes[0].1, &nodes[1].1);
    let trips = drive(a, b, &read, &out, 0);
    println!("round trips (sent in tab A, reply drawn): {trips:?}");
    let phases: Vec<_> = trips.iter().map(|t| t["phase"].clone()).collect();
    assert_eq!(phases, ["mention", "follow-up"], "{trips:?}");

    // What the tabs showed is what the chat holds, on either node: the
    // person's two messages and grace's two replies, in one thread.
    let channel = b
        .get("/chat/channels/general/messages")
        .expect("GET messages")
        .json();
    let root = &channel["messages"][0];
    assert_eq!(root["text"], "@grace hello", "{channel}");
    assert_eq!(root["replies"], 3, "{channel}");
    let thread = a
        .get(&format!(
            "/chat/channels/general/messages?thread={}",
            root["id"].as_str().unwrap()
        ))
        .expect("GET thread")
        .json();
    let authors: Vec<_> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["id"] != root["id"])
        .map(|m| m["author"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        authors,
        ["grace", root["author"].as_str().unwrap(), "grace"],
        "{thread}"
    );
    for width in [1280, 390] {
        for shot in ["chat", "chat-read-scope"] {
            let file = out.join(format!("{shot}-{width}.png"));
            assert!(file.is_file(), "{}", file.display());
        }
    }
}

/// The n-th percentile (nearest rank) of `v`, sorted in place.
fn percentile(v: &mut [f64], n: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = ((n / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The figure in BENCHMARKS.md: 24 mentions of grace in one thread, one
/// after another, each from tab A (node A) until her reply is drawn in tab
/// B (node B), against the same turns' time from the wake to the reply
/// (`wake_published` → `reply_posted`, joined by trace id). 24 with the
/// test's two keeps her under the wake valve (30 wakes in 30 s), which
/// would hold the rest back for the window. Not a check:
/// `cargo test -p crewlet --test e2e -- --ignored --nocapture dashboard_chat::figure`
#[test]
#[ignore = "a benchmark: prints the figure, asserts nothing about it"]
fn figure_a_reply_seen_in_another_tab_against_the_turns_wake_to_reply() {
    const N: usize = 24;
    let server = NatsServer::start();
    let out = out_dir("dashboard-chat-figure");
    let (nodes, read) = fleet(&server);
    let (a, b) = (&nodes[0].1, &nodes[1].1);
    let trips = drive(a, b, &read, &out, N);
    let figure: Vec<&Value> = trips.iter().filter(|t| t["phase"] == "figure").collect();
    let from = figure[0]["sent_ms"].as_f64().unwrap();
    let mut seen: Vec<f64> = figure
        .iter()
        .map(|t| t["shown_ms"].as_f64().unwrap() - t["sent_ms"].as_f64().unwrap())
        .collect();
    let of = |kind: &str| -> Vec<Value> {
        events(a, kind)
            .into_iter()
            .filter(|e| e["seat"] == "grace" && e["at_ms"].as_f64().unwrap_or(0.0) >= from)
            .collect()
    };
    let replies = of("reply_posted");
    let mut wake_to_reply: Vec<f64> = of("wake_published")
        .iter()
        .filter_map(|w| {
            let r = replies.iter().find(|r| r["trace_id"] == w["trace_id"])?;
            Some(r["at_ms"].as_f64()? - w["at_ms"].as_f64()?)
        })
        .collect();
    println!(
        "| {N} mentions, one after another | p50 | p99 |\n| --- | --- | --- |\n\
         | sent in tab A → reply drawn in tab B | {:.0} ms | {:.0} ms |\n\
         | the same turns: wake published → reply posted ({} joined) | {:.0} ms | {:.0} ms |",
        percentile(&mut seen, 50.0),
        percentile(&mut seen, 99.0),
        wake_to_reply.len(),
        percentile(&mut wake_to_reply, 50.0),
        percentile(&mut wake_to_reply, 99.0),
    );
}
