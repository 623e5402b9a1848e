//! The budget park: work a full window cannot afford waits for room.
//!
//! Rules, and why:
//! - A full window parks the work, never drops it. The wakes stay the
//!   seat's, in its mailbox (handed back, not acknowledged, the triggers not
//!   completed); the seat's mailbox holds a park gate and fetches nothing
//!   while it is shut. No park record is kept beside the wakes: the mailbox
//!   already keeps them durable, ordered and with whoever holds the seat
//!   next, and what is parked can be read on any node from the counters and
//!   the mailbox depth ([`BudgetRoom`]), so a second copy would only be one
//!   more thing to keep true.
//! - A park names the window that is full and when it turns over on the
//!   company's clock ([`turns_over_at`]); the seat re-asks the counters —
//!   reads, never a model call — when that instant comes and whenever the
//!   company changes (a raised cap), and takes its work again once every
//!   capped window of the seat and the company has room for `need` tokens
//!   (one; or the prompt a call was refused for, so the next attempt fits).
//! - Unknown (an unreadable counter) is neither room nor full: the parked
//!   seat stays parked and asks again.

use std::time::SystemTime;

use crewlet_company::{Ceilings, Company, Seat};
use crewlet_coord::{BudgetReads, BudgetView, CoordError, Period, Refusal, Scope, Windows};

/// Why a seat's work waits: the window that has no room, and when it turns
/// over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Park {
    pub scope: Scope,
    pub period: Period,
    /// The full window's label (`2026-09-23`, `2026-W39`, `2026-09`).
    pub window: String,
    pub spent: u64,
    pub cap: u64,
    /// When the window turns over, on the company's clock.
    pub until: SystemTime,
    /// Tokens the work needs room for before it is taken again.
    pub need: u64,
}

impl Park {
    /// `company` or `seat:HANDLE`.
    pub fn scope_name(&self) -> String {
        scope_name(&self.scope)
    }

    /// `day`, `week` or `month`.
    pub fn period_name(&self) -> &'static str {
        period_name(self.period)
    }

    /// `budget: day window until 2026-09-24T00:00:00+02:00` (company clock).
    pub fn reason(&self, company: &Company) -> String {
        format!(
            "budget: {} window until {}",
            self.period_name(),
            company_time(company, self.until)
        )
    }
}

pub(crate) fn scope_name(scope: &Scope) -> String {
    match scope {
        Scope::Company => "company".to_owned(),
        Scope::Seat(h) => format!("seat:{h}"),
    }
}

pub(crate) fn period_name(p: Period) -> &'static str {
    match p {
        Period::Day => "day",
        Period::Week => "week",
        Period::Month => "month",
    }
}

fn zone(company: &Company) -> jiff::tz::TimeZone {
    jiff::tz::TimeZone::get(&company.timezone).unwrap_or(jiff::tz::TimeZone::UTC)
}

/// `instant` as an RFC 3339 time on the company's clock.
pub fn company_time(company: &Company, instant: SystemTime) -> String {
    match jiff::Timestamp::try_from(instant) {
        Ok(ts) => {
            let z = ts.to_zoned(zone(company));
            z.timestamp().display_with_offset(z.offset()).to_string()
        }
        Err(_) => format!("{instant:?}"),
    }
}

/// When the `period` window holding `now` turns over on the company's
/// clock: the next midnight, the next Monday's, the first of next month's.
pub fn turns_over_at(company: &Company, period: Period, now: SystemTime) -> SystemTime {
    let tz = zone(company);
    let Ok(ts) = jiff::Timestamp::try_from(now) else {
        return now;
    };
    let today = ts.to_zoned(tz.clone()).date();
    let next = match period {
        Period::Day => today.tomorrow().ok(),
        Period::Week => {
            let to_monday = 7 - i64::from(today.weekday().to_monday_zero_offset());
            today.checked_add(jiff::Span::new().days(to_monday)).ok()
        }
        Period::Month => today
            .first_of_month()
            .checked_add(jiff::Span::new().months(1))
            .ok(),
    };
    next.and_then(|d| d.to_zoned(tz).ok())
        .map(|z| SystemTime::from(z.timestamp()))
        .unwrap_or(now)
}

fn caps(c: &Ceilings, p: Period) -> Option<u64> {
    match p {
        Period::Day => c.day,
        Period::Week => c.week,
        Period::Month => c.month,
    }
}

/// What the counters say about a seat's room, as one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetRoom {
    /// Every capped window of the company and the seat has room for `need`.
    Free,
    /// A window has not: the park, naming the one that turns over last (room
    /// comes back only when every full window has turned).
    Full(Park),
}

/// The company's and `seat`'s windows at `now`, with their ceilings.
async fn views(
    budgets: &BudgetReads,
    company: &Company,
    seat: &Seat,
    now: SystemTime,
) -> Result<[(Scope, BudgetView, Ceilings); 2], CoordError> {
    let windows = windows_at(company, now);
    let scope = Scope::Seat(seat.handle.to_string());
    let (c, s) = futures::join!(
        budgets.budget(&Scope::Company, &windows),
        budgets.budget(&scope, &windows)
    );
    Ok([
        (Scope::Company, c?, company.budget),
        (scope, s?, company.role_of(seat).budget),
    ])
}

/// Reads the company's and the seat's windows at `now` and answers whether
/// `need` tokens fit in every capped window; an unreadable counter is an
/// error, never room and never full.
pub async fn budget_room(
    budgets: &BudgetReads,
    company: &Company,
    seat: &Seat,
    now: SystemTime,
    need: u64,
) -> Result<BudgetRoom, CoordError> {
    let views = views(budgets, company, seat, now).await?;
    Ok(match park_for(company, &views, now, need) {
        Some(p) => BudgetRoom::Full(p),
        None => BudgetRoom::Free,
    })
}

/// What a reader (`GET /budgets`, `/agents`) calls the park of a seat with
/// waiting wakes, from one read: see [`parked_on`].
pub async fn budget_parked(
    budgets: &BudgetReads,
    company: &Company,
    seat: &Seat,
    now: SystemTime,
) -> Result<Option<Park>, CoordError> {
    Ok(parked_on(
        company,
        &views(budgets, company, seat, now).await?,
        now,
    ))
}

/// The park `views` show to a reader: a capped window without room for a
/// token, or one whose refusal stamp stands (the gate turned a call away
/// in it — a prompt past the room — and admitted no charge since). The
/// stamp is the gate's own decision kept beside the counter, so every node
/// reads the same; the parked seat itself asks [`budget_room`] instead, so
/// a raised cap opens it before its next charge clears the stamp.
pub fn parked_on(
    company: &Company,
    views: &[(Scope, BudgetView, Ceilings)],
    now: SystemTime,
) -> Option<Park> {
    park_for(company, views, now, 1).or_else(|| {
        views.iter().find_map(|(scope, view, ceilings)| {
            Period::ALL.into_iter().find_map(|p| {
                let cap = caps(ceilings, p)?;
                let slot = view.slot(p);
                slot.refused_at.map(|_| Park {
                    scope: scope.clone(),
                    period: p,
                    window: slot.label.clone(),
                    spent: slot.spent,
                    cap,
                    until: turns_over_at(company, p, now),
                    need: 1,
                })
            })
        })
    })
}

/// The park `views` (each scope's windows and ceilings, read at `now`)
/// call for, if any capped window lacks room for `need` tokens.
pub fn park_for(
    company: &Company,
    views: &[(Scope, BudgetView, Ceilings)],
    now: SystemTime,
    need: u64,
) -> Option<Park> {
    let mut park: Option<Park> = None;
    for (scope, view, ceilings) in views {
        for p in Period::ALL {
            let Some(cap) = caps(ceilings, p) else {
                continue;
            };
            let slot = view.slot(p);
            if slot.spent.saturating_add(need.max(1)) <= cap {
                continue;
            }
            let until = turns_over_at(company, p, now);
            if park.as_ref().is_none_or(|k| until > k.until) {
                park = Some(Park {
                    scope: scope.clone(),
                    period: p,
                    window: slot.label.clone(),
                    spent: slot.spent,
                    cap,
                    until,
                    need: need.max(1),
                });
            }
        }
    }
    park
}

/// The park a refusal calls for: its window, turning over after `now`.
pub(crate) fn of_refusal(
    company: &Company,
    r: &Refusal,
    window: String,
    now: SystemTime,
    need: u64,
) -> Park {
    Park {
        scope: r.scope.clone(),
        period: r.period,
        window,
        spent: r.spent,
        cap: r.cap,
        until: turns_over_at(company, r.period, now),
        need: need.max(1),
    }
}

/// The budget windows at `instant`, on the company's clock (its timezone's
/// offset in force then, DST included; UTC when the zone is unknown).
pub fn windows_at(company: &Company, instant: SystemTime) -> Windows {
    let offset = jiff::tz::TimeZone::get(&company.timezone)
        .ok()
        .and_then(|tz| {
            let ts = jiff::Timestamp::try_from(instant).ok()?;
            time::UtcOffset::from_whole_seconds(tz.to_offset(ts).seconds()).ok()
        })
        .unwrap_or(time::UtcOffset::UTC);
    Windows::at(instant, offset)
}

/// The budget windows now, on the company's clock.
pub fn windows_now(company: &Company) -> Windows {
    windows_at(company, SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn company(tz: &str) -> Company {
        let doc = format!(
            "[org]\nname = \"Acme\"\ntimezone = \"{tz}\"\n[roles.r]\nsystem_prompt = \"x\"\nexecutor = [{{ provider = \"p\", model = \"m\" }}]\nreviewer = {{ provider = \"p\", model = \"m\" }}\n[seats]\nada = {{ role = \"r\" }}\n"
        );
        Company::parse(&doc).expect("company")
    }

    fn at(rfc: &str) -> SystemTime {
        SystemTime::from(rfc.parse::<jiff::Timestamp>().unwrap())
    }

    #[test]
    fn each_window_turns_over_at_its_boundary_on_the_company_clock() {
        let berlin = company("Europe/Berlin");
        // Wednesday 2026-09-23 15:00 in Berlin (13:00 UTC, CEST).
        let now = at("2026-09-23T13:00:00Z");
        assert_eq!(
            turns_over_at(&berlin, Period::Day, now),
            at("2026-09-23T22:00:00Z")
        );
        assert_eq!(
            turns_over_at(&berlin, Period::Week, now),
            at("2026-09-27T22:00:00Z"),
            "Monday 00:00 in Berlin"
        );
        assert_eq!(
            turns_over_at(&berlin, Period::Month, now),
            at("2026-09-30T22:00:00Z")
        );
        // A Monday's week turns over on the next Monday, not today.
        let monday = at("2026-09-28T08:00:00Z");
        assert_eq!(
            turns_over_at(&berlin, Period::Week, monday),
            at("2026-10-04T22:00:00Z")
        );
        let utc = company("UTC");
        let late = at("2026-12-31T23:59:59Z");
        assert_eq!(
            turns_over_at(&utc, Period::Month, late),
            at("2027-01-01T00:00:00Z")
        );
        assert_eq!(
            turns_over_at(&utc, Period::Day, late) - Duration::from_secs(1),
            late
        );
        assert_eq!(
            company_time(&berlin, at("2026-09-23T22:00:00Z")),
            "2026-09-24T00:00:00+02:00"
        );
    }
}
