//! What the models read: the executor's system prompt, the reviewer's
//! record of a round, and the engine's feedback between rounds.
//!
//! Rule: the reviewer judges the record of what actually ran (each call,
//! its arguments and answer, clipped), never the worker's own account
//! alone. Text an executor writes instead of a tool call is seen by nobody,
//! and every feedback line says what to do next.

use serde_json::Value;
use tracing::warn;

use super::{Brain, Run};
use crate::builtins::{self, SubmitWork};
use crate::ports::{Msg, Speaker, Thought, Toolbox};
use crate::trigger;

pub(super) const UNSUBMITTED: &str = "You ended the round with text and no submit_work. Text is not seen by anyone: post what is owed with your tools, then call submit_work.";

pub(super) const ANSWER_WITH_REVIEW: &str = "Answer with submit_review.";

pub(super) const ONLY_REVIEW: &str = "Only submit_review is available to you.";

pub(super) fn rounds_used(max_tool_rounds: u32) -> String {
    format!(
        "You used all {max_tool_rounds} tool rounds of this iteration without submit_work. Finish: post what is owed, then submit."
    )
}

pub(super) fn another_round(feedback: &str) -> String {
    format!("The review asks for another round: {feedback}")
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    fn owed_label(&self) -> String {
        self.unanswered()
            .or(self.owed.as_ref())
            .map(|t| t.to_string())
            .unwrap_or_default()
    }

    pub(super) fn overturned(&self) -> String {
        format!(
            "The review said done, but someone is waiting for your reply in {} and nothing was posted there. Post the reply with your reply tool, then submit.",
            self.owed_label()
        )
    }

    pub(super) fn delivery_refused(&self) -> String {
        format!(
            "Refused: you claim delivery, but nothing was posted to {} in this turn. Post the reply with your reply tool first, or submit blocked / no_action with the reason.",
            self.owed_label()
        )
    }

    pub(super) fn executor_prompt(&self) -> String {
        let mut p = format!(
            "{}\n\nYou are @{}, {} at {}. Work on the trigger with your tools, then call submit_work exactly once.\n",
            self.role.system_prompt, self.handle, self.role.name, self.company.org
        );
        let servers = self.tools.servers();
        if servers.is_empty() {
            p.push_str("You have no MCP servers.\n");
        } else {
            p.push_str("Your MCP servers (list_mcp_server_tools shows a server's tools; activate_tool makes one callable as SERVER__TOOL):\n");
            for s in servers {
                match (&s.failed, s.tools) {
                    (Some(why), _) => p.push_str(&format!("- {} (unavailable: {why})\n", s.name)),
                    (None, n) => p.push_str(&format!(
                        "- {}{}{}\n",
                        s.name,
                        n.map(|n| format!(" ({n} tools)")).unwrap_or_default(),
                        s.about.map(|a| format!(": {a}")).unwrap_or_default()
                    )),
                }
            }
        }
        if let Some(owed) = &self.owed {
            let tools: Vec<String> = self
                .reply_tools()
                .iter()
                .map(|(s, t)| builtins::offered_name(s, t))
                .collect();
            p.push_str(&format!(
                "Someone is waiting for your reply in {owed}. Post it with {} (channel {:?}{}). A reply you only write as text is never seen.\n",
                if tools.is_empty() { "a reply tool".to_owned() } else { tools.join(" or ") },
                owed.channel,
                owed.thread.as_ref().map(|t| format!(", thread {t:?}")).unwrap_or_default()
            ));
        }
        let answered = self.answered_targets();
        if !answered.is_empty() {
            p.push_str(&format!(
                "Already answered, by an earlier run of this work (do not answer there again): {}.\n",
                answered.join(", ")
            ));
        }
        if let Some(conv) = &self.conversation {
            match self.engine.sessions.said(&self.handle, conv) {
                Ok(said) if !said.is_empty() => {
                    p.push_str("What you already said in this conversation (oldest first):\n");
                    for s in &said {
                        p.push_str(&format!("- {}\n", s.text));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(subsystem = "turns", error = %e, "cannot read the conversation session")
                }
            }
        }
        if let Some(thread) = self.thread_prompt() {
            p.push_str(&thread);
        }
        p.push_str(&self.prefetched);
        p
    }

    /// The reviewer's opening: who it judges, and the record since `from`.
    pub(super) fn review_brief(&self, work: &SubmitWork, from: usize) -> Vec<Msg> {
        vec![
            Msg::system(format!(
                "You review one round of work by @{} ({} at {}). Judge it against the record of what actually ran, not against what the worker says. Answer with submit_review: done, iterate (say exactly what to fix) or failed.",
                self.handle, self.role.name, self.company.org
            )),
            Msg::user(format!(
                "{}\nRecord of this round:\n{}\nSubmission: {} — {}",
                trigger::render(&self.wakes),
                self.render_record(from),
                serde_json::to_string(&work.outcome).unwrap_or_default(),
                work.summary
            )),
        ]
    }

    fn render_record(&self, from: usize) -> String {
        let clip = self.engine.limits.record_clip;
        let mut s = String::new();
        for r in &self.record[from..] {
            s.push_str(&format!(
                "- {}({}) → {}: {}\n",
                r.name,
                clipped(&r.arguments, clip),
                if r.ok { "ok" } else { "error" },
                clipped(&r.answer, clip)
            ));
        }
        if s.is_empty() {
            s.push_str("(no tool ran)\n");
        }
        s
    }
}

/// A server's tools as `list_mcp_server_tools` answers them.
pub(super) fn tool_list(server: &str, tools: &[crate::ports::ToolDef]) -> String {
    let list: Vec<Value> = tools
        .iter()
        .map(|t| serde_json::json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
        .collect();
    serde_json::json!({"server": server, "tools": list, "hint": "activate_tool makes one callable as SERVER__TOOL"})
        .to_string()
}

pub(super) fn assistant(t: &Thought) -> Msg {
    Msg {
        speaker: Speaker::Assistant,
        content: t.text.clone().unwrap_or_default(),
        calls: t.calls.clone(),
        call_id: None,
    }
}

pub(super) fn clipped(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// What a parked seat says to the person owed a reply, when its company
/// opted in (`[budgets] announce_park`).
pub(super) fn out_of_budget(reason: &str) -> String {
    format!("I am out of token budget ({reason}); I will pick this up then.")
}
