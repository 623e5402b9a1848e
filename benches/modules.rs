//! Modules on the bus, measured through the release binary on one
//! nats-server, each figure beside its baseline in the same run:
//!
//! - **event → handler**: a `turn_ended` row published on the events
//!   stream until the subscribed module (`plugins/testdata/tool-module`,
//!   `once`) has handled it — seen as its write of the event into its
//!   bucket `seen`, watched from here — against a plain NATS subscriber on
//!   the same subject receiving the same publish. The module's figure
//!   includes its state write and the watch's delivery of it.
//! - **a healthy module beside one that traps on every event**: the
//!   `notebook` module's handling of the same rows (its write into
//!   `worked`, watched), first while `tool-module` handles them too, then
//!   while `tool-module` traps on every one (`payload.trap`): the healthy
//!   module's p50/p99 in the second phase against the first.
//! - **tool call from a turn**: `MODULES_TURNS` scripted turns, one after
//!   another, each calling the module tool `tool-module__echo` and the MCP
//!   stdio tool `chat__read_thread` (a real `crewlet mcp chat` child)
//!   alternately, `MODULES_CALLS` times each; the
//!   figures are the turn engine's own timing of each call (`tool_call`
//!   events, `us`). Goal: a module tool costs less than a tenth of an MCP
//!   stdio call.
//!
//! `cargo bench --bench modules` (`MODULES_EVENTS`, default 200;
//! `MODULES_CALLS`, default 40, at most 49; `MODULES_TURNS`, default 5).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crewlet_testkit::{NatsServer, PluginsDir, free_port, http};
use futures::StreamExt;
use serde_json::{Value, json};

const SLACK_SECRET: &str = "bench-slack-secret";

struct Node {
    child: Child,
    addr: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn company(calls: usize, chat_log: &Path) -> String {
    let mut steps = String::new();
    for i in 0..calls {
        steps.push_str(&format!(
            "  {{ call = \"tool-module__echo\", args = {{ text = \"call {i}\" }} }},\n  {{ call = \"chat__read_thread\", args = {{ channel = \"C1\", thread = \"1.1\" }} }},\n"
        ));
    }
    format!(
        r#"
[org]
name = "Bench"
[roles.support]
system_prompt = "bench"
modules = ["tool-module"]
max_tool_rounds = 100
executor = [{{ provider = "scripted", model = "bench", options = {{ steps = [
{steps}  {{ call = "submit_work", args = {{ outcome = "delivered", summary = "bench" }} }},
] }} }}]
reviewer = {{ provider = "scripted", model = "bench-review", options = {{ steps = [
  {{ call = "submit_review", args = {{ verdict = "done" }} }},
] }} }}
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {log:?} }}
[seats]
ada = {{ role = "support" }}
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#,
        log = chat_log.display().to_string()
    )
}

fn start(server: &NatsServer, dir: &Path, calls: usize) -> Node {
    let port = free_port();
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[api]\nport = {port}\n[stream]\nurl = \"{}\"\n",
            server.url()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("company.toml"),
        company(calls, &dir.join("chat.jsonl")),
    )
    .unwrap();
    let plugins = PluginsDir::new(dir.join("plugins"));
    plugins
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml")
        .add("tool-module", "plugins/testdata/tool-module/plugin.toml")
        .add("notebook", "plugins/modules/notebook/plugin.toml");
    let child = Command::new(env!("CARGO_BIN_EXE_crewlet"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--company")
        .arg(dir.join("company.toml"))
        .arg("--plugins")
        .arg(plugins.path())
        .env("CREWLET_LOG", "error")
        .env("CREWLET_BOOTSTRAP_TOKEN", http::OPERATOR_TOKEN)
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let node = Node {
        child,
        addr: format!("127.0.0.1:{port}"),
    };
    let started = Instant::now();
    while !http::get(&node.addr, "/ready").is_ok_and(|r| r.status == 200) {
        assert!(started.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    node
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn line(what: &str, mut lat: Vec<Duration>) -> (Duration, Duration) {
    lat.sort();
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    println!(
        "{what:<58} n={:>4} p50 {:>8.3} ms p99 {:>8.3} ms",
        lat.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    (p50, p99)
}

/// Waits until `module`'s durable consumer of `turn_ended` exists (the
/// first event goes only once it does).
async fn subscribed(js: &async_nats::jetstream::Context, module: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let stream = js.get_stream(crewlet_bus::EVENTS_STREAM).await.unwrap();
    while stream
        .consumer_info(crewlet_bus::module_durable(module, "turn_ended"))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "{module} never subscribed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A synthetic `turn_ended` row of seat `bench`.
fn row(turn: &str, i: usize, trap: bool) -> Value {
    json!({
        "event_id": turn, "type": "turn_ended", "at_ms": 0,
        "node_id": "bench", "trace_id": null, "seat": "bench", "conversation": null,
        "payload": {"bench": i, "turn_id": turn, "outcome": "delivered", "trap": trap}, "parties": [],
    })
}

/// Waits on `watch` for a value `matches` accepts.
async fn until(watch: &mut async_nats::jetstream::kv::Watch, matches: impl Fn(&Value) -> bool) {
    loop {
        let entry = watch.next().await.unwrap().unwrap();
        let v: Value = serde_json::from_slice(&entry.value).unwrap_or(Value::Null);
        if matches(&v) {
            return;
        }
    }
}

/// Publishes `n` synthetic `turn_ended` rows, one at a time, and times
/// each until a raw subscriber received it and until each module wrote
/// it; then `n` more that `tool-module` traps on, timing `notebook`.
async fn events(server: &NatsServer, n: usize) {
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    let subject = crewlet_bus::event_subject("turn_ended");
    let mut raw = client.subscribe(subject.clone()).await.unwrap();
    let bucket = |name: &'static str| {
        let js = js.clone();
        async move { js.get_key_value(name).await.expect("the module's bucket") }
    };
    let mut seen = bucket("mod_tool-module_seen")
        .await
        .watch("last")
        .await
        .unwrap();
    let mut worked = bucket("mod_notebook_worked")
        .await
        .watch("bench")
        .await
        .unwrap();
    subscribed(&js, "tool-module").await;
    subscribed(&js, "notebook").await;
    let publish = |row: Value| {
        let (js, subject) = (js.clone(), subject.clone());
        async move {
            js.publish(subject, row.to_string().into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    let (mut module, mut plain, mut healthy, mut beside_trap) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let turn = format!("bench-{i}");
        let t0 = Instant::now();
        publish(row(&turn, i, false)).await;
        let got = raw.next().await.unwrap();
        plain.push(t0.elapsed());
        assert_eq!(
            serde_json::from_slice::<Value>(&got.payload).unwrap()["payload"]["bench"],
            i
        );
        let (mut module_at, mut notebook_at) = (None, None);
        let (mut m, mut w) = (
            Box::pin(until(&mut seen, |v| v["payload"]["payload"]["bench"] == i)),
            Box::pin(until(&mut worked, |v| v["turn_id"] == turn.as_str())),
        );
        while module_at.is_none() || notebook_at.is_none() {
            tokio::select! {
                _ = &mut m, if module_at.is_none() => module_at = Some(t0.elapsed()),
                _ = &mut w, if notebook_at.is_none() => notebook_at = Some(t0.elapsed()),
            }
        }
        module.push(module_at.unwrap());
        healthy.push(notebook_at.unwrap());
    }
    for i in 0..n {
        let turn = format!("bench-trap-{i}");
        let t0 = Instant::now();
        publish(row(&turn, i, true)).await;
        until(&mut worked, |v| v["turn_id"] == turn.as_str()).await;
        beside_trap.push(t0.elapsed());
    }
    println!("-- event published -> handled, {n} events");
    let (m50, m99) = line("module handled it (its state write, watched)", module);
    let (p50, p99) = line("baseline: a plain NATS subscriber received it", plain);
    println!(
        "module / baseline: p50 {:.1}x, p99 {:.1}x",
        m50.as_secs_f64() / p50.as_secs_f64(),
        m99.as_secs_f64() / p99.as_secs_f64()
    );
    println!("-- a healthy module (notebook), {n} events each");
    let (h50, h99) = line("baseline: beside a healthy tool-module", healthy);
    let (t50, t99) = line("beside tool-module trapping on every event", beside_trap);
    println!(
        "beside a trapping module / beside a healthy one: p50 {:.2}x, p99 {:.2}x",
        t50.as_secs_f64() / h50.as_secs_f64(),
        t99.as_secs_f64() / h99.as_secs_f64()
    );
}

/// Wakes ada with mention `n` (its own event id) and waits until `n + 1`
/// turns have ended.
fn one_turn(node: &Node, n: usize) {
    let body = json!({
        "type": "event_callback", "event_id": format!("EvBench{n}"), "team_id": "T1",
        "event": {"type": "app_mention", "user": "U1", "text": "<@ada> bench", "channel": "C1", "ts": format!("1.{n}")},
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(SLACK_SECRET.as_bytes(), body.as_bytes());
    let r = http::post(
        &node.addr,
        "/webhooks/slack/ada",
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &now),
            ("X-Slack-Signature", &sig),
        ],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    let started = Instant::now();
    loop {
        let ended = http::get(&node.addr, "/events?type=turn_ended&limit=100")
            .unwrap()
            .json();
        if ended["events"].as_array().is_some_and(|a| a.len() > n) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "turn {n} never ended"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `turns` turns' tool calls, timed by the turn engine, by tool.
fn tool_calls(node: &Node, calls: usize, turns: usize) {
    // Read after each turn: a query answers at most 1,000 rows.
    let mut seen = std::collections::BTreeMap::new();
    for n in 0..turns {
        one_turn(node, n);
        let page = http::get(&node.addr, "/events?type=tool_call&limit=1000")
            .unwrap()
            .json();
        for e in page["events"].as_array().unwrap() {
            seen.insert(e["event_id"].as_str().unwrap().to_string(), e.clone());
        }
    }
    let events = Value::Array(seen.into_values().collect());
    let of = |prefix: &str| -> Vec<Duration> {
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| {
                e["payload"]["tool"]
                    .as_str()
                    .is_some_and(|t| t.starts_with(prefix))
            })
            .filter(|e| e["payload"]["ok"] == true)
            .map(|e| Duration::from_micros(e["payload"]["us"].as_u64().expect("`us` on tool_call")))
            .collect()
    };
    let (module, mcp) = (of("tool-module__"), of("chat__"));
    let each = calls * turns;
    assert_eq!((module.len(), mcp.len()), (each, each), "{events}");
    println!("-- tool calls from {turns} turns, {each} of each, timed by the turn engine");
    let (m50, m99) = line("module tool (tool-module__echo)", module);
    let (c50, c99) = line("baseline: MCP stdio tool (chat__read_thread)", mcp);
    println!(
        "module / MCP stdio: p50 {:.3}x, p99 {:.3}x (goal < 0.1)",
        m50.as_secs_f64() / c50.as_secs_f64(),
        m99.as_secs_f64() / c99.as_secs_f64()
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("MODULES_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let calls: usize = std::env::var("MODULES_CALLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .min(49);
    let turns: usize = std::env::var("MODULES_TURNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let server = NatsServer::start();
    let tmp = tempfile::tempdir().unwrap();
    let node = start(&server, tmp.path(), calls);
    tool_calls(&node, calls, turns);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(events(&server, n));
    drop(node);
}
