//! A module's trial: one event or one tool call on empty state of its own
//! (every bucket of the catalogue, in memory), printed with the answer,
//! what it published, what its buckets then hold and its log. Exit 0 when
//! the module answered, 1 when it (or the host, for bad arguments)
//! refused, or it faulted.

use crewlet_plugins::trial::module::{ModuleInput, try_module};
use crewlet_plugins::{Catalogue, Manifest};
use serde_json::{Value, json};

use super::{Engine, Trial, failed};

const EXPECTED: &str = "one event {\"event\": {\"kind\", \"payload\"}} or one tool call {\"tool\": {\"name\", \"arguments\", \"seat\", \"turn_id\"}}";

pub(super) async fn run(
    engine: &Engine,
    manifest: Manifest,
    catalogue: &Catalogue,
    request: &Trial<'_>,
) -> i32 {
    let input: ModuleInput = match request.read(EXPECTED) {
        Ok(i) => i,
        Err(status) => return status,
    };
    let name = manifest.clone();
    match try_module(engine, manifest, catalogue, input).await {
        Ok(trial) => {
            let status = if trial.answer.is_ok() { 0 } else { 1 };
            let view = json!({
                "answer": trial.answer.as_ref().ok(),
                "refused": trial.answer.as_ref().err(),
                "published": trial.published.iter().map(|(kind, payload)| json!({
                    "kind": kind,
                    "payload": serde_json::from_str::<Value>(payload)
                        .unwrap_or_else(|_| Value::String(payload.clone())),
                })).collect::<Vec<_>>(),
                "state": trial.state.iter().map(|(bucket, key, value)| json!({
                    "bucket": bucket, "key": key, "value": value,
                })).collect::<Vec<_>>(),
                "plugin_said": trial.said,
            });
            request.print(&view, render, status)
        }
        Err(e) => failed(&name, e),
    }
}

fn render(v: &Value) -> String {
    let mut out = match (v["answer"].as_str(), v["refused"].as_str()) {
        (Some(""), _) => "answer: ok\n".to_string(),
        (Some(text), _) => format!("answer: {text}\n"),
        (_, Some(why)) => format!("refused: {why}\n"),
        _ => String::new(),
    };
    for p in v["published"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "published {}: {}\n",
            p["kind"].as_str().unwrap_or(""),
            p["payload"]
        ));
    }
    for s in v["state"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "state {}/{} = {}\n",
            s["bucket"].as_str().unwrap_or(""),
            s["key"].as_str().unwrap_or(""),
            s["value"].as_str().unwrap_or("")
        ));
    }
    for line in v["plugin_said"].as_array().into_iter().flatten() {
        out.push_str(&format!("plugin said: {}\n", line.as_str().unwrap_or("")));
    }
    out
}
