//! Only what is sent to a seat wakes it, through the real binary: a seat's
//! own Slack app, subscribed to `message.channels`, hears its own reply on
//! its route and is not woken by it (no wake, no model request); chatter in
//! a channel, an edit, a join, a topic change and a reaction wake nobody,
//! each recorded with why; a seat mentioned by another seat is woken, and
//! the turn's prompt names who is talking.

use crate::common;
use crate::turns::{KEYS, OPENAI_COMPANY, World, post, start, submit, verdict};

use common::company::SLACK_SECRET;
use crewlet_testkit::http;
use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::{Value, json};

const CHANNEL: &str = "C0ENG";
const THREAD: &str = "1700000000.000100";

/// ada and bob each their own Slack app (user, bot and app ids); Grace a
/// person.
fn company() -> String {
    let doc = OPENAI_COMPANY
        .replace(
            "ada = { role = \"support\" }",
            "ada = { role = \"support\", identities = { slack = [\"U04ADA\", \"B04ADA\", \"A04ADA\"] } }",
        )
        .replace(
            "bob = { role = \"support\" }",
            "bob = { role = \"support\", identities = { slack = [\"U05BOB\", \"B05BOB\"] } }",
        );
    assert_ne!(doc, OPENAI_COMPANY);
    format!(
        "{doc}\n[people.grace]\nname = \"Grace Hopper\"\nidentities = {{ slack = \"U07GRACE1\" }}\n"
    )
}

/// Posts a signed Events API `event` to `/webhooks/slack/HANDLE`; asserts
/// it was accepted.
fn deliver(w: &World, handle: &str, event_id: &str, event: Value) {
    let body = json!({
        "type": "event_callback", "event_id": event_id, "team_id": "T1",
        "api_app_id": "A04ADA", "event": event,
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(SLACK_SECRET.as_bytes(), body.as_bytes());
    let r = http::post(
        &w.node.api,
        &format!("/webhooks/slack/{handle}"),
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &now),
            ("X-Slack-Signature", &sig),
        ],
        body.as_bytes(),
    )
    .expect("POST webhook");
    common::assert_accepted(&w.node, &r);
}

fn message(user: &str, text: &str, extra: Value) -> Value {
    let mut e = json!({"type": "message", "channel_type": "channel", "user": user,
        "text": text, "channel": CHANNEL, "ts": "1700000001.000200", "thread_ts": THREAD});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        e[k] = v;
    }
    e
}

/// Scripts one turn: a reply in the thread, delivered, reviewed done.
fn answer_once(ai: &ScriptedOpenAi, text: &str) {
    ai.reply("exec-a", post(CHANNEL, THREAD, text));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
}

/// The events of `kind` about delivery `id`.
fn about(w: &World, kind: &str, id: &str) -> Vec<Value> {
    w.events(kind)
        .into_iter()
        .filter(|e| e["payload"]["delivery_id"] == id)
        .collect()
}

/// Waits for one `kind` event about each of `ids`; answers their reasons.
fn recorded(w: &World, kind: &str, ids: &[&str]) -> Vec<String> {
    let mut reasons = Vec::new();
    let all = common::eventually(std::time::Duration::from_secs(30), || {
        reasons = ids
            .iter()
            .filter_map(|id| {
                about(w, kind, id)
                    .first()
                    .map(|e| e["payload"]["reason"].to_string())
            })
            .collect();
        reasons.len() == ids.len()
    });
    assert!(
        all,
        "{kind} for each of {ids:?}, saw {reasons:?}: {}",
        w.node.log_text()
    );
    reasons
}

#[test]
fn a_seat_app_hears_its_own_reply_and_the_channel_chatter_and_wakes_for_neither() {
    let ai = ScriptedOpenAi::start();
    let w = start(&company(), Some(&ai), KEYS);

    // Grace mentions ada: one turn, whose prompt names Grace.
    answer_once(&ai, "On it.");
    deliver(
        &w,
        "ada",
        "Ev-ask",
        json!({"type": "app_mention", "user": "U07GRACE1", "text": "<@U04ADA> the build is red",
               "channel": CHANNEL, "ts": THREAD}),
    );
    w.wait_events("turn_ended", 1);
    let first = ai.requests()[0].messages.to_string();
    assert!(
        first.contains("From Grace Hopper (person grace)"),
        "{first}"
    );
    let asked = ai.requests().len();

    // ada's own reply, heard back by her app: in the channel, in a DM, and
    // naming herself; then the channel's chatter and noise.
    let own = |text: &str, extra: Value| {
        message(
            "U04ADA",
            text,
            json!({"bot_id": "B04ADA", "app_id": "A04ADA"}),
        )
        .as_object()
        .cloned()
        .map(|mut m| {
            m.extend(extra.as_object().cloned().unwrap_or_default());
            Value::Object(m)
        })
        .unwrap_or_default()
    };
    deliver(&w, "ada", "Ev-own", own("On it.", json!({})));
    deliver(
        &w,
        "ada",
        "Ev-own-dm",
        own("On it.", json!({"channel_type": "im", "channel": "D0ADA"})),
    );
    deliver(
        &w,
        "ada",
        "Ev-own-self",
        own("<@U04ADA> note to self", json!({})),
    );
    deliver(
        &w,
        "ada",
        "Ev-lunch",
        message("U07GRACE1", "lunch anyone?", json!({"channel": "C0RANDOM"})),
    );
    deliver(
        &w,
        "ada",
        "Ev-edit",
        json!({"type": "message", "subtype": "message_changed", "channel": CHANNEL, "ts": "1.2",
               "message": {"user": "U07GRACE1", "text": "the build is red again"}}),
    );
    deliver(
        &w,
        "ada",
        "Ev-join",
        message(
            "U07GRACE1",
            "<@U07GRACE1> has joined the channel",
            json!({"subtype": "channel_join"}),
        ),
    );
    deliver(
        &w,
        "ada",
        "Ev-topic",
        message(
            "U07GRACE1",
            "set the channel topic: builds",
            json!({"subtype": "channel_topic"}),
        ),
    );
    deliver(
        &w,
        "ada",
        "Ev-reaction",
        json!({"type": "reaction_added", "user": "U07GRACE1", "reaction": "eyes",
               "item": {"type": "message", "channel": CHANNEL, "ts": THREAD}}),
    );

    let own_why = recorded(&w, "delivery_quiet", &["Ev-own-dm", "Ev-own-self"]);
    for why in &own_why {
        assert!(why.contains("written by seat ada itself"), "{why}");
    }
    let noise = recorded(
        &w,
        "delivery_quiet",
        &["Ev-edit", "Ev-join", "Ev-topic", "Ev-reaction"],
    );
    for (why, what) in noise
        .iter()
        .zip(["an edit", "a join", "a topic change", "a reaction"])
    {
        assert!(why.contains(what), "{what}: {why}");
    }
    let unrouted = recorded(&w, "delivery_unrouted", &["Ev-own", "Ev-lunch"]);
    for why in &unrouted {
        assert!(why.contains("only saw it in a channel"), "{why}");
    }
    // Nothing of it woke ada, and no model heard of it.
    let wakes = w.events("wake_published");
    assert_eq!(wakes.len(), 1, "only Grace's mention woke ada: {wakes:?}");
    assert_eq!(ai.requests().len(), asked, "no model request since");
    assert_eq!(w.posts().len(), 1, "one reply in all");

    // bob, another seat, mentions ada: she is woken, and told it is bob.
    answer_once(&ai, "Sure, bob.");
    deliver(
        &w,
        "bob",
        "Ev-bob",
        message(
            "U05BOB",
            "<@U04ADA> can you take the build?",
            json!({"bot_id": "B05BOB"}),
        ),
    );
    w.wait_events("turn_ended", 2);
    let woke = about(&w, "wake_published", "Ev-bob");
    assert_eq!(woke.len(), 1, "{woke:?}");
    assert_eq!(
        (&woke[0]["seat"], &woke[0]["payload"]["reason"]),
        (&json!("ada"), &json!("mention"))
    );
    let prompt = ai.requests()[asked].messages.to_string();
    assert!(prompt.contains("From seat bob"), "{prompt}");
}

/// One post, sent as several events: ada's app subscribed to both
/// `app_mention` and `message.channels` gets two (each its own event id),
/// and bob's app in the same channel its own copy. ada is woken once, for
/// whichever came first; the other copies are recorded as quiet, naming
/// the message.
#[test]
fn one_post_sent_as_several_events_wakes_its_seat_once() {
    let ai = ScriptedOpenAi::start();
    let w = start(&company(), Some(&ai), KEYS);
    answer_once(&ai, "Looking.");
    let ts = "1700000005.000500";
    let text = "<@U04ADA> the deploy is stuck";
    let copy = json!({"type": "message", "channel_type": "channel", "user": "U07GRACE1",
        "text": text, "channel": CHANNEL, "ts": ts});
    deliver(
        &w,
        "ada",
        "Ev-post-mention",
        json!({"type": "app_mention", "user": "U07GRACE1", "text": text,
               "channel": CHANNEL, "ts": ts}),
    );
    deliver(&w, "ada", "Ev-post-message", copy.clone());
    deliver(&w, "bob", "Ev-post-bob", copy);

    let ids = ["Ev-post-mention", "Ev-post-message", "Ev-post-bob"];
    let settled = common::eventually(std::time::Duration::from_secs(30), || {
        ids.iter().all(|id| {
            !about(&w, "wake_published", id).is_empty()
                || !about(&w, "delivery_quiet", id).is_empty()
        })
    });
    assert!(settled, "every copy settled: {}", w.node.log_text());
    let woke: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !about(&w, "wake_published", id).is_empty())
        .collect();
    assert_eq!(woke.len(), 1, "ada woken once for the post: {woke:?}");
    let quiet: Vec<String> = ids
        .iter()
        .flat_map(|id| about(&w, "delivery_quiet", id))
        .map(|e| e["payload"]["reason"].to_string())
        .collect();
    assert_eq!(quiet.len(), 2, "{quiet:?}");
    for why in &quiet {
        assert!(
            why.contains("already woken for this message") && why.contains(ts),
            "{why}"
        );
    }
    w.wait_events("turn_ended", 1);
    assert_eq!(w.posts().len(), 1, "one reply to one post");
    assert_eq!(w.events("wake_published").len(), 1);
}
