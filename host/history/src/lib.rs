//! The fleet's history (`crewlet-history`): read from every node, not
//! copied to every node.
//!
//! Each node's event log holds only what it published, so a read of the
//! event log (`GET /events`, the `/ws/stream` query, the operator's
//! `seat_turns`, a turn's detail on `GET /turns/{id}`, the turns in flight
//! on `GET /agents`) is scattered to every
//! node in presence over core request/reply ([`crewlet_bus::history_subject`],
//! one subject per node) and merged here.
//!
//! Rules, and why:
//! - One budget for the whole read, [`BUDGET`] (2 s): the membership
//!   listing and every peer's answer share it. A read a person waits on
//!   must end, and a frozen peer must not hold the fleet's history hostage.
//! - Every answer carries a [`Coverage`]: the nodes that answered, and every
//!   node in presence that did not with the reason (timeout, no responder,
//!   its own error). A node is never silently absent; when presence cannot
//!   be listed the coverage says membership is unknown rather than
//!   pretending this node is the fleet.
//! - The serving node answers for itself from its own log, without the
//!   network.
//! - Rows are merged newest first by time (then event id), deduplicated by
//!   event id; a `limit` that cut the answer is stated (`truncated`, and the
//!   `limit` applied), never silent.
//! - A node without `data` keeps no log: its events are in the log of the
//!   data node that keeps each batch ([`custody`]), so the scatter finds
//!   them there, carrying the stateless node's id. With no live data node
//!   in presence the coverage says nobody keeps those events
//!   ([`NO_KEEPER`], `complete: false`) — an empty answer must not read as
//!   "nothing happened".
//! - `node=ID` reads one node's log; `before_seq` is a position in one
//!   node's log, so it pages the node named (the serving node when none is).
//!   A node that is not a live data node (no `data`, or gone) has no log to
//!   read: its events are read from every live data node's log, those it
//!   published ([`Ask::Published`]).

pub mod custody;
pub mod custody_view;
pub mod local;
pub mod responder;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_bus::EventFilter;
use crewlet_coord::Roster;
use crewlet_store::Store;
use serde::Serialize;
use serde_json::{Value, json};

pub use local::{Ask, OpenTurn, Told};
pub use responder::{Responder, StartError};

/// The fleet read budget: membership and every peer's answer within it.
pub const BUDGET: Duration = Duration::from_secs(2);

/// What a read's coverage says while no live node has `data`.
pub const NO_KEEPER: &str = "no live node has the `data` role: the events of nodes without it are kept by no log until one runs, so this answer holds none of them (they wait on CREWLET_CUSTODY)";

/// A node that was asked and did not answer, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Missing {
    pub node: String,
    /// `timeout`, `no_responders`, `error` or `unreadable`.
    pub reason: &'static str,
    pub detail: String,
}

/// Which nodes a fleet read covers.
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    /// Every node in presence answered (and presence was listed).
    pub complete: bool,
    /// `presence` (the live `node:*` leases) or `unknown`.
    pub membership: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub membership_error: Option<String>,
    pub answered: Vec<String>,
    pub missing: Vec<Missing>,
    /// The live data nodes, which keep the events of nodes without `data`
    /// (absent when presence was not listed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepers: Option<Vec<String>>,
    /// Set when no live node keeps the events of nodes without `data`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<&'static str>,
    pub budget_ms: u64,
    pub took_ms: u64,
}

/// What a fleet read gathered: every answer, and the coverage.
pub struct Gathered {
    pub told: Vec<Told>,
    pub coverage: Coverage,
}

/// What a fleet read is made with: this node's id, log and start, the
/// connection peers are asked on, and presence (who to ask: the node
/// leases, read only). Cheap to clone.
#[derive(Clone)]
pub struct Reader {
    node_id: String,
    client: async_nats::Client,
    presence: Roster,
    store: Arc<Store>,
    since_ms: i64,
}

impl Reader {
    /// `since_ms`: when this process started (a turn that started before
    /// cannot still be open).
    pub fn new(
        node_id: String,
        client: async_nats::Client,
        presence: Roster,
        store: Arc<Store>,
        since_ms: i64,
    ) -> Reader {
        Reader {
            node_id,
            client,
            presence,
            store,
            since_ms,
        }
    }

    /// Asks `ask` of every live node (or only `only`), this one from its own
    /// log; answers within [`BUDGET`].
    pub async fn gather(&self, ask: Ask, only: Option<&str>) -> Gathered {
        gather(self, ask, only).await
    }

    /// A fleet read of the event log, as `GET /events` and the socket answer it.
    pub async fn events(&self, filter: EventFilter) -> Value {
        events(self, filter).await
    }

    /// A turn's detail, wherever it ran: every row carrying its turn id, from
    /// every node (a turn moved by a crash has rows on two), with coverage.
    pub async fn turn(&self, turn_id: &str) -> Value {
        turn(self, turn_id).await
    }
}

/// Who a fleet read asks.
enum Target<'a> {
    /// Every node in presence.
    Fleet,
    /// One node, asked as it is.
    Node(&'a str),
    /// These nodes (the keepers of a stateless node's events), known from
    /// presence listed at `begun`.
    Keepers(Vec<String>, Instant, tokio::time::Instant),
}

/// Where one node's events are: its own log, or the logs of the live data
/// nodes (it has no `data`, or is gone); `Err` when presence was not read.
enum Publisher {
    OwnLog,
    Kept(Vec<String>),
}

/// Live data nodes among `leases` (a lease without its status yet is not
/// counted: its roles are not known).
fn data_nodes(leases: &[crewlet_coord::Lease]) -> Vec<String> {
    let mut ids: Vec<String> = leases
        .iter()
        .filter(|l| {
            l.status
                .as_ref()
                .is_some_and(|s| s.roles.iter().any(|r| r == "data"))
        })
        .map(|l| l.name.id().to_owned())
        .collect();
    ids.sort();
    ids
}

async fn publisher_of(
    ctx: &Reader,
    node: &str,
    deadline: tokio::time::Instant,
) -> Result<Publisher, String> {
    let leases = match tokio::time::timeout_at(deadline, ctx.presence.live()).await {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("presence was not listed within the budget".into()),
    };
    let keepers = data_nodes(&leases);
    Ok(if keepers.iter().any(|k| k == node) {
        Publisher::OwnLog
    } else if leases
        .iter()
        .any(|l| l.name.id() == node && l.status.is_none())
    {
        // Live, roles not published yet: its own log, as before.
        Publisher::OwnLog
    } else {
        Publisher::Kept(keepers)
    })
}

async fn gather(ctx: &Reader, ask: Ask, only: Option<&str>) -> Gathered {
    let target = match only {
        Some(node) => Target::Node(node),
        None => Target::Fleet,
    };
    gather_in(ctx, ask, target).await
}

async fn gather_in(ctx: &Reader, ask: Ask, target: Target<'_>) -> Gathered {
    let (begun, deadline) = match &target {
        Target::Keepers(_, begun, deadline) => (*begun, *deadline),
        _ => (Instant::now(), tokio::time::Instant::now() + BUDGET),
    };
    let me = ctx.node_id.clone();
    let room = ctx.client.server_info().max_payload;
    let since = ctx.since_ms;
    let asks_me = match &target {
        Target::Fleet => true,
        Target::Node(n) => *n == me,
        Target::Keepers(k, ..) => k.contains(&me),
    };
    let mine = async {
        if asks_me {
            let store = ctx.store.clone();
            Some(local::answer_off_thread(store, me.clone(), ask.clone(), since, room).await)
        } else {
            None
        }
    };
    let peers = async {
        // A named node is asked as it is, without listing presence: the
        // read is of it alone, and its silence is named below.
        let (targets, keepers, membership_error) = match &target {
            Target::Node(node) if *node == me => (Vec::new(), None, None),
            Target::Node(node) => (vec![(*node).to_owned()], None, None),
            Target::Keepers(keepers, ..) => (
                keepers.iter().filter(|n| **n != me).cloned().collect(),
                Some(keepers.clone()),
                None,
            ),
            Target::Fleet => match tokio::time::timeout_at(deadline, ctx.presence.live()).await {
                Ok(Ok(leases)) => (
                    leases
                        .iter()
                        .map(|l| l.name.id().to_owned())
                        .filter(|n| *n != me)
                        .collect(),
                    Some(data_nodes(&leases)),
                    None,
                ),
                // Presence unknown: the rest of the fleet cannot be known,
                // and the coverage says so.
                Ok(Err(e)) => (Vec::new(), None, Some(e.to_string())),
                Err(_) => (
                    Vec::new(),
                    None,
                    Some(format!(
                        "presence was not listed within the {} ms budget",
                        BUDGET.as_millis()
                    )),
                ),
            },
        };
        let mut missing = Vec::new();
        let body: bytes::Bytes = serde_json::to_vec(&ask).unwrap_or_default().into();
        let asked = targets
            .iter()
            .map(|node| ask_peer(ctx, node, body.clone(), deadline));
        let answers = futures::future::join_all(asked).await;
        let mut told = Vec::new();
        for (node, answer) in targets.iter().zip(answers) {
            match answer {
                Ok(t) => told.push(t),
                Err((reason, detail)) => missing.push(Missing {
                    node: node.clone(),
                    reason,
                    detail,
                }),
            }
        }
        (told, missing, keepers, membership_error)
    };
    let (mine, (mut told, mut missing, keepers, membership_error)) = futures::join!(mine, peers);
    if let Some(mine) = mine {
        told.insert(0, mine);
    }
    // A node that answered with its own error is named, not counted.
    let mut answered = Vec::new();
    told.retain(|t| match &t.error {
        Some(e) => {
            missing.push(Missing {
                node: t.node.clone(),
                reason: "error",
                detail: e.clone(),
            });
            false
        }
        None => {
            answered.push(t.node.clone());
            true
        }
    });
    let warning = keepers
        .as_ref()
        .is_some_and(|k| k.is_empty())
        .then_some(NO_KEEPER);
    Gathered {
        coverage: Coverage {
            complete: missing.is_empty() && membership_error.is_none() && warning.is_none(),
            membership: if membership_error.is_some() {
                "unknown"
            } else {
                "presence"
            },
            membership_error,
            answered,
            missing,
            keepers,
            warning,
            budget_ms: BUDGET.as_millis() as u64,
            took_ms: begun.elapsed().as_millis() as u64,
        },
        told,
    }
}

async fn ask_peer(
    ctx: &Reader,
    node: &str,
    body: bytes::Bytes,
    deadline: tokio::time::Instant,
) -> Result<Told, (&'static str, String)> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let request = async_nats::client::Request::new()
        .payload(body)
        .timeout(Some(left));
    let subject = crewlet_bus::history_subject(node);
    let sent = tokio::time::timeout_at(deadline, ctx.client.send_request(subject, request)).await;
    let timeout = || {
        (
            "timeout",
            format!("no answer within the {} ms budget", BUDGET.as_millis()),
        )
    };
    let msg = match sent {
        Err(_) => return Err(timeout()),
        Ok(Err(e)) => {
            use async_nats::client::RequestErrorKind;
            return Err(match e.kind() {
                RequestErrorKind::TimedOut => timeout(),
                RequestErrorKind::NoResponders => (
                    "no_responders",
                    "nobody answers on its history subject: the node is gone, or a build without fleet history".into(),
                ),
                _ => ("error", e.to_string()),
            });
        }
        Ok(Ok(msg)) => msg,
    };
    serde_json::from_slice::<Told>(&msg.payload).map_err(|e| {
        (
            "unreadable",
            format!("its answer is not a history answer ({e})"),
        )
    })
}

/// The event rows of a fleet read, merged: newest first by time, then
/// event id; one row per event id; at most `limit`. Answers the rows and
/// whether the limit cut them (some node may hold more than it gave).
pub fn merge(told: &[Told], limit: usize) -> (Vec<Value>, bool) {
    let mut seen = HashSet::new();
    let mut rows: Vec<&Value> = told
        .iter()
        .flat_map(|t| t.events.iter())
        .filter(|e| seen.insert(e["event_id"].as_str().unwrap_or_default().to_owned()))
        .collect();
    rows.sort_by(|a, b| {
        let key = |e: &Value| (e["at_ms"].as_i64().unwrap_or(0), e["event_id"].to_string());
        key(b).cmp(&key(a))
    });
    let truncated = rows.len() > limit || told.iter().any(|t| t.full);
    rows.truncate(limit);
    (rows.into_iter().cloned().collect(), truncated)
}

async fn events(ctx: &Reader, filter: EventFilter) -> Value {
    let asked = filter.limit;
    let limit = local::effective_limit(asked);
    // `before_seq` is a position in one node's log: without `node` it
    // pages the serving node's.
    let only = filter
        .node
        .clone()
        .or_else(|| filter.before_seq.map(|_| ctx.node_id.clone()));
    let named = filter.node.clone();
    let filter = EventFilter {
        limit: Some(limit),
        node: None,
        ..filter
    };
    // A node named that keeps no log of its own: read what it published
    // from the logs of the data nodes that keep it.
    if let Some(node) = named {
        let begun = Instant::now();
        let deadline = tokio::time::Instant::now() + BUDGET;
        if let Ok(Publisher::Kept(keepers)) = publisher_of(ctx, &node, deadline).await {
            let ask = Ask::Published { node, filter };
            let target = Target::Keepers(keepers, begun, deadline);
            let gathered = gather_in(ctx, ask, target).await;
            return answer(&gathered.told, gathered.coverage, limit, asked);
        }
    }
    let gathered = gather(ctx, Ask::Events { filter }, only.as_deref()).await;
    answer(&gathered.told, gathered.coverage, limit, asked)
}

fn answer(told: &[Told], coverage: Coverage, limit: usize, asked: Option<usize>) -> Value {
    let (events, truncated) = merge(told, limit);
    let mut out = json!({
        "events": events,
        "limit": limit,
        "truncated": truncated,
        "coverage": coverage,
    });
    if asked.is_some_and(|a| a > limit) {
        out["limit_asked"] = json!(asked);
    }
    out
}

async fn turn(ctx: &Reader, turn_id: &str) -> Value {
    let ask = Ask::Turn {
        turn_id: turn_id.to_owned(),
    };
    let gathered = gather(ctx, ask, None).await;
    let (events, truncated) = merge(&gathered.told, local::MAX_LIMIT);
    let ran_on: std::collections::BTreeSet<&str> = events
        .iter()
        .filter_map(|e| e["node_id"].as_str())
        .collect();
    json!({
        "turn_id": turn_id,
        "found": !events.is_empty(),
        "nodes": ran_on,
        "events": events,
        "truncated": truncated,
        "coverage": gathered.coverage,
    })
}

/// This node's log could not be read for a read of it alone.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// A read of this node's log alone, before the fleet can be asked (the
/// engine is still starting): the answer has the fleet read's shape, its
/// coverage saying the fleet was not asked.
pub async fn own_log(
    store: Arc<Store>,
    node_id: String,
    since_ms: i64,
    filter: EventFilter,
) -> Result<Value, Unreadable> {
    let begun = Instant::now();
    let asked = filter.limit;
    let limit = local::effective_limit(asked);
    let filter = EventFilter {
        limit: Some(limit),
        ..filter
    };
    let mine = local::answer_off_thread(
        store,
        node_id.clone(),
        Ask::Events { filter },
        since_ms,
        usize::MAX,
    )
    .await;
    if let Some(e) = mine.error {
        return Err(Unreadable(e));
    }
    let coverage = Coverage {
        complete: false,
        membership: "unknown",
        membership_error: Some(
            "the engine is still starting: only this node's log was read".into(),
        ),
        answered: vec![node_id],
        missing: Vec::new(),
        keepers: None,
        warning: None,
        budget_ms: BUDGET.as_millis() as u64,
        took_ms: begun.elapsed().as_millis() as u64,
    };
    Ok(answer(&[mine], coverage, limit, asked))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(node: &str, rows: &[(&str, i64)], full: bool) -> Told {
        Told {
            node: node.into(),
            events: rows
                .iter()
                .map(|(id, at)| json!({"event_id": id, "at_ms": at, "node_id": node}))
                .collect(),
            full,
            ..Told::default()
        }
    }

    #[test]
    fn rows_merge_newest_first_once_each_and_a_cut_is_stated() {
        let a = told("a", &[("a2", 30), ("a1", 10)], false);
        let b = told("b", &[("b1", 20), ("a2", 30)], false);
        let (rows, cut) = merge(&[a.clone(), b.clone()], 10);
        let ids: Vec<_> = rows
            .iter()
            .map(|r| r["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a2", "b1", "a1"]);
        assert!(!cut, "nothing was left out");
        let (rows, cut) = merge(&[a.clone(), b], 2);
        assert_eq!(rows.len(), 2);
        assert!(cut, "the limit cut a row");
        let full = told("c", &[("c1", 5)], true);
        assert!(
            merge(&[a, full], 10).1,
            "a node that may hold more cuts the answer"
        );
    }
}
