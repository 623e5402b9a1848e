//! `presence-board`: reads `presence.seen` (read-only) and keeps a log of
//! what its watch delivered, to show the grants from the reader's side.
//!
//! Tools: `log` answers the watch log (one line per step); `get` / `keys`
//! read; `write` tries to write and fails with the refusal it gets. It
//! handles no events.

use std::sync::Mutex;

use crewlet_plugin_sdk::module::{
    Event, Guest, StateChange, StateEvent, ToolCall, Tools, describe, info, state,
};
use serde_json::Value;

struct Module;

const BUCKET: &str = "presence.seen";
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

const TOOLS: Tools = Tools::new(&[("log", log), ("get", get), ("keys", keys), ("write", write)]);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn key(arguments: &Value) -> Result<&str, String> {
    arguments["key"]
        .as_str()
        .ok_or_else(|| "`key` must be a string".to_string())
}

fn log(_arguments: Value) -> Result<String, String> {
    Ok(LOG.lock().map_err(|_| "log poisoned")?.join("\n"))
}

fn get(arguments: Value) -> Result<String, String> {
    match state::get(BUCKET, key(&arguments)?).map_err(|e| describe(&e))? {
        Some(entry) => Ok(text(&entry.value)),
        None => Ok("<none>".to_string()),
    }
}

fn keys(_arguments: Value) -> Result<String, String> {
    let mut keys = state::keys(BUCKET).map_err(|e| describe(&e))?;
    keys.sort();
    Ok(keys.join(","))
}

fn write(arguments: Value) -> Result<String, String> {
    match state::put(BUCKET, key(&arguments)?, b"{}") {
        Ok(rev) => Ok(format!("written at {rev}")),
        Err(e) => Err(describe(&e)),
    }
}

impl Guest for Module {
    fn init() -> Result<(), String> {
        let id = state::watch(BUCKET).map_err(|e| describe(&e))?;
        info(&format!("presence-board watching {BUCKET} (watch {id})"));
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        Err(format!(
            "presence-board handles no event (got `{}`)",
            event.topic
        ))
    }

    fn on_state(event: StateEvent) -> Result<(), String> {
        let line = match event.change {
            StateChange::Current(e) => format!("current {}={}", e.key, text(&e.value)),
            StateChange::EndOfCurrent => "end-of-current".to_string(),
            StateChange::Put(e) => format!("put {}={}", e.key, text(&e.value)),
            StateChange::Deleted(k) => format!("deleted {k}"),
        };
        LOG.lock().map_err(|_| "log poisoned")?.push(line);
        Ok(())
    }

    fn call_tool(call: ToolCall) -> Result<String, String> {
        TOOLS.dispatch(&call)
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
