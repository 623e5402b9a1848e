//! When a schedule fires: cron expressions evaluated on the wall clock of a
//! time zone, and what to do with the fires nobody ran.
//!
//! **Expressions** are parsed by the `croner` crate: five fields
//! `minute hour day-of-month month day-of-week` (`0 9 * * mon-fri`), or six
//! with a leading seconds field (`30 0 9 * * *`), or an alias (`@hourly`,
//! `@daily`, `@weekly`, `@monthly`, `@yearly`, `@annually`). Names of days
//! and months are accepted in any case; croner's extensions (`L`, `W`, `#`)
//! too. As in Vixie cron, when both day fields are restricted a day matching
//! either one matches. An expression that matches no date at all (`0 0 30 2
//! *`) is refused rather than accepted as a schedule that never fires.
//!
//! **The DST rule.** An expression matches *civil* times, the wall clock
//! with no daylight saving: `30 2 * * *` means "at 02:30 on the clock". Each
//! matching civil time then maps to exactly one instant in the zone:
//!
//! - a time the clock skips (spring forward: 02:30 on the last Sunday of
//!   March in Europe/Berlin) fires at the instant it would have been, shifted
//!   forward by the gap (03:30 CEST), the "compatible" disambiguation of
//!   RFC 5545 and `jiff`;
//! - a time the clock shows twice (fall back: 02:30 on the last Sunday of
//!   October) fires once, at the earlier of its two instants (02:30 CEST).
//!
//! The instants are then kept strictly increasing: a civil time whose
//! instant is not after the last fire is not fired again. So a daily
//! schedule fires once on both transition days, and an every-minute
//! schedule fires once per instant minute: it runs through the skipped hour
//! at its shifted instants (02:00–02:59 on the clock fire at 03:00–03:59
//! CEST, and 03:00–03:59 on the clock, the same instants, do not fire
//! again), and is quiet for the repeated hour, whose minutes already fired
//! the first time round.
//!
//! Evaluation runs croner on `jiff`'s civil datetime, a clock with no
//! transitions, and maps each match with `jiff`; nothing here reads the
//! system clock, so every node computes the same instants.
//!
//! **Catch-up** ([`CatchUp`], [`plan`]): what happens to fires that passed
//! while no node held the scheduler duty.

mod catch_up;

pub use catch_up::{CatchUp, DEFAULT_CATCH_UP_LIMIT, MAX_CATCH_UP_LIMIT, Plan, plan};

use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

/// The forms an expression may take, shown with every parse error.
const FORMS: &str = "use five fields `minute hour day-of-month month day-of-week` \
    (`0 9 * * mon-fri`: 09:00 on weekdays), six with a leading seconds field \
    (`30 0 9 * * *`), or an alias (`@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`)";

const ALIASES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// Why an expression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("{expression:?} is not a cron expression ({reason}): {FORMS}")]
    Invalid { expression: String, reason: String },
    #[error(
        "{expression:?} matches no date (like 30 February), so it would never fire: fix the day and month fields"
    )]
    NeverFires { expression: String },
}

/// A parsed cron expression.
///
/// ```
/// use crewlet_schedule::Cron;
/// use jiff::Timestamp;
/// use jiff::tz::TimeZone;
///
/// let nightly = Cron::parse("30 2 * * *")?;
/// let berlin = TimeZone::get("Europe/Berlin")?;
/// let after: Timestamp = "2026-03-28T12:00:00Z".parse()?;
/// let fires: Vec<String> = nightly
///     .fires(&berlin, after)
///     .take(2)
///     .map(|t| t.to_zoned(berlin.clone()).to_string())
///     .collect();
/// // 02:30 does not exist on 29 March in Berlin (the clock springs from
/// // 02:00 to 03:00): that fire comes at the instant it would have been.
/// assert_eq!(
///     fires,
///     [
///         "2026-03-29T03:30:00+02:00[Europe/Berlin]",
///         "2026-03-30T02:30:00+02:00[Europe/Berlin]",
///     ]
/// );
/// // An expression that matches no date is refused, never a silent schedule.
/// assert!(Cron::parse("0 0 30 2 *").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Cron {
    source: String,
    pattern: croner::Cron,
}

impl PartialEq for Cron {
    fn eq(&self, other: &Cron) -> bool {
        self.source == other.source
    }
}

impl Eq for Cron {}

impl Cron {
    /// Parses an expression in one of the forms of the crate docs.
    pub fn parse(expression: &str) -> Result<Cron, CronError> {
        let source = expression.trim();
        let invalid = |reason: String| CronError::Invalid {
            expression: source.to_owned(),
            reason,
        };
        if source.is_empty() {
            return Err(invalid("it is empty".into()));
        }
        if source.starts_with('@') {
            if !ALIASES.iter().any(|a| a.eq_ignore_ascii_case(source)) {
                return Err(invalid("not an alias this parser knows".into()));
            }
        } else {
            let fields = source.split_whitespace().count();
            if !(5..=6).contains(&fields) {
                return Err(invalid(format!("it has {fields} fields")));
            }
        }
        let pattern = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build()
            .parse(source)
            .map_err(|e| invalid(e.to_string()))?;
        let epoch = DateTime::constant(2000, 1, 1, 0, 0, 0, 0);
        if pattern.find_next_occurrence(&epoch, true).is_err() {
            return Err(CronError::NeverFires {
                expression: source.to_owned(),
            });
        }
        Ok(Cron {
            source: source.to_owned(),
            pattern,
        })
    }

    /// The expression as written (trimmed).
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Every fire in `tz` strictly after `after`, in increasing order (see
    /// the DST rule in the crate docs).
    pub fn fires(&self, tz: &TimeZone, after: Timestamp) -> Fires {
        Fires {
            pattern: self.pattern.clone(),
            tz: tz.clone(),
            cursor: Some(civil_start(tz, after)),
            inclusive: true,
            last: after,
        }
    }

    /// The first fire strictly after `after`.
    pub fn next_after(&self, tz: &TimeZone, after: Timestamp) -> Option<Timestamp> {
        self.fires(tz, after).next()
    }

    /// The fires strictly after `after` and at or before `until`: the ones a
    /// scheduler that last looked at `after` owes at `until`.
    pub fn between(&self, tz: &TimeZone, after: Timestamp, until: Timestamp) -> Vec<Timestamp> {
        self.fires(tz, after).take_while(|t| *t <= until).collect()
    }
}

impl std::fmt::Display for Cron {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for Cron {
    type Err = CronError;

    fn from_str(s: &str) -> Result<Cron, CronError> {
        Cron::parse(s)
    }
}

impl serde::Serialize for Cron {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

impl<'de> serde::Deserialize<'de> for Cron {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cron, D::Error> {
        let s = String::deserialize(d)?;
        Cron::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// How far back offsets are looked at to find where the search starts; more
/// than any two offsets a zone can have apart.
const LOOKBACK: SignedDuration = SignedDuration::from_hours(72);

/// The civil time the search for fires after `after` starts at: every civil
/// time before it maps to an instant at or before `after`.
///
/// Usually that is the clock at `after`. After a spring-forward gap, a civil
/// time up to the gap's length earlier maps forward past `after` (02:30
/// fires at 03:30), so the search starts that much earlier: by how far the
/// offset now exceeds the lowest it had within [`LOOKBACK`].
fn civil_start(tz: &TimeZone, after: Timestamp) -> DateTime {
    let here = tz.to_offset(after);
    let from = after.checked_sub(LOOKBACK).unwrap_or(Timestamp::MIN);
    let lowest = tz
        .preceding(after)
        .take_while(|t| t.timestamp() >= from)
        .map(|t| t.offset())
        .fold(tz.to_offset(from).min(here), std::cmp::Ord::min);
    let back = SignedDuration::from_secs(i64::from(here.seconds() - lowest.seconds()));
    tz.to_datetime(after)
        .checked_sub(back)
        .unwrap_or(DateTime::MIN)
}

/// The fires of a [`Cron`] in a zone, strictly increasing; see
/// [`Cron::fires`].
#[derive(Debug, Clone)]
pub struct Fires {
    pattern: croner::Cron,
    tz: TimeZone,
    /// The last civil time matched, or where the search starts; `None`
    /// once the calendar has run out.
    cursor: Option<DateTime>,
    inclusive: bool,
    /// Only instants after this one fire: `after`, then the last fire.
    last: Timestamp,
}

impl Iterator for Fires {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        loop {
            let from = self.cursor?;
            let found = self.pattern.find_next_occurrence(&from, self.inclusive);
            self.inclusive = false;
            let instant = found.ok().and_then(|civil| {
                self.cursor = Some(civil);
                self.tz.to_ambiguous_timestamp(civil).compatible().ok()
            });
            let Some(instant) = instant else {
                self.cursor = None;
                return None;
            };
            if instant > self.last {
                self.last = instant;
                return Some(instant);
            }
        }
    }
}

#[cfg(test)]
mod tests;
