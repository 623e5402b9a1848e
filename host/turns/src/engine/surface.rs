//! The turn's own calls on the seat's chat server: the thread read back
//! before the first model call, and the working indicator while the seat
//! thinks (which tool does each is the server's mapping,
//! `crewlet_company::surface`).
//!
//! Rules, and why:
//! - Through the seat's own [`Toolbox`], never a vendor API: the server
//!   reads and signals with the seat's own credentials.
//! - Bounded: each call waits at most [`Limits::surface_timeout`]; the
//!   read-back keeps the newest [`MAX_THREAD_MESSAGES`] messages and at
//!   most [`MAX_THREAD_BYTES`] of them, and says what it left out. A
//!   thread is context, not a place to spend the budget.
//! - Never fatal: a read-back that fails or times out, or a server that
//!   offers none, leaves the turn to run without it, and the
//!   `thread_read` event says which (`working_indicator` likewise).
//! - The indicator is a guard ([`Working`]): cleared when the turn ends,
//!   whatever the outcome; a turn whose future is dropped (cancelled)
//!   clears it on a task of its own ([`Toolbox::call_detached`]).
//!
//! [`Limits::surface_timeout`]: super::Limits::surface_timeout

use std::collections::BTreeMap;
use std::time::Instant;

use crewlet_bus::Wake;
use crewlet_company::Role;
use crewlet_company::surface::{
    CHANNEL_PLACEHOLDER, CLEAR_WORKING, RAISE_WORKING, READ_THREAD, SurfaceTool, SurfaceTools,
    TEXT_PLACEHOLDER, THREAD_PLACEHOLDER, default_arguments, notice_arguments,
};
use serde_json::{Map, Value, json};
use tracing::{info, warn};

use super::{Brain, Run};
use crate::ports::Toolbox;

/// The newest messages of a thread the executor reads.
pub const MAX_THREAD_MESSAGES: usize = 50;
/// The most of a thread, in bytes, the executor reads.
pub const MAX_THREAD_BYTES: usize = 16 * 1024;

/// One of the turn's own calls, resolved for one wake.
#[derive(Debug, Clone)]
pub(super) struct Mapped {
    server: String,
    tool: String,
    arguments: Value,
}

/// The place a turn's surface calls are about: the first wake that names
/// a channel.
struct Place<'w> {
    source: &'w str,
    channel: &'w str,
    thread: Option<&'w str>,
}

fn place(wakes: &[Wake]) -> Option<Place<'_>> {
    wakes.iter().find_map(|w| {
        Some(Place {
            source: &w.source,
            channel: w.channel.as_deref()?,
            thread: w.thread.as_deref(),
        })
    })
}

/// The first server of `role` (by name) that serves `at.source` and maps
/// `key` to a tool it offers, with the call's arguments filled in.
fn resolve<T: Toolbox>(
    tools: &T,
    role: &Role,
    key: &str,
    pick: fn(&SurfaceTools) -> &SurfaceTool,
    at: &Place<'_>,
) -> Option<Mapped> {
    role.mcp.iter().find_map(|(server, spec)| {
        if !spec.surface.serves(at.source) {
            return None;
        }
        let (tool, template) = match pick(&spec.surface) {
            SurfaceTool::Off => return None,
            SurfaceTool::ByName => (key.to_owned(), default_arguments()),
            SurfaceTool::Tool { tool, arguments } => (tool.clone(), arguments.clone()),
        };
        let def = tools
            .tools(server)
            .ok()?
            .into_iter()
            .find(|t| t.name == tool)?;
        Some(Mapped {
            server: server.clone(),
            arguments: fill(&template, at, &def.parameters),
            tool,
        })
    })
}

/// How the seat posts a notice of the turn's own (`text`) to `target`: the
/// first server of `role` (by name) whose `notice` is mapped to a tool, or
/// left unset on a server with a reply tool (its first); the arguments
/// template filled with the target's channel and thread, then the text
/// (last, so nothing in the text is taken for a placeholder).
pub(super) fn notice_call<T: Toolbox>(
    tools: &T,
    role: &Role,
    target: &crate::trigger::Target,
    text: &str,
) -> Option<(String, String, Value)> {
    role.mcp.iter().find_map(|(server, spec)| {
        let (tool, template) = match &spec.surface.notice {
            SurfaceTool::Off => return None,
            SurfaceTool::ByName => (spec.replies.first()?.clone(), notice_arguments()),
            SurfaceTool::Tool { tool, arguments } => (tool.clone(), arguments.clone()),
        };
        let schema = tools
            .tools(server)
            .ok()
            .and_then(|defs| defs.into_iter().find(|d| d.name == tool))
            .map(|d| d.parameters)
            .unwrap_or(Value::Null);
        let at = Place {
            source: "",
            channel: &target.channel,
            thread: target.thread.as_deref(),
        };
        let mut arguments = fill(&template, &at, &schema);
        if let Value::Object(args) = &mut arguments {
            for value in args.values_mut() {
                if let Value::String(s) = value
                    && s.contains(TEXT_PLACEHOLDER)
                {
                    *s = s.replace(TEXT_PLACEHOLDER, text);
                }
            }
        }
        Some((server.clone(), tool, arguments))
    })
}

/// The arguments template with the wake's channel and thread in it. A
/// value that is only `{thread}` is left out when the wake has no thread;
/// a filled value is a number where the tool's schema asks for one.
fn fill(template: &BTreeMap<String, Value>, at: &Place<'_>, schema: &Value) -> Value {
    let mut out = Map::new();
    for (name, value) in template {
        let Value::String(text) = value else {
            out.insert(name.clone(), value.clone());
            continue;
        };
        if text == THREAD_PLACEHOLDER && at.thread.is_none() {
            continue;
        }
        let text = text
            .replace(CHANNEL_PLACEHOLDER, at.channel)
            .replace(THREAD_PLACEHOLDER, at.thread.unwrap_or_default());
        let numeric = matches!(
            schema["properties"][name]["type"].as_str(),
            Some("integer" | "number")
        );
        let number = numeric
            .then(|| serde_json::from_str::<serde_json::Number>(&text).ok())
            .flatten();
        out.insert(
            name.clone(),
            number.map_or_else(|| Value::String(text), Value::Number),
        );
    }
    Value::Object(out)
}

/// A thread as the executor reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ThreadText {
    /// One line per message, oldest first (or the server's text, clipped).
    pub(super) text: String,
    /// Messages the server answered, when its answer was a list.
    pub(super) messages: Option<usize>,
    /// Of them, those kept.
    pub(super) kept: usize,
    /// Something was left out to stay within the bounds.
    pub(super) cut: bool,
}

/// Cuts a read-back to the newest [`MAX_THREAD_MESSAGES`] and
/// [`MAX_THREAD_BYTES`]. A JSON answer holding a list of messages (the
/// list itself, or an object's `messages` or first list) is read one line
/// per message; any other answer is kept as text, its newest end.
pub(super) fn bound(answer: &str) -> ThreadText {
    let parsed: Option<Value> = serde_json::from_str(answer).ok();
    let list = parsed.as_ref().and_then(|v| match v {
        Value::Array(items) => Some(items),
        Value::Object(fields) => fields
            .get("messages")
            .and_then(Value::as_array)
            .or_else(|| fields.values().find_map(Value::as_array)),
        _ => None,
    });
    let Some(items) = list else {
        let text = newest_bytes(answer.trim(), MAX_THREAD_BYTES);
        return ThreadText {
            cut: text.len() < answer.trim().len(),
            kept: 0,
            messages: None,
            text,
        };
    };
    let mut lines: Vec<String> = items
        .iter()
        .skip(items.len().saturating_sub(MAX_THREAD_MESSAGES))
        .map(line)
        .collect();
    let mut bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    while bytes > MAX_THREAD_BYTES && lines.len() > 1 {
        bytes -= lines.remove(0).len() + 1;
    }
    if bytes > MAX_THREAD_BYTES {
        lines[0] = newest_bytes(&lines[0], MAX_THREAD_BYTES - 1);
    }
    ThreadText {
        cut: lines.len() < items.len() || bytes > MAX_THREAD_BYTES,
        messages: Some(items.len()),
        kept: lines.len(),
        text: lines.join("\n"),
    }
}

/// One message as a line: `author: text` when the fields are found under
/// common names, else its JSON.
fn line(message: &Value) -> String {
    let field = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| message.get(*n).and_then(Value::as_str))
    };
    let author = field(&["as", "author", "user", "username", "login", "name"])
        .or_else(|| message["user"]["login"].as_str());
    match (author, field(&["text", "body", "content", "message"])) {
        (Some(who), Some(text)) => format!("{who}: {}", text.replace('\n', " ")),
        (None, Some(text)) => text.replace('\n', " "),
        _ => message.to_string(),
    }
}

/// The last at most `max` bytes of `s`, cut at a character boundary.
fn newest_bytes(s: &str, max: usize) -> String {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

/// A raised working indicator: cleared by [`Run::clear_working`], or, if
/// the turn is dropped first, on a task of its own.
pub(super) struct Working<'t, T: Toolbox> {
    tools: &'t T,
    clear: Option<Mapped>,
    turn_id: String,
}

impl<T: Toolbox> Drop for Working<'_, T> {
    fn drop(&mut self) {
        if let Some(m) = self.clear.take() {
            info!(subsystem = "turns", turn_id = %self.turn_id, server = %m.server, "the turn was dropped with its working indicator raised; clearing it on its own task");
            self.tools
                .call_detached(&m.server, &m.tool, m.arguments, &self.turn_id);
        }
    }
}

impl<'a, B: Brain, T: Toolbox> Run<'a, B, T> {
    /// Reads the thread the turn was woken in, for the executor's prompt
    /// (answered: the caller keeps it); emits `thread_read` saying what
    /// became of it.
    pub(super) async fn read_back(&self) -> Option<(Mapped, ThreadText)> {
        let at = place(&self.wakes).filter(|p| p.thread.is_some())?;
        let Some(call) = resolve(self.tools, &self.role, READ_THREAD, |s| &s.read_thread, &at)
        else {
            self.not_offered("thread_read", "status", "a read-thread tool", at.source)
                .await;
            return None;
        };
        let started = Instant::now();
        let answered = self.surface_call(&call).await;
        let ms = started.elapsed().as_millis() as u64;
        let mut event =
            json!({"turn_id": self.turn_id, "server": call.server, "tool": call.tool, "ms": ms});
        let thread = match answered {
            Ok(answer) => {
                let read = bound(&answer);
                event["status"] = json!("read");
                event["messages"] = json!(read.messages);
                event["kept"] = json!(read.kept);
                event["bytes"] = json!(read.text.len());
                event["cut"] = json!(read.cut);
                Some((call, read))
            }
            Err((status, error)) => {
                warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, server = %call.server, tool = %call.tool, %error, "the thread could not be read back; the turn runs without it");
                event["status"] = json!(status);
                event["error"] = json!(error);
                None
            }
        };
        self.emit("thread_read", event).await;
        thread
    }

    /// Raises the working indicator where the turn was woken, when a
    /// server offers one; the guard clears it.
    pub(super) async fn raise_working(&self) -> Option<Working<'a, T>> {
        let at = place(&self.wakes)?;
        let pick = |key, which: fn(&SurfaceTools) -> &SurfaceTool| {
            resolve(self.tools, &self.role, key, which, &at)
        };
        let (raise, clear) = (
            pick(RAISE_WORKING, |s| &s.raise_working),
            pick(CLEAR_WORKING, |s| &s.clear_working),
        );
        let Some(raise) = raise else {
            self.not_offered(
                "working_indicator",
                "state",
                "a working indicator",
                at.source,
            )
            .await;
            return None;
        };
        let mut event = json!({"turn_id": self.turn_id, "server": raise.server, "tool": raise.tool, "clears": clear.is_some()});
        match self.surface_call(&raise).await {
            Ok(_) => event["state"] = json!("raised"),
            Err((_, error)) => {
                event["state"] = json!("failed");
                event["error"] = json!(error);
            }
        }
        self.emit("working_indicator", event).await;
        Some(Working {
            tools: self.tools,
            clear,
            turn_id: self.turn_id.clone(),
        })
    }

    /// Clears the indicator [`Run::raise_working`] raised.
    pub(super) async fn clear_working(&self, working: Option<Working<'a, T>>) {
        let Some(call) = working.and_then(|mut w| w.clear.take()) else {
            return;
        };
        let mut event = json!({"turn_id": self.turn_id, "server": call.server, "tool": call.tool});
        match self.surface_call(&call).await {
            Ok(_) => event["state"] = json!("cleared"),
            Err((_, error)) => {
                warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, server = %call.server, %error, "the working indicator could not be cleared");
                event["state"] = json!("failed");
                event["error"] = json!(error);
            }
        }
        self.emit("working_indicator", event).await;
    }

    /// Emits `kind` saying no server offers `what` for wakes of `source`.
    async fn not_offered(&self, kind: &'static str, field: &str, what: &str, source: &str) {
        let reason = format!("no MCP server of the role offers {what} for {source} wakes");
        let mut event = json!({"turn_id": self.turn_id, "reason": reason});
        event[field] = json!("not_offered");
        self.emit(kind, event).await;
    }

    /// One surface call, bounded; an error is (`failed` | `timed_out`,
    /// the reason).
    async fn surface_call(&self, call: &Mapped) -> Result<String, (&'static str, String)> {
        let limit = self.engine.limits.surface_timeout;
        let answer = tokio::time::timeout(
            limit,
            self.tools.call(
                &call.server,
                &call.tool,
                call.arguments.clone(),
                &self.turn_id,
            ),
        )
        .await;
        match answer {
            Err(_) => Err((
                "timed_out",
                format!("{} did not answer within {limit:?}", call.tool),
            )),
            Ok(Err(e)) => Err(("failed", format!("{} failed: {e}", call.tool))),
            Ok(Ok(out)) if out.is_error => Err((
                "failed",
                format!("{} refused: {}", call.tool, out.text.trim()),
            )),
            Ok(Ok(out)) => Ok(out.text),
        }
    }

    /// The read-back as the executor's prompt shows it.
    pub(super) fn thread_prompt(&self) -> Option<String> {
        let (call, read) = self.thread.as_ref()?;
        let left_out = match read.messages {
            Some(n) if n > read.kept => format!("; the {} older messages left out", n - read.kept),
            _ if read.cut => "; its older part left out".to_owned(),
            _ => String::new(),
        };
        Some(if read.text.is_empty() {
            format!(
                "The thread you were woken in, read through {}'s {}, has no messages yet.\n",
                call.server, call.tool
            )
        } else {
            format!(
                "The thread you were woken in, read through {}'s {} (oldest first, at most {MAX_THREAD_MESSAGES} messages and {MAX_THREAD_BYTES} bytes{left_out}):\n{}\n",
                call.server, call.tool, read.text
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_thread_keeps_its_newest_messages_within_both_bounds() {
        let many: Vec<Value> = (0..80)
            .map(|i| json!({"as": "U1", "text": format!("message {i}")}))
            .collect();
        let read = bound(&json!({ "messages": many }).to_string());
        assert_eq!((read.messages, read.kept, read.cut), (Some(80), 50, true));
        assert!(read.text.starts_with("U1: message 30\n"), "{}", read.text);
        assert!(read.text.ends_with("U1: message 79"));

        let big: Vec<Value> = (0..10)
            .map(|i| json!({"user": "ana", "body": format!("{i}{}", "x".repeat(4000))}))
            .collect();
        let read = bound(&Value::Array(big).to_string());
        assert!(read.text.len() <= MAX_THREAD_BYTES, "{}", read.text.len());
        assert_eq!(read.kept, 4, "the newest four fit in 16 KiB");
        assert!(read.text.starts_with("ana: 6x"));

        let plain = "é".repeat(MAX_THREAD_BYTES);
        let read = bound(&plain);
        assert!(read.cut && read.text.len() <= MAX_THREAD_BYTES);
        assert_eq!(read.messages, None);
    }

    #[test]
    fn a_template_takes_the_wakes_place_and_the_tools_types() {
        let at = Place {
            source: "github",
            channel: "acme/app",
            thread: Some("42"),
        };
        let template = BTreeMap::from([
            ("repo".to_owned(), json!("{channel}")),
            ("issue_number".to_owned(), json!("{thread}")),
            ("note".to_owned(), json!("in {channel}#{thread}")),
            ("per_page".to_owned(), json!(50)),
        ]);
        let schema = json!({"properties": {"issue_number": {"type": "integer"}}});
        assert_eq!(
            fill(&template, &at, &schema),
            json!({"repo": "acme/app", "issue_number": 42, "note": "in acme/app#42", "per_page": 50})
        );
        let top = Place { thread: None, ..at };
        assert_eq!(
            fill(&default_arguments(), &top, &json!({})),
            json!({"channel": "acme/app"}),
            "no thread: the argument is left out"
        );
    }
}
