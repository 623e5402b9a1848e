//! Test data: a module that watches its own bucket eight times over and is
//! slow to take each step (it spins for a while in `on-state`), so changes
//! arrive faster than it consumes them. The host must hold the backlog on
//! the server, not in its own memory.

use std::hint::black_box;

use crewlet_plugin_sdk::module::{Event, Guest, StateEvent, ToolCall, state};

struct Module;

impl Guest for Module {
    fn init() -> Result<(), String> {
        for _ in 0..8 {
            state::watch("own").map_err(|e| format!("{e:?}"))?;
        }
        Ok(())
    }

    fn on_event(_event: Event) -> Result<(), String> {
        Ok(())
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        let mut n: u64 = 0;
        for _ in 0..20_000_000u64 {
            n = black_box(n.wrapping_add(1));
        }
        black_box(n);
        Ok(())
    }

    fn call_tool(_call: ToolCall) -> Result<String, String> {
        Err("no tools".to_string())
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
