//! `presence`: owns the bucket `seen` and writes who was seen where.
//!
//! Events: `seen.set` with a JSON object carrying `who` (the key) puts the
//! whole object under `who`; `seen.delete` with a key as payload deletes
//! it. It offers no tools.

use crewlet_plugin_sdk::module::{Event, Guest, StateEvent, ToolCall, describe, info, state};

struct Module;

const BUCKET: &str = "seen";

impl Guest for Module {
    fn init() -> Result<(), String> {
        info("presence ready: owns bucket `seen`");
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        match event.topic.as_str() {
            "seen.set" => {
                let value: serde_json::Value = serde_json::from_slice(&event.payload)
                    .map_err(|e| format!("payload is not JSON: {e}"))?;
                let who = value["who"].as_str().ok_or("payload has no `who`")?;
                state::put(BUCKET, who, &event.payload).map_err(|e| describe(&e))?;
                Ok(())
            }
            "seen.delete" => {
                let key = String::from_utf8(event.payload).map_err(|_| "key is not UTF-8")?;
                state::delete(BUCKET, &key).map_err(|e| describe(&e))
            }
            other => Err(format!("presence does not handle `{other}`")),
        }
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Err("presence starts no watch".to_string())
    }

    fn call_tool(_call: ToolCall) -> Result<String, String> {
        Err("no tools".to_string())
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
