//! The notification service: parse → resolve → valve → wake.
//!
//! Rules, and why:
//! - **One group, fleet-wide.** Every node pulls from the one durable
//!   consumer [`DURABLE`], so each delivery is worked by one node at a time.
//!   The consumer is created before the edge answers anything: the stream
//!   has interest retention and would drop a delivery nobody is subscribed
//!   to.
//! - **Resolve through the org.** Route handle, mentions, assignees and
//!   reviewers that name a seat of the active company (leading `@`
//!   stripped); seat ids are UUIDv5, so every node answers the same.
//! - **The valve fails closed by delaying.** A closed or unknown valve naks
//!   with [`RETRY_DELAY`]; the delivery comes back, it is not dropped — and
//!   a delay never counts towards dead-lettering (a busy seat is not a bad
//!   message). The same holds while no company is active.
//! - **Wakes are idempotent on the stream.** Each carries the message id
//!   `SOURCE:ID:HANDLE`, so a redelivery after a partial wake does not wake
//!   a seat twice within the stream's duplicate window.
//! - **Bounded retries.** The consumer itself redelivers without limit;
//!   this service dead-letters on delivery [`MAX_DELIVER`] (publish to
//!   [`crate::DLQ_SUBJECT`] with the reason, then ack). Counting here rather
//!   than with the server's `max_deliver` means a DLQ publish that fails is
//!   retried instead of the message vanishing at the limit.
//! - **Addressed to nobody** is an `delivery_unrouted` event and an ack.
//! - **A shedding node stops consuming.** While [`NotifyConfig::admitting`]
//!   is false (the node's config posture is `shed`: peers have the epoch
//!   this node cannot apply), the service hands back every delivery its
//!   pull already holds (a nak, redelivered after [`HAND_BACK_DELAY`] to
//!   whichever node pulls it) and then stops pulling, so a peer that has the
//!   epoch works it instead of this node working it against a company it is
//!   no longer sure of. A delivery the server sent to the dropped pull
//!   after that comes back after the consumer's ack wait.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use crewlet_company::{Company, Handle, seat_id};
use crewlet_coord::{Answer, Coord};
use crewlet_observe::Publisher;
use crewlet_store::Party;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::message::{Inbound, Wake};
use crate::{DLQ_SUBJECT, INBOUND_SUBJECT, NOTIFICATIONS_STREAM, TRACE_HEADER};

/// The fleet-wide durable consumer (and queue group) name.
pub const DURABLE: &str = "notify-inbound";
/// The delivery on which a failing message is dead-lettered.
pub const MAX_DELIVER: i64 = 5;
/// How long a refused or failed delivery waits before it comes back.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);
/// Wakes per seat per [`VALVE_WINDOW`], fleet-wide.
pub const VALVE_LIMIT: u64 = 30;
/// The valve's window (at most half the rate bucket's 60 s age).
pub const VALVE_WINDOW: Duration = Duration::from_secs(30);
/// How long the service may hold a delivery before the server redelivers it.
const ACK_WAIT: Duration = Duration::from_secs(30);
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a shedding node keeps handing back what its pull delivers
/// before it drops the pull.
const HAND_BACK_QUIET: Duration = Duration::from_millis(200);
/// A handed-back delivery is redelivered after this: longer than
/// [`HAND_BACK_QUIET`], so it does not come straight back into the pull
/// this node is draining (a nak without delay loops there), short enough
/// for a peer to take it at once.
pub const HAND_BACK_DELAY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("cannot open stream {NOTIFICATIONS_STREAM}: {0}")]
    Stream(String),
    #[error("cannot create the {DURABLE} consumer: {0}")]
    Consumer(String),
}

/// What the service works with.
#[derive(Clone)]
pub struct NotifyConfig {
    pub client: async_nats::Client,
    pub coord: Coord,
    pub publisher: Publisher,
    pub active: crewlet_company::ActiveCompany,
    /// True while this node admits triggers; false while it sheds.
    pub admitting: watch::Receiver<bool>,
}

/// The running service.
pub struct NotifyService {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

enum Failure {
    /// Not now: the valve is closed or unknown, or no company is active.
    /// Redelivered after [`RETRY_DELAY`], never dead-lettered.
    Delay(String),
    /// Worth another delivery.
    Retry(String),
    /// Will never succeed: dead-letter now.
    Poison(String),
}

impl NotifyService {
    /// Creates the consumer (idempotently), then starts pulling.
    pub async fn start(cfg: NotifyConfig) -> Result<NotifyService, NotifyError> {
        let js = jetstream::new(cfg.client.clone());
        let stream = js
            .get_stream(NOTIFICATIONS_STREAM)
            .await
            .map_err(|e| NotifyError::Stream(e.to_string()))?;
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                DURABLE,
                consumer::pull::Config {
                    durable_name: Some(DURABLE.into()),
                    filter_subject: INBOUND_SUBJECT.into(),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    description: Some("notification service: parse, resolve, valve, wake".into()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| NotifyError::Consumer(e.to_string()))?;
        let (stop, mut stopped) = watch::channel(false);
        let mut admitting = cfg.admitting.clone();
        let worker = Worker { cfg, js };
        let task = tokio::spawn(async move {
            loop {
                let admits = *admitting.borrow_and_update();
                if !admits {
                    info!(subsystem = "notify", "shedding: not consuming {DURABLE}");
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = until_admitting(&mut admitting, true) => {
                            info!(subsystem = "notify", "admitting again: consuming {DURABLE}");
                            continue;
                        }
                    }
                }
                let mut messages = match consumer.messages().await {
                    Ok(m) => m,
                    Err(e) => {
                        warn!(subsystem = "notify", error = %e, "cannot pull; retrying");
                        tokio::select! {
                            _ = stopped.changed() => return,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        }
                    }
                };
                loop {
                    tokio::select! {
                        _ = stopped.changed() => return,
                        // Shedding: hand back what the client already
                        // pulled, then drop the pull (a new one starts when
                        // this node admits again).
                        _ = until_admitting(&mut admitting, false) => {
                            worker.hand_back_buffered(&mut messages).await;
                            break;
                        }
                        next = messages.next() => match next {
                            Some(Ok(msg)) => {
                                let admits = *admitting.borrow();
                                if admits {
                                    worker.handle(msg).await;
                                } else {
                                    worker.hand_back(msg).await;
                                }
                            }
                            Some(Err(e)) => {
                                debug!(subsystem = "notify", error = %e, "pull interrupted");
                                tokio::time::sleep(Duration::from_millis(250)).await;
                            }
                            None => break,
                        }
                    }
                }
            }
        });
        info!(
            subsystem = "notify",
            durable = DURABLE,
            "notification service pulling"
        );
        Ok(NotifyService { stop, task })
    }

    /// Stops pulling; a delivery in hand finishes first.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Resolves once admission is `want`; never, once nobody can change it.
async fn until_admitting(admitting: &mut watch::Receiver<bool>, want: bool) {
    if admitting.wait_for(|a| *a == want).await.is_err() {
        std::future::pending::<()>().await;
    }
}

struct Worker {
    cfg: NotifyConfig,
    js: jetstream::Context,
}

/// The seats a delivery is for, each with why; first reason wins.
pub fn resolve(company: &Company, inbound: &Inbound) -> Vec<(Handle, &'static str)> {
    let mut out: Vec<(Handle, &'static str)> = Vec::new();
    let candidates = inbound
        .route_handle
        .iter()
        .map(|h| (h, "route"))
        .chain(inbound.mentions.iter().map(|h| (h, "mention")))
        .chain(inbound.assignees.iter().map(|h| (h, "assignee")))
        .chain(inbound.reviewers.iter().map(|h| (h, "reviewer")));
    for (raw, why) in candidates {
        let name = raw.trim().trim_start_matches('@').to_ascii_lowercase();
        let Ok(h) = Handle::parse(&name) else {
            continue;
        };
        if company.seat(h.as_str()).is_some() && !out.iter().any(|(o, _)| o == &h) {
            out.push((h, why));
        }
    }
    out
}

impl Worker {
    /// Shedding: the delivery goes straight back for a peer to take.
    async fn hand_back(&self, msg: jetstream::Message) {
        if let Err(e) = msg.ack_with(AckKind::Nak(Some(HAND_BACK_DELAY))).await {
            debug!(subsystem = "notify", error = %e, "hand-back failed; the delivery comes back after the ack wait");
        }
    }

    /// Hands back every delivery the client holds already (until the pull
    /// is quiet for [`HAND_BACK_QUIET`]).
    async fn hand_back_buffered(&self, messages: &mut consumer::pull::Stream) {
        let mut handed = 0u32;
        while let Ok(Some(Ok(msg))) = tokio::time::timeout(HAND_BACK_QUIET, messages.next()).await {
            self.hand_back(msg).await;
            handed += 1;
        }
        if handed > 0 {
            info!(
                subsystem = "notify",
                handed, "shedding: handed deliveries back"
            );
        }
    }

    async fn handle(&self, msg: jetstream::Message) {
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        match self.work(&msg).await {
            Ok(()) => {
                if let Err(e) = msg.ack().await {
                    warn!(subsystem = "notify", error = %e, "ack failed; the delivery comes back and its wakes are deduplicated");
                }
            }
            Err(Failure::Delay(reason)) => {
                debug!(subsystem = "notify", delivered, reason, "delivery delayed");
                let _ = msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
            }
            Err(Failure::Retry(reason)) if delivered < MAX_DELIVER => {
                debug!(subsystem = "notify", delivered, reason, "delivery delayed");
                let _ = msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
            }
            Err(Failure::Retry(reason) | Failure::Poison(reason)) => {
                self.dead_letter(&msg, delivered, &reason).await;
            }
        }
    }

    async fn work(&self, msg: &jetstream::Message) -> Result<(), Failure> {
        let inbound: Inbound = serde_json::from_slice(&msg.payload)
            .map_err(|e| Failure::Poison(format!("not an inbound delivery: {e}")))?;
        let Some(active) = self.cfg.active.current() else {
            return Err(Failure::Delay("no active company".into()));
        };
        let company = &active.company;
        let seats = resolve(company, &inbound);
        if seats.is_empty() {
            let mut ev = self.cfg.publisher.event(
                "delivery_unrouted",
                json!({
                    "source": inbound.source, "event_type": inbound.event_type,
                    "delivery_id": inbound.delivery_id, "mentions": inbound.mentions,
                    "assignees": inbound.assignees, "reviewers": inbound.reviewers,
                }),
            );
            ev.trace_id = Some(inbound.trace_id.clone());
            ev.parties = vec![party(format!("source:{}", inbound.source), "sender")];
            self.record(ev).await;
            return Ok(());
        }
        let conversation = inbound.channel.as_ref().map(|c| match &inbound.thread {
            Some(t) => format!("{}:{c}#{t}", inbound.source),
            None => format!("{}:{c}", inbound.source),
        });
        for (handle, reason) in seats {
            let h = handle.as_str();
            match self
                .cfg
                .coord
                .admit(&format!("wake:{h}"), VALVE_LIMIT, VALVE_WINDOW)
                .await
            {
                Ok(Answer::Yes(_)) => {}
                Ok(Answer::No(v)) => {
                    return Err(Failure::Delay(format!(
                        "rate valve closed for {h} ({}/{})",
                        v.count, v.limit
                    )));
                }
                Err(e) => return Err(Failure::Delay(format!("rate valve unknown for {h}: {e}"))),
            }
            let seat = seat_id(&company.org, &handle).to_string();
            let wake = Wake {
                trace_id: inbound.trace_id.clone(),
                delivery_id: inbound.delivery_id.clone(),
                source: inbound.source.clone(),
                event_type: inbound.event_type.clone(),
                handle: h.to_owned(),
                seat_id: seat.clone(),
                reason: reason.to_owned(),
                text: inbound.text.clone(),
                conversation: conversation.clone(),
                channel: inbound.channel.clone(),
                thread: inbound.thread.clone(),
            };
            let msg_id = format!("{}:{h}", inbound.key);
            self.publish(
                handle.inbox_subject(),
                &msg_id,
                &inbound.trace_id,
                serde_json::to_vec(&wake).expect("wake serialises"),
            )
            .await
            .map_err(|e| Failure::Retry(format!("wake for {h} not published: {e}")))?;
            let mut ev = self.cfg.publisher.event(
                "wake_published",
                json!({
                    "handle": h, "reason": reason, "source": inbound.source,
                    "event_type": inbound.event_type, "delivery_id": inbound.delivery_id,
                }),
            );
            ev.trace_id = Some(inbound.trace_id.clone());
            ev.seat = Some(seat);
            ev.conversation = conversation.clone();
            ev.parties = vec![
                party(format!("seat:{h}"), "recipient"),
                party(format!("source:{}", inbound.source), "sender"),
            ];
            self.record(ev).await;
        }
        Ok(())
    }

    async fn dead_letter(&self, msg: &jetstream::Message, delivered: i64, reason: &str) {
        let trace = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(TRACE_HEADER))
            .map(|v| v.as_str().to_owned());
        let body = json!({
            "reason": reason,
            "delivered": delivered,
            "subject": msg.subject.as_str(),
            "trace_id": trace,
            "original": String::from_utf8_lossy(&msg.payload),
        });
        let id = format!("dlq:{}", msg.info().map(|i| i.stream_sequence).unwrap_or(0));
        if let Err(e) = self
            .publish(
                DLQ_SUBJECT.into(),
                &id,
                trace.as_deref().unwrap_or(""),
                serde_json::to_vec(&body).expect("json"),
            )
            .await
        {
            warn!(subsystem = "notify", error = %e, "dead-letter publish failed; the delivery comes back");
            let _ = msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
            return;
        }
        warn!(
            subsystem = "notify",
            delivered, reason, "delivery dead-lettered"
        );
        let _ = msg.ack().await;
        let mut ev = self.cfg.publisher.event(
            "delivery_dead_lettered",
            json!({ "reason": reason, "delivered": delivered, "dlq_subject": DLQ_SUBJECT }),
        );
        ev.trace_id = trace;
        ev.parties = vec![party("service:notify-inbound".into(), "worker")];
        self.record(ev).await;
    }

    async fn publish(
        &self,
        subject: String,
        msg_id: &str,
        trace: &str,
        body: Vec<u8>,
    ) -> Result<(), String> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id);
        headers.insert(TRACE_HEADER, trace);
        let ack = self
            .js
            .publish_with_headers(subject, headers, body.into())
            .await
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(PUBLISH_TIMEOUT, ack).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no ack within {PUBLISH_TIMEOUT:?}")),
        }
    }

    async fn record(&self, ev: crewlet_store::EventRecord) {
        let kind = ev.kind.clone();
        if let Err(e) = self.cfg.publisher.publish(ev).await {
            warn!(subsystem = "notify", event = kind, error = %e, "event not recorded");
        }
    }
}

fn party(party: String, role: &str) -> Party {
    Party {
        party,
        role: role.into(),
    }
}
