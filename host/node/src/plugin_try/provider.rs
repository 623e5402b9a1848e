//! A provider's trial: one `complete` call as a turn would make it — to
//! the manifest's base URL, through its outbound grant — with the key from
//! the environment variable the request names; or, when the request
//! carries `input`, one `embed` as the node's embedder would ask it. Exit 0
//! when the vendor answered, 1 when the plugin classified a failure (or
//! does not embed).

use crewlet_plugins::Manifest;
use crewlet_plugins::provider::{
    Completion, EmbedError, Embedded, ErrorKind, ProviderError, ProviderPlugin,
};
use crewlet_plugins::trial::provider::{CompletionRequest, EmbeddingRequest};
use serde_json::{Value, json};

use super::{Engine, Trial, failed};

const EXPECTED: &str = "a completion request: {\"model\", \"messages\": [{\"role\", \"content\"}], \"tools\", \"tool_choice\", \"max_tokens\", \"options\", \"api_key_env\"}, or an embedding request: {\"model\", \"input\": [\"text\", …], \"options\", \"api_key_env\"}";

pub(super) async fn run(engine: &Engine, manifest: Manifest, request: &Trial<'_>) -> i32 {
    let asked: Value = match request.read(EXPECTED) {
        Ok(r) => r,
        Err(status) => return status,
    };
    if asked.get("input").is_some() {
        return embed(engine, manifest, request, asked).await;
    }
    let asked: CompletionRequest = match as_shape(request, asked) {
        Ok(r) => r,
        Err(status) => return status,
    };
    let api_key = match api_key(request, asked.api_key_env.as_deref()) {
        Ok(k) => k,
        Err(status) => return status,
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

/// One embedding.
async fn embed(engine: &Engine, manifest: Manifest, request: &Trial<'_>, asked: Value) -> i32 {
    let asked: EmbeddingRequest = match as_shape(request, asked) {
        Ok(r) => r,
        Err(status) => return status,
    };
    let api_key = match api_key(request, asked.api_key_env.as_deref()) {
        Ok(k) => k,
        Err(status) => return status,
    };
    let plugin = match ProviderPlugin::load(engine, manifest.clone()) {
        Ok(p) => p,
        Err(e) => return failed(&manifest, e),
    };
    match plugin.trial_embed(asked.request(api_key)).await {
        Ok(trial) => {
            let status = if trial.answer.is_ok() { 0 } else { 1 };
            let view = json!({
                "embedded": trial.answer.as_ref().ok().map(embedded),
                "refused": trial.answer.as_ref().err().map(|e| match e {
                    EmbedError::Unsupported(why) => json!({"kind": "unsupported", "message": why}),
                    EmbedError::Failed(e) => refusal(e),
                }),
                "denied_origins": plugin.denied_origins(),
                "plugin_said": trial.said,
                "plugin_logged": trial.logged,
            });
            request.print(&view, render, status)
        }
        Err(e) => failed(&manifest, e),
    }
}

/// The request as `T`; `Err` is the exit status after saying what was
/// expected.
fn as_shape<T: serde::de::DeserializeOwned>(request: &Trial<'_>, v: Value) -> Result<T, i32> {
    serde_json::from_value(v).map_err(|e| {
        eprintln!(
            "crewlet: {}: {e}; expected {EXPECTED}",
            request.file.display()
        );
        2
    })
}

/// The key from the environment variable the request names (none: empty).
fn api_key(request: &Trial<'_>, var: Option<&str>) -> Result<String, i32> {
    let Some(var) = var else {
        return Ok(String::new());
    };
    std::env::var(var).map_err(|_| {
        eprintln!(
            "crewlet: {}: api_key_env names {var}, which is not set; export it, or drop the field to call without a key",
            request.file.display()
        );
        2
    })
}

fn embedded(e: &Embedded) -> Value {
    json!({
        "vectors": e.vectors,
        "dimensions": e.vectors.first().map_or(0, Vec::len),
        "input_tokens": e.input_tokens,
        "request_id": e.request_id,
    })
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
    if let Some(e) = v["embedded"].as_object() {
        out.push_str(&format!(
            "embedded: {} vectors of {} dimensions, {} tokens\n",
            e["vectors"].as_array().map_or(0, Vec::len),
            e["dimensions"],
            e["input_tokens"]
        ));
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
