//! Test data: a module with tools that behave and tools that do not.
//!
//! Tools: `echo` answers its arguments; `loop` never returns; `trap`
//! panics; `publish` publishes on a topic (declared or not, of any size)
//! and answers what the bus said; `calls` and `events` count what this
//! instance ran. Every event is counted and its kind and payload kept in
//! the bucket `seen` under `last` (with the count under `count`), so a
//! test can watch deliveries from outside. An event row whose payload has
//! `refuse = true` is refused, one with `trap = true` traps.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use crewlet_plugin_sdk::module::{
    Event, Guest, StateEvent, ToolCall, Tools, describe, describe_publish, info, publish_bytes,
    state,
};
use serde_json::{Value, json};

struct Module;

static CALLS: AtomicU64 = AtomicU64::new(0);
static EVENTS: AtomicU64 = AtomicU64::new(0);

const TOOLS: Tools = Tools::new(&[
    ("echo", echo),
    ("loop", spin),
    ("trap", trap),
    ("publish", publish),
    ("calls", calls),
    ("events", events),
]);

fn echo(arguments: Value) -> Result<String, String> {
    Ok(arguments.to_string())
}

fn spin(_arguments: Value) -> Result<String, String> {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

fn trap(_arguments: Value) -> Result<String, String> {
    panic!("the trap tool was called")
}

fn publish(arguments: Value) -> Result<String, String> {
    let topic = arguments["topic"]
        .as_str()
        .ok_or("`topic` must be a string")?;
    let payload = match arguments["size"].as_u64() {
        Some(size) => vec![b'x'; size as usize],
        None => json!({ "from": "tool-module" }).to_string().into_bytes(),
    };
    publish_bytes(topic, &payload)
        .map(|()| "published".to_string())
        .map_err(|e| describe_publish(&e))
}

fn calls(_arguments: Value) -> Result<String, String> {
    Ok(CALLS.load(Ordering::Relaxed).to_string())
}

fn events(_arguments: Value) -> Result<String, String> {
    Ok(EVENTS.load(Ordering::Relaxed).to_string())
}

impl Guest for Module {
    fn init() -> Result<(), String> {
        info("tool-module ready");
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        let count = EVENTS.fetch_add(1, Ordering::Relaxed) + 1;
        let payload: Value = serde_json::from_slice(&event.payload).unwrap_or(Value::Null);
        // An event row whose payload asks for it is refused, or traps.
        if payload["payload"]["refuse"] == true {
            return Err("refused on purpose".to_string());
        }
        if payload["payload"]["trap"] == true {
            panic!("trapped on purpose by an event");
        }
        let last = json!({ "kind": event.topic, "payload": payload });
        state::put("seen", "last", last.to_string().as_bytes()).map_err(|e| describe(&e))?;
        state::put("seen", "count", count.to_string().as_bytes()).map_err(|e| describe(&e))?;
        Ok(())
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Ok(())
    }

    fn call_tool(call: ToolCall) -> Result<String, String> {
        CALLS.fetch_add(1, Ordering::Relaxed);
        TOOLS.dispatch(&call)
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
