//! What a turn needs from outside the engine, as ports: a [`Brain`] (one
//! model call through a role's chain) and a [`Toolbox`] (the seat's own MCP
//! servers) per seat, and for the whole engine an [`EventSink`] (where the
//! steps of a turn are published), [`Sessions`] (what a seat already said in
//! a conversation) and a [`Clock`] (the wall clock budgets are cut on).
//!
//! Rule: the engine knows nothing of WASM, MCP children, vendors, NATS or
//! SQLite. Why: the turn is the product's heart and is tested at these
//! ports; the node plugs the real ones in. The fleet's records stay in
//! coordination, reached through the two narrow handles the engine is made
//! with (`crewlet_coord::{Budgets, Ledger}`), which have an in-process twin.

use std::future::Future;
use std::time::SystemTime;

use crewlet_company::ModelRef;
use futures::future::BoxFuture;
use serde::Serialize;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Speaker {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool call a model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (JSON text, possibly invalid).
    pub arguments: String,
}

/// One message of a conversation with a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Msg {
    pub speaker: Speaker,
    pub content: String,
    pub calls: Vec<Call>,
    /// For a [`Speaker::Tool`] message: the call it answers.
    pub call_id: Option<String>,
}

impl Msg {
    pub fn system(content: impl Into<String>) -> Msg {
        Msg::plain(Speaker::System, content)
    }

    pub fn user(content: impl Into<String>) -> Msg {
        Msg::plain(Speaker::User, content)
    }

    pub fn tool(call_id: &str, content: impl Into<String>) -> Msg {
        Msg {
            call_id: Some(call_id.to_owned()),
            ..Msg::plain(Speaker::Tool, content)
        }
    }

    fn plain(speaker: Speaker, content: impl Into<String>) -> Msg {
        Msg {
            speaker,
            content: content.into(),
            calls: Vec::new(),
            call_id: None,
        }
    }
}

/// A function the model may ask the engine to call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: serde_json::Value,
}

/// One model request.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub messages: Vec<Msg>,
    pub tools: Vec<ToolDef>,
    /// The answer must be a tool call (the reviewer's one submission tool).
    pub must_call_tool: bool,
    pub max_tokens: u32,
}

/// One model answer.
#[derive(Debug, Clone)]
pub struct Thought {
    pub text: Option<String>,
    pub calls: Vec<Call>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `provider/model` of the model that answered.
    pub model: String,
    /// The provider slot that served the call: the chain's entry and the
    /// pool's key (`provider/model#key-hint`, `#keyless` for an entry
    /// without one); `None` where the brain cannot say.
    pub slot: Option<String>,
}

/// Which stage of a turn a call belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Executor,
    Reviewer,
    /// The learning duty's reflection over a seat's episodes.
    Reflection,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Executor => "executor",
            Phase::Reviewer => "reviewer",
            Phase::Reflection => "reflection",
        }
    }
}

/// Where a model call happens, so a fallback is addressed to the turn, the
/// phase and the iteration that paid for it.
#[derive(Debug, Clone)]
pub struct CallSite {
    pub turn_id: String,
    pub seat: String,
    pub phase: Phase,
    pub iteration: u32,
    pub trace_id: Option<String>,
}

/// Why a model call gave no thought; carries the backend's own (redacted)
/// line.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// The whole chain failed: the turn ends `llm_unavailable`.
    #[error("no model in the chain answered: {0}")]
    Chain(String),
    /// A model's key is not known yet (the secrets store has not answered
    /// this node): our outage, not the models' answer — the turn is not
    /// done and runs again later.
    #[error("a model key is not known yet: {0}")]
    KeyUnknown(String),
}

/// One model call through a chain, with the credential pool and fallbacks
/// behind it. Publishing `provider_fallback` / `llm_unavailable` is the
/// brain's job.
pub trait Brain: Send + Sync + 'static {
    fn think(
        &self,
        chain: &[ModelRef],
        prompt: Prompt,
        site: &CallSite,
    ) -> impl Future<Output = Result<Thought, Unavailable>> + Send;
}

/// An MCP server as the executor sees it: a name and what it is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    pub name: String,
    pub about: Option<String>,
    /// Tools it offers, when it started.
    pub tools: Option<usize>,
    /// Why it did not start.
    pub failed: Option<String>,
}

/// What a tool answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    /// The tool ran and reported a failure (a definite "not done").
    pub is_error: bool,
}

/// The seat's own tools: never another seat's children.
pub trait Toolbox: Send + Sync {
    fn servers(&self) -> Vec<ServerInfo>;
    /// The tools of `server`, names as the server publishes them.
    fn tools(&self, server: &str) -> Result<Vec<ToolDef>, String>;
    /// Calls a tool for turn `turn_id`. `Err` is a failure to reach it
    /// (the call may or may not have run); `Ok` with `is_error` is the
    /// tool's own refusal.
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Value,
        turn_id: &str,
    ) -> impl Future<Output = Result<ToolOutput, String>> + Send;
    /// Calls a tool on a task of its own, for what must happen even when
    /// the turn is dropped (its working indicator's clear); the answer is
    /// only logged. It is called from a `Drop`, so it must not panic
    /// (outside a runtime it logs that it could not run the call).
    fn call_detached(&self, server: &str, tool: &str, arguments: serde_json::Value, turn_id: &str);
}

/// One step of a turn as the engine reports it: what happened (`kind`), for
/// which seat, when on the engine's [`Clock`], and its details.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnEvent {
    pub kind: &'static str,
    pub at_ms: i64,
    pub seat: String,
    pub trace_id: Option<String>,
    pub conversation: Option<String>,
    pub payload: serde_json::Value,
}

/// The sink refused or lost an event; carries its own line.
#[derive(Debug, Clone, thiserror::Error)]
#[error("event not published: {0}")]
pub struct Unpublished(pub String);

/// Where a turn's events go (the node: its log row, then the broadcast).
/// The engine calls it from one writer task, in the order it emitted, so a
/// slow sink delays events, never a model call.
pub trait EventSink: Send + Sync + 'static {
    fn publish(&self, event: TurnEvent) -> BoxFuture<'_, Result<(), Unpublished>>;
}

pub use crewlet_os::Said;

/// A session could not be read or written; carries the store's own line.
#[derive(Debug, Clone, thiserror::Error)]
#[error("conversation session: {0}")]
pub struct SessionError(pub String);

/// What a seat already said in a conversation, kept by this node.
pub trait Sessions: Send + Sync + 'static {
    /// What `seat` said in `conversation`, oldest first; empty when nothing.
    fn said(&self, seat: &str, conversation: &str) -> Result<Vec<Said>, SessionError>;
    /// Records that a turn of `seat` ran in `conversation` and said `said`
    /// (possibly nothing).
    fn remember(
        &self,
        seat: &str,
        conversation: &str,
        said: &[Said],
        at_ms: i64,
    ) -> Result<(), SessionError>;
}

/// The wall clock: budget windows are cut on it when a round is charged,
/// and events and sessions are stamped with it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> SystemTime;

    fn now_ms(&self) -> i64 {
        self.now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Vectors for texts, from the company's embedding model (`[memory]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// `provider/model` the vectors came from: vectors of different models
    /// (or dimensions) are never compared.
    pub model: String,
    /// One vector per input text, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens the provider charged (counted against the seat's budget).
    pub tokens: u64,
}

/// Who an embedding is for: the seat whose budget pays, and the turn (none
/// for a duty's pass, e.g. re-embedding by the learning duty).
#[derive(Debug, Clone)]
pub struct EmbedSite {
    pub seat: String,
    pub turn_id: Option<String>,
}

/// Why there are no vectors. Every case is a first-class state of recall
/// (it falls back to recency), never a failed turn.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    /// The company names no embedding model: recall is by recency.
    #[error("no embedding model is configured (`[memory] embedding`): recall is by recency")]
    Off,
    /// The provider did not answer, is rate-limited or cooling down, or
    /// its key is not known yet; carries the provider's (redacted) line.
    #[error("the embedding provider is unavailable: {0}")]
    Unavailable(String),
    /// The seat's budget window is full: the embedding is refused.
    #[error("the seat's budget refused the embedding: {0}")]
    Refused(String),
    /// The provider answered, but not one vector per text.
    #[error("the embedding provider answered badly: {0}")]
    Malformed(String),
}

/// Embeds texts through the company's embedding model, with the same key
/// pool, cooldowns and budgets as completions.
pub trait Embedder: Send + Sync + 'static {
    /// `provider/model` of the configured embedder; `None` when the company
    /// decided none.
    fn model(&self) -> Option<String>;
    fn embed(
        &self,
        texts: Vec<String>,
        site: &EmbedSite,
    ) -> impl Future<Output = Result<Embedded, EmbedError>> + Send;
}

/// No embedding model: every call answers [`EmbedError::Off`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEmbedder;

impl Embedder for NoEmbedder {
    fn model(&self) -> Option<String> {
        None
    }

    async fn embed(&self, _texts: Vec<String>, _site: &EmbedSite) -> Result<Embedded, EmbedError> {
        Err(EmbedError::Off)
    }
}
