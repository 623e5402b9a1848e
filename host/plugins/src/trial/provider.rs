//! One model call through a provider plugin, from a request written by
//! hand: what `crewlet plugins try` runs for a provider — a completion, or
//! an embedding when the request carries `input`.
//!
//! The call is the node's own ([`ProviderPlugin::complete`]): the base URL
//! and the outbound hosts are the manifest's, so a try reaches exactly what
//! a turn would. The key comes from the environment variable the request
//! names, never from the file, and is scrubbed from what the plugin said.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::provider::{
    Completion, Credential, EmbedError, EmbedRequest, Embedded, Message, ProviderError,
    ProviderPlugin, Request, Role, Tool, ToolCall, ToolChoice,
};
use crate::runtime::CallError;
use crate::trial::TrialInputError;

/// A completion request as `plugins try` reads it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub messages: Vec<TryMessage>,
    #[serde(default)]
    pub tools: Vec<TryTool>,
    /// `auto` (the default), `none`, `required`, or a tool's name.
    #[serde(default)]
    pub tool_choice: Option<String>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// The model entry's `options`, as the company document would give
    /// them.
    #[serde(default)]
    pub options: Map<String, Value>,
    /// The environment variable holding the API key (none: an empty key).
    #[serde(default)]
    pub api_key_env: Option<String>,
}

/// An embedding request as `plugins try` reads it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRequest {
    pub model: String,
    /// The texts, one vector each.
    pub input: Vec<String>,
    /// The embedding entry's `options`, as the company document would
    /// give them.
    #[serde(default)]
    pub options: Map<String, Value>,
    /// The environment variable holding the API key (none: an empty key).
    #[serde(default)]
    pub api_key_env: Option<String>,
}

impl EmbeddingRequest {
    /// The request the plugin gets, with `api_key`.
    pub fn request(&self, api_key: String) -> EmbedRequest {
        EmbedRequest {
            base_url: String::new(),
            model: self.model.clone(),
            inputs: self.input.clone(),
            credential: Credential { api_key },
            options_json: Value::Object(self.options.clone()).to_string(),
        }
    }
}

fn default_max_tokens() -> u32 {
    1024
}

/// One message: `role` is system, user, assistant or tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TryMessage {
    pub role: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub tool_calls: Vec<TryToolCall>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TryToolCall {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TryTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The parameters' JSON Schema.
    #[serde(default = "empty_schema")]
    pub parameters: Value,
}

fn empty_schema() -> Value {
    serde_json::json!({"type": "object"})
}

impl CompletionRequest {
    /// The request the plugin gets, with `api_key`; `Err` names the field
    /// that is wrong.
    pub fn request(&self, api_key: String) -> Result<Request, TrialInputError> {
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "tool" => Role::Tool,
                    other => {
                        return Err(TrialInputError::Role {
                            index: i,
                            role: other.to_owned(),
                        });
                    }
                };
                Ok(Message {
                    role,
                    content: m.content.clone(),
                    tool_calls: m
                        .tool_calls
                        .iter()
                        .map(|c| ToolCall {
                            id: c.id.clone(),
                            name: c.name.clone(),
                            arguments_json: c.arguments.to_string(),
                        })
                        .collect(),
                    tool_call_id: m.tool_call_id.clone(),
                })
            })
            .collect::<Result<Vec<_>, TrialInputError>>()?;
        let tool_choice = match self.tool_choice.as_deref() {
            None | Some("auto") => ToolChoice::Auto,
            Some("none") => ToolChoice::None,
            Some("required") => ToolChoice::Required,
            Some(name) if self.tools.iter().any(|t| t.name == name) => {
                ToolChoice::Named(name.to_string())
            }
            Some(other) => return Err(TrialInputError::ToolChoice(other.to_owned())),
        };
        Ok(Request {
            base_url: String::new(),
            model: self.model.clone(),
            messages,
            tools: self
                .tools
                .iter()
                .map(|t| Tool {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters_schema_json: t.parameters.to_string(),
                })
                .collect(),
            tool_choice,
            max_tokens: self.max_tokens,
            credential: Credential { api_key },
            options_json: Value::Object(self.options.clone()).to_string(),
        })
    }
}

/// What the provider answered, and what it said on stderr and `log`.
#[derive(Debug)]
pub struct ProviderTrial {
    pub answer: Result<Completion, ProviderError>,
    pub said: String,
    pub logged: Vec<String>,
}

/// What the provider answered an embedding, and what it said.
#[derive(Debug)]
pub struct EmbeddingTrial {
    pub answer: Result<Embedded, EmbedError>,
    pub said: String,
    pub logged: Vec<String>,
}

impl ProviderPlugin {
    /// One embedding, as the node's embedder would ask it, with the
    /// plugin's stderr and `log` lines.
    pub async fn trial_embed(&self, req: EmbedRequest) -> Result<EmbeddingTrial, CallError> {
        let speaker = self.speaker();
        let mark = speaker.mark();
        let (answer, said) = self.embed_said(req).await?;
        Ok(EmbeddingTrial {
            answer,
            said,
            logged: speaker.logged_since(mark),
        })
    }

    /// One call, as a turn would make it, with the plugin's stderr and
    /// `log` lines.
    pub async fn trial(&self, req: Request) -> Result<ProviderTrial, CallError> {
        let speaker = self.speaker();
        let mark = speaker.mark();
        let (answer, said) = self.call(req).await?;
        Ok(ProviderTrial {
            answer,
            said,
            logged: speaker.logged_since(mark),
        })
    }
}
