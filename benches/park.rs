//! How soon parked work resumes — issue 32's figure: within 2 s of its
//! window turning over or its cap being raised — against an unparked wake
//! on the same node, all in one run.
//!
//!     cargo bench --bench park        (`PARK_SAMPLES`, default 7)
//!
//! The real binary on its embedded broker, the real OpenAI provider plugin
//! against `ScriptedOpenAi` (a zero-latency local server speaking the
//! OpenAI wire format), a real chat MCP child per seat. Each figure ends
//! when the vendor has the turn's first model request:
//! - baseline: a wake published on an unparked seat's inbox;
//! - cap raised: the seat parked on a day cap below today's spend (lowered
//!   by a config apply, then a wake); from the moment `PUT /config` raising
//!   the cap returns (and, beside it, how soon `/health` shows that epoch
//!   applied);
//! - window turnover: a node whose clock (`CREWLET_TEST_CLOCK_OFFSET_MS`)
//!   is `PARK_LEAD_MS` (default 20 s) before a UTC midnight; its seat parks
//!   on the day window (the first call billed past the cap); from the
//!   instant that clock reaches midnight. A fresh node (and broker) per
//!   sample, so no sample meets another's spend.
//!
//! Figures go to BENCHMARKS.md; nothing here asserts them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use crewlet_testkit::{PluginsDir, free_port, http};
use serde_json::json;

const DAY_MS: i64 = 86_400_000;
/// A cap no bench turn reaches, and one every turn is past.
const ROOMY: u64 = 1_000_000;
const FULL: u64 = 1;

fn main() {
    let samples = env_or("PARK_SAMPLES", 7) as usize;
    let lead_ms = env_or("PARK_LEAD_MS", 20_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (baseline, raised, applied) = cap_raised(&rt, samples);
    let turnover: Vec<f64> = (0..samples)
        .map(|i| window_turnover(&rt, lead_ms, i))
        .collect();

    let base = spread(&baseline);
    println!(
        "parked work resumes ({samples} samples each; p50 / max; ratio to the baseline's p50)"
    );
    row("baseline: unparked wake → first model request", base, None);
    row(
        "window turnover (node clock) → first model request",
        spread(&turnover),
        Some(base),
    );
    row(
        "cap raised: PUT /config returned → first model request",
        spread(&raised),
        Some(base),
    );
    row(
        "  (PUT /config returned → /health shows it applied)",
        spread(&applied),
        None,
    );
    let worst = turnover.iter().chain(&raised).copied().fold(0.0, f64::max);
    println!("  issue 32's bound: 2000 ms; the slowest resume here: {worst:.1} ms");
}

/// Baseline wakes, then parks lifted by a raised cap, on one node.
fn cap_raised(rt: &tokio::runtime::Runtime, samples: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let ai = ScriptedOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins(dir.path(), &ai);
    let doc = |cap: u64| company(dir.path(), cap);
    let node = Node::start(dir.path(), &doc(ROOMY), &plugins, 0);
    node.wait_held(1);
    let inbox = Inbox::open(rt, &node);
    let (mut baseline, mut raised, mut applied) = (Vec::new(), Vec::new(), Vec::new());
    let mut wake = 0;
    for _ in 0..samples {
        script_turn(&ai);
        let before = ai.request_count();
        wake += 1;
        let sent = inbox.wake(rt, wake);
        let first = first_request_after(&ai, before);
        baseline.push(ms(first - sent));
        inbox.wait_settled(rt);
    }
    for _ in 0..samples {
        // Today's spend is past the lowered cap: the next work parks before
        // any model call.
        node.put_config(&doc(FULL));
        let parked = node.count("budget_parked");
        let before = ai.request_count();
        wake += 1;
        inbox.wake(rt, wake);
        node.wait_count("budget_parked", parked + 1);
        assert_eq!(
            ai.request_count(),
            before,
            "no model call to learn it is full"
        );
        script_turn(&ai);
        let (returned, epoch) = node.put_config_returning(&doc(ROOMY));
        let seen = node.wait_applied(epoch);
        let first = first_request_after(&ai, before);
        raised.push(ms(first - returned));
        applied.push(ms(seen - returned));
        inbox.wait_settled(rt);
    }
    node.stop();
    (baseline, raised, applied)
}

/// One node whose clock is `lead_ms` before a UTC midnight: its seat parks
/// on the day window, and the work runs when that clock reaches midnight.
/// Answers ms from that instant to the parked work's first model request.
fn window_turnover(rt: &tokio::runtime::Runtime, lead_ms: i64, sample: usize) -> f64 {
    let ai = ScriptedOpenAi::start();
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins(dir.path(), &ai);
    let (anchor, anchor_ms) = (Instant::now(), wall_ms());
    let midnight = (anchor_ms / DAY_MS + 1) * DAY_MS;
    let offset = midnight - lead_ms - anchor_ms;
    // The node's clock reads midnight `lead_ms` from the anchor.
    let turnover = anchor + Duration::from_millis(lead_ms as u64);
    let node = Node::start(dir.path(), &company(dir.path(), 3_000), &plugins, offset);
    node.wait_held(1);
    let inbox = Inbox::open(rt, &node);
    // The first call is billed past the cap before anything is answered.
    let look = Reply::ToolCalls(vec![(
        "list_mcp_server_tools".into(),
        json!({"server": "chat"}),
    )]);
    ai.reply("exec", Reply::billed(100, 5_000, look));
    inbox.wake(rt, 1);
    node.wait_count("budget_parked", 1);
    assert!(
        Instant::now() < turnover,
        "sample {sample}: parked only after the turnover; raise PARK_LEAD_MS"
    );
    script_turn(&ai);
    let first = first_request_after(&ai, 1);
    let late = ms(first - turnover);
    node.stop();
    late
}

/// The seat's turn: `submit_work` at once, the reviewer says done.
fn script_turn(ai: &ScriptedOpenAi) {
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
}

/// When the vendor had the first request after the first `seen`.
fn first_request_after(ai: &ScriptedOpenAi, seen: usize) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(120);
    while ai.request_count() <= seen {
        assert!(
            Instant::now() < deadline,
            "the work never reached the model"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    ai.requests_from(seen)[0].at
}

fn plugins(dir: &Path, ai: &ScriptedOpenAi) -> PluginsDir {
    let plugins = PluginsDir::new(dir.join("plugins"));
    plugins.add_provider_at(
        "openai",
        "plugins/providers/openai/plugin.toml",
        &ai.base_url(),
        &ai.origin(),
    );
    plugins
}

fn company(dir: &Path, cap: u64) -> String {
    format!(
        r#"
[org]
name = "Bench"
[roles.r]
system_prompt = "You work."
executor = [{{ provider = "openai", model = "exec" }}]
reviewer = {{ provider = "openai", model = "review" }}
max_iterations = 1
budget = {{ day = {cap} }}
[roles.r.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {:?} }}
[seats]
ada = {{ role = "r" }}
"#,
        dir.join("chat.jsonl").display().to_string()
    )
}

/// ada's inbox on the node's broker.
struct Inbox {
    js: async_nats::jetstream::Context,
    seat_id: String,
}

impl Inbox {
    fn open(rt: &tokio::runtime::Runtime, node: &Node) -> Inbox {
        let h = http::get(&node.addr, "/health").unwrap().json();
        let url = h["stream"]["urls"][0].as_str().unwrap().to_owned();
        let file = h["stream"]["server"]["credential_file"].as_str().unwrap();
        let seed = std::fs::read_to_string(file).unwrap();
        let login = async_nats::ConnectOptions::with_nkey(seed.trim().to_owned());
        let client = rt.block_on(login.connect(url)).unwrap();
        let seat_id =
            crewlet_company::seat_id("Bench", &crewlet_company::Handle::parse("ada").unwrap());
        let _inside = rt.enter();
        Inbox {
            js: async_nats::jetstream::new(client),
            seat_id: seat_id.to_string(),
        }
    }

    /// Publishes wake `n` on the inbox; answers when it was sent.
    fn wake(&self, rt: &tokio::runtime::Runtime, n: usize) -> Instant {
        let payload = json!({
            "trace_id": format!("park-{n}"), "delivery_id": format!("park-d{n}"), "source": "bench",
            "event_type": "task", "handle": "ada", "seat_id": self.seat_id,
            "reason": "assignee", "text": "tidy up", "conversation": null,
            "channel": null, "thread": null,
        });
        let sent = Instant::now();
        rt.block_on(self.js.publish(
            crewlet_bus::inbox_subject("ada"),
            payload.to_string().into(),
        ))
        .unwrap();
        sent
    }

    /// Waits until the mailbox holds nothing pending or unacknowledged.
    fn wait_settled(&self, rt: &tokio::runtime::Runtime) {
        rt.block_on(async {
            let agent = self.js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let info = agent
                    .consumer_info(crewlet_bus::mailbox_durable("ada"))
                    .await
                    .unwrap();
                if info.num_pending == 0 && info.num_ack_pending == 0 {
                    return;
                }
                assert!(Instant::now() < deadline, "the mailbox never settled");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    }
}

struct Node {
    child: Child,
    addr: String,
}

impl Node {
    fn start(dir: &Path, company: &str, plugins: &PluginsDir, offset_ms: i64) -> Node {
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
        let child = Command::new(env!("CARGO_BIN_EXE_crewlet"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--company")
            .arg(&company_file)
            .arg("--plugins")
            .arg(plugins.path())
            .env("CREWLET_LOG", "warn")
            .env("CREWLET_BOOTSTRAP_TOKEN", http::OPERATOR_TOKEN)
            .env(crewlet_os::TEST_CLOCK_OFFSET_ENV, offset_ms.to_string())
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
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "node never ready"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        node
    }

    fn health(&self) -> serde_json::Value {
        http::get(&self.addr, "/health").unwrap().json()
    }

    fn wait_held(&self, n: u64) {
        let started = Instant::now();
        while self.health()["seats_held"].as_u64() != Some(n) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{n} seats never held"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Applies `doc` and waits until this node runs it.
    fn put_config(&self, doc: &str) {
        let (_, epoch) = self.put_config_returning(doc);
        self.wait_applied(epoch);
    }

    /// `PUT /config`: when it returned, and the epoch it made.
    fn put_config_returning(&self, doc: &str) -> (Instant, u64) {
        let put = http::request(&self.addr, "PUT", "/config", &[], doc.as_bytes()).unwrap();
        let returned = Instant::now();
        assert_eq!(put.status, 201, "{}", put.text());
        (returned, put.json()["epoch"].as_u64().unwrap())
    }

    /// When `/health` first showed `epoch` applied (asked every 2 ms).
    fn wait_applied(&self, epoch: u64) -> Instant {
        let started = Instant::now();
        while self.health()["applied_epoch"].as_u64() != Some(epoch) {
            assert!(started.elapsed() < Duration::from_secs(30), "never applied");
            std::thread::sleep(Duration::from_millis(2));
        }
        Instant::now()
    }

    /// How many events of `kind` the node's log holds.
    fn count(&self, kind: &str) -> usize {
        let r = http::get(&self.addr, &format!("/events?type={kind}&limit=1000")).unwrap();
        r.json()["events"].as_array().map_or(0, Vec::len)
    }

    fn wait_count(&self, kind: &str, n: usize) {
        let started = Instant::now();
        while self.count(kind) < n {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no {kind} event"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stop(mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().unwrap();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // A panic mid-bench leaves no node behind; after `stop`, a no-op.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn env_or(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// p50 and max in milliseconds.
fn spread(samples: &[f64]) -> (f64, f64) {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    (s[(s.len() - 1) / 2], s[s.len() - 1])
}

fn row(what: &str, (p50, max): (f64, f64), base: Option<(f64, f64)>) {
    match base {
        Some((b50, _)) => println!(
            "  {what:<56} {p50:>8.1} ms / {max:>8.1} ms   ({:.1}× baseline p50)",
            p50 / b50
        ),
        None => println!("  {what:<56} {p50:>8.1} ms / {max:>8.1} ms"),
    }
}
