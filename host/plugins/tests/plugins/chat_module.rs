//! The company chat's module (`plugins/modules/chat`) on real wasmtime and
//! a real nats-server: a post is one entry of its messages bucket, read back
//! by channel (top-level messages with their reply counts) and by thread,
//! oldest first; its ids order by time; a retried post with its
//! idempotency key posts once (a key is its author's own); the working
//! indicator is kept and cleared; a seat's own turn may not post through
//! the module, and a thread that does not exist is refused, not made.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{manifest, nats_bus, runtime};
use crewlet_plugins::catalogue::Catalogue;
use crewlet_plugins::module::{ModulePlugin, ToolCaller, ensure_buckets};
use crewlet_plugins::state::{KvState, StateBackend};
use crewlet_testkit::NatsServer;
use futures::StreamExt;
use serde_json::{Value, json};

struct Chat {
    plugin: Arc<ModulePlugin>,
    backend: Arc<dyn StateBackend>,
    client: async_nats::Client,
    _server: NatsServer,
    _data: tempfile::TempDir,
}

async fn start() -> Chat {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::nats(client.clone()));
    let m = manifest("modules/chat");
    let catalogue = Catalogue {
        plugins: vec![m.clone()],
    };
    ensure_buckets(&catalogue, backend.as_ref()).await.unwrap();
    let (rt, data) = runtime();
    let plugin = ModulePlugin::start(&rt, m, &catalogue, backend.clone(), nats_bus(&client))
        .await
        .unwrap();
    Chat {
        plugin,
        backend,
        client,
        _server: server,
        _data: data,
    }
}

/// The node's call (no seat); `Err` is the module's refusal.
async fn node_call(c: &Chat, tool: &str, arguments: Value) -> Result<Value, String> {
    let node = ToolCaller {
        seat: String::new(),
        turn_id: String::new(),
    };
    let answer = c
        .plugin
        .call_tool(tool, &arguments, &node)
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
        .map_err(|refused| refused.to_string())?;
    Ok(serde_json::from_str(&answer).expect("the module answers JSON"))
}

async fn post(c: &Chat, author: &str, at_ms: u64, extra: Value) -> Result<Value, String> {
    let mut args =
        json!({ "channel": "general", "text": "hello @grace", "author": author, "at_ms": at_ms });
    for (k, v) in extra.as_object().into_iter().flatten() {
        args[k] = v.clone();
    }
    node_call(c, "post", args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_one_entry_read_back_by_channel_and_by_thread_and_told_on_the_bus() {
    let c = start().await;
    let mut told = c
        .client
        .subscribe(crewlet_bus::event_subject("module.chat.posted"))
        .await
        .unwrap();
    c.client.flush().await.unwrap();

    let top = post(&c, "ana", 1_000, json!({})).await.unwrap();
    assert_eq!(top["duplicate"], false);
    let top = &top["message"];
    let id = top["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("0000000001000-ana-"), "{id}");
    assert_eq!(
        (&top["thread"], &top["author"]),
        (&Value::Null, &json!("ana"))
    );
    let kept = c
        .backend
        .get("mod_chat_messages", &format!("general.{id}.{id}"))
        .await
        .unwrap()
        .expect("the message is an entry of the messages bucket");
    assert_eq!(serde_json::from_slice::<Value>(&kept.value).unwrap(), *top);

    let reply = post(
        &c,
        "grace",
        2_000,
        json!({ "thread": id, "text": "hi ana" }),
    )
    .await
    .unwrap();
    let reply_id = reply["message"]["id"].as_str().unwrap().to_owned();
    assert!(reply_id > id, "ids order by time: {reply_id} after {id}");

    let channel = node_call(&c, "read", json!({ "channel": "general" }))
        .await
        .unwrap();
    let listed = channel["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{channel}");
    assert_eq!(
        (&listed[0]["id"], &listed[0]["replies"]),
        (&json!(id), &json!(1))
    );
    let thread = node_call(&c, "read", json!({ "channel": "general", "thread": id }))
        .await
        .unwrap();
    let ids: Vec<&str> = thread["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str(), reply_id.as_str()], "oldest first");
    let page = node_call(
        &c,
        "read",
        json!({ "channel": "general", "thread": id, "before": reply_id, "limit": 5 }),
    )
    .await
    .unwrap();
    assert_eq!(page["messages"].as_array().unwrap().len(), 1, "{page}");
    let channels = node_call(&c, "channels", json!({})).await.unwrap();
    assert_eq!(
        channels,
        json!({ "channels": [{ "name": "general", "messages": 2, "last_at_ms": 2_000 }] })
    );

    for want in [&id, &reply_id] {
        let msg = tokio::time::timeout(Duration::from_secs(10), told.next())
            .await
            .expect("module.chat.posted within 10 s")
            .unwrap();
        let event: Value = serde_json::from_slice(&msg.payload).unwrap();
        assert!(event.to_string().contains(want.as_str()), "{event}");
    }

    // A thread that does not exist is refused, not made; a seat's turn
    // posts through its chat server, never this tool.
    let orphan = post(
        &c,
        "ana",
        3_000,
        json!({ "thread": "0000000000009-nobody-00000000" }),
    )
    .await;
    assert!(orphan.unwrap_err().contains("not-found"));
    let seat = ToolCaller {
        seat: "grace".into(),
        turn_id: "turn-1".into(),
    };
    let args = json!({ "channel": "general", "text": "x", "author": "ana", "at_ms": 1 });
    let refused = c.plugin.call_tool("post", &args, &seat).await.unwrap();
    assert!(refused.is_err(), "{refused:?}");
    let keys = c.backend.keys("mod_chat_messages").await.unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_post_posts_once_and_the_indicator_is_kept_then_cleared() {
    let c = start().await;
    let key = json!({ "idempotency_key": "reply-1" });
    let first = post(&c, "grace", 1_000, key.clone()).await.unwrap();
    let again = post(&c, "grace", 1_500, key.clone()).await.unwrap();
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["message"], first["message"]);
    let other = post(&c, "ada", 1_600, key).await.unwrap();
    assert_eq!(other["duplicate"], false, "a key is its author's own");
    assert_eq!(c.backend.keys("mod_chat_messages").await.unwrap().len(), 2);

    let thread = first["message"]["id"].as_str().unwrap();
    let raise = json!({ "channel": "general", "thread": thread, "seat": "grace", "working": true, "at_ms": 1_700 });
    node_call(&c, "indicate", raise.clone()).await.unwrap();
    let working = node_call(&c, "working", json!({ "channel": "general" }))
        .await
        .unwrap();
    assert_eq!(
        working,
        json!({ "working": [{ "seat": "grace", "thread": thread, "since_ms": 1_700 }] })
    );
    let mut clear = raise;
    clear["working"] = json!(false);
    node_call(&c, "indicate", clear).await.unwrap();
    let working = node_call(&c, "working", json!({ "channel": "general" }))
        .await
        .unwrap();
    assert_eq!(working, json!({ "working": [] }));
}
