//! Test data: a module whose `init` fills its bucket with 256 KiB values
//! until the bucket refuses one, and starts only if the refusal is
//! `bucket-full` — the 64 MiB cap as a module meets it.

use crewlet_plugin_sdk::module::{
    Event, Guest, StateError, StateEvent, ToolCall, describe, info, state,
};

struct Module;

const BUCKET: &str = "blobs";
const VALUE_BYTES: usize = 256 * 1024;
/// More values than a 64 MiB bucket holds.
const MOST: usize = 300;

impl Guest for Module {
    fn init() -> Result<(), String> {
        let value = vec![b'x'; VALUE_BYTES];
        for i in 0..MOST {
            match state::put(BUCKET, &format!("blob.{i}"), &value) {
                Ok(_) => {}
                Err(StateError::BucketFull(_)) => {
                    info(&format!("filler: bucket-full after {i} values"));
                    return Ok(());
                }
                Err(e) => return Err(describe(&e)),
            }
        }
        Err(format!(
            "{MOST} values of {VALUE_BYTES} bytes fitted: the bucket has no 64 MiB cap"
        ))
    }

    fn on_event(event: Event) -> Result<(), String> {
        Err(format!("filler does not handle `{}`", event.topic))
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Ok(())
    }

    fn call_tool(_call: ToolCall) -> Result<String, String> {
        Err("no tools".to_string())
    }
}

crewlet_plugin_sdk::module::export_module!(Module);
