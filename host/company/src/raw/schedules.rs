//! `[schedules.NAME]`: prompts the company sends its seats on a clock.
//!
//! A schedule names one seat, or a role (one fire per seat of the role, the
//! seats as the document has them), a cron expression read on the wall
//! clock of its time zone (its own, or `org.timezone`; the DST rule is
//! `crewlet-schedule`'s), a prompt, where the result goes, and what to do
//! with fires missed while no node held the scheduler duty.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::raw::{Errors, bounded, non_empty, time_zone};
use crate::{
    CatchUp, Cron, DEFAULT_CATCH_UP_LIMIT, Delivery, Handle, MAX_CATCH_UP_LIMIT, MAX_PROMPT_BYTES,
    Role, Schedule, ScheduleTarget, Seat,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSchedule {
    cron: String,
    seat: Option<String>,
    role: Option<String>,
    prompt: String,
    timezone: Option<String>,
    deliver: Option<RawDelivery>,
    catch_up: Option<String>,
    catch_up_limit: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDelivery {
    channel: String,
    thread: Option<String>,
}

/// The company's clocks, read on the validated roles and seats; `org_tz`
/// is `org.timezone` as written and, if it names a zone, that zone.
pub(crate) fn validate(
    raw: BTreeMap<String, RawSchedule>,
    org_tz: (&str, Option<&jiff::tz::TimeZone>),
    roles: &BTreeMap<String, Role>,
    seats: &BTreeMap<Handle, Seat>,
    errors: &mut Errors,
) -> BTreeMap<String, Schedule> {
    let mut schedules = BTreeMap::new();
    for (name, s) in raw {
        let path = format!("schedules.{name}");
        let named = errors.check(
            path.clone(),
            Handle::parse(&name).map_err(|e| format!("a schedule is named like a seat: {e}")),
        );
        let cron = errors.check(
            format!("{path}.cron"),
            Cron::parse(&s.cron).map_err(|e| e.to_string()),
        );
        let zone = match &s.timezone {
            Some(own) => errors
                .check(format!("{path}.timezone"), time_zone(own))
                .map(|tz| (own.clone(), tz)),
            // A bad `org.timezone` is reported there.
            None => org_tz.1.map(|tz| (org_tz.0.to_owned(), tz.clone())),
        };
        let target = target(&path, s.seat, s.role, roles, seats, errors);
        let prompt = errors.check(format!("{path}.prompt"), prompt(&s.prompt));
        let deliver = s.deliver.map(|d| {
            errors.check(
                format!("{path}.deliver.channel"),
                non_empty(&d.channel, "a channel"),
            );
            if let Some(thread) = &d.thread {
                errors.check(
                    format!("{path}.deliver.thread"),
                    non_empty(thread, "a thread (or leave the key out)"),
                );
            }
            Delivery {
                channel: d.channel,
                thread: d.thread,
            }
        });
        let catch_up = catch_up(&path, s.catch_up.as_deref(), s.catch_up_limit, errors);
        let (Some(_), Some(cron), Some((timezone, tz)), Some((target, seats)), Some(())) =
            (named, cron, zone, target, prompt)
        else {
            continue;
        };
        schedules.insert(
            name.clone(),
            Schedule {
                name,
                cron,
                timezone,
                tz,
                target,
                seats,
                prompt: s.prompt,
                deliver,
                catch_up,
            },
        );
    }
    schedules
}

/// Exactly one of `seat` and `role`, naming one the document has, and the
/// seats a fire wakes.
fn target(
    path: &str,
    seat: Option<String>,
    role: Option<String>,
    roles: &BTreeMap<String, Role>,
    seats: &BTreeMap<Handle, Seat>,
    errors: &mut Errors,
) -> Option<(ScheduleTarget, Vec<Handle>)> {
    match (seat, role) {
        (Some(seat), None) => {
            let path = format!("{path}.seat");
            let handle = errors.check(path.clone(), Handle::parse(&seat))?;
            if !seats.contains_key(&handle) {
                let known: Vec<&str> = seats.keys().map(Handle::as_str).collect();
                errors.add(
                    path,
                    format!("no seat {seat:?} in `seats` ({})", list(&known)),
                );
                return None;
            }
            Some((ScheduleTarget::Seat(handle.clone()), vec![handle]))
        }
        (None, Some(role)) => {
            let path = format!("{path}.role");
            if !roles.contains_key(&role) {
                let known: Vec<&str> = roles.keys().map(String::as_str).collect();
                errors.add(
                    path,
                    format!("no role {role:?} in `roles` ({})", list(&known)),
                );
                return None;
            }
            let holders: Vec<Handle> = seats
                .values()
                .filter(|s| s.role == role)
                .map(|s| s.handle.clone())
                .collect();
            if holders.is_empty() {
                errors.add(
                    path,
                    format!(
                        "no seat has the role {role:?}, so the schedule would never wake anyone: add a seat with it or remove the schedule"
                    ),
                );
                return None;
            }
            Some((ScheduleTarget::Role(role), holders))
        }
        (Some(_), Some(_)) => {
            errors.add(
                path,
                "give either `seat` (one seat) or `role` (one fire per seat of the role), not both",
            );
            None
        }
        (None, None) => {
            errors.add(
                path,
                "expected `seat` (one seat) or `role` (one fire per seat of the role)",
            );
            None
        }
    }
}

fn list(known: &[&str]) -> String {
    if known.is_empty() {
        "there are none".into()
    } else {
        format!("known: {}", known.join(", "))
    }
}

fn prompt(text: &str) -> Result<(), String> {
    non_empty(text, "a prompt")?;
    if text.len() > MAX_PROMPT_BYTES {
        return Err(format!(
            "the prompt is {} bytes, over the {MAX_PROMPT_BYTES} a schedule takes: put standing instructions in the role's `system_prompt` and keep the schedule's prompt to the task",
            text.len()
        ));
    }
    Ok(())
}

fn catch_up(path: &str, policy: Option<&str>, limit: Option<i64>, errors: &mut Errors) -> CatchUp {
    let limit_path = format!("{path}.catch_up_limit");
    let policy = match policy {
        None | Some("latest") => CatchUp::Latest,
        Some("none") => CatchUp::None,
        Some("all") => {
            return CatchUp::All {
                limit: bounded(
                    limit_path,
                    limit,
                    DEFAULT_CATCH_UP_LIMIT,
                    MAX_CATCH_UP_LIMIT,
                    errors,
                ),
            };
        }
        Some(other) => {
            errors.add(
                format!("{path}.catch_up"),
                format!(
                    "expected \"latest\" (the most recent missed fire once; the default), \"none\" (skip missed fires) or \"all\" (the most recent `catch_up_limit` of them), found {other:?}"
                ),
            );
            CatchUp::Latest
        }
    };
    if limit.is_some() {
        errors.add(
            limit_path,
            "`catch_up_limit` applies to `catch_up = \"all\"` only: set that or leave the limit out",
        );
    }
    policy
}
