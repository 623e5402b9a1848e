//! Steps 4–5 of the module docs for one delivery: claim it fleet-wide,
//! publish it with the claim key as the stream's message id, and wait for
//! the stream's ack through [`crewlet_observe::publish_acked`], the one
//! publish-and-await-ack. Another attempt's young claim is published again
//! under the same id, and the ack's `duplicate` says which attempt the
//! stream kept (the rules are in [`super`]'s docs).

use std::sync::PoisonError;
use std::time::Duration;

use crewlet_bus::{INBOUND_SUBJECT, Inbound, MSG_ID_HEADER, TRACE_HEADER};
use crewlet_coord::Answer;
use crewlet_observe::{AckError, publish_acked};
use crewlet_os::now_ms;
use crewlet_plugins::webhook::{Delivery, Wakes};
use tracing::{info, warn};

use super::outcome::DispatchError;
use super::release::forget;
use super::{ACK_TIMEOUT, CLAIM_TTL, Edge};

/// What the stream's ack said of a publish.
enum Stored {
    /// Stored by this publish.
    Now,
    /// Its message id was stored within the duplicate window already.
    Already,
}

/// Whether the stream still remembers the message id of the delivery
/// `held` claims: the claim was written within the stream's duplicate
/// window, less [`CLOCK_MARGIN`] (the deadline is the broker's clock).
fn stream_remembers(held: &crewlet_coord::Claimed) -> bool {
    let written = held.deadline.checked_sub(CLAIM_TTL);
    let age = written.and_then(|w| crewlet_os::wall_now().duration_since(w).ok());
    // A claim written "after now" is younger than any age.
    let age = age.unwrap_or(Duration::ZERO);
    written.is_some() && age + CLOCK_MARGIN < crewlet_stream::streams::DUPLICATE_WINDOW
}

/// How long after its claim a live claimant has published, on any broker
/// that answers at all (a publish takes milliseconds; one that takes
/// longer is failing, and the claimant answers 503).
const CLAIMANT_HEAD_START: Duration = Duration::from_secs(1);

/// What is left of [`CLAIMANT_HEAD_START`] for the claim `held`.
fn head_start_left(held: &crewlet_coord::Claimed) -> Option<Duration> {
    let written = held.deadline.checked_sub(CLAIM_TTL)?;
    let due = written + CLAIMANT_HEAD_START;
    due.duration_since(crewlet_os::wall_now())
        .ok()
        .map(|d| d.min(CLAIMANT_HEAD_START))
}

/// What the edge allows for its clock and the broker's to differ when it
/// ages a claim against the stream's duplicate window.
const CLOCK_MARGIN: Duration = Duration::from_secs(30);

/// A delivery on the stream: what was published, and whether this attempt
/// holds its claim (`false`: the claim's answer was unknown and failed open).
#[derive(Debug, Clone)]
pub struct Published {
    pub inbound: Inbound,
    pub claimed: bool,
}

impl Edge {
    /// Steps 4–5 for one delivery: claim, publish, wait for the ack.
    /// `Ok(Some(_))` on the stream, `Ok(None)` a duplicate, `Err` our
    /// outage (the claim released in the background).
    pub async fn dispatch(
        &self,
        source: &str,
        handle: Option<&str>,
        d: Delivery,
    ) -> Result<Option<Published>, DispatchError> {
        // Time-ordered, like event ids: the log indexes trace ids too.
        let trace_id = uuid::Uuid::now_v7().to_string();
        let key = format!("{source}:{}", d.delivery_id);
        let claimant = format!("{}/{trace_id}", self.cfg.node_id);
        // A claim of ours not released yet still stands in the way of this
        // retry: release it first.
        let stale = self
            .unreleased
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(stale) = stale {
            if let Err(why) = self.releaser.release(&key, &stale).await {
                return Err(DispatchError::Unreleased { key, why });
            }
            forget(&self.unreleased, &key, &stale);
        }
        let mut claim = self
            .cfg
            .deliveries
            .claim_delivery(&key, &claimant, CLAIM_TTL)
            .await;
        if let Ok(Answer::No(held)) = &claim
            && self.was_abandoned(&key, &held.claimant)
        {
            // Our own earlier attempt's claim, landed late: it published
            // nothing, so it is released and this attempt claims afresh.
            info!(subsystem = "ingress", %key, trace_id, "a claim of an earlier attempt that never published landed late; releasing it");
            if let Err(why) = self.releaser.release(&key, &held.claimant).await {
                return Err(DispatchError::Unreleased { key, why });
            }
            claim = self
                .cfg
                .deliveries
                .claim_delivery(&key, &claimant, CLAIM_TTL)
                .await;
        }
        let (claimed, held) = match claim {
            Ok(Answer::Yes(_)) => (true, None),
            Ok(Answer::No(held)) if !stream_remembers(&held) => return Ok(None),
            Ok(Answer::No(held)) => (false, Some(held)),
            Err(e) => {
                warn!(subsystem = "ingress", %key, trace_id, error = %e, "claim unknown; failing open");
                (false, None)
            }
        };
        let inbound = Inbound {
            trace_id,
            key,
            delivery_id: d.delivery_id,
            source: d.source,
            event_type: d.event_type,
            route_handle: handle.map(str::to_owned),
            mentions: d.addressed.mentions,
            assignees: d.addressed.assignees,
            reviewers: d.addressed.reviewers,
            channel: d.addressed.channel,
            thread: d.addressed.thread,
            text: d.text,
            owed: d.owed.map(|o| crewlet_bus::ReplyTo {
                channel: o.channel,
                thread: o.thread,
            }),
            sender: d.sender,
            wakes: match d.wakes {
                Wakes::RouteAndNamed => crewlet_bus::Wakes::RouteAndNamed,
                Wakes::Named => crewlet_bus::Wakes::Named,
                Wakes::Nobody(why) => crewlet_bus::Wakes::Nobody(why),
            },
            message: d.message,
            received_by: self.cfg.node_id.clone(),
            received_at_ms: now_ms(),
        };
        if let Some(held) = held {
            // Another attempt's claim: whether its delivery is on the stream
            // is the stream's to say. Published again under the same message
            // id, the stream keeps one copy and its ack tells which. A claim
            // younger than [`CLAIMANT_HEAD_START`] is waited out first, so a
            // claimant still publishing is not overtaken (two 202s).
            if let Some(wait) = head_start_left(&held) {
                tokio::time::sleep(wait).await;
            }
            return match self.publish(&inbound).await {
                Ok(Stored::Already) => Ok(None),
                Ok(Stored::Now) => {
                    let (key, trace_id) = (&inbound.key, &inbound.trace_id);
                    info!(subsystem = "ingress", %key, trace_id, claimant = %held.claimant,
                        "a claimed delivery was not on the stream (its attempt never published); published it");
                    Ok(Some(Published {
                        inbound,
                        claimed: false,
                    }))
                }
                // Nothing of ours to release: the claim is the other attempt's.
                Err(e) => Err(DispatchError::NotStored(e)),
            };
        }
        // The claimant answers 202 even when the stream had the message
        // id already (an earlier attempt's publish that timed out and
        // landed late): it holds the claim, so the delivery is its to
        // record.
        if let Err(e) = self.publish(&inbound).await {
            // Claimed, or unknown (a timed-out claim write may still land):
            // released off the answer's path, remembered until it is.
            let why = if claimed { "claimed" } else { "claim unknown" };
            let (key, trace_id) = (&inbound.key, &inbound.trace_id);
            warn!(subsystem = "ingress", %key, trace_id, why, "publish failed; releasing the claim in the background");
            self.unreleased
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.clone(), claimant.clone());
            self.abandon(key, &claimant);
            self.releaser
                .spawn(key.clone(), claimant, !claimed, self.unreleased.clone());
            return Err(DispatchError::NotStored(e));
        }
        Ok(Some(Published { inbound, claimed }))
    }

    /// Remembers that `claimant`'s claim on `key` published nothing.
    fn abandon(&self, key: &str, claimant: &str) {
        let now = tokio::time::Instant::now();
        let mut map = self
            .abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, (_, lapse)| *lapse > now);
        map.insert(key.to_owned(), (claimant.to_owned(), now + CLAIM_TTL));
    }

    /// Whether `claimant`'s claim on `key` is one this node abandoned.
    fn was_abandoned(&self, key: &str, claimant: &str) -> bool {
        let now = tokio::time::Instant::now();
        self.abandoned
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .is_some_and(|(c, lapse)| c == claimant && *lapse > now)
    }

    /// Publishes `inbound` under its claim key as the message id and waits
    /// for the stream's ack.
    async fn publish(&self, inbound: &Inbound) -> Result<Stored, AckError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(MSG_ID_HEADER, inbound.key.as_str());
        headers.insert(TRACE_HEADER, inbound.trace_id.as_str());
        let body = serde_json::to_vec(inbound).expect("inbound serialises");
        let ack = publish_acked(&self.js, INBOUND_SUBJECT, headers, body, ACK_TIMEOUT).await?;
        Ok(if ack.duplicate {
            Stored::Already
        } else {
            Stored::Now
        })
    }
}
