//! A real third-party server from npm, `@modelcontextprotocol/server-everything`
//! (installed under tests/mcp-servers by scripts/bootstrap.sh), over stdio
//! and over streamable HTTP.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use crewlet_company::{McpServer, McpTransport};
use crewlet_mcp::{McpError, McpOptions, SeatTools, ServerState, SharedChildren};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The package's entry point; a missing install fails loudly, never skips.
fn everything() -> String {
    let entry: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "../../tests/mcp-servers/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
    ]
    .iter()
    .collect();
    assert!(
        entry.exists(),
        "{} is missing: install the test MCP servers with `./dev test` (or `scripts/bootstrap.sh`, \
         which runs `npm ci` in tests/mcp-servers)",
        entry.display()
    );
    entry.display().to_string()
}

fn opts() -> McpOptions {
    McpOptions {
        start_timeout: Duration::from_secs(30),
        call_timeout: Duration::from_secs(2),
        policy: test_policy(),
        ..McpOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_stdio() {
    let entry = everything();
    let role = BTreeMap::from([(
        "everything".to_owned(),
        stdio(
            "node",
            &[&entry, "stdio"],
            &[("SEAT_MARK", "${MARK}"), ("PRICE", "$$5")],
        ),
    )]);
    let shared = SharedChildren::new(opts());
    let seat = SeatTools::start(
        "ana",
        &role,
        &shared,
        resolver(&[("MARK", "ana-mark-1")]),
        &opts(),
    )
    .await
    .expect("no credential is unknown here");
    let servers = seat.servers();
    let tools = match &summary(&servers, "everything").state {
        ServerState::Started { tools } => *tools,
        other => panic!("server-everything did not start: {other:?}"),
    };
    assert!(tools >= 10, "{tools} tools");
    assert!(summary(&servers, "everything").instructions.is_some());
    let listed = seat.tools("everything").unwrap();
    let echo = listed
        .iter()
        .find(|t| t.name == "echo")
        .expect("an echo tool");
    assert_eq!(
        echo.description.as_deref(),
        Some("Echoes back the input string")
    );
    assert_eq!(echo.input_schema["properties"]["message"]["type"], "string");

    let answer = seat
        .call(
            "everything",
            "echo",
            json!({"message": "hello from crewlet"}),
        )
        .await
        .unwrap();
    assert_eq!(answer.text, "Echo: hello from crewlet");
    assert!(!answer.is_error);

    // The child sees its spec's env, substituted, and not the node's own.
    let env = seat.call("everything", "get-env", json!({})).await.unwrap();
    let env: serde_json::Value = serde_json::from_str(&env.text).unwrap();
    assert_eq!(env["SEAT_MARK"], "ana-mark-1");
    assert_eq!(env["PRICE"], "$5");
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some() && env.get("CARGO_MANIFEST_DIR").is_none(),
        "the node's environment must not reach a child: {env}"
    );

    // A tool slower than the call timeout: a clear timeout, then the server
    // still answers.
    match seat
        .call(
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 30, "steps": 2}),
        )
        .await
    {
        Err(McpError::CallTimeout { timeout, .. }) => assert_eq!(timeout, Duration::from_secs(2)),
        other => panic!("expected CallTimeout, got {other:?}"),
    }
    let answer = seat
        .call("everything", "echo", json!({"message": "still here"}))
        .await
        .unwrap();
    assert_eq!(answer.text, "Echo: still here");

    let pid = pid_of(&servers, "everything");
    seat.shutdown().await;
    assert!(!process_exists(pid), "node child stopped and reaped");
}

/// server-everything's HTTP mode, as a real server on a loopback port.
struct HttpEverything {
    child: tokio::process::Child,
    url: String,
}

impl HttpEverything {
    async fn start() -> HttpEverything {
        let entry = everything();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let mut child = tokio::process::Command::new("node")
            .args([&entry, "streamableHttp"])
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("run node");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("listening on port") {
                    return true;
                }
                eprintln!("server-everything: {line}");
            }
            false
        })
        .await
        .expect("server-everything listens within 30 s");
        assert!(ready, "server-everything exited before listening");
        // Keep draining stderr so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HttpEverything {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_over_streamable_http() {
    let mut server = HttpEverything::start().await;
    let role = BTreeMap::from([
        (
            "everything".to_owned(),
            McpServer {
                transport: McpTransport::Http {
                    url: server.url.clone(),
                    headers: BTreeMap::from([(
                        "Authorization".to_owned(),
                        "Bearer ${SEAT_TOKEN}".to_owned(),
                    )]),
                },
                shared: false,
                replies: Vec::new(),
                surface: Default::default(),
            },
        ),
        (
            "unresolved".to_owned(),
            McpServer {
                transport: McpTransport::Http {
                    url: server.url.clone(),
                    headers: BTreeMap::from([(
                        "Authorization".to_owned(),
                        "Bearer ${MISSING_TOKEN}".to_owned(),
                    )]),
                },
                shared: false,
                replies: Vec::new(),
                surface: Default::default(),
            },
        ),
        (
            "nobody-home".to_owned(),
            McpServer {
                transport: McpTransport::Http {
                    url: "http://127.0.0.1:9/mcp".to_owned(),
                    headers: BTreeMap::new(),
                },
                shared: false,
                replies: Vec::new(),
                surface: Default::default(),
            },
        ),
    ]);
    let shared = SharedChildren::new(opts());
    let seat = SeatTools::start(
        "ana",
        &role,
        &shared,
        resolver(&[("SEAT_TOKEN", "ana-http-token")]),
        &opts(),
    )
    .await
    .expect("no credential is unknown here");
    let servers = seat.servers();
    assert!(
        matches!(
            summary(&servers, "everything").state,
            ServerState::Started { .. }
        ),
        "{servers:?}"
    );
    assert_eq!(summary(&servers, "everything").pid, None);
    let reason = failure(&servers, "unresolved");
    assert!(reason.contains("headers.Authorization"), "{reason}");
    let reason = failure(&servers, "nobody-home");
    assert!(reason.contains("127.0.0.1:9"), "{reason}");
    assert!(reason.len() <= crewlet_mcp::REASON_MAX);

    let answer = seat
        .call("everything", "echo", json!({"message": "over http"}))
        .await
        .unwrap();
    assert_eq!(answer.text, "Echo: over http");

    // The server goes away: calls fail clearly, never hang.
    server.child.kill().await.unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        seat.call("everything", "echo", json!({"message": "anyone?"})),
    )
    .await
    .expect("no hang after the server died");
    match answer {
        Err(e @ McpError::ServerGone { .. }) => assert!(e.to_string().contains(&server.url), "{e}"),
        other => panic!("expected ServerGone, got {other:?}"),
    }
    seat.shutdown().await;
}
