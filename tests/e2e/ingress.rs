//! Ingress end to end through the real binary: signed webhooks through the
//! real plugins, claims, the notification service, mailboxes, the event
//! log and the live view.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use crewlet_ingress::sign::github_signature;
use crewlet_testkit::{NatsServer, free_port};
use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

const SECRET: &str = "it's-a-secret-to-everybody";
/// Every role but `seats`: these tests read a seat's mailbox themselves, as
/// the seat would, so no seat on the node may consume it first.
const NO_SEATS: &str = r#"["data", "ingress", "workers"]"#;

#[derive(Clone, Copy)]
struct Opts {
    company: bool,
    secret: bool,
}

const FULL: Opts = Opts {
    company: true,
    secret: true,
};

/// The keyring every node of these tests shares, as a fleet's operator
/// gives every node one copy: a secret set through one node opens on all.
fn fleet_keyring() -> &'static Path {
    static RING: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    RING.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        crewlet_secrets::Keyring::open_or_create(&dir.path().join("keyring")).unwrap();
        dir
    })
    .path()
}

fn node_on(server: &NatsServer, id: &str, opts: Opts) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let port = free_port();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\nroles = {NO_SEATS}\n[stream]\nurl = \"{}\"\n[secrets]\nkeyring = {:?}\n",
            server.url(),
            fleet_keyring().join("keyring"),
        ),
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut b = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .arg("--plugins")
        .arg(root.join("plugins"));
    if opts.company {
        b = b.arg("--company").arg(root.join("examples/company.toml"));
    }
    if opts.secret {
        b = b
            .env("GITHUB_WEBHOOK_SECRET", SECRET)
            .env("SLACK_SIGNING_SECRET", SECRET);
    } else {
        b = b
            .env_remove("GITHUB_WEBHOOK_SECRET")
            .env_remove("SLACK_SIGNING_SECRET");
    }
    let mut node = b.spawn();
    node.wait_ready(Duration::from_secs(60));
    (sb, node)
}

/// An HTTP answer: status, headers (lower-cased names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// POSTs raw; the body is written from another thread so a server that
/// answers before reading it all (413) is still heard.
fn post(addr: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut writer = stream.try_clone().unwrap();
    let body = body.to_vec();
    let w = std::thread::spawn(move || {
        let _ = writer.write_all(head.as_bytes());
        let _ = writer.write_all(&body);
    });
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(_) if !raw.is_empty() => break,
            Err(e) => panic!("no answer from {addr}{path}: {e}"),
        }
    }
    let _ = w.join();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status: status.parse().unwrap(),
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

fn comment(mention: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "action": "created",
        "issue": { "number": 42, "title": "Flaky build" },
        "comment": { "body": format!("Could you take a look, {mention}?") },
        "repository": { "full_name": "acme/robot" },
        "sender": { "login": "octocat" },
    }))
    .unwrap()
}

fn send_github(node: &Node, path: &str, delivery: &str, body: &[u8]) -> Answer {
    let sig = github_signature(SECRET.as_bytes(), body);
    post(
        &node.api,
        path,
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", delivery),
            ("X-Hub-Signature-256", &sig),
        ],
        body,
    )
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn pending(client: &async_nats::Client, handle: &str) -> u64 {
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
    let info = stream
        .consumer_info(crewlet_bus::mailbox_durable(handle))
        .await
        .unwrap();
    info.num_pending
}

fn ws_connect(node: &Node) -> WebSocket<TcpStream> {
    let stream = TcpStream::connect(&node.api).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (ws, _) = tungstenite::client(common::ws_stream_request(&node.api), stream).unwrap();
    ws
}

fn ws_wait(ws: &mut WebSocket<TcpStream>, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match ws.read().expect("socket open") {
            Message::Text(t) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if pred(&v) {
                    return v;
                }
            }
            _ => continue,
        }
    }
    panic!("no matching frame");
}

#[test]
fn a_signed_mention_wakes_the_seat_is_recorded_and_pushed_live() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-a", FULL);
    let mut ws = ws_connect(&node);

    let answer = send_github(&node, "/webhooks/github", "d-first", &comment("@ada"));
    assert_eq!(
        answer.status,
        202,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let trace = answer.json()["trace_ids"][0].as_str().unwrap().to_owned();

    let rt = rt();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let mut wake = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            wake = rt.block_on(take_wake(&client, "ada"));
            wake.is_some()
        }),
        "no wake on ada's mailbox: {}",
        node.log_text()
    );
    let wake = wake.unwrap();
    assert_eq!(wake["trace_id"], trace.as_str());
    assert_eq!(wake["delivery_id"], "d-first");
    assert_eq!(wake["source"], "github");
    assert_eq!(wake["event_type"], "issue_comment.created");
    assert_eq!(wake["reason"], "mention");
    assert_eq!(wake["conversation"], "github:acme/robot#42");
    let org = node.get("/org").unwrap().json();
    let ada_id = org.to_string();
    assert!(
        ada_id.contains(wake["seat_id"].as_str().unwrap()),
        "the wake's seat id is ada's: {org}"
    );

    // The row, in this node's log, under the edge's trace id.
    let rows = wait_events(&node, "webhook_received", 1);
    assert_eq!(rows[0]["trace_id"], trace.as_str());
    let woke = wait_events(&node, "wake_published", 1);
    assert_eq!(woke[0]["trace_id"], trace.as_str());
    assert_eq!(woke[0]["parties"][0]["party"], "seat:ada");
    // Named by handle like every other event; the seat's id rides along.
    assert_eq!(woke[0]["seat"], "ada", "{}", woke[0]);
    assert_eq!(
        woke[0]["payload"]["seat_id"], wake["seat_id"],
        "{}",
        woke[0]
    );
    let by_seat = node
        .get("/events?type=wake_published&seat=ada")
        .unwrap()
        .json();
    assert_eq!(
        by_seat["events"].as_array().map(Vec::len),
        Some(1),
        "{by_seat}"
    );

    // And live.
    let pushed = ws_wait(&mut ws, |f| {
        f["kind"] == "event" && f["event"]["type"] == "webhook_received"
    });
    assert_eq!(pushed["event"]["trace_id"], trace.as_str());

    // The mailbox is recorded in the mailboxes bucket.
    rt.block_on(async {
        let js = async_nats::jetstream::new(client.clone());
        let kv = js.get_key_value("crewlet_mailboxes").await.unwrap();
        let rec = kv
            .get("mailbox.grace")
            .await
            .unwrap()
            .expect("grace's mailbox recorded");
        let rec: Value = serde_json::from_slice(&rec).unwrap();
        assert_eq!(rec["durable"], "inbox-grace");
    });

    // Addressed to nobody: recorded as unrouted, no wake.
    let answer = send_github(&node, "/webhooks/github", "d-nobody", &comment("@nobody"));
    assert_eq!(answer.status, 202);
    let unrouted = wait_events(&node, "delivery_unrouted", 1);
    assert_eq!(unrouted[0]["trace_id"], answer.json()["trace_ids"][0]);

    // The route names the seat.
    let answer = send_github(
        &node,
        "/webhooks/github/linus",
        "d-route",
        &comment("nobody"),
    );
    assert_eq!(answer.status, 202);
    let mut wake = None;
    assert!(eventually(Duration::from_secs(20), || {
        wake = rt.block_on(take_wake(&client, "linus"));
        wake.is_some()
    }));
    assert_eq!(wake.unwrap()["reason"], "route");
}

#[test]
fn a_delivery_sent_twice_or_ten_times_at_once_wakes_once() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-dup", FULL);
    let body = comment("@ada");

    let first = send_github(&node, "/webhooks/github", "d-twice", &body);
    assert_eq!(first.status, 202);
    let second = send_github(&node, "/webhooks/github", "d-twice", &body);
    assert_eq!(second.status, 200);
    assert_eq!(second.json()["status"], "duplicate");

    let statuses: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..10)
            .map(|_| s.spawn(|| send_github(&node, "/webhooks/github", "d-ten", &body).status))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 202).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        9,
        "{statuses:?}"
    );

    // Two deliveries → two wakes, and no more after the service settles.
    wait_events(&node, "wake_published", 2);
    let rt = rt();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let mut ids = Vec::new();
    while let Some(w) = rt.block_on(take_wake(&client, "ada")) {
        ids.push(w["delivery_id"].as_str().unwrap().to_owned());
    }
    std::thread::sleep(Duration::from_secs(1));
    while let Some(w) = rt.block_on(take_wake(&client, "ada")) {
        ids.push(w["delivery_id"].as_str().unwrap().to_owned());
    }
    ids.sort();
    assert_eq!(ids, ["d-ten", "d-twice"]);
    assert_eq!(events(&node, "webhook_received").len(), 2);
}

#[test]
fn a_wake_for_a_seat_no_node_runs_stays_in_its_mailbox() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-keep", FULL);
    let answer = send_github(&node, "/webhooks/github", "d-grace", &comment("@grace"));
    assert_eq!(answer.status, 202);
    wait_events(&node, "wake_published", 1);
    let rt = rt();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    // Nobody reads grace's mailbox for a while: the wake is kept.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(rt.block_on(pending(&client, "grace")), 1);
    // The seat attaches later (here: the test reads the mailbox).
    let wake = rt.block_on(take_wake(&client, "grace")).expect("kept");
    assert_eq!(wake["delivery_id"], "d-grace");
}

#[test]
fn bad_deliveries_get_their_documented_status() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-bad", FULL);
    let body = comment("@ada");

    let unsigned = post(
        &node.api,
        "/webhooks/github",
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", "d-unsigned"),
        ],
        &body,
    );
    assert_eq!(unsigned.status, 401);

    let badly = post(
        &node.api,
        "/webhooks/github",
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", "d-bad"),
            (
                "X-Hub-Signature-256",
                &github_signature(b"not the secret", &body),
            ),
        ],
        &body,
    );
    assert_eq!(badly.status, 401);

    let mut big = comment("@ada");
    big.resize(2 * 1024 * 1024, b' ');
    assert_eq!(
        send_github(&node, "/webhooks/github", "d-big", &big).status,
        413
    );

    assert_eq!(
        send_github(&node, "/webhooks/github", "d-text", b"hello").status,
        400
    );
    assert_eq!(
        send_github(&node, "/webhooks/github", "d-array", b"[1,2]").status,
        400
    );
    assert_eq!(
        send_github(&node, "/webhooks/github", "d-broken", b"{\"action\": ").status,
        400,
        "an object that does not parse is the plugin's 400"
    );
    assert_eq!(
        send_github(&node, "/webhooks/nope", "d-route", &body).status,
        404
    );

    // A route a plugin serves that the company does not integrate: 404
    // (a sender retries a 503 for ever), with the fix in the sentence.
    let unintegrated = send_github(&node, "/webhooks/gitlab", "d-gitlab", &body);
    assert_eq!(unintegrated.status, 404);
    assert!(
        unintegrated.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("[integrations.gitlab]")),
        "{}",
        unintegrated.json()
    );

    // Each refusal is an event and a log line, in the host's sentence and
    // without the secret or the body.
    let refused = events(&node, "delivery_refused");
    let rows: Vec<(String, u64, String)> = refused
        .iter()
        .map(|e| {
            let p = &e["payload"];
            (
                p["source"].as_str().unwrap_or_default().to_owned(),
                p["status"].as_u64().unwrap_or_default(),
                p["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let mut statuses: Vec<(String, u64)> = rows.iter().map(|(s, c, _)| (s.clone(), *c)).collect();
    statuses.sort();
    assert_eq!(
        statuses,
        [
            ("github".to_owned(), 400),
            ("github".to_owned(), 400),
            ("github".to_owned(), 400),
            ("github".to_owned(), 401),
            ("github".to_owned(), 401),
            ("github".to_owned(), 413),
            ("gitlab".to_owned(), 404),
            ("nope".to_owned(), 404),
        ],
        "{refused:?}"
    );
    assert!(
        rows.iter()
            .any(|(_, c, r)| *c == 401 && r.contains("does not match")),
        "{rows:?}"
    );
    for (_, _, reason) in &rows {
        assert!(
            !reason.contains(SECRET) && !reason.contains("@ada"),
            "{reason}"
        );
        assert!(
            !reason.contains("Error::") && !reason.contains("VerifyError"),
            "{reason}"
        );
    }
    assert!(
        eventually(Duration::from_secs(5), || node
            .log_text()
            .matches("delivery refused")
            .count()
            >= 8),
        "{}",
        node.log_text()
    );

    // None of them was claimed or published: the same ids go through now.
    let ok = send_github(&node, "/webhooks/github", "d-unsigned", &body);
    assert_eq!(ok.status, 202);
    assert_eq!(events(&node, "webhook_received").len(), 1);

    // No active company; no secret: 503 + Retry-After, never 200 or 4xx.
    let lone = NatsServer::start();
    let (_sb2, bare) = node_on(
        &lone,
        "edge-bare",
        Opts {
            company: false,
            secret: true,
        },
    );
    let a = send_github(&bare, "/webhooks/github", "d-x", &body);
    assert_eq!(a.status, 503);
    assert!(a.header("retry-after").is_some());
    let (_sb3, nosecret) = node_on(
        &server,
        "edge-nosecret",
        Opts {
            company: true,
            secret: false,
        },
    );
    let a = send_github(&nosecret, "/webhooks/github", "d-y", &body);
    assert_eq!(a.status, 503);
    assert!(a.header("retry-after").is_some());
}

#[test]
fn slack_url_verification_is_answered_with_the_challenge() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-slack", FULL);
    let body = br#"{"type":"url_verification","challenge":"c-123","token":"t"}"#;
    let (ts, sig) = crewlet_ingress::sign::slack_headers(SECRET.as_bytes(), body);
    let a = post(
        &node.api,
        "/webhooks/slack",
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &ts),
            ("X-Slack-Signature", &sig),
        ],
        body,
    );
    assert_eq!(a.status, 200);
    assert_eq!(a.body, b"c-123");
}

#[test]
fn a_broker_outage_during_a_delivery_is_503_and_the_retry_is_delivered_once() {
    let mut server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-outage", FULL);
    let body = comment("@ada");
    // Warm the path, so the outage hits a live edge.
    assert_eq!(
        send_github(&node, "/webhooks/github", "d-warm", &body).status,
        202
    );
    wait_events(&node, "wake_published", 1);

    server.kill();
    let a = send_github(&node, "/webhooks/github", "d-outage", &body);
    assert_eq!(a.status, 503, "{}", String::from_utf8_lossy(&a.body));
    assert!(a.header("retry-after").is_some());

    server.restart();
    server.wait_healthy(Duration::from_secs(30));
    // The sender retries as told until the node is reconnected; the claim
    // must not make the retry look like a duplicate.
    let deadline = Instant::now() + Duration::from_secs(60);
    let accepted = loop {
        let a = send_github(&node, "/webhooks/github", "d-outage", &body);
        match a.status {
            503 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(500)),
            _ => break a,
        }
    };
    assert_eq!(
        accepted.status,
        202,
        "{} {}",
        String::from_utf8_lossy(&accepted.body),
        node.log_text()
    );
    let again = send_github(&node, "/webhooks/github", "d-outage", &body);
    assert_eq!(again.json()["status"], "duplicate");

    let rt = rt();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let mut ids = Vec::new();
    assert!(eventually(Duration::from_secs(30), || {
        while let Some(w) = rt.block_on(take_wake(&client, "ada")) {
            ids.push(w["delivery_id"].as_str().unwrap().to_owned());
        }
        ids.iter().any(|i| i == "d-outage")
    }));
    std::thread::sleep(Duration::from_secs(1));
    while let Some(w) = rt.block_on(take_wake(&client, "ada")) {
        ids.push(w["delivery_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        ids.iter().filter(|i| *i == "d-outage").count(),
        1,
        "{ids:?}"
    );
}

#[test]
fn a_secret_set_through_the_api_serves_webhooks_without_a_restart() {
    let server = NatsServer::start();
    let no_secret = Opts {
        company: true,
        secret: false,
    };
    let (_sb, node) = node_on(&server, "edge-secrets", no_secret);
    let body = comment("@ada");
    let before = send_github(&node, "/webhooks/github", "sec-1", &body);
    assert_eq!(before.status, 503, "no secret yet");

    // Set through the CLI (value on stdin, trailing newline trimmed).
    let mut cli = std::process::Command::new(crewlet_bin())
        .args(["secrets", "set", "GITHUB_WEBHOOK_SECRET", "--api"])
        .env("CREWLET_TOKEN", common::http::OPERATOR_TOKEN)
        .arg(format!("http://{}", node.api))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    cli.stdin
        .take()
        .unwrap()
        .write_all(format!("{SECRET}\n").as_bytes())
        .unwrap();
    let out = cli.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(SECRET), "the CLI never prints a value");

    // Accepted at once: the node that took the write holds it already.
    let after = send_github(&node, "/webhooks/github", "sec-1", &body);
    assert_eq!(
        after.status,
        202,
        "{}",
        String::from_utf8_lossy(&after.body)
    );

    // Listed by name, never by value; the CLI shows the same.
    let listed = http::get(&node.api, "/secrets").unwrap();
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json()["secrets"][0]["name"], "GITHUB_WEBHOOK_SECRET");
    assert!(listed.json()["secrets"][0]["updated_ms"].as_u64().is_some());
    assert!(!listed.text().contains(SECRET));
    let (status, text) = run_to_exit(
        &["secrets", "list", "--api", &format!("http://{}", node.api)],
        &[],
    );
    assert!(status.success(), "{text}");
    assert!(
        text.contains("GITHUB_WEBHOOK_SECRET") && !text.contains(SECRET),
        "{text}"
    );
    assert!(!node.log_text().contains(SECRET), "a value reached the log");

    // Bad names and oversized values are refused and change nothing.
    for bad in ["1BAD", "has-dash", "a.b"] {
        let r = http::request(&node.api, "PUT", &format!("/secrets/{bad}"), &[], b"v").unwrap();
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
    }
    let big = vec![b'x'; 64 * 1024 + 1];
    let r = http::request(&node.api, "PUT", "/secrets/BIG", &[], &big).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    let r = http::request(&node.api, "PUT", "/secrets/NOT_TEXT", &[], &[0xff, 0xfe]).unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    // The one set here; the chat signing secret the node made aside.
    assert_eq!(
        http::get(&node.api, "/secrets").unwrap().json()["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| row["name"] != "chat_signing_secret")
            .count(),
        1
    );

    // A peer node on the same fleet sees it through its watch.
    let (_sb2, peer) = node_on(&server, "edge-secrets-peer", no_secret);
    assert!(
        eventually(Duration::from_secs(10), || {
            send_github(&peer, "/webhooks/github", "sec-peer", &body).status == 202
        }),
        "{}",
        peer.log_text()
    );

    // Removed: the edge answers 503 again (on both nodes, once watched).
    let r = http::request(
        &node.api,
        "DELETE",
        "/secrets/GITHUB_WEBHOOK_SECRET",
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 204, "{}", r.text());
    let r = http::request(
        &node.api,
        "DELETE",
        "/secrets/GITHUB_WEBHOOK_SECRET",
        &[],
        b"",
    )
    .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        send_github(&node, "/webhooks/github", "sec-2", &body).status,
        503
    );
    assert!(eventually(Duration::from_secs(10), || {
        send_github(&peer, "/webhooks/github", "sec-3", &body).status == 503
    }));
}

/// A node on its own embedded nats-server (no `stream.url`).
fn embedded_node(id: &str) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let port = free_port();
    let cfg = sb.config(
        port,
        &format!("[node]\nid = \"{id}\"\nroles = {NO_SEATS}\n"),
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut node = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .arg("--plugins")
        .arg(root.join("plugins"))
        .arg("--company")
        .arg(root.join("examples/company.toml"))
        .env("GITHUB_WEBHOOK_SECRET", SECRET)
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    (sb, node)
}

/// The live claim on `key` in the claims bucket, if any (a leader read).
async fn live_claim(client: &async_nats::Client, key: &str) -> Option<Value> {
    let js = async_nats::jetstream::new(client.clone());
    let stream = js.get_stream("KV_crewlet_claims").await.unwrap();
    let subject = format!(
        "$KV.crewlet_claims.{}",
        crewlet_coord::names::encode_token(key)
    );
    let m = stream
        .get_last_raw_message_by_subject(&subject)
        .await
        .ok()?;
    let removed = m
        .headers
        .get("KV-Operation")
        .is_some_and(|op| op.as_str() != "PUT");
    (!removed).then(|| serde_json::from_slice(&m.payload).unwrap())
}

/// Resumes a stopped process when dropped, so a failing test never leaves
/// a frozen broker behind.
struct Frozen(i32);

impl Frozen {
    fn stop(pid: i32) -> Frozen {
        crewlet_testkit::process::stop(pid);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn a_stalled_embedded_broker_is_503_leaves_no_claim_and_the_retry_is_delivered_once() {
    let (_sb, node) = embedded_node("edge-stalled");
    let broker = children(node.pid())
        .into_iter()
        .find(|p| cmdline(*p).contains("nats-server"))
        .unwrap_or_else(|| panic!("no nats-server child of {}", node.pid()));
    assert_eq!(broker, node.broker_pid(), "the child is the node's broker");
    let url = node.health()["stream"]["urls"][0]
        .as_str()
        .expect("the embedded broker's url")
        .to_owned();
    let body = comment("@ada");
    // Warm the path, so the stall hits a live edge.
    assert_eq!(
        send_github(&node, "/webhooks/github", "s-warm", &body).status,
        202
    );
    wait_events(&node, "wake_published", 1);

    let frozen = Frozen::stop(broker);
    let sent = Instant::now();
    let a = send_github(&node, "/webhooks/github", "s-stall", &body);
    let took = sent.elapsed();
    assert_eq!(a.status, 503, "{}", String::from_utf8_lossy(&a.body));
    assert!(a.header("retry-after").is_some());
    // The claim's request timeout and the publish's ack timeout, 5 s each.
    assert!(took < Duration::from_secs(15), "503 after {took:?}");
    drop(frozen);

    // Everything the edge wrote into the stalled connection lands now (a
    // claim that timed out included); its release follows it.
    let rt = rt();
    let client = rt
        .block_on(broker_login(&node.health()).connect(&url))
        .unwrap();
    let mut claim = None;
    let released = eventually(Duration::from_secs(30), || {
        claim = rt.block_on(live_claim(&client, "github:s-stall"));
        claim.is_none()
    });
    assert!(
        released,
        "claim left behind: {claim:?}\n{}",
        node.log_text()
    );

    // The sender retries as told: accepted, then a duplicate.
    let deadline = Instant::now() + Duration::from_secs(60);
    let accepted = loop {
        let a = send_github(&node, "/webhooks/github", "s-stall", &body);
        match a.status {
            503 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(500)),
            _ => break a,
        }
    };
    assert_eq!(
        accepted.status,
        202,
        "{} {}",
        String::from_utf8_lossy(&accepted.body),
        node.log_text()
    );
    let again = send_github(&node, "/webhooks/github", "s-stall", &body);
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["status"], "duplicate");

    // Exactly one wake for it: the stalled publish may have landed when
    // the broker resumed, and the retry's copy is the same stream message id.
    let mut ids = Vec::new();
    assert!(eventually(Duration::from_secs(30), || {
        while let Some(w) = rt.block_on(take_wake(&client, "ada")) {
            ids.push(w["delivery_id"].as_str().unwrap().to_owned());
        }
        ids.iter().any(|i| i == "s-stall")
    }));
    // Whatever else is in flight has been worked once the notify consumer
    // has nothing pending.
    assert!(eventually(Duration::from_secs(30), || {
        rt.block_on(async {
            let js = async_nats::jetstream::new(client.clone());
            let stream = js
                .get_stream(crewlet_bus::NOTIFICATIONS_STREAM)
                .await
                .unwrap();
            let info = stream
                .consumer_info(crewlet_bus::NOTIFY_DURABLE)
                .await
                .unwrap();
            info.num_pending == 0 && info.num_ack_pending == 0
        })
    }));
    while let Some(w) = rt.block_on(take_wake(&client, "ada")) {
        ids.push(w["delivery_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.iter().filter(|i| *i == "s-stall").count(), 1, "{ids:?}");
}

/// xorshift64*: deterministic, so a failing case can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn a_fuzz_pass_of_random_headers_and_bodies_never_yields_5xx() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-fuzz", FULL);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let routes = [
        "/webhooks/github",
        "/webhooks/github/ada",
        "/webhooks/slack",
        "/webhooks/unknown",
        "/webhooks/github/no%20one",
    ];
    let bodies = [
        "{}",
        "{\"action\":\"created\"}",
        "[]",
        "null",
        "{\"comment\":{\"body\":\"@ada\"},\"issue\":{\"number\":\"x\"}}",
        "{\"type\":\"url_verification\"}",
        "token=x&command=/x",
        "{\"a\":",
    ];
    let mut seen = std::collections::BTreeMap::<u16, usize>::new();
    for i in 0..300 {
        let route = rng.pick(&routes);
        let body: Vec<u8> = match rng.next() % 3 {
            0 => rng.pick(&bodies).as_bytes().to_vec(),
            1 => {
                let n = (rng.next() % 512) as usize;
                rng.bytes(n)
            }
            _ => comment(rng.pick(&["@ada", "@grace", "", "@@", "@ADA"])),
        };
        let delivery = format!("fuzz-{i}-{}", rng.next() % 4);
        let sig = match rng.next() % 3 {
            0 => github_signature(SECRET.as_bytes(), &body),
            1 => format!("sha256={}", "0".repeat(64)),
            _ => String::from_utf8_lossy(&rng.bytes(8))
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .collect(),
        };
        let event = rng.pick(&["issue_comment", "push", "", "pull_request"]);
        let ctype = rng.pick(&[
            "application/json",
            "text/plain",
            "application/x-www-form-urlencoded",
        ]);
        let mut headers = vec![
            ("Content-Type", ctype),
            ("X-Hub-Signature-256", sig.as_str()),
        ];
        if !event.is_empty() {
            headers.push(("X-GitHub-Event", event));
        }
        if !rng.next().is_multiple_of(4) {
            headers.push(("X-GitHub-Delivery", &delivery));
        }
        if rng.next().is_multiple_of(3) {
            headers.push(("X-Slack-Signature", "v0=00"));
            headers.push(("X-Slack-Request-Timestamp", "1"));
        }
        let a = post(&node.api, route, &headers, &body);
        *seen.entry(a.status).or_default() += 1;
        assert!(
            a.status < 500,
            "case {i}: {route} {headers:?} answered {}: {}",
            a.status,
            String::from_utf8_lossy(&a.body)
        );
    }
    // The pass exercised more than one answer.
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(seen.contains_key(&202), "{seen:?}");
}

#[test]
fn a_poisoned_inbound_message_is_dead_lettered_with_its_reason() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-dlq", FULL);
    let rt = rt();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let js = rt.block_on(async { async_nats::jetstream::new(client.clone()) });
    // Not a delivery the edge would ever publish: it can never succeed.
    rt.block_on(async {
        js.publish(crewlet_bus::INBOUND_SUBJECT, "this is not JSON".into())
            .await
            .unwrap()
            .await
            .unwrap();
    });
    let dead = wait_events(&node, "delivery_dead_lettered", 1);
    assert!(
        dead[0]["payload"]["reason"]
            .as_str()
            .unwrap()
            .contains("not an inbound delivery"),
        "{dead:?}"
    );
    let letter = rt.block_on(async {
        let stream = js.get_stream(crewlet_bus::DLQ_STREAM).await.unwrap();
        stream
            .get_last_raw_message_by_subject(crewlet_bus::NOTIFY_DLQ_SUBJECT)
            .await
            .expect("the dead letter is on the DLQ stream")
    });
    let letter: Value = serde_json::from_slice(&letter.payload).unwrap();
    assert_eq!(letter["original"], "this is not JSON");
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains("not an inbound delivery")
    );
    // Dead-lettered, not retried: the group has nothing left.
    let info = rt.block_on(async {
        js.get_stream(crewlet_bus::NOTIFICATIONS_STREAM)
            .await
            .unwrap()
            .consumer_info(crewlet_bus::NOTIFY_DURABLE)
            .await
            .unwrap()
    });
    assert_eq!(
        info.num_pending + info.num_ack_pending as u64,
        0,
        "{info:?}"
    );
}

#[test]
fn a_closed_valve_delays_a_wake_and_never_drops_it() {
    let server = NatsServer::start();
    let (_sb, node) = node_on(&server, "edge-valve", FULL);
    let limit = crewlet_ingress::notify::VALVE_LIMIT as usize;
    for i in 0..=limit {
        let answer = send_github(
            &node,
            "/webhooks/github",
            &format!("v-{i}"),
            &comment("@linus"),
        );
        assert_eq!(answer.status, 202, "delivery {i}");
    }
    // The valve admits `limit` wakes in this window; the one over it is
    // delayed until a later window, then woken — never dead-lettered.
    let window = crewlet_ingress::notify::VALVE_WINDOW;
    let rt = rt();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let all_woken = eventually(window + Duration::from_secs(15), || {
        rt.block_on(pending(&client, "linus")) as usize == limit + 1
    });
    assert!(
        all_woken,
        "wakes pending: {}",
        rt.block_on(pending(&client, "linus"))
    );
    assert!(events(&node, "delivery_dead_lettered").is_empty());
    assert_eq!(events(&node, "wake_published").len(), limit + 1);
}
