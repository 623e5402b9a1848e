//! One module subscription, consumed as the module's manifest declares.
//!
//! - `once`: the fleet-wide durable [`crewlet_bus::module_durable`] on the
//!   events stream, new events only from the moment it was first created;
//!   every node pulls from it, so each event reaches one instance. One event
//!   at a time per node, acked once the module answered.
//! - `each-node`: an ordered consumer of this node's own from the moment it
//!   starts, so every node's instance sees every event. Nothing to ack: a
//!   retry happens in place, holding the events behind it.
//!
//! Outcomes, the same for both: the module's answer `Ok` is handled; its
//! refusal (`Err(reason)`) is retried after a backoff (1 s doubling) and
//! after [`MAX_REFUSALS`] dead-lettered to [`crewlet_bus::module_dlq_subject`]
//! with the reason (a dead letter that cannot be written is retried, never
//! dropped). A fault (trap, deadline, memory) or a module that was not run
//! (quarantined, busy, not started) is no refusal of the event: it waits
//! ([`WAIT_AFTER_FAULT`], or the breaker's own retry-after) and is offered
//! again, as many times as it takes — the module shows degraded in
//! `/plugins`, and nothing is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use crewlet_bus::{DeadLetter, EVENTS_STREAM};
use crewlet_plugins::manifest::Delivery;
use crewlet_plugins::module::ModulePlugin;
use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::Stats;

/// Refusals of one event before it is dead-lettered.
pub const MAX_REFUSALS: u32 = 5;
/// How long an event waits after the module faulted on it.
const WAIT_AFTER_FAULT: Duration = Duration::from_secs(2);
/// How long a node waits before it tries the stream again.
const RECONNECT: Duration = Duration::from_secs(1);
/// Refusal counts kept per `once` subscription (events in flight on this
/// node are few; an event redelivered elsewhere is counted there).
const KEEP_COUNTS: usize = 1024;

/// What one offer of an event came to.
enum Offer {
    Handled,
    /// Refused by the module, for the n-th time, with its reason.
    Refused(String),
    /// Not the event's fault: the module faulted or was not run.
    Wait(Duration),
}

/// One subscription of one module on this node.
pub struct Subscription {
    pub module: Arc<ModulePlugin>,
    /// The event kind (`turn_ended`, `module.notebook.changed`).
    pub kind: String,
    pub delivery: Delivery,
    pub stats: Arc<Stats>,
}

impl Subscription {
    fn name(&self) -> &str {
        &self.module.manifest().name
    }

    async fn offer(&self, payload: &[u8]) -> Offer {
        let outcome = self.module.on_event(&self.kind, payload).await;
        match outcome {
            Ok(Ok(())) => {
                self.stats.handled();
                Offer::Handled
            }
            Ok(Err(reason)) => {
                self.stats.refused();
                Offer::Refused(crewlet_plugins::scrub::bound(&reason.to_string(), 240))
            }
            Err(e) => {
                self.stats.waited(&e.to_string());
                Offer::Wait(e.retry_after().unwrap_or(WAIT_AFTER_FAULT))
            }
        }
    }

    /// Consumes until `stop`, reconnecting while the stream cannot be read.
    pub async fn run(self, js: jetstream::Context, mut stop: watch::Receiver<bool>) {
        loop {
            let result = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                r = self.consume(&js) => r,
            };
            if let Err(e) = result {
                warn!(subsystem = "modules", module = %self.name(), kind = %self.kind, error = %e, "subscription interrupted; reopening");
                self.stats.set_state("reopening", Some(e));
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(RECONNECT) => {}
            }
        }
    }

    async fn consume(&self, js: &jetstream::Context) -> Result<(), String> {
        let stream = js
            .get_stream(EVENTS_STREAM)
            .await
            .map_err(|e| format!("cannot read stream {EVENTS_STREAM}: {e}"))?;
        let subject = crewlet_bus::event_subject(&self.kind);
        match self.delivery {
            Delivery::Once => self.consume_once(js, &stream, subject).await,
            Delivery::EachNode => self.consume_each(js, &stream, subject).await,
        }
    }

    async fn consume_once(
        &self,
        js: &jetstream::Context,
        stream: &jetstream::stream::Stream,
        subject: String,
    ) -> Result<(), String> {
        let durable = crewlet_bus::module_durable(self.name(), &self.kind);
        let deadline = self.module.manifest().limits.deadline;
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                &durable,
                consumer::pull::Config {
                    durable_name: Some(durable.clone()),
                    filter_subject: subject,
                    deliver_policy: consumer::DeliverPolicy::New,
                    ack_policy: consumer::AckPolicy::Explicit,
                    // An answer takes at most the module's deadline; a
                    // node that died holding an event loses it for this long.
                    ack_wait: deadline * 2 + Duration::from_secs(5),
                    description: Some(format!("module {}: {} (once)", self.name(), self.kind)),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("cannot open consumer {durable}: {e}"))?;
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(1)
            .messages()
            .await
            .map_err(|e| format!("cannot pull from {durable}: {e}"))?;
        self.stats.set_state("consuming", None);
        let mut refusals: HashMap<u64, u32> = HashMap::new();
        while let Some(next) = messages.next().await {
            let msg = next.map_err(|e| format!("pull from {durable} failed: {e}"))?;
            let seq = msg.info().map(|i| i.stream_sequence).unwrap_or_default();
            match self.offer(&msg.payload).await {
                Offer::Handled => {
                    refusals.remove(&seq);
                    ack(&msg, AckKind::Ack).await;
                }
                Offer::Wait(delay) => ack(&msg, AckKind::Nak(Some(delay))).await,
                Offer::Refused(reason) => {
                    if refusals.len() >= KEEP_COUNTS {
                        refusals.clear();
                    }
                    let n = refusals.entry(seq).or_default();
                    *n += 1;
                    if *n < MAX_REFUSALS {
                        ack(&msg, AckKind::Nak(Some(backoff(*n)))).await;
                        continue;
                    }
                    let delivered = msg.info().map(|i| i.delivered).unwrap_or_default();
                    let letter = self.letter(&msg.payload, reason, *n, delivered);
                    match self.dead_letter(js, &letter).await {
                        Ok(()) => {
                            refusals.remove(&seq);
                            ack(&msg, AckKind::Ack).await;
                        }
                        Err(e) => {
                            warn!(subsystem = "modules", module = %self.name(), error = %e, "cannot dead-letter; the event comes back");
                            ack(&msg, AckKind::Nak(Some(WAIT_AFTER_FAULT))).await;
                        }
                    }
                }
            }
        }
        Err(format!("the pull from {durable} ended"))
    }

    async fn consume_each(
        &self,
        js: &jetstream::Context,
        stream: &jetstream::stream::Stream,
        subject: String,
    ) -> Result<(), String> {
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject,
                deliver_policy: consumer::DeliverPolicy::New,
                description: Some(format!("module {}: {} (each node)", self.name(), self.kind)),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("cannot open an ordered consumer: {e}"))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|e| format!("cannot read the ordered consumer: {e}"))?;
        self.stats.set_state("consuming", None);
        while let Some(next) = messages.next().await {
            let msg = next.map_err(|e| format!("the ordered consumer failed: {e}"))?;
            let mut refused = 0;
            loop {
                match self.offer(&msg.payload).await {
                    Offer::Handled => break,
                    Offer::Wait(delay) => tokio::time::sleep(delay).await,
                    Offer::Refused(reason) => {
                        refused += 1;
                        if refused < MAX_REFUSALS {
                            tokio::time::sleep(backoff(refused)).await;
                            continue;
                        }
                        let letter = self.letter(&msg.payload, reason, refused, refused.into());
                        match self.dead_letter(js, &letter).await {
                            Ok(()) => break,
                            Err(e) => {
                                warn!(subsystem = "modules", module = %self.name(), error = %e, "cannot dead-letter; offering the event again");
                                tokio::time::sleep(WAIT_AFTER_FAULT).await;
                            }
                        }
                    }
                }
            }
        }
        Err("the ordered consumer ended".to_string())
    }

    fn letter(&self, payload: &[u8], reason: String, refusals: u32, delivered: i64) -> DeadLetter {
        DeadLetter {
            reason: format!("module {} refused it: {reason}", self.name()),
            failures: refusals.into(),
            delivered,
            owed: None,
            subject: crewlet_bus::event_subject(&self.kind),
            trace_id: None,
            original: String::from_utf8_lossy(payload).into_owned(),
        }
    }

    async fn dead_letter(
        &self,
        js: &jetstream::Context,
        letter: &DeadLetter,
    ) -> Result<(), String> {
        let body = serde_json::to_vec(letter).map_err(|e| e.to_string())?;
        let subject = crewlet_bus::module_dlq_subject(self.name());
        js.publish(subject, body.into())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        self.stats.dead_lettered();
        warn!(subsystem = "modules", module = %self.name(), kind = %self.kind, reason = %letter.reason, "event dead-lettered");
        Ok(())
    }
}

/// The wait after the n-th refusal: 1 s, 2 s, 4 s, 8 s.
fn backoff(n: u32) -> Duration {
    Duration::from_secs(1 << n.saturating_sub(1).min(5))
}

async fn ack(msg: &jetstream::Message, kind: AckKind) {
    if let Err(e) = msg.ack_with(kind).await {
        debug!(subsystem = "modules", error = %e, "ack not sent; the event comes back after the ack wait");
    }
}
