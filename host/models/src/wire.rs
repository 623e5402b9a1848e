//! The turn engine's words to the provider world's and back: the one place
//! the WIT types are spelled.
//!
//! Rule: the WIT types (`crewlet_plugins::provider`) never leave this crate.
//! A caller speaks the turn engine's port ([`Prompt`], [`Thought`]); the
//! request is converted once per call and cloned per attempt, and the
//! answer converted once, so a plugin's ABI can change without a caller
//! changing, and nothing is translated twice.

use crewlet_company::ModelRef;
use crewlet_plugins::provider::{
    Completion, Credential, Message, Request, Role, Tool, ToolCall, ToolChoice,
};
use crewlet_turns::{Call, Msg, Prompt, Speaker, Thought, ToolDef};

/// A prompt in the provider world's words, the same for every model of the
/// chain.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    messages: Vec<Message>,
    tools: Vec<Tool>,
    tool_choice: ToolChoice,
    max_tokens: u32,
}

impl Outgoing {
    pub(crate) fn of(prompt: Prompt) -> Outgoing {
        Outgoing {
            messages: prompt.messages.into_iter().map(message).collect(),
            tools: prompt.tools.into_iter().map(tool).collect(),
            tool_choice: if prompt.must_call_tool {
                ToolChoice::Required
            } else {
                ToolChoice::Auto
            },
            max_tokens: prompt.max_tokens,
        }
    }

    /// The request for one attempt: this model, this key, its options.
    pub(crate) fn request(&self, model: &str, api_key: &str, options_json: &str) -> Request {
        Request {
            base_url: String::new(),
            model: model.to_owned(),
            messages: self.messages.clone(),
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            max_tokens: self.max_tokens,
            credential: Credential {
                api_key: api_key.to_owned(),
            },
            options_json: options_json.to_owned(),
        }
    }
}

fn message(m: Msg) -> Message {
    Message {
        role: match m.speaker {
            Speaker::System => Role::System,
            Speaker::User => Role::User,
            Speaker::Assistant => Role::Assistant,
            Speaker::Tool => Role::Tool,
        },
        content: m.content,
        tool_calls: m
            .calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments_json: c.arguments,
            })
            .collect(),
        tool_call_id: m.call_id,
    }
}

fn tool(t: ToolDef) -> Tool {
    Tool {
        name: t.name,
        description: t.description,
        parameters_schema_json: t.parameters.to_string(),
    }
}

/// What the vendor said besides the thought: why it stopped and its id for
/// the request.
pub(crate) struct Receipt {
    pub stop_reason: String,
    pub request_id: Option<String>,
}

/// A completion as the turn engine's thought, `model` being the entry that
/// answered.
pub(crate) fn thought(c: Completion, model: &ModelRef) -> (Thought, Receipt) {
    let thought = Thought {
        text: c.text,
        calls: c
            .tool_calls
            .into_iter()
            .map(|t| Call {
                id: t.id,
                name: t.name,
                arguments: t.arguments_json,
            })
            .collect(),
        input_tokens: c.usage.input_tokens.into(),
        output_tokens: c.usage.output_tokens.into(),
        model: format!("{}/{}", model.provider, model.model),
        slot: None,
    };
    let receipt = Receipt {
        stop_reason: c.stop_reason,
        request_id: c.request_id,
    };
    (thought, receipt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crewlet_plugins::provider::Usage;
    use serde_json::json;

    #[test]
    fn every_speaker_call_and_tool_reaches_the_request_and_the_key_only_its_credential() {
        let assistant = Msg {
            speaker: Speaker::Assistant,
            content: String::new(),
            calls: vec![Call {
                id: "c1".into(),
                name: "lookup".into(),
                arguments: r#"{"q":"oslo"}"#.into(),
            }],
            call_id: None,
        };
        let prompt = Prompt {
            messages: vec![
                Msg::system("be brief"),
                Msg::user("weather?"),
                assistant,
                Msg::tool("c1", "rain"),
            ],
            tools: vec![ToolDef {
                name: "lookup".into(),
                description: "look it up".into(),
                parameters: json!({"type": "object"}),
            }],
            must_call_tool: true,
            max_tokens: 77,
        };
        let r = Outgoing::of(prompt).request("gpt-a", "sk-1", "{\"t\":1}");
        let roles: Vec<Role> = r.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [Role::System, Role::User, Role::Assistant, Role::Tool]
        );
        assert_eq!(r.messages[1].content, "weather?");
        assert_eq!(r.messages[2].tool_calls[0].id, "c1");
        assert_eq!(r.messages[2].tool_calls[0].name, "lookup");
        assert_eq!(
            r.messages[2].tool_calls[0].arguments_json,
            r#"{"q":"oslo"}"#
        );
        assert_eq!(r.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(r.messages[0].tool_call_id, None);
        assert_eq!(r.tools[0].name, "lookup");
        assert_eq!(r.tools[0].description, "look it up");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&r.tools[0].parameters_schema_json).unwrap(),
            json!({"type": "object"})
        );
        assert_eq!(r.tool_choice, ToolChoice::Required);
        assert_eq!((r.model.as_str(), r.max_tokens), ("gpt-a", 77));
        assert_eq!(r.credential.api_key, "sk-1");
        assert_eq!(
            (r.base_url.as_str(), r.options_json.as_str()),
            ("", "{\"t\":1}")
        );

        let free = Prompt {
            messages: vec![],
            tools: vec![],
            must_call_tool: false,
            max_tokens: 1,
        };
        assert_eq!(
            Outgoing::of(free).request("m", "", "{}").tool_choice,
            ToolChoice::Auto
        );
    }

    #[test]
    fn a_completion_becomes_a_thought_named_by_the_entry_that_answered() {
        let entry = ModelRef {
            provider: "openai".into(),
            model: "gpt-a".into(),
            credentials: vec![],
            options: Default::default(),
        };
        let (t, receipt) = thought(
            Completion {
                text: Some("done".into()),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "submit_work".into(),
                    arguments_json: "{}".into(),
                }],
                usage: Usage {
                    input_tokens: 12,
                    output_tokens: 3,
                },
                stop_reason: "tool_calls".into(),
                request_id: Some("req-9".into()),
            },
            &entry,
        );
        assert_eq!(t.text.as_deref(), Some("done"));
        assert_eq!(
            t.calls,
            [Call {
                id: "call_1".into(),
                name: "submit_work".into(),
                arguments: "{}".into()
            }]
        );
        assert_eq!((t.input_tokens, t.output_tokens), (12, 3));
        assert_eq!(t.model, "openai/gpt-a");
        assert_eq!(receipt.stop_reason, "tool_calls");
        assert_eq!(receipt.request_id.as_deref(), Some("req-9"));
    }
}
