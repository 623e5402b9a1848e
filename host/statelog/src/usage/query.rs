//! `GET /usage`'s read: the estate's usage rows summed by period (day,
//! week, month) and by seat, role, model or node. One read of this node's
//! own estate: every data node holds everyone's usage, so nothing is
//! scattered.

use std::collections::BTreeMap;
use std::str::FromStr;

use rusqlite::Connection;
use serde::Serialize;

use crate::EstateError;

/// The period rows are summed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    Day,
    /// Monday to Sunday, named by its Monday.
    Week,
    Month,
}

/// What rows are keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Seat,
    Role,
    Model,
    Node,
    /// The provider slot that served the calls (tokens only; a row whose
    /// records did not say is keyed `null`: unknown).
    Provider,
}

/// Why a usage query was refused (the asker's to fix).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadQuery {
    #[error("period `{0}` is not one of day, week, month")]
    Period(String),
    #[error("by `{0}` is not one of seat, role, model, node, provider")]
    By(String),
    #[error("`{field}` = `{value}` is not a day (YYYY-MM-DD)")]
    Day { field: &'static str, value: String },
}

impl FromStr for Period {
    type Err = BadQuery;
    fn from_str(s: &str) -> Result<Period, BadQuery> {
        match s {
            "day" => Ok(Period::Day),
            "week" => Ok(Period::Week),
            "month" => Ok(Period::Month),
            other => Err(BadQuery::Period(other.into())),
        }
    }
}

impl FromStr for By {
    type Err = BadQuery;
    fn from_str(s: &str) -> Result<By, BadQuery> {
        match s {
            "seat" => Ok(By::Seat),
            "role" => Ok(By::Role),
            "model" => Ok(By::Model),
            "node" => Ok(By::Node),
            "provider" => Ok(By::Provider),
            other => Err(BadQuery::By(other.into())),
        }
    }
}

/// One usage read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageQuery {
    pub period: Period,
    pub by: By,
    /// First day included (company days, `YYYY-MM-DD`).
    pub from: Option<String>,
    /// Last day included.
    pub to: Option<String>,
}

impl UsageQuery {
    /// Parses the query's words as `GET /usage` and `crewlet usage` take
    /// them (each optional: day, seat, all days).
    pub fn parse(
        period: Option<&str>,
        by: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<UsageQuery, BadQuery> {
        let day = |field: &'static str, v: Option<&str>| -> Result<Option<String>, BadQuery> {
            match v {
                None => Ok(None),
                Some(v) => jiff::civil::Date::from_str(v)
                    .map(|d| Some(d.to_string()))
                    .map_err(|_| BadQuery::Day {
                        field,
                        value: v.into(),
                    }),
            }
        };
        Ok(UsageQuery {
            period: period.unwrap_or("day").parse()?,
            by: by.unwrap_or("seat").parse()?,
            from: day("from", from)?,
            to: day("to", to)?,
        })
    }
}

/// One period and key's sums. `turns` and `fires` are absent where the
/// key does not apply to them (turns have no model; fires no role). `key`
/// is `None` only by provider, for calls whose records did not name a slot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UsageRow {
    pub period: String,
    pub key: Option<String>,
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub outcomes: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fires: Option<u64>,
}

impl UsageQuery {
    /// Runs the read on a connection to the estate.
    pub fn run(&self, conn: &Connection) -> Result<Vec<UsageRow>, EstateError> {
        let period = match self.period {
            Period::Day => "day",
            Period::Week => "date(day, '-6 days', 'weekday 1')",
            Period::Month => "substr(day, 1, 7)",
        };
        let key = match self.by {
            By::Seat => "seat",
            By::Role => "role",
            By::Model => "model",
            By::Node => "node",
            By::Provider => "NULLIF(slot, '')",
        };
        let from = self.from.clone().unwrap_or_else(|| "0000-00-00".into());
        let to = self.to.clone().unwrap_or_else(|| "9999-99-99".into());
        let mut out: BTreeMap<(String, Option<String>), UsageRow> = BTreeMap::new();
        let sql = format!(
            "SELECT {period}, {key}, SUM(calls), SUM(input_tokens), SUM(output_tokens)
               FROM usage_tokens WHERE day BETWEEN ?1 AND ?2 GROUP BY 1, 2"
        );
        let mut stmt = conn.prepare(&sql)?;
        let mut q = stmt.query([&from, &to])?;
        while let Some(r) = q.next()? {
            let e = entry(&mut out, r.get(0)?, r.get(1)?);
            e.calls = r.get::<_, i64>(2)? as u64;
            e.input_tokens = r.get::<_, i64>(3)? as u64;
            e.output_tokens = r.get::<_, i64>(4)? as u64;
        }
        if !matches!(self.by, By::Model | By::Provider) {
            let sql = format!(
                "SELECT {period}, {key}, outcome, SUM(turns)
                   FROM usage_turns WHERE day BETWEEN ?1 AND ?2 GROUP BY 1, 2, 3"
            );
            let mut stmt = conn.prepare(&sql)?;
            let mut q = stmt.query([&from, &to])?;
            while let Some(r) = q.next()? {
                let e = entry(&mut out, r.get(0)?, r.get(1)?);
                let n = r.get::<_, i64>(3)? as u64;
                *e.turns.get_or_insert(0) += n;
                e.outcomes.insert(r.get(2)?, n);
            }
        }
        if matches!(self.by, By::Seat | By::Node) {
            let sql = format!(
                "SELECT {period}, {key}, SUM(fires)
                   FROM usage_schedule_runs WHERE day BETWEEN ?1 AND ?2 GROUP BY 1, 2"
            );
            let mut stmt = conn.prepare(&sql)?;
            let mut q = stmt.query([&from, &to])?;
            while let Some(r) = q.next()? {
                let e = entry(&mut out, r.get(0)?, r.get(1)?);
                e.fires = Some(r.get::<_, i64>(2)? as u64);
            }
        }
        Ok(out.into_values().collect())
    }
}

fn entry(
    out: &mut BTreeMap<(String, Option<String>), UsageRow>,
    period: String,
    key: Option<String>,
) -> &mut UsageRow {
    out.entry((period.clone(), key.clone()))
        .or_insert_with(|| UsageRow {
            period,
            key,
            ..UsageRow::default()
        })
}
