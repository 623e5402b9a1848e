//! A failed tool call says why, through the real binary: in the turn's
//! `tool_call` event (and so in `GET /turns/{id}`), in the node's log, and
//! to the model, whose next request carries the reason; a turn whose owed
//! reply failed is never `delivered`. The failure is the one a newcomer
//! met: the chat child's log file in a folder that does not exist.

use crate::common;
use crate::turns::{KEYS, outcomes, post, start, submit, verdict};

use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::Value;

/// The OpenAI company of `turns`, its chat log in a folder never made.
const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "openai", model = "exec-a", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review", credentials = "${KEY_TWO}" }
max_iterations = 2
max_tool_rounds = 6
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = { CHAT_IDENTITY = "${CREWLET_SEAT}", CHAT_LOG = "CHAT_LOG_PATH.missing/chat.jsonl" }
replies = ["post_message"]
[seats]
ada = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

#[test]
fn a_failed_reply_is_explained_to_the_model_the_turn_and_the_log_and_is_not_delivered() {
    let ai = ScriptedOpenAi::start();
    let w = start(COMPANY, Some(&ai), KEYS);
    ai.reply("exec-a", post("C1", "17.1", "Hi, ada here."));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("exec-a", submit("blocked"));
    ai.reply("review", verdict("failed"));
    w.mention("ada", "Ev1", "C1", "17.1", "<@ada> can you help?");
    let ended = w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["failed"], "{}", w.node.log_text());
    assert!(w.posts().is_empty());

    // The turn's own rows say which call failed and why.
    let turn_id = ended[0]["payload"]["turn_id"].as_str().unwrap();
    let detail = w.node.get(&format!("/turns/{turn_id}")).unwrap().json();
    let calls: Vec<&Value> = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool_call")
        .collect();
    let failed = calls
        .iter()
        .find(|e| e["payload"]["tool"] == "chat__post_message")
        .unwrap_or_else(|| panic!("no post in {detail}"));
    assert_eq!(failed["payload"]["ok"], false, "{failed}");
    let error = failed["payload"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("chat__post_message failed: ")
            && error.contains("could not write the chat log"),
        "{failed}"
    );

    // The log, at WARN, with the seat and the reason.
    let log = w.node.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("a tool call failed"))
        .unwrap_or_else(|| panic!("no log line for the failed call:\n{log}"));
    assert!(
        line.contains("WARN")
            && line.contains("ada")
            && line.contains("could not write the chat log"),
        "{line}"
    );

    // The model read the reason as the post's answer, then the refusal of
    // its claim of delivery.
    let second = ai
        .requests()
        .iter()
        .filter(|r| r.model == "exec-a")
        .nth(1)
        .map(|r| r.messages.to_string())
        .unwrap();
    assert!(
        second.contains("chat__post_message failed: could not write the chat log"),
        "{second}"
    );
    let third = ai
        .requests()
        .iter()
        .filter(|r| r.model == "exec-a")
        .nth(2)
        .map(|r| r.messages.to_string())
        .unwrap();
    assert!(third.contains("Refused: you claim delivery"), "{third}");
    assert!(common::events(&w.node, "reply_posted").is_empty());
}
