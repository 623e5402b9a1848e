//! Drives the real `crewlet` binary as a child process.

#![allow(dead_code)] // each test file uses a different part of this module

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub mod company;
pub mod fleet;

pub use crewlet_testkit::http;
use crewlet_testkit::nats::{nats_server_bin, spawn_tied};

pub fn crewlet_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_crewlet"))
}

/// A temp dir holding one node's config, data dir and log.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.path("data")
    }

    /// A node of this sandbox: `node.toml` with the API on a free port plus
    /// `extra`, and the sandbox's data dir.
    pub fn node(&self, extra: &str) -> NodeBuilder {
        let port = crewlet_testkit::free_port();
        let cfg = self.config(port, extra);
        NodeBuilder::new(self, port)
            .arg("--config")
            .arg(cfg)
            .arg("--data-dir")
            .arg(self.data_dir())
    }

    /// Node `id` of a fleet sharing this sandbox, on the broker(s) at
    /// `urls`: its own `ID.toml` (API on a free port, `[node] id`,
    /// `[stream] url`, then `extra`, which may go on with `[stream]` keys),
    /// data dir `data-ID`, and the sandbox's `company.toml` and `plugins`
    /// dir when they exist. Called again with the same id, it is the same
    /// node restarted on its data dir (on a new API port).
    pub fn fleet_node(&self, id: &str, urls: &[String], extra: &str) -> NodeBuilder {
        let port = crewlet_testkit::free_port();
        let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
        let cfg = self.path(&format!("{id}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[api]\nport = {port}\n[node]\nid = \"{id}\"\n[stream]\nurl = [{}]\n{extra}\n",
                urls.join(", ")
            ),
        )
        .expect("write the node's config");
        let mut b = NodeBuilder::new(self, port)
            .arg("--config")
            .arg(cfg)
            .arg("--data-dir")
            .arg(self.path(&format!("data-{id}")));
        for (flag, file) in [("--company", "company.toml"), ("--plugins", "plugins")] {
            if self.path(file).exists() {
                b = b.arg(flag).arg(self.path(file));
            }
        }
        b
    }

    /// Writes `node.toml` with an API on a free port plus `extra` TOML.
    pub fn config(&self, api_port: u16, extra: &str) -> PathBuf {
        let file = self.path("node.toml");
        std::fs::write(&file, format!("[api]\nport = {api_port}\n\n{extra}\n"))
            .expect("write node.toml");
        file
    }
}

/// The `/ws/stream` handshake for a node, carrying the test operator token.
pub fn ws_stream_request(api: &str) -> tungstenite::handshake::client::Request {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{api}/ws/stream")
        .into_client_request()
        .expect("a ws URL");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", http::OPERATOR_TOKEN)
            .parse()
            .expect("a header value"),
    );
    req
}

/// A running `crewlet run`. Killed on drop if still alive.
pub struct Node {
    pub child: Child,
    pub api: String,
    pub log: PathBuf,
}

pub struct NodeBuilder {
    args: Vec<String>,
    envs: Vec<(String, String)>,
    removed: Vec<String>,
    api_port: u16,
    log: PathBuf,
    cwd: Option<PathBuf>,
}

impl NodeBuilder {
    pub fn new(sandbox: &Sandbox, api_port: u16) -> NodeBuilder {
        NodeBuilder {
            args: vec!["run".into()],
            envs: Vec::new(),
            removed: Vec::new(),
            api_port,
            log: sandbox.path(&format!("node-{api_port}.log")),
            cwd: None,
        }
    }

    /// Starts the node in `dir` instead of the test's working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    pub fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Self {
        self.args.push(a.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<std::ffi::OsStr>) -> Self {
        self.envs
            .push((k.to_owned(), v.as_ref().to_string_lossy().into_owned()));
        self
    }

    pub fn env_remove(mut self, k: &str) -> Self {
        self.removed.push(k.to_owned());
        self
    }

    /// Serving the sandbox's `company.toml` with the plugins in its
    /// `plugins` dir, the Slack signing secret the test companies verify
    /// with set.
    pub fn slack_company(self, sb: &Sandbox) -> Self {
        self.arg("--company")
            .arg(sb.path("company.toml"))
            .arg("--plugins")
            .arg(sb.path("plugins"))
            .env("SLACK_SIGNING_SECRET", company::SLACK_SECRET)
    }

    pub fn spawn(self) -> Node {
        let log = std::fs::File::create(&self.log).expect("log file");
        let mut cmd = Command::new(crewlet_bin());
        cmd.args(&self.args)
            .env_remove("CREWLET_CONFIG")
            .env_remove("CREWLET_COMPANY")
            .env_remove("CREWLET_PLUGINS")
            .env_remove("CREWLET_DATA_DIR")
            .env_remove("CREWLET_TOOLS_DIR")
            // The binary the tests run, wherever the build put the executable.
            .env("CREWLET_NATS_SERVER", nats_server_bin())
            .env("CREWLET_LOG", "info")
            .env("CREWLET_BOOTSTRAP_TOKEN", http::OPERATOR_TOKEN)
            .env_remove("CREWLET_TOKEN")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        for k in &self.removed {
            cmd.env_remove(k);
        }
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        Node {
            child: spawn_tied(cmd).expect("spawn crewlet"),
            api: format!("127.0.0.1:{}", self.api_port),
            log: self.log,
        }
    }
}

impl Node {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Option<http::Response> {
        http::get(&self.api, path).ok()
    }

    /// Waits until `/ready` answers 200; panics with the log otherwise.
    pub fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                panic!(
                    "node exited ({status}) before ready; log:\n{}",
                    self.log_text()
                );
            }
            if self.get("/ready").map(|r| r.status) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "node not ready within {within:?}; log:\n{}",
            self.log_text()
        );
    }

    pub fn health(&self) -> serde_json::Value {
        self.get("/health").expect("/health answers").json()
    }

    /// The embedded nats-server's pid, from `/health`.
    pub fn broker_pid(&self) -> i32 {
        self.health()["stream"]["server"]["pid"]
            .as_i64()
            .unwrap_or_else(|| panic!("no broker pid in {}", self.health())) as i32
    }

    /// Stops the node (SIGSTOP) and returns once every one of its threads
    /// is stopped — not merely once the signal is queued.
    pub fn freeze(&self) {
        crewlet_testkit::process::stop(self.pid());
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own, unreaped child.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > deadline {
                panic!(
                    "node still running after {within:?}; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `crewlet` to completion with `args`, answering (status, output).
pub fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> (ExitStatus, String) {
    run_to_exit_without(args, envs, &[])
}

/// [`run_to_exit`] with the variables `unset` removed from what the child
/// inherits (`./dev` exports the example's secrets to everything it runs).
pub fn run_to_exit_without(
    args: &[&str],
    envs: &[(&str, &str)],
    unset: &[&str],
) -> (ExitStatus, String) {
    let mut cmd = Command::new(crewlet_bin());
    for name in unset {
        cmd.env_remove(name);
    }
    let out = cmd
        .args(args)
        .env_remove("CREWLET_CONFIG")
        .env_remove("CREWLET_DATA_DIR")
        .env_remove("CREWLET_API")
        .env("CREWLET_TOKEN", http::OPERATOR_TOKEN)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run crewlet");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status, text)
}

/// True while `pid` names a live (not zombie) process.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3, after the parenthesised command name, is the state.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The command line of `pid`, NUL separators turned into spaces.
pub fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Live children of `pid`.
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(pid) && alive(child) {
            out.push(child);
        }
    }
    out
}

/// Polls `cond` every 10 ms until true or `within` passes.
pub fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

pub fn dir_is_absent_or_empty(p: &Path) -> bool {
    !p.exists()
        || std::fs::read_dir(p)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false)
}

/// Takes (and acks) the next wake in `handle`'s mailbox, if there is one.
pub async fn take_wake(client: &async_nats::Client, handle: &str) -> Option<serde_json::Value> {
    use futures::StreamExt;
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(&crewlet_bus::mailbox_durable(handle))
        .await
        .expect("the mailbox exists");
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .expect("fetch");
    let msg = batch.next().await?.expect("a message");
    msg.double_ack().await.expect("ack");
    Some(serde_json::from_slice(&msg.payload).expect("a wake is JSON"))
}

/// Posts a Slack `app_mention` signed with `secret`, in `channel`, thread
/// `thread`, to seat `handle`'s route on the node at `api`; the node's
/// answer. Each event is its own post, as on Slack: its `ts` is made from
/// the event id (the same event sent again is the same post), its
/// `thread_ts` is `thread`.
pub fn post_slack_mention(
    api: &str,
    secret: &str,
    handle: &str,
    event_id: &str,
    channel: &str,
    thread: &str,
    text: &str,
) -> std::io::Result<http::Response> {
    let body = serde_json::json!({
        "type": "event_callback",
        "event_id": event_id,
        "team_id": "T1",
        "event": {"type": "app_mention", "user": "U1", "text": text, "channel": channel,
                  "ts": format!("{thread}.{event_id}"), "thread_ts": thread},
    })
    .to_string();
    post_slack_event(api, secret, handle, &body)
}

/// Posts the Slack event callback `body` signed with `secret` to seat
/// `handle`'s route on the node at `api`; the node's answer.
pub fn post_slack_event(
    api: &str,
    secret: &str,
    handle: &str,
    body: &str,
) -> std::io::Result<http::Response> {
    let (now, sig) = crewlet_ingress::sign::slack_headers(secret.as_bytes(), body.as_bytes());
    http::post(
        api,
        &format!("/webhooks/slack/{handle}"),
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &now),
            ("X-Slack-Signature", &sig),
        ],
        body.as_bytes(),
    )
}

/// Sends `node` a Slack `app_mention` signed with `secret`, in `channel`,
/// thread `ts`, to seat `handle` ([`post_slack_mention`]); asserts it was
/// accepted (202).
pub fn slack_mention(
    node: &Node,
    secret: &str,
    handle: &str,
    event_id: &str,
    channel: &str,
    ts: &str,
    text: &str,
) {
    let r = post_slack_mention(&node.api, secret, handle, event_id, channel, ts, text)
        .expect("POST webhook");
    assert_accepted(node, &r);
}

/// Asserts a webhook was accepted (202), showing the node's log if not.
pub fn assert_accepted(node: &Node, r: &http::Response) {
    assert_eq!(
        r.status,
        202,
        "{}\nnode log:\n{}",
        r.text(),
        node.log_text()
    );
}

/// Events of `kind` in the fleet's logs (as read from `node`), newest first.
pub fn events(node: &Node, kind: &str) -> Vec<serde_json::Value> {
    node.get(&format!("/events?type={kind}&limit=1000"))
        .expect("GET /events")
        .json()["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Events of `kind` in `node`'s own log only (`node=ID`), newest first.
pub fn events_on(node: &Node, kind: &str) -> Vec<serde_json::Value> {
    let id = node.health()["node_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    node.get(&format!("/events?type={kind}&limit=1000&node={id}"))
        .expect("GET /events")
        .json()["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Waits up to 30 s for at least `n` events of `kind`.
pub fn wait_events(node: &Node, kind: &str, n: usize) -> Vec<serde_json::Value> {
    let mut got = Vec::new();
    let ok = eventually(Duration::from_secs(30), || {
        got = events(node, kind);
        got.len() >= n
    });
    assert!(
        ok,
        "{n} {kind} events expected, saw {}: {}",
        got.len(),
        node.log_text()
    );
    got
}

/// The login to a node's embedded broker: the nkey seed in the file its
/// `/health` names (the broker admits no client without it).
pub fn broker_login(health: &serde_json::Value) -> async_nats::ConnectOptions {
    let file = health["stream"]["server"]["credential_file"]
        .as_str()
        .unwrap_or_else(|| panic!("no broker credential file in /health: {health}"));
    let seed = std::fs::read_to_string(file).expect("the broker's seed file");
    async_nats::ConnectOptions::with_nkey(seed.trim().to_owned())
}

/// A node without seats serving the example company plus the hostile
/// webhook (`[integrations.hostile]`) from `plugins`, on `nats_url`, with
/// the GitHub and hostile secrets given: the sandbox's and hot reload's
/// node.
pub fn hostile_route_node(
    sb: &Sandbox,
    id: &str,
    nats_url: &str,
    plugins: &Path,
    secrets: (&str, &str),
) -> Node {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let company = std::fs::read_to_string(root.join("examples/company.toml")).unwrap()
        + "\n[integrations.hostile]\nplugin = \"hostile-webhook\"\nsecret = \"HOSTILE_SECRET\"\n";
    let company_file = sb.path("company.toml");
    std::fs::write(&company_file, company).unwrap();
    seatless_node(
        sb,
        id,
        nats_url,
        plugins,
        &company_file,
        &[
            ("GITHUB_WEBHOOK_SECRET", secrets.0),
            ("HOSTILE_SECRET", secrets.1),
            // Two malloc arenas, so the node's RSS follows the bytes it
            // holds, not how many of its threads allocated at once (glibc
            // keeps each of up to 8 arenas a core at its peak): what the
            // sandbox's memory bounds read.
            ("MALLOC_ARENA_MAX", "2"),
        ],
    )
}

/// A node without seats (its tests read the mailboxes, as a seat would)
/// serving `company_file` with the plugins under `plugins`, on `nats_url`,
/// with `env` set.
pub fn seatless_node(
    sb: &Sandbox,
    id: &str,
    nats_url: &str,
    plugins: &Path,
    company_file: &Path,
    env: &[(&str, &str)],
) -> Node {
    let port = crewlet_testkit::free_port();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\nroles = [\"data\", \"ingress\", \"workers\"]\n[stream]\nurl = \"{nats_url}\"\n"
        ),
    );
    let mut builder = NodeBuilder::new(sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .arg("--plugins")
        .arg(plugins)
        .arg("--company")
        .arg(company_file);
    for (k, v) in env {
        builder = builder.env(k, v);
    }
    let mut node = builder.spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}
