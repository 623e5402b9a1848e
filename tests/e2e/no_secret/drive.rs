//! What the test does to the node: Slack mentions signed with a given
//! secret, and turns whose model replies are scripted in order.

use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use serde_json::json;

use crate::common::{Node, http, wait_events};

/// A Slack `app_mention` to `handle` signed with `secret`; answers the status.
pub fn mention(node: &Node, secret: &str, handle: &str, event_id: &str, ts: &str) -> u16 {
    let body = json!({
        "type": "event_callback", "event_id": event_id, "team_id": "T1",
        "event": {"type": "app_mention", "user": "U1", "text": "<@x> help", "channel": "C1", "ts": ts},
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(secret.as_bytes(), body.as_bytes());
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Slack-Request-Timestamp", now.as_str()),
        ("X-Slack-Signature", sig.as_str()),
    ];
    let path = format!("/webhooks/slack/{handle}");
    http::post(&node.api, &path, &headers, body.as_bytes())
        .expect("POST a webhook")
        .status
}

pub fn post(ts: &str) -> Reply {
    Reply::ToolCalls(vec![(
        "chat__post_message".into(),
        json!({"channel": "C1", "thread": ts, "text": "on it"}),
    )])
}

pub fn submit() -> Reply {
    Reply::ToolCalls(vec![(
        "submit_work".into(),
        json!({"outcome": "delivered", "summary": "replied"}),
    )])
}

pub fn verdict() -> Reply {
    Reply::ToolCalls(vec![(
        "submit_review".into(),
        json!({"verdict": "done", "feedback": ""}),
    )])
}

/// One turn for `handle` (the `n`th of the node's life), the models
/// answering `script` in order; it must end delivered.
pub fn turn(
    node: &Node,
    ai: &ScriptedOpenAi,
    hook: &str,
    handle: &str,
    n: usize,
    script: Vec<(&str, Reply)>,
) {
    for (model, reply) in script {
        ai.reply(model, reply);
    }
    let ts = format!("{n}.1");
    assert_eq!(
        mention(node, hook, handle, &format!("Ev{n}{handle}"), &ts),
        202
    );
    let ended = wait_events(node, "turn_ended", n);
    assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{}", ended[0]);
}
