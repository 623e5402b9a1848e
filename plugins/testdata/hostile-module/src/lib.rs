//! Test data: a module that tries everything its grants forbid. Each event
//! fails with `refused: <the state error>` or succeeds when allowed, so a
//! test sees exactly what the runtime told the guest.

use crewlet_plugin_sdk::module::{Event, Guest, StateEvent, ToolCall, describe, state};

struct Module;

fn outcome(result: Result<u64, state::StateError>) -> Result<(), String> {
    result
        .map(|_| ())
        .map_err(|e| format!("refused: {}", describe(&e)))
}

impl Guest for Module {
    fn init() -> Result<(), String> {
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        match event.topic.as_str() {
            "write-read-only" => outcome(state::put("presence.seen", "intruder", b"{}")),
            "undeclared-bucket" => outcome(state::get("payroll.salaries", "alice").map(|_| 0)),
            "credential-field" => outcome(state::put(
                "own",
                "mcp",
                br#"{"server":{"url":"x","headers":[{"Authorization":"Bearer abc"}]}}"#,
            )),
            "huge-value" => {
                let value = format!("\"{}\"", "a".repeat(300 * 1024));
                outcome(state::put("own", "huge", value.as_bytes()))
            }
            "ordinary" => outcome(state::put(
                "own",
                "fine",
                br#"{"max_tokens":3,"note":"ok"}"#,
            )),
            other => Err(format!("unknown topic {other}")),
        }
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Ok(())
    }

    fn call_tool(_call: ToolCall) -> Result<String, String> {
        Err("no tools".to_string())
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
