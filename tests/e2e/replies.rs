//! Exactly-once replies across crashes, through the real binary: the node
//! dies (`CREWLET_TEST_CRASH_AT`, an abort at an exact point of a reply),
//! starts again on the same data dir, and the chat server's log — every
//! post ever made — is counted.

use std::time::Duration;

use crewlet_testkit::NatsServer;
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use serde_json::{Value, json};

use crate::common;
use crate::turns::{
    KEYS, OPENAI_COMPANY, World, outcomes, post, start, start_with, submit, verdict,
};

/// Waits for the node to die at its crash point.
fn died(w: &mut World) {
    let status = w.node.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "the node was meant to die: {status:?}");
    assert!(
        w.node.log_text().contains("dying at the crash point"),
        "{}",
        w.node.log_text()
    );
}

fn texts(posts: &[Value]) -> Vec<&str> {
    posts.iter().filter_map(|p| p["text"].as_str()).collect()
}

/// Killed between the reply's intent and its post, or after the post and
/// before its completion: the node that runs the turn again finishes the
/// recorded post through the chat server, which dedupes by the idempotency
/// key — one post either way, the one first meant, and the turn delivered.
#[test]
fn a_reply_cut_off_by_a_crash_is_posted_exactly_once_after_the_restart() {
    for (point, landed) in [("reply.after_intent", 0), ("reply.after_post", 1)] {
        let ai = ScriptedOpenAi::start();
        let crash: Vec<(&str, &str)> = KEYS
            .iter()
            .copied()
            .chain([("CREWLET_TEST_CRASH_AT", point)])
            .collect();
        let mut w = start(OPENAI_COMPANY, Some(&ai), &crash);
        ai.reply("exec-a", post("C1", "17.1", "Hi, ada here."));
        w.mention("ada", "Ev1", "C1", "17.1", "<@ada> can you help?");
        died(&mut w);
        assert_eq!(w.posts().len(), landed, "{point}: {:?}", w.posts());

        ai.reply("exec-a", post("C1", "17.1", "Hi, ada here (second run)."));
        ai.reply("exec-a", submit("delivered"));
        ai.reply("review", verdict("done"));
        w.restart(KEYS);
        w.wait_events("turn_ended", 1);
        assert_eq!(outcomes(&w), ["delivered"], "{point}");
        let posts = w.posts();
        assert_eq!(texts(&posts), ["Hi, ada here."], "{point}: exactly once");
        assert_eq!(posts[0]["idempotency_key"].as_str().map(str::len), Some(32));
        let posted = w.events("reply_posted");
        assert!(
            posted
                .iter()
                .any(|e| e["payload"]["recovered_from"].is_string()),
            "{point}: the restart finished the recorded post: {posted:?}"
        );
        let ended = w.events("turn_ended");
        assert_eq!(ended[0]["payload"]["replies"], json!(1), "{point}");
    }
}

/// w1's turn posts; w2 of the same thread arrives while it runs; the node
/// dies before the turn is recorded done. After the restart w1 and w2 run as
/// one new turn: w1's reply is not posted again, w2 gets its own.
///
/// w2 reaches the seat while w1's model call is held (the gate), so the dead
/// holder got the two apart; they come back to the next one as one batch
/// because one conversation's wakes lapse together (`crewlet_seats`'
/// progress rule). The broker is an outside one that lives through the
/// node's death: an embedded broker dies with its node, and whether its
/// store had w2's delivery written by then is its own timing — w2 came back
/// at once when it had not, alone, a turn before w1.
#[test]
fn a_reply_posted_before_a_crash_is_not_posted_again_when_its_trigger_is_batched_anew() {
    let ai = ScriptedOpenAi::start();
    let broker = NatsServer::start();
    let crash: Vec<(&str, &str)> = KEYS
        .iter()
        .copied()
        .chain([("CREWLET_TEST_CRASH_AT", "reply.after_reply")])
        .collect();
    let on_broker = format!("[stream]\nurl = \"{}\"\n", broker.url());
    let mut w = start_with(OPENAI_COMPANY, Some(&ai), &crash, &on_broker);
    // The first model call lasts until w2 waits behind its turn.
    let gate = ai.gate();
    ai.reply(
        "exec-a",
        Reply::Held(
            gate.clone(),
            Box::new(post("C1", "17.1", "Yes, the build is green.")),
        ),
    );
    w.mention("ada", "Ev1", "C1", "17.1", "<@ada> is the build green?");
    w.wait_events("turn_started", 1);
    w.mention("ada", "Ev2", "C1", "17.1", "<@ada> and does it deploy?");
    let behind = "a wake waits for its conversation's running turn";
    assert!(
        common::eventually(Duration::from_secs(30), || w
            .node
            .log_text()
            .contains(behind)),
        "w2 never waited behind w1's turn: {}",
        w.node.log_text()
    );
    gate.open();
    died(&mut w);
    assert_eq!(texts(&w.posts()), ["Yes, the build is green."]);

    ai.reply("exec-a", post("C1", "17.1", "It deploys too."));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.restart(KEYS);
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    assert_eq!(
        texts(&w.posts()),
        ["Yes, the build is green.", "It deploys too."],
        "one reply per trigger"
    );
    let started = w.events("turn_started");
    let batched = started
        .iter()
        .find(|e| e["payload"]["triggers"].as_array().map(Vec::len) == Some(2))
        .unwrap_or_else(|| panic!("w1 and w2 ran as one turn: {started:?}"));
    let first = started.last().expect("the first turn's start");
    assert_ne!(
        batched["payload"]["turn_id"], first["payload"]["turn_id"],
        "a new batch is a new turn"
    );
    let prompt = ai
        .requests()
        .iter()
        .rev()
        .find(|r| r.model == "exec-a")
        .map(|r| r.messages.to_string())
        .unwrap_or_default();
    assert!(
        prompt.contains("Already answered, by an earlier run of this work"),
        "{prompt}"
    );
}
