//! Token budgets as calendar windows.
//!
//! Rules (ADR-0019):
//! - One record per scope (the company, each seat) with a slot per period —
//!   the day, the ISO week from Monday, the month, cut on the company's
//!   clock by the caller ([`Windows`]); the store holds labels and never
//!   reads a clock.
//! - A charge is admitted only while every capped window of both scopes
//!   has room for it; it is one compare-and-swap per scope, the company
//!   first, then the seat. A refused round is still counted (the vendor has
//!   billed it). Contended CAS waits a jittered 1 ms doubling to 32 ms, for
//!   16 attempts and 2 s at least ([`crate::Contention`]), then fails
//!   closed with an error that is not a refusal.
//! - The roll is the reset: a slot on an earlier window is moved onto the
//!   current one inside the charge. A slot never rolls back: a node whose
//!   clock trails finds the slot on the next window and counts there.
//! - Nothing counted is taken back. Once the company's write landed, the
//!   seat's is finished on a task that outlives the caller; if it fails the
//!   charge answers [`CoordError::SeatShareUncounted`].
//! - [`Coord::refuse`] records a refusal without a charge: one CAS on the
//!   scope a charge would be refused by, stamping every capped window with
//!   no room for a single token (or, [`Coord::refuse_for`], for a call's
//!   prompt), as the counter stands; it writes nothing where it would stamp
//!   nothing.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use time::{OffsetDateTime, UtcOffset};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::Bucket;
use crate::kv::Expect;
use crate::names::encode_token;
use crate::{Contention, Coord, decode, encode};

/// A calendar period a budget slot counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    pub const ALL: [Period; 3] = [Period::Day, Period::Week, Period::Month];
}

/// The windows a charge is about: labels like `2026-09-23`, `2026-W39`, `2026-09`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    pub day: String,
    pub week: String,
    pub month: String,
}

impl Windows {
    /// The windows containing a civil date.
    pub fn of(date: time::Date) -> Windows {
        let (iso_year, week, _) = date.to_iso_week_date();
        Windows {
            day: format!(
                "{:04}-{:02}-{:02}",
                date.year(),
                date.month() as u8,
                date.day()
            ),
            week: format!("{iso_year:04}-W{week:02}"),
            month: format!("{:04}-{:02}", date.year(), date.month() as u8),
        }
    }

    /// The windows at `instant` on a clock at `offset` (the company's
    /// timezone offset in force at that instant, which the caller resolves,
    /// DST included).
    pub fn at(instant: SystemTime, offset: UtcOffset) -> Windows {
        Windows::of(OffsetDateTime::from(instant).to_offset(offset).date())
    }

    fn label(&self, p: Period) -> &str {
        match p {
            Period::Day => &self.day,
            Period::Week => &self.week,
            Period::Month => &self.month,
        }
    }
}

/// Ceilings per period; `None` is uncapped (still counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    pub day: Option<u64>,
    pub week: Option<u64>,
    pub month: Option<u64>,
}

impl Caps {
    fn get(&self, p: Period) -> Option<u64> {
        match p {
            Period::Day => self.day,
            Period::Week => self.week,
            Period::Month => self.month,
        }
    }
}

/// A budget scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Company,
    Seat(String),
}

impl Scope {
    fn key(&self) -> String {
        match self {
            Scope::Company => "company".into(),
            Scope::Seat(h) => format!("seat.{}", encode_token(h)),
        }
    }
}

/// One window as a read or a charge sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetSlot {
    pub label: String,
    pub spent: u64,
    /// When the gate last turned a call away in this window.
    pub refused_at: Option<SystemTime>,
}

/// A scope's three windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetView {
    pub day: BudgetSlot,
    pub week: BudgetSlot,
    pub month: BudgetSlot,
}

impl BudgetView {
    pub fn slot(&self, p: Period) -> &BudgetSlot {
        match p {
            Period::Day => &self.day,
            Period::Week => &self.week,
            Period::Month => &self.month,
        }
    }
}

/// An admitted charge: both scopes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charged {
    pub company: BudgetView,
    pub seat: BudgetView,
}

/// A refusal: which scope and window turned the call away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub scope: Scope,
    pub period: Period,
    /// What the window reads after the refusal: a refused charge's round
    /// included, since it is counted.
    pub spent: u64,
    pub cap: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SlotRec {
    label: String,
    spent: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refused_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct BudgetRec {
    day: Option<SlotRec>,
    week: Option<SlotRec>,
    month: Option<SlotRec>,
}

impl BudgetRec {
    fn slot_mut(&mut self, p: Period) -> &mut Option<SlotRec> {
        match p {
            Period::Day => &mut self.day,
            Period::Week => &mut self.week,
            Period::Month => &mut self.month,
        }
    }
    fn slot(&self, p: Period) -> &Option<SlotRec> {
        match p {
            Period::Day => &self.day,
            Period::Week => &self.week,
            Period::Month => &self.month,
        }
    }

    /// Rolls every slot onto the current window, never backwards.
    fn rolled(&self, w: &Windows) -> BudgetRec {
        let mut out = self.clone();
        for p in Period::ALL {
            let cur = w.label(p);
            let s = out.slot_mut(p);
            match s {
                Some(slot) if slot.label.as_str() >= cur => {}
                _ => {
                    *s = Some(SlotRec {
                        label: cur.to_owned(),
                        spent: 0,
                        refused_at_ms: None,
                    })
                }
            }
        }
        out
    }

    fn view(&self, w: &Windows) -> BudgetView {
        let r = self.rolled(w);
        let v = |p: Period| {
            let s = r.slot(p).clone().unwrap_or_default();
            BudgetSlot {
                label: s.label,
                spent: s.spent,
                refused_at: s.refused_at_ms.map(from_ms),
            }
        };
        BudgetView {
            day: v(Period::Day),
            week: v(Period::Week),
            month: v(Period::Month),
        }
    }

    /// The first capped window (of an already rolled record) without room.
    fn refusal(&self, caps: &Caps, tokens: u64, scope: &Scope) -> Option<Refusal> {
        Period::ALL.into_iter().find_map(|p| {
            let cap = caps.get(p)?;
            let spent = self.slot(p).as_ref().map_or(0, |s| s.spent);
            (spent.saturating_add(tokens) > cap).then(|| Refusal {
                scope: scope.clone(),
                period: p,
                spent,
                cap,
            })
        })
    }

    /// Counts `tokens` on every window; stamps the windows that refused, or
    /// clears the stamps when the whole charge was admitted.
    fn counted(&self, caps: &Caps, tokens: u64, admitted: bool, now_ms: u64) -> BudgetRec {
        let mut out = self.clone();
        for p in Period::ALL {
            let cap = caps.get(p);
            if let Some(s) = out.slot_mut(p) {
                let over = cap.is_some_and(|c| s.spent.saturating_add(tokens) > c);
                s.spent = s.spent.saturating_add(tokens);
                if admitted {
                    s.refused_at_ms = None;
                } else if over {
                    s.refused_at_ms = Some(now_ms);
                }
            }
        }
        out
    }
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn from_ms(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

impl Coord {
    async fn budget_read(&self, scope: &Scope) -> Result<(BudgetRec, u64), CoordError> {
        let b = Bucket::Budgets;
        Ok(match self.kv(b).get(b, &scope.key()).await? {
            Some(e) if !e.removed => (decode(b, &e)?, e.revision),
            Some(e) => (BudgetRec::default(), e.revision),
            None => (BudgetRec::default(), 0),
        })
    }

    /// What the next charge would be judged against, in `windows`: a slot on
    /// a later window (a peer's clock ahead) reads as that later window.
    pub async fn budget(&self, scope: &Scope, windows: &Windows) -> Result<BudgetView, CoordError> {
        Ok(self.budget_read(scope).await?.0.view(windows))
    }

    /// Charges a round of `tokens` to the company and to `seat`.
    ///
    /// Yes: admitted. No: refused — and still counted on both scopes. An
    /// error is never a refusal: on any error the caller fails the turn
    /// (fails closed) rather than telling an agent it is out of budget.
    pub async fn charge(
        &self,
        seat: &str,
        windows: &Windows,
        company_caps: &Caps,
        seat_caps: &Caps,
        tokens: u64,
    ) -> Reply<Charged, Refusal> {
        let b = Bucket::Budgets;
        let company = Scope::Company;
        let seat_scope = Scope::Seat(seat.to_owned());
        let mut landed = None;
        let mut tries = Contention::new();
        loop {
            if !tries.again().await {
                break;
            }
            let (c, s) = futures::join!(self.budget_read(&company), self.budget_read(&seat_scope));
            let ((crec, crev), (srec, _)) = (c?, s?);
            let (c_roll, s_roll) = (crec.rolled(windows), srec.rolled(windows));
            let refusal = c_roll
                .refusal(company_caps, tokens, &company)
                .or_else(|| s_roll.refusal(seat_caps, tokens, &seat_scope));
            let now_ms = ms(self.kv(b).now());
            let new_c = c_roll.counted(company_caps, tokens, refusal.is_none(), now_ms);
            if self
                .kv(b)
                .put(b, &company.key(), encode(&new_c), Expect::Revision(crev))
                .await?
                .is_ok()
            {
                landed = Some((refusal, new_c));
                break;
            }
        }
        let Some((refusal, new_c)) = landed else {
            return Err(CoordError::Contended {
                key: "budgets/company".into(),
                attempts: tries.made(),
            });
        };
        // The round is spent whatever the caller does next: finish the
        // seat's share on a task that outlives the caller's future.
        let this = self.clone();
        let (w, caps, admitted) = (windows.clone(), *seat_caps, refusal.is_none());
        let seat_owned = seat_scope.clone();
        let task = tokio::spawn(async move {
            this.charge_seat(&seat_owned, &w, &caps, tokens, admitted)
                .await
        });
        let seat_rec = match task.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(
                    event = "coord_kv_budget_spend_uncounted",
                    seat,
                    tokens,
                    error = %e,
                    "a budget charge landed on the company but not on the seat"
                );
                return Err(CoordError::SeatShareUncounted {
                    seat: seat.to_owned(),
                    tokens,
                });
            }
            Err(join) => {
                tracing::warn!(event = "coord_kv_budget_spend_uncounted", seat, tokens, error = %join);
                return Err(CoordError::SeatShareUncounted {
                    seat: seat.to_owned(),
                    tokens,
                });
            }
        };
        let company_view = new_c.view(windows);
        let seat_view = seat_rec.view(windows);
        Ok(match refusal {
            None => Answer::Yes(Charged {
                company: company_view,
                seat: seat_view,
            }),
            Some(r) => Answer::No(Refusal {
                spent: r.spent.saturating_add(tokens),
                ..r
            }),
        })
    }

    async fn charge_seat(
        &self,
        seat: &Scope,
        windows: &Windows,
        caps: &Caps,
        tokens: u64,
        admitted: bool,
    ) -> Result<BudgetRec, CoordError> {
        let b = Bucket::Budgets;
        let mut tries = Contention::new();
        loop {
            if !tries.again().await {
                break;
            }
            let (rec, rev) = self.budget_read(seat).await?;
            let new = rec
                .rolled(windows)
                .counted(caps, tokens, admitted, ms(self.kv(b).now()));
            if self
                .kv(b)
                .put(b, &seat.key(), encode(&new), Expect::Revision(rev))
                .await?
                .is_ok()
            {
                return Ok(new);
            }
        }
        Err(CoordError::Contended {
            key: seat.key(),
            attempts: tries.made(),
        })
    }

    /// Records a refusal made without a charge. Yes: the scope stamped (the
    /// company before the seat). No: every capped window has room for a
    /// token as the counter stands — nothing was written.
    pub async fn refuse(
        &self,
        seat: &str,
        windows: &Windows,
        company_caps: &Caps,
        seat_caps: &Caps,
    ) -> Reply<Refusal, ()> {
        self.refuse_for(seat, windows, company_caps, seat_caps, 1)
            .await
    }

    /// [`Coord::refuse`] for a call that needs `need` tokens (its prompt, at
    /// least one): stamps every capped window without room for them.
    pub async fn refuse_for(
        &self,
        seat: &str,
        windows: &Windows,
        company_caps: &Caps,
        seat_caps: &Caps,
        need: u64,
    ) -> Reply<Refusal, ()> {
        let need = need.max(1);
        let scopes = [
            (Scope::Company, *company_caps),
            (Scope::Seat(seat.to_owned()), *seat_caps),
        ];
        let b = Bucket::Budgets;
        for (scope, caps) in scopes {
            let mut tries = Contention::new();
            loop {
                if !tries.again().await {
                    return Err(CoordError::Contended {
                        key: scope.key(),
                        attempts: tries.made(),
                    });
                }
                let (rec, rev) = self.budget_read(&scope).await?;
                let now_ms = ms(self.kv(b).now());
                // A window that turned over is judged (and stamped) as the
                // next charge would find it: rolled, with nothing spent.
                let mut new = rec.rolled(windows);
                let mut first = None;
                for p in Period::ALL {
                    let Some(cap) = caps.get(p) else { continue };
                    let Some(slot) = new.slot_mut(p).as_mut() else {
                        continue;
                    };
                    if slot.spent.saturating_add(need) <= cap {
                        continue;
                    }
                    slot.refused_at_ms = Some(now_ms);
                    first.get_or_insert(Refusal {
                        scope: scope.clone(),
                        period: p,
                        spent: slot.spent,
                        cap,
                    });
                }
                let Some(refusal) = first else { break };
                if self
                    .kv(b)
                    .put(b, &scope.key(), encode(&new), Expect::Revision(rev))
                    .await?
                    .is_ok()
                {
                    return Ok(Answer::Yes(refusal));
                }
            }
        }
        Ok(Answer::No(()))
    }
}
