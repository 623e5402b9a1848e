//! Test data: one instance per node says hello in the module's bucket and
//! writes down what its watch showed it of the others — the Live row of
//! ADR 202 made observable from outside, without events.
//!
//! `init` picks an instance id (random: a module is told nothing of its
//! node), puts `hello.<id>`, then watches `seen`. For every `hello.<other>`
//! its watch hands it, it puts `saw.<id>.<other>` = `current` (it was
//! there when the watch started) or `put` (it was written afterwards).
//! A `trap.<anything>` written while it watches makes its `on-state` trap
//! (one listed as current does not), so a test can fault the instance.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;

use crewlet_plugin_sdk::module::{
    Event, Guest, StateChange, StateEvent, ToolCall, describe, info, state,
};

struct Module;

const BUCKET: &str = "seen";
static ME: Mutex<String> = Mutex::new(String::new());

fn me() -> Result<String, String> {
    ME.lock()
        .map(|m| m.clone())
        .map_err(|_| "id poisoned".into())
}

fn noted(other: &str, how: &str) -> Result<(), String> {
    let me = me()?;
    if other == me {
        return Ok(());
    }
    state::put(BUCKET, &format!("saw.{me}.{other}"), how.as_bytes())
        .map(|_| ())
        .map_err(|e| describe(&e))
}

impl Guest for Module {
    fn init() -> Result<(), String> {
        let id = format!("{:016x}", RandomState::new().hash_one(0u8));
        *ME.lock().map_err(|_| "id poisoned")? = id.clone();
        let body = format!("{{\"id\":\"{id}\"}}");
        state::put(BUCKET, &format!("hello.{id}"), body.as_bytes()).map_err(|e| describe(&e))?;
        let watch = state::watch(BUCKET).map_err(|e| describe(&e))?;
        info(&format!(
            "relay {id} said hello and watches `{BUCKET}` (watch {watch})"
        ));
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        Err(format!("relay does not handle `{}`", event.topic))
    }

    fn on_state(event: StateEvent) -> Result<(), String> {
        match event.change {
            StateChange::Current(e) => match e.key.strip_prefix("hello.") {
                Some(other) => noted(other, "current"),
                None => Ok(()),
            },
            StateChange::Put(e) if e.key.starts_with("trap.") => {
                unreachable!("told to trap by `{}`", e.key)
            }
            StateChange::Put(e) => match e.key.strip_prefix("hello.") {
                Some(other) => noted(other, "put"),
                None => Ok(()),
            },
            StateChange::EndOfCurrent | StateChange::Deleted(_) => Ok(()),
        }
    }

    fn call_tool(_call: ToolCall) -> Result<String, String> {
        Err("no tools".to_string())
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
