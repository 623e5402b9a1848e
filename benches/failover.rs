//! Fleet figures on one 3-node NATS cluster on loopback (every stream and
//! bucket at three replicas), all in one run:
//!
//! - **Failover**: three nodes hold six seats; the holder of some is
//!   SIGKILLed and the time until the survivors hold all six (as a
//!   survivor's `/agents` says) is set against the lease TTL + one
//!   heartbeat, the design's bound. The killed node is restarted on its
//!   data dir and the seats spread again before the next trial.
//! - **Webhook ingest**: signed Slack deliveries (unique event ids) from
//!   `INGEST_CLIENTS` concurrent clients, round-robin over 1, 2 and 3
//!   ingress nodes (no node holds seats, so only ingest runs: verify,
//!   parse, claim, publish to R3, 202). Rounds interleave 1, 2, 3; each
//!   count is the best of its rounds, as a ratio to the 1-node figure.
//!
//!     cargo bench --bench failover
//!
//! `FAILOVER_TRIALS` (default 3; 0 skips the failover part), `INGEST_SECONDS` per round (default 5),
//! `INGEST_CLIENTS` (default 16), `INGEST_ROUNDS` (default 2). The load
//! generator runs on the same machine as the nodes and the cluster, so what
//! ingest gains per node is bounded by the cores they share.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crewlet_testkit::{Cluster, PluginsDir, free_port, http};

const SECRET: &str = "slack-signing-secret";
const SEATS: usize = 6;

struct Node {
    child: Child,
    addr: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A sandbox: the company (six seats, Slack) and the plugins it needs.
fn sandbox() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    PluginsDir::new(dir.path().join("plugins"))
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    let mut doc = String::from(
        "[org]\nname = \"Bench\"\n[roles.r]\nsystem_prompt = \"p\"\n\
         executor = [{ provider = \"scripted\", model = \"m\", options = { steps = [{ call = \"submit_work\", args = { outcome = \"delivered\", summary = \"ok\" } }] } }]\n\
         reviewer = { provider = \"scripted\", model = \"m\", options = { steps = [{ call = \"submit_review\", args = { verdict = \"done\" } }] } }\n\
         [integrations.slack]\nplugin = \"slack\"\nsecret = \"SLACK_SIGNING_SECRET\"\n[seats]\n",
    );
    for i in 0..SEATS {
        doc.push_str(&format!("s{i} = {{ role = \"r\" }}\n"));
    }
    std::fs::write(dir.path().join("company.toml"), doc).unwrap();
    dir
}

/// Node `id` of the sandbox `dir` on `cluster`, dialling member `i` first; ready.
fn start(dir: &Path, cluster: &Cluster, i: usize, id: &str, extra: &str) -> Node {
    let port = free_port();
    let mut urls = cluster.urls();
    urls.rotate_left(i);
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    let config = dir.join(format!("{id}.toml"));
    std::fs::write(
        &config,
        format!(
            "[api]\nport = {port}\n[node]\nid = \"{id}\"\n{extra}\n[stream]\nurl = [{}]\nreplicas = 3\n",
            urls.join(", ")
        ),
    )
    .unwrap();
    let data: PathBuf = dir.join(format!("data-{id}"));
    let child = Command::new(env!("CARGO_BIN_EXE_crewlet"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .arg("--company")
        .arg(dir.join("company.toml"))
        .arg("--plugins")
        .arg(dir.join("plugins"))
        .env("CREWLET_LOG", "error")
        .env("CREWLET_BOOTSTRAP_TOKEN", http::OPERATOR_TOKEN)
        .env("SLACK_SIGNING_SECRET", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let node = Node {
        child,
        addr: format!("127.0.0.1:{port}"),
    };
    let t = Instant::now();
    while !http::get(&node.addr, "/ready").is_ok_and(|r| r.status == 200) {
        assert!(t.elapsed() < Duration::from_secs(90), "{id} never ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    node
}

/// Seat → holder node, for the seats `node` sees held.
fn holders(node: &Node) -> BTreeMap<String, String> {
    let Ok(r) = http::get(&node.addr, "/agents") else {
        return BTreeMap::new();
    };
    r.json()["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["state"] == "held")
        .map(|a| {
            (
                a["handle"].as_str().unwrap_or("?").to_owned(),
                a["holder"]["node"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect()
}

/// CPU seconds (user + system) `pid` has used so far; 0 once it is gone.
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After the parenthesised name: utime and stime are fields 12 and 13.
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|t| t.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    // SAFETY: a plain query of a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 / hz as f64
}

/// CPU seconds used so far by each group of processes.
fn cpu_of(groups: &[Vec<u32>]) -> Vec<f64> {
    groups
        .iter()
        .map(|g| g.iter().map(|&p| cpu_secs(p)).sum())
        .collect()
}

fn wait_until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < within, "{what} not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    t.elapsed()
}

fn spread(reader: &Node, nodes: usize) -> bool {
    let h = holders(reader);
    h.len() == SEATS && h.values().collect::<BTreeSet<_>>().len() == nodes
}

/// Failover times (s) for a lease TTL and heartbeat, over `trials` kills.
fn failover(ttl: u64, heartbeat: u64, trials: usize) -> Vec<f64> {
    let cluster = Cluster::start();
    let dir = sandbox();
    let ids = ["fb-a", "fb-b", "fb-c"];
    let extra =
        format!("[coordination]\nlease_ttl_seconds = {ttl}\nheartbeat_seconds = {heartbeat}\n");
    let mut nodes: Vec<Node> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| start(dir.path(), &cluster, i, id, &extra))
        .collect();
    let mut times = Vec::new();
    for trial in 0..trials {
        let victim = 1 + trial % 2;
        wait_until(Duration::from_secs(60), "the seats spread", || {
            spread(&nodes[0], 3)
        });
        // SAFETY: our own child.
        unsafe { libc::kill(nodes[victim].child.id() as i32, libc::SIGKILL) };
        let killed = Instant::now();
        let _ = nodes[victim].child.wait();
        wait_until(
            Duration::from_secs(3 * ttl + 30),
            "the survivors' hold",
            || {
                let h = holders(&nodes[0]);
                h.len() == SEATS && h.values().all(|n| n != ids[victim])
            },
        );
        times.push(killed.elapsed().as_secs_f64());
        nodes[victim] = start(dir.path(), &cluster, victim, ids[victim], &extra);
    }
    times
}

/// Accepted deliveries per second with `clients` clients over `targets`
/// for `secs` seconds; `next` numbers the event ids across rounds.
fn ingest(targets: &[String], clients: usize, secs: u64, next: &Arc<AtomicU64>) -> (f64, u64, f64) {
    let until = Instant::now() + Duration::from_secs(secs);
    let refused = Arc::new(AtomicU64::new(0));
    let begun = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|c| {
            let targets = targets.to_vec();
            let next = next.clone();
            let refused = refused.clone();
            std::thread::spawn(move || {
                let mut accepted = 0u64;
                let mut k = c;
                while Instant::now() < until {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let body = serde_json::json!({
                        "type": "event_callback",
                        "event_id": format!("EvB{n}"),
                        "team_id": "T1",
                        "event": {"type": "app_mention", "user": "U1", "text": "<@s0> hi", "channel": "C1", "ts": format!("{n}.1")},
                    })
                    .to_string();
                    let (now, sig) =
                        crewlet_ingress::sign::slack_headers(SECRET.as_bytes(), body.as_bytes());
                    let r = http::post(
                        &targets[k % targets.len()],
                        &format!("/webhooks/slack/s{}", n % SEATS as u64),
                        &[
                            ("Content-Type", "application/json"),
                            ("X-Slack-Request-Timestamp", &now),
                            ("X-Slack-Signature", &sig),
                        ],
                        body.as_bytes(),
                    );
                    if r.is_ok_and(|r| r.status == 202) {
                        accepted += 1;
                    } else {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    k += 1;
                }
                accepted
            })
        })
        .collect();
    let accepted: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let wall = begun.elapsed().as_secs_f64();
    (
        accepted as f64 / wall,
        refused.load(Ordering::Relaxed),
        wall,
    )
}

fn main() {
    let trials = env_or("FAILOVER_TRIALS", 3) as usize;
    let secs = env_or("INGEST_SECONDS", 5);
    let clients = env_or("INGEST_CLIENTS", 16) as usize;
    let rounds = env_or("INGEST_ROUNDS", 2) as usize;

    let mut failovers = Vec::new();
    // The default TTL and its derived heartbeat, and a short pair.
    for (ttl, hb) in [(15, 5), (6, 2)].into_iter().filter(|_| trials > 0) {
        failovers.push((ttl, hb, failover(ttl, hb, trials)));
    }

    let cluster = Cluster::start();
    let dir = sandbox();
    let no_seats = "roles = [\"data\", \"ingress\", \"workers\"]";
    let nodes: Vec<Node> = (0..3)
        .map(|i| start(dir.path(), &cluster, i, &format!("ib-{i}"), no_seats))
        .collect();
    let apis: Vec<String> = nodes.iter().map(|n| n.addr.clone()).collect();
    let next = Arc::new(AtomicU64::new(0));
    // Warm every node's plugin pool and connections.
    ingest(&apis, clients, 1, &next);
    // CPU of the crewlet nodes, the cluster's servers and this process
    // (the load generator), per second of a round: what bounds the rate.
    let groups = vec![
        nodes.iter().map(|n| n.child.id()).collect::<Vec<_>>(),
        (0..3).filter_map(|i| cluster.member(i).pid()).collect(),
        vec![std::process::id()],
    ];
    let mut best: BTreeMap<usize, (f64, u64, Vec<f64>)> = BTreeMap::new();
    for _ in 0..rounds {
        for n in 1..=3 {
            let before = cpu_of(&groups);
            let (rate, refused, wall) = ingest(&apis[..n], clients, secs, &next);
            let used: Vec<f64> = cpu_of(&groups)
                .iter()
                .zip(&before)
                .map(|(a, b)| (a - b) / wall)
                .collect();
            let e = best.entry(n).or_insert((0.0, 0, Vec::new()));
            if rate > e.0 {
                *e = (rate, refused, used);
            }
        }
    }

    println!("failover after SIGKILL of a seat holder, 3 nodes, 6 seats, 3-node R3 cluster:");
    for (ttl, hb, times) in &failovers {
        let bound = (ttl + hb) as f64;
        let shown: Vec<String> = times.iter().map(|t| format!("{t:.2} s")).collect();
        let worst = times.iter().copied().fold(0.0, f64::max);
        let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
        println!(
            "  TTL {ttl:>2} s + heartbeat {hb} s = {bound:>4.0} s: {} — mean {:.2}x, worst {:.2}x the bound",
            shown.join(", "),
            mean / bound,
            worst / bound
        );
    }
    println!(
        "webhook ingest, {clients} clients, best of {rounds} x {secs} s rounds, signed Slack deliveries:"
    );
    let one = best.get(&1).map_or(1.0, |b| b.0);
    for (n, (rate, refused, used)) in &best {
        println!(
            "  {n} ingress node(s): {rate:8.1} accepted/s ({refused} not accepted) = {:.2}x one node; cores busy: crewlet {:.2}, nats-server {:.2}, load generator {:.2}",
            rate / one,
            used[0],
            used[1],
            used[2]
        );
    }
}
