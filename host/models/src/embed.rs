//! The company's embedding model (`[memory] embedding`) as the turn
//! engine's [`Embedder`] port.
//!
//! Rules, and why:
//! - One model, no chain: vectors of two models are never compared, so a
//!   fallback would only make vectors recall cannot use. A failure is
//!   [`EmbedError::Unavailable`] (recall falls back to recency), never a
//!   failed turn.
//! - The same key pool and cooldowns as completions ([`Inner::with_keys`]):
//!   a rate-limited or refused key is benched here and for the fleet, and
//!   the next key is tried; a provider that does not embed (a 0.4.1
//!   component, Anthropic) is unavailable, saying so.
//! - The same budgets: before the call, a capped seat's windows are read
//!   and a batch whose estimate (a quarter of its characters, the turn's
//!   rule) does not fit is refused — recorded once, nothing sent
//!   ([`EmbedError::Refused`]). After it, the tokens the vendor counted are
//!   charged to the company and the seat, in the windows current then. An
//!   unreachable counter is our outage ([`EmbedError::Unavailable`]), never
//!   "out of budget".
//! - Every call is a `model_call` event, phase `embedding`, so its tokens
//!   show in the seat's spend beside its turns' calls.
//! - The company is read at each call: a new revision's `[memory]` applies
//!   to the next embedding.

use std::sync::Arc;
use std::time::Instant;

use crewlet_company::{ActiveCompany, Ceilings, Company, ModelRef};
use crewlet_coord::{Answer, Budgets, Caps, Period, Scope};
use crewlet_plugins::provider::{Credential, EmbedError as Refusal, EmbedRequest};
use crewlet_turns::{EmbedError, EmbedSite, Embedded, Embedder, windows_at};
use serde_json::json;
use tracing::warn;

use crate::{Inner, Miss, Whom, label, options_json};

/// The phase label of an embedding's events.
pub const PHASE: &str = "embedding";

/// The company's embedding model through this node's model layer.
#[derive(Clone)]
pub struct Embeddings {
    inner: Arc<Inner>,
    budgets: Budgets,
    active: ActiveCompany,
}

impl crate::Models {
    /// The [`Embedder`] of the company `active` serves, charged to
    /// `budgets`, through this layer's key pool and cooldowns.
    pub fn embedder(&self, budgets: Budgets, active: ActiveCompany) -> Embeddings {
        Embeddings {
            inner: self.inner.clone(),
            budgets,
            active,
        }
    }
}

fn caps(c: &Ceilings) -> Caps {
    Caps {
        day: c.day,
        week: c.week,
        month: c.month,
    }
}

/// The company's and the seat's caps; `None` when the company has no
/// such seat.
fn caps_of(company: &Company, seat: &str) -> Option<(Caps, Caps)> {
    let s = company.seat(seat)?;
    Some((caps(&company.budget), caps(&company.role_of(s).budget)))
}

/// A batch's tokens as the budget meter estimates them before the call: a
/// quarter of its characters, rounded up (the turn's rule).
fn estimate(texts: &[String]) -> u64 {
    let chars: usize = texts.iter().map(|t| t.chars().count()).sum();
    (chars as u64).div_ceil(4)
}

impl Embedder for Embeddings {
    fn model(&self) -> Option<String> {
        let active = self.active.current()?;
        active.company.embedding.as_ref().map(label)
    }

    async fn embed(&self, texts: Vec<String>, site: &EmbedSite) -> Result<Embedded, EmbedError> {
        let active = self.active.current().ok_or(EmbedError::Off)?;
        let company = active.company;
        let entry = company.embedding.as_ref().ok_or(EmbedError::Off)?;
        let (company_caps, seat_caps) = caps_of(&company, &site.seat).ok_or_else(|| {
            EmbedError::Refused(format!(
                "the company has no seat {:?} to charge the embedding to",
                site.seat
            ))
        })?;
        let whom = Whom {
            seat: site.seat.clone(),
            turn_id: site.turn_id.clone(),
            phase: PHASE,
            iteration: None,
            trace_id: None,
        };
        self.room(&company, &site.seat, &company_caps, &seat_caps, &texts)
            .await?;
        let started = Instant::now();
        let (answer, slot) = self.call(entry, &texts, &whom).await?;
        let tokens = u64::from(answer.input_tokens);
        self.inner
            .emit(
                "model_call",
                Some(&whom),
                json!({
                    "model": label(entry), "slot": slot, "input_tokens": tokens, "output_tokens": 0,
                    "texts": texts.len(), "tool_calls": [],
                    "ms": started.elapsed().as_millis() as u64,
                }),
            )
            .await;
        let windows = windows_at(&company, std::time::SystemTime::now());
        let charged = self
            .budgets
            .charge(&site.seat, &windows, &company_caps, &seat_caps, tokens)
            .await;
        if let Err(e) = charged {
            return Err(EmbedError::Unavailable(format!(
                "the budget counters are unreachable, so the embedding's {tokens} tokens could not be charged: {e}"
            )));
        }
        // A refusal of this charge is counted; it stops the next call, as
        // a turn's does: these vectors were paid for.
        check(&answer.vectors, texts.len())?;
        Ok(Embedded {
            model: label(entry),
            vectors: answer.vectors,
            tokens,
        })
    }
}

impl Embeddings {
    /// Refuses a batch a capped window has no room for, recording the
    /// refusal; uncapped, nothing is read.
    async fn room(
        &self,
        company: &Company,
        seat: &str,
        company_caps: &Caps,
        seat_caps: &Caps,
        texts: &[String],
    ) -> Result<(), EmbedError> {
        if *company_caps == Caps::default() && *seat_caps == Caps::default() {
            return Ok(());
        }
        let unreachable = |e: crewlet_coord::CoordError| {
            EmbedError::Unavailable(format!("the budget counters are unreachable: {e}"))
        };
        let windows = windows_at(company, std::time::SystemTime::now());
        let seat_scope = Scope::Seat(seat.to_owned());
        let (c, s) = tokio::join!(
            self.budgets.budget(&Scope::Company, &windows),
            self.budgets.budget(&seat_scope, &windows)
        );
        let (c, s) = (c.map_err(unreachable)?, s.map_err(unreachable)?);
        let cap = |caps: &Caps, p: Period| match p {
            Period::Day => caps.day,
            Period::Week => caps.week,
            Period::Month => caps.month,
        };
        let room = Period::ALL
            .into_iter()
            .flat_map(|p| {
                [
                    cap(company_caps, p).map(|k| k.saturating_sub(c.slot(p).spent)),
                    cap(seat_caps, p).map(|k| k.saturating_sub(s.slot(p).spent)),
                ]
            })
            .flatten()
            .min()
            .unwrap_or(u64::MAX);
        let need = estimate(texts);
        if need < room {
            return Ok(());
        }
        let refused = self
            .budgets
            .refuse_for(seat, &windows, company_caps, seat_caps, need)
            .await
            .map_err(unreachable)?;
        let why = match refused {
            Answer::Yes(r) => format!(
                "the {} budget's {:?} window has {} of {} tokens spent; the batch needs about {need}",
                match &r.scope {
                    Scope::Company => "company".to_owned(),
                    Scope::Seat(h) => format!("seat {h}"),
                },
                r.period,
                r.spent,
                r.cap
            ),
            // The counter moved under the read (a window turned).
            Answer::No(()) => {
                format!("about {need} tokens do not fit the {room} left in the seat's window")
            }
        };
        Err(EmbedError::Refused(why))
    }

    /// The one embedding call through the key pool.
    async fn call(
        &self,
        entry: &ModelRef,
        texts: &[String],
        whom: &Whom,
    ) -> Result<(crewlet_plugins::provider::Embedded, String), EmbedError> {
        let options_json = options_json(entry);
        let mut attempts = Vec::new();
        let answered = self
            .inner
            .with_keys(entry, whom, &mut attempts, |plugin, key| {
                let request = EmbedRequest {
                    base_url: String::new(),
                    model: entry.model.clone(),
                    inputs: texts.to_vec(),
                    credential: Credential {
                        api_key: key.to_owned(),
                    },
                    options_json: options_json.clone(),
                };
                async move {
                    match plugin.embed(request).await {
                        Ok(Ok(embedded)) => Ok(embedded),
                        Ok(Err(Refusal::Failed(e))) => Err(Miss::Provider(e)),
                        Ok(Err(Refusal::Unsupported(why))) => Err(Miss::Unsupported(why)),
                        Err(fault) => Err(Miss::Fault(fault)),
                    }
                }
            })
            .await;
        match answered {
            Ok((embedded, hint)) => Ok((embedded, crate::slot(entry, hint.as_ref()))),
            Err(leave) => {
                // Every attempt's line: a 429 is why the key then cools.
                let lines: Vec<&str> = attempts
                    .iter()
                    .filter_map(|a| match &a.outcome {
                        crate::Outcome::Failed { line, .. } => Some(line.as_str()),
                        crate::Outcome::Answered => None,
                    })
                    .collect();
                let why = if lines.is_empty() {
                    leave.line
                } else {
                    lines.join("; then ")
                };
                warn!(model = %label(entry), seat = %whom.seat, reason = %why,
                    "no embedding: recall falls back to recency");
                Err(EmbedError::Unavailable(format!("{}: {why}", label(entry))))
            }
        }
    }
}

/// One vector per text, all of one non-zero dimension.
fn check(vectors: &[Vec<f32>], texts: usize) -> Result<(), EmbedError> {
    if vectors.len() != texts {
        return Err(EmbedError::Malformed(format!(
            "{} vectors for {texts} texts",
            vectors.len()
        )));
    }
    let dim = vectors.first().map_or(0, Vec::len);
    if texts > 0 && (dim == 0 || vectors.iter().any(|v| v.len() != dim)) {
        return Err(EmbedError::Malformed(format!(
            "vectors of dimensions {:?}: expected one dimension above zero",
            vectors.iter().map(Vec::len).collect::<Vec<_>>()
        )));
    }
    Ok(())
}
