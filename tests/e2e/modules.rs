//! Modules in the running node: a seat calls a module's tools, the module
//! hears the company's events and publishes its own, and an operator sees
//! all of it — the real binary, its embedded nats-server, real components
//! (`plugins/modules/notebook`, `plugins/testdata/tool-module`), the
//! scripted provider and a real chat MCP child per seat.

use crate::common;

use std::time::{Duration, Instant};

use common::{Node, Sandbox, dir_is_absent_or_empty, eventually, http, run_to_exit};
use crewlet_testkit::PluginsDir;
use serde_json::{Value, json};

const SLACK_SECRET: &str = "slack-signing-secret";

/// A company whose `support` seats may use `modules` and whose scripted
/// model makes `steps` (a TOML array's items) before it posts and submits.
fn company(modules: &str, steps: &str, chat_log: &std::path::Path) -> String {
    format!(
        r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
modules = [{modules}]
executor = [{{ provider = "scripted", model = "demo", options = {{ steps = [
  {steps}
  {{ call = "chat__post_message", args = {{ channel = "{{{{wake.channel}}}}", thread = "{{{{wake.thread}}}}", text = "done: {{{{last_tool_result}}}}" }} }},
  {{ call = "submit_work", args = {{ outcome = "delivered", summary = "replied" }} }},
] }} }}]
reviewer = {{ provider = "scripted", model = "demo-review", options = {{ steps = [
  {{ call = "submit_review", args = {{ verdict = "done" }} }},
] }} }}
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {log:?} }}
replies = ["post_message"]
[seats]
ada = {{ role = "support" }}
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#,
        log = chat_log.display().to_string()
    )
}

struct World {
    _sb: Sandbox,
    node: Node,
}

fn start(modules: &str, steps: &str) -> World {
    let sb = Sandbox::new();
    let doc = company(modules, steps, &sb.path("chat.jsonl"));
    let company_file = sb.path("company.toml");
    std::fs::write(&company_file, doc).unwrap();
    let dir = PluginsDir::new(sb.path("plugins"));
    dir.add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml")
        .add("notebook", "plugins/modules/notebook/plugin.toml")
        .add("tool-module", "plugins/testdata/tool-module/plugin.toml");
    let mut node = sb
        .node("[coordination]\nheartbeat_seconds = 1\nlease_ttl_seconds = 3\n")
        .arg("--company")
        .arg(&company_file)
        .arg("--plugins")
        .arg(dir.path())
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    World { _sb: sb, node }
}

impl World {
    fn mention(&self, event_id: &str, text: &str) {
        common::slack_mention(&self.node, SLACK_SECRET, "ada", event_id, "C1", "1.1", text);
    }

    fn plugin(&self, name: &str) -> Value {
        let view = self.node.get("/plugins").expect("GET /plugins").json();
        view["plugins"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no plugin {name} in {view}"))
    }

    fn state(&self, module: &str, bucket: &str) -> Value {
        let r = self
            .node
            .get(&format!("/plugins/{module}/state/{bucket}"))
            .expect("GET state");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    fn tool_calls(&self) -> Vec<Value> {
        common::events(&self.node, "tool_call")
    }
}

fn entry<'a>(state: &'a Value, key: &str) -> Option<&'a Value> {
    state["entries"]
        .as_array()?
        .iter()
        .find(|e| e["key"] == key)
        .map(|e| &e["value"])
}

#[test]
fn a_seat_writes_in_the_notebook_and_the_notebook_hears_the_turn_end() {
    let w = start(
        r#""notebook""#,
        r#"{ call = "notebook__write", args = { title = "Asked by U1", text = "{{wake.text}}" } },"#,
    );
    let view = w.plugin("notebook");
    assert_eq!(
        view["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["read", "worked", "write"],
        "{view}"
    );
    assert_eq!(
        view["subscriptions"]["turn_ended"]["delivery"], "once",
        "{view}"
    );

    w.mention("Ev1", "<@ada> please note the deploy window");
    common::wait_events(&w.node, "turn_ended", 1);

    // The tool ran as ada, in her turn, and the model read its answer.
    let calls = w.tool_calls();
    let write = calls
        .iter()
        .find(|c| c["payload"]["tool"] == "notebook__write")
        .unwrap_or_else(|| panic!("{calls:?}"));
    assert_eq!(write["payload"]["ok"], true, "{write}");
    let notes = w.state("notebook", "notes");
    let note = entry(&notes, "asked-by-u1").unwrap_or_else(|| panic!("{notes}"));
    assert_eq!(note["by"], "ada");
    assert_eq!(note["turn_id"], write["payload"]["turn_id"]);
    assert!(
        note["text"]
            .as_str()
            .unwrap()
            .contains("please note the deploy window"),
        "{note}"
    );

    // Its publication is an event of the log, and the turn's end reached
    // its subscription: who worked on what, last.
    let changed = common::wait_events(&w.node, "module.notebook.changed", 1);
    assert_eq!(changed[0]["payload"]["key"], "asked-by-u1");
    assert!(
        eventually(Duration::from_secs(15), || {
            entry(&w.state("notebook", "worked"), "ada")
                .is_some_and(|last| last["outcome"] == "delivered")
        }),
        "{}\n{}",
        w.state("notebook", "worked"),
        w.node.log_text()
    );
    let subs = &w.plugin("notebook")["subscriptions"]["turn_ended"];
    assert_eq!(subs["handled"], 1, "{subs}");

    // What each bucket holds, on /plugins and through the command line.
    let view = w.node.get("/plugins").unwrap().json();
    let row = |name: &str| {
        view["buckets"]
            .as_array()
            .and_then(|rows| rows.iter().find(|b| b["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no bucket {name} in {view}"))
    };
    for bucket in ["mod_notebook_notes", "mod_notebook_worked"] {
        let b = row(bucket);
        assert_eq!(b["keys"], 1, "{b}");
        assert!(b["bytes"].as_u64().is_some_and(|n| n > 0), "{b}");
        assert_eq!(b["max_bytes"], 64 * 1024 * 1024, "{b}");
    }
    let (status, out) = common::run_to_exit(
        &[
            "plugins",
            "list",
            "--api",
            &format!("http://{}", w.node.api),
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    for line in [
        "tool notebook__write",
        "subscribes turn_ended (once)",
        "publishes module.notebook.changed",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("bucket mod_notebook_notes: 1 keys, ")
                && l.contains(" bytes of 67108864")),
        "{out}"
    );

    // An unknown module, bucket or one the module only reads: 404.
    for path in [
        "/plugins/nobody/state/notes",
        "/plugins/notebook/state/nope",
    ] {
        assert_eq!(w.node.get(path).unwrap().status, 404, "{path}");
    }
}

#[test]
fn a_module_tool_that_loops_traps_or_is_called_wrong_is_a_tool_error_and_the_turn_goes_on() {
    let w = start(
        r#""tool-module""#,
        r#"{ call = "tool-module__loop", args = {} },
  { call = "tool-module__trap", args = {} },
  { call = "tool-module__echo", args = { nonsense = 1 } },
  { call = "tool-module__echo", args = { text = "still here" } },
  { call = "tool-module__calls", args = {} },"#,
    );
    w.mention("Ev2", "<@ada> try the tools");
    let t0 = Instant::now();
    // The loop is stopped at the module's deadline; /health answers
    // meanwhile.
    while t0.elapsed() < Duration::from_secs(2) {
        let h = Instant::now();
        assert_eq!(w.node.get("/health").unwrap().status, 200);
        assert!(h.elapsed() < Duration::from_secs(1), "{:?}", h.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    let ended = common::wait_events(&w.node, "turn_ended", 1);
    assert_eq!(ended[0]["payload"]["outcome"], "delivered", "{ended:?}");
    let mut calls = w.tool_calls();
    calls.reverse();
    let by_tool: Vec<(&str, bool)> = calls
        .iter()
        .filter_map(|c| {
            let tool = c["payload"]["tool"].as_str()?;
            tool.starts_with("tool-module__")
                .then(|| (tool, c["payload"]["ok"].as_bool().unwrap()))
        })
        .collect();
    assert_eq!(
        by_tool,
        [
            ("tool-module__loop", false),
            ("tool-module__trap", false),
            ("tool-module__echo", false),
            ("tool-module__echo", true),
            ("tool-module__calls", true),
        ]
    );
    // The trap replaced the instance; the echo against the schema was
    // refused before the module ran: the fresh instance ran two tool calls
    // (the good echo, then `calls`), not three.
    let posts = std::fs::read_to_string(w._sb.path("chat.jsonl")).unwrap();
    assert!(posts.contains("done: 2"), "{posts}");
    let view = w.plugin("tool-module");
    assert_eq!(view["last_fault_kind"], "trap", "{view}");
    assert_eq!(view["faults"], 2, "the loop and the trap: {view}");
}

/// Publishes a `turn_ended` row for `seat` with `payload` on the node's
/// broker, as a turn of any node would be broadcast.
async fn publish_turn_ended(js: &async_nats::jetstream::Context, seat: &str, payload: Value) {
    let row = json!({
        "event_id": format!("test-{seat}"), "type": "turn_ended", "at_ms": 1,
        "node_id": "elsewhere", "trace_id": null, "seat": seat, "conversation": null,
        "payload": payload, "parties": [],
    });
    js.publish(
        crewlet_bus::event_subject("turn_ended"),
        row.to_string().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

#[test]
fn an_event_a_module_refuses_is_dead_lettered_and_one_it_traps_on_waits_while_a_healthy_module_goes_on()
 {
    use futures::StreamExt;
    let w = start(r#""notebook""#, "");
    let health = w.node.health();
    let url = health["stream"]["urls"][0].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (js, dlq) = rt.block_on(async {
        let client = common::broker_login(&health).connect(url).await.unwrap();
        let dlq = client
            .subscribe(crewlet_bus::module_dlq_subject("tool-module"))
            .await
            .unwrap();
        (async_nats::jetstream::new(client), dlq)
    });
    // Both modules subscribe to turn_ended; wait until both consume.
    let consuming =
        |w: &World, m: &str| w.plugin(m)["subscriptions"]["turn_ended"]["state"] == "consuming";
    assert!(eventually(Duration::from_secs(20), || {
        consuming(&w, "tool-module") && consuming(&w, "notebook")
    }));

    // The healthy module hears an event at once, whatever the other does.
    let heard = |seat: &str| {
        let t0 = Instant::now();
        let ok = eventually(Duration::from_secs(5), || {
            entry(&w.state("notebook", "worked"), seat).is_some()
        });
        assert!(ok, "{}", w.state("notebook", "worked"));
        t0.elapsed()
    };

    rt.block_on(publish_turn_ended(
        &js,
        "refused",
        json!({"refuse": true, "outcome": "x"}),
    ));
    let first = heard("refused");
    // Refused five times (1 + 2 + 4 + 8 s apart), then dead-lettered with
    // the module's reason.
    let letter = rt.block_on(async {
        let mut dlq = dlq;
        tokio::time::timeout(Duration::from_secs(40), dlq.next())
            .await
            .expect("a dead letter within 40 s")
            .unwrap()
    });
    let letter: Value = serde_json::from_slice(&letter.payload).unwrap();
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains("refused on purpose"),
        "{letter}"
    );
    assert_eq!(letter["failures"], 5, "{letter}");
    assert!(
        letter["original"]
            .as_str()
            .unwrap()
            .contains("\"refuse\":true")
    );
    assert!(eventually(Duration::from_secs(5), || {
        let sub = &w.plugin("tool-module")["subscriptions"]["turn_ended"];
        sub["dead_lettered"] == 1 && sub["refused"] == 5
    }));

    // An event it traps on is not its refusal: it waits in the durable and
    // is offered again; nothing is lost, and the healthy module goes on.
    rt.block_on(publish_turn_ended(
        &js,
        "trapping",
        json!({"trap": true, "outcome": "y"}),
    ));
    let second = heard("trapping");
    assert!(
        eventually(Duration::from_secs(15), || {
            let v = w.plugin("tool-module");
            v["last_fault_kind"] == "trap"
                && v["subscriptions"]["turn_ended"]["waited"].as_u64().unwrap() >= 2
        }),
        "{}",
        w.plugin("tool-module")
    );
    let pending = rt.block_on(async {
        let stream = js.get_stream(crewlet_bus::EVENTS_STREAM).await.unwrap();
        let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .get_consumer(&crewlet_bus::module_durable("tool-module", "turn_ended"))
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        info.num_ack_pending + info.num_pending as usize
    });
    assert!(pending >= 1, "the trapping event is kept");
    let sub = &w.plugin("tool-module")["subscriptions"]["turn_ended"];
    assert_eq!(sub["dead_lettered"], 1, "not dead-lettered: {sub}");
    assert!(first < Duration::from_secs(5) && second < Duration::from_secs(5));
}

/// What the node's plugins cannot run is refused with the key's path:
/// through `PUT /config` and `crewlet config import` on a running node
/// (nothing moves), and as `--company` at start (exit 2, before anything
/// starts). A right name of the wrong kind is refused too.
#[test]
fn a_company_naming_what_the_plugins_cannot_run_is_refused_with_its_path() {
    let w = start("\"notebook\"", "");
    let epoch = w.node.health()["applied_epoch"].clone();
    let good = company("\"notebook\"", "", std::path::Path::new("/tmp/x.jsonl"));
    let bad = good
        .replacen(
            "provider = \"scripted\", model = \"demo\"",
            "provider = \"scriptd\", model = \"demo\"",
            1,
        )
        .replace(
            "provider = \"scripted\", model = \"demo-review\"",
            "provider = \"slack\", model = \"demo-review\"",
        )
        .replace("modules = [\"notebook\"]", "modules = [\"notebok\"]")
        .replace("plugin = \"slack\"", "plugin = \"slakc\"");
    let expected = [
        (
            "roles.support.executor[0].provider",
            "no provider plugin `scriptd`",
        ),
        (
            "roles.support.reviewer.provider",
            "`slack` is a webhook plugin, not a provider plugin",
        ),
        ("roles.support.modules[0]", "no module plugin `notebok`"),
        ("integrations.slack.plugin", "no webhook plugin `slakc`"),
    ];

    let refused = http::request(&w.node.api, "PUT", "/config", &[], bad.as_bytes()).unwrap();
    assert_eq!(refused.status, 400, "{}", refused.text());
    let errors = refused.json()["errors"].as_array().cloned().unwrap();
    for (path, says) in expected {
        let e = errors
            .iter()
            .find(|e| e["path"] == path)
            .unwrap_or_else(|| panic!("no error at {path}: {errors:?}"));
        assert!(e["message"].as_str().unwrap().contains(says), "{e}");
    }
    let providers = errors.iter().find(|e| e["path"] == expected[0].0).unwrap();
    assert!(
        providers["message"]
            .as_str()
            .unwrap()
            .contains("`scripted`"),
        "{providers}"
    );
    assert_eq!(w.node.health()["applied_epoch"], epoch, "nothing moved");

    let file = w._sb.path("bad.toml");
    std::fs::write(&file, &bad).unwrap();
    let api = format!("http://{}", w.node.api);
    // The API from CREWLET_API, as every client command takes it.
    let (status, out) = run_to_exit(
        &["config", "import", file.to_str().unwrap()],
        &[("CREWLET_API", &api)],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("integrations.slack.plugin"), "{out}");
    assert_eq!(w.node.health()["applied_epoch"], epoch, "nothing moved");

    // An option the provider does not read is refused at its key, never
    // ignored (the scripted provider's manifest declares `steps` and
    // `dimensions`, its embedder's).
    let stray = good.replace(
        "model = \"demo-review\", options = { ",
        "model = \"demo-review\", options = { base_url = \"http://127.0.0.1:9\", ",
    );
    assert_ne!(stray, good);
    let refused = http::request(&w.node.api, "PUT", "/config", &[], stray.as_bytes()).unwrap();
    assert_eq!(refused.status, 400, "{}", refused.text());
    let errors = refused.json()["errors"].clone();
    assert_eq!(
        errors[0]["path"], "roles.support.reviewer.options.base_url",
        "{errors}"
    );
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("does not read the option `base_url` (it takes: `steps`, `dimensions`)"),
        "{errors}"
    );
    assert_eq!(errors.as_array().unwrap().len(), 1, "{errors}");

    // The good document still goes in.
    let put = http::request(&w.node.api, "PUT", "/config", &[], good.as_bytes()).unwrap();
    assert!(put.status == 201 || put.status == 200, "{}", put.text());

    // As `--company`, before anything starts.
    let sb = Sandbox::new();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("scripted", "plugins/providers/scripted/plugin.toml");
    let company_file = sb.path("company.toml");
    std::fs::write(&company_file, &bad).unwrap();
    let data = sb.data_dir();
    let (status, out) = run_to_exit(
        &[
            "run",
            "--data-dir",
            data.to_str().unwrap(),
            "--company",
            company_file.to_str().unwrap(),
            "--plugins",
            plugins.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    for (path, _) in expected {
        assert!(out.contains(path), "{path} not in {out}");
    }
    assert!(dir_is_absent_or_empty(&data), "nothing started: {out}");
}

/// Hot reload of a module: a new version takes over its subscription (the
/// counts go on from where they were); a version the host refuses leaves
/// the running one consuming.
#[test]
fn a_reloaded_module_takes_over_its_subscription_and_a_refused_one_leaves_it_consuming() {
    let w = start(r#""notebook""#, "");
    let health = w.node.health();
    let url = health["stream"]["urls"][0].as_str().unwrap().to_owned();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let js = rt.block_on(async {
        let client = common::broker_login(&health).connect(url).await.unwrap();
        async_nats::jetstream::new(client)
    });
    let sub = |w: &World| w.plugin("tool-module")["subscriptions"]["turn_ended"].clone();
    let handled_reaches = |n: u64| eventually(Duration::from_secs(20), || sub(&w)["handled"] == n);
    assert!(eventually(Duration::from_secs(20), || sub(&w)["state"] == "consuming"));
    rt.block_on(publish_turn_ended(
        &js,
        "one",
        json!({"outcome": "delivered"}),
    ));
    assert!(handled_reaches(1), "{}", sub(&w));

    let manifest = w._sb.path("plugins/tool-module/plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(
        &manifest,
        text.replace("version = \"0.1.0\"", "version = \"0.2.0\""),
    )
    .unwrap();
    assert!(
        eventually(
            Duration::from_secs(30),
            || w.plugin("tool-module")["version"] == "0.2.0"
        ),
        "{}",
        w.plugin("tool-module")
    );
    assert_eq!(w.plugin("tool-module")["state"], "running");
    rt.block_on(publish_turn_ended(
        &js,
        "two",
        json!({"outcome": "delivered"}),
    ));
    assert!(handled_reaches(2), "the new version consumes: {}", sub(&w));

    // Over the module world's deadline ceiling: refused, 0.2.0 goes on.
    let text = std::fs::read_to_string(&manifest).unwrap();
    let broken = text
        .replace("version = \"0.2.0\"", "version = \"0.3.0\"")
        .replace("deadline_ms = 500", "deadline_ms = 999999");
    std::fs::write(&manifest, broken).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || {
            !w.plugin("tool-module")["reload_refused"].is_null()
        }),
        "{}",
        w.plugin("tool-module")
    );
    let row = w.plugin("tool-module");
    assert_eq!(row["version"], "0.2.0", "{row}");
    assert!(
        row["reload_refused"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("deadline_ms")),
        "{row}"
    );
    rt.block_on(publish_turn_ended(
        &js,
        "three",
        json!({"outcome": "delivered"}),
    ));
    assert!(
        handled_reaches(3),
        "the running version still consumes: {}",
        sub(&w)
    );
}
