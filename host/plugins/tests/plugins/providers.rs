//! Provider plugins against a local HTTP server speaking each vendor's wire
//! format: success with tool calls, 429 with Retry-After, 401, 500, a
//! malformed body, and a redirect to a host the manifest does not allow.

use crate::common;

use std::sync::{Arc, Mutex};

use common::{manifest_text, runtime};
use crewlet_plugins::provider::{
    Credential, ErrorKind, Message, ProviderPlugin, Request, Role, Tool, ToolCall, ToolChoice,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request the server received.
#[derive(Debug, Clone)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A canned answer: status, extra headers, body.
type Canned = (u16, Vec<(String, String)>, String);

/// A loopback HTTP/1.1 server answering each connection with the next
/// canned response and recording what it was sent.
struct VendorServer {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<Vec<Canned>>>,
}

impl VendorServer {
    async fn start() -> VendorServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let script: Arc<Mutex<Vec<Canned>>> = Arc::default();
        let (s, sc) = (seen.clone(), script.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let (s, sc) = (s.clone(), sc.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let head_end = loop {
                        let n = conn.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let mut lines = head.split("\r\n");
                    let request_line = lines.next().unwrap_or_default().to_string();
                    let headers: Vec<(String, String)> = lines
                        .filter_map(|l| l.split_once(':'))
                        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
                        .collect();
                    let length: usize = headers
                        .iter()
                        .find(|(n, _)| n == "content-length")
                        .and_then(|(_, v)| v.parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        let n = conn.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let body = String::from_utf8_lossy(&buf[head_end..]).to_string();
                    s.lock().unwrap().push(Seen {
                        request_line,
                        headers,
                        body,
                    });
                    let (status, extra, body) = {
                        let mut script = sc.lock().unwrap();
                        if script.is_empty() {
                            (500, vec![], "{}".to_string())
                        } else {
                            script.remove(0)
                        }
                    };
                    if status == 0 {
                        // A vendor that never answers.
                        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                        return;
                    }
                    let mut response = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                        body.len()
                    );
                    for (n, v) in extra {
                        response.push_str(&format!("{n}: {v}\r\n"));
                    }
                    response.push_str("\r\n");
                    response.push_str(&body);
                    let _ = conn.write_all(response.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        VendorServer { port, seen, script }
    }

    fn answer(&self, status: u16, headers: &[(&str, &str)], body: &str) {
        self.script.lock().unwrap().push((
            status,
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body.to_string(),
        ));
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn plugin(kind: &str, port: u16) -> (ProviderPlugin, tempfile::TempDir) {
    plugin_with_deadline(kind, port, 10_000)
}

fn plugin_with_deadline(
    kind: &str,
    port: u16,
    deadline_ms: u64,
) -> (ProviderPlugin, tempfile::TempDir) {
    let (rt, data) = runtime();
    let path = if kind == "openai" {
        "/v1"
    } else {
        "/anthropic/v1"
    };
    let m = manifest_text(
        &format!("providers/{kind}"),
        &format!(
            "name = \"{kind}\"\nversion = \"0.1.0\"\nkind = \"provider\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_provider_{kind}.wasm\"\n[limits]\ndeadline_ms = {deadline_ms}\n[provider]\nbase_url = \"http://127.0.0.1:{port}{path}\"\nallowed_outbound_hosts = [\"http://127.0.0.1:{port}\"]\n"
        ),
    );
    (
        ProviderPlugin::load(&rt, m).unwrap_or_else(|e| panic!("{e}")),
        data,
    )
}

fn request() -> Request {
    Request {
        base_url: "https://ignored.example.com".into(),
        model: "test-model".into(),
        messages: vec![
            Message {
                role: Role::System,
                content: "be brief".into(),
                tool_calls: vec![],
                tool_call_id: None,
            },
            Message {
                role: Role::User,
                content: "weather in Oslo?".into(),
                tool_calls: vec![],
                tool_call_id: None,
            },
            Message {
                role: Role::Assistant,
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c0".into(),
                    name: "clock".into(),
                    arguments_json: "{}".into(),
                }],
                tool_call_id: None,
            },
            Message {
                role: Role::Tool,
                content: "12:00".into(),
                tool_calls: vec![],
                tool_call_id: Some("c0".into()),
            },
        ],
        tools: vec![Tool {
            name: "weather".into(),
            description: "current weather".into(),
            parameters_schema_json: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#
                .into(),
        }],
        tool_choice: ToolChoice::Named("weather".into()),
        max_tokens: 256,
        credential: Credential {
            api_key: "sk-test-0123456789".into(),
        },
        options_json: "{}".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_success_with_tool_calls_and_the_request_it_sent() {
    let server = VendorServer::start().await;
    server.answer(200, &[("x-request-id", "req_abc")], r#"{"id":"chatcmpl-1","choices":[{"index":0,"finish_reason":"tool_calls",
        "message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]}}],
        "usage":{"prompt_tokens":31,"completion_tokens":9}}"#);
    let (p, _d) = plugin("openai", server.port);
    let done = p.complete(request()).await.unwrap().unwrap();
    assert_eq!(done.text, None);
    assert_eq!(
        done.tool_calls,
        vec![ToolCall {
            id: "call_1".into(),
            name: "weather".into(),
            arguments_json: r#"{"city":"Oslo"}"#.into()
        }]
    );
    assert_eq!((done.usage.input_tokens, done.usage.output_tokens), (31, 9));
    assert_eq!(done.stop_reason, "tool_calls");
    assert_eq!(done.request_id.as_deref(), Some("req_abc"));

    let seen = &server.seen()[0];
    assert_eq!(seen.request_line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(
        seen.header("authorization"),
        Some("Bearer sk-test-0123456789")
    );
    let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap();
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(body["tool_choice"]["function"]["name"], "weather");
    assert_eq!(
        body["tools"][0]["function"]["parameters"]["properties"]["city"]["type"],
        "string"
    );
    assert_eq!(body["messages"][2]["tool_calls"][0]["id"], "c0");
    assert_eq!(body["messages"][3]["tool_call_id"], "c0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reuse_the_plugins_connection_and_each_carries_its_own_key() {
    let vendor = crewlet_testkit::ScriptedOpenAi::start();
    for text in ["one", "two", "three"] {
        vendor.reply("test-model", crewlet_testkit::Reply::Text(text.into()));
    }
    let (p, _d) = plugin("openai", vendor.port());
    let mut answers = Vec::new();
    for key in [
        "sk-first-000000001",
        "sk-second-00000002",
        "sk-third-000000003",
    ] {
        let mut req = request();
        req.credential.api_key = key.into();
        answers.push(p.complete(req).await.unwrap().unwrap().text);
        // The connection goes back to the pool once the client's own task
        // has seen the response end; calls of a turn are that far apart.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        answers,
        ["one", "two", "three"].map(|t| Some(t.to_owned())).to_vec()
    );
    let seen = vendor.requests();
    assert_eq!(seen.len(), 3);
    // One connection for the three calls (fresh instances each time), and
    // every request carried the key of its own call.
    assert!(
        seen.iter().all(|r| r.peer == seen[0].peer),
        "{:?}",
        seen.iter().map(|r| r.peer).collect::<Vec<_>>()
    );
    assert_eq!(
        seen.iter()
            .map(|r| r.bearer.clone().unwrap())
            .collect::<Vec<_>>(),
        [
            "sk-first-000000001",
            "sk-second-00000002",
            "sk-third-000000003"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_failures_are_classified_and_redacted() {
    let server = VendorServer::start().await;
    let (p, _d) = plugin("openai", server.port);
    let url = format!("http://127.0.0.1:{}/v1", server.port);

    server.answer(429, &[("retry-after", "7"), ("x-request-id", "req_429")], r#"{"error":{"message":"Rate limit reached for sk-test-0123456789","code":"rate_limit_exceeded"}}"#);
    let e = p.complete(request()).await.unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::RateLimited(Some(7000)));
    assert_eq!(
        (e.status, e.request_id.as_deref()),
        (Some(429), Some("req_429"))
    );
    assert!(!e.message.contains("sk-test-0123456789"), "{}", e.message);

    server.answer(401, &[], &format!(r#"{{"error":{{"message":"Incorrect API key provided at {url}","code":"invalid_api_key"}}}}"#));
    let e = p.complete(request()).await.unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    // The vendor's echo of the URL is redacted; the host names the origin
    // it called (scheme, host, port: no path, no query) after it.
    let origin = format!("http://127.0.0.1:{}", server.port);
    assert!(
        !e.message.contains(&url)
            && e.message.ends_with(&format!("(calling {origin})"))
            && e.message.matches("127.0.0.1").count() == 1,
        "the URL must be redacted, the origin named: {}",
        e.message
    );

    server.answer(400, &[], r#"{"error":{"message":"maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#);
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::ContextTooLong
    );

    server.answer(500, &[], "<html>upstream exploded</html>");
    let e = p.complete(request()).await.unwrap().unwrap_err();
    assert_eq!((e.kind, e.status), (ErrorKind::Transient, Some(500)));
    assert!(
        !e.message.contains("exploded"),
        "never the raw body: {}",
        e.message
    );

    server.answer(200, &[], r#"{"choices":"#);
    let e = p.complete(request()).await.unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transient);
    assert!(e.message.contains("not a chat completion"), "{}", e.message);
    assert_eq!(
        p.health().total_faults,
        0,
        "classified failures are not faults"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_a_host_not_allowed_is_denied_and_logged() {
    let server = VendorServer::start().await;
    let (p, _d) = plugin("openai", server.port);
    // Same host, other port: a different origin.
    let elsewhere = format!("http://127.0.0.1:{}/steal", server.port.wrapping_add(1));
    server.answer(302, &[("location", &elsewhere)], "");
    let e = p.complete(request()).await.unwrap().unwrap_err();
    assert_eq!(e.kind, ErrorKind::RequestDenied, "{e:?}");
    let denied = format!("http://127.0.0.1:{}", server.port.wrapping_add(1));
    assert_eq!(p.denied_origins(), vec![format!("{denied}")]);
    assert_eq!(server.seen().len(), 1, "the denied hop never left the host");

    // A redirect within the allowed origin is followed.
    let same = format!("http://127.0.0.1:{}/v1/moved", server.port);
    server.answer(307, &[("location", &same)], "");
    server.answer(200, &[], r#"{"choices":[{"finish_reason":"stop","message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}"#);
    let done = p.complete(request()).await.unwrap().unwrap();
    assert_eq!(done.text.as_deref(), Some("hi"));
    assert_eq!(server.seen()[2].request_line, "POST /v1/moved HTTP/1.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_success_and_failures() {
    let server = VendorServer::start().await;
    let (p, _d) = plugin("anthropic", server.port);
    server.answer(200, &[("request-id", "req_011")], r#"{"id":"msg_1","type":"message","role":"assistant","stop_reason":"tool_use",
        "content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Oslo"}}],
        "usage":{"input_tokens":40,"output_tokens":12}}"#);
    let done = p.complete(request()).await.unwrap().unwrap();
    assert_eq!(done.text.as_deref(), Some("Checking."));
    assert_eq!(done.tool_calls[0].name, "weather");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&done.tool_calls[0].arguments_json).unwrap()["city"],
        "Oslo"
    );
    assert_eq!(
        (done.usage.input_tokens, done.usage.output_tokens),
        (40, 12)
    );
    assert_eq!(
        (done.stop_reason.as_str(), done.request_id.as_deref()),
        ("tool_use", Some("req_011"))
    );
    let seen = &server.seen()[0];
    assert_eq!(seen.request_line, "POST /anthropic/v1/messages HTTP/1.1");
    assert_eq!(seen.header("x-api-key"), Some("sk-test-0123456789"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap();
    assert_eq!(body["system"], "be brief");
    assert_eq!(
        body["tool_choice"],
        serde_json::json!({"type": "tool", "name": "weather"})
    );
    assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(body["messages"][2]["content"][0]["tool_use_id"], "c0");

    server.answer(
        429,
        &[("retry-after", "3")],
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
    );
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::RateLimited(Some(3000))
    );
    server.answer(
        401,
        &[],
        r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
    );
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::Auth
    );
    server.answer(
        529,
        &[("request-id", "req_529")],
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
    );
    let e = p.complete(request()).await.unwrap().unwrap_err();
    assert_eq!(
        (e.kind, e.request_id.as_deref()),
        (ErrorKind::Overloaded, Some("req_529"))
    );
    server.answer(400, &[], r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#);
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::ContextTooLong
    );
    server.answer(
        500,
        &[],
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
    );
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::Transient
    );
    server.answer(200, &[], "not json at all");
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::Transient
    );
    let evil = "http://evil.example:80/x".to_string();
    server.answer(308, &[("location", &evil)], "");
    assert_eq!(
        p.complete(request()).await.unwrap().unwrap_err().kind,
        ErrorKind::RequestDenied
    );
    assert_eq!(
        p.denied_origins(),
        vec!["http://evil.example:80".to_string()]
    );
}

/// The SDK's one classifier, through both real components: each vendor's
/// documented body for a failure, and the other vendor's, gives the same
/// kind from both plugins (a context-window error was `bad-request` in one
/// and `context-too-long` in the other when each kept its own table).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_and_anthropic_classify_the_same_failure_the_same_way() {
    let failures: &[(u16, &str, &str)] = &[
        (
            400,
            "context-too-long",
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130314 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        ),
        (
            400,
            "context-too-long",
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210345 tokens > 200000 maximum"}}"#,
        ),
        (
            400,
            "context-too-long",
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000, decrease input length or `max_tokens` and try again"}}"#,
        ),
        (
            400,
            "context-too-long",
            r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}"#,
        ),
        (
            529,
            "overloaded",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        (
            503,
            "overloaded",
            r#"{"error":{"message":"The engine is currently overloaded, please try again later.","type":"server_error","param":null,"code":null}}"#,
        ),
        (
            402,
            "auth",
            r#"{"type":"error","error":{"type":"billing_error","message":"Your credit balance is too low."}}"#,
        ),
        (
            429,
            "auth",
            r#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
        ),
        (
            504,
            "transient",
            r#"{"type":"error","error":{"type":"timeout_error","message":"Request timed out"}}"#,
        ),
        (
            400,
            "bad-request",
            r#"{"error":{"message":"Unrecognized request argument supplied: temperatur","type":"invalid_request_error","param":null,"code":null}}"#,
        ),
    ];
    let server = VendorServer::start().await;
    let (openai, _d1) = plugin("openai", server.port);
    let (anthropic, _d2) = plugin("anthropic", server.port);
    for (status, expected, body) in failures {
        for (vendor, p) in [("openai", &openai), ("anthropic", &anthropic)] {
            server.answer(*status, &[], body);
            let e = p.complete(request()).await.unwrap().unwrap_err();
            let kind = match e.kind {
                ErrorKind::ContextTooLong => "context-too-long",
                ErrorKind::Overloaded => "overloaded",
                ErrorKind::Auth => "auth",
                ErrorKind::Transient => "transient",
                ErrorKind::BadRequest => "bad-request",
                _ => "other",
            };
            assert_eq!(
                (kind, e.status),
                (*expected, Some(*status)),
                "{vendor} on {body}: {e:?}"
            );
        }
    }
}

/// A vendor that never answers cuts every call at its deadline, and each
/// is the host's to answer for, not the plugin's: past the breaker's five
/// faults in its window the plugin is still not quarantined, and answers
/// the moment the vendor does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_while_the_vendor_is_slow_does_not_trip_the_breaker() {
    let server = VendorServer::start().await;
    let (p, _d) = plugin_with_deadline("openai", server.port, 200);
    for _ in 0..7 {
        server.answer(0, &[], "");
    }
    for _ in 0..7 {
        let err = p
            .complete(request())
            .await
            .expect_err("a vendor that never answers times the call out");
        assert!(
            matches!(err.fault(), Some(crewlet_plugins::Fault::Timeout { .. })),
            "{err:?}"
        );
        assert_eq!(err.blame(), crewlet_plugins::Blame::Host, "{err:?}");
    }
    let report = p.health();
    assert_eq!(
        report.breaker,
        crewlet_plugins::BreakerState::Closed,
        "{report:?}"
    );
    assert_eq!(
        (report.total_faults, report.host_faults),
        (0, 7),
        "{report:?}"
    );
    answers_again(&p, &server).await;
}

/// The vendor answers in time again: the plugin's next call (on a fresh
/// instance) gets the answer.
async fn answers_again(p: &ProviderPlugin, server: &VendorServer) {
    server.answer(
        200,
        &[],
        r#"{"choices":[{"finish_reason":"stop","message":{"content":"ok"}}],"usage":{}}"#,
    );
    assert_eq!(
        p.complete(request())
            .await
            .unwrap()
            .unwrap()
            .text
            .as_deref(),
        Some("ok")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_covers_time_spent_waiting_in_host_calls() {
    let server = VendorServer::start().await;
    let (p, _d) = plugin_with_deadline("openai", server.port, 400);
    server.answer(0, &[], "");
    let started = std::time::Instant::now();
    let err = p
        .complete(request())
        .await
        .expect_err("a vendor that never answers times the call out");
    assert_eq!(
        err.fault(),
        Some(&crewlet_plugins::Fault::Timeout {
            deadline: std::time::Duration::from_millis(400)
        })
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The next call works on a fresh instance.
    answers_again(&p, &server).await;
}
