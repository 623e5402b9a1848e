//! Plugins speak, through the real binary: a third-party webhook source
//! (`plugins/testdata/custom-source`, written without Crewlet's SDK) says
//! which deliveries are owed a reply and where; a seat asked that way
//! answers there, as an owed reply, and one that is not owed needs none.
//! What the plugin logs reaches the node's log, tagged with the plugin.

use crewlet_testkit::PluginsDir;
use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::json;

use crate::common::Sandbox;
use crate::turns::{KEYS, OPENAI_COMPANY, outcomes, post, start_custom, submit, verdict};

const TOKEN: &str = "tickets-shared-token";

fn plugins(sb: &Sandbox, ai: &ScriptedOpenAi) {
    let dir = PluginsDir::new(sb.path("plugins"));
    dir.add("slack", "plugins/webhooks/slack/plugin.toml")
        .add(
            "custom-source",
            "plugins/testdata/custom-source/plugin.toml",
        )
        .add_provider_at(
            "openai",
            "plugins/providers/openai/plugin.toml",
            &ai.base_url(),
            &ai.origin(),
        );
}

/// Sends one ticket event to `/webhooks/tickets`, signed with the token.
fn ticket(api: &str, body: serde_json::Value) {
    let body = body.to_string();
    let r = crewlet_testkit::http::post(
        api,
        "/webhooks/tickets",
        &[
            ("Content-Type", "application/json"),
            ("X-Tickets-Token", TOKEN),
        ],
        body.as_bytes(),
    )
    .expect("POST webhook");
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn a_third_party_source_says_where_a_reply_is_owed_and_its_log_reaches_the_node() {
    let ai = ScriptedOpenAi::start();
    let company = format!(
        "{OPENAI_COMPANY}\n[integrations.tickets]\nplugin = \"custom-source\"\nsecret = \"TICKETS_TOKEN\"\n"
    );
    let envs: Vec<(&str, &str)> = KEYS
        .iter()
        .copied()
        .chain([("TICKETS_TOKEN", TOKEN)])
        .collect();
    let w = start_custom(&company, &envs, "", |sb| plugins(sb, &ai));

    // Owed: the plugin names `ops#42`, not the ticket's own channel, as the
    // place a person waits; the post there answers it.
    ai.reply("exec-a", post("ops", "42", "Looking at the VPN now."));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    ticket(
        &w.node.api,
        json!({"id": "T-1", "kind": "ticket.commented", "to": "ada",
               "text": "@ada is the VPN down?", "asks": true,
               "channel": "ops", "thread": "42"}),
    );
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    let posts = w.posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(
        (&posts[0]["as"], &posts[0]["channel"], &posts[0]["thread"]),
        (&json!("ada"), &json!("ops"), &json!("42"))
    );
    // Only an owed reply is posted with the trigger's idempotency key.
    assert_eq!(
        posts[0]["idempotency_key"].as_str().map(str::len),
        Some(32),
        "the post answered the owed reply: {posts:?}"
    );

    // Not owed: the seat submits without posting, and that is done.
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    ticket(
        &w.node.api,
        json!({"id": "T-2", "kind": "ticket.assigned", "to": "bob",
               "text": "take the VPN ticket", "asks": false}),
    );
    w.wait_events("turn_ended", 2);
    assert_eq!(outcomes(&w), ["delivered", "delivered"]);
    assert_eq!(w.posts().len(), 1, "no reply for a delivery not owed one");

    // The plugin's `log` lines, at their level, tagged with the plugin.
    let log = w.node.log_text();
    for said in [
        "ticket T-1: ticket.commented for ada, reply owed: ops#42",
        "ticket T-2: ticket.assigned for bob, reply owed: no",
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(said))
            .unwrap_or_else(|| panic!("{said:?} is not in the node's log:\n{log}"));
        assert!(
            line.contains("INFO") && line.contains("custom-source") && line.contains("webhook"),
            "{line}"
        );
    }
    // stderr of a call that succeeded is said at DEBUG: not at INFO.
    assert!(!log.contains("custom-source parsed ticket"), "{log}");
}

/// `plugins try` on a captured ticket prints the delivery's `owed`, what
/// the plugin wrote to stderr and what it logged, on a call that succeeded.
#[test]
fn plugins_try_prints_where_a_reply_is_owed_and_what_the_plugin_said() {
    use base64::Engine as _;

    let sb = Sandbox::new();
    let dir = PluginsDir::new(sb.path("plugins"));
    dir.add(
        "custom-source",
        "plugins/testdata/custom-source/plugin.toml",
    );
    let body = json!({"id": "T-9", "kind": "ticket.commented", "to": "ada",
                      "asks": true, "channel": "ops", "thread": "42"})
    .to_string();
    let capture = json!({
        "route": "/webhooks/tickets",
        "headers": [["x-tickets-token", TOKEN], ["content-type", "application/json"]],
        "body_base64": base64::engine::general_purpose::STANDARD.encode(body),
        "received_unix": 1_700_000_000,
    });
    let file = sb.path("ticket.json");
    std::fs::write(&file, capture.to_string()).unwrap();
    let (status, out) = crate::common::run_to_exit(
        &[
            "plugins",
            "try",
            "custom-source",
            "--request",
            &file.display().to_string(),
            &dir.path().display().to_string(),
        ],
        &[("CUSTOM_TOKEN", TOKEN)],
    );
    assert_eq!(status.code(), Some(0), "{out}");
    for expected in [
        r#""owed":{"channel":"ops","thread":"42"}"#,
        "plugin said: custom-source parsed ticket T-9",
        "plugin logged: ticket T-9: ticket.commented for ada, reply owed: ops#42",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}
