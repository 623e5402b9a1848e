//! `presence-board`: reads `presence.seen` (read-only) and keeps a log of
//! what its watch delivered, to show the grants from the reader's side.
//!
//! Events: `board.log` answers the watch log (one line per step);
//! `board.get` / `board.keys` read; `board.write` tries to write and answers
//! the refusal it gets.

use std::sync::Mutex;

use crewlet_plugin_sdk::module::{Event, Guest, StateChange, StateEvent, describe, info, state};

struct Module;

const BUCKET: &str = "presence.seen";
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl Guest for Module {
    fn init() -> Result<(), String> {
        let id = state::watch(BUCKET).map_err(|e| describe(&e))?;
        info(&format!("presence-board watching {BUCKET} (watch {id})"));
        Ok(())
    }

    fn on_event(event: Event) -> Result<Vec<u8>, String> {
        let key = text(&event.payload);
        match event.topic.as_str() {
            "board.log" => Ok(LOG
                .lock()
                .map_err(|_| "log poisoned")?
                .join("\n")
                .into_bytes()),
            "board.get" => match state::get(BUCKET, &key).map_err(|e| describe(&e))? {
                Some(entry) => Ok(entry.value),
                None => Ok(b"<none>".to_vec()),
            },
            "board.keys" => {
                let mut keys = state::keys(BUCKET).map_err(|e| describe(&e))?;
                keys.sort();
                Ok(keys.join(",").into_bytes())
            }
            "board.write" => match state::put(BUCKET, &key, b"{}") {
                Ok(rev) => Ok(format!("written at {rev}").into_bytes()),
                Err(e) => Err(describe(&e)),
            },
            other => Err(format!("presence-board does not handle `{other}`")),
        }
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
}

crewlet_plugin_sdk::module::export_module!(Module);
