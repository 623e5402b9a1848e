//! A seat's memory follows the seat, through the real binary: two nodes on
//! one nats-server, each with its own store; the seat answers in a thread
//! on node A; A drains; B takes the seat, replays its memory from
//! `CREWLET_MEMORY` before attaching its mailbox, and answers a follow-up
//! in the thread with the earlier exchange in the executor's prompt
//! (asserted on the request the model server received).

use std::time::Duration;

use crewlet_testkit::NatsServer;
use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::Value;

use crate::common::company::{SLACK_SECRET, fill};
use crate::common::{Node, Sandbox, eventually, slack_mention, wait_events};
use crate::turns::{plugins, post, submit, verdict};

const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "openai", model = "exec-a", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review", credentials = "${KEY_ONE}" }
max_iterations = 2
max_tool_rounds = 6
{chat}
[seats]
ada = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

fn spawn(sb: &Sandbox, id: &str, server: &NatsServer) -> Node {
    let mut node = sb
        .fleet_node(
            id,
            &[server.url()],
            "[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n",
        )
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .env("KEY_ONE", "sk-one-1111")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

/// The node holding `seat`, as `node`'s `/agents` says.
fn holder(node: &Node, seat: &str) -> Option<String> {
    let agents: Value = node.get("/agents")?.json();
    agents["agents"]
        .as_array()?
        .iter()
        .find(|a| a["handle"] == seat && a["state"] == "held")
        .and_then(|a| a["holder"]["node"].as_str().map(str::to_owned))
}

#[test]
fn a_seat_moved_to_another_node_answers_a_follow_up_knowing_what_it_said() {
    let ai = ScriptedOpenAi::start();
    let server = NatsServer::start();
    let sb = Sandbox::new();
    std::fs::write(
        sb.path("company.toml"),
        fill(COMPANY, &sb.path("chat.jsonl")),
    )
    .unwrap();
    plugins(&sb, Some(&ai));

    let mut a = spawn(&sb, "node-a", &server);
    assert!(
        eventually(Duration::from_secs(30), || holder(&a, "ada").as_deref()
            == Some("node-a")),
        "node A never held ada: {}",
        a.log_text()
    );
    let b = spawn(&sb, "node-b", &server);

    ai.reply(
        "exec-a",
        post("C1", "17.1", "The build is green (run 4411)."),
    );
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    slack_mention(
        &a,
        SLACK_SECRET,
        "ada",
        "Ev1",
        "C1",
        "17.1",
        "<@ada> is the build green?",
    );
    let ended = wait_events(&a, "turn_ended", 1);
    assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{ended:?}");
    let first = ai.requests().len();

    // A drains: its seats are released and its queued memory reaches the
    // stream before it lets the connection go.
    a.signal(libc::SIGTERM);
    let status = a.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "drain exited {status}: {}", a.log_text());
    assert!(
        eventually(Duration::from_secs(30), || holder(&b, "ada").as_deref()
            == Some("node-b")),
        "node B never took ada: {}",
        b.log_text()
    );
    // The lease shows before the hydration ends: a wake sent meanwhile
    // waits in the mailbox, which is attached after it.
    assert!(
        eventually(Duration::from_secs(30), || b
            .log_text()
            .contains("seat memory hydrated")),
        "{}",
        b.log_text()
    );

    ai.reply("exec-a", post("C1", "17.1", "Yes, it deploys too."));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    slack_mention(
        &b,
        SLACK_SECRET,
        "ada",
        "Ev2",
        "C1",
        "17.1",
        "<@ada> and does it deploy?",
    );
    let ended = wait_events(&b, "turn_ended", 1);
    assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{ended:?}");

    let on_b: Vec<String> = ai.requests()[first..]
        .iter()
        .filter(|r| r.model == "exec-a")
        .map(|r| r.messages.to_string())
        .collect();
    let prompt = on_b.first().expect("node B's executor asked the model");
    assert!(
        prompt.contains("What you already said in this conversation")
            && prompt.contains("The build is green (run 4411)."),
        "node B's first executor request lacks the earlier exchange: {prompt}"
    );
}
