//! A fleet of three nodes on a real 3-node NATS cluster (every stream and
//! bucket at three replicas), six seats of the scripted company answering
//! Slack mentions through their chat servers: the set-up the failover and
//! route-cut tests share, and how they read who holds which seat and who
//! answered what.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crewlet_testkit::{Cluster, PluginsDir};
use serde_json::Value;

use super::company::{SLACK_SECRET, scripted_company};
use super::{Node, Sandbox, eventually, post_slack_mention};

/// The seats, all of the role `support`.
pub const SEATS: [&str; 6] = ["ada", "bob", "cyd", "dee", "eve", "fay"];
/// Nodes in the fleet, one per cluster member.
pub const NODES: usize = 3;

/// Dropped in field order: the nodes stop while their cluster still runs.
pub struct Fleet {
    pub nodes: Vec<Node>,
    pub cluster: Cluster,
    pub sb: Sandbox,
    ids: [&'static str; NODES],
    lease_ttl: Duration,
    heartbeat: Duration,
}

impl Fleet {
    /// Starts the cluster and the nodes `ids` (each ready) with seat leases
    /// of `lease_ttl` renewed every `heartbeat`, and waits until the seats
    /// are spread two to a node; answers the fleet and who holds which seat.
    pub fn start(
        ids: [&'static str; NODES],
        lease_ttl: Duration,
        heartbeat: Duration,
    ) -> (Fleet, BTreeMap<String, String>) {
        let t0 = Instant::now();
        let sb = Sandbox::new();
        PluginsDir::new(sb.path("plugins"))
            .add("slack", "plugins/webhooks/slack/plugin.toml")
            .add("scripted", "plugins/providers/scripted/plugin.toml");
        let seats: String = SEATS
            .iter()
            .map(|s| format!("{s} = {{ role = \"support\" }}\n"))
            .collect();
        let doc = scripted_company(&seats, &sb.path("chat.jsonl"));
        std::fs::write(sb.path("company.toml"), doc).unwrap();
        let mut f = Fleet {
            nodes: Vec::new(),
            cluster: Cluster::start(),
            sb,
            ids,
            lease_ttl,
            heartbeat,
        };
        f.nodes = (0..NODES).map(|i| f.spawn(i)).collect();
        for n in &mut f.nodes {
            n.wait_ready(Duration::from_secs(60));
        }
        let mut seen = BTreeMap::new();
        assert!(
            eventually(Duration::from_secs(30), || {
                seen = holders(&f.nodes[0]).unwrap_or_default();
                balanced(&seen)
            }),
            "the seats never spread two to a node: {seen:?}"
        );
        eprintln!("seats spread after {:?}: {seen:?}", t0.elapsed());
        (f, seen)
    }

    /// Node `i` (again, on its data dir), dialling cluster member `i` first.
    pub fn spawn(&self, i: usize) -> Node {
        let mut urls = self.cluster.urls();
        urls.rotate_left(i);
        self.sb
            .fleet_node(
                self.ids[i],
                &urls,
                &format!(
                    "replicas = 3\n[coordination]\nlease_ttl_seconds = {}\nheartbeat_seconds = {}\n",
                    self.lease_ttl.as_secs(),
                    self.heartbeat.as_secs()
                ),
            )
            .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
            .spawn()
    }

    /// The chat server's log: every post any seat made.
    pub fn chat_log(&self) -> PathBuf {
        self.sb.path("chat.jsonl")
    }

    /// The ingress nodes' API addresses.
    pub fn apis(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.api.clone()).collect()
    }

    /// Waits until every node is [`quiet`]; `reader`'s `/agents` otherwise.
    pub fn wait_quiet(&self, reader: &Node) {
        assert!(
            eventually(Duration::from_secs(30), || self.nodes.iter().all(quiet)),
            "the fleet never went quiet: {}",
            reader.get("/agents").map(|r| r.text()).unwrap_or_default()
        );
    }
}

/// Sends one signed `app_mention` of `seat` in `thread`; the status, or
/// `None` when the node did not answer.
pub fn mention(api: &str, seat: &str, event_id: &str, thread: &str) -> Option<u16> {
    let text = format!("<@{seat}> ping");
    post_slack_mention(api, SLACK_SECRET, seat, event_id, "C7", thread, &text)
        .ok()
        .map(|r| r.status)
}

/// Posts in the chat log: thread → the authors of its posts.
pub fn posts(log: &Path) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let p: Value = serde_json::from_str(line).expect("a post is JSON");
        by.entry(p["thread"].as_str().unwrap_or("").to_owned())
            .or_default()
            .push(p["as"].as_str().unwrap_or("?").to_owned());
    }
    by
}

/// Asserts that each of `accepted` (thread, seat) was answered exactly
/// once, by the seat it named, and nothing was posted anywhere else.
pub fn assert_each_answered_once<'a>(
    log: &Path,
    accepted: impl Iterator<Item = (&'a str, &'a str)>,
) {
    let accepted: Vec<(&str, &str)> = accepted.collect();
    let by = posts(log);
    let wrong: Vec<(&str, &Vec<String>)> = accepted
        .iter()
        .filter_map(|(thread, seat)| {
            let authors = &by[*thread];
            (authors != &vec![(*seat).to_owned()]).then_some((*thread, authors))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "not answered exactly once by the seat named: {wrong:?}"
    );
    assert_eq!(
        by.len(),
        accepted.len(),
        "posts in threads nobody mentioned"
    );
}

/// Seat → holder node for the seats `node` sees held; `None` while its
/// `/agents` does not answer.
pub fn holders(node: &Node) -> Option<BTreeMap<String, String>> {
    let r = node.get("/agents").filter(|r| r.status == 200)?;
    Some(
        r.json()["agents"]
            .as_array()?
            .iter()
            .filter(|a| a["state"] == "held")
            .map(|a| {
                (
                    a["handle"].as_str().unwrap_or("?").to_owned(),
                    a["holder"]["node"].as_str().unwrap_or("-").to_owned(),
                )
            })
            .collect(),
    )
}

/// Every seat held, each node holding its fair share: placement gives
/// each live seat node `ceil(seats / nodes)` per group, two here.
pub fn balanced(held: &BTreeMap<String, String>) -> bool {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    for n in held.values() {
        *per.entry(n.as_str()).or_default() += 1;
    }
    held.len() == SEATS.len()
        && per.len() == NODES
        && per.values().all(|&n| n == SEATS.len() / NODES)
}

/// Every seat held, no turn in flight and every mailbox empty and settled.
pub fn quiet(node: &Node) -> bool {
    let Some(r) = node.get("/agents").filter(|r| r.status == 200) else {
        return false;
    };
    let v = r.json();
    let agents = v["agents"].as_array().cloned().unwrap_or_default();
    agents.len() == SEATS.len()
        && agents.iter().all(|a| {
            a["state"] == "held"
                && a["turns_in_flight"] == 0
                && a["mailbox"]["pending"] == 0
                && a["mailbox"]["in_work"] == 0
        })
}
