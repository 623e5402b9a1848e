//! The turn engine at its ports: the coordination twin (`MemoryKv` on a
//! `ManualClock`, behind `Faulty`), a scripted brain, a recording chat
//! toolbox, a recording event sink, in-memory sessions and a clock the
//! tests move.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use crewlet_bus::{ReplyTo, Wake};
use crewlet_company::{Active, Company};
use crewlet_coord::bucket::Retentions;
use crewlet_coord::kv::{Entry, Expect, KvResult, Unavailable, Watch, WriteResult};
use crewlet_coord::{Bucket, Coord, CoordOptions, Faulty, Kv, ManualClock, MemoryKv, Owner};
use crewlet_turns::{
    Act, Clock, EventSink, Limits, Ports, Said, ServerInfo, SessionError, Sessions, ToolDef,
    ToolOutput, Toolbox, Turn, TurnEnd, TurnEngine, TurnEvent, Unpublished,
};
use futures::future::BoxFuture;
use serde_json::{Value, json};

pub use crate::script::{ScriptedBrain, Step, leave_thread, list_tools, post, review, submit};

/// 2026-01-01T00:00:00Z, a Thursday.
pub const NEW_YEAR: u64 = 1_767_225_600;

/// The company the tests run under; one seat, `ada`, of role `dev`.
pub struct Doc {
    pub timezone: &'static str,
    pub max_iterations: u32,
    pub max_tool_rounds: u32,
    pub seat_day_cap: Option<u64>,
    /// `[budgets] announce_park`.
    pub announce_park: bool,
    /// How long the turn's own chat calls may take (`Limits::surface_timeout`).
    pub surface_timeout: Duration,
    /// How long the turn-start prefetch may take (`Limits::prefetch_timeout`).
    pub prefetch_timeout: Duration,
}

impl Default for Doc {
    fn default() -> Doc {
        Doc {
            timezone: "UTC",
            max_iterations: 3,
            max_tool_rounds: 4,
            seat_day_cap: None,
            announce_park: false,
            surface_timeout: Limits::default().surface_timeout,
            prefetch_timeout: Limits::default().prefetch_timeout,
        }
    }
}

impl Doc {
    fn company(&self) -> Company {
        let budget = self
            .seat_day_cap
            .map(|d| format!("[roles.dev.budget]\nday = {d}\n"))
            .unwrap_or_default();
        let budgets = if self.announce_park {
            "[budgets]\nannounce_park = true\n"
        } else {
            ""
        };
        let text = format!(
            r#"
[org]
name = "Acme"
timezone = "{}"
[roles.dev]
system_prompt = "You write code."
executor = [{{ provider = "scripted", model = "exec" }}]
reviewer = {{ provider = "scripted", model = "rev" }}
max_iterations = {}
max_tool_rounds = {}
[roles.dev.mcp.chat]
command = "chat"
replies = ["post_message"]
{budget}
{budgets}
[seats]
ada = {{ role = "dev" }}
"#,
            self.timezone, self.max_iterations, self.max_tool_rounds
        );
        Company::parse(&text).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// A mention of `@ada` in Slack thread `C1#17.1`: owes a reply there.
pub fn mention(delivery: &str) -> Wake {
    Wake {
        trace_id: format!("trace-{delivery}"),
        delivery_id: delivery.into(),
        source: "slack".into(),
        event_type: "app_mention".into(),
        handle: "ada".into(),
        seat_id: "seat-ada".into(),
        reason: "mention".into(),
        text: Some("@ada is the build green?".into()),
        conversation: Some("C1#17.1".into()),
        channel: Some("C1".into()),
        thread: Some("17.1".into()),
        owed: Some(ReplyTo {
            channel: "C1".into(),
            thread: Some("17.1".into()),
        }),
        sender: None,
    }
}

/// An issue assigned to `@ada`: owes the work, not a message.
pub fn assignment(delivery: &str) -> Wake {
    Wake {
        source: "github".into(),
        event_type: "issues.assigned".into(),
        reason: "assignee".into(),
        conversation: None,
        channel: Some("acme/app".into()),
        thread: Some("7".into()),
        owed: None,
        ..mention(delivery)
    }
}

/// The seat's one MCP server, `chat`: records every call; can refuse posts,
/// dedupe them by `idempotency_key`, and hang mid-post (a crash, when the
/// test drops the turn).
#[derive(Default)]
pub struct Chat {
    pub calls: Mutex<Vec<(String, Value)>>,
    /// How many of the next posts answer as the tool's own refusal.
    pub refuse_posts: AtomicUsize,
    /// `post_message` declares `idempotency_key`, and a key used before
    /// posts nothing.
    pub idempotent: AtomicBool,
    /// How many of the next posts never answer; `land_then_hang` says
    /// whether they landed first.
    pub hang_posts: AtomicUsize,
    pub land_then_hang: AtomicBool,
    /// The posts that landed (a deduped one once).
    pub landed: Mutex<Vec<Value>>,
    /// `read_thread`'s answer (`"ok"` when unset).
    pub thread: Mutex<Option<Value>>,
    /// `read_thread` answers as the tool's own refusal.
    pub refuse_reads: AtomicBool,
    /// `read_thread` never answers.
    pub hang_reads: AtomicBool,
    /// The server offers `raise_working` and `clear_working`.
    pub working: AtomicBool,
}

impl Chat {
    pub fn posts(&self) -> Vec<Value> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(t, _)| t == "post_message")
            .map(|(_, a)| a.clone())
            .collect()
    }
}

impl Toolbox for Chat {
    fn servers(&self) -> Vec<ServerInfo> {
        vec![ServerInfo {
            name: "chat".into(),
            about: Some("the team chat".into()),
            tools: Some(2),
            failed: None,
        }]
    }

    fn tools(&self, server: &str) -> Result<Vec<ToolDef>, String> {
        if server != "chat" {
            return Err(format!("no server {server:?}"));
        }
        let working: &[&str] = if self.working.load(Ordering::SeqCst) {
            &["raise_working", "clear_working"]
        } else {
            &[]
        };
        Ok(["post_message", "read_thread"]
            .iter()
            .chain(working)
            .copied()
            .map(|name| ToolDef {
                name: name.into(),
                description: format!("{name} in a channel"),
                parameters: if name == "post_message" && self.idempotent.load(Ordering::SeqCst) {
                    json!({"type": "object", "properties": {"idempotency_key": {"type": "string"}}})
                } else {
                    json!({"type": "object"})
                },
            })
            .collect())
    }

    async fn call(
        &self,
        _server: &str,
        tool: &str,
        args: Value,
        _turn_id: &str,
    ) -> Result<ToolOutput, String> {
        self.calls
            .lock()
            .unwrap()
            .push((tool.to_owned(), args.clone()));
        let take = |n: &AtomicUsize| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        if tool == "read_thread" {
            if self.hang_reads.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let refused = self.refuse_reads.load(Ordering::SeqCst);
            let thread = self.thread.lock().unwrap().clone();
            return Ok(ToolOutput {
                text: match (refused, thread) {
                    (true, _) => "channel_not_found".to_owned(),
                    (false, Some(t)) => t.to_string(),
                    (false, None) => "ok".to_owned(),
                },
                is_error: refused,
            });
        }
        let refused = tool == "post_message" && take(&self.refuse_posts);
        if tool == "post_message" && !refused {
            let hang = take(&self.hang_posts);
            if !hang || self.land_then_hang.load(Ordering::SeqCst) {
                let mut landed = self.landed.lock().unwrap();
                let key = args
                    .get("idempotency_key")
                    .filter(|_| self.idempotent.load(Ordering::SeqCst));
                let seen =
                    key.is_some_and(|k| landed.iter().any(|p| p.get("idempotency_key") == Some(k)));
                if !seen {
                    landed.push(args);
                }
            }
            if hang {
                std::future::pending::<()>().await;
            }
        }
        Ok(ToolOutput {
            text: if refused { "channel_not_found" } else { "ok" }.into(),
            is_error: refused,
        })
    }
    fn call_detached(&self, _server: &str, tool: &str, args: Value, _turn_id: &str) {
        self.calls.lock().unwrap().push((tool.to_owned(), args));
    }
}

/// Keeps every event it is handed, in order.
#[derive(Default)]
pub struct Recorder(Mutex<Vec<TurnEvent>>);

impl EventSink for Recorder {
    fn publish(&self, event: TurnEvent) -> BoxFuture<'_, Result<(), Unpublished>> {
        self.0.lock().unwrap().push(event);
        Box::pin(async { Ok(()) })
    }
}

/// Sessions in memory: (seat, conversation) → what was said.
#[derive(Default)]
pub struct Memory(pub Mutex<HashMap<(String, String), Vec<Said>>>);

impl Sessions for Memory {
    fn said(&self, seat: &str, conversation: &str) -> Result<Vec<Said>, SessionError> {
        let key = (seat.to_owned(), conversation.to_owned());
        Ok(self
            .0
            .lock()
            .unwrap()
            .get(&key)
            .cloned()
            .unwrap_or_default())
    }

    fn remember(
        &self,
        seat: &str,
        conversation: &str,
        said: &[Said],
        _at_ms: i64,
    ) -> Result<(), SessionError> {
        let key = (seat.to_owned(), conversation.to_owned());
        self.0
            .lock()
            .unwrap()
            .entry(key)
            .or_default()
            .extend_from_slice(said);
        Ok(())
    }
}

/// The engine's clock: the coordination twin's, so both see one instant.
pub struct Calendar(pub ManualClock);

impl Clock for Calendar {
    fn now(&self) -> SystemTime {
        crewlet_coord::Clock::now(&self.0)
    }
}

/// `Faulty` cannot fail reads of one bucket only: this wrapper makes the
/// completion ledger's reads answer unknown while the budgets still read.
pub struct BlindLedger {
    inner: Arc<Faulty>,
    pub blind: AtomicBool,
}

impl Kv for BlindLedger {
    fn get<'a>(&'a self, bucket: Bucket, key: &'a str) -> BoxFuture<'a, KvResult<Option<Entry>>> {
        if bucket == Bucket::Ledger && self.blind.load(Ordering::SeqCst) {
            return Box::pin(async { Err(Unavailable("the ledger is unreadable".into())) });
        }
        self.inner.get(bucket, key)
    }
    fn put<'a>(&'a self, b: Bucket, k: &'a str, v: Bytes, e: Expect) -> BoxFuture<'a, WriteResult> {
        self.inner.put(b, k, v, e)
    }
    fn remove<'a>(&'a self, b: Bucket, k: &'a str, e: Expect) -> BoxFuture<'a, WriteResult> {
        self.inner.remove(b, k, e)
    }
    fn purge_through<'a>(&'a self, b: Bucket, k: &'a str, r: u64) -> BoxFuture<'a, KvResult<()>> {
        self.inner.purge_through(b, k, r)
    }
    fn list<'a>(&'a self, b: Bucket, f: Option<&'a str>) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        self.inner.list(b, f)
    }
    fn markers<'a>(&'a self, b: Bucket, t: SystemTime) -> BoxFuture<'a, KvResult<Vec<Entry>>> {
        self.inner.markers(b, t)
    }
    fn watch<'a>(&'a self, b: Bucket, f: Option<&'a str>) -> BoxFuture<'a, KvResult<Watch>> {
        self.inner.watch(b, f)
    }
    fn age(&self, b: Bucket) -> Option<Duration> {
        self.inner.age(b)
    }
    fn now(&self) -> SystemTime {
        self.inner.now()
    }
    fn broker_now<'a>(&'a self, b: Bucket) -> BoxFuture<'a, KvResult<SystemTime>> {
        self.inner.broker_now(b)
    }
}

/// One engine over the twin, with its ports' far sides in reach.
pub struct Fixture {
    pub clock: ManualClock,
    pub faulty: Arc<Faulty>,
    pub ledger: Arc<BlindLedger>,
    pub coord: Coord,
    pub brain: Arc<ScriptedBrain>,
    pub chat: Chat,
    pub events: Arc<Recorder>,
    pub sessions: Arc<Memory>,
    pub active: Active,
    pub engine: TurnEngine<ScriptedBrain>,
}

impl Fixture {
    pub fn new(doc: Doc) -> Fixture {
        Fixture::at(doc, SystemTime::UNIX_EPOCH + Duration::from_secs(NEW_YEAR))
    }

    pub fn at(doc: Doc, start: SystemTime) -> Fixture {
        let clock = ManualClock::at(start);
        let opts = CoordOptions::new(Owner::incarnation("node-a"));
        let retentions = Retentions {
            lease_ttl: opts.lease_ttl,
            status: opts.status_age,
            rate: opts.rate_age,
        };
        let faulty = Faulty::new(Arc::new(MemoryKv::new(
            Arc::new(clock.clone()),
            &retentions,
        )));
        let ledger = Arc::new(BlindLedger {
            inner: faulty.clone(),
            blind: AtomicBool::new(false),
        });
        let kv: Arc<dyn Kv> = ledger.clone();
        let coord = Coord::with_backends(kv.clone(), kv, opts);
        let brain = Arc::new(ScriptedBrain::default());
        let events = Arc::new(Recorder::default());
        let sessions = Arc::new(Memory::default());
        let ports = Ports {
            events: events.clone(),
            sessions: sessions.clone(),
            clock: Arc::new(Calendar(clock.clone())),
        };
        let limits = Limits {
            surface_timeout: doc.surface_timeout,
            prefetch_timeout: doc.prefetch_timeout,
            ..Limits::default()
        };
        let engine = TurnEngine::new(
            brain.clone(),
            coord.budgets(),
            coord.ledger(),
            coord.follows(),
            ports,
            limits,
        );
        Fixture {
            clock,
            faulty,
            ledger,
            coord,
            brain,
            chat: Chat::default(),
            events,
            sessions,
            active: Active::local(doc.company()),
            engine,
        }
    }

    pub fn script(&self, steps: impl IntoIterator<Item = Step>) {
        self.brain.steps.lock().unwrap().extend(steps);
    }

    pub async fn run(&self, wakes: &[Wake]) -> TurnEnd {
        self.run_fenced(wakes, &|| Act::Go).await
    }

    /// Runs a turn that must hang in a tool call, and drops it there: what a
    /// node killed mid-call leaves behind.
    pub async fn crash(&self, wakes: &[Wake]) {
        let run = self.run(wakes);
        if let Ok(end) = tokio::time::timeout(Duration::from_millis(300), run).await {
            panic!("the turn was meant to hang in a tool call, but ended: {end:?}");
        }
    }

    pub async fn run_fenced(
        &self,
        wakes: &[Wake],
        may_act: &(dyn Fn() -> Act + Send + Sync),
    ) -> TurnEnd {
        let seat = self.active.company.seat("ada").expect("ada");
        self.engine
            .run(Turn {
                seat,
                active: &self.active,
                wakes,
                tools: &self.chat,
                may_act,
            })
            .await
    }

    /// Every event published so far, in order (drains the writer first;
    /// later events are published inline).
    pub async fn events(&self) -> Vec<TurnEvent> {
        self.engine.close().await;
        self.events.0.lock().unwrap().clone()
    }

    pub async fn kinds(&self) -> Vec<&'static str> {
        self.events().await.iter().map(|e| e.kind).collect()
    }

    pub async fn of_kind(&self, kind: &str) -> Vec<Value> {
        let events = self.events().await;
        events
            .into_iter()
            .filter(|e| e.kind == kind)
            .map(|e| e.payload)
            .collect()
    }
}

/// The outcome of a turn that ended; panics on anything else.
pub fn outcome(end: &TurnEnd) -> &crewlet_turns::Outcome {
    match end {
        TurnEnd::Ended { outcome, .. } => outcome,
        other => panic!("the turn did not end: {other:?}"),
    }
}
