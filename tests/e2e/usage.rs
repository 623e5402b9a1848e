//! Fleet-wide usage history through the real binary: two nodes on one
//! nats-server, each holding one seat, each running a turn; `GET /usage`
//! on either node answers both nodes' usage from its own replicated
//! estate (no scatter); one node is killed and its usage still counts on
//! the other; a query with a wrong word is 400 naming it; the killed node
//! restarts, resumes at its committed position and its republished day
//! replaces rather than adds. Evicted, a node that comes back applies
//! nothing until an operator readmits it. A node without `data` counts
//! too: its usage is tallied from what it publishes (it keeps no log),
//! read on the data node by node and by provider slot, and a restart of
//! it resumes its day from what it published rather than shrinking it.

use std::collections::BTreeMap;
use std::time::Duration;

use crewlet_testkit::NatsServer;
use serde_json::Value;

use crate::common::company::{SCRIPTED_COMPANY, SLACK_SECRET, fill};
use crate::common::fleet::holders;
use crate::common::{Node, Sandbox, eventually, run_to_exit, slack_mention};
use crate::memory::spawn;
use crate::turns::plugins;

/// `GET /usage` on `node` with `query` (null unless it answered 200).
fn usage(node: &Node, query: &str) -> Value {
    match node.get(&format!("/usage?{query}")) {
        Some(r) if r.status == 200 => r.json(),
        _ => Value::Null,
    }
}

/// Turns ended per key, as `node`'s `/usage` sums them over every day.
fn turns_by(node: &Node, by: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for row in usage(node, &format!("period=month&by={by}"))["rows"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let (Some(k), Some(n)) = (row["key"].as_str(), row["turns"].as_u64()) {
            *out.entry(k.to_owned()).or_default() += n;
        }
    }
    out
}

/// The scripted company with a second seat, bob, of ada's role; the
/// plugins it names.
fn two_seats(sb: &Sandbox) {
    let seats = "[seats]\nada = { role = \"support\" }\n";
    assert!(
        SCRIPTED_COMPANY.contains(seats),
        "the scripted company's seats moved"
    );
    let doc = SCRIPTED_COMPANY.replace(seats, &format!("{seats}bob = {{ role = \"support\" }}\n"));
    std::fs::write(sb.path("company.toml"), fill(&doc, &sb.path("chat.jsonl"))).unwrap();
    plugins(sb, None);
}

/// Waits until `node` sees ada and bob held, one on each node.
fn one_seat_each(node: &Node) {
    let mut held = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            held = holders(node).unwrap_or_default();
            held.len() == 2 && held["ada"] != held["bob"]
        }),
        "the two seats never sat one on each node: {held:?}"
    );
}

#[test]
fn usage_from_every_node_reads_on_either_and_outlives_a_node_that_stopped() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    two_seats(&sb);
    let a = spawn(&sb, "node-a", &server);
    let mut b = spawn(&sb, "node-b", &server);
    one_seat_each(&a);
    slack_mention(&a, SLACK_SECRET, "ada", "EvU1", "C1", "1.1", "<@ada> hello");
    slack_mention(&a, SLACK_SECRET, "bob", "EvU2", "C1", "2.1", "<@bob> hello");

    let both: BTreeMap<String, u64> = [("node-a".to_owned(), 1), ("node-b".to_owned(), 1)].into();
    for node in [&a, &b] {
        let mut seen = BTreeMap::new();
        assert!(
            eventually(Duration::from_secs(30), || {
                seen = turns_by(node, "node");
                seen == both
            }),
            "{} never showed one turn from each node: {seen:?}\n{}",
            node.api,
            usage(node, "by=node")
        );
    }
    let by_seat = usage(&b, "by=seat&period=day");
    for seat in ["ada", "bob"] {
        let row = by_seat["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["key"] == seat).cloned())
            .unwrap_or_else(|| panic!("no row for {seat}: {by_seat}"));
        // The executor's two steps (post, submit) and the reviewer's one.
        assert_eq!(row["calls"], 3, "{row}");
        assert!(row["input_tokens"].as_u64() > Some(0), "{row}");
        assert_eq!(row["outcomes"]["delivered"], 1, "{row}");
    }
    assert_eq!(
        turns_by(&a, "role"),
        BTreeMap::from([("support".to_owned(), 2)])
    );
    let health = a.health();
    assert_eq!(
        health["estate"]["domains"][0]["state"], "applying",
        "{health}"
    );
    assert_eq!(health["estate"]["domains"][0]["ops_lost"], 0, "{health}");

    let r = a.get("/usage?period=year").expect("GET /usage");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("year"), "{}", r.text());

    // Node B is killed: the usage it published stays in A's estate.
    b.signal(libc::SIGKILL);
    b.wait_exit(Duration::from_secs(30));
    assert_eq!(turns_by(&a, "node"), both);
    let api = format!("http://{}", a.api);
    let (status, out) = run_to_exit(
        &["usage", "--by", "node", "--period", "month", "--api", &api],
        &[],
    );
    assert!(
        status.success() && out.contains("node-a") && out.contains("node-b"),
        "{out}"
    );

    // B is gone for good: an operator evicts it, audited; a node the
    // state log never knew is refused, naming the ones it knows.
    let (status, out) = run_to_exit(
        &[
            "estate", "evict", "node-z", "--reason", "typo", "--api", &api,
        ],
        &[],
    );
    assert!(!status.success() && out.contains("node-a"), "{out}");
    let (status, out) = run_to_exit(
        &[
            "estate",
            "evict",
            "node-b",
            "--reason",
            "disk lost",
            "--api",
            &api,
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    assert!(
        eventually(Duration::from_secs(10), || !crate::common::events(
            &a,
            "node_evicted"
        )
        .is_empty()),
        "no node_evicted event"
    );

    // B comes back while evicted: it applies nothing and says how to be
    // readmitted; an operator readmits it (audited, once) and it applies
    // the log again, everyone's usage with it.
    let b = spawn(&sb, "node-b", &server);
    let mut state = Value::Null;
    assert!(
        eventually(Duration::from_secs(20), || {
            state = b.health()["estate"]["domains"][0].clone();
            state["state"] == "evicted"
        }),
        "the evicted node is not refused: {state}"
    );
    let fix = state["fix"].as_str().unwrap_or_default();
    assert!(fix.contains("crewlet estate readmit node-b"), "{state}");
    let readmit = || {
        run_to_exit(
            &[
                "estate",
                "readmit",
                "node-b",
                "--reason",
                "disk replaced",
                "--api",
                &api,
            ],
            &[],
        )
    };
    let (status, out) = readmit();
    assert!(status.success(), "{out}");
    let (status, out) = readmit();
    assert!(!status.success() && out.contains("not evicted"), "{out}");
    assert!(
        eventually(Duration::from_secs(30), || {
            state = b.health()["estate"]["domains"][0].clone();
            state["state"] == "applying" && turns_by(&b, "node") == both
        }),
        "the readmitted node does not apply again: {state}"
    );
    assert!(
        eventually(Duration::from_secs(10), || !crate::common::events(
            &a,
            "node_readmitted"
        )
        .is_empty()),
        "no node_readmitted event"
    );
}

/// A node without `data` (seats only): the fleet config of `spawn`, its
/// roles narrowed.
fn stateless(sb: &Sandbox, id: &str, server: &NatsServer) -> Node {
    let builder = sb
        .fleet_node(
            id,
            &[server.url()],
            "[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n",
        )
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .env("MODEL_KEY", "sk-one-1111");
    let cfg = sb.path(&format!("{id}.toml"));
    let text = std::fs::read_to_string(&cfg).unwrap();
    let named = format!("id = \"{id}\"\n");
    assert!(text.contains(&named), "the fleet config moved: {text}");
    std::fs::write(
        &cfg,
        text.replace(&named, &format!("{named}roles = [\"seats\"]\n")),
    )
    .unwrap();
    let mut node = builder.spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

/// Calls per key of `node`'s `/usage?by=provider` over every day (the key
/// `null`, calls whose events named no slot, as `?`).
fn calls_by_slot(node: &Node) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for row in usage(node, "period=month&by=provider")["rows"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = row["key"].as_str().unwrap_or("?").to_owned();
        *out.entry(key).or_default() += row["calls"].as_u64().unwrap_or(0);
    }
    out
}

#[test]
fn a_stateless_nodes_usage_counts_on_the_data_node_by_slot_and_survives_its_restart() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    two_seats(&sb);
    let keeper = spawn(&sb, "keeper", &server);
    let mut edge = stateless(&sb, "edge", &server);
    one_seat_each(&keeper);
    slack_mention(
        &keeper,
        SLACK_SECRET,
        "ada",
        "EvS1",
        "C1",
        "1.1",
        "<@ada> hello",
    );
    slack_mention(
        &keeper,
        SLACK_SECRET,
        "bob",
        "EvS2",
        "C1",
        "2.1",
        "<@bob> hello",
    );

    let both: BTreeMap<String, u64> = [("edge".to_owned(), 1), ("keeper".to_owned(), 1)].into();
    let mut seen = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            seen = turns_by(&keeper, "node");
            seen == both
        }),
        "the data node never showed one turn from each node: {seen:?}\n{}",
        usage(&keeper, "by=node")
    );
    // Each turn: the executor's two calls and the reviewer's one, each
    // naming the entry that served it (the scripted provider has no key).
    let slots: BTreeMap<String, u64> = [
        ("scripted/demo#keyless".to_owned(), 4),
        ("scripted/demo-review#keyless".to_owned(), 2),
    ]
    .into();
    let mut by_slot = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            by_slot = calls_by_slot(&keeper);
            by_slot == slots
        }),
        "calls by provider slot: {by_slot:?}"
    );
    let api = format!("http://{}", keeper.api);
    let (status, out) = run_to_exit(
        &["usage", "--by", "node", "--period", "month", "--api", &api],
        &[],
    );
    assert!(
        status.success() && out.contains("edge") && out.contains("keeper"),
        "{out}"
    );

    // Edge is killed and restarted: it keeps no log, so it resumes its day
    // from what it published, and its republished day does not shrink.
    let applied = |n: &Node| n.health()["estate"]["domains"][0]["position"].as_u64();
    let before = applied(&keeper).expect("the keeper's position");
    edge.signal(libc::SIGKILL);
    edge.wait_exit(Duration::from_secs(30));
    let edge = stateless(&sb, "edge", &server);
    let mut position = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            position = applied(&keeper);
            position > Some(before)
        }),
        "the restarted edge never republished its day: {position:?} after {before}"
    );
    assert_eq!(turns_by(&keeper, "node"), both, "edge's day shrank or grew");
    assert_eq!(calls_by_slot(&keeper), slots);
    drop(edge);
}
