//! The usage domain (`CREWLET_USAGE_LOG`): what each node's seats and
//! schedules did each company day.
//!
//! Rule: one message per (kind, node, day, seat or schedule), each the
//! object's whole cumulative value, republished by the node that owns the
//! day whenever it moves. Why: the node is in the subject, so each object
//! has one writer and nothing is arbitrated; a node that restarts and
//! publishes the same day again replaces its value rather than adding to
//! it, so nothing is counted twice. Rows are kept 181 days, aged out by
//! the applier.

mod publish;
mod query;
mod tally;

use std::time::Duration;

use compact_str::CompactString;
use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::{Change, Domain, Writes};
use crate::record::{Incoming, Record, Undecodable};

pub use publish::{UsagePublisher, published};
pub use query::{By, Period, UsageQuery, UsageRow};
pub use tally::{Tally, USAGE_EVENT_KINDS, UsageEvent, company_day, tally};

/// How long usage is kept: the stream's age and the applier's horizon.
pub const USAGE_DAYS: i64 = 181;

/// Tokens one seat spent on one day, by phase, model and provider slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokensObject {
    pub node: CompactString,
    pub day: CompactString,
    pub seat: CompactString,
    pub role: CompactString,
    pub phase: CompactString,
    pub model: CompactString,
    /// The provider slot that served the calls (`provider/model#key-hint`);
    /// `None` where the calls' events did not say (an older build's), and
    /// absent from the record then, so an older build reads it as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<CompactString>,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Turns one seat ended on one day with one outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TurnsObject {
    pub node: CompactString,
    pub day: CompactString,
    pub seat: CompactString,
    pub role: CompactString,
    pub outcome: CompactString,
    pub turns: u64,
}

/// Fires of one schedule for one seat on one day.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScheduleObject {
    pub node: CompactString,
    pub day: CompactString,
    pub schedule: CompactString,
    pub seat: CompactString,
    pub fires: u64,
}

/// One usage object: a kind and its whole cumulative value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UsageObject {
    Tokens(TokensObject),
    Turns(TurnsObject),
    Schedule(ScheduleObject),
}

impl UsageObject {
    fn kind(&self) -> &'static str {
        match self {
            UsageObject::Tokens(_) => "tokens",
            UsageObject::Turns(_) => "turns",
            UsageObject::Schedule(_) => "schedule_runs",
        }
    }

    /// The company day the object counts.
    pub fn day(&self) -> &str {
        match self {
            UsageObject::Tokens(o) => &o.day,
            UsageObject::Turns(o) => &o.day,
            UsageObject::Schedule(o) => &o.day,
        }
    }

    /// The subject this object rides: its writer, its day, and a digest of
    /// the rest of its identity.
    pub fn subject(&self) -> String {
        let (node, day, identity) = match self {
            UsageObject::Tokens(o) => (&o.node, &o.day, {
                let mut id = format!("{}\0{}\0{}", o.seat, o.phase, o.model);
                // Unsaid: the subject an older build gave the object.
                if let Some(slot) = &o.slot {
                    id = format!("{id}\0{slot}");
                }
                id
            }),
            UsageObject::Turns(o) => (&o.node, &o.day, format!("{}\0{}", o.seat, o.outcome)),
            UsageObject::Schedule(o) => (&o.node, &o.day, format!("{}\0{}", o.schedule, o.seat)),
        };
        let digest = Sha256::digest(identity.as_bytes());
        let key: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        crewlet_bus::usage_subject(self.kind(), node, day, &key)
    }

    /// The object a record carries (the reverse of [`UsageObject::record`]).
    pub fn from_record(record: &Incoming) -> Result<UsageObject, Undecodable> {
        Ok(match record.kind.as_str() {
            "tokens" => UsageObject::Tokens(record.body()?),
            "turns" => UsageObject::Turns(record.body()?),
            "schedule_runs" => UsageObject::Schedule(record.body()?),
            other => {
                return Err(Undecodable(format!(
                    "usage record kind `{other}` is unknown to this build: upgrade this node"
                )));
            }
        })
    }

    /// The record carrying this object's whole value.
    pub fn record(&self) -> Record {
        let body = match self {
            UsageObject::Tokens(o) => serde_json::to_value(o),
            UsageObject::Turns(o) => serde_json::to_value(o),
            UsageObject::Schedule(o) => serde_json::to_value(o),
        }
        .unwrap_or_default();
        Record::new(self.kind(), body)
    }
}

static WRITE_TOKENS: &str = "INSERT OR REPLACE INTO usage_tokens
   (node, day, seat, role, phase, model, slot, calls, input_tokens, output_tokens)
 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
static WRITE_TURNS: &str =
    "INSERT OR REPLACE INTO usage_turns (node, day, seat, role, outcome, turns)
 VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
static WRITE_SCHEDULE: &str =
    "INSERT OR REPLACE INTO usage_schedule_runs (node, day, schedule, seat, fires)
 VALUES (?1, ?2, ?3, ?4, ?5)";

/// Each object is one row, its whole value replacing the one before.
impl Change for UsageObject {
    fn write(&self, w: &mut Writes<'_>) -> rusqlite::Result<()> {
        match self {
            UsageObject::Tokens(o) => {
                w.statement(WRITE_TOKENS)?.execute(params![
                    o.node.as_str(),
                    o.day.as_str(),
                    o.seat.as_str(),
                    o.role.as_str(),
                    o.phase.as_str(),
                    o.model.as_str(),
                    o.slot.as_deref().unwrap_or(""),
                    o.calls as i64,
                    o.input_tokens as i64,
                    o.output_tokens as i64
                ])?;
            }
            UsageObject::Turns(o) => {
                w.statement(WRITE_TURNS)?.execute(params![
                    o.node.as_str(),
                    o.day.as_str(),
                    o.seat.as_str(),
                    o.role.as_str(),
                    o.outcome.as_str(),
                    o.turns as i64
                ])?;
            }
            UsageObject::Schedule(o) => {
                w.statement(WRITE_SCHEDULE)?.execute(params![
                    o.node.as_str(),
                    o.day.as_str(),
                    o.schedule.as_str(),
                    o.seat.as_str(),
                    o.fires as i64
                ])?;
            }
        }
        Ok(())
    }
}

/// The usage domain, as the applier sees it.
pub struct Usage;

impl Domain for Usage {
    fn name(&self) -> &'static str {
        "usage"
    }

    fn stream(&self) -> &'static str {
        crewlet_bus::USAGE_LOG_STREAM
    }

    fn prefix(&self) -> &'static str {
        crewlet_bus::USAGE_LOG_PREFIX
    }

    fn compacted(&self) -> bool {
        true
    }

    fn max_age(&self) -> Option<Duration> {
        Some(Duration::from_secs(USAGE_DAYS as u64 * 24 * 3600))
    }

    fn decode(&self, record: &Incoming) -> Result<Box<dyn Change>, Undecodable> {
        Ok(Box::new(UsageObject::from_record(record)?))
    }

    fn age_out(&self, tx: &Connection, now_ms: i64) -> rusqlite::Result<()> {
        let cutoff = horizon_day(now_ms);
        for table in ["usage_tokens", "usage_turns", "usage_schedule_runs"] {
            tx.execute(&format!("DELETE FROM {table} WHERE day < ?1"), [&cutoff])?;
        }
        Ok(())
    }
}

/// The oldest day kept at `now_ms` (UTC; a company day a zone away is
/// kept or dropped a day apart, well inside the horizon's purpose).
pub fn horizon_day(now_ms: i64) -> String {
    let now = jiff::Timestamp::from_millisecond(now_ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let day = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    day.checked_sub(jiff::Span::new().days(USAGE_DAYS))
        .unwrap_or(day)
        .to_string()
}
