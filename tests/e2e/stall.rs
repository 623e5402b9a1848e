//! A stalled node holds nothing hostage: two nodes on one nats-server, one
//! frozen (SIGSTOP) while mentions for every seat arrive at the other. Its
//! `notify-inbound` deliveries and its seats' wakes move to the peer within
//! the ack waits, every mention is answered exactly once, and the frozen
//! node, thawed, posts nothing of what it held.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::company::{SCRIPTED_COMPANY, SLACK_SECRET, chat_server};
use crate::common::{Node, Sandbox, eventually, slack_mention};
use crewlet_testkit::{NatsServer, PluginsDir};
use serde_json::Value;

const SEATS: [&str; 4] = ["ada", "bob", "cy", "di"];

fn node(server: &NatsServer, id: &str, chat_log: &Path) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let seats: String = SEATS
        .iter()
        .map(|s| format!("{s} = {{ role = \"support\" }}\n"))
        .collect();
    let doc = SCRIPTED_COMPANY
        .replace("{chat}", &chat_server("support", chat_log))
        .replace("ada = { role = \"support\" }\n", &seats);
    std::fs::write(sb.path("company.toml"), doc).unwrap();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    let mut n = sb
        .fleet_node(
            id,
            &[server.url()],
            "[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n",
        )
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .spawn();
    n.wait_ready(Duration::from_secs(60));
    (sb, n)
}

/// Posts in the log, by thread.
fn posts(log: &Path) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let p: Value = serde_json::from_str(line).expect("a post is JSON");
        *by.entry(p["thread"].as_str().unwrap_or("").to_owned())
            .or_default() += 1;
    }
    by
}

#[test]
fn a_frozen_nodes_deliveries_are_answered_by_its_peer_within_seconds() {
    let server = NatsServer::start();
    let shared = Sandbox::new();
    let log = shared.path("chat.jsonl");
    let (_sa, a) = node(&server, "stall-a", &log);
    let (_sb, b) = node(&server, "stall-b", &log);
    let held = || {
        a.health()["seats_held"].as_u64().unwrap_or(0)
            + b.health()["seats_held"].as_u64().unwrap_or(0)
    };
    // Both nodes hold seats: the frozen one's seats move too.
    let b_holds = || b.health()["seats_held"].as_u64().unwrap_or(0) > 0;
    assert!(
        eventually(Duration::from_secs(30), || held() == SEATS.len() as u64
            && b_holds()),
        "every seat held: a {} b {}",
        a.health()["seats_held"],
        b.health()["seats_held"]
    );
    let b_held = b.health()["seats_held"].clone();

    b.freeze();
    let mut sent = Vec::new();
    for i in 0..12 {
        let seat = SEATS[i % SEATS.len()];
        let thread = format!("90.{i}");
        slack_mention(
            &a,
            SLACK_SECRET,
            seat,
            &format!("EvStall{i}"),
            "C9",
            &thread,
            &format!("<@{seat}> are you there?"),
        );
        sent.push((thread, Instant::now()));
    }
    let mut waited = BTreeMap::new();
    let all = eventually(Duration::from_secs(60), || {
        let by = posts(&log);
        for (thread, at) in &sent {
            if by.contains_key(thread) {
                waited.entry(thread.clone()).or_insert_with(|| at.elapsed());
            }
        }
        waited.len() == sent.len()
    });
    b.signal(libc::SIGCONT);
    assert!(
        all,
        "answered {} of {}: {waited:?}\nnode a:\n{}",
        waited.len(),
        sent.len(),
        a.log_text()
    );
    let worst = waited.values().max().copied().unwrap_or_default();
    eprintln!(
        "stall: b held {b_held} seat(s) when frozen; 12 mentions answered by its peer, worst wait {worst:?}: {waited:?}"
    );
    // Bound: the notify ack wait (5 s) plus a mailbox ack wait (10 s) plus
    // the turn, against 30 s + 30 s before they were shortened.
    assert!(
        worst < Duration::from_secs(25),
        "a mention waited {worst:?} on the frozen node: {waited:?}"
    );

    // Thawed, the frozen node finds its leases gone and posts nothing of
    // what it held: still one post per mention.
    std::thread::sleep(Duration::from_secs(5));
    let by = posts(&log);
    assert!(
        sent.iter().all(|(t, _)| by.get(t) == Some(&1)),
        "one post per mention after the thaw: {by:?}\nnode b:\n{}",
        b.log_text()
    );
}
