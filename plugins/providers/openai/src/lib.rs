//! An OpenAI-compatible chat-completions backend.
//!
//! `POST {base_url}/chat/completions` with `Authorization: Bearer <key>`.
//! Any server speaking this wire format works (OpenAI, Azure-style proxies,
//! vLLM, Ollama); the base URL comes from the manifest.
//!
//! Failures are classified by the SDK's one classifier
//! (`crewlet_plugin_sdk::provider::classify`), the same way as every other
//! provider's: this plugin never retries and keeps no table of its own. The
//! request id is the `x-request-id` header.
//!
//! Embeddings: `POST {base_url}/embeddings` with the model and the texts as
//! `input` (a list); the vectors are `data[].embedding`, put back in the
//! inputs' order by each item's `index`, and the tokens billed are
//! `usage.prompt_tokens`. Whether there is one vector per text is the
//! host's to judge, not this plugin's.

use crewlet_plugin_sdk::provider::classify::{classify, denied_or_network};
use crewlet_plugin_sdk::provider::http;
use crewlet_plugin_sdk::provider::{
    Completion, EmbedError, EmbedRequest, Embedded, Embeddings, ErrorKind, Guest, ProviderError,
    Request, Role, ToolCall, ToolChoice, Usage,
};
use serde_json::{Value, json};

struct Plugin;

impl Guest for Plugin {
    fn complete(req: Request) -> Result<Completion, ProviderError> {
        let url = format!("{}/chat/completions", req.base_url.trim_end_matches('/'));
        let body = request_body(&req).to_string();
        let auth = format!("Bearer {}", req.credential.api_key);
        let headers = [
            ("content-type", "application/json"),
            ("authorization", auth.as_str()),
        ];
        let response = http::send("POST", &url, &headers, body.as_bytes())
            .map_err(|f| denied_or_network(f, &req.credential.api_key))?;
        let request_id = response.header("x-request-id").map(str::to_string);
        if response.status != 200 {
            return Err(classify(&response, request_id, &req.credential.api_key));
        }
        parse_completion(&response.body, request_id)
    }
}

impl Embeddings for Plugin {
    fn embed(req: EmbedRequest) -> Result<Embedded, EmbedError> {
        let url = format!("{}/embeddings", req.base_url.trim_end_matches('/'));
        let body = json!({ "model": req.model, "input": req.inputs }).to_string();
        let auth = format!("Bearer {}", req.credential.api_key);
        let headers = [
            ("content-type", "application/json"),
            ("authorization", auth.as_str()),
        ];
        let response = http::send("POST", &url, &headers, body.as_bytes())
            .map_err(|f| EmbedError::Failed(denied_or_network(f, &req.credential.api_key)))?;
        let request_id = response.header("x-request-id").map(str::to_string);
        if response.status != 200 {
            return Err(EmbedError::Failed(classify(
                &response,
                request_id,
                &req.credential.api_key,
            )));
        }
        parse_embeddings(&response.body, request_id).map_err(EmbedError::Failed)
    }
}

/// `data[].embedding` in `index` order, and `usage.prompt_tokens`.
fn parse_embeddings(body: &[u8], request_id: Option<String>) -> Result<Embedded, ProviderError> {
    let undocumented = |what: &str| ProviderError {
        kind: ErrorKind::Transient,
        status: Some(200),
        request_id: request_id.clone(),
        message: format!("the response is not an embeddings list ({what})"),
    };
    let value: Value = serde_json::from_slice(body).map_err(|_| undocumented("not JSON"))?;
    let data = value["data"]
        .as_array()
        .ok_or_else(|| undocumented("no `data` list"))?;
    let mut items = data
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let vector = item["embedding"]
                .as_array()?
                .iter()
                .map(|x| x.as_f64().map(|x| x as f32))
                .collect::<Option<Vec<f32>>>()?;
            Some((item["index"].as_u64().unwrap_or(i as u64), vector))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| undocumented("an item without a list of numbers as `embedding`"))?;
    items.sort_by_key(|(index, _)| *index);
    Ok(Embedded {
        vectors: items.into_iter().map(|(_, v)| v).collect(),
        input_tokens: value["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as u32,
        request_id: request_id.or_else(|| value["id"].as_str().map(str::to_string)),
    })
}

/// The chat-completions request body.
pub fn request_body(req: &Request) -> Value {
    let messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            let mut msg = json!({ "role": role, "content": m.content });
            if !m.tool_calls.is_empty() {
                msg["tool_calls"] = m
                    .tool_calls
                    .iter()
                    .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}))
                    .collect();
            }
            if let Some(id) = &m.tool_call_id {
                msg["tool_call_id"] = json!(id);
            }
            msg
        })
        .collect();
    let mut body =
        json!({ "model": req.model, "messages": messages, "max_tokens": req.max_tokens });
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                let schema: Value = serde_json::from_str(&t.parameters_schema_json).unwrap_or(json!({"type": "object"}));
                json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": schema}})
            })
            .collect();
        body["tool_choice"] = match &req.tool_choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
        };
    }
    body
}

fn parse_completion(body: &[u8], request_id: Option<String>) -> Result<Completion, ProviderError> {
    let undocumented = |what: &str| ProviderError {
        kind: ErrorKind::Transient,
        status: Some(200),
        request_id: request_id.clone(),
        message: format!("the response is not a chat completion ({what})"),
    };
    let value: Value = serde_json::from_slice(body).map_err(|_| undocumented("not JSON"))?;
    let choice = value["choices"]
        .get(0)
        .ok_or_else(|| undocumented("no choices"))?;
    let message = &choice["message"];
    let tool_calls = match &message["tool_calls"] {
        Value::Array(calls) => calls
            .iter()
            .map(|c| {
                Some(ToolCall {
                    id: c["id"].as_str()?.to_string(),
                    name: c["function"]["name"].as_str()?.to_string(),
                    arguments_json: c["function"]["arguments"]
                        .as_str()
                        .unwrap_or("{}")
                        .to_string(),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| undocumented("a tool call without id or name"))?,
        _ => Vec::new(),
    };
    let usage = Usage {
        input_tokens: value["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as u32,
        output_tokens: value["usage"]["completion_tokens"].as_u64().unwrap_or(0) as u32,
    };
    Ok(Completion {
        text: message["content"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        tool_calls,
        usage,
        stop_reason: choice["finish_reason"]
            .as_str()
            .unwrap_or("unknown")
            .to_string(),
        request_id: request_id.or_else(|| value["id"].as_str().map(str::to_string)),
    })
}

crewlet_plugin_sdk::provider::export_provider!(Plugin);
