//! `worker:learning` through the real binary: one node (every role) with a
//! one-second learning tick, ada thinking with the OpenAI plugin against
//! the scripted model server, which records every request.
//!
//! - Three delivered turns → a pass reflects over their episodes through
//!   ada's chain (the request quotes them) → a skill with a version; the
//!   next turn's executor prompt carries it, and `crewlet agents memory`
//!   shows it.
//! - A reflection answering garbage writes no skill and the pass says
//!   `failed`; with ada's day window then full, the next reflection is
//!   declined before any request reaches the model server, and the pass
//!   says why.
//! - With the duty on another node than the seat's holder, the skill the
//!   duty writes reaches the holder live (its tail of the memory stream),
//!   and the holder's next turn carries it.

use std::time::Duration;

use crewlet_testkit::NatsServer;
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use serde_json::Value;

use crate::common::company::{OPENAI_ONE_SEAT, SLACK_SECRET, fill};
use crate::common::{
    Node, NodeBuilder, Sandbox, events, eventually, run_to_exit, slack_mention, wait_events,
};
use crate::turns::{World, plugins, post, start_with, submit, verdict};

/// The reflection's system prompt begins so.
const REFLECTION: &str = "You are the reflection of the seat ada";

const LEARNING_TICK: &str = "[duties]\nlearning_tick_seconds = 1\n";

fn world(ai: &ScriptedOpenAi, company: &str) -> World {
    start_with(
        company,
        Some(ai),
        &[("MODEL_KEY", "sk-one-1111")],
        LEARNING_TICK,
    )
}

/// Scripts one turn answering in `thread` (`review` billed as given).
fn script_turn(ai: &ScriptedOpenAi, thread: &str, text: &str, review: Reply) {
    ai.reply("exec-a", post("C1", thread, text));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", review);
}

/// Scripts the `n`th of three green-build turns; behind the third's own
/// answers, the reflection's: the pass after it reflects over three
/// episodes and learns "Build status check".
fn script_lesson(ai: &ScriptedOpenAi, n: usize) {
    script_turn(
        ai,
        &format!("{n}.1"),
        &format!("Build 44{n} is green."),
        verdict("done"),
    );
    if n == 3 {
        ai.reply(
            "exec-a",
            Reply::Text(
                r#"{"skill": {"name": "Build status check", "procedure": "1. Find the build by number. 2. Reply in the thread with its status."}}"#
                    .into(),
            ),
        );
    }
}

/// The first executor request's messages from request `from` on.
fn executor_prompt(ai: &ScriptedOpenAi, from: usize) -> String {
    ai.requests()[from..]
        .iter()
        .find(|r| r.model == "exec-a")
        .map(|r| r.messages.to_string())
        .expect("the turn asked the executor")
}

/// Mentions ada in a thread of its own and waits for the turn to end
/// delivered (the `n`th turn of the node).
fn turn(w: &World, n: usize, text: &str) {
    turn_of(w, "ada", n, text);
}

/// [`turn`] for `seat`.
fn turn_of(w: &World, seat: &str, n: usize, text: &str) {
    let thread = format!("{n}.1");
    w.mention(
        seat,
        &format!("Ev{n}"),
        "C1",
        &thread,
        &format!("<@{seat}> {text}"),
    );
    let mut ended = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            ended = w.events("turn_ended");
            ended.len() >= n
        }),
        "turn {n} never ended: {}",
        w.node.log_text()
    );
    assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{ended:?}");
}

/// ada's reflection in the newest pass whose reflection is in `state`.
fn pass_with(w: &World, state: &str) -> Value {
    pass_of(w, "ada", state)
}

/// [`pass_with`] for `seat`.
fn pass_of(w: &World, seat: &str, state: &str) -> Value {
    let mut found = Value::Null;
    let ok = eventually(Duration::from_secs(30), || {
        found = w
            .events("learning_pass")
            .into_iter()
            .find(|e| {
                e["payload"]["seats"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|s| s["seat"] == seat && s["reflection"]["state"] == state)
            })
            .map(|e| e["payload"].clone())
            .unwrap_or(Value::Null);
        !found.is_null()
    });
    assert!(
        ok,
        "no learning pass with {seat}'s reflection {state}: {:?}\n{}",
        w.events("learning_pass").first(),
        w.node.log_text()
    );
    found
}

fn reflections(ai: &ScriptedOpenAi) -> Vec<String> {
    ai.requests()
        .into_iter()
        .map(|r| r.messages.to_string())
        .filter(|m| m.contains(REFLECTION))
        .collect()
}

fn skills(w: &World) -> Vec<Value> {
    skills_of(w, "ada")
}

fn skills_of(w: &World, seat: &str) -> Vec<Value> {
    let memory = w
        .node
        .get(&format!("/agents/{seat}/memory"))
        .expect("GET memory")
        .json();
    memory["skills"].as_array().cloned().unwrap_or_default()
}

#[test]
fn three_successful_turns_teach_a_skill_that_a_later_turn_carries() {
    let ai = ScriptedOpenAi::start();
    let w = world(&ai, OPENAI_ONE_SEAT);
    for n in 1..=3 {
        script_lesson(&ai, n);
        turn(&w, n, &format!("is build 44{n} green?"));
    }
    let pass = pass_with(&w, "learned");
    assert_eq!(pass["outcome"], "ok", "{pass}");
    let asked = reflections(&ai);
    assert_eq!(asked.len(), 1, "{asked:?}");
    for n in 1..=3 {
        assert!(
            asked[0].contains(&format!("is build 44{n} green?")),
            "the reflection does not quote turn {n}: {}",
            asked[0]
        );
    }
    let learned = skills(&w);
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!(learned[0]["id"], "build-status-check");
    assert_eq!(learned[0]["origin"], "induced");
    assert_eq!(learned[0]["versions"][0]["model"], "openai/exec-a");
    assert_eq!(
        learned[0]["versions"][0]["episodes"]
            .as_array()
            .map(Vec::len),
        Some(3)
    );

    // A later turn's executor prompt carries the skill.
    let before = ai.request_count();
    script_turn(&ai, "4.1", "Build 450 is red.", verdict("done"));
    turn(&w, 4, "and build 450?");
    let prompt = executor_prompt(&ai, before);
    assert!(
        prompt.contains("skills you learned")
            && prompt.contains("Build status check (v1): 1. Find the build by number."),
        "the fourth turn's prompt lacks the skill: {prompt}"
    );

    // The operator sees it.
    let api = format!("http://{}", w.node.api);
    let (status, out) = run_to_exit(&["agents", "memory", "ada", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    assert!(
        out.contains("build-status-check  Build status check  active  induced  1")
            && out.contains("build-status-check v1 (openai/exec-a): 1. Find the build by number."),
        "{out}"
    );
}

#[test]
fn garbage_writes_no_skill_and_a_full_window_declines_the_next_reflection() {
    let ai = ScriptedOpenAi::start();
    let company = OPENAI_ONE_SEAT.replace(
        "max_iterations = 2",
        "max_iterations = 2\nbudget = { day = 200000 }",
    );
    let w = world(&ai, &company);
    for n in 1..=3 {
        script_turn(&ai, &format!("{n}.1"), "Done.", verdict("done"));
        if n == 3 {
            ai.reply(
                "exec-a",
                Reply::Text("Sure! The skill is: be helpful.".into()),
            );
        }
        turn(&w, n, &format!("task {n}"));
    }
    let pass = pass_with(&w, "failed");
    assert_eq!(pass["outcome"], "failed", "{pass}");
    let why = pass["why"].as_str().unwrap_or_default();
    assert!(why.contains("ada") && why.contains("not JSON"), "{why}");
    assert!(
        skills(&w).is_empty(),
        "garbage wrote a skill: {:?}",
        skills(&w)
    );
    assert_eq!(reflections(&ai).len(), 1);

    // Three more delivered turns, the last review billed past ada's day
    // cap: the window is full, so the next reflection is declined.
    for n in 4..=6 {
        let review = if n == 6 {
            Reply::billed(300_000, 10, verdict("done"))
        } else {
            verdict("done")
        };
        script_turn(&ai, &format!("{n}.1"), "Done.", review);
        turn(&w, n, &format!("task {n}"));
    }
    let declined = pass_with(&w, "declined");
    let ada = declined["seats"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["seat"] == "ada")
        .cloned()
        .unwrap_or(Value::Null);
    let why = ada["reflection"]["why"].as_str().unwrap_or_default();
    assert!(
        why.contains("day window is full") && ada["reflection"]["cap"] == 200000,
        "{ada}"
    );
    assert_eq!(
        reflections(&ai).len(),
        1,
        "a declined reflection reached the model server"
    );
    assert!(skills(&w).is_empty());
}

/// Two seats of one role learn the same skill on their own: the next pass
/// gives it to the third seat of the role, naming where it came from.
#[test]
fn a_skill_two_seats_of_a_role_learned_is_given_to_the_third() {
    let ai = ScriptedOpenAi::start();
    let company = OPENAI_ONE_SEAT.replace(
        "ada = { role = \"support\" }",
        "ada = { role = \"support\" }\nbob = { role = \"support\" }\ncy = { role = \"support\" }",
    );
    let w = world(&ai, &company);
    let mut n = 0;
    for seat in ["ada", "bob"] {
        for i in 1..=3 {
            n += 1;
            script_turn(&ai, &format!("{n}.1"), "Green.", verdict("done"));
            if i == 3 {
                ai.reply(
                    "exec-a",
                    Reply::Text(format!(
                        r#"{{"skill": {{"name": "Build status check", "procedure": "{seat}'s steps: 1. find the build 2. reply"}}}}"#
                    )),
                );
            }
            turn_of(&w, seat, n, &format!("is build {n} green?"));
        }
        // The reflection took its answer before the next seat's turns ask.
        pass_of(&w, seat, "learned");
    }
    let mut given = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            given = skills_of(&w, "cy");
            !given.is_empty()
        }),
        "cy was never given the skill: {}",
        w.node.log_text()
    );
    assert_eq!(given[0]["id"], "build-status-check");
    assert_eq!(given[0]["origin"], "promoted");
    assert_eq!(given[0]["promoted_from"], serde_json::json!(["ada", "bob"]));
    assert_eq!(
        given[0]["versions"][0]["procedure"], "bob's steps: 1. find the build 2. reply",
        "the newest inducer's procedure"
    );
    for seat in ["ada", "bob"] {
        assert_eq!(
            skills_of(&w, seat)[0]["origin"],
            "induced",
            "{seat} keeps its own"
        );
    }
}

/// Node `id` of a fleet on `server` with `roles`, the sandbox's company
/// and plugins, and a one-second learning tick.
fn fleet_node(sb: &Sandbox, server: &NatsServer, id: &str, roles: &str) -> Node {
    let port = crewlet_testkit::free_port();
    let cfg = sb.path(&format!("{id}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[api]\nport = {port}\n[node]\nid = \"{id}\"\nroles = {roles}\n[stream]\nurl = \"{}\"\n[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n{LEARNING_TICK}",
            server.url()
        ),
    )
    .expect("write the node's config");
    let mut node = NodeBuilder::new(sb, port)
        .arg("--config")
        .arg(cfg)
        .arg("--data-dir")
        .arg(sb.path(&format!("data-{id}")))
        .arg("--company")
        .arg(sb.path("company.toml"))
        .arg("--plugins")
        .arg(sb.path("plugins"))
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .env("MODEL_KEY", "sk-one-1111")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

/// The learning duty runs on node W, ada is held by node H: the skill W
/// learns reaches H through H's live tail of the memory stream, so H's
/// next turn carries it with ada never hydrated again (no restart, no
/// move).
#[test]
fn a_skill_learned_on_the_duty_node_reaches_the_holder_live() {
    let ai = ScriptedOpenAi::start();
    let server = NatsServer::start();
    let sb = Sandbox::new();
    std::fs::write(
        sb.path("company.toml"),
        fill(OPENAI_ONE_SEAT, &sb.path("chat.jsonl")),
    )
    .unwrap();
    plugins(&sb, Some(&ai));
    let h = fleet_node(&sb, &server, "node-h", r#"["data", "ingress", "seats"]"#);
    let w = fleet_node(&sb, &server, "node-w", r#"["workers"]"#);
    let hydrated = |node: &Node| node.log_text().matches("seat memory hydrated").count();
    assert!(
        eventually(Duration::from_secs(30), || hydrated(&h) == 1),
        "node H never hydrated ada: {}",
        h.log_text()
    );
    for n in 1..=3 {
        let thread = format!("{n}.1");
        script_lesson(&ai, n);
        slack_mention(
            &h,
            SLACK_SECRET,
            "ada",
            &format!("Ev{n}"),
            "C1",
            &thread,
            &format!("<@ada> is build 44{n} green?"),
        );
        let ended = wait_events(&h, "turn_ended", n);
        assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{ended:?}");
    }
    let mut learned = false;
    assert!(
        eventually(Duration::from_secs(30), || {
            learned = events(&h, "learning_pass").iter().any(|e| {
                e["node_id"] == "node-w"
                    && e["payload"]["seats"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| s["seat"] == "ada" && s["reflection"]["state"] == "learned")
            });
            learned
        }),
        "node W never learned ada's skill: {:?}\n{}",
        events(&h, "learning_pass").first(),
        w.log_text()
    );

    let before = ai.request_count();
    script_turn(&ai, "4.1", "Build 450 is red.", verdict("done"));
    slack_mention(
        &h,
        SLACK_SECRET,
        "ada",
        "Ev4",
        "C1",
        "4.1",
        "<@ada> and build 450?",
    );
    wait_events(&h, "turn_ended", 4);
    let prompt = executor_prompt(&ai, before);
    assert!(
        prompt.contains("Build status check (v1): 1. Find the build by number."),
        "the holder's next turn lacks the skill node W learned: {prompt}"
    );
    assert_eq!(hydrated(&h), 1, "ada was hydrated again: {}", h.log_text());
}
