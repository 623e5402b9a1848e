//! `/operator/mcp`: the company's operator catalogue as an MCP server
//! (streamable HTTP, stateless). [`service`] is rmcp's own HTTP service;
//! `crewlet-api` mounts it as a route of the node like any other, so the
//! node's HTTP guard covers it, and the node hands it its parts through
//! [`Engine`] once they are up.
//!
//! Rules, and why:
//! - A message to a seat enters as a trigger like any other: claimed
//!   (`operator:ID`), published on the inbound subject, routed by
//!   notify-inbound and answered through the normal turn. The caller waits
//!   for that turn's `turn_ended` on the event broadcast (subscribed before
//!   the publish, so nothing is missed) and gets the replies it posted. A
//!   wait that runs out is a tool error naming the trace id; the trigger
//!   stands and the seat still answers it.
//! - Unknown is never no: a holder, pause or turn state the node cannot
//!   read is `"unknown"`, never "unowned" or "not paused".
//! - A seat's turns are read from every node's event log (the fleet's
//!   history read, with its coverage): a seat's turns ran wherever it was
//!   held. Whether a seat is in a turn now is read from this node's log
//!   when it holds the seat, and `unknown` otherwise (`GET /agents` asks
//!   the holder).

use std::sync::Arc;
use std::time::Duration;

use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::Answer;
use crewlet_ingress::Edge;
use crewlet_plugins::webhook::{Addressed, Delivery};
use crewlet_store::{EventQuery, EventRecord};
use futures::StreamExt;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;

/// What the catalogue reads and does, once the node's engine is up.
pub struct Parts {
    pub node_id: String,
    /// The node's one NATS connection (the event broadcast is read on it).
    pub client: async_nats::Client,
    /// Who holds each seat, and who this node is among the holders.
    pub survey: crewlet_coord::Survey,
    /// The positions bucket, where a seat's pause record is read.
    pub positions: crewlet_coord::Records,
    /// This node's event log (whether a seat it holds is in a turn).
    pub store: Arc<crewlet_store::Store>,
    /// The node's webhook edge: an operator's message enters through it.
    pub edge: Arc<Edge>,
    pub active: ActiveCompany,
    pub fleet: crewlet_fleet::View,
    pub history: crewlet_history::Reader,
    pub seat_pauses: crewlet_seats::SeatPauses,
}

/// Where the catalogue finds the engine: `None` until it is up.
pub trait Engine: Send + Sync + 'static {
    fn parts(&self) -> Option<Parts>;
    /// Whether the node has begun draining (a waiting message gives up).
    fn draining(&self) -> bool;
}
/// The `source` of an operator's message on the inbound stream.
pub const SOURCE: &str = "operator";
/// How long `send_message` waits when the caller does not say.
const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// The longest wait a caller may ask for.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// How often a waiting `send_message` looks whether the node is draining.
const PHASE_CHECK: Duration = Duration::from_millis(250);

/// Why a tool did not do what it was asked; the text says what to do.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("the node's engine is not up yet; retry in a few seconds")]
    Starting,
    #[error("no company is active on this node; activate one with PUT /config")]
    NoCompany,
    #[error("no seat `{seat}` in the company (it has: {known}); use one of those handles")]
    UnknownSeat { seat: String, known: String },
    #[error("{what} is unknown right now ({why}); retry shortly")]
    Unavailable { what: &'static str, why: String },
    #[error(
        "seat `{seat}` did not finish a turn on message {trace_id} within {waited:?}; the message stands and the seat will still answer it: read its turns later with `seat_turns`"
    )]
    NoAnswer {
        seat: String,
        trace_id: String,
        waited: Duration,
    },
    #[error(
        "this node began draining while waiting for seat `{seat}` on message {trace_id}; the message stands and the seat will still answer it: read its turns later with `seat_turns`"
    )]
    Draining { seat: String, trace_id: String },
    #[error("the message was not accepted: {0}; nothing was delivered, send it again")]
    NotAccepted(String),
    #[error("`{field}`: {message}")]
    BadArgument {
        field: &'static str,
        message: String,
    },
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SeatArg {
    /// The seat's handle, e.g. `ada`.
    pub seat: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SendMessage {
    /// The seat's handle, e.g. `ada`.
    pub seat: String,
    /// What you say to the seat.
    pub text: String,
    /// How long to wait for the seat's turn to end (1 to 600 s; default 60).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SeatTurns {
    /// The seat's handle, e.g. `ada`.
    pub seat: String,
    /// How many turns, newest first (1 to 100; default 10).
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PauseSeat {
    /// The seat's handle, e.g. `ada`.
    pub seat: String,
    /// Why, for whoever looks at the seat next.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One MCP server instance per request (the transport is stateless).
#[derive(Clone)]
pub struct Operator {
    engine: Arc<dyn Engine>,
}

/// The catalogue, served by rmcp's streamable HTTP transport (mounted by
/// `crewlet_api::operator::routes`).
pub fn service(engine: Arc<dyn Engine>) -> StreamableHttpService<Operator, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true);
    StreamableHttpService::new(
        move || {
            Ok(Operator {
                engine: engine.clone(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

fn rendered(v: Result<Value, OperatorError>) -> Result<String, String> {
    v.map(|v| serde_json::to_string_pretty(&v).unwrap_or_default())
        .map_err(|e| e.to_string())
}

#[tool_router]
impl Operator {
    fn ctx(&self) -> Result<(Parts, Active), OperatorError> {
        let ctx = self.engine.parts().ok_or(OperatorError::Starting)?;
        let active = ctx.active.current().ok_or(OperatorError::NoCompany)?;
        Ok((ctx, active))
    }

    #[tool(
        description = "List the company's seats and what each is doing: who holds it (this node, another node, nobody, or unknown), whether it is paused, and whether it is in a turn."
    )]
    async fn list_seats(&self) -> Result<String, String> {
        rendered(self.seats().await)
    }

    #[tool(
        description = "Send a message to a seat and wait for its answer. The message enters as a trigger like any webhook delivery; the answer is the seat's turn outcome and the replies it posted. On timeout the message still stands."
    )]
    async fn send_message(&self, Parameters(m): Parameters<SendMessage>) -> Result<String, String> {
        rendered(self.send(m).await)
    }

    #[tool(
        description = "A seat's recent turns on this node, newest first: outcome, tokens, replies, duration."
    )]
    async fn seat_turns(&self, Parameters(t): Parameters<SeatTurns>) -> Result<String, String> {
        rendered(self.turns(t).await)
    }

    #[tool(
        description = "Record a pause for a seat in the fleet's seat-pause records (who, why, when); list_seats shows it."
    )]
    async fn pause_seat(&self, Parameters(p): Parameters<PauseSeat>) -> Result<String, String> {
        rendered(self.pause(p).await)
    }

    #[tool(description = "Remove a seat's pause record; answers whether it was paused.")]
    async fn resume_seat(&self, Parameters(s): Parameters<SeatArg>) -> Result<String, String> {
        rendered(self.resume(s).await)
    }

    #[tool(
        description = "The company's and every seat's token budgets: spent, ceiling and remaining for the day, week and month."
    )]
    async fn budgets(&self) -> Result<String, String> {
        let result = async {
            let (ctx, active) = self.ctx()?;
            ctx.fleet
                .budgets_of(&active.company)
                .await
                .map_err(|e| OperatorError::Unavailable {
                    what: "the budgets",
                    why: e.to_string(),
                })
        }
        .await;
        rendered(result)
    }
}

#[tool_handler(
    name = "crewlet-operator",
    instructions = "Operate a Crewlet company: list_seats, send_message (and wait for the reply), seat_turns, pause_seat, resume_seat, budgets."
)]
impl ServerHandler for Operator {}

fn seat_of<'c>(
    company: &'c Company,
    seat: &str,
) -> Result<&'c crewlet_company::Seat, OperatorError> {
    company
        .seat(seat)
        .ok_or_else(|| OperatorError::UnknownSeat {
            seat: seat.to_owned(),
            known: company
                .handles()
                .map(|h| h.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl Operator {
    async fn seats(&self) -> Result<Value, OperatorError> {
        let (ctx, active) = self.ctx()?;
        let me = ctx.survey.owner().clone();
        let leases = ctx.survey.live("seat").await;
        let mut out = Vec::new();
        for seat in active.company.seats.values() {
            let handle = seat.handle.as_str();
            let holder = match &leases {
                Ok(all) => match all.iter().find(|l| l.name.id() == handle) {
                    Some(l) if l.owner == me => json!({"state": "here", "node": ctx.node_id}),
                    Some(l) => json!({"state": "elsewhere", "owner": l.owner.as_str()}),
                    None => json!({"state": "unowned"}),
                },
                Err(e) => json!({"state": "unknown", "why": e.to_string()}),
            };
            let paused = match ctx.positions.get_record("seat_pause", handle).await {
                Ok(Answer::Yes((record, _))) => json!({"paused": true, "record": record}),
                Ok(Answer::No(())) => json!({"paused": false}),
                Err(e) => json!({"paused": "unknown", "why": e.to_string()}),
            };
            out.push(json!({
                "seat": handle,
                "role": seat.role,
                "holder": holder,
                "pause": paused,
                "turn": match holder["state"].as_str() {
                    Some("here") => self.turn_state(&ctx, handle).await,
                    Some("unowned") => json!({"in_turn": false}),
                    _ => json!({"in_turn": "unknown", "why": "not held by this node: its turns are in its holder's event log"}),
                },
            }));
        }
        Ok(json!({"org": active.company.org, "epoch": active.epoch, "seats": out}))
    }

    /// In a turn when this node's latest `turn_started` for the seat has no
    /// `turn_ended` after it.
    async fn turn_state(&self, ctx: &Parts, handle: &str) -> Value {
        let latest = |kind: &str| EventQuery {
            seat: Some(handle.to_owned()),
            kind: Some(kind.to_owned()),
            limit: 1,
            ..EventQuery::default()
        };
        let (store, started, ended) = (
            ctx.store.clone(),
            latest("turn_started"),
            latest("turn_ended"),
        );
        let read = tokio::task::spawn_blocking(move || {
            Ok::<_, crewlet_store::StoreError>((store.events(&started)?, store.events(&ended)?))
        })
        .await;
        match read {
            Ok(Ok((started, ended))) => {
                let turn = |e: &EventRecord| e.payload["turn_id"].as_str().map(str::to_owned);
                let open = started.first().and_then(turn);
                let closed = ended.first().and_then(turn);
                match open {
                    Some(t) if Some(&t) != closed.as_ref() => {
                        json!({"in_turn": true, "turn_id": t})
                    }
                    _ => json!({"in_turn": false}),
                }
            }
            Ok(Err(e)) => json!({"in_turn": "unknown", "why": e.to_string()}),
            Err(e) => json!({"in_turn": "unknown", "why": e.to_string()}),
        }
    }

    async fn send(&self, m: SendMessage) -> Result<Value, OperatorError> {
        let (ctx, active) = self.ctx()?;
        let handle = seat_of(&active.company, &m.seat)?.handle.to_string();
        if m.text.trim().is_empty() {
            return Err(OperatorError::BadArgument {
                field: "text",
                message: "is empty: write the message for the seat".into(),
            });
        }
        let waited = match m.timeout_seconds {
            None => DEFAULT_WAIT,
            Some(s) if (1..=MAX_WAIT.as_secs()).contains(&s) => Duration::from_secs(s),
            Some(s) => {
                return Err(OperatorError::BadArgument {
                    field: "timeout_seconds",
                    message: format!("expected 1 to {} seconds, found {s}", MAX_WAIT.as_secs()),
                });
            }
        };
        // Subscribed (and flushed) before the publish: the turn's events
        // cannot come before the watcher.
        let unavailable = |e: &dyn std::fmt::Display| OperatorError::Unavailable {
            what: "the event broadcast",
            why: e.to_string(),
        };
        let mut events = ctx
            .client
            .subscribe(crewlet_bus::EVENTS_SUBJECTS)
            .await
            .map_err(|e| unavailable(&e))?;
        ctx.client.flush().await.map_err(|e| unavailable(&e))?;

        let delivery_id = uuid::Uuid::now_v7().to_string();
        let delivery = Delivery {
            source: SOURCE.to_owned(),
            event_type: "message".to_owned(),
            delivery_id: delivery_id.clone(),
            addressed: Addressed {
                mentions: Vec::new(),
                assignees: Vec::new(),
                reviewers: Vec::new(),
                channel: Some(SOURCE.to_owned()),
                thread: Some(delivery_id.clone()),
            },
            payload: m.text.as_bytes().to_vec(),
            text: Some(m.text),
            // As before WIT 0.4.0: the operator reads the turn's events,
            // no reply is owed in a chat.
            owed: None,
            // The operator speaks to the seat its route names.
            sender: Vec::new(),
            wakes: crewlet_plugins::webhook::Wakes::RouteAndNamed,
            message: None,
        };
        let edge = ctx.edge.clone();
        let started = std::time::Instant::now();
        let published = match edge.dispatch(SOURCE, Some(&handle), delivery).await {
            Ok(Some(p)) => p,
            Ok(None) => {
                return Err(OperatorError::NotAccepted(format!(
                    "delivery {SOURCE}:{delivery_id} is already claimed"
                )));
            }
            Err(e) => return Err(OperatorError::NotAccepted(e.to_string())),
        };
        edge.record(&published, started).await;
        let trace_id = published.inbound.trace_id.clone();
        let key = published.inbound.key.clone();
        info!(subsystem = "operator", seat = %handle, trace_id, "operator message accepted");

        let deadline = tokio::time::Instant::now() + waited;
        // The node's phase is an atomic with no watch: looked at on a tick,
        // so a drain never waits out a long `timeout_seconds`.
        let mut phase_tick = tokio::time::interval(PHASE_CHECK);
        let mut turn: Option<String> = None;
        let mut replies = Vec::new();
        loop {
            let msg = tokio::select! {
                m = events.next() => m,
                _ = tokio::time::sleep_until(deadline) => None,
                _ = phase_tick.tick() => {
                    if self.engine.draining() {
                        return Err(OperatorError::Draining { seat: handle, trace_id });
                    }
                    continue;
                }
            };
            let Some(msg) = msg else {
                return Err(OperatorError::NoAnswer {
                    seat: handle,
                    trace_id,
                    waited,
                });
            };
            let Ok(ev) = serde_json::from_slice::<EventRecord>(&msg.payload) else {
                continue;
            };
            if ev.seat.as_deref() != Some(handle.as_str()) {
                continue;
            }
            let turn_id = ev.payload["turn_id"].as_str().map(str::to_owned);
            match ev.kind.as_str() {
                "turn_started" if turn.is_none() => {
                    let ours = ev.trace_id.as_deref() == Some(trace_id.as_str())
                        || ev.payload["triggers"].as_array().is_some_and(|t| {
                            t.iter()
                                .any(|k| k.as_str().is_some_and(|k| k.contains(&key)))
                        });
                    if ours {
                        turn = turn_id;
                    }
                }
                "reply_posted" if turn.is_some() && turn_id == turn => {
                    replies.push(json!({
                        "target": ev.payload["target"],
                        "text": ev.payload["text"],
                    }));
                }
                "turn_ended" if turn.is_some() && turn_id == turn => {
                    return Ok(json!({
                        "seat": handle,
                        "trace_id": trace_id,
                        "turn_id": turn,
                        "outcome": ev.payload["outcome"],
                        "detail": ev.payload["detail"],
                        "replies": replies,
                    }));
                }
                _ => {}
            }
        }
    }

    async fn turns(&self, t: SeatTurns) -> Result<Value, OperatorError> {
        let (ctx, active) = self.ctx()?;
        let handle = seat_of(&active.company, &t.seat)?.handle.to_string();
        let limit = match t.limit {
            None => 10,
            Some(n) if (1..=100).contains(&n) => n,
            Some(n) => {
                return Err(OperatorError::BadArgument {
                    field: "limit",
                    message: format!("expected 1 to 100 turns, found {n}"),
                });
            }
        };
        // The fleet's logs: the seat's turns ran wherever it was held.
        let filter = crewlet_bus::EventFilter {
            seat: Some(handle.clone()),
            kind: Some("turn_ended".into()),
            limit: Some(limit),
            ..crewlet_bus::EventFilter::default()
        };
        let read = ctx.history.events(filter).await;
        let rows: Vec<EventRecord> = read["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| serde_json::from_value(e.clone()).ok())
            .collect();
        let turns: Vec<Value> = rows
            .iter()
            .map(|e| {
                json!({
                    "turn_id": e.payload["turn_id"],
                    "ended_at_ms": e.at_ms,
                    "node": e.node_id,
                    "trace_id": e.trace_id,
                    "outcome": e.payload["outcome"],
                    "detail": e.payload["detail"],
                    "replies": e.payload["replies"],
                    "input_tokens": e.payload["input_tokens"],
                    "output_tokens": e.payload["output_tokens"],
                    "ms": e.payload["ms"],
                })
            })
            .collect();
        Ok(json!({
            "seat": handle,
            "node": ctx.node_id,
            "turns": turns,
            "truncated": read["truncated"],
            "coverage": read["coverage"],
        }))
    }

    async fn pause(&self, p: PauseSeat) -> Result<Value, OperatorError> {
        let (ctx, active) = self.ctx()?;
        let handle = seat_of(&active.company, &p.seat)?.handle.to_string();
        ctx.seat_pauses
            .pause(&handle, "operator-mcp", p.reason)
            .await
            .map_err(paused_not)
    }

    async fn resume(&self, s: SeatArg) -> Result<Value, OperatorError> {
        let (ctx, active) = self.ctx()?;
        let handle = seat_of(&active.company, &s.seat)?.handle.to_string();
        ctx.seat_pauses
            .resume(&handle, "operator-mcp")
            .await
            .map_err(paused_not)
    }
}

/// A pause or resume not done, as the catalogue says it.
fn paused_not(e: crewlet_seats::PauseError) -> OperatorError {
    use crewlet_seats::PauseError;
    match e {
        PauseError::NoCompany => OperatorError::NoCompany,
        PauseError::NoSeat(seat) => OperatorError::UnknownSeat {
            seat,
            known: String::new(),
        },
        PauseError::Unavailable { what, why } => OperatorError::Unavailable { what, why },
    }
}

#[cfg(test)]
mod tests;
