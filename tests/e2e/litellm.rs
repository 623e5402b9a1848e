//! A third-party OpenAI-compatible server behind an operator grant: the
//! OpenAI plugin exactly as shipped (its manifest says api.openai.com),
//! granted LiteLLM's proxy (PyPI `litellm[proxy]`, pinned, run by the test
//! with mock models) by the node's configuration, completes a seat's turn
//! there — the executor's reply and submission, the reviewer's verdict —
//! and the seat's reply is posted. The same node restarted without the
//! grant calls the manifest's host again: the turn fails, its failure and
//! the node's log name that host, and the proxy hears nothing.
//!
//! LiteLLM's mock answers every call to a model with the same message, so
//! the executor's model answers the reply and `submit_work` in one message
//! (the turn loop runs a message's calls in order), and the reviewer's is
//! its own model.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::eventually;
use crate::turns::{self, outcomes};
use crewlet_testkit::PluginsDir;
use crewlet_testkit::litellm::{LiteLlm, MASTER_KEY, MockModel};

const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "openai", model = "exec", credentials = "${LITELLM_KEY}" }]
reviewer = { provider = "openai", model = "review", credentials = "${LITELLM_KEY}" }
max_iterations = 1
max_tool_rounds = 2
{chat}
[seats]
ada = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

const REPLY: &str = "Hi, ada here, through LiteLLM.";

fn models() -> [MockModel; 2] {
    [
        MockModel::new("exec", "Replied in the thread.")
            .call(
                "chat__post_message",
                json!({"channel": "C1", "thread": "1.1", "text": REPLY}),
            )
            .call(
                "submit_work",
                json!({"outcome": "delivered", "summary": "answered ada's mention"}),
            ),
        MockModel::new("review", "Reviewed.")
            .call("submit_review", json!({"verdict": "done", "feedback": ""})),
    ]
}

#[test]
fn a_granted_provider_completes_a_turn_through_litellm_and_without_the_grant_names_the_host() {
    let mut proxy = LiteLlm::spawn(&models());
    let grant = format!(
        "[plugins.grants.openai]\nbase_url = \"{}\"\n",
        proxy.base_url()
    );
    let envs = [("LITELLM_KEY", MASTER_KEY)];
    let mut w = turns::start_custom(COMPANY, &envs, &grant, |sb| {
        PluginsDir::new(sb.path("plugins"))
            .add("slack", "plugins/webhooks/slack/plugin.toml")
            .add("openai", "plugins/providers/openai/plugin.toml");
    });
    proxy.wait_ready(Duration::from_secs(120));

    w.mention("ada", "EvL1", "C1", "1.1", "<@ada> hello?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"], "{}", proxy.log_text());
    let posts = w.posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(
        (
            &posts[0]["as"],
            &posts[0]["channel"],
            &posts[0]["thread"],
            &posts[0]["text"]
        ),
        (&json!("ada"), &json!("C1"), &json!("1.1"), &json!(REPLY))
    );
    let mut calls = w.events("model_call");
    calls.reverse();
    let said: Vec<(&Value, &Value)> = calls
        .iter()
        .map(|e| (&e["payload"]["model"], &e["payload"]["tool_calls"]))
        .collect();
    // The model each answer names is LiteLLM's deployment it routed to.
    assert_eq!(
        said,
        [
            (
                &json!("openai/exec"),
                &json!(["chat__post_message", "submit_work"])
            ),
            (&json!("openai/review"), &json!(["submit_review"])),
        ]
    );
    assert!(
        eventually(Duration::from_secs(10), || proxy.completions() == 2),
        "LiteLLM answered both calls: {:?}",
        proxy.served()
    );
    // The usage LiteLLM reported is what the turn counted.
    let ended = &w.events("turn_ended")[0]["payload"];
    for side in ["input_tokens", "output_tokens"] {
        let per_call: u64 = calls
            .iter()
            .map(|e| e["payload"][side].as_u64().unwrap_or(0))
            .sum();
        assert!(per_call > 0, "{side}: {calls:?}");
        assert_eq!(ended[side].as_u64(), Some(per_call), "{side}: {ended}");
    }

    w.node.signal(libc::SIGTERM);
    assert!(w.node.wait_exit(Duration::from_secs(30)).success());
    w.restart_with(&envs, "");
    w.mention("ada", "EvL2", "C1", "2.1", "<@ada> still there?");
    w.wait_events("turn_ended", 2);
    assert_eq!(outcomes(&w), ["delivered", "llm_unavailable"]);
    let host = "calling https://api.openai.com:443";
    let down = w.wait_events("llm_unavailable", 1)[0].to_string();
    assert!(down.contains(host), "{down}");
    let failed = &w.events("turn_ended")[0]["payload"];
    assert!(
        failed["detail"].as_str().is_some_and(|d| d.contains(host)),
        "the turn's failure reason names the host: {failed}"
    );
    assert!(
        eventually(Duration::from_secs(10), || w.node.log_text().contains(host)),
        "the node's log names the host: {}",
        w.node.log_text()
    );
    assert_eq!(w.posts().len(), 1, "nothing more was posted");
    assert_eq!(
        proxy.completions(),
        2,
        "without the grant nothing reached LiteLLM: {:?}",
        proxy.served()
    );
}
