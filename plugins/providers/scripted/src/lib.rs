//! The scripted provider: a deterministic model for demos and tests.
//!
//! It is not a model. Every answer comes from the model entry's `options`
//! (passed in `options-json`), so a demo company or a test can say exactly
//! what the "model" does at each step of a turn, and every run is the same.
//! It makes no outbound request at all.
//!
//! Rules (the full spec is in docs/plugins.md, "The scripted provider"):
//! - `options.steps` is a list; the step used is the number of assistant
//!   messages already in the conversation (0-based); past the end, the last
//!   step repeats. That makes the answer a function of the conversation,
//!   not of any state in the plugin (a provider instance is never reused).
//! - A step is `{ say }`, `{ call, args }` or `{ calls = [{ call, args }] }`,
//!   with optional `fail` (answer that provider error instead),
//!   `retry_after` (seconds, with `fail = "rate-limited"`) and
//!   `usage = { input, output }`.
//! - Strings in `say` and anywhere in `args` are templates:
//!   `{{wake.FIELD}}` from the JSON object in the first user message's
//!   ```` ```wake ```` block, `{{last_tool_result}}` from the last `tool`
//!   message. Unknown placeholders are left as they are. A wake field
//!   that is empty (`null`: a wake with no channel or thread) fills as
//!   nothing, and an argument that is that placeholder alone is left out,
//!   so a reply is never posted to a channel named "null": without a
//!   channel the tool refuses the call, and its event says so.
//! - Malformed options answer `bad-request` naming the problem, never a trap:
//!   a typo in a company document must read as a message, not a fault.
//! - Embeddings (`embed`) are a hashed bag of words, not a model: see
//!   [`embed`].

mod embed;

use crewlet_plugin_sdk::provider::{
    Completion, EmbedError, EmbedRequest, Embedded, Embeddings, ErrorKind, Guest, Message,
    ProviderError, Request, Role, ToolCall, Usage,
};
use serde_json::{Map, Value};

struct Plugin;

impl Guest for Plugin {
    fn complete(req: Request) -> Result<Completion, ProviderError> {
        let steps = parse_steps(&req.options_json)?;
        let index = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let step = &steps[index.min(steps.len() - 1)];
        answer(step, index, &req.messages)
    }
}

impl Embeddings for Plugin {
    fn embed(req: EmbedRequest) -> Result<Embedded, EmbedError> {
        embed::embed(&req)
    }
}

/// What one step answers.
#[derive(Debug, Clone)]
enum Act {
    Say(String),
    Calls(Vec<(String, Value)>),
    /// A step that only fails.
    Nothing,
}

/// One validated step.
#[derive(Debug, Clone)]
struct Step {
    act: Act,
    fail: Option<Failure>,
    usage: Option<(u32, u32)>,
}

#[derive(Debug, Clone, Copy)]
struct Failure {
    kind: FailKind,
    retry_after_s: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
enum FailKind {
    RateLimited,
    Auth,
    Overloaded,
    Transient,
    BadRequest,
}

impl FailKind {
    const NAMES: &'static str = "rate-limited, auth, overloaded, transient, bad-request";

    fn parse(s: &str) -> Option<FailKind> {
        Some(match s {
            "rate-limited" => FailKind::RateLimited,
            "auth" => FailKind::Auth,
            "overloaded" => FailKind::Overloaded,
            "transient" => FailKind::Transient,
            "bad-request" => FailKind::BadRequest,
            _ => return None,
        })
    }

    fn status(self) -> u16 {
        match self {
            FailKind::RateLimited => 429,
            FailKind::Auth => 401,
            FailKind::Overloaded => 503,
            FailKind::Transient => 500,
            FailKind::BadRequest => 400,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FailKind::RateLimited => "rate-limited",
            FailKind::Auth => "auth",
            FailKind::Overloaded => "overloaded",
            FailKind::Transient => "transient",
            FailKind::BadRequest => "bad-request",
        }
    }
}

/// A `bad-request` naming what is wrong with the options.
fn malformed(what: String) -> ProviderError {
    ProviderError {
        kind: ErrorKind::BadRequest,
        status: None,
        request_id: None,
        message: format!("scripted provider: malformed options: {what}"),
    }
}

fn parse_steps(options_json: &str) -> Result<Vec<Step>, ProviderError> {
    let text = if options_json.trim().is_empty() {
        "{}"
    } else {
        options_json
    };
    let options: Value =
        serde_json::from_str(text).map_err(|e| malformed(format!("options are not JSON ({e})")))?;
    let Value::Object(options) = options else {
        return Err(malformed("options must be a table (a JSON object)".into()));
    };
    let steps = match options.get("steps") {
        None => {
            return Err(malformed(
                "`steps` is missing: give the model entry `options.steps = [ { say = \"…\" }, … ]`"
                    .into(),
            ));
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(malformed("`steps` is empty: give at least one step".into()));
        }
        Some(Value::Array(a)) => a,
        Some(_) => return Err(malformed("`steps` must be a list of steps".into())),
    };
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| parse_step(s).map_err(|e| malformed(format!("steps[{i}]: {e}"))))
        .collect()
}

fn parse_step(value: &Value) -> Result<Step, String> {
    let Value::Object(step) = value else {
        return Err("a step must be a table like { say = \"…\" }".into());
    };
    for key in step.keys() {
        if ![
            "say",
            "call",
            "args",
            "calls",
            "fail",
            "retry_after",
            "usage",
        ]
        .contains(&key.as_str())
        {
            return Err(format!(
                "unknown key `{key}` (known: say, call, args, calls, fail, retry_after, usage)"
            ));
        }
    }
    let act = match (step.get("say"), step.get("call"), step.get("calls")) {
        (Some(Value::String(s)), None, None) => Act::Say(s.clone()),
        (Some(_), None, None) => return Err("`say` must be a string".into()),
        (None, Some(_), None) => Act::Calls(vec![parse_call(step, false)?]),
        (None, None, Some(Value::Array(calls))) if !calls.is_empty() => Act::Calls(
            calls
                .iter()
                .enumerate()
                .map(|(i, c)| match c {
                    Value::Object(c) => parse_call(c, true).map_err(|e| format!("calls[{i}]: {e}")),
                    _ => Err(format!(
                        "calls[{i}]: must be a table like {{ call = \"tool\" }}"
                    )),
                })
                .collect::<Result<_, _>>()?,
        ),
        (None, None, Some(_)) => return Err("`calls` must be a non-empty list".into()),
        (None, None, None) if step.contains_key("fail") => Act::Nothing,
        (None, None, None) => return Err("a step needs `say`, `call` or `calls`".into()),
        _ => return Err("use exactly one of `say`, `call` or `calls`".into()),
    };
    if step.contains_key("args") && step.contains_key("calls") {
        return Err("`args` belongs inside each entry of `calls`".into());
    }
    let fail = match step.get("fail") {
        None => None,
        Some(Value::String(s)) => Some(Failure {
            kind: FailKind::parse(s)
                .ok_or_else(|| format!("`fail` {s:?} is not one of {}", FailKind::NAMES))?,
            retry_after_s: None,
        }),
        Some(_) => return Err(format!("`fail` must be one of {}", FailKind::NAMES)),
    };
    let fail = match (fail, step.get("retry_after")) {
        (f, None) => f,
        (Some(f), Some(v)) if matches!(f.kind, FailKind::RateLimited) => Some(Failure {
            retry_after_s: Some(
                v.as_u64()
                    .ok_or("`retry_after` must be a whole number of seconds")?,
            ),
            ..f
        }),
        _ => return Err("`retry_after` goes only with `fail = \"rate-limited\"`".into()),
    };
    let usage = match step.get("usage") {
        None => None,
        Some(Value::Object(u)) => {
            for key in u.keys() {
                if key != "input" && key != "output" {
                    return Err(format!("usage: unknown key `{key}` (known: input, output)"));
                }
            }
            let count = |k: &str| -> Result<u32, String> {
                match u.get(k) {
                    None => Ok(0),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| format!("usage.{k} must be a whole number of tokens")),
                }
            };
            Some((count("input")?, count("output")?))
        }
        Some(_) => return Err("`usage` must be a table { input = N, output = M }".into()),
    };
    Ok(Step { act, fail, usage })
}

/// One tool call; `entry` when it is an entry of `calls` (only `call` and
/// `args` allowed there).
fn parse_call(call: &Map<String, Value>, entry: bool) -> Result<(String, Value), String> {
    let name = match call.get("call") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err("`call` must name a tool (a non-empty string)".into()),
    };
    let args = match call.get("args") {
        None => Value::Object(Map::new()),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return Err("`args` must be a table (a JSON object)".into()),
    };
    if entry && let Some(k) = call.keys().find(|k| *k != "call" && *k != "args") {
        return Err(format!("unknown key `{k}` in a call (known: call, args)"));
    }
    Ok((name, args))
}

/// The step's answer, templates filled.
fn answer(step: &Step, index: usize, messages: &[Message]) -> Result<Completion, ProviderError> {
    let request_id = Some(format!("scripted-{index}"));
    if let Some(f) = step.fail {
        return Err(ProviderError {
            kind: match f.kind {
                FailKind::RateLimited => ErrorKind::RateLimited(f.retry_after_s.map(|s| s * 1000)),
                FailKind::Auth => ErrorKind::Auth,
                FailKind::Overloaded => ErrorKind::Overloaded,
                FailKind::Transient => ErrorKind::Transient,
                FailKind::BadRequest => ErrorKind::BadRequest,
            },
            status: Some(f.kind.status()),
            request_id,
            message: format!("scripted failure at step {index}: {}", f.kind.name()),
        });
    }
    let context = Context::of(messages);
    let (text, tool_calls) = match &step.act {
        Act::Say(s) => (Some(context.fill(s)), Vec::new()),
        Act::Calls(calls) => (
            None,
            calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| ToolCall {
                    id: format!("call-{index}-{i}"),
                    name: name.clone(),
                    arguments_json: context.fill_value(args).to_string(),
                })
                .collect(),
        ),
        Act::Nothing => (None, Vec::new()),
    };
    let answer_chars = text.as_deref().map_or(0, |t| t.chars().count())
        + tool_calls
            .iter()
            .map(|c| c.name.chars().count() + c.arguments_json.chars().count())
            .sum::<usize>();
    let input_chars: usize = messages.iter().map(|m| m.content.chars().count()).sum();
    let (input, output) = step
        .usage
        .unwrap_or((quarter(input_chars), quarter(answer_chars)));
    Ok(Completion {
        stop_reason: if tool_calls.is_empty() {
            "stop".into()
        } else {
            "tool_calls".into()
        },
        text,
        tool_calls,
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
        },
        request_id,
    })
}

/// A character count / 4, at least 1.
fn quarter(chars: usize) -> u32 {
    u32::try_from(chars / 4).unwrap_or(u32::MAX).max(1)
}

/// What templates may refer to.
struct Context {
    wake: Option<Map<String, Value>>,
    last_tool_result: Option<String>,
}

impl Context {
    fn of(messages: &[Message]) -> Context {
        let wake = messages
            .iter()
            .find(|m| m.role == Role::User)
            .and_then(|m| wake_object(&m.content));
        let last_tool_result = messages
            .iter()
            .rev()
            .find(|m| m.role == Role::Tool)
            .map(|m| m.content.clone());
        Context {
            wake,
            last_tool_result,
        }
    }

    fn lookup(&self, name: &str) -> Option<String> {
        if name == "last_tool_result" {
            return self.last_tool_result.clone();
        }
        let field = name.strip_prefix("wake.")?;
        match self.wake.as_ref()?.get(field)? {
            Value::String(s) => Some(s.clone()),
            Value::Null => Some(String::new()),
            other => Some(other.to_string()),
        }
    }

    /// Whether `template` is one placeholder alone naming a wake field
    /// that is empty (`null`) in this wake.
    fn names_only_an_empty_field(&self, template: &str) -> bool {
        let Some(name) = template
            .trim()
            .strip_prefix("{{")
            .and_then(|t| t.strip_suffix("}}"))
        else {
            return false;
        };
        let field = name.trim().strip_prefix("wake.");
        let wake = self.wake.as_ref();
        match (field, wake) {
            (Some(f), Some(w)) => !name.contains('}') && w.get(f).is_some_and(Value::is_null),
            _ => false,
        }
    }

    /// Replaces every known `{{name}}`; anything else is kept verbatim.
    fn fill(&self, template: &str) -> String {
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        while let Some(open) = rest.find("{{") {
            out.push_str(&rest[..open]);
            let after = &rest[open + 2..];
            match after.find("}}") {
                Some(close) => {
                    let name = after[..close].trim();
                    match self.lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => out.push_str(&rest[open..open + 2 + close + 2]),
                    }
                    rest = &after[close + 2..];
                }
                None => {
                    out.push_str(&rest[open..]);
                    rest = "";
                }
            }
        }
        out.push_str(rest);
        out
    }

    fn fill_value(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.fill(s)),
            Value::Array(a) => Value::Array(a.iter().map(|v| self.fill_value(v)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .filter(|(_, v)| {
                        !v.as_str()
                            .is_some_and(|s| self.names_only_an_empty_field(s))
                    })
                    .map(|(k, v)| (k.clone(), self.fill_value(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// The first JSON object inside the first ```` ```wake ```` fenced block.
fn wake_object(text: &str) -> Option<Map<String, Value>> {
    let start = text.find("```wake")?;
    let body = &text[start + "```wake".len()..];
    let body = &body[body.find('\n')? + 1..];
    let body = &body[..body.find("```").unwrap_or(body.len())];
    let mut from = 0;
    while let Some(brace) = body[from..].find('{') {
        let at = from + brace;
        let mut stream = serde_json::Deserializer::from_str(&body[at..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(o))) = stream.next() {
            return Some(o);
        }
        from = at + 1;
    }
    None
}

crewlet_plugin_sdk::provider::export_provider!(Plugin);
