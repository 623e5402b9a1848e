//! Seeing the fleet (`crewlet-fleet`): what `GET /fleet` (every live
//! node), `GET /agents` (every seat of the served company, in [`agents`])
//! and `GET /turns/{id}` (a turn's detail from every node's log) answer —
//! the routes are `crewlet-api`'s — and the tables `crewlet fleet` /
//! `crewlet agents` print.
//!
//! Rules, and why:
//! - Membership is the presence leases (`node:*`), nothing else: a node is
//!   in the fleet exactly while its lease is live, so this view cannot
//!   disagree with placement about who is there.
//! - Unknown is never no. A coordination read that fails shows as
//!   `"unknown"` (or `null` where a number was due) with the reason in
//!   `errors`; `/fleet` answers 503 + Retry-After when presence itself
//!   cannot be listed, since then there is nothing true to show.
//! - What a peer did not say is "not reported", never zero: a status field
//!   an older build does not send is `null` in `/fleet` and "not reported"
//!   in `crewlet fleet` (the rule is in `crewlet_coord`'s status module).
//! - Every read is bounded by the fleet read budget
//!   ([`crewlet_history::BUDGET`]): a view a person waits on must end.

pub mod agents;
pub mod budgets;
pub mod memory;
pub mod presence;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crewlet_company::ActiveCompany;
use crewlet_coord::{CoordError, Lease, Survey};
use serde_json::{Value, json};
use tokio::sync::watch;

use crewlet_history::BUDGET;

pub use agents::render_agents;
pub use budgets::render as render_budgets;
pub use memory::render_memory;

/// Why a fleet view could not be given; the text says what to do.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("no company is active on this node; activate one with PUT /config")]
    NoCompany,
    #[error("the fleet's presence leases cannot be listed ({0}); retry shortly")]
    Presence(String),
}

impl FleetError {
    /// A short kind a program can match (the HTTP answer's `error`).
    pub fn kind(&self) -> &'static str {
        match self {
            FleetError::NoCompany => "no_company",
            FleetError::Presence(_) => "presence_unknown",
        }
    }
}

/// The seats paused in the fleet, as this node mirrors them (`None` until
/// first listed).
pub type PausesWatch = watch::Receiver<Option<Arc<BTreeSet<String>>>>;

/// What the fleet views read: presence and the seats' leases, the
/// mailboxes, every node's log, the served company, the pauses.
#[derive(Clone)]
pub struct View {
    node_id: String,
    survey: Survey,
    client: async_nats::Client,
    history: crewlet_history::Reader,
    active: ActiveCompany,
    pauses: PausesWatch,
}

impl View {
    pub fn new(
        node_id: String,
        survey: Survey,
        client: async_nats::Client,
        history: crewlet_history::Reader,
        active: ActiveCompany,
        pauses: PausesWatch,
    ) -> View {
        View {
            node_id,
            survey,
            client,
            history,
            active,
            pauses,
        }
    }

    /// Every live node, with what its presence lease and its status say.
    pub async fn fleet(&self) -> Result<Value, FleetError> {
        fleet(self).await
    }

    /// Every seat of the active company ([`agents`]'s docs).
    pub async fn agents(&self) -> Result<Value, FleetError> {
        agents::agents(self).await
    }

    /// The company's and every seat's token windows, with their ceilings
    /// and what is parked on each; an unreadable counter is an error,
    /// never a zero. `None` when no company is active.
    pub async fn budgets(&self) -> Result<Option<Value>, CoordError> {
        let Some(active) = self.active.current() else {
            return Ok(None);
        };
        self.budgets_of(&active.company).await.map(Some)
    }

    /// [`View::budgets`] of `company` (the one a caller already holds).
    pub async fn budgets_of(
        &self,
        company: &crewlet_company::Company,
    ) -> Result<Value, CoordError> {
        budgets::view(self, company).await
    }

    /// A turn's detail from every node's log, with coverage.
    pub async fn turn(&self, turn_id: &str) -> Value {
        self.history.turn(turn_id).await
    }
}

/// A coordination read within the fleet read budget; running out is an
/// unknown like any other.
pub(crate) async fn bounded<T>(
    read: impl std::future::Future<Output = Result<T, CoordError>>,
) -> Result<T, String> {
    match tokio::time::timeout(BUDGET, read).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "no answer within the {} ms fleet read budget",
            BUDGET.as_millis()
        )),
    }
}

pub(crate) fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The node id in an owner (`NODE/INCARNATION`).
pub(crate) fn node_of(owner: &crewlet_coord::Owner) -> &str {
    owner.as_str().split('/').next().unwrap_or_default()
}

async fn fleet(ctx: &View) -> Result<Value, FleetError> {
    let (nodes, statuses) = futures::join!(
        bounded(ctx.survey.live("node")),
        bounded(ctx.survey.statuses())
    );
    let mut nodes = nodes.map_err(FleetError::Presence)?;
    nodes.sort_by(|a, b| a.name.id().cmp(b.name.id()));
    let mut errors = Vec::new();
    if let Err(e) = &statuses {
        errors.push(json!({"what": "the nodes' applied epochs (status bucket)", "error": e}));
    }
    let rows: Vec<Value> = nodes
        .iter()
        .map(|lease| node_row(ctx, lease, statuses.as_ref().ok()))
        .collect();
    Ok(json!({
        "node": ctx.node_id,
        "nodes": rows,
        "errors": errors,
    }))
}

fn node_row(
    ctx: &View,
    lease: &Lease,
    statuses: Option<&std::collections::BTreeMap<String, Value>>,
) -> Value {
    let id = lease.name.id();
    let status = lease.status.clone().unwrap_or_default();
    let applied = match statuses {
        Some(all) => all
            .get(id)
            .map_or(Value::Null, |s| s["applied_epoch"].clone()),
        None => json!("unknown"),
    };
    let beat = lease.deadline.checked_sub(lease.ttl).unwrap_or(UNIX_EPOCH);
    json!({
        "id": id,
        "owner": lease.owner.as_str(),
        "this_node": lease.owner == *ctx.survey.owner(),
        "roles": status.roles,
        "labels": status.labels,
        "posture": status.posture,
        "draining": status.draining,
        "applied_epoch": applied,
        "seats_held": status.seats_held,
        "turns_in_flight": status.turns_in_flight,
        "duties": status.duties,
        "mcp": status.mcp,
        "started_at_ms": status.started_at_ms,
        "last_beat_ms": ms(beat),
        "deadline_ms": ms(lease.deadline),
        "presence_epoch": lease.epoch,
        "broker": status.broker,
    })
}

/// `crewlet fleet`'s table.
pub fn render_fleet(v: &Value) -> String {
    let now = crewlet_os::now_ms();
    let mut rows = vec![
        [
            "NODE", "ROLES", "POSTURE", "EPOCH", "SEATS", "TURNS", "DUTIES", "MCP", "BEAT",
            "BROKER",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for n in v["nodes"].as_array().into_iter().flatten() {
        let list = |key: &str, field: &str| {
            if n[key].is_null() {
                return NOT_REPORTED.to_owned();
            }
            let names: Vec<&str> = n[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| {
                    if field.is_empty() {
                        x.as_str()
                    } else {
                        x[field].as_str()
                    }
                })
                .collect();
            if names.is_empty() {
                "-".to_owned()
            } else {
                names.join(",")
            }
        };
        let mark = if n["this_node"] == true { "*" } else { "" };
        let broker = &n["broker"];
        rows.push(vec![
            format!("{}{mark}", text(&n["id"])),
            list("roles", ""),
            reported(&n["posture"]),
            text(&n["applied_epoch"]),
            reported(&n["seats_held"]),
            reported(&n["turns_in_flight"]),
            list("duties", "duty"),
            list("mcp", "server"),
            n["last_beat_ms"]
                .as_i64()
                .map_or("-".into(), |b| ago(now, b)),
            if broker.is_null() {
                "-".into()
            } else {
                text(&broker["server_name"])
            },
        ]);
    }
    let mut out = table(&rows);
    for e in v["errors"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "unknown: {}: {}\n",
            text(&e["what"]),
            text(&e["error"])
        ));
    }
    out
}

/// What the table says of a status field a peer did not send.
const NOT_REPORTED: &str = "not reported";

/// A peer's status field as a cell: null is a field it did not send.
fn reported(v: &Value) -> String {
    if v.is_null() {
        NOT_REPORTED.to_owned()
    } else {
        text(v)
    }
}

/// A JSON value as a cell: strings bare, null as `-`.
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn ago(now: i64, at: i64) -> String {
    let d = Duration::from_millis(now.saturating_sub(at).max(0) as u64);
    format!("{:.1}s ago", d.as_secs_f64())
}

/// Left-aligned columns, two spaces apart.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_table_names_every_node_and_what_is_unknown() {
        let v = json!({
            "nodes": [
                {"id": "n1", "this_node": true, "roles": ["ingress", "seats"], "posture": "serve",
                 "applied_epoch": 3, "seats_held": 2, "turns_in_flight": 0,
                 "duties": [{"duty": "scheduler"}], "mcp": [], "last_beat_ms": 0,
                 "broker": {"server_name": "nats-a"}},
                {"id": "n2", "roles": ["seats"], "posture": "wait", "applied_epoch": "unknown",
                 "seats_held": 1, "turns_in_flight": 1, "duties": [], "mcp": [{"server": "gh"}],
                 "broker": null},
                {"id": "n3", "roles": ["seats"], "posture": null, "applied_epoch": null,
                 "seats_held": null, "turns_in_flight": null, "duties": null, "mcp": null,
                 "broker": null}
            ],
            "errors": [{"what": "the nodes' applied epochs", "error": "timed out"}]
        });
        let out = render_fleet(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("NODE "), "{out}");
        assert!(
            lines[1].starts_with("n1* ")
                && lines[1].contains("scheduler")
                && lines[1].contains("nats-a"),
            "{out}"
        );
        assert!(
            lines[2].starts_with("n2 ") && lines[2].contains("unknown") && lines[2].contains("gh"),
            "{out}"
        );
        // A peer that did not say: "not reported" in every such column
        // (posture, seats, turns, duties, mcp), never 0.
        assert!(lines[3].starts_with("n3 "), "{out}");
        assert_eq!(lines[3].matches("not reported").count(), 5, "{out}");
        assert!(!lines[3].contains(" 0 "), "{out}");
        assert!(
            lines[4].starts_with("unknown: the nodes' applied epochs: timed out"),
            "{out}"
        );
    }
}
