//! Seats and turns end to end: the real binary, its embedded nats-server,
//! real plugin components (Slack webhook, the OpenAI provider talking to a
//! local server that speaks the OpenAI wire format), and a real MCP child
//! per seat (`crewlet mcp chat`, recording every post to a file).

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::company::{SCRIPTED_COMPANY, SLACK_SECRET, fill};
use common::{Node, Sandbox, broker_login, eventually};
use crewlet_testkit::PluginsDir;
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use serde_json::{Value, json};

/// A plugins dir for a test: the built Slack and scripted components, and
/// the OpenAI provider pointed at `ai`.
pub(crate) fn plugins(sb: &Sandbox, ai: Option<&ScriptedOpenAi>) -> PathBuf {
    let dir = PluginsDir::new(sb.path("plugins"));
    dir.add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    if let Some(ai) = ai {
        dir.add_provider_at(
            "openai",
            "plugins/providers/openai/plugin.toml",
            &ai.base_url(),
            &ai.origin(),
        );
    }
    dir.path().to_owned()
}

pub(crate) struct World {
    pub(crate) sb: Sandbox,
    pub(crate) node: Node,
    chat_log: PathBuf,
    /// More of the node's configuration file (TOML), kept for restarts.
    node_extra: String,
}

pub(crate) fn start(company: &str, ai: Option<&ScriptedOpenAi>, envs: &[(&str, &str)]) -> World {
    start_with(company, ai, envs, "")
}

/// [`start`] with `node_extra` appended to the node's configuration file.
pub(crate) fn start_with(
    company: &str,
    ai: Option<&ScriptedOpenAi>,
    envs: &[(&str, &str)],
    node_extra: &str,
) -> World {
    start_custom(company, envs, node_extra, |sb| {
        plugins(sb, ai);
    })
}

/// [`start_with`], the plugins dir filled by `plugins`.
pub(crate) fn start_custom(
    company: &str,
    envs: &[(&str, &str)],
    node_extra: &str,
    plugins: impl FnOnce(&Sandbox),
) -> World {
    let sb = Sandbox::new();
    let chat_log = sb.path("chat.jsonl");
    let company_file = sb.path("company.toml");
    std::fs::write(&company_file, fill(company, &chat_log)).unwrap();
    plugins(&sb);
    let node = spawn(&sb, envs, node_extra);
    World {
        sb,
        node,
        chat_log,
        node_extra: node_extra.to_string(),
    }
}

/// A node of the sandbox `start` wrote, ready.
fn spawn(sb: &Sandbox, envs: &[(&str, &str)], node_extra: &str) -> Node {
    let mut b = sb
        .node(&format!(
            "[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n{node_extra}"
        ))
        .arg("--company")
        .arg(sb.path("company.toml"))
        .arg("--plugins")
        .arg(sb.path("plugins"))
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET);
    for (k, v) in envs {
        b = b.env(k, v);
    }
    let mut node = b.spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

impl World {
    /// Starts the node again on the same data dir (its broker's store, its
    /// event log), with `envs`; the old one must have exited.
    pub(crate) fn restart(&mut self, envs: &[(&str, &str)]) {
        self.node = spawn(&self.sb, envs, &self.node_extra);
    }

    /// [`World::restart`] with `node_extra` replacing the configuration's
    /// extra part from now on.
    pub(crate) fn restart_with(&mut self, envs: &[(&str, &str)], node_extra: &str) {
        self.node_extra = node_extra.to_string();
        self.restart(envs);
    }

    /// Sends a signed Slack `app_mention` in `channel`, thread `ts`, to
    /// `handle` (each event its own post: [`common::post_slack_mention`]).
    pub(crate) fn mention(
        &self,
        handle: &str,
        event_id: &str,
        channel: &str,
        ts: &str,
        text: &str,
    ) {
        common::slack_mention(
            &self.node,
            SLACK_SECRET,
            handle,
            event_id,
            channel,
            ts,
            text,
        );
    }

    pub(crate) fn events(&self, kind: &str) -> Vec<Value> {
        common::events(&self.node, kind)
    }

    pub(crate) fn wait_events(&self, kind: &str, n: usize) -> Vec<Value> {
        common::wait_events(&self.node, kind, n)
    }

    /// The posts the chat server recorded, oldest first.
    pub(crate) fn posts(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.chat_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a post is JSON"))
            .collect()
    }

    fn nats(&self) -> String {
        let h = self.node.health();
        h["stream"]["urls"][0]
            .as_str()
            .unwrap_or_else(|| panic!("no stream url in /health: {h}"))
            .to_owned()
    }
}

/// `turn_ended` events, oldest first, with their outcome.
pub(crate) fn outcomes(w: &World) -> Vec<String> {
    let mut ended = w.events("turn_ended");
    ended.reverse();
    ended
        .iter()
        .map(|e| e["payload"]["outcome"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub(crate) const OPENAI_COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [
  { provider = "openai", model = "exec-a", credentials = ["${KEY_ONE}", "${KEY_TWO}"] },
  { provider = "openai", model = "exec-b", credentials = "${KEY_TWO}" },
]
reviewer = { provider = "openai", model = "review", credentials = "${KEY_TWO}" }
max_iterations = 2
max_tool_rounds = 6
{chat}
[seats]
ada = { role = "support" }
bob = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

pub(crate) const KEYS: &[(&str, &str)] = &[("KEY_ONE", "sk-one-1111"), ("KEY_TWO", "sk-two-2222")];

pub(crate) fn post(channel: &str, thread: &str, text: &str) -> Reply {
    Reply::ToolCalls(vec![(
        "chat__post_message".into(),
        json!({"channel": channel, "thread": thread, "text": text}),
    )])
}

pub(crate) fn submit(outcome: &str) -> Reply {
    Reply::ToolCalls(vec![(
        "submit_work".into(),
        json!({"outcome": outcome, "summary": "done here"}),
    )])
}

pub(crate) fn verdict(v: &str) -> Reply {
    Reply::ToolCalls(vec![(
        "submit_review".into(),
        json!({"verdict": v, "feedback": ""}),
    )])
}

#[test]
fn a_slack_mention_becomes_one_reply_by_that_seat_in_its_thread() {
    let ai = ScriptedOpenAi::start();
    let w = start(OPENAI_COMPANY, Some(&ai), KEYS);
    ai.reply("exec-a", post("C1", "17.1", "Hi, ada here."));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("ada", "Ev1", "C1", "17.1", "<@ada> can you help?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    let posts = w.posts();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(
        (&posts[0]["as"], &posts[0]["channel"], &posts[0]["thread"]),
        (&json!("ada"), &json!("C1"), &json!("17.1"))
    );
    assert_eq!(w.events("reply_posted").len(), 1);
    // The turn's events are ada's in the party index, named as the wake
    // names her (`seat:HANDLE`).
    let of_ada = w
        .node
        .get("/events?party=seat:ada&type=turn_ended")
        .expect("GET /events")
        .json();
    assert_eq!(
        of_ada["events"].as_array().map(Vec::len),
        Some(1),
        "{of_ada}"
    );
    // The node's status (its presence row, and /health) carries one row per
    // MCP server: both seats' chat children started, five tools each.
    let health = w.node.health();
    let chat = health["mcp"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["server"] == "chat"))
        .unwrap_or_else(|| panic!("no chat row in /health: {health}"));
    assert_eq!(
        (&chat["started"], &chat["failed"], &chat["tools"]),
        (&json!(2), &json!(0), &json!(5)),
        "{chat}"
    );
    assert_eq!(health["seats_held"], 2);

    // bob's own child posts as bob: two seats of one template never share.
    ai.reply("exec-a", post("C2", "9.9", "bob here"));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("bob", "Ev2", "C2", "9.9", "<@bob> hello");
    w.wait_events("turn_ended", 2);
    let posts = w.posts();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[1]["as"], "bob");

    // A redelivered wake (same trigger, new stream message) does not run
    // the turn again: the completion ledger says it was served.
    let seen = ai.requests().len();
    let wakes = w.events("wake_published");
    let ada = wakes
        .iter()
        .find(|e| e["payload"]["handle"] == "ada")
        .expect("ada's wake event");
    let (url, login) = (w.nats(), broker_login(&w.node.health()));
    rt().block_on(async {
        let client = login.connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client.clone());
        let payload = json!({
            "trace_id": ada["trace_id"], "delivery_id": "Ev1", "source": "slack",
            "event_type": "app_mention", "handle": "ada",
            "seat_id": crewlet_company::seat_id("Acme", &crewlet_company::Handle::parse("ada").unwrap()).to_string(),
            "reason": "route",
            "text": "<@ada> can you help?", "conversation": "C1#17.1",
            "channel": "C1", "thread": "17.1",
        });
        js.publish(crewlet_bus::inbox_subject("ada"), payload.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
        let stream = js.get_stream(crewlet_bus::AGENT_STREAM).await.unwrap();
        let drained = async {
            loop {
                let info = stream.consumer_info(crewlet_bus::mailbox_durable("ada")).await.unwrap();
                if info.num_pending == 0 && info.num_ack_pending == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), drained)
            .await
            .expect("the redelivered wake is acked");
    });
    assert_eq!(
        ai.requests().len(),
        seen,
        "no model call for a served trigger"
    );
    assert_eq!(w.posts().len(), 2, "no second post");
    assert_eq!(outcomes(&w).len(), 2, "no second turn");
}

#[test]
fn a_rate_limited_key_is_benched_fleet_wide_and_the_chain_falls_back() {
    let ai = ScriptedOpenAi::start();
    let w = start(OPENAI_COMPANY, Some(&ai), KEYS);
    // Turn 1: the first key is told 429 → the second key answers.
    ai.reply("exec-a", Reply::rate_limited(120));
    ai.reply("exec-a", post("C1", "1.1", "one"));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("ada", "Ev10", "C1", "1.1", "first");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    let exec_a: Vec<_> = ai
        .requests()
        .into_iter()
        .filter(|r| r.model == "exec-a")
        .collect();
    assert_eq!(exec_a[0].bearer.as_deref(), Some("sk-one-1111"));
    assert!(
        exec_a[1..]
            .iter()
            .all(|r| r.bearer.as_deref() == Some("sk-two-2222")),
        "a benched key is not used again"
    );
    let (url, login) = (w.nats(), broker_login(&w.node.health()));
    let cooling = rt().block_on(async {
        let client = login.connect(url).await.unwrap();
        let owner = crewlet_coord::Owner::incarnation("turns-test");
        let coord = crewlet_coord::Coord::open(client, crewlet_coord::CoordOptions::new(owner))
            .await
            .unwrap();
        coord.cooldowns().await.unwrap()
    });
    let hint = crewlet_coord::key_hint("sk-one-1111");
    let c = cooling
        .iter()
        .find(|c| c.hint == hint)
        .unwrap_or_else(|| panic!("the 429'd key is benched in coordination: {cooling:?}"));
    let left = c
        .until
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        left > Duration::from_secs(60) && left <= Duration::from_secs(121),
        "{left:?}"
    );

    // Turn 2: exec-a fails → exec-b answers; the fallback is an event
    // addressed to the turn, the phase and the iteration.
    ai.reply("exec-a", Reply::error(500, "upstream exploded"));
    ai.reply("exec-b", post("C1", "2.2", "two"));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("ada", "Ev11", "C1", "2.2", "second");
    w.wait_events("turn_ended", 2);
    assert_eq!(outcomes(&w), ["delivered", "delivered"]);
    let fb = w.wait_events("provider_fallback", 1);
    let p = &fb[0]["payload"];
    assert_eq!(
        (p["phase"].as_str(), p["iteration"].as_u64()),
        (Some("executor"), Some(1))
    );
    assert!(p["turn_id"].is_string());

    // Turn 3: every model fails → llm_unavailable, the turn fails, and no
    // key appears in what the fleet is told.
    for _ in 0..2 {
        ai.reply("exec-a", Reply::error(500, "down"));
        ai.reply("exec-b", Reply::error(503, "down too"));
    }
    w.mention("ada", "Ev12", "C1", "3.3", "third");
    w.wait_events("turn_ended", 3);
    assert_eq!(outcomes(&w)[2], "llm_unavailable");
    let un = w.wait_events("llm_unavailable", 1);
    let text = un[0].to_string();
    assert!(
        !text.contains("sk-one") && !text.contains("sk-two"),
        "{text}"
    );
    assert_eq!(w.posts().len(), 2);
}

#[test]
fn delivery_is_the_engines_judgement() {
    let ai = ScriptedOpenAi::start();
    let w = start(OPENAI_COMPANY, Some(&ai), KEYS);
    // A delivery claimed with nothing posted is bounced at decode time; a
    // no_action the reviewer calls done is overturned (a reply was owed);
    // the second iteration posts and is accepted.
    ai.reply("exec-a", submit("delivered"));
    ai.reply("exec-a", submit("no_action"));
    ai.reply("review", verdict("done"));
    ai.reply("exec-a", post("C7", "7.7", "here it is"));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("ada", "Ev20", "C7", "7.7", "<@ada> answer me");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    assert_eq!(w.events("review_overturned").len(), 1);
    assert_eq!(
        ai.requests().iter().filter(|r| r.model == "review").count(),
        2,
        "the bounced claim cost no review call"
    );
    let bounced = ai
        .requests()
        .iter()
        .filter(|r| r.model == "exec-a")
        .nth(1)
        .map(|r| r.messages.to_string())
        .unwrap();
    assert!(bounced.contains("Refused: you claim delivery"), "{bounced}");
    assert_eq!(w.posts().len(), 1);
}

const BUDGET_COMPANY: &str = r#"
[org]
name = "Acme"
budget = { day = 8000 }
[roles.capped]
system_prompt = "You answer."
executor = [{ provider = "openai", model = "exec-c", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review-c", credentials = "${KEY_ONE}" }
budget = { day = 3000 }
{chat:capped}
[roles.support]
system_prompt = "You answer."
executor = [{ provider = "openai", model = "exec-a", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review", credentials = "${KEY_ONE}" }
{chat}
[roles.later]
system_prompt = "You answer."
executor = [{ provider = "openai", model = "exec-d", credentials = "${KEY_ONE}" }]
reviewer = { provider = "openai", model = "review-d", credentials = "${KEY_ONE}" }
{chat:later}
[seats]
ada = { role = "capped" }
bob = { role = "support" }
cy = { role = "later" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

/// A post and a claim of delivery in one answer.
pub(crate) fn post_and_submit(channel: &str, thread: &str, text: &str) -> Reply {
    Reply::ToolCalls(vec![
        (
            "chat__post_message".into(),
            json!({"channel": channel, "thread": thread, "text": text}),
        ),
        (
            "submit_work".into(),
            json!({"outcome": "delivered", "summary": "answered"}),
        ),
    ])
}

/// The `GET /agents` row of `handle`.
pub(crate) fn agent(w: &World, handle: &str) -> Value {
    let all = w.node.get("/agents").expect("GET /agents").json();
    all["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["handle"] == handle)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The `GET /budgets` scope named `name` (`company`, `seat:HANDLE`).
pub(crate) fn budget_scope(w: &World, name: &str) -> Value {
    let b = w.node.get("/budgets").expect("GET /budgets").json();
    b["scopes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["scope"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn model_tokens(w: &World) -> Vec<u64> {
    w.events("model_call")
        .iter()
        .map(|c| {
            c["payload"]["input_tokens"].as_u64().unwrap()
                + c["payload"]["output_tokens"].as_u64().unwrap()
        })
        .collect()
}

#[test]
fn budgets_stop_the_next_call_park_the_work_until_room_and_never_pass_an_outage_off_as_a_refusal() {
    let ai = ScriptedOpenAi::start();
    let w = start(BUDGET_COMPANY, Some(&ai), KEYS);
    let api = format!("http://{}", w.node.api);
    // ada's seat cap (3000/day) is passed by the first call, billed past
    // the ceiling it asked for (a tokenizer the estimate undercounts): the
    // reply that paid answer chose is posted, no second call is made, the
    // work parks.
    ai.reply("exec-c", Reply::billed(100, 5_000, post("C1", "1", "x")));
    w.mention("ada", "Ev30", "C1", "1", "hi");
    w.wait_events("budget_parked", 1);
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["budget_exhausted"]);
    assert_eq!(ai.requests().len(), 1, "the refusal stopped the next call");
    assert_eq!(w.posts().len(), 1, "the paid answer's reply was posted");
    let ex = w.events("budget_exhausted");
    assert_eq!(ex[0]["payload"]["scope"], "seat:ada");
    assert_eq!(ex[0]["payload"]["before_first_call"], false);
    assert_eq!(
        ex[0]["payload"]["spent"].as_u64(),
        model_tokens(&w).first().copied(),
        "the refusal carries the spend it saw"
    );
    let parked = w.events("budget_parked");
    assert_eq!(parked[0]["payload"]["scope"], "seat:ada");
    assert_eq!(parked[0]["payload"]["period"], "day");
    let until = parked[0]["payload"]["until"].as_str().unwrap().to_owned();
    assert!(until.ends_with("T00:00:00+00:00"), "{until}");
    // A parked seat takes none of its other work: the next mention waits
    // in its mailbox beside the first, and no turn starts.
    w.mention("ada", "Ev31", "C1", "1", "still there?");
    assert!(
        eventually(Duration::from_secs(30), || {
            let a = agent(&w, "ada");
            a["mailbox"]["pending"].as_u64().unwrap_or(0)
                + a["mailbox"]["in_work"].as_u64().unwrap_or(0)
                == 2
        }),
        "{}",
        agent(&w, "ada")
    );
    assert_eq!(w.events("turn_started").len(), 1);
    let a = agent(&w, "ada");
    assert_eq!(a["state"], "parked", "{a}");
    assert_eq!(
        a["reason"],
        format!("budget: day window until {until}"),
        "{a}"
    );
    let (status, out) = common::run_to_exit(&["agents", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    assert!(
        out.contains(&format!("parked (budget: day window until {until})")),
        "{out}"
    );
    let seat = budget_scope(&w, "seat:ada");
    assert_eq!(seat["parked"][0]["seat"], "ada", "{seat}");
    assert_eq!(seat["parked"][0]["wakes"], 2, "{seat}");

    // bob's model would answer at length: the call is asked for no more
    // than the company's room, and the call after it, whose prompt would
    // not fit, is not made. bob parks on the company's window.
    ai.reply("exec-a", Reply::Text("word ".repeat(20_000)));
    w.mention("bob", "Ev32", "C9", "9", "tell me everything");
    w.wait_events("budget_parked", 2);
    assert_eq!(ai.requests().len(), 2);
    let company = budget_scope(&w, "company");
    let spent = company["windows"]["day"]["spent"].as_u64().unwrap();
    let prompt = w
        .events("model_call")
        .iter()
        .map(|c| c["payload"]["input_tokens"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(
        spent <= 8000 + prompt,
        "the company spent {spent} of 8000, more than one prompt ({prompt}) over"
    );
    // cy's work is parked before any call: the company is full.
    w.mention("cy", "Ev33", "C7", "7", "hello?");
    w.wait_events("budget_parked", 3);
    w.wait_events("turn_ended", 3);
    assert_eq!(
        ai.requests().len(),
        2,
        "no model call when the window is full"
    );
    assert_eq!(
        outcomes(&w),
        ["budget_exhausted", "budget_exhausted", "parked"]
    );
    let first = w
        .events("budget_exhausted")
        .into_iter()
        .find(|e| e["payload"]["before_first_call"] == true)
        .expect("a refusal recorded before the first call");
    assert_eq!(first["payload"]["scope"], "company");
    let company = budget_scope(&w, "company");
    let on_company: Vec<&str> = company["parked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["seat"].as_str().unwrap())
        .collect();
    assert_eq!(on_company, ["bob", "cy"], "{company}");
    let (_, shown) = common::run_to_exit(&["budgets", "show", "--api", &api], &[]);
    assert!(shown.contains("refused"), "{shown}");

    // A config apply raises the caps: every parked seat takes its work by
    // itself — nobody sends anything.
    ai.reply("exec-c", post_and_submit("C1", "1", "back with more"));
    ai.reply("review-c", verdict("done"));
    ai.reply("exec-a", post_and_submit("C9", "9", "the short version"));
    ai.reply("review", verdict("done"));
    ai.reply("exec-d", post_and_submit("C7", "7", "hello"));
    ai.reply("review-d", verdict("done"));
    let doc = std::fs::read_to_string(w.sb.path("company.toml"))
        .unwrap()
        .replace("budget = { day = 8000 }", "budget = { day = 10000000 }")
        .replace("budget = { day = 3000 }", "budget = { day = 10000000 }");
    let put = common::http::request(&w.node.api, "PUT", "/config", &[], doc.as_bytes()).unwrap();
    assert_eq!(put.status, 201, "{}", put.text());
    w.wait_events("turn_ended", 6);
    let mut resumed = outcomes(&w)[3..].to_vec();
    resumed.sort();
    assert_eq!(resumed, ["delivered", "delivered", "delivered"]);
    assert_eq!(
        w.events("budget_parked").len(),
        3,
        "each park recorded once"
    );
    assert_eq!(w.events("budget_exhausted").len(), 3);
    let texts: Vec<String> = w
        .posts()
        .iter()
        .map(|p| p["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    for said in ["x", "back with more", "the short version", "hello"] {
        assert!(texts.iter().any(|t| t == said), "{texts:?}");
    }
    let (_, shown) = common::run_to_exit(&["budgets", "show", "--api", &api], &[]);
    assert!(
        !shown.contains("refused"),
        "a raised cap leaves room: {shown}"
    );
    assert_eq!(agent(&w, "ada")["state"], "held");

    // The budget counters unreachable (their bucket gone): an outage, not a
    // refusal — the turn fails and the wake is kept for a retry.
    let (url, login) = (w.nats(), broker_login(&w.node.health()));
    rt().block_on(async {
        let client = login.connect(url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        js.delete_stream("KV_crewlet_budgets").await.unwrap();
    });
    let refusals = w.events("budget_exhausted").len();
    w.mention("bob", "Ev40", "C1", "40", "still there?");
    let ended = outcomes(&w).len() + 1;
    w.wait_events("turn_ended", ended);
    assert_eq!(outcomes(&w).last().map(String::as_str), Some("outage"));
    assert_eq!(w.events("budget_exhausted").len(), refusals);
}

#[test]
fn the_scripted_provider_runs_a_whole_turn_without_any_vendor() {
    let w = start(SCRIPTED_COMPANY, None, &[]);
    w.mention("ada", "Ev50", "C5", "5.5", "<@ada> demo");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    let posts = w.posts();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0]["text"], "Hello from ada!");
    assert_eq!(posts[0]["thread"], "5.5");
    let calls = w.events("model_call");
    assert!(calls.iter().all(|c| {
        c["payload"]["model"]
            .as_str()
            .unwrap()
            .starts_with("scripted/")
    }));
}

#[test]
fn the_sample_webhook_command_is_answered_and_budgets_show_the_spend() {
    let w = start(SCRIPTED_COMPANY, None, &[]);
    let api = format!("http://{}", w.node.api);
    let (status, out) = common::run_to_exit(
        &["webhook", "sample", "--to", "ada", "--api", &api],
        &[("SLACK_SIGNING_SECRET", SLACK_SECRET)],
    );
    assert!(status.success(), "{out}");
    assert!(out.contains("202"), "{out}");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    assert_eq!(w.posts()[0]["as"], "ada");

    let (status, out) = common::run_to_exit(&["budgets", "show", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("company") && out.contains("seat:ada"), "{out}");

    // Without the secret the command says what to set, and sends nothing.
    let (status, out) = common::run_to_exit(
        &[
            "webhook",
            "sample",
            "--to",
            "ada",
            "--api",
            &api,
            "--secret-env",
            "NO_SUCH_SECRET_VAR",
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("NO_SUCH_SECRET_VAR"), "{out}");
}

#[test]
fn a_paused_seat_keeps_its_wakes_in_its_mailbox_until_resumed() {
    let company = SCRIPTED_COMPANY.replace(
        "ada = { role = \"support\" }",
        "ada = { role = \"support\" }\nbob = { role = \"support\" }",
    );
    let w = start(&company, None, &[]);
    let api = format!("http://{}", w.node.api);
    let paused = |w: &World| w.node.health()["paused_seats"].clone();
    assert!(eventually(Duration::from_secs(10), || paused(&w) == json!([])));

    let (status, out) = common::run_to_exit(
        &[
            "agents",
            "pause",
            "ada",
            "--reason",
            "maintenance",
            "--api",
            &api,
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    let said: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (said["paused"].clone(), said["record"]["reason"].clone()),
        (json!(true), json!("maintenance"))
    );
    assert!(
        eventually(Duration::from_secs(10), || paused(&w) == json!(["ada"])),
        "{}",
        w.node.health()
    );

    // Ada's mention waits; Bob's, sent after it, is answered.
    w.mention("ada", "Ev70", "C7", "7.1", "<@ada> are you there?");
    w.mention("bob", "Ev71", "C7", "7.2", "<@bob> are you there?");
    w.wait_events("turn_ended", 1);
    let started = w.events("turn_started");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["seat"], "bob");
    assert!(
        w.posts().iter().all(|p| p["as"] != "ada"),
        "{:?}",
        w.posts()
    );

    // Unknown seats are named, nothing written.
    let r = crewlet_testkit::http::post(&w.node.api, "/agents/nobody/pause", &[], b"").unwrap();
    assert_eq!(r.status, 404, "{}", r.text());

    let (status, out) = common::run_to_exit(&["agents", "resume", "ada", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("\"was_paused\":true"), "{out}");
    w.wait_events("turn_ended", 2);
    assert_eq!(outcomes(&w), ["delivered", "delivered"]);
    let ada: Vec<Value> = w.posts().into_iter().filter(|p| p["as"] == "ada").collect();
    assert_eq!(ada.len(), 1, "answered once, after the resume: {ada:?}");
    assert_eq!(ada[0]["thread"], "7.1");
}
