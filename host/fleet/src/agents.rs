//! `GET /agents`: every seat of the served company — its role, placement
//! group, holder node, state, turns in flight and mailbox depth.
//!
//! A seat's state is one of:
//! - `paused`: a pause record names it (whoever holds it; its wakes wait);
//! - `parked`: held, with wakes in its mailbox and a budget window (its own
//!   or the company's) without room for a token or with a standing refusal
//!   (`crewlet_turns::parked_on`), so its mailbox takes nothing until the
//!   window turns over or a cap is raised; `reason` says
//!   `budget: day window until …` on the company's clock (the counters are
//!   read only for seats with waiting wakes; unreadable → `unknown`);
//! - `held`: a live seat lease whose owner is a live node (the very
//!   incarnation on the presence lease);
//! - `hydrating`: held, but its holder says it could not read the seat's
//!   memory yet (`memory_unread` on its presence): its mailbox stays
//!   detached, its wakes wait, and `reason` says why;
//! - `stale`: a live seat lease whose owner is not in presence, or whose
//!   last renew is a seat beat (half the lease TTL) older than the
//!   freshest presence beat (both write times on the broker's clock, never
//!   this node's; the holder froze, died or
//!   restarted, and the lease has not lapsed yet: by the holder rule it no
//!   longer admits work; a lapsed lease is gone from the leases bucket,
//!   whose age is the lease TTL);
//! - `unplaced`: no live seat lease, with a `reason`: the seat's group is
//!   pinned to labels no live seat node carries (naming the pin and the
//!   nodes seen), no live node runs seats, or it waits for a node with
//!   room to claim it;
//! - `unknown`: a read this depends on did not answer — never collapsed
//!   into "not paused" or "not held"; the reason is in `errors`.
//!
//! `mailbox` is the durable's pending and in-work counts, `"missing"` when
//! the (complete) consumer listing has no mailbox for the seat, `null` when
//! the listing did not answer.
//!
//! Turns in flight are the holder's to say (they are in its own event
//! log), asked over the fleet's history read; a holder that did not answer
//! gives `null`, and the read's coverage is in `turns_coverage`.

use std::collections::{BTreeMap, HashSet};

use crewlet_company::PlacementGroup;
use crewlet_coord::{Lease, NodeStatus};
use serde_json::{Value, json};

use super::{FleetError, View, bounded, node_of, table, text};
use crewlet_history::Ask;

/// Every seat of the active company, as the module docs describe.
pub(crate) async fn agents(ctx: &View) -> Result<Value, FleetError> {
    let active = ctx.active.current().ok_or(FleetError::NoCompany)?;
    let js = async_nats::jetstream::new(ctx.client.clone());
    let depths = async {
        match tokio::time::timeout(crewlet_history::BUDGET, crewlet_stream::mailbox_depths(&js))
            .await
        {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("the mailbox listing did not answer within the fleet read budget".into()),
        }
    };
    let (seats, nodes, depths, open) = futures::join!(
        bounded(ctx.survey.live("seat")),
        bounded(ctx.survey.live("node")),
        depths,
        ctx.history.gather(Ask::OpenTurns, None),
    );
    let pauses = ctx.pauses.borrow().clone();
    let parks = parks(ctx, &active.company, depths.as_ref().ok()).await;
    let mut errors = Vec::new();
    let mut unknown = |what: &str, e: &String| errors.push(json!({"what": what, "error": e}));
    if let Err(e) = &seats {
        unknown("the seat leases", e);
    }
    if let Err(e) = &nodes {
        unknown("the presence leases", e);
    }
    if let Err(e) = &depths {
        unknown("the mailbox depths", e);
    }
    if let Err(e) = &parks {
        unknown("the budget counters", e);
    }
    if pauses.is_none() {
        unknown(
            "the seat pauses",
            &"this node's pauses watch has not listed them yet".to_owned(),
        );
    }
    let holders: Option<BTreeMap<&str, &Lease>> = seats
        .as_ref()
        .ok()
        .map(|all| all.iter().map(|l| (l.name.id(), l)).collect());
    let live: Option<HashSet<&str>> = nodes
        .as_ref()
        .ok()
        .map(|all| all.iter().map(|l| l.owner.as_str()).collect());
    // Open turns by (node, seat), from the nodes that answered.
    let mut in_turn: BTreeMap<(String, String), u32> = BTreeMap::new();
    for told in &open.told {
        for t in &told.open_turns {
            if let Some(seat) = &t.seat {
                *in_turn
                    .entry((told.node.clone(), seat.clone()))
                    .or_default() += 1;
            }
        }
    }
    let answered: HashSet<&str> = open.told.iter().map(|t| t.node.as_str()).collect();
    // "Now" on the broker's clock: the freshest presence beat in the fleet
    // (every live node beats each heartbeat), so a node whose own clock
    // runs off does not call every seat stale, or none.
    let beat = |l: &Lease| l.deadline.checked_sub(l.ttl).unwrap_or(l.deadline);
    let now = nodes
        .as_ref()
        .ok()
        .and_then(|all| all.iter().map(beat).max())
        .unwrap_or_else(std::time::SystemTime::now);
    // The holder stops admitting a seat beat after its last good renew;
    // "now" here is never later than the broker's, so a seat called stale
    // is one its holder no longer admits on.
    let missed = ctx.survey.seat_beat();
    let renewed_lately = |l: &Lease| now.duration_since(beat(l)).unwrap_or_default() <= missed;
    // What each live node says about itself, by node id.
    let statuses: BTreeMap<&str, &NodeStatus> = nodes
        .as_ref()
        .map(|all| {
            all.iter()
                .filter_map(|l| Some((l.name.id(), l.status.as_ref()?)))
                .collect()
        })
        .unwrap_or_default();
    // Live seat nodes and their labels, for why a seat is unplaced.
    let seat_nodes: Option<Vec<(&str, &NodeStatus)>> = nodes.as_ref().ok().map(|all| {
        all.iter()
            .filter_map(|l| Some((l.name.id(), l.status.as_ref()?)))
            .filter(|(_, s)| s.roles.iter().any(|r| r == "seats") && !s.says_draining())
            .collect()
    });
    let mut rows = Vec::new();
    for seat in active.company.seats.values() {
        let handle = seat.handle.as_str();
        let lease = holders.as_ref().map(|h| h.get(handle).copied());
        let paused = pauses.as_ref().map(|p| p.contains(handle));
        let state = match (paused, lease) {
            (Some(true), _) => "paused",
            (None, _) | (_, None) => "unknown",
            (Some(false), Some(None)) => "unplaced",
            (Some(false), Some(Some(l))) => match &live {
                Some(live) if live.contains(l.owner.as_str()) && renewed_lately(l) => "held",
                Some(_) => "stale",
                None => "unknown",
            },
        };
        let holder = match lease {
            Some(Some(l)) => json!({
                "node": node_of(&l.owner),
                "owner": l.owner.as_str(),
                "epoch": l.epoch,
                "deadline_ms": super::ms(l.deadline),
            }),
            _ => Value::Null,
        };
        let turns = match lease {
            Some(None) => json!(0),
            Some(Some(l)) if answered.contains(node_of(&l.owner)) => {
                let key = (node_of(&l.owner).to_owned(), handle.to_owned());
                json!(in_turn.get(&key).copied().unwrap_or(0))
            }
            _ => Value::Null,
        };
        let mailbox = match &depths {
            Ok(d) => d
                .get(&crewlet_bus::mailbox_durable(handle))
                .map_or(json!("missing"), |d| json!(d)),
            Err(_) => Value::Null,
        };
        let park = match &parks {
            Ok(p) => Some(p.get(handle)),
            Err(_) => None,
        };
        let unread = lease
            .flatten()
            .and_then(|l| statuses.get(node_of(&l.owner)))
            .and_then(|s| s.memory_unread.as_ref()?.get(handle));
        let state = match (state, park) {
            ("held", _) if unread.is_some() => "hydrating",
            ("held", Some(Some(_))) => "parked",
            ("held", None) => "unknown",
            (s, _) => s,
        };
        let reason = match (state, &seat_nodes) {
            ("unplaced", Some(seat_nodes)) => {
                json!(unplaced_reason(active.company.pin_of(seat), seat_nodes))
            }
            ("parked", _) => json!(park.flatten()),
            ("hydrating", _) => json!(format!(
                "its memory could not be read yet ({}); its mailbox is attached once it is, asked again with backoff",
                unread.map_or("", String::as_str)
            )),
            _ => Value::Null,
        };
        rows.push(json!({
            "handle": handle,
            "role": seat.role,
            "group": seat.group,
            "identities": seat.identities,
            "holder": holder,
            "state": state,
            "reason": reason,
            "paused": paused,
            "turns_in_flight": turns,
            "mailbox": mailbox,
        }));
    }
    Ok(json!({
        "org": active.company.org,
        "epoch": active.epoch,
        "node": ctx.node_id,
        "agents": rows,
        "turns_coverage": open.coverage,
        "errors": errors,
    }))
}

/// The seats with waiting wakes whose budget has no room, with why (see the
/// module docs); the counters are read only for those seats.
async fn parks(
    ctx: &View,
    company: &crewlet_company::Company,
    depths: Option<&BTreeMap<String, crewlet_stream::MailboxDepth>>,
) -> Result<BTreeMap<String, String>, String> {
    let Some(depths) = depths else {
        return Ok(BTreeMap::new());
    };
    let waiting: Vec<&crewlet_company::Seat> = company
        .seats
        .values()
        .filter(|s| {
            depths
                .get(&crewlet_bus::mailbox_durable(s.handle.as_str()))
                .is_some_and(|d| d.pending + d.in_work > 0)
        })
        .collect();
    let now = crewlet_os::wall_now();
    let budgets = ctx.survey.budgets();
    let reads = waiting
        .iter()
        .map(|seat| crewlet_turns::budget_parked(&budgets, company, seat, now));
    let mut out = BTreeMap::new();
    for (seat, park) in waiting.iter().zip(futures::future::join_all(reads).await) {
        if let Some(park) = park.map_err(|e| e.to_string())? {
            out.insert(seat.handle.to_string(), park.reason(company));
        }
    }
    Ok(out)
}

/// Why a seat no node holds is unplaced, from the live seat nodes.
fn unplaced_reason(pin: Option<&PlacementGroup>, seat_nodes: &[(&str, &NodeStatus)]) -> String {
    let fits: Vec<&str> = seat_nodes
        .iter()
        .filter(|(_, s)| pin.is_none_or(|p| p.admits(&s.labels)))
        .map(|(id, _)| *id)
        .collect();
    match pin {
        _ if !fits.is_empty() => format!(
            "waiting for a node with room to claim it (may run it: {})",
            fits.join(", ")
        ),
        None => "no live node runs seats: start one with the `seats` role".to_owned(),
        Some(p) => {
            let seen: Vec<String> = seat_nodes
                .iter()
                .map(|(id, s)| format!("{id} {{{}}}", pairs(&s.labels)))
                .collect();
            format!(
                "placement group {:?} is pinned to {{{}}} and no live seat node carries those labels (seen: {}); give a node those `[node] labels` or change `placement.groups.{}.labels`",
                p.name,
                pairs(&p.labels),
                if seen.is_empty() {
                    "none".to_owned()
                } else {
                    seen.join(", ")
                },
                p.name
            )
        }
    }
}

fn pairs(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A seat's identities as `surface:id`, every id of every surface
/// (`slack:U04ABCDEF github:acme-ada-bot`); `-` with none.
fn identities(v: &Value) -> String {
    let ids: Vec<String> = v
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(surface, ids)| {
            ids.as_array()
                .into_iter()
                .flatten()
                .map(move |id| format!("{surface}:{}", text(id)))
        })
        .collect();
    if ids.is_empty() {
        "-".to_owned()
    } else {
        ids.join(" ")
    }
}

/// `crewlet agents`' table.
pub fn render_agents(v: &Value) -> String {
    let mut rows = vec![
        [
            "SEAT",
            "ROLE",
            "GROUP",
            "STATE",
            "HOLDER",
            "TURNS",
            "MAILBOX",
            "IDENTITIES",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for a in v["agents"].as_array().into_iter().flatten() {
        let mailbox = match &a["mailbox"] {
            Value::Object(m) => format!(
                "{} waiting, {} in work",
                text(&m["pending"]),
                text(&m["in_work"])
            ),
            other => text(other),
        };
        rows.push(vec![
            text(&a["handle"]),
            text(&a["role"]),
            text(&a["group"]),
            match (a["state"].as_str(), a["reason"].as_str()) {
                (Some("parked"), Some(why)) => format!("parked ({why})"),
                _ => text(&a["state"]),
            },
            text(&a["holder"]["node"]),
            text(&a["turns_in_flight"]),
            mailbox,
            identities(&a["identities"]),
        ]);
    }
    let mut out = table(&rows);
    for a in v["agents"].as_array().into_iter().flatten() {
        if (a["state"] == "unplaced" || a["state"] == "hydrating") && a["reason"].is_string() {
            out.push_str(&format!(
                "{} {}: {}\n",
                text(&a["handle"]),
                text(&a["state"]),
                text(&a["reason"])
            ));
        }
    }
    for m in v["turns_coverage"]["missing"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "turns unknown on {}: {} ({})\n",
            text(&m["node"]),
            text(&m["reason"]),
            text(&m["detail"])
        ));
    }
    for e in v["errors"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "unknown: {}: {}\n",
            text(&e["what"]),
            text(&e["error"])
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unplaced_seat_says_whether_its_pin_matches_no_live_node() {
        let gpu = PlacementGroup {
            name: "gpu".into(),
            labels: [("accel".to_owned(), "gpu".to_owned())].into(),
        };
        let cpu = NodeStatus {
            labels: [("accel".to_owned(), "cpu".to_owned())].into(),
            ..NodeStatus::default()
        };
        let why = unplaced_reason(Some(&gpu), &[("n1", &cpu)]);
        assert!(
            why.contains("pinned to {accel=gpu}") && why.contains("n1 {accel=cpu}"),
            "{why}"
        );
        let why = unplaced_reason(None, &[("n1", &cpu)]);
        assert!(
            why.starts_with("waiting for a node with room") && why.contains("n1"),
            "{why}"
        );
        let why = unplaced_reason(None, &[]);
        assert!(why.contains("no live node runs seats"), "{why}");
    }

    #[test]
    fn the_agents_table_shows_states_and_says_what_is_unknown() {
        let v = json!({
            "agents": [
                {"handle": "ada", "role": "eng", "group": null, "state": "held",
                 "holder": {"node": "n1"}, "turns_in_flight": 1,
                 "mailbox": {"pending": 2, "in_work": 1},
                 "identities": {"github": ["acme-ada-bot"], "slack": ["U04ABCDEF", "B01ADA"]}},
                {"handle": "bob", "role": "eng", "group": "gpu", "state": "unknown",
                 "holder": null, "turns_in_flight": null, "mailbox": null},
                {"handle": "cyd", "role": "eng", "group": null, "state": "hydrating",
                 "reason": "its memory could not be read yet (stream gone)",
                 "holder": {"node": "n1"}, "turns_in_flight": 0,
                 "mailbox": {"pending": 1, "in_work": 0}}
            ],
            "turns_coverage": {"missing": [{"node": "n2", "reason": "timeout", "detail": "no answer"}]},
            "errors": [{"what": "the seat leases", "error": "timed out"}]
        });
        let out = render_agents(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("SEAT "), "{out}");
        assert!(
            lines[1].contains("held")
                && lines[1].contains("n1")
                && lines[1].contains("2 waiting, 1 in work")
                && lines[1].ends_with("github:acme-ada-bot slack:U04ABCDEF slack:B01ADA"),
            "{out}"
        );
        assert!(lines[2].trim_end().ends_with(" -"), "no identities: {out}");
        assert!(
            lines[2].contains("gpu") && lines[2].contains("unknown"),
            "{out}"
        );
        assert!(
            lines[3].contains("hydrating")
                && out.contains("cyd hydrating: its memory could not be read yet (stream gone)"),
            "{out}"
        );
        assert!(
            out.contains("turns unknown on n2: timeout")
                && out.contains("unknown: the seat leases: timed out"),
            "{out}"
        );
    }
}
