//! Seeing the fleet through the real binary: three nodes on one
//! nats-server, each holding one seat and running its turns with the
//! scripted provider. `GET /events` read from one node covers the turns
//! of all three; a frozen node is named in the coverage within the fleet
//! read budget, a killed one too; `GET /agents` shows each seat's holder,
//! `paused` after a pause and `stale` for a frozen holder; `GET /fleet`
//! lists every node; `crewlet agents` / `crewlet fleet` print them.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::company::{SLACK_SECRET, scripted_company};
use common::*;
use crewlet_testkit::{NatsServer, PluginsDir};
use serde_json::Value;

const SEATS: [&str; 3] = ["ada", "bob", "cyd"];

struct Fleet {
    _server: NatsServer,
    _sb: Sandbox,
    nodes: Vec<Node>,
}

/// Nodes `ids` on one nats-server; a lease TTL long enough (20 s) that a
/// frozen node stays in presence while the test reads around it and its
/// seat goes stale (a seat beat, half the TTL, after its last renew).
fn start(ids: &[&str]) -> Fleet {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    let doc = sb.path("company.toml");
    let seats: String = SEATS
        .iter()
        .map(|s| format!("{s} = {{ role = \"support\", group = \"day\" }}\n"))
        .collect();
    std::fs::write(&doc, scripted_company(&seats, &sb.path("chat.jsonl"))).unwrap();
    let nodes = ids
        .iter()
        .map(|id| {
            let mut node = sb
                .fleet_node(
                    id,
                    &[server.url()],
                    "[coordination]\nlease_ttl_seconds = 20\nheartbeat_seconds = 1\n",
                )
                .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
                .spawn();
            node.wait_ready(Duration::from_secs(60));
            node
        })
        .collect();
    Fleet {
        _server: server,
        _sb: sb,
        nodes,
    }
}

fn agents(node: &Node) -> Value {
    let r = node.get("/agents").expect("GET /agents");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Seat → (state, holder node).
fn holders(node: &Node) -> Vec<(String, String, String)> {
    agents(node)["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["handle"].as_str().unwrap().to_owned(),
                a["state"].as_str().unwrap().to_owned(),
                a["holder"]["node"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

fn ids(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            x.as_str()
                .unwrap_or_else(|| x["node"].as_str().unwrap())
                .to_owned()
        })
        .collect()
}

fn set(of: &[&str]) -> BTreeSet<String> {
    of.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn history_and_holders_are_read_from_every_node_and_a_stopped_one_is_named() {
    let mut f = start(&["fleet-a", "fleet-b", "fleet-c"]);
    let a = &f.nodes[0];
    // One seat per node: placement spreads three seats over three nodes.
    let mut seen = Vec::new();
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = holders(a);
            let nodes: BTreeSet<&str> = seen.iter().map(|(_, _, n)| n.as_str()).collect();
            seen.iter().all(|(_, s, _)| s == "held") && nodes.len() == 3
        }),
        "seats never spread over three nodes: {seen:?}"
    );
    let view = agents(a);
    let bob = &view["agents"].as_array().unwrap()[1];
    assert_eq!(
        (&bob["handle"], &bob["group"]),
        (&"bob".into(), &"day".into())
    );
    assert_eq!(bob["mailbox"]["pending"], 0, "{view}");
    assert_eq!(bob["turns_in_flight"], 0, "{view}");
    assert_eq!(view["errors"].as_array().map(Vec::len), Some(0), "{view}");
    // Each node's own view agrees on who holds what.
    for n in &f.nodes[1..] {
        let theirs: Vec<_> = holders(n).into_iter().map(|(h, _, n)| (h, n)).collect();
        let ours: Vec<_> = seen
            .iter()
            .map(|(h, _, n)| (h.clone(), n.clone()))
            .collect();
        assert_eq!(theirs, ours);
    }

    // Every seat answers a mention, sent to node a: the turns run on their
    // holders and each lands in its holder's own log.
    for (i, seat) in SEATS.iter().enumerate() {
        slack_mention(
            a,
            SLACK_SECRET,
            seat,
            &format!("Ev{i}"),
            "C1",
            &format!("{i}.1"),
            "hi",
        );
    }
    let mut read = Value::Null;
    assert!(
        eventually(Duration::from_secs(60), || {
            read = a.get("/events?type=turn_ended").unwrap().json();
            read["events"].as_array().is_some_and(|e| e.len() == 3)
        }),
        "three turns expected in the fleet's history: {read}"
    );
    let ran_on: BTreeSet<String> = read["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ran_on, set(&["fleet-a", "fleet-b", "fleet-c"]), "{read}");
    let cov = &read["coverage"];
    assert_eq!(cov["complete"], true, "{read}");
    assert_eq!(ids(&cov["answered"]), ran_on, "{read}");
    assert_eq!(
        (&read["truncated"], &read["limit"]),
        (&false.into(), &100.into())
    );
    // What a healthy three-node read costs, as seen by the caller.
    let mut walls: Vec<Duration> = (0..20)
        .map(|_| {
            let begun = Instant::now();
            let r = a.get("/events?type=turn_ended").unwrap().json();
            assert_eq!(r["coverage"]["complete"], true, "{r}");
            begun.elapsed()
        })
        .collect();
    walls.sort();
    eprintln!(
        "fleet read, 3 nodes, 20 reads: p50 {:?}, max {:?}",
        walls[10], walls[19]
    );
    assert!(walls[19] < Duration::from_secs(2), "{walls:?}");
    // Only node a's own log, and a limit that cuts is stated.
    let own = a
        .get("/events?type=turn_ended&node=fleet-a")
        .unwrap()
        .json();
    assert_eq!(own["events"].as_array().unwrap().len(), 1, "{own}");
    assert_eq!(ids(&own["coverage"]["answered"]), set(&["fleet-a"]));
    let cut = a.get("/events?type=turn_ended&limit=2").unwrap().json();
    assert_eq!(
        (cut["events"].as_array().unwrap().len(), &cut["truncated"]),
        (2, &true.into())
    );
    // A turn's detail, read from a node that did not run it.
    let elsewhere = read["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["node_id"] != "fleet-a")
        .unwrap();
    let turn_id = elsewhere["payload"]["turn_id"].as_str().unwrap();
    let detail = a.get(&format!("/turns/{turn_id}")).unwrap();
    assert_eq!(detail.status, 200, "{}", detail.text());
    let detail = detail.json();
    assert_eq!(
        detail["nodes"],
        serde_json::json!([elsewhere["node_id"]]),
        "{detail}"
    );
    let kinds: BTreeSet<&str> = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains("turn_started")
            && kinds.contains("turn_ended")
            && kinds.contains("model_call"),
        "{detail}"
    );
    assert_eq!(a.get("/turns/no-such-turn").unwrap().status, 404);
    // The fleet view: every node, what it holds, which broker it is on.
    // (What a node says of itself is as of its last beat: a node's first
    // beat can precede its broker being known.)
    let mut fleet = Value::Null;
    assert!(
        eventually(Duration::from_secs(20), || {
            fleet = a.get("/fleet").unwrap().json();
            let rows = fleet["nodes"].as_array().unwrap();
            let on_a_broker = rows.iter().all(|r| {
                r["broker"]["server_name"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            });
            on_a_broker
                && rows
                    .iter()
                    .map(|r| r["seats_held"].as_u64().unwrap())
                    .sum::<u64>()
                    == 3
        }),
        "{fleet}"
    );
    let rows = fleet["nodes"].as_array().unwrap();
    assert_eq!(
        ids(&Value::from(
            rows.iter().map(|r| r["id"].clone()).collect::<Vec<_>>()
        )),
        ran_on
    );
    for r in rows {
        assert!(
            r["broker"]["server_name"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{r}"
        );
        assert!(
            r["last_beat_ms"].as_i64() > Some(crewlet_os::now_ms() - 5_000),
            "{r}"
        );
        assert_eq!(r["roles"].as_array().map(Vec::len), Some(4), "{r}");
    }
    assert_eq!(rows.iter().filter(|r| r["this_node"] == true).count(), 1);
    let api = format!("http://{}", a.api);
    let (status, out) = run_to_exit(&["fleet", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    for id in &ran_on {
        assert!(out.contains(id.as_str()), "{out}");
    }

    // A pause shows, whoever holds the seat; `crewlet agents` prints it.
    let r = http::post(&a.api, "/agents/bob/pause", &[], b"{}").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        eventually(Duration::from_secs(10), || holders(a)[1].1 == "paused"),
        "{:?}",
        holders(a)
    );
    let (status, out) = run_to_exit(&["agents", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    let bob_line = out
        .lines()
        .find(|l| l.starts_with("bob "))
        .unwrap_or_default();
    assert!(
        bob_line.contains("paused") && bob_line.contains("day"),
        "{out}"
    );
    let (status, out) = run_to_exit(&["agents", "--json", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["agents"][1]["paused"],
        true
    );

    // Freeze the node holding cyd: it stays in presence, answers nothing,
    // and is named — within the budget — while the others' rows are there.
    let frozen_id = seen[2].2.clone();
    let at = f
        .nodes
        .iter()
        .position(|n| n.health()["node_id"] == frozen_id.as_str())
        .unwrap();
    let reader = if at == 0 { 1 } else { 0 };
    f.nodes[at].freeze();
    let begun = Instant::now();
    let read = f.nodes[reader]
        .get("/events?type=turn_ended")
        .unwrap()
        .json();
    let took = begun.elapsed();
    eprintln!("fleet read with a frozen node: {took:?}");
    assert!(took < Duration::from_secs(3), "the read took {took:?}");
    let missing = read["coverage"]["missing"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{read}");
    assert_eq!(
        (&missing[0]["node"], &missing[0]["reason"]),
        (&frozen_id.as_str().into(), &"timeout".into())
    );
    assert_eq!(read["coverage"]["complete"], false);
    assert_eq!(read["events"].as_array().unwrap().len(), 2, "{read}");
    // Its seat goes stale once it misses its renewals: within a seat beat
    // (10 s) of its last renew, and well before its presence lapses.
    assert!(
        eventually(Duration::from_secs(12), || holders(&f.nodes[reader])[2].1
            == "stale"),
        "{:?}",
        holders(&f.nodes[reader])
    );
    let view = agents(&f.nodes[reader]);
    assert_eq!(
        view["agents"][2]["turns_in_flight"],
        Value::Null,
        "the frozen holder cannot say"
    );
    assert_eq!(ids(&view["turns_coverage"]["missing"]), set(&[&frozen_id]));

    // Killed before its lease lapses: still in presence, named as gone.
    f.nodes[at].signal(libc::SIGKILL);
    let _ = f.nodes[at].child.wait();
    let mut read = Value::Null;
    assert!(
        eventually(Duration::from_secs(5), || {
            read = f.nodes[reader]
                .get("/events?type=turn_ended")
                .unwrap()
                .json();
            read["coverage"]["missing"][0]["reason"] == "no_responders"
        }),
        "{read}"
    );
    assert_eq!(read["coverage"]["missing"][0]["node"], frozen_id.as_str());
}

#[test]
fn a_coordination_store_that_does_not_answer_is_unknown_never_no() {
    let f = start(&["solo"]);
    let node = &f.nodes[0];
    assert!(
        eventually(Duration::from_secs(30), || holders(node)
            .iter()
            .all(|(_, s, _)| s == "held")),
        "{:?}",
        holders(node)
    );
    let server = f._server.pid().expect("the nats-server runs") as i32;
    crewlet_testkit::process::stop(server);
    let begun = Instant::now();
    let view = agents(node);
    let took = begun.elapsed();
    let answered = node.get("/events?type=node_started").unwrap().json();
    let fleet = node.get("/fleet").unwrap();
    // SAFETY: signals a child process this test started.
    unsafe { libc::kill(server, libc::SIGCONT) };
    assert!(took < Duration::from_secs(4), "/agents took {took:?}");
    for a in view["agents"].as_array().unwrap() {
        assert_eq!(
            (&a["state"], &a["holder"]),
            (&"unknown".into(), &Value::Null),
            "{view}"
        );
        assert_eq!(
            (&a["turns_in_flight"], &a["mailbox"]),
            (&Value::Null, &Value::Null),
            "{view}"
        );
    }
    let errors = view["errors"].to_string();
    assert!(
        errors.contains("the seat leases") && errors.contains("the mailbox depths"),
        "{view}"
    );
    // History still answers this node's rows, and says the fleet is unknown.
    let cov = &answered["coverage"];
    assert_eq!(
        (&cov["membership"], &cov["complete"]),
        (&"unknown".into(), &false.into()),
        "{answered}"
    );
    assert_eq!(
        answered["events"].as_array().map(Vec::len),
        Some(1),
        "{answered}"
    );
    assert_eq!(fleet.status, 503, "{}", fleet.text());
    assert_eq!(fleet.json()["error"], "presence_unknown");
    // Back: every seat held again, nothing lost on the way.
    assert!(
        eventually(Duration::from_secs(20), || holders(node)
            .iter()
            .all(|(_, s, _)| s == "held")),
        "{:?}",
        holders(node)
    );
}
