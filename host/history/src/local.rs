//! What one node answers about its own event log, and the wire it answers
//! on: the same function serves the node reading for itself (no network)
//! and a peer asking over [`crewlet_bus::history_subject`].
//!
//! Rules:
//! - An answer never claims more than it read: `full` is set when the log
//!   gave as many rows as asked (there may be older ones) or when rows were
//!   left out to fit the broker's message size, so the merge can say the
//!   limit cut the answer.
//! - A turn is open when its `turn_started` has no `turn_ended` and it
//!   started in this process's life (a turn of an earlier run cannot still
//!   be running).

use std::collections::HashSet;
use std::sync::Arc;

use crewlet_bus::EventFilter;
use crewlet_store::{EventQuery, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Rows a read gives when it names no limit, and the most it may ask.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1_000;
/// The newest `turn_started` rows an open-turns read looks at, and the
/// `turn_ended` rows it matches them against (more: an end is newer than
/// its start, and turns of other seats end in between).
const OPEN_STARTED: usize = 200;
const OPEN_ENDED: usize = 1_000;

/// The limit a read applies for `asked` (0 or none: the default).
pub fn effective_limit(asked: Option<usize>) -> usize {
    match asked.unwrap_or(0) {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    }
}

/// What a node is asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "read", rename_all = "snake_case")]
pub enum Ask {
    /// Its event log, filtered (the limit already effective).
    Events { filter: EventFilter },
    /// The turns running on it now.
    OpenTurns,
    /// Every row of one turn (`payload.turn_id`), among the turns of its
    /// latest [`TURN_WINDOW`] started on it.
    Turn { turn_id: String },
    /// The rows of its log that `node` published, filtered: what a data
    /// node keeps of a node without `data` (custody).
    Published { node: String, filter: EventFilter },
}

/// How many of a node's latest started turns a turn's detail is looked
/// for among (the log has no index on a payload's turn id).
pub const TURN_WINDOW: usize = 1_000;

/// A turn that started on a node and has not ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenTurn {
    pub seat: Option<String>,
    pub turn_id: String,
    pub started_at_ms: i64,
}

/// What a node answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Told {
    pub node: String,
    pub events: Vec<Value>,
    /// There may be more rows than those given (see the module docs).
    pub full: bool,
    pub open_turns: Vec<OpenTurn>,
    /// The node could not read its own log; what it said.
    pub error: Option<String>,
}

/// Answers `ask` from `store` (blocking: run it off the async threads).
/// `since_ms` is when this process started; `room` the most bytes the
/// answer may take on the wire.
pub fn answer(store: &Store, node: &str, ask: &Ask, since_ms: i64, room: usize) -> Told {
    let mut told = Told {
        node: node.to_owned(),
        ..Told::default()
    };
    let read = match ask {
        Ask::Events { filter } => events(store, filter, None, room).map(|(rows, full)| {
            told.events = rows;
            told.full = full;
        }),
        Ask::Published { node, filter } => {
            events(store, filter, Some(node), room).map(|(rows, full)| {
                told.events = rows;
                told.full = full;
            })
        }
        Ask::OpenTurns => open_turns(store, since_ms).map(|open| told.open_turns = open),
        Ask::Turn { turn_id } => turn(store, turn_id, room).map(|(rows, full)| {
            told.events = rows;
            told.full = full;
        }),
    };
    if let Err(e) = read {
        told.error = Some(format!("this node's event log could not be read: {e}"));
    }
    told
}

fn events(
    store: &Store,
    f: &EventFilter,
    published_by: Option<&String>,
    room: usize,
) -> Result<(Vec<Value>, bool), crewlet_store::StoreError> {
    let limit = effective_limit(f.limit);
    let rows = store.events(&EventQuery {
        seat: f.seat.clone(),
        kind: f.kind.clone(),
        party: f.party.clone(),
        trace_id: f.trace_id.clone(),
        node_id: published_by.cloned(),
        before_seq: f.before_seq,
        limit,
    })?;
    let mut full = rows.len() >= limit;
    let mut used = 256;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let value = serde_json::to_value(&row)?;
        used += value.to_string().len() + 1;
        if used > room {
            // The oldest rows stay behind; the answer says it was cut.
            full = true;
            break;
        }
        out.push(value);
    }
    Ok((out, full))
}

/// A turn's rows: its `turn_started` among the latest [`TURN_WINDOW`]
/// gives its trace, and the trace's rows carrying its turn id are the turn.
fn turn(
    store: &Store,
    turn_id: &str,
    room: usize,
) -> Result<(Vec<Value>, bool), crewlet_store::StoreError> {
    let of_turn = |e: &crewlet_store::EventRecord| e.payload["turn_id"].as_str() == Some(turn_id);
    let started = store.events(&EventQuery {
        kind: Some("turn_started".into()),
        limit: TURN_WINDOW,
        ..EventQuery::default()
    })?;
    let Some(trace) = started
        .iter()
        .find(|e| of_turn(e))
        .map(|e| e.trace_id.clone())
    else {
        return Ok((Vec::new(), false));
    };
    let rows = match trace {
        Some(trace_id) => store.events(&EventQuery {
            trace_id: Some(trace_id),
            limit: MAX_LIMIT,
            ..EventQuery::default()
        })?,
        None => started.into_iter().filter(|e| of_turn(e)).collect(),
    };
    let full = rows.len() >= MAX_LIMIT;
    let mut used = 256;
    let mut out = Vec::new();
    for row in rows.iter().filter(|e| of_turn(e)) {
        let value = serde_json::to_value(row)?;
        used += value.to_string().len() + 1;
        if used > room {
            return Ok((out, true));
        }
        out.push(value);
    }
    Ok((out, full))
}

fn open_turns(store: &Store, since_ms: i64) -> Result<Vec<OpenTurn>, crewlet_store::StoreError> {
    let of = |kind: &str, limit| EventQuery {
        kind: Some(kind.to_owned()),
        limit,
        ..EventQuery::default()
    };
    let started = store.events(&of("turn_started", OPEN_STARTED))?;
    let ended: HashSet<String> = store
        .events(&of("turn_ended", OPEN_ENDED))?
        .iter()
        .filter_map(|e| e.payload["turn_id"].as_str().map(str::to_owned))
        .collect();
    Ok(started
        .into_iter()
        .filter(|e| e.at_ms >= since_ms)
        .filter_map(|e| {
            let turn_id = e.payload["turn_id"].as_str()?.to_owned();
            (!ended.contains(&turn_id)).then_some(OpenTurn {
                seat: e.seat.clone(),
                turn_id,
                started_at_ms: e.at_ms,
            })
        })
        .collect())
}

/// [`answer`] on a blocking thread; a reader that failed is an error told.
pub async fn answer_off_thread(
    store: Arc<Store>,
    node: String,
    ask: Ask,
    since_ms: i64,
    room: usize,
) -> Told {
    let who = node.clone();
    tokio::task::spawn_blocking(move || answer(&store, &node, &ask, since_ms, room))
        .await
        .unwrap_or_else(|e| Told {
            node: who,
            error: Some(format!("the event log reader failed: {e}")),
            ..Told::default()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crewlet_store::EventRecord;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_in(dir.path()).unwrap();
        (dir, s)
    }

    fn turn(s: &Store, id: &str, kind: &str, turn: &str, at_ms: i64) {
        let mut e = EventRecord::new(id, kind, "n1", serde_json::json!({ "turn_id": turn }));
        e.seat = Some("ada".into());
        e.at_ms = at_ms;
        s.append_event(&e).unwrap();
    }

    #[test]
    fn a_turn_is_open_until_it_ends_and_only_in_this_run() {
        let (_d, s) = store();
        turn(&s, "1", "turn_started", "old", 10);
        turn(&s, "2", "turn_started", "t1", 100);
        turn(&s, "3", "turn_started", "t2", 110);
        turn(&s, "4", "turn_ended", "t1", 120);
        let told = answer(&s, "n1", &Ask::OpenTurns, 50, 1 << 20);
        let open: Vec<_> = told.open_turns.iter().map(|t| t.turn_id.as_str()).collect();
        assert_eq!(open, ["t2"], "{told:?}");
    }

    #[test]
    fn a_turns_detail_is_its_rows_of_its_trace() {
        let (_d, s) = store();
        for (id, kind, t) in [
            ("1", "turn_started", "t1"),
            ("2", "model_call", "t1"),
            ("3", "model_call", "t2"),
            ("4", "turn_ended", "t1"),
        ] {
            let mut e = EventRecord::new(id, kind, "n1", serde_json::json!({ "turn_id": t }));
            e.trace_id = Some("tr".into());
            s.append_event(&e).unwrap();
        }
        let told = answer(
            &s,
            "n1",
            &Ask::Turn {
                turn_id: "t1".into(),
            },
            0,
            1 << 20,
        );
        let ids: Vec<_> = told
            .events
            .iter()
            .map(|e| e["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["4", "2", "1"], "{told:?}");
        let none = answer(
            &s,
            "n1",
            &Ask::Turn {
                turn_id: "nope".into(),
            },
            0,
            1 << 20,
        );
        assert!(none.events.is_empty() && none.error.is_none());
    }

    #[test]
    fn an_answer_says_when_it_may_hold_less_than_the_log() {
        let (_d, s) = store();
        for i in 0..5 {
            turn(&s, &format!("e{i}"), "turn_started", &format!("t{i}"), i);
        }
        let ask = |limit, room| {
            let filter = EventFilter {
                limit: Some(limit),
                ..EventFilter::default()
            };
            answer(&s, "n1", &Ask::Events { filter }, 0, room)
        };
        let all = ask(10, 1 << 20);
        assert_eq!((all.events.len(), all.full), (5, false));
        let cut = ask(3, 1 << 20);
        assert_eq!((cut.events.len(), cut.full), (3, true), "the limit was met");
        let small = ask(10, 700);
        assert!(small.full && small.events.len() < 5, "{small:?}");
        assert_eq!(small.events[0]["event_id"], "e4", "the newest rows stay");
    }
}
