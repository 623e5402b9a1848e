//! The company chat through the real binary (`docs/chat.md`): a person's
//! "@grace hello" posted over the API wakes grace through the webhook edge,
//! and she answers in its thread through her own chat child, as herself,
//! her working indicator raised then cleared; a follow-up in the thread
//! with no mention is answered; her own replies wake nobody; a read token's
//! post, a badly signed delivery and a seat credential the node did not
//! mint are refused and store nothing; the
//! other node of the fleet shows the same conversation, and a restarted
//! node still does.

use crate::common;

use std::time::Duration;

use common::*;
use crewlet_testkit::{NatsServer, PluginsDir, http};
use serde_json::{Value, json};

/// `grace` answers in the thread that woke her, through the company chat.
const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "scripted", model = "demo", options = { steps = [
  { call = "chat__post_message", args = { channel = "{{wake.channel}}", thread = "{{wake.thread}}", text = "Hello from {{wake.handle}}!" } },
  { call = "submit_work", args = { outcome = "delivered", summary = "replied" } },
] } }]
reviewer = { provider = "scripted", model = "demo-review", options = { steps = [
  { call = "submit_review", args = { verdict = "done" } },
] } }
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = { CHAT_URL = "${CREWLET_CHAT_URL}", CHAT_TOKEN = "${CREWLET_CHAT_TOKEN}" }
replies = ["post_message"]
[seats]
grace = { role = "support" }
[integrations.chat]
plugin = "chat-webhook"
secret = "chat_signing_secret"
"#;

const MESSAGES: &str = "/chat/channels/general/messages";

/// A token of `scope` named `name`, made with the test's admin token.
fn token(node: &Node, scope: &str, name: &str) -> String {
    let body = json!({ "scope": scope, "name": name }).to_string();
    let r = http::post(&node.api, "/tokens", &[], body.as_bytes()).expect("POST /tokens");
    assert!(r.status == 200 || r.status == 201, "{}", r.text());
    r.json()["token"]
        .as_str()
        .expect("a token value")
        .to_owned()
}

/// A post to #general with `token`.
fn post(node: &Node, token: &str, body: Value) -> http::Response {
    let bearer = format!("Bearer {token}");
    http::post(
        &node.api,
        MESSAGES,
        &[
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
    .expect("POST a message")
}

/// `path`'s messages, oldest first.
fn messages(node: &Node, path: &str) -> Vec<Value> {
    let r = node.get(path).expect("GET messages");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["messages"].as_array().cloned().unwrap_or_default()
}

/// Waits until `thread` of #general holds `n` messages by grace.
fn grace_replied(node: &Node, thread: &str, n: usize) -> Vec<Value> {
    let path = format!("{MESSAGES}?thread={thread}");
    let mut got = Vec::new();
    let ok = eventually(Duration::from_secs(30), || {
        got = messages(node, &path);
        got.iter().filter(|m| m["author"] == "grace").count() >= n
    });
    assert!(
        ok,
        "grace did not reply {n} times in {thread}: {got:?}\n{}",
        node.log_text()
    );
    got
}

/// Asserts the delivery of grace's message `id` woke nobody: it was hers.
fn woke_nobody(node: &Node, id: &str) {
    let mut unrouted = Vec::new();
    let seen = eventually(Duration::from_secs(30), || {
        unrouted = events(node, "delivery_unrouted")
            .into_iter()
            .filter(|e| e["payload"]["delivery_id"] == id)
            .collect();
        !unrouted.is_empty()
    });
    assert!(
        seen,
        "grace's message {id} was never routed: {}",
        node.log_text()
    );
    assert_eq!(
        unrouted[0]["payload"]["authored_by"], "grace",
        "{}",
        unrouted[0]
    );
}

#[test]
fn a_mention_posted_over_the_api_is_answered_in_its_thread_by_the_seat_fleet_wide() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    PluginsDir::new(sb.path("plugins"))
        .add("chat", "plugins/modules/chat/plugin.toml")
        .add("chat-webhook", "plugins/webhooks/chat/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    std::fs::write(sb.path("company.toml"), COMPANY).unwrap();
    let spawn = |id: &str| {
        let mut n = sb.fleet_node(id, &[server.url()], "").spawn();
        n.wait_ready(Duration::from_secs(60));
        n
    };
    let mut a = spawn("chat-a");
    let ana = token(&a, "write", "ana");
    let rita = token(&a, "read", "rita");

    // A person mentions grace at the top of #general: the message is ana's.
    let r = post(&a, &ana, json!({ "text": "@grace hello" }));
    assert_eq!(r.status, 201, "{}\n{}", r.text(), a.log_text());
    let asked = r.json();
    assert_eq!(
        (&asked["author"], &asked["thread"]),
        (&json!("ana"), &Value::Null),
        "{asked}"
    );
    assert!(asked.get("undelivered").is_none(), "{asked}");
    let thread = asked["id"].as_str().unwrap().to_owned();

    // She answers in its thread, as herself, having shown she was working.
    let first = grace_replied(&a, &thread, 1);
    assert_eq!(
        first[0]["id"],
        thread.as_str(),
        "the thread opens with the question"
    );
    let reply = first
        .iter()
        .find(|m| m["author"] == "grace")
        .unwrap()
        .clone();
    assert_eq!(
        (&reply["thread"], &reply["text"]),
        (&json!(thread), &json!("Hello from grace!"))
    );
    let working = wait_events(&a, "module.chat.working", 2);
    let mut changes: Vec<&Value> = working.iter().map(|e| &e["payload"]).collect();
    changes.reverse();
    assert_eq!(
        changes
            .iter()
            .map(|c| c["working"].as_bool())
            .collect::<Vec<_>>(),
        [Some(true), Some(false)],
        "{changes:?}"
    );
    assert!(
        changes
            .iter()
            .all(|c| c["seat"] == "grace" && c["thread"] == thread.as_str())
    );
    let top = messages(&a, MESSAGES);
    assert_eq!(top.len(), 1, "{top:?}");
    assert_eq!(top[0]["replies"], 1, "{top:?}");
    // Her own reply, delivered back through the edge, woke nobody.
    woke_nobody(&a, reply["id"].as_str().unwrap());

    // A follow-up in the thread, naming nobody, is hers by follow.
    let r = post(
        &a,
        &ana,
        json!({ "text": "and what about ARM?", "thread": thread }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let both = grace_replied(&a, &thread, 2);
    let second = both.iter().rfind(|m| m["author"] == "grace").unwrap();
    woke_nobody(&a, second["id"].as_str().unwrap());
    let wakes = events(&a, "wake_published");
    assert_eq!(
        wakes.len(),
        2,
        "grace was woken twice, by the mention and the follow: {wakes:?}"
    );
    assert_eq!(wakes[0]["payload"]["reason"], "follow", "{}", wakes[0]);

    // A read token may read, not post; a badly signed delivery is refused.
    assert_eq!(
        post(&a, &rita, json!({ "text": "@grace psst" })).status,
        403
    );
    let forged = json!({ "id": "0000000000001-ana-ffffffff", "channel": "general",
        "thread": null, "author": "ana", "text": "@grace forged", "at_ms": 1 })
    .to_string();
    let (now, _) = crewlet_ingress::sign::chat_headers(b"not the secret", forged.as_bytes());
    let bad_sig = crewlet_ingress::sign::chat_signature(b"not the secret", &now, forged.as_bytes());
    let r = http::post(
        &a.api,
        "/webhooks/chat",
        &[
            ("Content-Type", "application/json"),
            ("X-Chat-Timestamp", &now),
            ("X-Chat-Signature", &bad_sig),
        ],
        forged.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 401, "{}", r.text());
    // Nor may anyone pass for grace with a credential the node did not mint.
    let r = post(&a, "crewlet-chat.grace.00ff", json!({ "text": "as grace" }));
    assert_eq!(r.status, 401, "{}", r.text());
    let stored = messages(&a, &format!("{MESSAGES}?thread={thread}"));
    assert_eq!(stored.len(), 4, "nothing was stored by either: {stored:?}");
    assert_eq!(messages(&a, MESSAGES).len(), 1);

    // The fleet's other node shows the same conversation; so does this one
    // after a restart.
    let b = spawn("chat-b");
    assert_eq!(messages(&b, &format!("{MESSAGES}?thread={thread}")), stored);
    a.signal(libc::SIGTERM);
    assert!(
        a.wait_exit(Duration::from_secs(60)).success(),
        "{}",
        a.log_text()
    );
    let a = spawn("chat-a");
    assert_eq!(messages(&a, &format!("{MESSAGES}?thread={thread}")), stored);
    let channels = a.get("/chat/channels").unwrap().json();
    assert_eq!(channels["channels"][0]["name"], "general", "{channels}");
    assert_eq!(channels["channels"][0]["messages"], 4, "{channels}");
    drop(b);
}
