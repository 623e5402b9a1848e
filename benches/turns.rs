//! Engine overhead of a turn, and how fast one node takes its seats, each
//! against a floor measured in the same run.
//!
//!     cargo bench --bench turns
//!
//! The real binary on its embedded broker, the real OpenAI provider plugin
//! talking to a zero-latency local server that speaks the OpenAI wire
//! format, and a real MCP child per seat (`crewlet mcp chat`):
//! - wake → first model request: a wake published on the seat's inbox until
//!   the model server has the executor's first request; floor: a raw
//!   JetStream publish reaching a waiting pull consumer.
//! - per tool round: between two executor requests of one turn, for a
//!   builtin tool and for an MCP tool; floor: one HTTP round trip to the
//!   same model server.
//! - acquire → equip → attach of 200 seats (no MCP) and of 20 seats with one
//!   stdio child each: `/ready` until `/health` shows every seat held;
//!   floor: the same number of raw seat-lease acquisitions, 16 in flight.
//!
//! Figures go to BENCHMARKS.md; nothing here asserts them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use crewlet_testkit::{PluginsDir, free_port, http};
use futures::StreamExt;
use serde_json::json;

const TURNS: usize = 200;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    turn_overhead(&rt);
    seat_taking(&rt, 200, false);
    seat_taking(&rt, 20, true);
}

fn turn_overhead(rt: &tokio::runtime::Runtime) {
    let ai = ScriptedOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let plugins = PluginsDir::new(dir.path().join("plugins"));
    plugins.add_provider_at(
        "openai",
        "plugins/providers/openai/plugin.toml",
        &ai.base_url(),
        &ai.origin(),
    );
    let chat_log = dir.path().join("chat.jsonl");
    let company = format!(
        r#"
[org]
name = "Bench"
[roles.r]
system_prompt = "You work."
executor = [{{ provider = "openai", model = "exec" }}]
reviewer = {{ provider = "openai", model = "review" }}
max_iterations = 1
[roles.r.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {:?} }}
[seats]
ada = {{ role = "r" }}
"#,
        chat_log.display().to_string()
    );
    let node = Node::start(dir.path(), &company, Some(plugins.path()));
    node.wait_held(1, Duration::from_secs(60));
    let (url, login) = (node.nats_url(), node.nats_login());
    let seat_id =
        crewlet_company::seat_id("Bench", &crewlet_company::Handle::parse("ada").unwrap());

    let (wake_ms, builtin_ms, mcp_ms, floor_js, floor_http) = rt.block_on(async {
        let client = login.connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        let floor_js = jetstream_floor(&js).await;
        let floor_http = http_floor(&ai);
        let agent = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
        let (mut wake, mut builtin, mut mcp) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..TURNS {
            let before = ai.request_count();
            ai.reply(
                "exec",
                Reply::ToolCalls(vec![(
                    "list_mcp_server_tools".into(),
                    json!({"server": "chat"}),
                )]),
            );
            ai.reply(
                "exec",
                Reply::ToolCalls(vec![(
                    "chat__read_thread".into(),
                    json!({"channel": "C1", "thread": "1"}),
                )]),
            );
            ai.reply(
                "exec",
                Reply::ToolCalls(vec![(
                    "submit_work".into(),
                    json!({"outcome": "no_action", "summary": "nothing to do"}),
                )]),
            );
            ai.reply(
                "review",
                Reply::ToolCalls(vec![("submit_review".into(), json!({"verdict": "done"}))]),
            );
            let payload = json!({
                "trace_id": format!("bench-{i}"), "delivery_id": format!("d{i}"), "source": "bench",
                "event_type": "task", "handle": "ada", "seat_id": seat_id.to_string(),
                "reason": "assignee", "text": "tidy up", "conversation": null,
                "channel": null, "thread": null,
            });
            let t0 = Instant::now();
            js.publish(
                crewlet_bus::inbox_subject("ada"),
                payload.to_string().into(),
            )
            .await
            .unwrap();
            while ai.request_count() < before + 4 {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            let r = &ai.requests_from(before)[..4];
            wake.push(r[0].at - t0);
            builtin.push(r[1].at - r[0].at);
            mcp.push(r[2].at - r[1].at);
            loop {
                let info = agent
                    .consumer_info(crewlet_bus::mailbox_durable("ada"))
                    .await
                    .unwrap();
                if info.num_pending == 0 && info.num_ack_pending == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        }
        (
            percentiles(wake),
            percentiles(builtin),
            percentiles(mcp),
            floor_js,
            floor_http,
        )
    });
    println!("turn overhead ({TURNS} turns, zero-latency model; p50 / p90)");
    row(
        "floor: JetStream publish → waiting pull consumer",
        floor_js,
        None,
    );
    row("wake → first model request", wake_ms, Some(floor_js));
    row(
        "floor: one HTTP round trip to the model server",
        floor_http,
        None,
    );
    row(
        "tool round, builtin (list_mcp_server_tools)",
        builtin_ms,
        Some(floor_http),
    );
    row(
        "tool round, MCP (chat read_thread)",
        mcp_ms,
        Some(floor_http),
    );
    node.stop();
    // Part of wake → first request: the memory the turn fetches before its
    // first call (each turn's `prefetch` event says how long it took).
    let store = crewlet_store::Store::open_in(&dir.path().join("data")).unwrap();
    let prefetch: Vec<Duration> = store
        .events(&crewlet_store::EventQuery {
            kind: Some("prefetch".into()),
            limit: 1_000,
            ..Default::default()
        })
        .unwrap()
        .iter()
        .filter_map(|e| e.payload["us"].as_u64())
        .map(Duration::from_micros)
        .collect();
    if !prefetch.is_empty() {
        row(
            "  of which the turn's memory prefetch",
            percentiles(prefetch),
            None,
        );
    }
}

fn seat_taking(rt: &tokio::runtime::Runtime, seats: usize, mcp: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut company = String::from(
        "[org]\nname = \"Bench\"\n[roles.r]\nsystem_prompt = \"p\"\nexecutor = [{ provider = \"openai\", model = \"m\" }]\nreviewer = { provider = \"openai\", model = \"m\" }\n",
    );
    if mcp {
        company.push_str(&format!(
            "[roles.r.mcp.chat]\ncommand = \"crewlet\"\nargs = [\"mcp\", \"chat\"]\nenv = {{ CHAT_IDENTITY = \"${{CREWLET_SEAT}}\", CHAT_LOG = {:?} }}\n",
            dir.path().join("chat.jsonl").display().to_string()
        ));
    }
    company.push_str("[seats]\n");
    for i in 0..seats {
        company.push_str(&format!("s{i} = {{ role = \"r\" }}\n"));
    }
    let node = Node::start(dir.path(), &company, None);
    let t = node.wait_held(seats, Duration::from_secs(120));
    let (url, login) = (node.nats_url(), node.nats_login());
    let floor = rt.block_on(async {
        let client = login.connect(url).await.unwrap();
        let owner = crewlet_coord::Owner::incarnation("bench-floor");
        let coord =
            crewlet_coord::Coord::open(client, crewlet_coord::CoordOptions::new(owner.clone()))
                .await
                .unwrap();
        let started = Instant::now();
        let names: Vec<_> = (0..seats)
            .map(|i| crewlet_coord::ResourceName::seat(&format!("floor{i}")).unwrap())
            .collect();
        futures::stream::iter(names.iter())
            .map(|n| coord.acquire(n, &owner, None))
            .buffer_unordered(16)
            .for_each(|r| async move {
                assert!(r.unwrap().is_yes());
            })
            .await;
        started.elapsed()
    });
    node.stop();
    println!(
        "seats: {seats} seats{}: /ready → all held {:>8.1} ms; floor ({seats} raw lease acquisitions, 16 in flight) {:>7.1} ms ({:.1}×)",
        if mcp {
            " with one stdio MCP child each"
        } else {
            " (no MCP)"
        },
        ms(t),
        ms(floor),
        t.as_secs_f64() / floor.as_secs_f64()
    );
}

struct Node {
    child: Child,
    addr: String,
}

impl Node {
    fn start(dir: &Path, company: &str, plugins: Option<&Path>) -> Node {
        let port = free_port();
        let config = dir.join("node.toml");
        std::fs::write(
            &config,
            format!(
                "[api]\nport = {port}\n[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n"
            ),
        )
        .unwrap();
        let company_file = dir.join("company.toml");
        std::fs::write(&company_file, company).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_crewlet"));
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--company")
            .arg(&company_file)
            .env("CREWLET_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(p) = plugins {
            cmd.arg("--plugins").arg(p);
        }
        let node = Node {
            child: cmd.spawn().unwrap(),
            addr: format!("127.0.0.1:{port}"),
        };
        let started = Instant::now();
        while !http::get(&node.addr, "/ready").is_ok_and(|r| r.status == 200) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "node never ready"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        node
    }

    /// Time from now (the node is ready) until it holds `n` seats.
    fn wait_held(&self, n: usize, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let h = http::get(&self.addr, "/health").unwrap().json();
            if h["seats_held"].as_u64() == Some(n as u64) {
                return started.elapsed();
            }
            assert!(started.elapsed() < within, "{n} seats never held: {h}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn nats_url(&self) -> String {
        let h = http::get(&self.addr, "/health").unwrap().json();
        h["stream"]["urls"][0].as_str().unwrap().to_owned()
    }

    /// The embedded broker admits the node's own nkey only.
    fn nats_login(&self) -> async_nats::ConnectOptions {
        let h = http::get(&self.addr, "/health").unwrap().json();
        let file = h["stream"]["server"]["credential_file"].as_str().unwrap();
        let seed = std::fs::read_to_string(file).unwrap();
        async_nats::ConnectOptions::with_nkey(seed.trim().to_owned())
    }

    fn stop(mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap();
    }
}

async fn jetstream_floor(js: &async_nats::jetstream::Context) -> (f64, f64) {
    use async_nats::jetstream::{consumer, stream};
    let s = js
        .create_stream(stream::Config {
            name: "BENCH_FLOOR".into(),
            subjects: vec!["bench.floor".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let c: consumer::PullConsumer = s
        .create_consumer(consumer::pull::Config {
            durable_name: Some("floor".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut messages = c.messages().await.unwrap();
    let mut samples = Vec::new();
    for i in 0..TURNS {
        let t0 = Instant::now();
        js.publish("bench.floor", format!("{i}").into())
            .await
            .unwrap();
        let m = messages.next().await.unwrap().unwrap();
        samples.push(t0.elapsed());
        m.ack().await.unwrap();
    }
    percentiles(samples)
}

fn http_floor(ai: &ScriptedOpenAi) -> (f64, f64) {
    let addr = ai.base_url();
    let authority = addr
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let body =
        json!({"model": "floor", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut samples = Vec::new();
    for _ in 0..TURNS {
        ai.reply("floor", Reply::Text("ok".into()));
        let t0 = Instant::now();
        let r = http::post(
            &authority,
            "/v1/chat/completions",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .unwrap();
        samples.push(t0.elapsed());
        assert_eq!(r.status, 200);
    }
    percentiles(samples)
}

/// p50 and p90 in milliseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| ms(samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]);
    (at(0.5), at(0.9))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(what: &str, (p50, p90): (f64, f64), floor: Option<(f64, f64)>) {
    match floor {
        Some((f50, _)) => println!(
            "  {what:<52} {p50:>7.2} ms / {p90:>7.2} ms   ({:.1}× floor p50)",
            p50 / f50
        ),
        None => println!("  {what:<52} {p50:>7.2} ms / {p90:>7.2} ms"),
    }
}
