//! A provider's trial: one `complete` call as a turn would make it — to
//! the manifest's base URL, through its outbound grant — with the key from
//! the environment variable the request names. Exit 0 when the vendor
//! answered a completion, 1 when the plugin classified a failure.

use crewlet_plugins::Manifest;
use crewlet_plugins::provider::{Completion, ErrorKind, ProviderError, ProviderPlugin};
use crewlet_plugins::trial::provider::CompletionRequest;
use serde_json::{Value, json};

use super::{Engine, Trial, failed};

const EXPECTED: &str = "a completion request: {\"model\", \"messages\": [{\"role\", \"content\"}], \"tools\", \"tool_choice\", \"max_tokens\", \"options\", \"api_key_env\"}";

pub(super) async fn run(engine: &Engine, manifest: Manifest, request: &Trial<'_>) -> i32 {
    let asked: CompletionRequest = match request.read(EXPECTED) {
        Ok(r) => r,
        Err(status) => return status,
    };
    let api_key = match &asked.api_key_env {
        None => String::new(),
        Some(var) => match std::env::var(var) {
            Ok(key) => key,
            Err(_) => {
                eprintln!(
                    "crewlet: {}: api_key_env names {var}, which is not set; export it, or drop the field to call without a key",
                    request.file.display()
                );
                return 2;
            }
        },
    };
    let req = match asked.request(api_key) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("crewlet: {}: {e}", request.file.display());
            return 2;
        }
    };
    let plugin = match ProviderPlugin::load(engine, manifest.clone()) {
        Ok(p) => p,
        Err(e) => return failed(&manifest, e),
    };
    match plugin.trial(req).await {
        Ok(trial) => {
            let status = if trial.answer.is_ok() { 0 } else { 1 };
            let view = json!({
                "completion": trial.answer.as_ref().ok().map(completion),
                "refused": trial.answer.as_ref().err().map(refusal),
                "denied_origins": plugin.denied_origins(),
                "plugin_said": trial.said,
                "plugin_logged": trial.logged,
            });
            request.print(&view, render, status)
        }
        Err(e) => failed(&manifest, e),
    }
}

fn completion(c: &Completion) -> Value {
    json!({
        "text": c.text,
        "tool_calls": c.tool_calls.iter().map(|t| json!({
            "id": t.id,
            "name": t.name,
            "arguments": serde_json::from_str::<Value>(&t.arguments_json)
                .unwrap_or_else(|_| Value::String(t.arguments_json.clone())),
        })).collect::<Vec<_>>(),
        "input_tokens": c.usage.input_tokens,
        "output_tokens": c.usage.output_tokens,
        "stop_reason": c.stop_reason,
        "request_id": c.request_id,
    })
}

fn refusal(e: &ProviderError) -> Value {
    let kind = match e.kind {
        ErrorKind::RateLimited(wait) => {
            return json!({"kind": "rate-limited", "retry_after_ms": wait, "status": e.status, "message": e.message});
        }
        ErrorKind::Auth => "auth",
        ErrorKind::Overloaded => "overloaded",
        ErrorKind::BadRequest => "bad-request",
        ErrorKind::ContextTooLong => "context-too-long",
        ErrorKind::Transient => "transient",
        ErrorKind::RequestDenied => "request-denied",
    };
    json!({"kind": kind, "status": e.status, "request_id": e.request_id, "message": e.message})
}

fn render(v: &Value) -> String {
    let mut out = String::new();
    if let Some(c) = v["completion"].as_object() {
        out.push_str(&format!(
            "completion: stop {}, {} in / {} out tokens\n",
            c["stop_reason"].as_str().unwrap_or(""),
            c["input_tokens"],
            c["output_tokens"]
        ));
        if let Some(text) = c["text"].as_str() {
            out.push_str(&format!("  text: {text}\n"));
        }
        for call in c["tool_calls"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  tool call {}: {}\n",
                call["name"].as_str().unwrap_or(""),
                call["arguments"]
            ));
        }
    }
    if let Some(r) = v["refused"].as_object() {
        out.push_str(&format!(
            "refused: {} (status {}): {}\n",
            r["kind"].as_str().unwrap_or(""),
            r["status"],
            r["message"].as_str().unwrap_or("")
        ));
    }
    for origin in v["denied_origins"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "denied: {} (not in the manifest's allowed_outbound_hosts)\n",
            origin.as_str().unwrap_or("")
        ));
    }
    out.push_str(&super::spoken(v));
    out
}
