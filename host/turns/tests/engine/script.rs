//! The model's side of the brain port: a script of answers, in order, and
//! a record of every request.

use std::collections::VecDeque;
use std::sync::Mutex;

use crewlet_company::ModelRef;
use crewlet_turns::{Brain, Call, CallSite, Phase, Prompt, Thought, Unavailable};
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// One scripted model answer.
pub struct Step {
    text: Option<String>,
    calls: Vec<Call>,
    input: u64,
    output: u64,
    before: Option<Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>>,
    /// The brain answers that a model key is not known yet.
    key_unknown: bool,
}

impl Step {
    pub fn calls(calls: Vec<Call>) -> Step {
        Step {
            text: None,
            calls,
            input: 10,
            output: 2,
            before: None,
            key_unknown: false,
        }
    }

    /// No thought: the model's key is not known yet on this node.
    pub fn key_unknown() -> Step {
        Step {
            key_unknown: true,
            ..Step::calls(Vec::new())
        }
    }

    pub fn text(text: &str) -> Step {
        Step {
            text: Some(text.into()),
            ..Step::calls(Vec::new())
        }
    }

    pub fn cost(self, input: u64, output: u64) -> Step {
        Step {
            input,
            output,
            ..self
        }
    }

    /// Runs `f` when the model is asked, before it answers.
    pub fn before<F>(self, f: impl FnOnce() -> F + Send + 'static) -> Step
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        Step {
            before: Some(Box::new(move || Box::pin(f()))),
            ..self
        }
    }
}

fn call(name: &str, args: Value) -> Call {
    Call {
        id: format!("id-{name}"),
        name: name.into(),
        arguments: args.to_string(),
    }
}

pub fn post(channel: &str, thread: &str, text: &str) -> Call {
    call(
        "chat__post_message",
        json!({"channel": channel, "thread": thread, "text": text}),
    )
}

pub fn leave_thread(args: Value) -> Call {
    call("leave_thread", args)
}

pub fn submit(outcome: &str, summary: &str) -> Call {
    call(
        "submit_work",
        json!({"outcome": outcome, "summary": summary}),
    )
}

pub fn review(verdict: &str, feedback: &str) -> Call {
    call(
        "submit_review",
        json!({"verdict": verdict, "feedback": feedback}),
    )
}

pub fn list_tools() -> Call {
    call("list_mcp_server_tools", json!({"server": "chat"}))
}

/// What the brain was asked.
#[derive(Clone)]
pub struct Asked {
    pub phase: Phase,
    pub iteration: u32,
    pub model: String,
    pub prompt: Prompt,
}

impl Asked {
    /// The last message of the prompt (what the engine said last).
    pub fn last(&self) -> &str {
        &self.prompt.messages.last().expect("a message").content
    }
}

/// Answers from a script, in order; records every request.
#[derive(Default)]
pub struct ScriptedBrain {
    pub(crate) steps: Mutex<VecDeque<Step>>,
    asked: Mutex<Vec<Asked>>,
}

impl ScriptedBrain {
    /// Every request so far, oldest first (a copy).
    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }

    pub fn phases(&self) -> Vec<Phase> {
        self.asked().iter().map(|a| a.phase).collect()
    }

    pub fn unused(&self) -> usize {
        self.steps.lock().unwrap().len()
    }
}

impl Brain for ScriptedBrain {
    async fn think(
        &self,
        chain: &[ModelRef],
        prompt: Prompt,
        site: &CallSite,
    ) -> Result<Thought, Unavailable> {
        self.asked.lock().unwrap().push(Asked {
            phase: site.phase,
            iteration: site.iteration,
            model: chain[0].model.clone(),
            prompt,
        });
        let step = self.steps.lock().unwrap().pop_front();
        let Some(mut step) = step else {
            return Err(Unavailable::Chain("the script ran out".into()));
        };
        if let Some(before) = step.before.take() {
            before().await;
        }
        if step.key_unknown {
            return Err(Unavailable::KeyUnknown(
                "the secrets bucket has not answered this node yet".into(),
            ));
        }
        Ok(Thought {
            text: step.text,
            calls: step.calls,
            input_tokens: step.input,
            output_tokens: step.output,
            model: format!("scripted/{}", chain[0].model),
            slot: Some(format!("scripted/{}#keyless", chain[0].model)),
        })
    }
}
