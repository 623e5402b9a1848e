//! Test data: a module whose `init` never returns. The host must report it
//! failed at its deadline and be ready without it.

use std::hint::black_box;

use crewlet_plugin_sdk::module::{Event, Guest, StateEvent, ToolCall};

struct Module;

impl Guest for Module {
    fn init() -> Result<(), String> {
        let mut n: u64 = 0;
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }

    fn on_event(_event: Event) -> Result<(), String> {
        Ok(())
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Ok(())
    }

    fn call_tool(_call: ToolCall) -> Result<String, String> {
        Err("no tools".to_string())
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
