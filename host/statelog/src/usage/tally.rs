//! From a node's own events to its usage objects: the whole value of each
//! (kind, day, seat or schedule) the events cover. Pure: the node reads
//! its event log and hands the events in.

use std::collections::BTreeMap;

use compact_str::CompactString;
use serde_json::Value;

use super::{ScheduleObject, TokensObject, TurnsObject, UsageObject};

/// The event kinds usage is counted from.
pub const USAGE_EVENT_KINDS: [&str; 3] = ["model_call", "turn_ended", "schedule_fired"];

/// One event of the node's log, as far as usage reads it.
#[derive(Debug, Clone)]
pub struct UsageEvent {
    pub kind: String,
    pub at_ms: i64,
    pub seat: Option<String>,
    pub payload: Value,
}

fn text(v: &Value, field: &str) -> Text {
    v.get(field).and_then(Value::as_str).unwrap_or("").into()
}

fn count(v: &Value, field: &str) -> u64 {
    v.get(field).and_then(Value::as_u64).unwrap_or(0)
}

/// The company day `at_ms` falls on in `zone`.
pub fn company_day(at_ms: i64, zone: &jiff::tz::TimeZone) -> String {
    jiff::Timestamp::from_millisecond(at_ms)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_zoned(zone.clone())
        .date()
        .to_string()
}

/// The objects' own text type (short strings held inline).
type Text = CompactString;

/// Day, seat, phase, model and provider slot (unsaid: `None`).
type TokenKey = (Text, Text, Text, Text, Option<Text>);

/// A node's running usage: every event added once, the objects read off
/// whole. Seeded at start from the node's log for the days it still owns,
/// so a restarted node publishes each day's whole value again.
#[derive(Debug, Default)]
pub struct Tally {
    tokens: BTreeMap<TokenKey, (u64, u64, u64)>,
    turns: BTreeMap<(Text, Text, Text), u64>,
    fires: BTreeMap<(Text, Text, Text), u64>,
}

impl Tally {
    /// Counts one event (a kind usage does not read is ignored).
    pub fn add(&mut self, e: &UsageEvent, zone: &jiff::tz::TimeZone) {
        let day = Text::from(company_day(e.at_ms, zone));
        let seat = Text::from(e.seat.as_deref().unwrap_or_default());
        match e.kind.as_str() {
            "model_call" => {
                let t = self
                    .tokens
                    .entry((
                        day,
                        seat,
                        text(&e.payload, "phase"),
                        text(&e.payload, "model"),
                        e.payload
                            .get("slot")
                            .and_then(Value::as_str)
                            .map(Text::from),
                    ))
                    .or_default();
                t.0 += 1;
                t.1 += count(&e.payload, "input_tokens");
                t.2 += count(&e.payload, "output_tokens");
            }
            "turn_ended" => {
                *self
                    .turns
                    .entry((day, seat, text(&e.payload, "outcome")))
                    .or_default() += 1;
            }
            "schedule_fired" => {
                let seat = match text(&e.payload, "seat") {
                    s if s.is_empty() => seat,
                    s => s,
                };
                *self
                    .fires
                    .entry((day, text(&e.payload, "schedule"), seat))
                    .or_default() += 1;
            }
            _ => {}
        }
    }

    /// Starts from values this node published before (a node without
    /// `data` has no log to count its day again from): each object's value
    /// as it stands, the events added after it.
    pub fn resume(&mut self, objects: impl IntoIterator<Item = UsageObject>) {
        for o in objects {
            match o {
                UsageObject::Tokens(t) => {
                    self.tokens.insert(
                        (t.day, t.seat, t.phase, t.model, t.slot),
                        (t.calls, t.input_tokens, t.output_tokens),
                    );
                }
                UsageObject::Turns(t) => {
                    self.turns.insert((t.day, t.seat, t.outcome), t.turns);
                }
                UsageObject::Schedule(s) => {
                    self.fires.insert((s.day, s.schedule, s.seat), s.fires);
                }
            }
        }
    }

    /// Forgets the days before `day` (published already; no event of this
    /// node moves them any more).
    pub fn forget_before(&mut self, day: &str) {
        self.tokens.retain(|k, _| k.0.as_str() >= day);
        self.turns.retain(|k, _| k.0.as_str() >= day);
        self.fires.retain(|k, _| k.0.as_str() >= day);
    }

    /// Every object, each its whole value, for `node`; `role_of` names a
    /// seat's role (empty for a seat the company no longer has).
    pub fn objects(&self, node: &str, role_of: impl Fn(&str) -> String) -> Vec<UsageObject> {
        let mut out = Vec::new();
        for ((day, seat, phase, model, slot), (calls, input_tokens, output_tokens)) in &self.tokens
        {
            out.push(UsageObject::Tokens(TokensObject {
                node: node.into(),
                role: role_of(seat).into(),
                day: day.clone(),
                seat: seat.clone(),
                phase: phase.clone(),
                model: model.clone(),
                slot: slot.clone(),
                calls: *calls,
                input_tokens: *input_tokens,
                output_tokens: *output_tokens,
            }));
        }
        for ((day, seat, outcome), n) in &self.turns {
            out.push(UsageObject::Turns(TurnsObject {
                node: node.into(),
                role: role_of(seat).into(),
                day: day.clone(),
                seat: seat.clone(),
                outcome: outcome.clone(),
                turns: *n,
            }));
        }
        for ((day, schedule, seat), n) in &self.fires {
            out.push(UsageObject::Schedule(ScheduleObject {
                node: node.into(),
                day: day.clone(),
                schedule: schedule.clone(),
                seat: seat.clone(),
                fires: *n,
            }));
        }
        out
    }
}

/// Every object `events` add up to, for `node` (a [`Tally`] of them).
pub fn tally(
    events: impl IntoIterator<Item = UsageEvent>,
    zone: &jiff::tz::TimeZone,
    node: &str,
    role_of: impl Fn(&str) -> String,
) -> Vec<UsageObject> {
    let mut t = Tally::default();
    for e in events {
        t.add(&e, zone);
    }
    t.objects(node, role_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(kind: &str, at_ms: i64, seat: &str, payload: Value) -> UsageEvent {
        UsageEvent {
            kind: kind.into(),
            at_ms,
            seat: Some(seat.into()),
            payload,
        }
    }

    #[test]
    fn events_add_up_per_company_day_seat_phase_and_model() {
        // 2026-12-06T23:30Z is the 7th in Berlin.
        let late = 1_796_599_800_000;
        let zone = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
        let call = |i, o| json!({"phase": "executor", "model": "m1", "input_tokens": i, "output_tokens": o});
        let objects = tally(
            [
                ev("model_call", late, "ada", call(10, 2)),
                ev("model_call", late + 1, "ada", call(5, 1)),
                ev("turn_ended", late + 2, "ada", json!({"outcome": "done"})),
                ev(
                    "schedule_fired",
                    late + 3,
                    "ada",
                    json!({"schedule": "standup", "seat": "ada"}),
                ),
                ev("tool_call", late + 4, "ada", json!({})),
            ],
            &zone,
            "n1",
            |s| format!("role-of-{s}"),
        );
        assert_eq!(objects.len(), 3, "{objects:?}");
        let UsageObject::Tokens(t) = &objects[0] else {
            panic!("{objects:?}")
        };
        assert_eq!(
            (t.day.as_str(), t.calls, t.input_tokens, t.output_tokens),
            ("2026-12-07", 2, 15, 3)
        );
        assert_eq!(t.role, "role-of-ada");
        let UsageObject::Turns(u) = &objects[1] else {
            panic!()
        };
        assert_eq!((u.outcome.as_str(), u.turns), ("done", 1));
        let UsageObject::Schedule(f) = &objects[2] else {
            panic!()
        };
        assert_eq!((f.schedule.as_str(), f.fires), ("standup", 1));
        assert_ne!(objects[0].subject(), objects[1].subject());
        assert!(
            objects[0]
                .subject()
                .starts_with("crewlet.usage.log.tokens.n1.2026-12-07.")
        );
    }
}
