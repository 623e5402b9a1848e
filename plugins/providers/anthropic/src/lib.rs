//! An Anthropic Messages backend.
//!
//! `POST {base_url}/messages` with `x-api-key` and `anthropic-version:
//! 2023-06-01`. System messages become the top-level `system`; tool answers
//! become `tool_result` blocks in a user turn, as the Messages API requires.
//!
//! Failures are classified by the SDK's one classifier
//! (`crewlet_plugin_sdk::provider::classify`), the same way as every other
//! provider's: this plugin never retries and keeps no table of its own. The
//! request id is the `request-id` header.
//!
//! Anthropic has no embeddings API: `embed` answers `unsupported`, naming
//! what to configure instead.

use crewlet_plugin_sdk::provider::classify::{classify, denied_or_network};
use crewlet_plugin_sdk::provider::http;
use crewlet_plugin_sdk::provider::{
    Completion, EmbedError, EmbedRequest, Embedded, Embeddings, ErrorKind, Guest, ProviderError,
    Request, Role, ToolCall, ToolChoice, Usage,
};
use serde_json::{Value, json};

/// The API version this plugin speaks.
pub const API_VERSION: &str = "2023-06-01";

struct Plugin;

impl Embeddings for Plugin {
    fn embed(_req: EmbedRequest) -> Result<Embedded, EmbedError> {
        Err(EmbedError::Unsupported(
            "Anthropic offers no embeddings API: name an OpenAI-compatible embedding model in the company's `[memory] embedding`".to_string(),
        ))
    }
}

impl Guest for Plugin {
    fn complete(req: Request) -> Result<Completion, ProviderError> {
        let url = format!("{}/messages", req.base_url.trim_end_matches('/'));
        let body = request_body(&req).to_string();
        let headers = [
            ("content-type", "application/json"),
            ("x-api-key", req.credential.api_key.as_str()),
            ("anthropic-version", API_VERSION),
        ];
        let response = http::send("POST", &url, &headers, body.as_bytes())
            .map_err(|f| denied_or_network(f, &req.credential.api_key))?;
        let request_id = response.header("request-id").map(str::to_string);
        if response.status != 200 {
            return Err(classify(&response, request_id, &req.credential.api_key));
        }
        parse_completion(&response.body, request_id)
    }
}

/// The Messages request body.
pub fn request_body(req: &Request) -> Value {
    let mut system: Vec<&str> = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for m in &req.messages {
        match m.role {
            Role::System => system.push(&m.content),
            Role::User => messages.push(json!({"role": "user", "content": m.content})),
            Role::Assistant => {
                let mut blocks: Vec<Value> = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({"type": "text", "text": m.content}));
                }
                for call in &m.tool_calls {
                    let input: Value = serde_json::from_str(&call.arguments_json).unwrap_or(json!({}));
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            Role::Tool => messages.push(json!({
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": m.tool_call_id.clone().unwrap_or_default(), "content": m.content}],
            })),
        }
    }
    let mut body =
        json!({ "model": req.model, "max_tokens": req.max_tokens, "messages": messages });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                let schema: Value = serde_json::from_str(&t.parameters_schema_json)
                    .unwrap_or(json!({"type": "object"}));
                json!({"name": t.name, "description": t.description, "input_schema": schema})
            })
            .collect();
        body["tool_choice"] = match &req.tool_choice {
            ToolChoice::Auto => json!({"type": "auto"}),
            ToolChoice::None => json!({"type": "none"}),
            ToolChoice::Required => json!({"type": "any"}),
            ToolChoice::Named(name) => json!({"type": "tool", "name": name}),
        };
    }
    body
}

fn parse_completion(body: &[u8], request_id: Option<String>) -> Result<Completion, ProviderError> {
    let undocumented = |what: &str| ProviderError {
        kind: ErrorKind::Transient,
        status: Some(200),
        request_id: request_id.clone(),
        message: format!("the response is not a Messages response ({what})"),
    };
    let value: Value = serde_json::from_slice(body).map_err(|_| undocumented("not JSON"))?;
    let blocks = value["content"]
        .as_array()
        .ok_or_else(|| undocumented("no content"))?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => tool_calls.push(ToolCall {
                id: block["id"]
                    .as_str()
                    .ok_or_else(|| undocumented("tool_use without id"))?
                    .to_string(),
                name: block["name"]
                    .as_str()
                    .ok_or_else(|| undocumented("tool_use without name"))?
                    .to_string(),
                arguments_json: block["input"].to_string(),
            }),
            _ => {}
        }
    }
    Ok(Completion {
        text: (!text.is_empty()).then_some(text),
        tool_calls,
        usage: Usage {
            input_tokens: value["usage"]["input_tokens"].as_u64().unwrap_or(0) as u32,
            output_tokens: value["usage"]["output_tokens"].as_u64().unwrap_or(0) as u32,
        },
        stop_reason: value["stop_reason"]
            .as_str()
            .unwrap_or("unknown")
            .to_string(),
        request_id: request_id.or_else(|| value["id"].as_str().map(str::to_string)),
    })
}

crewlet_plugin_sdk::provider::export_provider!(Plugin);
