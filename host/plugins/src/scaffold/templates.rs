//! The files `crewlet plugins new` writes for the plugin itself, with
//! `{{name}}`-style holes the scaffold fills. Each lib is small because the
//! guest SDK (shipped beside it) generates the bindings and does the
//! plumbing; each keeps its logic in plain functions with native unit
//! tests, so `cargo test` checks it without a host.

pub(super) const CARGO_TOML: &str = r#"[package]
name = "{{crate}}"
version = "0.1.0"
edition = "2024"
publish = false

# A cdylib built with `--target wasm32-wasip2` is a component. `cargo test`
# runs the unit tests natively (it builds the test harness, not the cdylib).
[lib]
crate-type = ["cdylib"]

[dependencies]
# The guest SDK this crewlet shipped, in crewlet-sdk/ (with the WIT it
# generates the bindings from). Its version is the SDK's, not crewlet's.
crewlet-plugin-sdk = { path = "crewlet-sdk/plugins/sdk", version = "{{sdk_version}}", features = ["{{kind}}"] }

[workspace]

"#;

pub(super) const MANIFEST_HEAD: &str = r#"name = "{{name}}"
version = "0.1.0"
kind = "{{kind}}"
component = "target/wasm32-wasip2/release/{{artifact}}.wasm"

[limits]
memory_mib = 32
"#;

pub(super) const WEBHOOK_MANIFEST: &str = r#"deadline_ms = 500

[webhook]
routes = ["/webhooks/{{name}}"]
secrets = ["{{secret}}_token"]
"#;

pub(super) const PROVIDER_MANIFEST: &str = r#"deadline_ms = 120000

[provider]
base_url = "https://api.example.com/v1"
allowed_outbound_hosts = ["https://api.example.com:443"]
"#;

pub(super) const MODULE_MANIFEST: &str = r#"deadline_ms = 2000

[module]
# Local topic names; published as `module.{{name}}.<topic>`.
publishes = ["noted"]

# A company event kind (or another module's topic: `topic = "MODULE.TOPIC"`).
[[module.subscribe]]
event = "turn_ended"
delivery = "once"

[module.state.notes]
history = 1

# A tool seats may call, as `{{name}}__add-note` (MODULE__TOOL, the name
# as spelled here); the host checks every call's arguments against this
# JSON Schema before the module runs.
[module.tools.add-note]
description = "Keeps a note under a key, in the bucket `notes`"
arguments = { type = "object", properties = { key = { type = "string" }, text = { type = "string" } }, required = ["key", "text"] }
"#;

pub(super) const WEBHOOK_LIB: &str = r#"//! The `{{name}}` webhook plugin: a shared token in `x-{{name}}-token`,
//! compared in constant time with the secret `{{secret}}_token`; the body,
//! as text, becomes one delivery. Set `owed` to where a person waits for an
//! answer (a channel, a thread) when the delivery asks a question; it is
//! `None` here: a bare message asks for nothing.

use crewlet_plugin_sdk::webhook::log::{self, Level};
use crewlet_plugin_sdk::webhook::{
    Addressed, Delivery, Guest, ParseError, Parsed, Request, VerifyError, Wakes,
};

/// Equal length and content, in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks the token header against the secret.
pub fn check_token(header: Option<&str>, secret: Option<&[u8]>) -> Result<(), VerifyError> {
    let secret = secret.ok_or_else(|| VerifyError::MissingSecret("{{secret}}_token".into()))?;
    let header = header.ok_or_else(|| VerifyError::MissingHeader("x-{{name}}-token".into()))?;
    if constant_time_eq(header.as_bytes(), secret) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        check_token(req.header("x-{{name}}-token"), req.secret("{{secret}}_token"))
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        let text = String::from_utf8(req.body.clone())
            .map_err(|_| ParseError::MalformedBody("the body is not UTF-8".into()))?;
        let id = req
            .header("x-request-id")
            .ok_or_else(|| ParseError::MissingField("header x-request-id".into()))?
            .to_string();
        log::write(Level::Debug, &format!("{} bytes of text", text.len()));
        Ok(Parsed {
            deliveries: vec![Delivery {
                source: "{{name}}".into(),
                event_type: "message".into(),
                delivery_id: id,
                addressed: Addressed { mentions: vec![], assignees: vec![], reviewers: vec![], channel: None, thread: None },
                text: Some(text),
                payload: req.body,
                owed: None,
                sender: vec![],
                wakes: Wakes::RouteAndNamed,
                message: None,
            }],
            reply: None,
        })
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_must_match() {
        assert!(check_token(Some("s3cret"), Some(b"s3cret")).is_ok());
        assert!(matches!(check_token(Some("s3creT"), Some(b"s3cret")), Err(VerifyError::Mismatch)));
        assert!(matches!(check_token(None, Some(b"s3cret")), Err(VerifyError::MissingHeader(_))));
        assert!(matches!(check_token(Some("x"), None), Err(VerifyError::MissingSecret(_))));
    }
}
"#;

pub(super) const PROVIDER_LIB: &str = r##"//! The `{{name}}` provider plugin: one `complete` is one
//! `POST {base_url}/chat/completions` in the OpenAI wire format, text only.
//! For another vendor, change `endpoint`, `request_body` and
//! `parse_completion`; keep the rest:
//! - the SDK's `http::send` follows redirects itself, so the host checks
//!   every hop against the manifest's `allowed_outbound_hosts`;
//! - the SDK's `classify` turns a failed response into the kind every
//!   provider reports for it (rate-limited, auth, overloaded,
//!   context-too-long, bad-request, transient), with the vendor's message
//!   redacted. Never retry here: the host benches the key and falls back.
//!
//! Embeddings (`Embeddings::embed`) answer `unsupported` until the vendor's
//! embeddings endpoint is wired (the repo's openai plugin shows one).

use crewlet_plugin_sdk::provider::classify::{classify, denied_or_network};
use crewlet_plugin_sdk::provider::{
    Completion, EmbedError, EmbedRequest, Embedded, Embeddings, ErrorKind, Guest, ProviderError,
    Request, Role, Usage, http,
};
use crewlet_plugin_sdk::serde_json::{self, Value, json};

/// The vendor endpoint for a base URL.
pub fn endpoint(base_url: &str) -> String {
    format!("{}/chat/completions", base_url.trim_end_matches('/'))
}

/// The request body for `req`'s model, messages and token limit.
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
            json!({ "role": role, "content": m.content })
        })
        .collect();
    json!({ "model": req.model, "messages": messages, "max_tokens": req.max_tokens })
}

/// A successful response's completion; a body that is not one is a
/// transient error that says what was missing.
pub fn parse_completion(body: &[u8], request_id: Option<String>) -> Result<Completion, ProviderError> {
    let undocumented = |what: &str| ProviderError {
        kind: ErrorKind::Transient,
        status: Some(200),
        request_id: request_id.clone(),
        message: format!("the response is not a chat completion ({what})"),
    };
    let value: Value = serde_json::from_slice(body).map_err(|_| undocumented("not JSON"))?;
    let choice = value["choices"].get(0).ok_or_else(|| undocumented("no choices"))?;
    Ok(Completion {
        text: choice["message"]["content"].as_str().map(str::to_string),
        tool_calls: Vec::new(),
        usage: Usage {
            input_tokens: value["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as u32,
            output_tokens: value["usage"]["completion_tokens"].as_u64().unwrap_or(0) as u32,
        },
        stop_reason: choice["finish_reason"].as_str().unwrap_or("unknown").to_string(),
        request_id,
    })
}

struct Plugin;

impl Guest for Plugin {
    fn complete(req: Request) -> Result<Completion, ProviderError> {
        let key = req.credential.api_key.as_str();
        let body = request_body(&req).to_string();
        let auth = format!("Bearer {key}");
        let headers = [("content-type", "application/json"), ("authorization", auth.as_str())];
        let response = http::send("POST", &endpoint(&req.base_url), &headers, body.as_bytes())
            .map_err(|failure| denied_or_network(failure, key))?;
        let request_id = response.header("x-request-id").map(str::to_string);
        if !(200..300).contains(&response.status) {
            return Err(classify(&response, request_id, key));
        }
        parse_completion(&response.body, request_id)
    }
}

impl Embeddings for Plugin {
    fn embed(_req: EmbedRequest) -> Result<Embedded, EmbedError> {
        Err(EmbedError::Unsupported("this provider does not embed yet".to_string()))
    }
}

crewlet_plugin_sdk::provider::export_provider!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_joins_without_double_slash() {
        assert_eq!(endpoint("https://api.example.com/v1/"), "https://api.example.com/v1/chat/completions");
    }

    #[test]
    fn a_completion_is_read_and_a_body_that_is_not_one_is_transient() {
        let done = parse_completion(
            br#"{"choices":[{"finish_reason":"stop","message":{"content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
            Some("req_1".into()),
        )
        .unwrap();
        assert_eq!((done.text.as_deref(), done.usage.input_tokens), (Some("hi"), 3));
        let error = parse_completion(b"{}", None).unwrap_err();
        assert!(matches!(error.kind, ErrorKind::Transient), "{}", error.message);
    }

    #[test]
    fn the_sdk_classifies_a_context_window_error() {
        let response = http::Response {
            status: 400,
            headers: Vec::new(),
            body: br#"{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}"#.to_vec(),
        };
        let error = classify(&response, None, "sk-test");
        assert!(matches!(error.kind, ErrorKind::ContextTooLong), "{}", error.message);
    }
}
"##;

pub(super) const MODULE_LIB: &str = r##"//! The `{{name}}` module: owns the bucket `notes`. Its tool `add-note`
//! keeps a note under a key and publishes `noted`; every `turn_ended` event
//! adds one to the count under `turns-ended`.

use crewlet_plugin_sdk::module::{self, Event, Guest, StateEvent, ToolCall, state};
use crewlet_plugin_sdk::serde_json::{self, json};

/// The key and text of an `add-note` call (the host has already checked
/// them against the manifest's schema).
pub fn note(arguments_json: &str) -> Result<(String, String), String> {
    let v: serde_json::Value = serde_json::from_str(arguments_json).map_err(|e| e.to_string())?;
    let key = v["key"].as_str().ok_or("`key` must be a string")?;
    let text = v["text"].as_str().ok_or("`text` must be a string")?;
    Ok((key.to_string(), text.to_string()))
}

/// The count after one more, from the stored text (absent or unreadable: 0).
pub fn next_count(stored: Option<&[u8]>) -> u64 {
    stored
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(0)
        + 1
}

struct Module;

impl Guest for Module {
    fn init() -> Result<(), String> {
        module::info("{{name}} ready");
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        match event.topic.as_str() {
            "turn_ended" => {
                let stored = state::get("notes", "turns-ended").map_err(|e| module::describe(&e))?;
                let count = next_count(stored.as_ref().map(|e| e.value.as_slice()));
                state::put("notes", "turns-ended", count.to_string().as_bytes())
                    .map_err(|e| module::describe(&e))?;
                Ok(())
            }
            other => Err(format!("{{name}} does not handle `{other}`")),
        }
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Ok(())
    }

    fn call_tool(call: ToolCall) -> Result<String, String> {
        match call.name.as_str() {
            "add-note" => {
                let (key, text) = note(&call.arguments_json)?;
                let revision = state::put("notes", &key, text.as_bytes()).map_err(|e| module::describe(&e))?;
                module::publish("noted", &json!({ "key": key, "by": call.caller.seat }))?;
                Ok(format!("noted `{key}` (revision {revision})"))
            }
            other => Err(format!("{{name}} has no tool `{other}`")),
        }
    }
}

crewlet_plugin_sdk::module::export_module!(Module);

#[cfg(test)]
mod tests {
    #[test]
    fn a_note_needs_a_key_and_a_text() {
        assert_eq!(
            super::note(r#"{"key":"a","text":"b"}"#),
            Ok(("a".to_string(), "b".to_string()))
        );
        assert!(super::note(r#"{"key":"a"}"#).is_err());
        assert!(super::note("not json").is_err());
    }

    #[test]
    fn counts_start_at_one() {
        assert_eq!(super::next_count(None), 1);
        assert_eq!(super::next_count(Some(b"41")), 42);
        assert_eq!(super::next_count(Some(b"junk")), 1);
    }
}
"##;
