//! No secret anywhere, proven: a webhook secret, two model keys and an MCP
//! credential, set as an operator sets them, go through good and badly
//! signed deliveries, turns, a 429 that rotates the key, a provider error
//! that echoes the key, an MCP child that prints its credential and dies,
//! and a restart (JSON logs before, text logs after). Then every log line,
//! event row, stream message, bucket key, API answer and file the node
//! wrote is searched for each value in every form (`forms.rs`): zero hits.

use crate::common;
#[path = "no_secret/drive.rs"]
mod drive;
#[path = "no_secret/forms.rs"]
mod forms;
#[path = "no_secret/sweep.rs"]
mod sweep;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Node, Sandbox, broker_login, eventually, http, wait_events};
use crewlet_testkit::PluginsDir;
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use drive::{mention, post, submit, turn, verdict};
use serde_json::Value;

/// Every crewlet crate at debug: no level may say a secret.
const LOG_FILTER: &str = "info,crewlet=debug,crewlet_api=debug,crewlet_config=debug,\
crewlet_coord=debug,crewlet_ingress=debug,crewlet_mcp=debug,crewlet_models=debug,\
crewlet_node=debug,crewlet_observe=debug,crewlet_plugins=debug,crewlet_seats=debug,\
crewlet_secrets=debug,crewlet_store=debug,crewlet_stream=debug,crewlet_turns=debug,\
crewlet_configplane=debug,crewlet_fleet=debug,crewlet_history=debug,crewlet_tokens=debug";

const NODE_TOML: &str = r#"
[coordination]
heartbeat_seconds = 1
lease_ttl_seconds = 3
[mcp]
allowed_commands = ["crewlet", "/bin/sh"]
"#;

/// Two seats; each gets a working chat child and a child that prints its
/// credential (raw and base64) on stderr, leaves proof it got it, and dies.
const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [
  { provider = "openai", model = "exec-a", credentials = ["${KEY_ONE}", "${KEY_TWO}"] },
  { provider = "openai", model = "exec-b", credentials = "${KEY_TWO}" },
]
reviewer = { provider = "openai", model = "review", credentials = "${KEY_TWO}" }
max_iterations = 2
max_tool_rounds = 6
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = { CHAT_IDENTITY = "${CREWLET_SEAT}", CHAT_LOG = "CHAT_LOG_PATH", CHAT_TOKEN = "${MCP_CREDENTIAL}" }
replies = ["post_message"]
[roles.support.mcp.broken]
command = "/bin/sh"
args = ["-c", 'printf %s "$MCP_TOKEN" > "$PROOF"; echo "login refused for $MCP_TOKEN" >&2; printf %s "$MCP_TOKEN" | base64 >&2; exit 3']
env = { MCP_TOKEN = "${MCP_CREDENTIAL}", PROOF = "PROOF_PATH" }
[seats]
ada = { role = "support" }
bob = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

/// The four values, each a recognisable prefix and 32 random characters.
struct Values {
    hook: String,
    key_one: String,
    key_two: String,
    mcp: String,
}

impl Values {
    fn new() -> Values {
        Values {
            hook: distinct("hook"),
            key_one: distinct("sk-one"),
            key_two: distinct("sk-two"),
            mcp: distinct("mcp"),
        }
    }

    fn named(&self) -> Vec<(&'static str, String)> {
        vec![
            ("SLACK_SIGNING_SECRET", self.hook.clone()),
            ("KEY_ONE", self.key_one.clone()),
            ("KEY_TWO", self.key_two.clone()),
            ("MCP_CREDENTIAL", self.mcp.clone()),
        ]
    }
}

fn distinct(tag: &str) -> String {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut raw))
        .expect("random bytes");
    let tail: String = raw
        .iter()
        .map(|b| ALNUM[*b as usize % ALNUM.len()] as char)
        .collect();
    format!("nosecret-{tag}-{tail}")
}

/// `crewlet secrets set NAME --data-dir DIR`, the value on stdin, as on a
/// stopped node; answers what it printed.
fn set_on_stopped_node(data: &Path, name: &str, value: &str) -> String {
    let mut child = Command::new(common::crewlet_bin())
        .args(["secrets", "set", name, "--data-dir"])
        .arg(data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run crewlet secrets set");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(value.as_bytes()).expect("write the value");
    drop(stdin);
    let out = child.wait_with_output().expect("crewlet secrets set ends");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "secrets set {name}: {text}");
    text
}

fn put_secret(node: &Node, name: &str, value: &str) {
    let path = format!("/secrets/{name}");
    let r = http::request(&node.api, "PUT", &path, &[], value.as_bytes()).expect("PUT");
    assert_eq!(r.status, 204, "PUT {path}: {}", r.text());
}

fn plugins(sb: &Sandbox, ai: &ScriptedOpenAi) -> PathBuf {
    let dir = PluginsDir::new(sb.path("plugins"));
    dir.add("slack", "plugins/webhooks/slack/plugin.toml")
        .add_provider_at(
            "openai",
            "plugins/providers/openai/plugin.toml",
            &ai.base_url(),
            &ai.origin(),
        );
    dir.path().to_owned()
}

fn start(sb: &Sandbox, company: &Path, plugins: &Path, format: &str) -> Node {
    let mut node = sb
        .node(NODE_TOML)
        .arg("--company")
        .arg(company)
        .arg("--plugins")
        .arg(plugins)
        .arg("--log-format")
        .arg(format)
        .env("CREWLET_LOG", LOG_FILTER)
        .env_remove("SLACK_SIGNING_SECRET")
        .env_remove("KEY_ONE")
        .env_remove("KEY_TWO")
        .env_remove("MCP_CREDENTIAL")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

fn stop(mut node: Node) {
    node.signal(libc::SIGTERM);
    let status = node.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status}: {}", node.log_text());
}

/// Waits until both seats' chat children run and both broken ones failed.
fn wait_mcp(node: &Node) {
    let row = |server: &str| {
        node.health()["mcp"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["server"] == server).cloned())
            .unwrap_or(Value::Null)
    };
    let ok = eventually(Duration::from_secs(30), || {
        row("chat")["started"].as_u64() >= Some(2) && row("broken")["failed"].as_u64() >= Some(2)
    });
    assert!(ok, "MCP children: {} / {}", row("chat"), row("broken"));
}

#[test]
fn no_secret_value_is_in_any_log_event_stream_bucket_or_file() {
    let sb = Sandbox::new();
    let v = Values::new();
    let ai = ScriptedOpenAi::start();
    let proof_dir = tempfile::tempdir().expect("temp dir");
    let proof = proof_dir.path().join("mcp-credential");
    let company = sb.path("company.toml");
    let doc = COMPANY
        .replace(
            "CHAT_LOG_PATH",
            &sb.path("chat.jsonl").display().to_string(),
        )
        .replace("PROOF_PATH", &proof.display().to_string());
    std::fs::write(&company, doc).expect("write the company");
    let plugins = plugins(&sb, &ai);
    let data = sb.data_dir();
    std::fs::create_dir_all(&data).expect("data dir");

    // Three set on the stopped node, one over the API once it runs.
    let mut said = Vec::new();
    for (name, value) in [
        ("SLACK_SIGNING_SECRET", &v.hook),
        ("KEY_ONE", &v.key_one),
        ("MCP_CREDENTIAL", &v.mcp),
    ] {
        said.push((name, set_on_stopped_node(&data, name, value)));
    }

    // Before the restart: JSON logs.
    let node = start(&sb, &company, &plugins, "json");
    put_secret(&node, "KEY_TWO", &v.key_two);
    wait_mcp(&node);
    assert_eq!(
        std::fs::read_to_string(&proof).ok().as_ref(),
        Some(&v.mcp),
        "the broken MCP child got its credential"
    );
    assert_eq!(mention(&node, "not-the-secret", "ada", "Ev0", "0.1"), 401);
    // A 429 on the first key: the second answers.
    let rate_limited = vec![
        ("exec-a", Reply::rate_limited(120)),
        ("exec-a", post("1.1")),
        ("exec-a", submit()),
        ("review", verdict()),
    ];
    turn(&node, &ai, &v.hook, "ada", 1, rate_limited);
    let bearers: Vec<_> = ai
        .requests()
        .into_iter()
        .filter(|r| r.model == "exec-a")
        .map(|r| r.bearer)
        .collect();
    assert_eq!(bearers[0].as_ref(), Some(&v.key_one), "the first key first");
    assert!(
        bearers[1..].iter().all(|b| b.as_ref() == Some(&v.key_two)),
        "rotated to the second key"
    );
    // A provider error whose body echoes the key (vendors do): fall back.
    let echoed = format!("Incorrect API key provided: {}", v.key_two);
    let failing = vec![
        ("exec-a", Reply::error(500, &echoed)),
        ("exec-b", post("2.1")),
        ("exec-a", submit()),
        ("review", verdict()),
    ];
    turn(&node, &ai, &v.hook, "ada", 2, failing);
    wait_events(&node, "provider_fallback", 1);
    let first_log = node.log.clone();
    stop(node);

    // After the restart: text logs.
    let node = start(&sb, &company, &plugins, "text");
    wait_mcp(&node);
    let plain = vec![
        ("exec-a", post("3.1")),
        ("exec-a", submit()),
        ("review", verdict()),
    ];
    turn(&node, &ai, &v.hook, "bob", 3, plain);

    let needles = forms::Needles::of(&v.named());
    let mut sweep = sweep::Sweep::new(&needles);
    for (name, text) in &said {
        sweep.output(&format!("`crewlet secrets set {name}` output"), text);
    }
    sweep.events_api(&node.api);
    for path in [
        "/health", "/secrets", "/plugins", "/org", "/budgets", "/agents", "/fleet",
    ] {
        sweep.answer(&node.api, path);
    }
    let health = node.health();
    let url = health["stream"]["urls"][0].as_str().expect("a broker url");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let client = broker_login(&health)
            .connect(url)
            .await
            .expect("log in to the broker");
        sweep.broker(client).await;
    });
    let second_log = node.log.clone();
    stop(node);
    sweep.log(&first_log);
    sweep.log(&second_log);
    sweep.files(sb.dir.path());

    assert_swept_everything(&sweep, &data);
    eprintln!(
        "searched {} log lines, {} events, {} messages in {:?}, {} keys, {} files",
        sweep.log_lines,
        sweep.events,
        sweep.messages,
        sweep.streams,
        sweep.keys,
        sweep.files.len()
    );
    assert!(
        sweep.hits.is_empty(),
        "secret values found (name, form, place):\n{}",
        sweep.hits.join("\n")
    );
}

/// An empty search must not pass for a clean one.
fn assert_swept_everything(sweep: &sweep::Sweep, data: &Path) {
    assert!(sweep.log_lines > 100, "{} log lines", sweep.log_lines);
    assert!(sweep.events > 20, "{} events", sweep.events);
    for stream in [
        "CREWLET_EVENTS",
        "CREWLET_AGENT",
        "KV_crewlet_secrets",
        "KV_crewlet_cooldowns",
    ] {
        assert!(
            sweep.streams.iter().any(|s| s == stream),
            "{stream} not in {:?}",
            sweep.streams
        );
    }
    assert!(
        sweep.messages > 20 && sweep.keys > 5,
        "{} messages, {} keys",
        sweep.messages,
        sweep.keys
    );
    let under = |dir: &str| {
        sweep
            .files
            .iter()
            .filter(|f| f.starts_with(data.join(dir)))
            .count()
    };
    assert!(under("stream") > 0, "no JetStream files searched");
    assert!(under("plugin-cache") > 0, "no plugin cache searched");
    assert!(
        sweep
            .files
            .iter()
            .any(|f| f.ends_with(crewlet_store::FILE_NAME)),
        "the node store was not searched"
    );
}
