//! A module's tools, events and publishes on real wasmtime, a real
//! component (`plugins/testdata/tool-module`) and a real nats-server: a
//! tool answers; arguments its schema refuses never reach the module; an
//! unknown tool is refused; a looping or trapping tool faults and the next
//! call runs on a fresh instance; a publish reaches the bus only on a
//! declared topic and within the size bound, every refusal a value the
//! guest sees.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{caller, manifest, nats_bus, runtime};
use crewlet_plugins::catalogue::Catalogue;
use crewlet_plugins::manifest::{Delivery, Source};
use crewlet_plugins::module::{ModuleBus, ModulePlugin, NotTaken, ToolError, ensure_buckets};
use crewlet_plugins::runtime::{CallError, Fault};
use crewlet_plugins::state::{KvState, StateBackend};
use crewlet_testkit::NatsServer;
use futures::StreamExt;

struct Module {
    plugin: Arc<ModulePlugin>,
    backend: Arc<dyn StateBackend>,
    client: async_nats::Client,
    _server: NatsServer,
    _data: tempfile::TempDir,
}

async fn start_with(bus: Option<Arc<dyn ModuleBus>>) -> Module {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let m = manifest("testdata/tool-module");
    let catalogue = Catalogue {
        plugins: vec![m.clone()],
    };
    ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    let (rt, data) = runtime();
    let bus = bus.unwrap_or_else(|| nats_bus(&client));
    let plugin = ModulePlugin::start(&rt, m, &catalogue, backend.clone(), bus)
        .await
        .unwrap();
    Module {
        plugin,
        backend,
        client,
        _server: server,
        _data: data,
    }
}

async fn call(m: &Module, tool: &str, arguments: serde_json::Value) -> Result<String, String> {
    m.plugin
        .call_tool(tool, &arguments, &caller())
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
        .map_err(|refused| refused.to_string())
}

fn ready_lines(m: &Module) -> usize {
    m.plugin
        .logs()
        .iter()
        .filter(|l| l.contains("tool-module ready"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_answers_and_arguments_its_schema_refuses_never_reach_the_module() {
    let m = start_with(None).await;
    let names: Vec<&str> = m.plugin.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["calls", "echo", "events", "loop", "publish", "trap"]
    );
    assert_eq!(m.plugin.publishes(), ["changed".to_string()]);
    let subs = m.plugin.subscriptions();
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].source, Source::Event("turn_ended".into()));
    assert_eq!(subs[0].delivery, Delivery::Once);

    let echoed = call(&m, "echo", serde_json::json!({ "text": "hi" })).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&echoed.unwrap()).unwrap(),
        serde_json::json!({ "text": "hi" })
    );

    for (arguments, needle) in [
        ("{}", "text"),
        (r#"{"text": 3}"#, "/text"),
        ("[1, 2]", "object"),
        ("not json", "not JSON"),
    ] {
        let err = m
            .plugin
            .call_tool_json("echo", arguments, &caller())
            .await
            .expect_err(arguments);
        let ToolError::BadArguments {
            module,
            tool,
            reason,
        } = &err
        else {
            panic!("{arguments}: {err:?}")
        };
        assert_eq!((module.as_str(), tool.as_str()), ("tool-module", "echo"));
        assert!(reason.contains(needle), "{arguments}: {reason}");
        assert!(err.to_string().contains("call it again"), "{err}");
    }
    let err = m
        .plugin
        .call_tool_json("rm-rf", "{}", &caller())
        .await
        .expect_err("unknown");
    assert!(
        matches!(&err, ToolError::Unknown { tool, .. } if tool == "rm-rf"),
        "{err:?}"
    );

    // One echo and this call ran: none of the refused calls reached it.
    assert_eq!(
        call(&m, "calls", serde_json::json!({})).await,
        Ok("2".into())
    );
    assert_eq!(m.plugin.health().total_faults, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_or_trapping_tool_faults_and_the_next_call_gets_a_fresh_instance() {
    let m = start_with(None).await;
    assert_eq!(ready_lines(&m), 1);
    let deadline = m.plugin.manifest().limits.deadline;
    for (tool, started) in [("loop", 2), ("trap", 3)] {
        assert_eq!(
            call(&m, "echo", serde_json::json!({ "text": "x" }))
                .await
                .map(|_| ()),
            Ok(())
        );
        let began = std::time::Instant::now();
        let err = m
            .plugin
            .call_tool_json(tool, "{}", &caller())
            .await
            .expect_err(tool);
        let ToolError::Call(CallError::Fault { fault, .. }) = &err else {
            panic!("{tool}: {err:?}")
        };
        match tool {
            "loop" => {
                assert!(matches!(fault, Fault::Timeout { .. }), "{fault:?}");
                assert!(began.elapsed() < deadline * 4, "{:?}", began.elapsed());
            }
            _ => assert!(matches!(fault, Fault::Trap { .. }), "{fault:?}"),
        }
        // The next call works, on a new instance: `init` ran again and the
        // call count starts afresh.
        assert_eq!(
            call(&m, "calls", serde_json::json!({})).await,
            Ok("1".into())
        );
        assert_eq!(ready_lines(&m), started, "{:?}", m.plugin.logs());
    }
    assert_eq!(m.plugin.health().total_faults, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_reaches_the_bus_only_on_a_declared_topic_within_its_size() {
    let m = start_with(None).await;
    let mut events = m.client.subscribe("crewlet.events.>").await.unwrap();
    m.client.flush().await.unwrap();

    assert_eq!(
        call(&m, "publish", serde_json::json!({ "topic": "changed" })).await,
        Ok("published".into())
    );
    let undeclared = call(&m, "publish", serde_json::json!({ "topic": "payroll" })).await;
    assert!(
        undeclared
            .as_ref()
            .is_err_and(|e| e.starts_with("undeclared: topic `payroll`")),
        "{undeclared:?}"
    );
    let huge = call(
        &m,
        "publish",
        serde_json::json!({ "topic": "changed", "size": 300 * 1024 }),
    )
    .await;
    assert_eq!(huge, Err("too-large: 307200 bytes (max 262144)".into()));
    let largest = call(
        &m,
        "publish",
        serde_json::json!({ "topic": "changed", "size": 256 * 1024 }),
    )
    .await;
    assert_eq!(largest, Ok("published".into()));

    // The refused publishes came between the two accepted ones on one
    // connection: had one got through, it would arrive before the last.
    let mut got = Vec::new();
    while got.len() < 2 {
        let msg = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("the accepted publishes arrive")
            .unwrap();
        got.push((msg.subject.to_string(), msg.payload.len()));
    }
    let subject = "crewlet.events.module.tool-module.changed".to_string();
    assert_eq!(
        got,
        vec![
            (subject.clone(), r#"{"from":"tool-module"}"#.len()),
            (subject, 256 * 1024)
        ]
    );
    assert_eq!(m.plugin.health().total_faults, 0, "refusals are values");
}

/// The node's bus when its stream does not take the event.
struct DownBus;

impl ModuleBus for DownBus {
    fn publish<'a>(
        &'a self,
        _kind: &'a str,
        _payload: Vec<u8>,
    ) -> futures::future::BoxFuture<'a, Result<(), NotTaken>> {
        Box::pin(async {
            Err(NotTaken {
                why: "the events stream did not acknowledge".to_string(),
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_that_does_not_take_the_event_is_unavailable_to_the_guest() {
    let m = start_with(Some(Arc::new(DownBus))).await;
    assert_eq!(
        call(&m, "publish", serde_json::json!({ "topic": "changed" })).await,
        Err("unavailable: the events stream did not acknowledge".into())
    );
    assert_eq!(m.plugin.health().total_faults, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_is_handled_by_the_module_with_its_kind_and_payload() {
    let m = start_with(None).await;
    let payload = serde_json::json!({ "turn_id": "t-9", "outcome": "done" });
    m.plugin
        .on_event("turn_ended", payload.to_string().as_bytes())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        call(&m, "events", serde_json::json!({})).await,
        Ok("1".into())
    );
    let last = m
        .backend
        .get("mod_tool-module_seen", "last")
        .await
        .unwrap()
        .expect("the module stored what it handled");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&last.value).unwrap(),
        serde_json::json!({ "kind": "turn_ended", "payload": payload })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_to_a_topic_its_owner_does_not_publish_is_refused_at_load() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let subscriber = |topic: &str| {
        common::manifest_text(
            "testdata/tool-module",
            &format!(
                "name = \"listener\"\nversion = \"0.1.0\"\nkind = \"module\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_test_tool_module.wasm\"\n[[module.subscribe]]\ntopic = \"{topic}\"\n"
            ),
        )
    };
    let owner = manifest("testdata/tool-module");
    let wrong = Catalogue {
        plugins: vec![owner.clone(), subscriber("tool-module.changd")],
    };
    let problems = wrong.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    let text = problems[0].to_string();
    assert!(
        text.contains("field `module.subscribe[0].topic`: `tool-module.changd` names a topic module `tool-module` does not publish (it publishes: changed)"),
        "{text}"
    );
    let (rt, _data) = runtime();
    let err = ModulePlugin::load(
        &rt,
        wrong.plugins[1].clone(),
        &wrong,
        backend.clone(),
        nats_bus(&client),
    )
    .err()
    .expect("refused");
    assert!(
        err.to_string().contains("module.subscribe[0].topic"),
        "{err}"
    );

    let right = Catalogue {
        plugins: vec![owner, subscriber("tool-module.changed")],
    };
    assert!(right.problems().is_empty(), "{:?}", right.problems());
    let listener = ModulePlugin::load(
        &rt,
        right.plugins[1].clone(),
        &right,
        backend,
        nats_bus(&client),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        listener.subscriptions()[0].source.subject_kind(),
        "module.tool-module.changed"
    );
}
