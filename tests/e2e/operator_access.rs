//! Who gets in: operator tokens on every route, the `Host` allow-list, a
//! guarded bind, and an HTTP edge that holds under abuse — all against the
//! real binary.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::http::{OPERATOR_TOKEN, request_exact};
use common::*;
use crewlet_testkit::{NatsServer, free_port};

const READY: Duration = Duration::from_secs(30);

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// GET `path` on `node` with exactly this Authorization (or none).
fn get_as(node: &Node, path: &str, auth: Option<&str>) -> http::Response {
    let mut headers = vec![("Host", node.api.as_str())];
    if let Some(a) = auth {
        headers.push(("Authorization", a));
    }
    request_exact(&node.api, "GET", path, &headers, b"").expect("the node answers")
}

fn create_token(node: &Node, body: &str) -> serde_json::Value {
    let r = http::request(
        &node.api,
        "POST",
        "/tokens",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

#[test]
fn first_start_makes_an_admin_token_prints_a_login_url_and_the_cli_uses_it() {
    let sb = Sandbox::new();
    let mut node = sb.node("").env_remove("CREWLET_BOOTSTRAP_TOKEN").spawn();
    node.wait_ready(READY);

    let file = sb.data_dir().join("operator.token");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is the owner's alone");
    let token = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    assert!(token.starts_with("crw_") && token.len() >= 40, "{token}");
    let log = node.log_text();
    let url = format!("http://{}/#token={token}", node.api);
    assert_eq!(log.matches(&url).count(), 1, "the login URL once: {log}");
    assert!(
        !log.contains(&format!("?token={token}")),
        "never in a query"
    );

    let refused = get_as(&node, "/org", None);
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert_eq!(refused.json()["scope_needed"], "read");
    assert_eq!(get_as(&node, "/events", Some(&bearer(&token))).status, 200);

    // The CLI finds the token in the data dir with nothing copied.
    let api = format!("http://{}", node.api);
    let data = sb.data_dir();
    let (status, out) = run_to_exit(
        &[
            "tokens", "create", "--scope", "read", "--name", "ci", "--api", &api,
        ],
        &[
            ("CREWLET_TOKEN", ""),
            ("CREWLET_DATA_DIR", data.to_str().unwrap()),
        ],
    );
    assert!(status.success(), "{out}");
    let made: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let read = made["token"].as_str().unwrap();
    assert_eq!(get_as(&node, "/events", Some(&bearer(read))).status, 200);
    let (status, out) = run_to_exit(
        &["tokens", "list", "--api", &api],
        &[("CREWLET_TOKEN", read)],
    );
    assert!(!status.success(), "listing needs admin: {out}");
    assert!(out.contains("403") && out.contains("admin"), "{out}");
    let (status, out) = run_to_exit(
        &["tokens", "list", "--api", &api],
        &[
            ("CREWLET_TOKEN", ""),
            ("CREWLET_DATA_DIR", data.to_str().unwrap()),
        ],
    );
    assert!(status.success(), "{out}");
    assert!(
        out.contains("\"ci\"") && !out.contains(read),
        "no value is ever listed: {out}"
    );

    // A restart finds the fleet's admin token: no second one, no banner.
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(20)).code(), Some(0));
    let mut again = sb.node("").env_remove("CREWLET_BOOTSTRAP_TOKEN").spawn();
    again.wait_ready(READY);
    assert!(
        !again.log_text().contains("#token="),
        "{}",
        again.log_text()
    );
    assert_eq!(get_as(&again, "/events", Some(&bearer(&token))).status, 200);
}

#[test]
fn bad_credentials_and_foreign_hosts_are_refused_naming_what_is_needed() {
    let sb = Sandbox::new();
    let mut node = sb.node("").spawn();
    node.wait_ready(READY);

    for bad in [
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer two words",
        "crw_no_scheme",
    ] {
        let r = get_as(&node, "/events", Some(bad));
        assert_eq!(r.status, 401, "{bad}: {}", r.text());
        assert_eq!(r.json()["status"], "unauthorized");
    }
    let unknown = get_as(
        &node,
        "/events",
        Some("Bearer crw_not-a-token-this-fleet-issued"),
    );
    assert_eq!(unknown.status, 401);
    assert!(
        unknown.json()["error"]
            .as_str()
            .unwrap()
            .contains("not one this fleet issued")
    );

    let short = create_token(&node, r#"{"scope":"write","ttl_seconds":1}"#);
    let short = bearer(short["token"].as_str().unwrap());
    assert_eq!(get_as(&node, "/events", Some(&short)).status, 200);
    assert!(
        eventually(Duration::from_secs(5), || get_as(
            &node,
            "/events",
            Some(&short)
        )
        .status
            == 401),
        "a 1 s token expires"
    );
    assert!(
        get_as(&node, "/events", Some(&short)).json()["error"]
            .as_str()
            .unwrap()
            .contains("expired")
    );

    let read = create_token(&node, r#"{"scope":"read"}"#);
    let read = bearer(read["token"].as_str().unwrap());
    let put = request_exact(
        &node.api,
        "PUT",
        "/secrets/SOME_NAME",
        &[("Host", &node.api), ("Authorization", &read)],
        b"v",
    )
    .unwrap();
    assert_eq!(put.status, 403, "{}", put.text());
    assert_eq!(put.json()["scope_needed"], "write");
    let bad_create =
        http::request(&node.api, "POST", "/tokens", &[], br#"{"scope":"root"}"#).unwrap();
    assert_eq!(bad_create.status, 400, "{}", bad_create.text());

    // DNS rebinding: a page's own name in Host, even with a valid token.
    let evil = request_exact(
        &node.api,
        "GET",
        "/events",
        &[
            ("Host", "evil.example.com"),
            ("Authorization", &bearer(OPERATOR_TOKEN)),
        ],
        b"",
    )
    .unwrap();
    assert_eq!(evil.status, 403, "{}", evil.text());
    assert_eq!(evil.json()["header"], "host");
    let hook = request_exact(
        &node.api,
        "POST",
        "/webhooks/github",
        &[("Host", "hooks.example.com")],
        b"{}",
    )
    .unwrap();
    assert_ne!(
        hook.status,
        403,
        "webhooks answer public names: {}",
        hook.text()
    );
    assert_ne!(hook.status, 401, "webhooks verify their own signatures");
    assert_eq!(
        get_as(&node, "/health", None).status,
        200,
        "probes need no token"
    );
}

#[test]
fn a_token_revoked_on_one_node_is_refused_on_its_peer_within_seconds() {
    let server = NatsServer::start();
    let start = |id: &str| {
        let sb = Sandbox::new();
        let port = free_port();
        let cfg = sb.config(
            port,
            &format!(
                "[node]\nid = \"{id}\"\n[stream]\nurl = \"{}\"\n",
                server.url()
            ),
        );
        let mut node = NodeBuilder::new(&sb, port)
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(sb.data_dir())
            .spawn();
        node.wait_ready(READY);
        (sb, node)
    };
    let (_sa, a) = start("tok-a");
    let (_sb, b) = start("tok-b");
    let made = create_token(&a, r#"{"scope":"write","name":"peer"}"#);
    let token = bearer(made["token"].as_str().unwrap());
    assert!(
        eventually(Duration::from_secs(5), || get_as(
            &b,
            "/events",
            Some(&token)
        )
        .status
            == 200),
        "a token made on A works on B"
    );
    let id = made["id"].as_str().unwrap();
    let revoked = http::request(&a.api, "DELETE", &format!("/tokens/{id}"), &[], b"").unwrap();
    assert_eq!(revoked.status, 200, "{}", revoked.text());
    let t0 = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || get_as(
            &b,
            "/events",
            Some(&token)
        )
        .status
            == 401),
        "B refuses a token revoked on A"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(
        get_as(&b, "/events", Some(&token)).json()["error"]
            .as_str()
            .unwrap()
            .contains("revoked")
    );
    let again = http::request(&a.api, "DELETE", "/tokens/no-such-id", &[], b"").unwrap();
    assert_eq!(again.status, 404);
}

#[test]
fn a_non_loopback_bind_without_allowed_hosts_or_a_weak_token_seed_is_refused_at_start() {
    let sb = Sandbox::new();
    let cfg = sb.path("node.toml");
    std::fs::write(&cfg, "[api]\nhost = \"0.0.0.0\"\nport = 0\n").unwrap();
    let data = sb.data_dir();
    let (status, out) = run_to_exit(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(
        out.contains("api.host") && out.contains("api.allowed_hosts"),
        "{out}"
    );
    assert!(
        dir_is_absent_or_empty(&data),
        "refused before the disk is touched"
    );
}

#[test]
fn a_slow_loris_socket_is_closed_by_the_header_timeout_while_others_are_served() {
    let sb = Sandbox::new();
    // `Sandbox::node` writes the `[api]` table first: bare keys land in it.
    let mut node = sb.node("header_timeout_seconds = 1\n").spawn();
    node.wait_ready(READY);

    let mut slow = TcpStream::connect(&node.api).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let t0 = Instant::now();
    let mut closed = None;
    while t0.elapsed() < Duration::from_secs(8) {
        // One header byte every 200 ms: never a complete head.
        if slow.write_all(b"X").is_err() {
            closed = Some(t0.elapsed());
            break;
        }
        let mut buf = [0u8; 512];
        match slow.read(&mut buf) {
            Ok(0) => {
                closed = Some(t0.elapsed());
                break;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => {
                closed = Some(t0.elapsed());
                break;
            }
        }
        assert_eq!(
            node.get("/health").map(|r| r.status),
            Some(200),
            "others are served meanwhile"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed = closed.expect("the slow socket is closed");
    assert!(
        closed >= Duration::from_millis(900) && closed < Duration::from_secs(5),
        "closed after {closed:?}"
    );
}

/// Reads one HTTP/1.1 response with a Content-Length off a kept-alive socket.
fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "closed mid-response: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                return (status, body[..len].to_owned());
            }
        }
    }
}

#[test]
fn past_the_connection_cap_a_fast_503_while_an_established_flow_still_answers() {
    let sb = Sandbox::new();
    let mut node = sb.node("max_connections = 4\n").spawn();
    node.wait_ready(READY);
    let probe = |s: &mut TcpStream| {
        s.write_all(format!("GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", node.api).as_bytes())
            .unwrap();
        read_response(s)
    };
    let mut flow = TcpStream::connect(&node.api).unwrap();
    flow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(probe(&mut flow).0, 200);
    let idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&node.api).unwrap())
        .collect();

    let mut refused_in = None;
    let ok = eventually(Duration::from_secs(5), || {
        let t0 = Instant::now();
        let r = node.get("/health");
        if r.as_ref().map(|r| r.status) == Some(503) {
            assert!(r.unwrap().text().contains("over_capacity"));
            refused_in = Some(t0.elapsed());
            true
        } else {
            false
        }
    });
    assert!(ok, "a fifth connection past a cap of 4 gets a 503");
    assert!(
        refused_in.unwrap() < Duration::from_millis(500),
        "{refused_in:?}"
    );
    assert_eq!(
        probe(&mut flow).0,
        200,
        "the established flow is still served"
    );
    drop(idle);
    assert!(
        eventually(Duration::from_secs(5), || node
            .get("/health")
            .map(|r| r.status)
            == Some(200)),
        "room again once the idle sockets close"
    );
}

#[test]
fn with_the_store_unreachable_unknown_tokens_stay_refused_and_known_ones_keep_their_standing() {
    let mut server = NatsServer::start();
    let sb = Sandbox::new();
    let port = free_port();
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"cut-off\"\n[stream]\nurl = \"{}\"\n",
            server.url()
        ),
    );
    let mut node = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir())
        .spawn();
    node.wait_ready(READY);
    let known = create_token(&node, r#"{"scope":"read","name":"known"}"#);
    let known = bearer(known["token"].as_str().unwrap());

    server.kill();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        let stranger = get_as(
            &node,
            "/events",
            Some("Bearer crw_never-issued-by-anyone-at-all"),
        );
        assert!(
            stranger.status == 401 || stranger.status == 503,
            "an unreachable store is never an accept: {} {}",
            stranger.status,
            stranger.text()
        );
        assert_eq!(
            get_as(&node, "/events", Some(&known)).status,
            200,
            "known token keeps its standing"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let made = http::request(
        &node.api,
        "POST",
        "/tokens",
        &[("content-type", "application/json")],
        br#"{"scope":"read"}"#,
    )
    .unwrap();
    assert_eq!(
        made.status,
        503,
        "nothing is made while the store is away: {}",
        made.text()
    );
    assert!(made.header("retry-after").is_some());

    server.restart();
    server.wait_healthy(Duration::from_secs(20));
    assert!(
        eventually(Duration::from_secs(30), || http::request(
            &node.api,
            "POST",
            "/tokens",
            &[("content-type", "application/json")],
            br#"{"scope":"read"}"#,
        )
        .is_ok_and(|r| r.status == 201)),
        "tokens are made again once the store is back"
    );
}

#[test]
fn an_open_dashboard_socket_keeps_its_place_under_the_connection_cap() {
    let sb = Sandbox::new();
    let mut node = sb.node("max_connections = 2\n").spawn();
    node.wait_ready(READY);
    let stream = TcpStream::connect(&node.api).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (mut ws, _) = tungstenite::client(ws_stream_request(&node.api), stream).unwrap();
    let hello = ws.read().expect("hello");
    assert!(hello.to_text().unwrap().contains("hello"), "{hello:?}");
    let _idle = TcpStream::connect(&node.api).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || node
            .get("/health")
            .map(|r| r.status)
            == Some(503)),
        "the socket and the idle connection fill a cap of 2"
    );
    drop(ws);
    drop(_idle);
    assert!(
        eventually(Duration::from_secs(5), || node
            .get("/health")
            .map(|r| r.status)
            == Some(200)),
        "the places come back when they close"
    );
}
