//! The budget park through the real binary, under bad input: a cap lowered
//! below today's spend by a config apply (what runs finishes under the caps
//! it started with; the next work parks; with `announce_park` the person is
//! told once, and still answered once a raised cap lets the work run), and a
//! day window that turns over
//! while work is parked on it (the node's clock set just before midnight
//! with `CREWLET_TEST_CLOCK_OFFSET_MS`; the work runs by itself after it).

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::eventually;
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};

use crate::turns::{KEYS, World, agent, budget_scope, outcomes, post_and_submit, start, verdict};

const COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer."
executor = [{ provider = "openai", model = "exec-a", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review", credentials = "${KEY_ONE}" }
budget = { day = 1000000 }
{chat}
[roles.desk]
budget = { day = 1000000 }
system_prompt = "You answer."
executor = [{ provider = "openai", model = "exec-b", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review-b", credentials = "${KEY_ONE}" }
{chat:desk}
[seats]
ada = { role = "support" }
bob = { role = "desk" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

fn applied(w: &World) -> Option<u64> {
    w.node.health()["applied_epoch"].as_u64()
}

#[test]
fn a_cap_lowered_below_todays_spend_parks_the_next_work_and_stops_nothing_running() {
    let ai = ScriptedOpenAi::start();
    let w = start(COMPANY, Some(&ai), KEYS);
    // A slow call: the apply lands while it is in flight.
    ai.reply(
        "exec-a",
        Reply::Delayed(
            Duration::from_secs(10),
            Box::new(post_and_submit("C1", "1", "worth the wait")),
        ),
    );
    ai.reply("review", verdict("done"));
    w.mention("ada", "Ev1", "C1", "1", "a long question");
    assert!(eventually(Duration::from_secs(30), || ai.request_count() == 1));
    let before = applied(&w);
    let doc = std::fs::read_to_string(w.sb.path("company.toml"))
        .unwrap()
        .replace("budget = { day = 1000000 }", "budget = { day = 10 }");
    let put = common::http::request(&w.node.api, "PUT", "/config", &[], doc.as_bytes()).unwrap();
    assert_eq!(put.status, 201, "{}", put.text());
    assert!(eventually(Duration::from_secs(30), || applied(&w) != before));
    assert!(
        w.events("turn_ended").is_empty(),
        "the apply landed while the call was in flight"
    );
    // The running turn finishes under the caps it started with.
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    assert_eq!(w.posts().len(), 1);

    // The next work parks before any call: today's spend is past the cap.
    w.mention("ada", "Ev2", "C1", "2", "and another");
    w.wait_events("budget_parked", 1);
    w.wait_events("turn_ended", 2);
    assert_eq!(outcomes(&w), ["delivered", "parked"]);
    assert_eq!(ai.request_count(), 2, "no model call to learn it is full");
    let seat = budget_scope(&w, "seat:ada");
    assert!(
        seat["windows"]["day"]["spent"].as_u64().unwrap() > 10,
        "{seat}"
    );
    assert_eq!(seat["windows"]["day"]["cap"], 10, "{seat}");
    assert_eq!(seat["parked"][0]["seat"], "ada", "{seat}");
    assert!(
        eventually(Duration::from_secs(10), || agent(&w, "ada")["state"]
            == "parked"),
        "{}",
        agent(&w, "ada")
    );
    assert!(
        w.node
            .log_text()
            .contains("parked until its budget has room"),
        "every park is a log line"
    );
    assert_eq!(w.posts().len(), 1, "by default a park says nothing");

    // A company that opts in: the parked seat tells the person it owes a
    // reply, once, when it will be back.
    let before = applied(&w);
    let announcing = format!("{doc}\n[budgets]\nannounce_park = true\n");
    let put =
        common::http::request(&w.node.api, "PUT", "/config", &[], announcing.as_bytes()).unwrap();
    assert_eq!(put.status, 201, "{}", put.text());
    assert!(eventually(Duration::from_secs(30), || applied(&w) != before));
    w.mention("bob", "Ev3", "C3", "3", "are you there?");
    w.wait_events("budget_parked", 2);
    assert!(
        eventually(Duration::from_secs(30), || w.posts().len() == 2),
        "{:?}",
        w.posts()
    );
    let said = w.posts()[1].clone();
    assert_eq!(
        (said["as"].as_str(), said["thread"].as_str()),
        (Some("bob"), Some("3"))
    );
    assert!(
        said["text"]
            .as_str()
            .unwrap()
            .contains("out of token budget (budget: day window until"),
        "{said}"
    );
    assert_eq!(ai.request_count(), 2, "no model call to announce it");

    // The notice was not the reply: once bob's cap is raised, the parked
    // work runs and the real answer is posted; the notice stays the one.
    ai.reply(
        "exec-b",
        post_and_submit("C3", "3", "yes, here is the answer"),
    );
    ai.reply("review-b", verdict("done"));
    let raised = announcing.replace(
        "[roles.desk]\nbudget = { day = 10 }",
        "[roles.desk]\nbudget = { day = 1000000 }",
    );
    assert_ne!(raised, announcing, "the desk's cap is in the document");
    let before = applied(&w);
    let put = common::http::request(&w.node.api, "PUT", "/config", &[], raised.as_bytes()).unwrap();
    assert_eq!(put.status, 201, "{}", put.text());
    assert!(
        eventually(Duration::from_secs(60), || w.posts().len() == 3),
        "{:?}\n{}",
        w.posts(),
        w.node.log_text()
    );
    assert_ne!(applied(&w), before);
    let bobs: Vec<String> = w
        .posts()
        .iter()
        .filter(|p| p["as"] == "bob")
        .map(|p| p["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(bobs.len(), 2, "{bobs:?}");
    assert!(bobs[0].contains("out of token budget"), "{bobs:?}");
    assert_eq!(bobs[1], "yes, here is the answer");
    assert!(eventually(Duration::from_secs(30), || outcomes(&w)
        .last()
        .is_some_and(|o| o == "delivered")));
    let bobs_park: Vec<_> = w
        .events("budget_parked")
        .into_iter()
        .filter(|e| e["payload"]["scope"] == "seat:bob")
        .collect();
    assert_eq!(bobs_park.len(), 1, "{bobs_park:?}");
    assert_eq!(
        bobs_park[0]["payload"]["announced_to"],
        serde_json::json!(["C3#3"])
    );
    assert!(
        eventually(Duration::from_secs(10), || agent(&w, "ada")["state"]
            == "parked"),
        "ada's cap is still 10: {}",
        agent(&w, "ada")
    );
}

/// Milliseconds since the epoch on this machine's clock.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn a_window_that_turns_over_while_work_is_parked_on_it_runs_the_work() {
    const DAY_MS: i64 = 86_400_000;
    // The node's clock starts 45 s before the nearest UTC midnight.
    let now = now_ms();
    let midnight = (now + DAY_MS / 2) / DAY_MS * DAY_MS;
    let offset = midnight - 45_000 - now;
    let offset_env = offset.to_string();
    let mut envs = KEYS.to_vec();
    envs.push((crewlet_os::TEST_CLOCK_OFFSET_ENV, offset_env.as_str()));
    let company = COMPANY.replace("budget = { day = 1000000 }", "budget = { day = 3000 }");
    let ai = ScriptedOpenAi::start();
    let w = start(&company, Some(&ai), &envs);
    // The first call is billed past the cap before anything is answered:
    // the work parks on the day window, the person still owed a reply.
    let look = Reply::ToolCalls(vec![(
        "list_mcp_server_tools".into(),
        serde_json::json!({"server": "chat"}),
    )]);
    ai.reply("exec-a", Reply::billed(100, 5_000, look));
    w.mention("ada", "Ev1", "C1", "1", "late question");
    let parked = w.wait_events("budget_parked", 1);
    let until_ms = parked[0]["payload"]["until_ms"].as_i64().unwrap();
    assert_eq!(until_ms, midnight, "{}", parked[0]);
    assert!(
        parked[0]["payload"]["until"]
            .as_str()
            .unwrap()
            .ends_with("T00:00:00+00:00")
    );
    // The turn's end is recorded after its park: wait for it, not race it.
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["budget_exhausted"]);
    assert!(w.posts().is_empty());

    // Nobody sends anything: the window turns over and the work runs.
    ai.reply("exec-a", post_and_submit("C1", "1", "after midnight"));
    ai.reply("review", verdict("done"));
    assert!(
        eventually(Duration::from_secs(120), || outcomes(&w).len() == 2),
        "{}",
        w.node.log_text()
    );
    assert_eq!(outcomes(&w), ["budget_exhausted", "delivered"]);
    let started: Vec<i64> = w
        .events("turn_started")
        .iter()
        .map(|e| e["at_ms"].as_i64().unwrap())
        .collect();
    let resumed = started.iter().max().copied().unwrap();
    assert!(
        resumed >= until_ms,
        "the work ran after the window turned: {started:?} vs {until_ms}"
    );
    eprintln!(
        "parked work resumed {} ms after its window turned over",
        resumed - until_ms
    );
    let texts: Vec<String> = w
        .posts()
        .iter()
        .map(|p| p["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(texts, ["after midnight"]);
    assert_eq!(w.events("budget_parked").len(), 1);
}
