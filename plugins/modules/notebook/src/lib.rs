//! `notebook`: the team's notebook, a module that earns its place.
//!
//! - Tools: `write` (a note under a title), `read` (a note, or the list),
//!   `worked` (per seat, the last turn it ended). A note records who wrote
//!   it and in which turn: the host tells the module who is calling.
//! - Subscribes to `turn_ended` (`once`: one instance in the fleet records
//!   each) and keeps, per seat, the turn it ended last and its outcome.
//! - Publishes `changed` (`module.notebook.changed`) with the note's key,
//!   title and author whenever a note is written.
//!
//! Keys are the title lower-cased, every run of characters outside
//! `a-z 0-9` turned into one `-`.

use crewlet_plugin_sdk::module::{Event, Guest, StateEvent, ToolCall, bus, describe, info, state};
use serde_json::{Value, json};

struct Notebook;

const NOTES: &str = "notes";
const WORKED: &str = "worked";

/// A note's key: its title lower-cased, runs of other characters as `-`.
fn key(title: &str) -> Result<String, String> {
    let mut out = String::new();
    for c in title.trim().chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-').chars().take(200).collect::<String>();
    if out.is_empty() {
        return Err("a note's title needs at least one letter or digit".to_string());
    }
    Ok(out)
}

fn object(arguments: &str) -> Result<Value, String> {
    serde_json::from_str(arguments).map_err(|e| format!("arguments are not JSON: {e}"))
}

fn write(call: &ToolCall) -> Result<String, String> {
    let args = object(&call.arguments_json)?;
    let title = args["title"].as_str().ok_or("`title` is required")?;
    let text = args["text"].as_str().ok_or("`text` is required")?;
    let key = key(title)?;
    let note = json!({
        "title": title,
        "text": text,
        "by": call.caller.seat,
        "turn_id": call.caller.turn_id,
    });
    let revision =
        state::put(NOTES, &key, note.to_string().as_bytes()).map_err(|e| describe(&e))?;
    let changed =
        json!({ "key": key, "title": title, "by": call.caller.seat, "revision": revision });
    // The note is kept whether or not the fleet hears of it at once.
    if let Err(e) = bus::publish("changed", changed.to_string().as_bytes()) {
        info(&format!("note {key} saved; `changed` not published: {e:?}"));
    }
    Ok(format!(
        "Saved the note {title:?} as {key} (revision {revision})."
    ))
}

fn read(call: &ToolCall) -> Result<String, String> {
    let args = object(&call.arguments_json)?;
    match args["title"].as_str() {
        Some(title) => {
            let key = key(title)?;
            match state::get(NOTES, &key).map_err(|e| describe(&e))? {
                Some(entry) => {
                    let note: Value = serde_json::from_slice(&entry.value)
                        .map_err(|e| format!("note {key} is not JSON: {e}"))?;
                    Ok(format!(
                        "# {}\n(by {}, revision {})\n\n{}",
                        note["title"].as_str().unwrap_or(&key),
                        note["by"].as_str().unwrap_or("?"),
                        entry.revision,
                        note["text"].as_str().unwrap_or_default()
                    ))
                }
                None => Err(format!("there is no note {title:?} (key {key})")),
            }
        }
        None => {
            let keys = state::keys(NOTES).map_err(|e| describe(&e))?;
            if keys.is_empty() {
                return Ok("The notebook is empty.".to_string());
            }
            let mut lines = Vec::new();
            for key in keys {
                if let Some(entry) = state::get(NOTES, &key).map_err(|e| describe(&e))? {
                    let note: Value = serde_json::from_slice(&entry.value).unwrap_or_default();
                    lines.push(format!(
                        "- {} (by {})",
                        note["title"].as_str().unwrap_or(&key),
                        note["by"].as_str().unwrap_or("?")
                    ));
                }
            }
            Ok(lines.join("\n"))
        }
    }
}

fn worked() -> Result<String, String> {
    let keys = state::keys(WORKED).map_err(|e| describe(&e))?;
    if keys.is_empty() {
        return Ok("No turn has ended yet.".to_string());
    }
    let mut lines = Vec::new();
    for seat in keys {
        if let Some(entry) = state::get(WORKED, &seat).map_err(|e| describe(&e))? {
            let last: Value = serde_json::from_slice(&entry.value).unwrap_or_default();
            lines.push(format!(
                "- {seat}: turn {} ended {}",
                last["turn_id"].as_str().unwrap_or("?"),
                last["outcome"].as_str().unwrap_or("?")
            ));
        }
    }
    Ok(lines.join("\n"))
}

impl Guest for Notebook {
    fn init() -> Result<(), String> {
        info("notebook ready: owns buckets `notes` and `worked`");
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        if event.topic != "turn_ended" {
            return Err(format!("notebook does not subscribe to `{}`", event.topic));
        }
        let row: Value = serde_json::from_slice(&event.payload)
            .map_err(|e| format!("the event is not JSON: {e}"))?;
        let seat = row["seat"]
            .as_str()
            .ok_or("a turn_ended event names its seat")?;
        let last = json!({
            "turn_id": row["payload"]["turn_id"],
            "outcome": row["payload"]["outcome"],
            "at_ms": row["at_ms"],
            "conversation": row["conversation"],
        });
        state::put(WORKED, seat, last.to_string().as_bytes()).map_err(|e| describe(&e))?;
        Ok(())
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Err("notebook starts no watch".to_string())
    }

    fn call_tool(call: ToolCall) -> Result<String, String> {
        match call.name.as_str() {
            "write" => write(&call),
            "read" => read(&call),
            "worked" => worked(),
            other => Err(format!("notebook has no tool `{other}`")),
        }
    }
}

crewlet_plugin_sdk::module::export_module!(Notebook);
