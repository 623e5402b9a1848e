//! `worker:scheduler`: the company's schedules, fired once fleet-wide.
//!
//! Rules, each paid for by a peer system's incident:
//! - **A fire is claimed before it is published**, in the `fires` bucket
//!   under `schedule.seat.instant`, by a create: two holders (a frozen one
//!   waking, its successor) can never both win one instant. The claim
//!   carries the holder's fencing epoch; it is marked `published` once the
//!   stream acknowledged the wake.
//! - **A fire is never lost silently.** A claim whose publish failed is
//!   published again on the next pass (by this holder or its successor, which
//!   takes over a claim of an older epoch), under the same `Nats-Msg-Id`, so
//!   the stream's duplicate window and the completion ledger absorb a
//!   publish that did land. A fire is retried while its window lasts — until
//!   the schedule's next instant, at most an hour — and then counts as missed.
//! - **A cursor per schedule** (`cursor.NAME` in `fires`) says through which
//!   instant every fire was resolved. A new schedule starts at the instant it
//!   is first seen (nothing before it is owed). A successor resumes from the
//!   cursor: instants past their window are *missed* and handled by the
//!   schedule's catch-up policy (`latest`: the most recent once; `none`;
//!   `all`, up to its limit), the rest recorded as `schedule_missed`. Nothing
//!   older than [`CATCHUP_CEILING`] is caught up (the `fires` bucket keeps a
//!   claim for 7 days, so a claim is always older than anything caught up).
//! - Every fire this node published is a `scheduled_runs` row here and a
//!   `schedule_fired` event; every miss a `schedule_missed` event.

use std::collections::BTreeMap;
use std::time::Duration;

use crewlet_bus::{MSG_ID_HEADER, TRACE_HEADER, Wake, inbox_subject};
use crewlet_company::{Company, Schedule};
use crewlet_coord::{Admits, Answer, Claims, Fence, FenceEpoch, Fires};
use crewlet_store::{RunStatus, ScheduledRun, Store};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;
use tracing::{info, warn};

/// How far back a successor catches up.
pub const CATCHUP_CEILING: Duration = Duration::from_secs(24 * 3600);
/// The longest a fire is retried on time.
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);
/// Instants resolved per schedule per pass (the rest on the next pass).
const MAX_PER_PASS: usize = 500;
/// The longest the loop sleeps: a company change or a lost tenure is seen
/// at least this often.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// How long a publish waits for the stream's acknowledgement.
const ACK_WITHIN: Duration = Duration::from_secs(5);

/// What the scheduler uses.
#[derive(Clone)]
pub struct Scheduler {
    pub node_id: String,
    pub fires: Fires,
    pub js: async_nats::jetstream::Context,
    pub store: std::sync::Arc<Store>,
    pub publisher: crewlet_observe::Publisher,
    pub active: crewlet_company::ActiveCompany,
}

/// Why a pass over one schedule stopped early.
enum Stop {
    /// The tenure no longer admits work: fenced.
    Fenced,
    /// The store or the stream did not answer; try again next pass.
    Retry(String),
}

impl Scheduler {
    /// Runs until `stop`: fires while the tenure's fence admits, idles
    /// otherwise.
    pub async fn run(
        self,
        mut tenure: watch::Receiver<Option<Fence>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut company = self.active.subscribe();
        // Cursors are read from the bucket at each new tenure: a peer may
        // have moved them while this node did not hold the duty.
        let mut cursors: BTreeMap<String, Timestamp> = BTreeMap::new();
        let mut epoch_seen = None;
        loop {
            let held = tenure.borrow_and_update().clone();
            let wait = match held.filter(|f| f.admits() == Admits::Yes) {
                None => {
                    cursors.clear();
                    epoch_seen = None;
                    MAX_SLEEP
                }
                Some(fence) => {
                    if epoch_seen != Some(fence.epoch()) {
                        cursors.clear();
                        epoch_seen = Some(fence.epoch());
                    }
                    match self.active.current() {
                        Some(active) => self.pass(&active.company, &fence, &mut cursors).await,
                        None => MAX_SLEEP,
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = tenure.changed() => {}
                _ = company.changed() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
    }

    /// One pass over every schedule; answers how long to sleep.
    async fn pass(
        &self,
        company: &Company,
        tenure: &Fence,
        cursors: &mut BTreeMap<String, Timestamp>,
    ) -> Duration {
        let now = Timestamp::now();
        let mut next = now + MAX_SLEEP;
        for (name, schedule) in &company.schedules {
            match self
                .schedule_pass(company, name, schedule, tenure, cursors, now)
                .await
            {
                Ok(Some(at)) => next = next.min(at),
                Ok(None) => {}
                Err(Stop::Fenced) => return MAX_SLEEP,
                Err(Stop::Retry(why)) => {
                    warn!(subsystem = "scheduler", schedule = %name, %why, "fires not resolved; retrying");
                }
            }
        }
        cursors.retain(|name, _| company.schedules.contains_key(name));
        let wait = next.duration_since(Timestamp::now());
        Duration::try_from(wait)
            .unwrap_or(Duration::ZERO)
            .clamp(Duration::from_millis(5), MAX_SLEEP)
    }

    /// Resolves every instant of `schedule` due by `now`; answers its next
    /// instant.
    async fn schedule_pass(
        &self,
        company: &Company,
        name: &str,
        schedule: &Schedule,
        tenure: &Fence,
        cursors: &mut BTreeMap<String, Timestamp>,
        now: Timestamp,
    ) -> Result<Option<Timestamp>, Stop> {
        let tz = &schedule.tz;
        let through = match cursors.get(name) {
            Some(t) => *t,
            None => {
                let t = self.load_cursor(name, tenure, now).await?;
                cursors.insert(name.to_owned(), t);
                t
            }
        };
        let floor = now - signed(CATCHUP_CEILING);
        let start = if through < floor {
            self.missed(
                name,
                (through, floor),
                None,
                "older than the catch-up ceiling",
            )
            .await;
            floor
        } else {
            through
        };
        let due: Vec<Timestamp> = schedule
            .cron
            .fires(tz, start)
            .take_while(|t| *t <= now)
            .take(MAX_PER_PASS)
            .collect();
        let Some(&last) = due.last() else {
            if start != through {
                self.save_cursor(name, start, tenure, cursors).await?;
            }
            return Ok(schedule.cron.fires(tz, now).next());
        };
        // Instants still within their window fire as usual; the rest were
        // missed and go to the catch-up policy — except one a predecessor
        // already claimed (it crashed before moving the cursor).
        let window = |t: Timestamp| {
            let to_next = schedule.cron.fires(tz, t).next().map_or(MAX_WINDOW, |n| {
                Duration::try_from(n.duration_since(t)).unwrap_or(MAX_WINDOW)
            });
            to_next.min(MAX_WINDOW)
        };
        let late = |t: Timestamp| {
            Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO) > window(t)
        };
        let mut missed: Vec<Timestamp> = due.iter().copied().filter(|t| late(*t)).collect();
        let on_time: Vec<Timestamp> = due.iter().copied().filter(|t| !late(*t)).collect();
        // The oldest may be one a predecessor published and crashed before
        // moving the cursor past: finish it (its published seats are skipped).
        if let Some(&first) = missed.first()
            && self.published_any(name, schedule, first).await?
        {
            missed.remove(0);
            self.fire_all(company, name, schedule, first, false, tenure)
                .await?;
            self.save_cursor(name, first, tenure, cursors).await?;
        }
        let crewlet_schedule::Plan {
            fire: catch_up,
            skip: skipped,
        } = crewlet_schedule::plan(schedule.catch_up, &missed);
        if let (Some(&oldest), Some(&newest)) = (skipped.first(), skipped.last()) {
            self.missed(
                name,
                (oldest, newest),
                Some(skipped.len()),
                "past its window and not caught up (no node held the scheduler, or its publish kept failing)",
            )
            .await;
            // Skipped instants are older than every one still to fire.
            if catch_up.first().is_none_or(|c| *c > newest) {
                self.save_cursor(name, newest, tenure, cursors).await?;
            }
        }
        let fires = catch_up
            .into_iter()
            .map(|t| (t, true))
            .chain(on_time.into_iter().map(|t| (t, false)));
        for (at, catching_up) in fires {
            self.fire_all(company, name, schedule, at, catching_up, tenure)
                .await?;
            self.save_cursor(name, at, tenure, cursors).await?;
        }
        if cursors.get(name).is_some_and(|c| *c < last) {
            self.save_cursor(name, last, tenure, cursors).await?;
        }
        Ok(schedule.cron.fires(tz, last.max(now)).next())
    }

    /// Fires `at` for every seat of the schedule.
    async fn fire_all(
        &self,
        company: &Company,
        name: &str,
        schedule: &Schedule,
        at: Timestamp,
        catching_up: bool,
        tenure: &Fence,
    ) -> Result<(), Stop> {
        for seat in &schedule.seats {
            self.fire(
                company,
                name,
                schedule,
                seat.as_str(),
                at,
                catching_up,
                tenure,
            )
            .await?;
        }
        Ok(())
    }

    /// Claims and publishes one fire for one seat.
    #[allow(clippy::too_many_arguments)]
    async fn fire(
        &self,
        company: &Company,
        name: &str,
        schedule: &Schedule,
        seat: &str,
        at: Timestamp,
        catching_up: bool,
        tenure: &Fence,
    ) -> Result<(), Stop> {
        let epoch = fenced(tenure)?;
        let id = fire_id(name, seat, at);
        let mut record = FireRecord {
            schedule: name.to_owned(),
            seat: seat.to_owned(),
            due_ms: at.as_millisecond(),
            epoch,
            node: self.node_id.clone(),
            state: FireState::Claimed,
            published_ms: None,
        };
        let fires = self.fires();
        let (revision, taken_over) = match fires.claim(&id, &record).await {
            Ok(Answer::Yes(rev)) => (rev, false),
            Ok(Answer::No((existing, rev))) => {
                if existing.state == FireState::Published {
                    return Ok(());
                }
                // Claimed and never published: ours from an earlier pass,
                // or an older epoch's. Take it over and publish it again.
                if existing.epoch > epoch {
                    return Err(Stop::Fenced);
                }
                (rev, true)
            }
            Err(e) => return Err(Stop::Retry(format!("claim {id}: {e}"))),
        };
        fenced(tenure)?;
        let wake = self.wake(company, name, schedule, seat, at);
        let started = Timestamp::now();
        self.publish(&wake, &id).await.map_err(Stop::Retry)?;
        record.state = FireState::Published;
        record.published_ms = Some(Timestamp::now().as_millisecond());
        if let Err(e) = fires.replace(&id, &record, revision).await {
            // The wake is out; a later pass publishes it again under the
            // same message id, which the stream drops as a duplicate.
            warn!(subsystem = "scheduler", fire = %id, error = %e, "fire published but not marked");
        }
        let late_ms = started.as_millisecond() - at.as_millisecond();
        self.record_run(&id, name, seat, at, started).await;
        let mut ev = self.publisher.event(
            "schedule_fired",
            json!({
                "schedule": name, "seat": seat, "seat_id": wake.seat_id, "fire_key": id,
                "due": at.to_string(), "late_ms": late_ms,
                "catch_up": catching_up, "epoch": epoch,
                "taken_over": taken_over,
            }),
        );
        ev.trace_id = Some(wake.trace_id.clone());
        ev.seat = Some(seat.to_owned());
        let _ = self.publisher.record(ev).await;
        info!(subsystem = "scheduler", schedule = %name, seat, due = %at, late_ms, catch_up = catching_up, "fired");
        Ok(())
    }

    fn wake(
        &self,
        company: &Company,
        name: &str,
        schedule: &Schedule,
        seat: &str,
        at: Timestamp,
    ) -> Wake {
        let handle = crewlet_company::Handle::parse(seat).expect("schedule seats are handles");
        let (channel, thread) = match &schedule.deliver {
            Some(d) => (Some(d.channel.clone()), d.thread.clone()),
            None => (None, None),
        };
        Wake {
            trace_id: uuid::Uuid::now_v7().simple().to_string(),
            delivery_id: format!("{name}:{}", at.as_millisecond()),
            source: "schedule".into(),
            event_type: "schedule.fired".into(),
            handle: seat.to_owned(),
            seat_id: crewlet_company::seat_id(&company.org, &handle).to_string(),
            reason: "schedule".into(),
            text: Some(schedule.prompt.clone()),
            conversation: channel.as_ref().map(|c| match &thread {
                Some(t) => format!("{c}#{t}"),
                None => c.clone(),
            }),
            channel,
            thread,
            owed: None,
            sender: None,
        }
    }

    async fn publish(&self, wake: &Wake, id: &str) -> Result<(), String> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(MSG_ID_HEADER, format!("schedule:{id}").as_str());
        headers.insert(TRACE_HEADER, wake.trace_id.as_str());
        crewlet_observe::publish_acked(
            &self.js,
            inbox_subject(&wake.handle),
            headers,
            serde_json::to_vec(wake).expect("wake serialises"),
            ACK_WITHIN,
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("wake for {} not published: {e}", wake.handle))
    }

    /// Whether any seat's fire at `at` was published.
    async fn published_any(
        &self,
        name: &str,
        schedule: &Schedule,
        at: Timestamp,
    ) -> Result<bool, Stop> {
        for seat in &schedule.seats {
            match self.fires().get(&fire_id(name, seat.as_str(), at)).await {
                Ok(Answer::Yes((fire, _))) if fire.state == FireState::Published => {
                    return Ok(true);
                }
                Ok(_) => {}
                Err(e) => return Err(Stop::Retry(e.to_string())),
            }
        }
        Ok(false)
    }

    /// The schedule's cursor; a schedule seen for the first time starts now.
    async fn load_cursor(
        &self,
        name: &str,
        tenure: &Fence,
        now: Timestamp,
    ) -> Result<Timestamp, Stop> {
        match self.cursors().get(name).await {
            Ok(Answer::Yes((cursor, _))) => Timestamp::from_millisecond(cursor.through_ms)
                .map_err(|e| {
                    Stop::Retry(format!(
                        "cursor {name} in fires holds an instant out of range ({e}); remove the record to start the schedule afresh"
                    ))
                }),
            Ok(Answer::No(())) => {
                let epoch = fenced(tenure)?;
                let cursor = CursorRecord {
                    through_ms: now.as_millisecond(),
                    epoch,
                    node: self.node_id.clone(),
                };
                self.cursors()
                    .put(name, &cursor)
                    .await
                    .map_err(|e| Stop::Retry(e.to_string()))?;
                info!(subsystem = "scheduler", schedule = %name, from = %now, "new schedule: fires from now on");
                Ok(now)
            }
            Err(e) => Err(Stop::Retry(e.to_string())),
        }
    }

    async fn save_cursor(
        &self,
        name: &str,
        through: Timestamp,
        tenure: &Fence,
        cursors: &mut BTreeMap<String, Timestamp>,
    ) -> Result<(), Stop> {
        let cursor = CursorRecord {
            through_ms: through.as_millisecond(),
            epoch: fenced(tenure)?,
            node: self.node_id.clone(),
        };
        self.cursors()
            .put(name, &cursor)
            .await
            .map_err(|e| Stop::Retry(e.to_string()))?;
        cursors.insert(name.to_owned(), through);
        Ok(())
    }

    async fn record_run(
        &self,
        id: &str,
        name: &str,
        seat: &str,
        at: Timestamp,
        started: Timestamp,
    ) {
        let run = ScheduledRun {
            fire_key: id.to_owned(),
            schedule: name.to_owned(),
            seat: Some(seat.to_owned()),
            due_ms: at.as_millisecond(),
            started_ms: Some(started.as_millisecond()),
            finished_ms: Some(Timestamp::now().as_millisecond()),
            status: RunStatus::Done,
            error: None,
        };
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.record_run(&run)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                warn!(subsystem = "scheduler", fire = %id, error = %e, "scheduled_runs row not written")
            }
            Err(e) => {
                warn!(subsystem = "scheduler", fire = %id, error = %e, "scheduled_runs writer failed")
            }
        }
    }

    /// Records fires missed from `first` to `last`: `count` of them, when
    /// they were counted (a gap past the catch-up ceiling is not).
    async fn missed(
        &self,
        name: &str,
        (first, last): (Timestamp, Timestamp),
        count: Option<usize>,
        why: &str,
    ) {
        warn!(subsystem = "scheduler", schedule = %name, ?count, first = %first, last = %last, why, "fires missed");
        let ev = self.publisher.event(
            "schedule_missed",
            json!({
                "schedule": name, "count": count,
                "first": first.to_string(), "last": last.to_string(), "reason": why,
            }),
        );
        let _ = self.publisher.record(ev).await;
    }
}

/// A fire's claim in `fires` (class `fire`): created before the wake is
/// published, marked published after the stream acknowledged it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FireRecord {
    schedule: String,
    seat: String,
    due_ms: i64,
    /// The claimant's fencing epoch: a successor takes over a claim of an
    /// older epoch, never a newer one.
    epoch: FenceEpoch,
    node: String,
    state: FireState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    published_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum FireState {
    Claimed,
    Published,
}

/// A schedule's cursor in `fires` (class `cursor`): every instant through
/// `through_ms` is resolved.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CursorRecord {
    through_ms: i64,
    epoch: FenceEpoch,
    node: String,
}

impl Scheduler {
    fn fires(&self) -> Claims<FireRecord> {
        self.fires.claims("fire")
    }

    fn cursors(&self) -> Claims<CursorRecord> {
        self.fires.claims("cursor")
    }
}

/// The fire's key in `fires`: schedule, seat and instant.
pub fn fire_id(schedule: &str, seat: &str, at: Timestamp) -> String {
    format!("{schedule}.{seat}.{}", at.as_millisecond())
}

/// The epoch to write with under the tenure a pass started under: every
/// write first asks its fence again, so a lease lost or gone stale mid-pass
/// stops the pass before its next write.
fn fenced(fence: &Fence) -> Result<FenceEpoch, Stop> {
    fence.admitted().ok_or(Stop::Fenced)
}

fn signed(d: Duration) -> jiff::SignedDuration {
    jiff::SignedDuration::try_from(d).expect("a ceiling fits")
}
