//! The sandbox against hostile plugins, through the real binary: the
//! plugins of `plugins/testdata` loaded beside the real GitHub plugin, each
//! misbehaviour contained — answered typed, nothing published, nothing
//! secret repeated, quarantined after repeated faults — while the GitHub
//! route and the probes keep answering.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use crewlet_ingress::sign::github_signature;
use crewlet_testkit::http::{self, Response};
use crewlet_testkit::{NatsServer, PluginsDir};

const GH_SECRET: &str = "sandbox-github-secret";
const HOSTILE_SECRET: &str = "hostile-secret-5d1c0b7e";

struct World {
    _sb: Sandbox,
    _plugins: tempfile::TempDir,
    server: NatsServer,
    node: Node,
}

fn start() -> World {
    start_with(None)
}

/// A node with the hostile webhook's deadline at `deadline_ms` when given:
/// a test whose plugin does real work (20,000 deliveries, an 8 MiB one)
/// must not meet the 300 ms the loop tests want when the machine is busy.
fn start_with(deadline_ms: Option<u64>) -> World {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let plugins_tmp = tempfile::tempdir().unwrap();
    let plugins = PluginsDir::new(plugins_tmp.path());
    let hostile = "plugins/testdata/hostile-webhook/plugin.toml";
    match deadline_ms {
        Some(ms) => plugins.add_with_deadline("hostile", hostile, ms),
        None => plugins.add("hostile", hostile),
    };
    plugins
        .add("github", "plugins/webhooks/github/plugin.toml")
        // The rest of what the example company names: a node refuses a
        // company its plugins cannot run.
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml")
        .add("notebook", "plugins/modules/notebook/plugin.toml")
        .add("chat", "plugins/modules/chat/plugin.toml")
        .add("chat-webhook", "plugins/webhooks/chat/plugin.toml")
        .add("stuck", "plugins/testdata/stuck-module/plugin.toml")
        .add("slow", "plugins/testdata/slow-watcher/plugin.toml");
    let node = hostile_route_node(
        &sb,
        "sandbox-1",
        &server.url(),
        plugins.path(),
        (GH_SECRET, HOSTILE_SECRET),
    );
    World {
        _sb: sb,
        _plugins: plugins_tmp,
        server,
        node,
    }
}

fn github(w: &World, delivery: &str) -> Response {
    let body = br#"{"action":"created","comment":{"body":"@ada hi"},"issue":{"number":1},"repository":{"full_name":"o/r"}}"#;
    let sig = github_signature(GH_SECRET.as_bytes(), body);
    http::post(
        &w.node.api,
        "/webhooks/github",
        &[
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", delivery),
            ("X-Hub-Signature-256", &sig),
            ("Content-Type", "application/json"),
        ],
        body,
    )
    .unwrap()
}

fn hostile(w: &World, what: &str) -> Response {
    http::post(
        &w.node.api,
        "/webhooks/hostile",
        &[("Content-Type", "text/plain")],
        what.as_bytes(),
    )
    .unwrap()
}

/// Messages ever stored on the notifications stream (its last sequence:
/// notify-inbound consumes and removes them).
fn published(w: &World) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(w.server.url()).await.unwrap());
        let mut stream = js
            .get_stream(crewlet_bus::NOTIFICATIONS_STREAM)
            .await
            .unwrap();
        stream.info().await.unwrap().state.last_sequence
    })
}

fn plugin(w: &World, name: &str) -> serde_json::Value {
    let view = w.node.get("/plugins").unwrap().json();
    view["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} in {view}"))
}

#[test]
fn delivery_ids_and_parse_output_are_bounded_before_anything_is_claimed_or_published() {
    let w = start_with(Some(5_000));
    assert_eq!(github(&w, "d-good-1").status, 202);
    let before = published(&w);

    // An id past 256 bytes (GitHub does not sign it) is refused 400, and
    // the node's one connection survives: the next delivery is accepted.
    let long = "x".repeat(5000);
    let r = github(&w, &long);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("at most 256"), "{}", r.text());
    for bad in ["", "a b", "a;b"] {
        assert_eq!(github(&w, bad).status, 400, "id {bad:?}");
    }
    assert_eq!(github(&w, "d-good-2").status, 202);

    // What parse returns: 20,000 deliveries (400), one of 8 MiB (413),
    // texts aliasing one buffer past the transfer bound (413, a fault), an
    // empty id (400) — none published.
    let many = hostile(&w, "many");
    assert_eq!(many.status, 400, "{}", many.text());
    assert!(many.text().contains("20000 deliveries"), "{}", many.text());
    assert_eq!(hostile(&w, "huge").status, 413);
    let alias = hostile(&w, "alias");
    assert_eq!(alias.status, 413, "{}", alias.text());
    assert!(alias.text().contains("transfer bound"), "{}", alias.text());
    assert_eq!(
        plugin(&w, "hostile-webhook")["last_fault_kind"],
        "oversized"
    );
    assert_eq!(hostile(&w, "empty-id").status, 400);
    assert_eq!(hostile(&w, "one").status, 202);
    assert_eq!(published(&w), before + 2, "only the two good deliveries");
}

#[test]
fn nothing_a_plugin_says_repeats_a_secret_it_was_handed() {
    let w = start_with(Some(5_000));
    let refused = hostile(&w, "verify-secret");
    assert_eq!(refused.status, 401);
    let text = refused.text();
    assert!(
        text.contains("not verified: the header [redacted]"),
        "{text}"
    );
    let reply = hostile(&w, "reply-secret");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.text(), "raw=[redacted] hex=[redacted]");
    let panicked = hostile(&w, "panic-secret");
    assert_eq!(panicked.status, 500);
    let fault = plugin(&w, "hostile-webhook")["last_fault"].to_string();
    assert!(fault.contains("leaking [redacted]"), "{fault}");
    let hex: String = HOSTILE_SECRET.bytes().map(|b| format!("{b:02x}")).collect();
    let log = w.node.log_text();
    for said in [&text, &reply.text(), &panicked.text(), &fault, &log] {
        assert!(!said.contains(HOSTILE_SECRET), "{said}");
        assert!(!said.contains(&hex), "{said}");
    }
}

#[test]
fn a_faulting_plugin_is_quarantined_while_the_rest_of_the_node_answers() {
    let w = start();
    // Verify passes and parse faults: every fault counts.
    for _ in 0..5 {
        assert_eq!(hostile(&w, "loop").status, 500);
        let started = Instant::now();
        assert_eq!(w.node.get("/health").unwrap().status, 200);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
    let view = plugin(&w, "hostile-webhook");
    assert_eq!(view["breaker"]["state"], "open", "{view}");
    assert_eq!(view["last_fault_kind"], "timeout", "{view}");
    let calls = view["calls"].clone();

    // Open: answered 503 + Retry-After at once, the plugin not run.
    let started = Instant::now();
    let r = hostile(&w, "loop");
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.status, 503, "{}", r.text());
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=5).contains(&retry), "{retry}");
    let view = plugin(&w, "hostile-webhook");
    assert_eq!(view["calls"], calls, "not run while open");
    assert!(view["refused"].as_u64().unwrap() >= 1);
    assert_eq!(github(&w, "q-1").status, 202);
    assert!(w.node.log_text().contains("plugin breaker open"));
}

#[test]
fn a_stuck_module_is_failed_at_its_deadline_and_the_node_is_ready_without_it() {
    let w = start();
    // The node was ready (start waited for /ready) while `init` spins.
    let stuck = plugin(&w, "stuck-module");
    assert_ne!(stuck["state"], "running", "{stuck}");
    assert!(eventually(Duration::from_secs(10), || plugin(
        &w,
        "stuck-module"
    )["state"]
        == "failed"));
    let stuck = plugin(&w, "stuck-module");
    assert!(
        stuck["error"].as_str().unwrap().contains("deadline"),
        "{stuck}"
    );
    assert_eq!(w.node.get("/ready").unwrap().status, 200);
    assert_eq!(plugin(&w, "slow-watcher")["state"], "running");
}

#[test]
fn a_slow_watch_consumer_holds_its_backlog_on_the_server_not_in_the_node() {
    let w = start();
    assert!(eventually(Duration::from_secs(10), || plugin(
        &w,
        "slow-watcher"
    )["state"]
        == "running"));
    let rss_before = rss_kib(w.node.pid());
    // 48 MiB of changes into the module's bucket, far faster than its
    // eight watches consume them.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(w.server.url()).await.unwrap());
        let kv = js.get_key_value("mod_slow-watcher_own").await.unwrap();
        let value = bytes::Bytes::from(vec![b'v'; 200 * 1024]);
        for i in 0..240 {
            kv.put(format!("k{i}"), value.clone()).await.unwrap();
        }
    });
    std::thread::sleep(Duration::from_secs(3));
    let rss_after = rss_kib(w.node.pid());
    // What the node may hold live: the module's queue (64 steps of 200 KiB)
    // and each watch's pull window (one and a half of 2 MiB): about 40 MiB.
    // RSS shows more than the live bytes: glibc keeps each malloc arena at
    // its peak, and the more threads allocate the more arenas hold one (a
    // fresh-clone CI run beside the other tests grew 84 MiB, then 126 MiB
    // once the node ran its estate, custody and chat tasks too), so the
    // node runs with two arenas (`hostile_route_node`): 36-45 MiB idle,
    // 77 MiB with both cores busy. The bound sits
    // between that and what it guards against: a push watch lets the
    // broker run 32 MiB ahead of each of the eight (a CI run saw 168 MiB);
    // an unbounded one, 48 MiB each. A watch re-opened mid-burst lists the
    // whole bucket (48 MiB) once: the log lines below say whether one was.
    let grew = rss_after.saturating_sub(rss_before);
    assert!(
        grew < 120 * 1024,
        "RSS grew by {grew} KiB, from {rss_before} KiB to {rss_after} KiB; the node's watch lines:\n{}",
        w.node
            .log_text()
            .lines()
            .filter(|l| l.contains("state watch"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(w.node.get("/health").unwrap().status, 200);
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}
