//! The notification service: parse → resolve → valve → wake.
//!
//! Rules, and why:
//! - **One group, fleet-wide.** Every node pulls from the one durable
//!   consumer [`NOTIFY_DURABLE`], so each delivery is worked by one node at a time.
//!   The consumer is created before the edge answers anything: the stream
//!   has interest retention and would drop a delivery nobody is subscribed
//!   to.
//! - **Resolve through the org.** Route handle, mentions, assignees and
//!   reviewers map to seats through the active company's identities, or a
//!   seat's handle ([`crewlet_company::resolve`]); seat ids are UUIDv5, so every
//!   node answers the same.
//! - **The valve fails closed by delaying.** A closed or unknown valve naks
//!   with [`RETRY_DELAY`]; the delivery comes back, it is not dropped — and
//!   a delay never counts towards dead-lettering (a busy seat is not a bad
//!   message). The same holds while no company is active.
//! - **Only real failures count, and the count travels on the message.**
//!   The server's delivery count includes every delayed redelivery, so it
//!   cannot tell a busy seat from a bad message, and no node may keep a
//!   count of its own: any node may pull the next delivery. A real failure
//!   (a wake that could not be published) passes the delivery on: a copy is
//!   published to [`INBOUND_SUBJECT`] carrying the failures so far
//!   ([`FAILURES_HEADER`]) and the instant it is due ([`NOT_BEFORE_HEADER`],
//!   [`RETRY_DELAY`] on), then the original is acked. A copy that arrives
//!   early is naked with what remains of its wait: a delay, uncounted. The
//!   failure that brings the count to [`MAX_DELIVER`] dead-letters instead
//!   (publish to [`NOTIFY_DLQ_SUBJECT`] with the reason, then ack; a DLQ
//!   publish that fails naks, so the message never vanishes at the limit).
//! - **A pass-on is stored once, or not at all.** Its message id is the
//!   delivery's key with its failures and the seats it owes: every pass-on
//!   of one delivery changes one of them, so no two differ only in time,
//!   and a pass-on repeated after a lost ack is deduplicated. A pass-on
//!   that cannot be published naks the original with [`RETRY_DELAY`]:
//!   nothing is lost, and that failure goes uncounted (a count no stored
//!   message carries does not exist).
//! - **A seat's wake is paid for once.** Seats are admitted and woken in
//!   order. When a later seat has to wait or fails after an earlier seat of
//!   the same delivery got its wake, the rest is passed on restricted to
//!   the seats still owed ([`OWED_HEADER`]), so a redelivery never charges a
//!   woken seat's valve again. Only after a pass-on that failed does a
//!   redelivery repeat earlier seats: charged again, woken once (below).
//! - **Wakes are idempotent on the stream.** Each carries the message id
//!   `SOURCE:ID:HANDLE`, so a redelivery after a partial wake does not wake
//!   a seat twice within the stream's duplicate window.
//! - **An ack-wait expiry is no failure.** A delivery whose worker stopped
//!   answering (a node died holding it) comes back from the server after
//!   the consumer's ack wait with its headers, so its count and the seats
//!   it owes are intact, and that redelivery is not counted: the worker
//!   failed, not the message. A delivery's content is only parsed and
//!   looked up, never run, so it cannot be what keeps killing its workers.
//! - **A thread's followers are woken too** ([`follow`]): one read per
//!   threaded delivery; unknown delays the delivery, never "nobody".
//! - **Addressed to nobody** is an `delivery_unrouted` event and an ack.
//! - **Only what is sent to a seat wakes it.** A delivery its plugin calls
//!   no conversation (an edit, a join, a reaction: WIT `wakes` `nobody`)
//!   wakes nobody; one the app only saw in a channel (`named`) wakes whom
//!   it names, never its route's seat; and a seat is never woken by its
//!   own message (its identities among the delivery's `sender`) — the
//!   loop of an app that hears its own replies. Each is a `delivery_quiet`
//!   event saying why. A seat another seat names is woken: that is how
//!   seats address each other.
//! - **A shedding node stops consuming.** While [`NotifyConfig::admitting`]
//!   is false (the node's config posture is `shed`: peers have the epoch
//!   this node cannot apply), the service hands back every delivery its
//!   pull already holds (a nak, redelivered after [`HAND_BACK_DELAY`] to
//!   whichever node pulls it) and then stops pulling, so a peer that has the
//!   epoch works it instead of this node working it against a company it is
//!   no longer sure of. A delivery the server sent to the dropped pull
//!   after that comes back after the consumer's ack wait.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer, publish::PublishAck};
use crewlet_company::resolve::{Addressed, Resolution, sender_words};
use crewlet_company::{Claimant, Company, Handle, seat_id};
use crewlet_coord::{Answer, Valve};
use crewlet_observe::{ACK_TIMEOUT, AckError, Publisher, publish_acked};
use crewlet_store::Party;
use futures::StreamExt;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crewlet_bus::{
    DeadLetter, FAILURES_HEADER, INBOUND_SUBJECT, Inbound, MSG_ID_HEADER, NOT_BEFORE_HEADER,
    NOTIFICATIONS_STREAM, NOTIFY_DLQ_SUBJECT, NOTIFY_DURABLE, OWED_HEADER, Sender, TRACE_HEADER,
    Wake, Wakes, inbox_subject,
};
use crewlet_os::now_ms;
/// The real failure on which a delivery is dead-lettered (delays do not
/// count; see the module docs).
pub const MAX_DELIVER: i64 = 5;
/// How long a refused or failed delivery waits before it comes back.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);
/// Wakes per seat per [`VALVE_WINDOW`], fleet-wide.
pub const VALVE_LIMIT: u64 = 30;
/// The valve's window (at most half the rate bucket's 60 s age).
pub const VALVE_WINDOW: Duration = Duration::from_secs(30);
/// How long the service may hold a delivery before the server redelivers
/// it; progress is acknowledged every half of it while one is worked on.
const ACK_WAIT: Duration = crewlet_stream::consumers::NOTIFY_ACK_WAIT;
/// Deliveries one pull brings at most: few, so a node that freezes holds
/// few hostage (each moves to a peer after [`ACK_WAIT`]).
const IN_HAND: usize = 4;
/// How long one pull request stands; the broker's idle heartbeat on it is
/// a quarter of this, and two heartbeats missed replace the pull. A pull
/// request is lost when the consumer's leader moves (a member cut off, an
/// election): the new leader never heard of it. With the client's default
/// (30 s, no heartbeat) the service heard nothing for up to 35 s after a
/// route cut while deliveries waited on the stream; with this, ~2 s.
const PULL_EXPIRES: Duration = Duration::from_secs(4);
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
    #[error("cannot create the {NOTIFY_DURABLE} consumer: {0}")]
    Consumer(String),
}

/// What the service works with.
#[derive(Clone)]
pub struct NotifyConfig {
    pub client: async_nats::Client,
    pub valve: Valve,
    /// Who follows a thread: a message there wakes them unmentioned.
    pub follows: crewlet_coord::Follows,
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
    /// Worth another delivery; counted.
    Retry(String),
}

/// Why a delivery stopped short, and what it still owes.
struct Stop {
    failure: Failure,
    /// The seats still owed a wake, when a seat of this delivery got its
    /// wake before it stopped; `None`: it owes what it owed.
    rest: Option<Vec<String>>,
}

/// What a delivery carries of its own history (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Carried {
    failures: i64,
    not_before_ms: Option<i64>,
    owed: Option<Vec<String>>,
}

impl Carried {
    /// Read from a delivery's headers; a header that does not parse counts
    /// as absent (only this service writes them).
    fn of(headers: Option<&async_nats::HeaderMap>) -> Carried {
        let get = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        Carried {
            failures: get(FAILURES_HEADER)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            not_before_ms: get(NOT_BEFORE_HEADER).and_then(|v| v.parse().ok()),
            owed: get(OWED_HEADER).map(|v| v.split(',').map(str::to_owned).collect()),
        }
    }

    /// How long the delivery must still wait; `None` once it is due. A wait
    /// above [`RETRY_DELAY`] means two nodes' clocks disagree: the delivery
    /// is due, rather than held for as long as they do.
    fn wait(&self, now_ms: i64) -> Option<Duration> {
        let left = self.not_before_ms? - now_ms;
        (left > 0 && left <= RETRY_DELAY.as_millis() as i64)
            .then(|| Duration::from_millis(left as u64))
    }

    /// The message id of the pass-on that carries this.
    fn msg_id(&self, key: &str) -> String {
        let owed = self.owed.as_ref().map_or("*".to_owned(), |o| o.join(","));
        format!("{key}|{}|{owed}", self.failures)
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![(FAILURES_HEADER, self.failures.to_string())];
        if let Some(at) = self.not_before_ms {
            out.push((NOT_BEFORE_HEADER, at.to_string()));
        }
        if let Some(owed) = &self.owed {
            out.push((OWED_HEADER, owed.join(",")));
        }
        out
    }
}

impl NotifyService {
    /// Creates the consumer (idempotently), then starts pulling.
    pub async fn start(cfg: NotifyConfig) -> Result<NotifyService, NotifyError> {
        let js = jetstream::new(cfg.client.clone());
        let stream = js
            .get_stream(NOTIFICATIONS_STREAM)
            .await
            .map_err(|e| NotifyError::Stream(e.to_string()))?;
        let consumer = crewlet_stream::consumers::adopt(
            &stream,
            consumer::pull::Config {
                durable_name: Some(NOTIFY_DURABLE.into()),
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
                    info!(
                        subsystem = "notify",
                        "shedding: not consuming {NOTIFY_DURABLE}"
                    );
                    tokio::select! {
                        _ = stopped.changed() => return,
                        _ = until_admitting(&mut admitting, true) => {
                            info!(subsystem = "notify", "admitting again: consuming {NOTIFY_DURABLE}");
                            continue;
                        }
                    }
                }
                // Few in hand: what a node holds when it freezes waits out
                // the ack wait before a peer gets it.
                let pull = consumer
                    .stream()
                    .max_messages_per_batch(IN_HAND)
                    .expires(PULL_EXPIRES)
                    .heartbeat(PULL_EXPIRES / 4)
                    .messages()
                    .await;
                let mut messages = match pull {
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
                                    worker.handle_kept(msg).await;
                                } else {
                                    worker.hand_back(msg).await;
                                }
                            }
                            // A missed heartbeat is a pull request nobody
                            // holds any more (a consumer leader that moved
                            // forgets it): the pull is replaced at once, not
                            // left to its expiry.
                            Some(Err(e)) => {
                                debug!(subsystem = "notify", error = %e, "pull interrupted; pulling afresh");
                                tokio::select! {
                                    _ = stopped.changed() => return,
                                    _ = tokio::time::sleep(Duration::from_millis(250)) => break,
                                }
                            }
                            None => break,
                        }
                    }
                }
            }
        });
        info!(
            subsystem = "notify",
            durable = NOTIFY_DURABLE,
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
    addressed(company, inbound).seats
}

/// What a delivery's ids come to in `company`.
fn addressed(company: &Company, inbound: &Inbound) -> Resolution {
    let to = Addressed {
        source: &inbound.source,
        // Only a delivery sent to the route's seat wakes it by route.
        route_handle: inbound
            .route_handle
            .as_deref()
            .filter(|_| inbound.wakes == Wakes::RouteAndNamed),
        mentions: &inbound.mentions,
        assignees: &inbound.assignees,
        reviewers: &inbound.reviewers,
    };
    crewlet_company::resolve::resolve(company, &to)
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

    /// Handles `msg`, acknowledging progress while it takes long (a slow
    /// parse, a publish waiting on the broker), so only a stalled node lets
    /// its ack wait lapse.
    async fn handle_kept(&self, msg: jetstream::Message) {
        let acker = msg.clone();
        let keep = async {
            let mut every = tokio::time::interval(ACK_WAIT / 2);
            every.tick().await;
            loop {
                every.tick().await;
                let _ = acker.ack_with(AckKind::Progress).await;
            }
        };
        tokio::select! {
            () = self.handle(msg) => {}
            () = keep => {}
        }
    }

    async fn handle(&self, msg: jetstream::Message) {
        let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
        let carried = Carried::of(msg.headers.as_ref());
        let inbound: Inbound = match serde_json::from_slice(&msg.payload) {
            Ok(i) => i,
            Err(e) => {
                let reason = format!("not an inbound delivery: {e}");
                let next = Carried {
                    failures: carried.failures + 1,
                    ..carried
                };
                return self.dead_letter(&msg, None, &next, &reason).await;
            }
        };
        if let Some(wait) = carried.wait(now_ms()) {
            debug!(subsystem = "notify", key = %inbound.key, ?wait, "passed-on delivery not due yet");
            let _ = msg.ack_with(AckKind::Nak(Some(wait))).await;
            return;
        }
        let Err(stop) = self.work(&inbound, &carried).await else {
            if let Err(e) = msg.ack().await {
                warn!(subsystem = "notify", error = %e, "ack failed; the delivery comes back and its wakes are deduplicated");
            }
            return;
        };
        let due = Some(now_ms() + RETRY_DELAY.as_millis() as i64);
        match stop.failure {
            Failure::Delay(reason) => match stop.rest {
                None => {
                    debug!(subsystem = "notify", delivered, reason, "delivery delayed");
                    let _ = msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
                }
                Some(rest) => {
                    let next = Carried {
                        failures: carried.failures,
                        not_before_ms: due,
                        owed: Some(rest),
                    };
                    self.pass_on(&msg, &inbound, &next, &reason).await;
                }
            },
            Failure::Retry(reason) => {
                let next = Carried {
                    failures: carried.failures + 1,
                    not_before_ms: due,
                    owed: stop.rest.or(carried.owed),
                };
                if next.failures >= MAX_DELIVER {
                    self.dead_letter(&msg, Some(&inbound), &next, &reason).await;
                } else {
                    self.pass_on(&msg, &inbound, &next, &reason).await;
                }
            }
        }
    }

    /// Publishes the delivery again carrying `next`, then acks this one; if
    /// the publish fails, this one comes back after [`RETRY_DELAY`] as it is.
    async fn pass_on(
        &self,
        msg: &jetstream::Message,
        inbound: &Inbound,
        next: &Carried,
        why: &str,
    ) {
        let published = self
            .publish(
                INBOUND_SUBJECT.into(),
                &next.msg_id(&inbound.key),
                &inbound.trace_id,
                &next.headers(),
                msg.payload.to_vec(),
            )
            .await;
        match published {
            Ok(_) => {
                debug!(subsystem = "notify", key = %inbound.key, failures = next.failures,
                    owed = ?next.owed, why, "delivery passed on");
                if let Err(e) = msg.ack().await {
                    warn!(subsystem = "notify", error = %e, "ack failed; the delivery comes back and its pass-on is deduplicated");
                }
            }
            Err(e) => {
                warn!(subsystem = "notify", key = %inbound.key, error = %e, why,
                    "delivery not passed on; it comes back as it was");
                let _ = msg.ack_with(AckKind::Nak(Some(RETRY_DELAY))).await;
            }
        }
    }

    async fn work(&self, inbound: &Inbound, carried: &Carried) -> Result<(), Stop> {
        let Some(active) = self.cfg.active.current() else {
            return Err(Stop {
                failure: Failure::Delay("no active company".into()),
                rest: None,
            });
        };
        let company = &active.company;
        if let Wakes::Nobody(why) = &inbound.wakes {
            self.quiet(inbound, None, &format!("not a conversation: {why}"))
                .await;
            return Ok(());
        }
        let resolution = addressed(company, inbound);
        let mut seats = resolution.seats;
        if let Some(Claimant::Seat { handle: author }) =
            crewlet_company::resolve::sender(company, &inbound.source, &inbound.sender)
            && seats.iter().any(|(h, _)| h == author)
        {
            seats.retain(|(h, _)| h != author);
            let why =
                format!("written by seat {author} itself: a seat's own message never wakes it");
            self.quiet(inbound, Some(author.as_str()), &why).await;
            if seats.is_empty() {
                return Ok(());
            }
        }
        let sender = sender_words(company, &inbound.source, &inbound.sender).map(|who| Sender {
            ids: inbound.sender.clone(),
            who,
        });
        // Unknown followers wait, before any seat is woken (see follow.rs).
        let by_follow = follow::by_follow(&self.cfg.follows, company, inbound)
            .await
            .map_err(|e| Stop {
                failure: Failure::Delay(format!("who follows the thread is unknown: {e}")),
                rest: None,
            })?;
        let authored_by = by_follow.authored_by.clone();
        by_follow.add_to(&mut seats);
        if let Some(owed) = &carried.owed {
            seats.retain(|(h, _)| owed.iter().any(|o| o == h.as_str()));
            if seats.is_empty() {
                debug!(subsystem = "notify", key = %inbound.key, ?owed, "no seat still owed a wake is in the company");
                return Ok(());
            }
        }
        if seats.is_empty() {
            let mut ev = self.cfg.publisher.event(
                "delivery_unrouted",
                json!({
                    "source": inbound.source, "event_type": inbound.event_type,
                    "delivery_id": inbound.delivery_id, "mentions": inbound.mentions,
                    "assignees": inbound.assignees, "reviewers": inbound.reviewers,
                    "unclaimed": resolution.unclaimed, "people": resolution.people,
                    "reason": unrouted_reason(inbound, &resolution.unclaimed, &resolution.people),
                    "authored_by": authored_by.as_ref().map(Handle::as_str),
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
        for (i, (handle, reason)) in seats.iter().enumerate() {
            let stop = |failure| Stop {
                failure,
                rest: (i > 0).then(|| {
                    seats[i..]
                        .iter()
                        .map(|(h, _)| h.as_str().to_owned())
                        .collect()
                }),
            };
            let h = handle.as_str();
            match self
                .cfg
                .valve
                .admit(&format!("wake:{h}"), VALVE_LIMIT, VALVE_WINDOW)
                .await
            {
                Ok(Answer::Yes(_)) => {}
                Ok(Answer::No(v)) => {
                    return Err(stop(Failure::Delay(format!(
                        "rate valve closed for {h} ({}/{})",
                        v.count, v.limit
                    ))));
                }
                Err(e) => {
                    return Err(stop(Failure::Delay(format!(
                        "rate valve unknown for {h}: {e}"
                    ))));
                }
            }
            let seat = seat_id(&company.org, handle).to_string();
            let wake = Wake {
                trace_id: inbound.trace_id.clone(),
                delivery_id: inbound.delivery_id.clone(),
                source: inbound.source.clone(),
                event_type: inbound.event_type.clone(),
                handle: h.to_owned(),
                seat_id: seat.clone(),
                reason: (*reason).to_owned(),
                text: inbound.text.clone(),
                conversation: conversation.clone(),
                channel: inbound.channel.clone(),
                thread: inbound.thread.clone(),
                owed: inbound.owed.clone(),
                sender: sender.clone(),
            };
            let ack = self
                .publish(
                    inbox_subject(h),
                    &wake_msg_id(inbound, h),
                    &inbound.trace_id,
                    &[],
                    serde_json::to_vec(&wake).expect("wake serialises"),
                )
                .await
                .map_err(|e| stop(Failure::Retry(format!("wake for {h} not published: {e}"))))?;
            if ack.duplicate
                && let Some(message) = &inbound.message
            {
                let why = format!(
                    "{h} was already woken for this message ({message}), by another copy of it or an earlier attempt of this delivery"
                );
                self.quiet(inbound, Some(h), &why).await;
                continue;
            }
            let mut ev = self.cfg.publisher.event(
                "wake_published",
                json!({
                    "handle": h, "seat_id": seat, "reason": reason, "source": inbound.source,
                    "event_type": inbound.event_type, "delivery_id": inbound.delivery_id,
                    "sender": sender.as_ref().map(|s| &s.who),
                }),
            );
            ev.trace_id = Some(inbound.trace_id.clone());
            // By handle, like every other event; the id is in the payload.
            ev.seat = Some(h.to_owned());
            ev.conversation = conversation.clone();
            ev.parties = vec![
                party(format!("seat:{h}"), "recipient"),
                party(format!("source:{}", inbound.source), "sender"),
            ];
            self.record(ev).await;
        }
        Ok(())
    }

    /// Records that `inbound` woke `seat` (or anyone) not, and why.
    async fn quiet(&self, inbound: &Inbound, seat: Option<&str>, why: &str) {
        let mut ev = self.cfg.publisher.event(
            "delivery_quiet",
            json!({
                "source": inbound.source, "event_type": inbound.event_type,
                "delivery_id": inbound.delivery_id, "sender": inbound.sender,
                "route_handle": inbound.route_handle, "reason": why,
            }),
        );
        ev.trace_id = Some(inbound.trace_id.clone());
        ev.seat = seat.map(str::to_owned);
        ev.parties = vec![party(format!("source:{}", inbound.source), "sender")];
        self.record(ev).await;
    }

    /// Publishes the delivery to the DLQ with why and what it still owed,
    /// then acks it; if that publish fails, it comes back after the delay.
    async fn dead_letter(
        &self,
        msg: &jetstream::Message,
        inbound: Option<&Inbound>,
        carried: &Carried,
        reason: &str,
    ) {
        let trace = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(TRACE_HEADER))
            .map(|v| v.as_str().to_owned())
            .or_else(|| inbound.map(|i| i.trace_id.clone()));
        let info = msg.info().ok();
        let delivered = info.as_ref().map_or(1, |i| i.delivered);
        let failures = carried.failures;
        let body = DeadLetter {
            reason: reason.to_owned(),
            failures,
            delivered,
            owed: carried.owed.clone(),
            subject: msg.subject.as_str().to_owned(),
            trace_id: trace.clone(),
            original: String::from_utf8_lossy(&msg.payload).into_owned(),
        };
        let id = format!("dlq:{}", info.as_ref().map_or(0, |i| i.stream_sequence));
        if let Err(e) = self
            .publish(
                NOTIFY_DLQ_SUBJECT.into(),
                &id,
                trace.as_deref().unwrap_or(""),
                &[],
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
            failures, delivered, reason, "delivery dead-lettered"
        );
        let _ = msg.ack().await;
        let mut ev = self.cfg.publisher.event(
            "delivery_dead_lettered",
            json!({
                "reason": reason, "failures": failures, "delivered": delivered,
                "dlq_subject": NOTIFY_DLQ_SUBJECT,
            }),
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
        extra: &[(&'static str, String)],
        body: Vec<u8>,
    ) -> Result<PublishAck, AckError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(MSG_ID_HEADER, msg_id);
        headers.insert(TRACE_HEADER, trace);
        for (name, value) in extra {
            headers.insert(*name, value.as_str());
        }
        publish_acked(&self.js, subject, headers, body, ACK_TIMEOUT).await
    }

    async fn record(&self, ev: crewlet_store::EventRecord) {
        let kind = ev.kind.clone();
        if let Err(e) = self.cfg.publisher.publish(ev).await {
            warn!(subsystem = "notify", event = kind, error = %e, "event not recorded");
        }
    }
}

/// The wake's message id, which the inbox stream deduplicates on: one
/// per message and seat when the vendor sends one message as several
/// deliveries (a seat is woken once per post), else one per delivery and
/// seat.
fn wake_msg_id(inbound: &Inbound, handle: &str) -> String {
    match &inbound.message {
        Some(message) => format!("{}:message:{message}:{handle}", inbound.source),
        None => format!("{}:{handle}", inbound.key),
    }
}

/// Why a delivery woke nobody, in words an operator can act on.
fn unrouted_reason(inbound: &Inbound, unclaimed: &[String], people: &[String]) -> String {
    let source = inbound.source.as_str();
    let mut why = if unclaimed.is_empty() {
        format!("it addresses no {source} id")
    } else {
        format!(
            "no seat claims the {source} ids it addresses ({}): give the seat `identities = {{ {source} = \"ID\" }}` in the company document, or mention a seat's handle",
            unclaimed.join(", ")
        )
    };
    if !people.is_empty() {
        why.push_str(&format!(
            "; it addresses people, not seats ({})",
            people.join(", ")
        ));
    }
    if let Some(h) = &inbound.route_handle
        && inbound.wakes == Wakes::Named
    {
        why.push_str(&format!(
            "; the app of /webhooks/{source}/{h} only saw it in a channel, and there only what addresses {h} wakes it (a mention, a direct message)"
        ));
    }
    why
}

fn party(party: String, role: &str) -> Party {
    Party {
        party,
        role: role.into(),
    }
}

mod follow;

#[cfg(test)]
mod tests;
