//! Where `/health` and `GET /usage` find this node's estate: set once at
//! start on a node with `data`, empty on any other.

use std::sync::{Arc, OnceLock};

use crewlet_statelog::usage::UsageQuery;
use crewlet_statelog::{Applier, Estate};
use serde_json::{Value, json};

use crate::UsageRefusal;

/// This node's estate, when it holds one.
pub struct NodeEstate {
    pub estate: Arc<Estate>,
    pub applier: Applier,
}

/// Where `/health` and `GET /usage` find the estate (set once, at start).
#[derive(Default)]
pub struct EstateSlot(OnceLock<Arc<NodeEstate>>);

impl EstateSlot {
    pub fn get(&self) -> Option<&Arc<NodeEstate>> {
        self.0.get()
    }

    pub(crate) fn set(&self, held: Arc<NodeEstate>) {
        let _ = self.0.set(held);
    }

    /// `/health` `estate`: null on a node without `data`.
    pub fn health(&self) -> Value {
        match self.0.get() {
            None => Value::Null,
            Some(e) => json!({
                "path": e.estate.path().display().to_string(),
                "domains": [e.applier.status()],
            }),
        }
    }
}

/// `GET /usage`'s query as asked (each part optional).
#[derive(Debug, Clone, Default)]
pub struct UsageAsk {
    pub period: Option<String>,
    pub by: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Answers `GET /usage` from this node's estate.
pub fn usage(slot: &EstateSlot, ask: UsageAsk) -> Result<Value, UsageRefusal> {
    let query = UsageQuery::parse(
        ask.period.as_deref(),
        ask.by.as_deref(),
        ask.from.as_deref(),
        ask.to.as_deref(),
    )
    .map_err(|e| UsageRefusal::BadQuery(e.to_string()))?;
    let Some(held) = slot.get() else {
        return Err(UsageRefusal::NotHeld(
            "this node has no `data` role, so it holds no usage history: ask a node whose node.roles include `data`".into(),
        ));
    };
    let conn = held
        .estate
        .reader()
        .map_err(|e| UsageRefusal::Unavailable(e.to_string()))?;
    let rows = query
        .run(&conn)
        .map_err(|e| UsageRefusal::Unavailable(e.to_string()))?;
    Ok(json!({
        "rows": rows,
        "estate": held.applier.status(),
    }))
}

/// `crewlet usage`'s table: one line per period and key.
pub fn render_usage(v: &Value) -> String {
    let mut out = format!(
        "{:<12} {:<24} {:>7} {:>12} {:>12} {:>7} {:>7}\n",
        "PERIOD", "KEY", "CALLS", "INPUT", "OUTPUT", "TURNS", "FIRES"
    );
    let dash = |x: &Value| x.as_u64().map_or("-".to_owned(), |n| n.to_string());
    for row in v["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<12} {:<24} {:>7} {:>12} {:>12} {:>7} {:>7}\n",
            row["period"].as_str().unwrap_or(""),
            // By provider, calls whose records named no slot.
            row["key"].as_str().unwrap_or("(unknown)"),
            dash(&row["calls"]),
            dash(&row["input_tokens"]),
            dash(&row["output_tokens"]),
            dash(&row["turns"]),
            dash(&row["fires"]),
        ));
    }
    out
}
