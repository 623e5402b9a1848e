//! What `GET /budgets` answers (the route is `crewlet-api`'s; the
//! operator's MCP reads it too): the live token windows of the company and
//! every seat.
//!
//! Rule: the answer is read from the fleet's counters (leader reads), so
//! every node answers the same numbers; an unreachable counter is a 503,
//! never a zero — a reader must not take "unknown" for "nothing spent".
//!
//! `parked` per scope: the seats whose work waits on that scope's full
//! window — a seat with wakes in its mailbox and a window without room for
//! a token or with a standing refusal (`crewlet_turns::parked_on`). Read
//! from the counters and the mailbox depths, so every node answers the same;
//! `null` when the depths did not answer (unknown, never "nothing parked").

use crewlet_company::{Ceilings, Company};
use crewlet_coord::{BudgetSlot, BudgetView, CoordError, Period, Scope};
use serde_json::{Value, json};

use crate::View;

/// The company's and every seat's windows, with their ceilings, and what
/// is parked on each.
pub(crate) async fn view(ctx: &View, company: &Company) -> Result<Value, CoordError> {
    let now = crewlet_os::wall_now();
    let windows = crewlet_turns::windows_at(company, now);
    let mut scopes = vec![(Scope::Company, company.budget)];
    for seat in company.seats.values() {
        scopes.push((
            Scope::Seat(seat.handle.to_string()),
            company.role_of(seat).budget,
        ));
    }
    let budgets = ctx.survey.budgets();
    let reads = scopes
        .iter()
        .map(|(scope, _)| budgets.budget(scope, &windows));
    let js = async_nats::jetstream::new(ctx.client.clone());
    let depths = async {
        tokio::time::timeout(crewlet_history::BUDGET, crewlet_stream::mailbox_depths(&js))
            .await
            .map_err(|_| "the mailbox listing did not answer in time".to_owned())?
            .map_err(|e| e.to_string())
    };
    let (views, depths) = futures::join!(futures::future::join_all(reads), depths);
    let mut read = Vec::new();
    for ((scope, caps), v) in scopes.into_iter().zip(views) {
        read.push((scope, v?, caps));
    }
    // Which scope each seat with waiting wakes is parked on.
    let mut parked: Vec<(Scope, Value)> = Vec::new();
    if let Ok(depths) = &depths {
        for (scope, view, caps) in &read[1..] {
            let Scope::Seat(handle) = scope else { continue };
            let waiting = depths
                .get(&crewlet_bus::mailbox_durable(handle))
                .map_or(0, |d| d.pending + d.in_work);
            let both = [read[0].clone(), (scope.clone(), view.clone(), *caps)];
            if waiting == 0 {
                continue;
            }
            if let Some(park) = crewlet_turns::parked_on(company, &both, now) {
                parked.push((
                    park.scope.clone(),
                    json!({
                        "seat": handle,
                        "wakes": waiting,
                        "period": park.period_name(),
                        "window": park.window,
                        "until": crewlet_turns::company_time(company, park.until),
                        "reason": park.reason(company),
                    }),
                ));
            }
        }
    }
    let mut out = Vec::new();
    for (scope, view, caps) in &read {
        let on_it: Vec<&Value> = parked
            .iter()
            .filter(|(s, _)| s == scope)
            .map(|(_, v)| v)
            .collect();
        out.push(json!({
            "scope": scope_name(scope),
            "windows": windows_json(view, caps),
            "parked": if depths.is_ok() { json!(on_it) } else { Value::Null },
        }));
    }
    let mut answer = json!({ "org": company.org, "timezone": company.timezone, "scopes": out });
    if let Err(e) = depths {
        answer["errors"] = json!([{ "what": "the mailbox depths", "error": e }]);
    }
    Ok(answer)
}

fn scope_name(scope: &Scope) -> String {
    match scope {
        Scope::Company => "company".to_owned(),
        Scope::Seat(h) => format!("seat:{h}"),
    }
}

fn windows_json(view: &BudgetView, caps: &Ceilings) -> Value {
    let one = |p: Period, cap: Option<u64>| {
        let slot: &BudgetSlot = view.slot(p);
        json!({
            "window": slot.label,
            "spent": slot.spent,
            "cap": cap,
            "remaining": cap.map(|c| c.saturating_sub(slot.spent)),
            "refused_at_ms": slot.refused_at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_millis() as u64),
        })
    };
    json!({
        "day": one(Period::Day, caps.day),
        "week": one(Period::Week, caps.week),
        "month": one(Period::Month, caps.month),
    })
}

/// Renders `GET /budgets` for a terminal.
pub fn render(v: &Value) -> String {
    let mut s = format!(
        "{} ({})\n{:<20} {:<8} {:>12} {:>12} {:>12}\n",
        v["org"].as_str().unwrap_or("?"),
        v["timezone"].as_str().unwrap_or("?"),
        "scope",
        "period",
        "spent",
        "cap",
        "remaining"
    );
    let num = |x: &Value| {
        x.as_u64()
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into())
    };
    for scope in v["scopes"].as_array().into_iter().flatten() {
        for p in ["day", "week", "month"] {
            let w = &scope["windows"][p];
            s.push_str(&format!(
                "{:<20} {:<8} {:>12} {:>12} {:>12}{}\n",
                scope["scope"].as_str().unwrap_or("?"),
                w["window"].as_str().unwrap_or(p),
                num(&w["spent"]),
                num(&w["cap"]),
                num(&w["remaining"]),
                // A refusal stamp stays until the next admitted charge;
                // once a raised cap leaves room it is history, not state.
                if w["refused_at_ms"].is_null() || w["remaining"].as_u64().is_none_or(|r| r > 0) {
                    ""
                } else {
                    "  refused"
                }
            ));
        }
    }
    for scope in v["scopes"].as_array().into_iter().flatten() {
        for p in scope["parked"].as_array().into_iter().flatten() {
            s.push_str(&format!(
                "{} parked on {}: {} wake(s), {}\n",
                p["seat"].as_str().unwrap_or("?"),
                scope["scope"].as_str().unwrap_or("?"),
                num(&p["wakes"]),
                p["reason"].as_str().unwrap_or("?"),
            ));
        }
    }
    for e in v["errors"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "unknown: {}: {}\n",
            e["what"].as_str().unwrap_or("?"),
            e["error"].as_str().unwrap_or("?")
        ));
    }
    s
}
