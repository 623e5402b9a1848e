//! A seat's memory follows the seat, through the real binary: two nodes on
//! one nats-server, each with its own store; the seat answers in a thread
//! on node A; A drains; B takes the seat, replays its memory from
//! `CREWLET_MEMORY` before attaching its mailbox, and answers a follow-up
//! in the thread with the earlier exchange in the executor's prompt
//! (asserted on the request the model server received). And the unknown
//! case: a node that cannot read the memory stream holds the seat without
//! attaching its mailbox, says so on `/agents` (`hydrating`, with why),
//! and answers the waiting wake once the stream reads again.

use std::time::Duration;

use crewlet_testkit::NatsServer;
use crewlet_testkit::openai::ScriptedOpenAi;
use serde_json::Value;

use crate::common::company::{OPENAI_ONE_SEAT, SLACK_SECRET, fill};
use crate::common::{Node, Sandbox, eventually, slack_mention, wait_events};
use crate::turns::{plugins, post, submit, verdict};

pub(crate) fn spawn(sb: &Sandbox, id: &str, server: &NatsServer) -> Node {
    let mut node = sb
        .fleet_node(
            id,
            &[server.url()],
            "[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n",
        )
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .env("MODEL_KEY", "sk-one-1111")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

/// `seat`'s row of `node`'s `/agents` (null if it did not answer).
fn agent(node: &Node, seat: &str) -> Value {
    let Some(r) = node.get("/agents") else {
        return Value::Null;
    };
    let agents: Value = r.json();
    agents["agents"]
        .as_array()
        .and_then(|all| all.iter().find(|a| a["handle"] == seat).cloned())
        .unwrap_or(Value::Null)
}

/// The node holding `seat`, as `node`'s `/agents` says.
fn holder(node: &Node, seat: &str) -> Option<String> {
    let a = agent(node, seat);
    let node = a["holder"]["node"].as_str()?;
    (a["state"] == "held").then(|| node.to_owned())
}

/// Scripts the model for one turn that replies `text` in `thread` of C1.
fn script_reply(ai: &ScriptedOpenAi, thread: &str, text: &str) {
    ai.reply("exec-a", post("C1", thread, text));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
}

/// Mentions ada in `thread` of C1 through `node`'s webhook edge.
fn ask(node: &Node, event: &str, thread: &str, text: &str) {
    slack_mention(node, SLACK_SECRET, "ada", event, "C1", thread, text);
}

/// Waits for `node`'s first turn to end, delivered.
fn delivered(node: &Node) {
    let ended = wait_events(node, "turn_ended", 1);
    assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{ended:?}");
}

/// Node A holding ada, then node B beside it.
struct Pair {
    ai: ScriptedOpenAi,
    server: NatsServer,
    a: Node,
    b: Node,
    _sb: Sandbox,
}

fn pair() -> Pair {
    let ai = ScriptedOpenAi::start();
    let server = NatsServer::start();
    let sb = Sandbox::new();
    std::fs::write(
        sb.path("company.toml"),
        fill(OPENAI_ONE_SEAT, &sb.path("chat.jsonl")),
    )
    .unwrap();
    plugins(&sb, Some(&ai));
    let a = spawn(&sb, "node-a", &server);
    assert!(
        eventually(Duration::from_secs(30), || holder(&a, "ada").as_deref()
            == Some("node-a")),
        "node A never held ada: {}",
        a.log_text()
    );
    let b = spawn(&sb, "node-b", &server);
    Pair {
        ai,
        server,
        a,
        b,
        _sb: sb,
    }
}

/// Drains `node` (SIGTERM) and waits for it to exit cleanly.
fn drain(node: &mut Node) {
    node.signal(libc::SIGTERM);
    let status = node.wait_exit(Duration::from_secs(60));
    assert!(
        status.success(),
        "drain exited {status}: {}",
        node.log_text()
    );
}

#[test]
fn a_seat_moved_to_another_node_answers_a_follow_up_knowing_what_it_said() {
    let Pair {
        ai,
        server: _server,
        mut a,
        b,
        _sb,
    } = pair();

    script_reply(&ai, "17.1", "The build is green (run 4411).");
    ask(&a, "Ev1", "17.1", "<@ada> is the build green?");
    delivered(&a);
    let first = ai.requests().len();

    // A drains: its seats are released and its queued memory reaches the
    // stream before it lets the connection go.
    drain(&mut a);
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

    script_reply(&ai, "17.1", "Yes, it deploys too.");
    ask(&b, "Ev2", "17.1", "<@ada> and does it deploy?");
    delivered(&b);

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

/// Unknown is not empty: with the memory stream gone, node B takes ada's
/// lease but not her work — `/agents` says `hydrating` and why, the wake
/// waits in her mailbox — and once the stream is back the retry reads it
/// and the wake is answered.
#[test]
fn a_seat_whose_memory_cannot_be_read_waits_says_why_and_answers_once_it_can() {
    let Pair {
        ai,
        server,
        mut a,
        b,
        _sb,
    } = pair();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let js = rt.block_on(async {
        async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap())
    });
    rt.block_on(js.delete_stream(crewlet_bus::MEMORY_STREAM))
        .expect("delete the memory stream");
    drain(&mut a);

    let mut seen = Value::Null;
    assert!(
        eventually(Duration::from_secs(30), || {
            seen = agent(&b, "ada");
            seen["state"] == "hydrating" && seen["holder"]["node"] == "node-b"
        }),
        "ada never showed as hydrating on node B: {seen}\n{}",
        b.log_text()
    );
    let why = seen["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("CREWLET_MEMORY") && why.contains("not given work"),
        "{why}"
    );

    script_reply(&ai, "18.1", "Back, and I remember.");
    ask(&b, "Ev3", "18.1", "<@ada> are you there?");
    assert!(
        eventually(Duration::from_secs(30), || {
            seen = agent(&b, "ada");
            seen["mailbox"]["pending"] == 1
        }),
        "the wake never waited in ada's mailbox: {seen}"
    );
    assert!(
        seen["state"] == "hydrating" && crate::common::events(&b, "turn_started").is_empty(),
        "ada took work without her memory: {seen}"
    );

    rt.block_on(js.create_stream(async_nats::jetstream::stream::Config {
        name: crewlet_bus::MEMORY_STREAM.into(),
        subjects: vec![crewlet_bus::MEMORY_SUBJECTS.into()],
        max_messages_per_subject: 1,
        ..Default::default()
    }))
    .expect("the memory stream back");
    delivered(&b);
    assert!(
        eventually(Duration::from_secs(30), || agent(&b, "ada")["state"]
            == "held"),
        "{}",
        agent(&b, "ada")
    );
}
