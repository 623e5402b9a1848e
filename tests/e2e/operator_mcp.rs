//! `/operator/mcp` end to end: the real binary, its embedded broker, the
//! scripted provider and a real chat child per seat, driven by rmcp's
//! streamable HTTP client and by the official MCP inspector CLI (installed
//! into `.tools/npm/inspector` by `scripts/bootstrap.sh --browser`).

use crate::common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::time::Duration;

use common::{Node, Sandbox};
use crewlet_testkit::PluginsDir;
use crewlet_testkit::http::{OPERATOR_TOKEN, request_exact};
use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

/// `ada` answers through the scripted model; `mute` calls a model server
/// that accepts connections and never answers.
fn company(chat_log: &str) -> String {
    format!(
        r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{{ provider = "scripted", model = "demo", options = {{ steps = [
  {{ call = "chat__post_message", args = {{ channel = "{{{{wake.channel}}}}", thread = "{{{{wake.thread}}}}", text = "Hello from {{{{wake.handle}}}}!" }} }},
  {{ call = "submit_work", args = {{ outcome = "delivered", summary = "replied" }} }},
] }} }}]
reviewer = {{ provider = "scripted", model = "demo-review", options = {{ steps = [
  {{ call = "submit_review", args = {{ verdict = "done" }} }},
] }} }}
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {chat_log:?} }}
replies = ["post_message"]
[roles.silent]
system_prompt = "You never get to answer."
executor = [{{ provider = "openai", model = "hang", credentials = "${{KEY_ONE}}" }}]
reviewer = {{ provider = "openai", model = "hang", credentials = "${{KEY_ONE}}" }}
[seats]
ada = {{ role = "support" }}
mute = {{ role = "silent" }}
"#
    )
}

struct World {
    sb: Sandbox,
    node: Node,
    _hang: TcpListener,
}

fn start() -> World {
    let sb = Sandbox::new();
    // Accepts connections (the kernel's backlog) and never answers.
    let hang = TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", hang.local_addr().unwrap());
    let dir = PluginsDir::new(sb.path("plugins"));
    dir.add("scripted", "plugins/providers/scripted/plugin.toml")
        .add_provider_at(
            "openai",
            "plugins/providers/openai/plugin.toml",
            &format!("{origin}/v1"),
            &origin,
        );
    let company_file = sb.path("company.toml");
    std::fs::write(
        &company_file,
        company(&sb.path("chat.jsonl").display().to_string()),
    )
    .unwrap();
    let mut node = sb
        .node("[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n")
        .arg("--company")
        .arg(&company_file)
        .arg("--plugins")
        .arg(dir.path())
        .env("KEY_ONE", "sk-test-never-used")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    World {
        sb,
        node,
        _hang: hang,
    }
}

/// The one way these tests reach `/operator/mcp`; `token` becomes a bearer.
async fn operator(node: &Node, token: Option<&str>) -> RunningService<RoleClient, ClientConfig> {
    let mut headers = HashMap::new();
    if let Some(t) = token {
        headers.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
    }
    let url = format!("http://{}/operator/mcp", node.api);
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    ClientConfig::default()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP handshake with /operator/mcp")
}

/// Calls `tool`: Ok(the JSON it answered) or Err(its error text).
async fn call(
    client: &RunningService<RoleClient, ClientConfig>,
    tool: &str,
    args: Value,
) -> Result<Value, String> {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    let result = client.call_tool(params).await.expect("tools/call answered");
    let text: String = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n");
    if result.is_error == Some(true) {
        Err(text)
    } else {
        Ok(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{tool}: {e}: {text}")))
    }
}

fn seat<'v>(seats: &'v Value, handle: &str) -> &'v Value {
    seats["seats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["seat"] == handle)
        .unwrap_or_else(|| panic!("no {handle} in {seats}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_catalogue_lists_messages_pauses_and_reads_budgets() {
    let w = start();
    // Guarded like every operator route: no token, no catalogue.
    let refused = request_exact(
        &w.node.api,
        "POST",
        "/operator/mcp",
        &[("host", "127.0.0.1"), ("content-type", "application/json")],
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    )
    .unwrap();
    assert_eq!(refused.status, 401, "{}", refused.text());
    let client = operator(&w.node, Some(OPERATOR_TOKEN)).await;
    let tools = client.list_all_tools().await.unwrap();
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "budgets",
            "list_seats",
            "pause_seat",
            "resume_seat",
            "seat_turns",
            "send_message"
        ]
    );

    // Both seats get held here (one node).
    let mut seats = Value::Null;
    for _ in 0..300 {
        seats = call(&client, "list_seats", json!({})).await.unwrap();
        if ["ada", "mute"]
            .iter()
            .all(|h| seat(&seats, h)["holder"]["state"] == "here")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seat(&seats, "ada")["holder"]["state"], "here", "{seats}");
    assert_eq!(seat(&seats, "ada")["pause"]["paused"], false);
    assert_eq!(seat(&seats, "ada")["turn"]["in_turn"], false);

    // A message enters as a trigger and comes back with the seat's reply.
    let answer = call(
        &client,
        "send_message",
        json!({"seat": "ada", "text": "are you there?", "timeout_seconds": 60}),
    )
    .await
    .unwrap();
    assert_eq!(answer["outcome"], "delivered", "{answer}");
    assert_eq!(answer["replies"][0]["text"], "Hello from ada!", "{answer}");
    let trace = answer["trace_id"].as_str().unwrap().to_owned();
    // ...through the normal path: the edge recorded it, the chat child posted.
    let received = common::events(&w.node, "webhook_received");
    assert!(
        received
            .iter()
            .any(|e| e["trace_id"] == trace.as_str() && e["payload"]["source"] == "operator"),
        "{received:?}"
    );
    let chat = std::fs::read_to_string(w.sb.path("chat.jsonl")).unwrap();
    assert!(
        chat.contains("Hello from ada!") && chat.contains("\"operator\""),
        "{chat}"
    );

    let turns = call(&client, "seat_turns", json!({"seat": "ada"}))
        .await
        .unwrap();
    assert_eq!(turns["turns"][0]["turn_id"], answer["turn_id"], "{turns}");
    assert_eq!(turns["turns"][0]["outcome"], "delivered");

    // Pause and resume write and remove the fleet's record.
    let paused = call(
        &client,
        "pause_seat",
        json!({"seat": "ada", "reason": "maintenance"}),
    )
    .await
    .unwrap();
    assert_eq!(paused["paused"], true);
    let seats = call(&client, "list_seats", json!({})).await.unwrap();
    assert_eq!(seat(&seats, "ada")["pause"]["paused"], true, "{seats}");
    assert_eq!(
        seat(&seats, "ada")["pause"]["record"]["reason"],
        "maintenance"
    );
    let resumed = call(&client, "resume_seat", json!({"seat": "ada"}))
        .await
        .unwrap();
    assert_eq!(resumed["was_paused"], true);
    let again = call(&client, "resume_seat", json!({"seat": "ada"}))
        .await
        .unwrap();
    assert_eq!(again["was_paused"], false);

    let budgets = call(&client, "budgets", json!({})).await.unwrap();
    let scopes: Vec<&str> = budgets["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["scope"].as_str().unwrap())
        .collect();
    assert!(
        scopes.contains(&"company") && scopes.contains(&"seat:ada"),
        "{budgets}"
    );
    client.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_are_clear_tool_errors_and_an_unanswered_message_still_stands() {
    let w = start();
    let client = operator(&w.node, Some(OPERATOR_TOKEN)).await;

    for (tool, args) in [
        ("send_message", json!({"seat": "nobody", "text": "hi"})),
        ("seat_turns", json!({"seat": "nobody"})),
        ("pause_seat", json!({"seat": "nobody"})),
        ("resume_seat", json!({"seat": "nobody"})),
    ] {
        let err = call(&client, tool, args).await.unwrap_err();
        assert!(
            err.contains("no seat `nobody`") && err.contains("ada, mute"),
            "{tool}: {err}"
        );
    }
    let err = call(
        &client,
        "send_message",
        json!({"seat": "ada", "text": "hi", "timeout_seconds": 0}),
    )
    .await
    .unwrap_err();
    assert!(err.contains("timeout_seconds"), "{err}");
    let err = call(
        &client,
        "send_message",
        json!({"seat": "ada", "text": "  "}),
    )
    .await
    .unwrap_err();
    assert!(err.contains("`text`"), "{err}");

    // `mute`'s model never answers: the wait ends as a tool error naming
    // the message, and the message is on the stream, its turn under way.
    let err = call(
        &client,
        "send_message",
        json!({"seat": "mute", "text": "hello?", "timeout_seconds": 3}),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("did not finish a turn") && err.contains("the message stands"),
        "{err}"
    );
    let trace = err
        .split_whitespace()
        .skip_while(|w| *w != "message")
        .nth(1)
        .unwrap()
        .to_owned();
    let received = common::events(&w.node, "webhook_received");
    assert!(
        received.iter().any(|e| e["trace_id"] == trace.as_str()),
        "{trace} not received: {received:?}"
    );
    let started = common::wait_events(&w.node, "turn_started", 1);
    assert!(
        started.iter().any(|e| e["seat"] == "mute"),
        "the seat took the message: {started:?}"
    );
    let seats = call(&client, "list_seats", json!({})).await.unwrap();
    assert_eq!(seat(&seats, "mute")["turn"]["in_turn"], true, "{seats}");

    // A drain does not wait out a long wait: the call ends, the message stands.
    let client = std::sync::Arc::new(client);
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            call(
                &client,
                "send_message",
                json!({"seat": "mute", "text": "still there?", "timeout_seconds": 600}),
            )
            .await
        })
    };
    common::wait_events(&w.node, "webhook_received", 2);
    w.node.signal(libc::SIGTERM);
    let err = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the wait ended with the drain")
        .unwrap()
        .unwrap_err();
    assert!(
        err.contains("began draining") && err.contains("the message stands"),
        "{err}"
    );
}

/// The inspector's CLI, installed by `scripts/bootstrap.sh --browser`.
fn inspector() -> PathBuf {
    let bin: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        ".tools/npm/inspector/node_modules/.bin/mcp-inspector",
    ]
    .iter()
    .collect();
    assert!(
        bin.exists(),
        "{} is missing: run `scripts/bootstrap.sh --browser` (it installs @modelcontextprotocol/inspector)",
        bin.display()
    );
    bin
}

/// Runs the inspector CLI against the node; answers its stdout as JSON.
fn inspect(w: &World, token: Option<&str>, args: &[&str]) -> Value {
    let mut cmd = std::process::Command::new(inspector());
    cmd.arg("--cli")
        .arg(format!("http://{}/operator/mcp", w.node.api))
        .args(["--transport", "http"]);
    if let Some(t) = token {
        cmd.arg("--header")
            .arg(format!("Authorization: Bearer {t}"));
    }
    cmd.args(args)
        .env("MCP_CATALOG_PATH", w.sb.path("inspector-catalog.json"));
    let out = cmd.output().expect("run the inspector");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "inspector {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn the_official_inspector_lists_and_calls_the_tools() {
    let w = start();
    let tools = inspect(&w, Some(OPERATOR_TOKEN), &["--method", "tools/list"]);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{tools}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"send_message") && names.contains(&"list_seats"),
        "{tools}"
    );
    let answer = inspect(
        &w,
        Some(OPERATOR_TOKEN),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "send_message",
            "--tool-arg",
            "seat=ada",
            "text=ping",
            "timeout_seconds=60",
        ],
    );
    let text = answer["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    let reply: Value = serde_json::from_str(text).unwrap();
    assert_eq!(reply["replies"][0]["text"], "Hello from ada!", "{reply}");
}
