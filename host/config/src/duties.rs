//! `[duties]`: the cadence of the company's singleton duties and the
//! horizons of what this node keeps.
//!
//! Rule: a duty's lease TTL follows its own cadence, never the seat lease
//! TTL (`coordination.lease_ttl_seconds` changes seats and presence only):
//! the scheduler holds `worker:scheduler` for `scheduler_lease_seconds`
//! (renewed every sixth of it, admitting while its last renew is younger
//! than a third), maintenance holds `worker:maintenance` for three of
//! its ticks, and learning `worker:learning` for three of its own. All
//! stay within the coordination store's ceiling for any duty (three
//! hours): the longest tick allowed is an hour, so three of them is the
//! ceiling itself.

use std::time::Duration;

use serde::Deserialize;

/// The scheduler's lease TTL by default (the design's 30 s).
pub const DEFAULT_SCHEDULER_LEASE_SECONDS: u64 = 30;
/// The maintenance tick by default: 15 minutes.
pub const DEFAULT_MAINTENANCE_TICK_SECONDS: u64 = 900;
/// The longest maintenance tick: three of them are the duty ceiling.
pub const MAX_MAINTENANCE_TICK_SECONDS: u64 = 3600;
/// How long this node keeps its event log rows, by default.
pub const DEFAULT_EVENT_RETENTION_DAYS: u64 = 30;
/// How long this node keeps its `scheduled_runs` rows, by default.
pub const DEFAULT_SCHEDULED_RUNS_RETENTION_DAYS: u64 = 30;
/// How long a seat is out of the company before its mailbox is retired.
pub const DEFAULT_MAILBOX_GRACE_SECONDS: u64 = 24 * 3600;
/// The learning duty's tick by default: an hour.
pub const DEFAULT_LEARNING_TICK_SECONDS: u64 = 3600;
/// How long an unused skill takes to lose half its strength, by default.
pub const DEFAULT_SKILL_HALF_LIFE_DAYS: u64 = 7;

const DAY: u64 = 24 * 3600;

/// The `[duties]` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DutiesConfig {
    /// TTL of the `worker:scheduler` lease.
    pub scheduler_lease: Duration,
    /// The maintenance duty's tick; its lease TTL is three ticks.
    pub maintenance_tick: Duration,
    /// Event log rows older than this are deleted (this node's own log).
    pub event_retention: Duration,
    /// `scheduled_runs` rows older than this are deleted.
    pub scheduled_runs_retention: Duration,
    /// A seat out of the active company this long has its mailbox retired.
    pub mailbox_grace: Duration,
    /// The learning duty's tick; its lease TTL is three ticks.
    pub learning_tick: Duration,
    /// An unused skill loses half its strength in this long.
    pub skill_half_life: Duration,
}

impl Default for DutiesConfig {
    fn default() -> Self {
        DutiesConfig {
            scheduler_lease: Duration::from_secs(DEFAULT_SCHEDULER_LEASE_SECONDS),
            maintenance_tick: Duration::from_secs(DEFAULT_MAINTENANCE_TICK_SECONDS),
            event_retention: Duration::from_secs(DEFAULT_EVENT_RETENTION_DAYS * DAY),
            scheduled_runs_retention: Duration::from_secs(
                DEFAULT_SCHEDULED_RUNS_RETENTION_DAYS * DAY,
            ),
            mailbox_grace: Duration::from_secs(DEFAULT_MAILBOX_GRACE_SECONDS),
            learning_tick: Duration::from_secs(DEFAULT_LEARNING_TICK_SECONDS),
            skill_half_life: Duration::from_secs(DEFAULT_SKILL_HALF_LIFE_DAYS * DAY),
        }
    }
}

pub(crate) mod raw {
    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    pub struct Duties {
        pub scheduler_lease_seconds: Option<f64>,
        pub maintenance_tick_seconds: Option<f64>,
        pub event_retention_days: Option<f64>,
        pub scheduled_runs_retention_days: Option<f64>,
        pub mailbox_grace_seconds: Option<f64>,
        pub learning_tick_seconds: Option<f64>,
        pub skill_half_life_days: Option<f64>,
    }
}

impl raw::Duties {
    /// `Err((key, message))` for the first value out of its range.
    pub(crate) fn validate(self) -> Result<DutiesConfig, (&'static str, String)> {
        let d = DutiesConfig::default();
        let within = |key: &'static str,
                      v: Option<f64>,
                      default: Duration,
                      unit: f64,
                      (lo, hi): (f64, f64),
                      why: &str| {
            let Some(v) = v else { return Ok(default) };
            if v.is_finite() && v >= lo && v <= hi {
                Ok(Duration::from_secs_f64(v * unit))
            } else {
                Err((key, format!("expected {lo} to {hi}, found {v}: {why}")))
            }
        };
        Ok(DutiesConfig {
            scheduler_lease: within(
                "duties.scheduler_lease_seconds",
                self.scheduler_lease_seconds,
                d.scheduler_lease,
                1.0,
                (3.0, 600.0),
                "the scheduler renews every sixth of it, and a fire waits for a holder at most this long after a crash",
            )?,
            maintenance_tick: within(
                "duties.maintenance_tick_seconds",
                self.maintenance_tick_seconds,
                d.maintenance_tick,
                1.0,
                (1.0, MAX_MAINTENANCE_TICK_SECONDS as f64),
                "its lease is three ticks, and no duty may hold one longer than three hours",
            )?,
            event_retention: within(
                "duties.event_retention_days",
                self.event_retention_days,
                d.event_retention,
                DAY as f64,
                (0.0001, 3650.0),
                "rows older than this are deleted from this node's event log",
            )?,
            scheduled_runs_retention: within(
                "duties.scheduled_runs_retention_days",
                self.scheduled_runs_retention_days,
                d.scheduled_runs_retention,
                DAY as f64,
                (0.0001, 3650.0),
                "rows older than this are deleted from this node's dispatch history",
            )?,
            mailbox_grace: within(
                "duties.mailbox_grace_seconds",
                self.mailbox_grace_seconds,
                d.mailbox_grace,
                1.0,
                (1.0, 30.0 * DAY as f64),
                "a seat out of the company this long has its mailbox retired; a seat put back within it keeps its queued wakes",
            )?,
            learning_tick: within(
                "duties.learning_tick_seconds",
                self.learning_tick_seconds,
                d.learning_tick,
                1.0,
                (1.0, MAX_MAINTENANCE_TICK_SECONDS as f64),
                "its lease is three ticks, and no duty may hold one longer than three hours",
            )?,
            skill_half_life: within(
                "duties.skill_half_life_days",
                self.skill_half_life_days,
                d.skill_half_life,
                DAY as f64,
                (0.0001, 3650.0),
                "an unused skill loses half its strength in this long and retires below a tenth",
            )?,
        })
    }
}
