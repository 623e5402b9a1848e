//! A node's limits end to end through the real binary: how many turns it
//! runs at once (`node.max_concurrent`), and a node that serves no HTTP at
//! all (`api.port = 0`).

use crate::common;

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{NodeBuilder, Sandbox, eventually};
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use crewlet_testkit::{NatsServer, PluginsDir};
use serde_json::{Value, json};

const SLACK_SECRET: &str = "slack-signing-secret";

/// A model that takes its time: every request is held for `delay`, then
/// forwarded to a [`ScriptedOpenAi`] and its answer relayed. It counts the
/// requests it holds at once, so a test sees how many turns were in a model
/// call side by side.
struct SlowModel {
    addr: SocketAddr,
    most: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl SlowModel {
    fn start(upstream: &ScriptedOpenAi, delay: Duration) -> SlowModel {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the slow model");
        let addr = listener.local_addr().unwrap();
        let upstream = format!("127.0.0.1:{}", upstream.port());
        let held = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (most2, stop2) = (most.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (upstream, held, most) = (upstream.clone(), held.clone(), most2.clone());
                std::thread::spawn(move || relay(conn, &upstream, delay, &held, &most));
            }
        });
        SlowModel { addr, most, stop }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The most requests held at once so far.
    fn most_at_once(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

impl Drop for SlowModel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// One request on `conn`, answered with `Connection: close`.
fn relay(
    mut conn: TcpStream,
    upstream: &str,
    delay: Duration,
    held: &AtomicUsize,
    most: &AtomicUsize,
) {
    let Some((path, headers, body)) = read_request(&mut conn) else {
        return;
    };
    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    // The model thinking: what this double is for, not a synchronisation.
    std::thread::sleep(delay);
    let forwarded: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "host" | "content-length" | "connection"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let answer = crewlet_testkit::http::post(upstream, &path, &forwarded, &body);
    held.fetch_sub(1, Ordering::SeqCst);
    let (status, content_type, body) = match answer {
        Ok(r) => {
            let ct = r.header("content-type").unwrap_or("application/json");
            (r.status, ct.to_owned(), r.body)
        }
        Err(e) => (502, "text/plain".into(), e.to_string().into_bytes()),
    };
    let head = format!(
        "HTTP/1.1 {status} Relayed\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(&body);
}

/// One HTTP/1.1 request: path, headers (lower-cased names), body.
type Request = (String, Vec<(String, String)>, Vec<u8>);

fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let split = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = conn.read(&mut buf).ok().filter(|n| *n > 0)?;
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split(' ').nth(1)?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = raw[split + 4..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut buf).ok().filter(|n| *n > 0)?;
        body.extend_from_slice(&buf[..n]);
    }
    Some((path, headers, body))
}

/// Sends a signed Slack `app_mention` to `/webhooks/slack/HANDLE`.
fn mention(api: &str, handle: &str, event_id: &str, channel: &str) {
    let body = json!({
        "type": "event_callback",
        "event_id": event_id,
        "team_id": "T1",
        "event": {"type": "app_mention", "user": "U1", "text": format!("<@{handle}> hello"),
                  "channel": channel, "ts": "1.1"},
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(SLACK_SECRET.as_bytes(), body.as_bytes());
    let r = crewlet_testkit::http::post(
        api,
        &format!("/webhooks/slack/{handle}"),
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &now),
            ("X-Slack-Signature", &sig),
        ],
        body.as_bytes(),
    )
    .expect("POST webhook");
    assert_eq!(r.status, 202, "{}", r.text());
}

/// Three seats, each of a role of its own so that each has its own
/// executor model (the scripted replies are queued per model, and turns
/// running side by side must not take each other's).
fn company(handles: &[&str], chat_log: &Path) -> String {
    let mut doc = String::from("[org]\nname = \"Acme\"\n");
    for h in handles {
        doc.push_str(&format!(
            r#"
[roles.{h}]
system_prompt = "You answer questions in chat."
executor = [{{ provider = "openai", model = "exec-{h}", credentials = "${{KEY_ONE}}" }}]
reviewer = {{ provider = "openai", model = "review", credentials = "${{KEY_ONE}}" }}
max_iterations = 2
max_tool_rounds = 6
[roles.{h}.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {log:?} }}
replies = ["post_message"]
"#,
            log = chat_log.display().to_string()
        ));
    }
    doc.push_str("[seats]\n");
    for h in handles {
        doc.push_str(&format!("{h} = {{ role = \"{h}\" }}\n"));
    }
    doc.push_str("[integrations.slack]\nplugin = \"slack\"\nsecret = \"SLACK_SIGNING_SECRET\"\n");
    doc
}

/// The most turns that overlapped, from their `turn_started` and
/// `turn_ended` rows (an end and a start in the same millisecond count as
/// one after the other: the permit is released before it is taken again).
fn most_overlapping(started: &[Value], ended: &[Value]) -> usize {
    let at = |e: &Value| e["at_ms"].as_i64().expect("at_ms");
    let ends: HashMap<&str, i64> = ended
        .iter()
        .map(|e| (e["payload"]["turn_id"].as_str().unwrap(), at(e)))
        .collect();
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for s in started {
        let id = s["payload"]["turn_id"].as_str().unwrap();
        let end = *ends
            .get(id)
            .unwrap_or_else(|| panic!("turn {id} never ended"));
        edges.push((at(s), 1));
        edges.push((end, -1));
    }
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    most as usize
}

#[test]
fn max_concurrent_caps_the_turns_in_flight_and_every_turn_still_runs() {
    const CAP: usize = 2;
    let handles = ["ada", "bob", "cy"];
    assert_eq!(handles.len(), CAP + 1);
    let ai = ScriptedOpenAi::start();
    let model = SlowModel::start(&ai, Duration::from_secs(1));
    for h in handles {
        ai.reply(
            &format!("exec-{h}"),
            Reply::ToolCalls(vec![(
                "chat__post_message".into(),
                json!({"channel": format!("C-{h}"), "thread": "1.1", "text": "on it"}),
            )]),
        );
        ai.reply(
            &format!("exec-{h}"),
            Reply::ToolCalls(vec![(
                "submit_work".into(),
                json!({"outcome": "delivered", "summary": "answered"}),
            )]),
        );
        ai.reply(
            "review",
            Reply::ToolCalls(vec![(
                "submit_review".into(),
                json!({"verdict": "done", "feedback": ""}),
            )]),
        );
    }

    let sb = Sandbox::new();
    let company_file = sb.path("company.toml");
    std::fs::write(&company_file, company(&handles, &sb.path("chat.jsonl"))).unwrap();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins.add("slack", "plugins/webhooks/slack/plugin.toml");
    plugins.add_provider_at(
        "openai",
        "plugins/providers/openai/plugin.toml",
        &format!("{}/v1", model.origin()),
        &model.origin(),
    );
    let mut node = sb
        .node(&format!(
            "[node]\nmax_concurrent = {CAP}\n[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n"
        ))
        .arg("--company")
        .arg(&company_file)
        .arg("--plugins")
        .arg(plugins.path())
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .env("KEY_ONE", "sk-one-1111")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    assert_eq!(node.health()["max_concurrent"], CAP);
    // Every seat attached first, so all three wakes can start a turn at once.
    assert!(
        eventually(Duration::from_secs(30), || node.health()["seats_held"]
            == handles.len()),
        "seats not all held: {}",
        node.health()
    );

    for (i, h) in handles.iter().enumerate() {
        mention(&node.api, h, &format!("Ev{i}"), &format!("C-{h}"));
    }
    let mut most_in_flight = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let health = node.health();
        most_in_flight = most_in_flight.max(health["turns_in_flight"].as_u64().unwrap_or(0));
        if common::events(&node, "turn_ended").len() == handles.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every turn ended; log:\n{}",
            node.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let ended = common::events(&node, "turn_ended");
    let started = common::events(&node, "turn_started");
    let outcomes: Vec<_> = ended
        .iter()
        .map(|e| e["payload"]["outcome"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(outcomes, ["delivered"; 3], "{ended:?}");
    assert_eq!(started.len(), handles.len());
    assert_eq!(most_overlapping(&started, &ended), CAP);
    assert_eq!(most_in_flight, CAP as u64, "turns_in_flight in /health");
    assert!(
        model.most_at_once() <= CAP,
        "{} model calls at once",
        model.most_at_once()
    );
}

/// TCP ports `pid` listens on, from its socket inodes and `/proc/PID/net`.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's fds")
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is field 1 (ADDR:PORT in hex), st field 3
            // (0A = LISTEN), inode field 9.
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

#[test]
fn api_port_zero_serves_no_http_and_the_node_still_works() {
    // The probe sees a listener when there is one: this process's own.
    let own = TcpListener::bind("127.0.0.1:0").unwrap();
    let own_port = own.local_addr().unwrap().port();
    assert!(listening_ports(std::process::id()).contains(&own_port));
    drop(own);

    let server = NatsServer::start();
    let sb = Sandbox::new();
    let cfg = sb.config(
        0,
        &format!(
            "[node]\nid = \"no-api\"\nroles = [\"data\", \"ingress\", \"workers\"]\n[stream]\nurl = \"{}\"\n",
            server.url()
        ),
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut node = NodeBuilder::new(&sb, 0)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .arg("--company")
        .arg(root.join("examples/company.toml"))
        .spawn();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let js = rt.block_on(async { async_nats::jetstream::new(client.clone()) });
    // Up, told by what it does: it creates the notification service's
    // consumer once its engine runs, after every seat's mailbox.
    let up = eventually(Duration::from_secs(60), || {
        if let Some(status) = node.child.try_wait().unwrap() {
            panic!("node exited ({status}); log:\n{}", node.log_text());
        }
        rt.block_on(async {
            let Ok(stream) = js.get_stream(crewlet_bus::NOTIFICATIONS_STREAM).await else {
                return false;
            };
            stream
                .consumer_info(crewlet_bus::NOTIFY_DURABLE)
                .await
                .is_ok()
        })
    });
    assert!(up, "the node never came up; log:\n{}", node.log_text());

    // And it works: a delivery on the stream becomes ada's wake.
    let inbound = crewlet_bus::Inbound {
        trace_id: "trace-no-api".into(),
        key: "github:no-api-1".into(),
        delivery_id: "no-api-1".into(),
        source: "github".into(),
        event_type: "issue_comment".into(),
        route_handle: None,
        mentions: vec!["@ada".into()],
        assignees: Vec::new(),
        reviewers: Vec::new(),
        channel: None,
        thread: None,
        text: Some("hello".into()),
        owed: None,
        sender: Vec::new(),
        wakes: Default::default(),
        message: None,
        received_by: "test".into(),
        received_at_ms: 0,
    };
    rt.block_on(async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(crewlet_bus::MSG_ID_HEADER, inbound.key.as_str());
        js.publish_with_headers(
            crewlet_bus::INBOUND_SUBJECT,
            headers,
            serde_json::to_vec(&inbound).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    });
    let woken = eventually(Duration::from_secs(20), || {
        rt.block_on(async {
            let stream = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
            stream
                .consumer_info(crewlet_bus::mailbox_durable("ada"))
                .await
                .is_ok_and(|i| i.num_pending == 1)
        })
    });
    assert!(woken, "no wake for ada; log:\n{}", node.log_text());

    assert_eq!(
        listening_ports(node.pid() as u32),
        Vec::<u16>::new(),
        "the node listens; log:\n{}",
        node.log_text()
    );
    assert!(
        node.log_text().contains("api.port = 0: serving no HTTP"),
        "{}",
        node.log_text()
    );
    assert!(node.child.try_wait().unwrap().is_none(), "still running");
}
