//! Running the calls the executor asks for: the builtins, the seat's MCP
//! tools as `SERVER__TOOL`, and reply tools through the reply key
//! ([`super::reply`]).
//!
//! Rules, and why:
//! - A `submit_work` claiming delivery while the reply it owes is unposted
//!   is refused at decode time, without a review call: one tool call fixes
//!   it, and a model's word is not delivery.
//! - Only what the executor activated is offered (reply tools are activated
//!   for it); every call — refused, failed or run — is in the turn's record
//!   the reviewer reads, and is a `tool_call` event.
//! - A failed call says why three times: to the model (its answer names the
//!   tool and the reason, or that the tool gave none: a bare
//!   `channel_not_found` does not read as a failure), in its `tool_call`
//!   event (`error`, clipped like the record) and in the log (WARN for a
//!   tool server's failure, INFO for the engine refusing the model's call).
//!   Why: a reply that failed once went unexplained everywhere but the
//!   reviewer's record.

use std::time::Instant;

use serde_json::{Value, json};
use tracing::{info, warn};

use super::prompts;
use super::{Brain, Ran, Run, Stop};
use crate::builtins::{self, Claimed, SubmitWork};
use crate::ports::{Call, ToolDef, Toolbox};
use crate::trigger::Target;

/// What a call answered, for the model and for the record.
pub(super) struct Answered {
    pub(super) text: String,
    pub(super) ok: bool,
    /// A reply tool posted (or had already posted) to this target.
    pub(super) posted_to: Option<Target>,
}

impl Answered {
    pub(super) fn ok(text: impl Into<String>) -> Answered {
        Answered {
            text: text.into(),
            ok: true,
            posted_to: None,
        }
    }

    pub(super) fn error(text: impl Into<String>) -> Answered {
        Answered {
            ok: false,
            ..Answered::ok(text)
        }
    }

    /// A tool server's failure, as the model reads it: the tool as offered
    /// and its reason.
    fn of_tool(self, offered: &str) -> Answered {
        if self.ok {
            return self;
        }
        let reason = self.text.trim();
        Answered {
            text: if reason.is_empty() {
                format!("{offered} failed and gave no reason.")
            } else {
                format!("{offered} failed: {reason}")
            },
            ..self
        }
    }
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Runs one call the executor asked for; answers what the model reads
    /// back, and the submission when the call was an accepted one.
    pub(super) async fn dispatch(
        &mut self,
        call: &Call,
    ) -> Result<(String, Option<SubmitWork>), Stop> {
        let started = Instant::now();
        let mut submitted = None;
        let answered = match call.name.as_str() {
            builtins::SUBMIT_WORK => {
                match builtins::decode::<SubmitWork>(&call.name, &call.arguments) {
                    Err(e) => Answered::error(e),
                    Ok(work) if work.outcome == Claimed::Delivered && self.owed_unanswered() => {
                        Answered::error(self.delivery_refused())
                    }
                    Ok(work) => {
                        submitted = Some(work);
                        Answered::ok("Submitted for review.")
                    }
                }
            }
            builtins::LIST_TOOLS => {
                match builtins::decode::<builtins::ServerArg>(&call.name, &call.arguments)
                    .map_err(String::from)
                    .and_then(|a| self.tools.tools(&a.server).map(|t| (a.server, t)))
                {
                    Ok((server, tools)) => Answered::ok(prompts::tool_list(&server, &tools)),
                    Err(e) => Answered::error(e),
                }
            }
            builtins::ACTIVATE => {
                match builtins::decode::<builtins::ToolArg>(&call.name, &call.arguments)
                    .map_err(String::from)
                    .and_then(|a| self.activate(&a.server, &a.tool))
                {
                    Ok(name) => Answered::ok(format!("{name} is now callable.")),
                    Err(e) => Answered::error(e),
                }
            }
            builtins::LEAVE_THREAD => self.leave_thread(&call.arguments).await,
            builtins::REMEMBER if self.engine.recall.is_some() => {
                self.remember_note(&call.arguments).await
            }
            builtins::RECALL if self.engine.recall.is_some() => {
                self.recall_notes(&call.arguments).await
            }
            name => match builtins::split_offered(name) {
                Some((server, tool)) => self
                    .call_mcp(server, tool, &call.arguments)
                    .await?
                    .of_tool(name),
                None => Answered::error(format!(
                    "There is no tool {name:?}. Your MCP servers' tools are called as SERVER__TOOL after activate_tool."
                )),
            },
        };
        // The call's time ends with its answer: building its event is not
        // part of it.
        let took = started.elapsed();
        let clip = self.engine.limits.record_clip;
        // What the call was asked and answered, clipped like the turn's
        // record, so a turn's timeline shows each step without its bulk.
        let mut event = json!({"turn_id": self.turn_id, "tool": call.name, "ok": answered.ok, "ms": took.as_millis() as u64, "us": took.as_micros() as u64, "arguments": prompts::clipped(&call.arguments, clip)});
        if answered.ok {
            event["result"] = json!(prompts::clipped(&answered.text, clip));
        } else {
            let error = prompts::clipped(&answered.text, clip);
            if builtins::split_offered(&call.name).is_some() {
                warn!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, tool = %call.name, %error, "a tool call failed; the model is told why");
            } else {
                info!(subsystem = "turns", seat = %self.handle, turn_id = %self.turn_id, tool = %call.name, %error, "a call the model made was refused; it is told why");
            }
            event["error"] = json!(error);
        }
        self.emit("tool_call", event).await;
        self.record.push(Ran {
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            ok: answered.ok,
            answer: answered.text.clone(),
            posted_to: answered.posted_to,
        });
        Ok((answered.text, submitted))
    }

    fn activate(&mut self, server: &str, tool: &str) -> Result<String, String> {
        let tools = self.tools.tools(server)?;
        if !tools.iter().any(|t| t.name == tool) {
            return Err(format!(
                "{server} has no tool {tool:?}; list_mcp_server_tools shows what it has"
            ));
        }
        self.activated.insert((server.to_owned(), tool.to_owned()));
        Ok(builtins::offered_name(server, tool))
    }

    /// Calls an MCP tool; a reply tool goes through the reply key.
    async fn call_mcp(
        &mut self,
        server: &str,
        tool: &str,
        arguments: &str,
    ) -> Result<Answered, Stop> {
        let args: Value = match builtins::decode(tool, arguments) {
            Ok(v) => v,
            Err(e) => return Ok(Answered::error(e)),
        };
        let is_reply = self
            .role
            .mcp
            .get(server)
            .is_some_and(|s| s.replies.iter().any(|r| r == tool));
        if is_reply {
            // Boxed: a reply's future is large, and every other call would
            // carry it.
            return Box::pin(self.post_reply(server, tool, args)).await;
        }
        Ok(
            match self.tools.call(server, tool, args, &self.turn_id).await {
                Ok(out) if out.is_error => Answered::error(out.text),
                Ok(out) => Answered::ok(out.text),
                Err(e) => Answered::error(format!("the tool could not be reached: {e}")),
            },
        )
    }

    /// The role's reply tools, as (server, tool).
    pub(super) fn reply_tools(&self) -> Vec<(String, String)> {
        self.role
            .mcp
            .iter()
            .flat_map(|(server, s)| s.replies.iter().map(move |t| (server.clone(), t.clone())))
            .collect()
    }

    /// The activated MCP tools, offered as `SERVER__TOOL`.
    pub(super) fn activated_defs(&self) -> Vec<ToolDef> {
        let mut out = Vec::new();
        for (server, tool) in &self.activated {
            if let Ok(tools) = self.tools.tools(server)
                && let Some(t) = tools.into_iter().find(|t| &t.name == tool)
            {
                out.push(ToolDef {
                    name: builtins::offered_name(server, tool),
                    ..t
                });
            }
        }
        out
    }
}
