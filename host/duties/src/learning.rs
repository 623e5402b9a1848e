//! `worker:learning`: what the company's seats learn from their own work,
//! one pass a tick on the duty's holder.
//!
//! Each pass, for every seat of the company (its memory first replayed from
//! `CREWLET_MEMORY` into this node's store, so the holder sees the rows of
//! seats other nodes serve):
//! - **compaction**: episodes past the newest [`KEEP_EPISODES`] are folded
//!   into the seat's digest episode, so recall scans a bounded table;
//! - **ageing**: skills unused for long lose strength and retire
//!   (`crewlet_store`'s half-life rule, `duties.skill_half_life_days`);
//! - **induction**: once a seat has [`MIN_EPISODES`] successful episodes
//!   since its last reflection, one reflection call over them
//!   ([`super::reflection`]: the seat's chain, its budget, declined when
//!   the window is full) may write a skill or a new version of one;
//! - **promotion**: a skill two seats of one role induced independently
//!   is written to every other seat of the role;
//! - **re-embedding**: at most [`REEMBED_PER_PASS`] of a seat's notes and
//!   episodes whose vector recall cannot compare with the company's
//!   `[memory] embedding` (another model or dimension, or none) are
//!   embedded again through the same `Embeddings` as turns (the seat's
//!   budget checked before, charged after); a row that cannot be embedded
//!   stays as it is and is named in the pass's event.
//!
//! Rules, and why:
//! - The tenure's fence is asked before each seat's writes (and before
//!   promotion) and the pass stops when it does not admit: a holder frozen past its TTL must not write what a
//!   newer holder is writing too. Every row written goes to the memory
//!   changelog, so what a seat learned follows it.
//! - Every pass is one `learning_pass` event: what it did per seat, and
//!   `outcome: failed` with why when a reflection answered garbage (no
//!   skill is written from it). A seat's reflection watermark (the newest
//!   episode it read) moves on an answer — a skill, nothing, or garbage —
//!   and not on a refusal or an outage, which are asked again next pass.
//!   It is a row of the seat's memory (`learning_marks`, only forward),
//!   replayed with the rest, so a new holder of the duty goes on from
//!   where the last one stopped; a seat without one starts from its
//!   newest induced skill.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_company::Active;
use crewlet_config::DutiesConfig;
use crewlet_coord::{Budgets, Fence, FenceEpoch};
use crewlet_memory::{
    Changelog, Diary, Episodes, Memory, MemoryError, ReflectionMarks, SkillVersions, Skills,
};
use crewlet_store::{
    Learned, MemoryKind, Origin, ReflectionMark, SkillRow, SkillVersionRow, Store, Vector,
};
use crewlet_turns::{Brain, EmbedError, EmbedSite, Embedder};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use super::reflection::{self, Reflected};

/// Successful episodes a seat needs since its last reflection.
pub const MIN_EPISODES: usize = 3;
/// The most episodes one reflection reads.
pub const MAX_EPISODES: usize = 10;
/// A seat's newest episodes kept whole; older ones are folded.
pub const KEEP_EPISODES: usize = 200;
/// Seats of one role that must have induced a skill for it to be
/// promoted to the whole role.
pub const PROMOTE_AT: usize = 2;
/// The most rows of one seat re-embedded in one pass (one call each, so
/// a row the provider refuses is named alone).
pub const REEMBED_PER_PASS: usize = 16;
/// How long a stopping duty waits for its queued rows to reach the stream.
const FLUSH: Duration = Duration::from_secs(5);

/// What the learning duty is started with: its own model layer (so it
/// runs on a `workers` node without `seats`), the node's connection for
/// the memory stream.
pub struct Inputs<B, E> {
    pub client: async_nats::Client,
    pub store: Arc<Store>,
    pub publisher: crewlet_observe::Publisher,
    pub active: crewlet_company::ActiveCompany,
    pub config: DutiesConfig,
    pub budgets: Budgets,
    pub models: Arc<B>,
    /// The company's embedding model, as turns embed with it (charged to
    /// the seat's budget like theirs).
    pub embedder: E,
}

/// The learning duty's work loop and what it writes with.
pub struct Learning<B, E> {
    with: Inputs<B, E>,
    /// The memory stream with every table a seat's memory has.
    memory: Memory,
    changelog: Changelog,
    /// The company's embedding model, as turns embed with it.
    /// The changelog's publishing task, ended after its last rows.
    carrier: tokio::task::JoinHandle<()>,
}

/// What one pass did to one seat.
#[derive(Default)]
struct SeatPass {
    report: serde_json::Map<String, Value>,
    failed: Option<String>,
}

impl<B: Brain, E: Embedder> Learning<B, E> {
    /// Ticks until `stop`, working only while `tenure` admits.
    pub async fn run(
        self,
        tenure: watch::Receiver<Option<Fence>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut next = Instant::now() + self.with.config.learning_tick;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            next = Instant::now() + self.with.config.learning_tick;
            if admitted(&tenure).is_none() {
                continue;
            }
            tokio::select! {
                _ = self.pass(&tenure) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        self.changelog.close(FLUSH).await;
        self.carrier.abort();
    }

    /// The duty's memory stream and changelog, opened on the node's
    /// connection; the rest comes from `inputs`.
    pub async fn equip(inputs: Inputs<B, E>) -> Result<Learning<B, E>, MemoryError> {
        let memory = Memory::open(async_nats::jetstream::new(inputs.client.clone())).await?;
        let memory = crewlet_memory::memory_tables(memory, &inputs.store);
        let (changelog, carrier) = Changelog::start(memory.clone());
        Ok(Learning {
            with: inputs,
            memory,
            changelog,
            carrier,
        })
    }

    async fn pass(&self, tenure: &watch::Receiver<Option<Fence>>) {
        let began = Instant::now();
        let Some(epoch) = admitted(tenure) else {
            return;
        };
        let Some(active) = self.with.active.current() else {
            self.event(json!({ "epoch": epoch, "outcome": "skipped", "why": "this node serves no company yet" }))
                .await;
            return;
        };
        let mut seats = Vec::new();
        let mut failures = Vec::new();
        let mut fenced = false;
        for handle in active.company.handles() {
            if admitted(tenure) != Some(epoch) {
                fenced = true;
                break;
            }
            let done = self.seat(&active, handle.as_str()).await;
            if let Some(why) = done.failed {
                failures.push(format!("{handle}: {why}"));
            }
            let mut report = done.report;
            report.insert("seat".into(), json!(handle.as_str()));
            seats.push(Value::Object(report));
        }
        let promoted = if fenced || admitted(tenure) != Some(epoch) {
            fenced = true;
            Vec::new()
        } else {
            self.promote(&active)
        };
        let outcome = match (fenced, failures.is_empty()) {
            (true, _) => "fenced",
            (false, true) => "ok",
            (false, false) => "failed",
        };
        info!(subsystem = "learning", %epoch, outcome, seats = seats.len(), promoted = promoted.len(), "learning pass");
        self.event(json!({
            "epoch": epoch,
            "outcome": outcome,
            "why": (!failures.is_empty()).then(|| failures.join("; ")),
            "seats": seats,
            "promoted": promoted,
            "took_ms": began.elapsed().as_millis() as u64,
        }))
        .await;
    }

    /// Hydrate, age, maybe reflect: one seat's share of a pass.
    async fn seat(&self, active: &Active, seat: &str) -> SeatPass {
        let mut out = SeatPass::default();
        match self.memory.hydrate(seat).await {
            Ok(h) => {
                out.report.insert("hydrated_rows".into(), json!(h.rows));
            }
            Err(e) => {
                // Unknown, not empty: a seat whose memory cannot be read is
                // neither aged nor reflected on this pass.
                out.report.insert("skipped".into(), json!(e.to_string()));
                return out;
            }
        }
        let now = crewlet_os::now_ms();
        match self.with.store.compact_episodes(seat, KEEP_EPISODES, now) {
            Ok(Some(digest)) => {
                out.report.insert("compacted".into(), json!(true));
                if let Err(e) = self.changelog.offer::<Episodes>(&digest) {
                    warn!(subsystem = "learning", seat, error = %e, "episode digest not published");
                }
            }
            Ok(None) => {}
            Err(e) => {
                out.report
                    .insert("compaction_error".into(), json!(e.to_string()));
            }
        }
        let half_life = self.with.config.skill_half_life.as_millis() as i64;
        match self.with.store.age_skills(seat, now, half_life) {
            Ok(retired) => {
                let ids: Vec<&str> = retired.iter().map(|s| s.skill_id.as_str()).collect();
                out.report.insert("retired".into(), json!(ids));
                for row in &retired {
                    self.offer_skill(row, None);
                }
            }
            Err(e) => {
                out.report
                    .insert("ageing_error".into(), json!(e.to_string()));
            }
        }
        if let Some(done) = self.reembed(seat).await {
            out.report.insert("reembedding".into(), done);
        }
        out.report.insert(
            "reflection".into(),
            self.induce(active, seat, &mut out.failed).await,
        );
        out
    }

    /// Re-embeds what recall cannot compare of `seat`'s memory; `None`
    /// when there is nothing to (or no embedding model: recall is by
    /// recency and no vector is compared).
    async fn reembed(&self, seat: &str) -> Option<Value> {
        let model = self.with.embedder.model()?;
        let rows = match self
            .with
            .store
            .unmatched_vectors(seat, &model, REEMBED_PER_PASS)
        {
            Ok(rows) if rows.is_empty() => return None,
            Ok(rows) => rows,
            Err(e) => return Some(json!({ "error": e.to_string() })),
        };
        let site = EmbedSite {
            seat: seat.to_owned(),
            turn_id: None,
        };
        let (mut done, mut not) = (0, Vec::new());
        let mut stopped: Option<String> = None;
        for row in rows {
            let named =
                |why: &str| json!({ "kind": row.kind.as_str(), "key": row.key, "why": why });
            if let Some(why) = &stopped {
                not.push(named(why));
                continue;
            }
            let vector = match self
                .with
                .embedder
                .embed(vec![row.text.clone()], &site)
                .await
            {
                Ok(mut e) if e.vectors.len() == 1 => Vector {
                    model: e.model,
                    values: e.vectors.remove(0),
                },
                Ok(e) => {
                    not.push(named(&format!("{} vectors for one text", e.vectors.len())));
                    continue;
                }
                Err(e) => {
                    let why = e.to_string();
                    // A full window or a provider away: the rest would be
                    // refused alike; they are asked again next pass.
                    if matches!(
                        e,
                        EmbedError::Refused(_) | EmbedError::Unavailable(_) | EmbedError::Off
                    ) {
                        stopped = Some(why.clone());
                    }
                    not.push(named(&why));
                    continue;
                }
            };
            let now = crewlet_os::now_ms();
            let written = match row.kind {
                MemoryKind::Note => self
                    .with
                    .store
                    .reembed_note(seat, &row.key, vector, now)
                    .map(|r| r.map(|r| self.changelog.offer::<Diary>(&r))),
                MemoryKind::Episode => self
                    .with
                    .store
                    .reembed_episode(seat, &row.key, vector, now)
                    .map(|r| r.map(|r| self.changelog.offer::<Episodes>(&r))),
            };
            match written {
                Ok(Some(Err(e))) => {
                    warn!(subsystem = "learning", seat, error = %e, "re-embedded row not published");
                    done += 1;
                }
                Ok(Some(Ok(()))) => done += 1,
                Ok(None) => {}
                Err(e) => not.push(named(&e.to_string())),
            }
        }
        Some(json!({ "model": model, "reembedded": done, "not_reembedded": not }))
    }

    async fn induce(&self, active: &Active, seat: &str, failed: &mut Option<String>) -> Value {
        let Some(seat_def) = active.company.seat(seat) else {
            return json!({ "state": "skipped", "why": "not a seat of the company" });
        };
        let role = active.company.role_of(seat_def);
        let mark = match self.with.store.reflection_mark(seat) {
            Ok(Some(m)) => m.reflected_ms,
            Ok(None) => match self.with.store.last_induced_ms(seat) {
                Ok(m) => m.unwrap_or(0),
                Err(e) => return json!({ "state": "unavailable", "why": e.to_string() }),
            },
            Err(e) => return json!({ "state": "unavailable", "why": e.to_string() }),
        };
        let episodes = match self
            .with
            .store
            .successful_episodes(seat, mark, MAX_EPISODES)
        {
            Ok(e) => e,
            Err(e) => return json!({ "state": "unavailable", "why": e.to_string() }),
        };
        if episodes.len() < MIN_EPISODES {
            return json!({ "state": "waiting", "episodes": episodes.len(), "needs": MIN_EPISODES });
        }
        let known: Vec<String> = match self.with.store.active_skills(seat, 20) {
            Ok(s) => s.into_iter().map(|(s, _)| s.name).collect(),
            Err(e) => return json!({ "state": "unavailable", "why": e.to_string() }),
        };
        let pass = format!("learning-{seat}-{}", crewlet_os::now_ms());
        let messages = reflection::prompt(seat, &episodes, &known);
        let answer = reflection::reflect(
            self.with.models.as_ref(),
            &self.with.budgets,
            &active.company,
            role,
            seat,
            messages,
            &pass,
        )
        .await;
        let mut report = answer.report();
        let newest = episodes.last().map_or(mark, |e| e.ended_ms);
        let ids: Vec<String> = episodes.iter().map(|e| e.turn_id.clone()).collect();
        match &answer {
            Reflected::Skill {
                name,
                procedure,
                model,
                ..
            } => {
                let learned = Learned {
                    seat,
                    name,
                    origin: Origin::Induced,
                    promoted_from: &[],
                    procedure,
                    episodes: &ids,
                    model,
                };
                match self.with.store.learn_skill(&learned, crewlet_os::now_ms()) {
                    Ok((skill, version)) => {
                        report["skill"] = json!(skill.skill_id);
                        report["version"] = json!(version.version);
                        self.offer_skill(&skill, Some(&version));
                        self.mark(seat, newest);
                    }
                    Err(e) => {
                        report["state"] = json!("failed");
                        report["why"] = json!(e.to_string());
                        *failed = Some(e.to_string());
                    }
                }
            }
            Reflected::Nothing { .. } => {
                self.mark(seat, newest);
            }
            Reflected::Garbage { why, .. } => {
                warn!(subsystem = "learning", seat, %why, "the reflection answered no skill; nothing written");
                *failed = Some(why.clone());
                self.mark(seat, newest);
            }
            Reflected::Declined(_) | Reflected::Unavailable(_) => {}
        }
        report["episodes"] = json!(ids);
        report
    }

    /// Writes every promotion of every role; answers what was written.
    fn promote(&self, active: &Active) -> Vec<Value> {
        let mut by_role: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (handle, seat) in &active.company.seats {
            by_role
                .entry(seat.role.as_str())
                .or_default()
                .push(handle.as_str().to_owned());
        }
        let mut out = Vec::new();
        for (role, seats) in by_role {
            let offers = match self.with.store.promotions(&seats, PROMOTE_AT) {
                Ok(o) => o,
                Err(e) => {
                    warn!(subsystem = "learning", role, error = %e, "promotions not read");
                    continue;
                }
            };
            for p in offers {
                for to in &p.to {
                    match self
                        .with
                        .store
                        .learn_skill(&p.for_seat(to), crewlet_os::now_ms())
                    {
                        Ok((skill, version)) => self.offer_skill(&skill, Some(&version)),
                        Err(e) => {
                            warn!(subsystem = "learning", seat = %to, error = %e, "promotion not written");
                            continue;
                        }
                    }
                }
                out.push(json!({ "role": role, "skill": p.skill_id, "from": p.from, "to": p.to }));
            }
        }
        out
    }

    /// Moves `seat`'s reflection watermark to `reflected_ms`, here and on
    /// the stream.
    fn mark(&self, seat: &str, reflected_ms: i64) {
        let mark = ReflectionMark {
            seat: seat.to_owned(),
            reflected_ms,
            updated_ms: crewlet_os::now_ms(),
        };
        match self
            .with
            .store
            .put_reflection_marks(std::slice::from_ref(&mark))
        {
            Ok(_) => {
                if let Err(e) = self.changelog.offer::<ReflectionMarks>(&mark) {
                    warn!(subsystem = "learning", seat, error = %e, "reflection watermark not published");
                }
            }
            Err(e) => {
                warn!(subsystem = "learning", seat, error = %e, "reflection watermark not kept; the next pass may read the same episodes")
            }
        }
    }

    fn offer_skill(&self, skill: &SkillRow, version: Option<&SkillVersionRow>) {
        if let Err(e) = self.changelog.offer::<Skills>(skill) {
            warn!(subsystem = "learning", seat = %skill.seat, error = %e, "skill row not published");
        }
        if let Some(v) = version
            && let Err(e) = self.changelog.offer::<SkillVersions>(v)
        {
            warn!(subsystem = "learning", seat = %v.seat, error = %e, "skill version not published");
        }
    }

    async fn event(&self, payload: Value) {
        let ev = self.with.publisher.event("learning_pass", payload);
        let _ = self.with.publisher.record(ev).await;
    }
}

fn admitted(tenure: &watch::Receiver<Option<Fence>>) -> Option<FenceEpoch> {
    tenure.borrow().as_ref().and_then(Fence::admitted)
}
