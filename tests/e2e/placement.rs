//! Placement through the real binary, two nodes on one nats-server:
//! - a placement group pinned to node labels runs only on the node whose
//!   labels match; an undeclared group and the default group spread over
//!   both; a group pinned to labels no node carries stays `unplaced`, and
//!   `/agents` says why;
//! - a rolling restart of one node lands its seats back on it: its peer
//!   took them while it was away and gives back first the seats whose
//!   previous holder (the epochs bucket) is live again, not the ones it
//!   held all along — which the hash order alone would have given back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::common::{Node, NodeBuilder, Sandbox, eventually};
use crewlet_company::Handle;
use crewlet_testkit::{NatsServer, PluginsDir, free_port};
use serde_json::Value;

const ROLE: &str = r#"
[org]
name = "Acme"
[roles.ops]
system_prompt = "You keep things running."
executor = [{ provider = "scripted", model = "demo", options = { steps = [
  { call = "submit_work", args = { outcome = "delivered", summary = "done" } },
] } }]
reviewer = { provider = "scripted", model = "demo-review", options = { steps = [
  { call = "submit_review", args = { verdict = "done" } },
] } }
"#;

/// A node that can be stopped and started again on the same files.
struct Member {
    sb: Sandbox,
    port: u16,
    cfg: PathBuf,
    node: Option<Node>,
}

impl Member {
    fn new(server: &NatsServer, id: &str, labels: &str, company: &str) -> Member {
        let sb = Sandbox::new();
        std::fs::write(sb.path("company.toml"), company).unwrap();
        PluginsDir::new(sb.path("plugins"))
            .add("scripted", "plugins/providers/scripted/plugin.toml");
        let port = free_port();
        let cfg = sb.config(
            port,
            &format!(
                "[node]\nid = \"{id}\"\nroles = [\"ingress\", \"seats\"]\nlabels = {labels}\n[stream]\nurl = \"{}\"\n[coordination]\nlease_ttl_seconds = 6\nheartbeat_seconds = 1\n",
                server.url()
            ),
        );
        let mut m = Member {
            sb,
            port,
            cfg,
            node: None,
        };
        m.start();
        m
    }

    fn start(&mut self) {
        let mut node = NodeBuilder::new(&self.sb, self.port)
            .arg("--config")
            .arg(&self.cfg)
            .arg("--data-dir")
            .arg(self.sb.data_dir())
            .arg("--company")
            .arg(self.sb.path("company.toml"))
            .arg("--plugins")
            .arg(self.sb.path("plugins"))
            .spawn();
        node.wait_ready(Duration::from_secs(60));
        self.node = Some(node);
    }

    /// SIGTERM: the node drains (presence first, then its seats) and exits.
    fn stop(&mut self) {
        let mut node = self.node.take().expect("running");
        node.signal(libc::SIGTERM);
        let status = node.wait_exit(Duration::from_secs(60));
        assert!(
            status.success(),
            "drain exited {status}: {}",
            node.log_text()
        );
    }

    fn node(&self) -> &Node {
        self.node.as_ref().expect("running")
    }
}

fn agents(node: &Node) -> Value {
    let r = node.get("/agents").expect("GET /agents");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Seat → (state, holder node or `-`).
fn holders(node: &Node) -> BTreeMap<String, (String, String)> {
    agents(node)["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["handle"].as_str().unwrap().to_owned(),
                (
                    a["state"].as_str().unwrap().to_owned(),
                    a["holder"]["node"].as_str().unwrap_or("-").to_owned(),
                ),
            )
        })
        .collect()
}

fn held_by(seen: &BTreeMap<String, (String, String)>, node: &str) -> BTreeSet<String> {
    seen.iter()
        .filter(|(_, (state, holder))| state == "held" && holder == node)
        .map(|(h, _)| h.clone())
        .collect()
}

#[test]
fn a_pinned_group_runs_only_where_the_labels_match_and_an_unmatched_one_says_why() {
    let server = NatsServer::start();
    let company = format!(
        "{ROLE}
[placement.groups.gpu]
labels = {{ accel = \"gpu\" }}
[placement.groups.tpu]
labels = {{ accel = \"tpu\" }}
[seats]
g1 = {{ role = \"ops\", group = \"gpu\" }}
g2 = {{ role = \"ops\", group = \"gpu\" }}
g3 = {{ role = \"ops\", group = \"gpu\" }}
b1 = {{ role = \"ops\", group = \"batch\" }}
b2 = {{ role = \"ops\", group = \"batch\" }}
d1 = {{ role = \"ops\" }}
d2 = {{ role = \"ops\" }}
t1 = {{ role = \"ops\", group = \"tpu\" }}
"
    );
    let cpu = Member::new(&server, "pin-cpu", "{ accel = \"cpu\" }", &company);
    let gpu = Member::new(
        &server,
        "pin-gpu",
        "{ accel = \"gpu\", zone = \"eu\" }",
        &company,
    );
    let mut seen = BTreeMap::new();
    let settled = |seen: &BTreeMap<String, (String, String)>| {
        held_by(seen, "pin-gpu").is_superset(&["g1", "g2", "g3"].map(String::from).into())
            && held_by(seen, "pin-cpu").len() == 2
            && held_by(seen, "pin-gpu").len() == 5
    };
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = holders(cpu.node());
            settled(&seen)
        }),
        "the gpu seats never all landed on pin-gpu with the rest spread: {seen:?}"
    );
    // The free-form group and the default group: one of each on each node.
    for pair in [["b1", "b2"], ["d1", "d2"]] {
        let nodes: BTreeSet<&str> = pair.iter().map(|h| seen[*h].1.as_str()).collect();
        assert_eq!(nodes.len(), 2, "{pair:?} not spread: {seen:?}");
    }
    // Pinned to labels no node carries: unplaced, and the answer says why.
    let view = agents(gpu.node());
    let t1 = view["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["handle"] == "t1")
        .unwrap()
        .clone();
    assert_eq!(t1["state"], "unplaced", "{view}");
    let why = t1["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("\"tpu\"")
            && why.contains("accel=tpu")
            && why.contains("pin-cpu {accel=cpu}")
            && why.contains("pin-gpu {accel=gpu, zone=eu}"),
        "{view}"
    );
    let g1 = view["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["handle"] == "g1")
        .unwrap();
    assert!(g1["reason"].is_null(), "{view}");
    // Still so a few heartbeats later: the cpu node never takes a gpu seat.
    std::thread::sleep(Duration::from_secs(3));
    let later = holders(gpu.node());
    assert_eq!(
        held_by(&later, "pin-gpu"),
        held_by(&seen, "pin-gpu"),
        "{later:?}"
    );
    assert_eq!(later["t1"].0, "unplaced");
}

#[test]
fn a_rolling_restart_lands_the_restarted_nodes_seats_back_on_it() {
    let server = NatsServer::start();
    let names = ["s1", "s2", "s3", "s4", "s5", "s6"];
    let seats: String = names
        .iter()
        .map(|s| format!("{s} = {{ role = \"ops\" }}\n"))
        .collect();
    let company = format!("{ROLE}\n[seats]\n{seats}");
    let all = || {
        names
            .iter()
            .map(|s| (*s).to_owned())
            .collect::<BTreeSet<_>>()
    };
    // b first: it holds all six; a joins and b gives a three of them.
    let mut b = Member::new(&server, "warm-bravo", "{}", &company);
    assert!(
        eventually(Duration::from_secs(60), || held_by(
            &holders(b.node()),
            "warm-bravo"
        ) == all()),
        "warm-bravo never held every seat: {:?}",
        holders(b.node())
    );
    let a = Member::new(&server, "warm-alpha", "{}", &company);
    let mut seen = BTreeMap::new();
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = holders(a.node());
            held_by(&seen, "warm-alpha").len() == 3 && held_by(&seen, "warm-bravo").len() == 3
        }),
        "the seats never split three and three: {seen:?}"
    );
    let b_kept = held_by(&seen, "warm-bravo");
    // The premise: by its hash order alone, a would give back other seats
    // than b's own when b returns — so only the previous holder brings them
    // back.
    let mut by_rank: Vec<&str> = names.to_vec();
    by_rank
        .sort_by_key(|h| crewlet_seats::placement::rank("warm-alpha", &Handle::parse(h).unwrap()));
    let a_least: BTreeSet<String> = by_rank[3..].iter().map(|s| (*s).to_owned()).collect();
    assert_ne!(
        a_least, b_kept,
        "pick other seat names: a's hash order alone would give b its seats back"
    );

    // Restart b: a takes all six while b is away.
    b.stop();
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = holders(a.node());
            held_by(&seen, "warm-alpha") == all()
        }),
        "warm-alpha never took b's seats: {seen:?}"
    );
    b.start();
    assert!(
        eventually(Duration::from_secs(60), || {
            seen = holders(a.node());
            held_by(&seen, "warm-alpha").len() == 3 && held_by(&seen, "warm-bravo").len() == 3
        }),
        "the seats never split again after b returned: {seen:?}"
    );
    assert_eq!(
        held_by(&seen, "warm-bravo"),
        b_kept,
        "b's seats did not land back on it; a kept them and gave up its own: {seen:?}"
    );
}
