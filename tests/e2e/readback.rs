//! The thread read back and the working indicator, through the real binary:
//! a seat woken inside a Slack thread reads the thread through its own
//! chat MCP child (`crewlet mcp chat`) before its first model call, and
//! shows it is working there until its turn ends; a read-back that fails
//! leaves the turn to run without it.

use crate::common;
use crate::turns::{KEYS, OPENAI_COMPANY, World, outcomes, post, start, submit, verdict};

use common::company::SLACK_SECRET;
use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::{Value, json};

/// What people said in thread `C1#17.1` before the seat was asked.
const EARLIER: &[(&str, &str)] = &[
    ("U7", "The nightly deploy failed at the migrate step."),
    ("bob", "Second time this week: the cache volume is full."),
];

/// Writes the thread's earlier messages into the chat log, as the chat
/// server stores them.
fn earlier_messages(w: &World) {
    let lines: String = EARLIER
        .iter()
        .enumerate()
        .map(|(i, (who, text))| {
            let m = json!({"as": who, "channel": "C1", "thread": "17.1", "text": text, "at_ms": 1000 + i});
            format!("{m}\n")
        })
        .collect();
    std::fs::write(w.sb.path("chat.jsonl"), lines).unwrap();
}

/// A Slack `app_mention` of `handle` posted inside thread `C1#17.1`.
fn mention_in_thread(w: &World, handle: &str, event_id: &str, text: &str) {
    let body = json!({
        "type": "event_callback",
        "event_id": event_id,
        "team_id": "T1",
        "event": {"type": "app_mention", "user": "U7", "text": text, "channel": "C1",
                  "ts": "17.9", "thread_ts": "17.1"},
    })
    .to_string();
    let r =
        common::post_slack_event(&w.node.api, SLACK_SECRET, handle, &body).expect("POST webhook");
    common::assert_accepted(&w.node, &r);
}

/// The lines of a JSON-lines file that parse (a corrupt line is skipped).
fn json_lines(path: &std::path::Path) -> Vec<Value> {
    let bytes = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The executor's first request to the model, as the server received it.
fn first_executor_request(ai: &ScriptedOpenAi) -> String {
    ai.requests()
        .iter()
        .find(|r| r.model == "exec-a")
        .map(|r| r.messages.to_string())
        .expect("the executor asked the model")
}

fn answers_in_thread(ai: &ScriptedOpenAi) {
    ai.reply(
        "exec-a",
        post("C1", "17.1", "Clearing the cache volume now."),
    );
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
}

#[test]
fn a_seat_woken_in_a_thread_reads_it_back_and_shows_it_is_working_until_its_turn_ends() {
    let ai = ScriptedOpenAi::start();
    let w = start(OPENAI_COMPANY, Some(&ai), KEYS);
    earlier_messages(&w);
    answers_in_thread(&ai);
    mention_in_thread(&w, "ada", "Ev1", "<@ada> can you fix it?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);

    // The thread's earlier messages were in the executor's very first
    // request, as its chat server read them.
    let first = first_executor_request(&ai);
    for (who, text) in EARLIER {
        assert!(first.contains(&format!("{who}: {text}")), "{first}");
    }
    let read = w.events("thread_read");
    assert_eq!(read.len(), 1, "{read:?}");
    let p = &read[0]["payload"];
    assert_eq!(
        (&p["status"], &p["server"], &p["tool"], &p["messages"]),
        (
            &json!("read"),
            &json!("chat"),
            &json!("read_thread"),
            &json!(2)
        ),
        "{p}"
    );

    // The indicator: raised as ada in the thread, cleared after her reply.
    let working = json_lines(&w.sb.path("chat.working.jsonl"));
    let changes: Vec<(&Value, &Value, &Value, &Value)> = working
        .iter()
        .map(|c| (&c["as"], &c["channel"], &c["thread"], &c["working"]))
        .collect();
    let (ada, c1, t) = (json!("ada"), json!("C1"), json!("17.1"));
    assert_eq!(
        changes,
        [
            (&ada, &c1, &t, &json!(true)),
            (&ada, &c1, &t, &json!(false))
        ],
        "{working:?}"
    );
    let posts = json_lines(&w.sb.path("chat.jsonl"));
    let reply = posts.last().expect("ada's reply");
    assert_eq!(reply["as"], "ada");
    let at = |v: &Value| v["at_ms"].as_u64().unwrap();
    assert!(
        at(&working[0]) <= at(reply) && at(reply) <= at(&working[1]),
        "the indicator was up while she replied: {working:?} {reply}"
    );
    let states: Vec<Value> = w
        .events("working_indicator")
        .iter()
        .rev()
        .map(|e| e["payload"]["state"].clone())
        .collect();
    assert_eq!(states, [json!("raised"), json!("cleared")]);
}

#[test]
fn a_thread_read_back_that_fails_leaves_the_turn_to_run_without_it_and_says_so() {
    let ai = ScriptedOpenAi::start();
    let w = start(OPENAI_COMPANY, Some(&ai), KEYS);
    // The chat's store holds a line that is not text: the server can still
    // post (it reads lines as bytes), but no longer read a thread.
    earlier_messages(&w);
    let mut log = std::fs::read(w.sb.path("chat.jsonl")).unwrap();
    log.extend_from_slice(b"\xff\xfe not text\n");
    std::fs::write(w.sb.path("chat.jsonl"), log).unwrap();
    answers_in_thread(&ai);
    mention_in_thread(&w, "ada", "Ev2", "<@ada> can you fix it?");
    w.wait_events("turn_ended", 1);
    assert_eq!(
        outcomes(&w),
        ["delivered"],
        "the turn ran without the thread"
    );

    let read = w.events("thread_read");
    assert_eq!(read.len(), 1, "{read:?}");
    let p = &read[0]["payload"];
    assert_eq!(p["status"], "failed", "{p}");
    let error = p["error"].as_str().unwrap_or_default();
    assert!(error.contains("could not read the chat log"), "{p}");
    let first = first_executor_request(&ai);
    assert!(!first.contains(EARLIER[0].1), "{first}");
    let posts = json_lines(&w.sb.path("chat.jsonl"));
    assert_eq!(
        posts.last().map(|p| (&p["as"], &p["text"])),
        Some((&json!("ada"), &json!("Clearing the cache volume now.")))
    );
}

#[test]
fn a_server_mapped_without_the_tools_is_done_without_and_the_events_say_so() {
    let ai = ScriptedOpenAi::start();
    // The chat server's own tools turned off in the company document.
    let company = OPENAI_COMPANY.replace(
        "{chat}",
        "{chat}read_thread = false\nraise_working = false\n",
    );
    let w = start(&company, Some(&ai), KEYS);
    earlier_messages(&w);
    answers_in_thread(&ai);
    mention_in_thread(&w, "ada", "Ev3", "<@ada> can you fix it?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);

    let read = w.events("thread_read");
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0]["payload"]["status"], "not_offered", "{read:?}");
    let working = w.events("working_indicator");
    assert_eq!(working.len(), 1, "{working:?}");
    assert_eq!(working[0]["payload"]["state"], "not_offered", "{working:?}");
    assert!(
        !first_executor_request(&ai).contains(EARLIER[0].1),
        "nothing was read"
    );
    assert!(
        !w.sb.path("chat.working.jsonl").exists(),
        "no indicator was raised"
    );
}
