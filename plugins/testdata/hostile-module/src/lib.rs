//! Test data: a module that tries everything its grants forbid. Each event
//! answers `refused: <the state error>` or `allowed: <revision>`, so a test
//! sees exactly what the runtime told the guest.

use crewlet_plugin_sdk::module::{Event, Guest, StateEvent, describe, state};

struct Module;

fn outcome(result: Result<u64, state::StateError>) -> Result<Vec<u8>, String> {
    match result {
        Ok(rev) => Ok(format!("allowed: {rev}").into_bytes()),
        Err(e) => Err(format!("refused: {}", describe(&e))),
    }
}

impl Guest for Module {
    fn init() -> Result<(), String> {
        Ok(())
    }

    fn on_event(event: Event) -> Result<Vec<u8>, String> {
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
}

crewlet_plugin_sdk::module::export_module!(Module);
