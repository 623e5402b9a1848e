//! `GET /budgets`: the live token windows of the company and every seat.
//!
//! Rule: the answer is read from the fleet's counters (leader reads), so
//! every node answers the same numbers; an unreachable counter is a 503,
//! never a zero — a reader must not take "unknown" for "nothing spent".

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use crewlet_api::retry_later;
use crewlet_company::{Ceilings, Company};
use crewlet_coord::{BudgetSlot, BudgetView, Coord, CoordError, Period, Scope};
use serde_json::{Value, json};

use crate::engine::Late;

pub fn routes(late: Late) -> Router {
    Router::new()
        .route("/budgets", get(get_budgets))
        .with_state(late)
}

fn unavailable(error: &str, detail: String) -> Response {
    retry_later(crewlet_api::OPERATOR_RETRY_SECONDS, error, detail)
}

async fn get_budgets(State(late): State<Late>) -> Response {
    let Some(ctx) = late.get() else {
        return unavailable("starting", "the node's engine is not up yet".into());
    };
    let Some(active) = ctx.active.current() else {
        return unavailable("no_company", "no company is active on this node".into());
    };
    match view(&ctx.coord, &active.company).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => unavailable("budgets_unavailable", e.to_string()),
    }
}

/// The company's and every seat's windows, with their ceilings.
pub async fn view(coord: &Coord, company: &Company) -> Result<Value, CoordError> {
    let windows = crewlet_turns::windows_now(company);
    let mut scopes = vec![(Scope::Company, "company".to_owned(), company.budget)];
    for seat in company.seats.values() {
        let caps = company.role_of(seat).budget;
        scopes.push((
            Scope::Seat(seat.handle.to_string()),
            format!("seat:{}", seat.handle),
            caps,
        ));
    }
    let reads = scopes
        .iter()
        .map(|(scope, _, _)| coord.budget(scope, &windows));
    let views = futures::future::join_all(reads).await;
    let mut out = Vec::new();
    for ((_, name, caps), v) in scopes.iter().zip(views) {
        out.push(json!({ "scope": name, "windows": windows_json(&v?, caps) }));
    }
    Ok(json!({ "org": company.org, "timezone": company.timezone, "scopes": out }))
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
                if w["refused_at_ms"].is_null() {
                    ""
                } else {
                    "  refused"
                }
            ));
        }
    }
    s
}
