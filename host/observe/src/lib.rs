//! The observability edge: one published event, two routes.
//!
//! A published event is written to this node's event log inline, by the
//! publisher itself — no consumer group, so no two nodes can ever write one
//! row — and broadcast on `crewlet.events.TYPE` (`crewlet_bus::event_subject`).
//! The live view reads the broadcast back through an ephemeral subscription,
//! so a dashboard on node B shows turns that ran on node A. Swapping either mechanism for the other
//! loses the guarantee the other provides: a group would scatter rows across
//! nodes, and reading the log would show only this node's work.
//!
//! Two ways to publish, one row either way. [`Publisher::publish`] waits
//! for the stream's acknowledgement of the broadcast and reports a failure
//! to its caller. [`Publisher::record`] hands the broadcast to the client
//! and returns once the row is written; the acknowledgement is awaited off
//! the caller's path and a failure is logged. That is enough wherever the
//! caller's promise is elsewhere — the webhook edge's 2xx rests on the
//! inbound message's own acknowledged publish, which happened first — because
//! neither reader of the broadcast gains anything from the wait: the live
//! view reads it through an ephemeral core subscription, which is
//! at-most-once with or without an ack, and the log is this node's row,
//! already committed. What the wait bought was only the caller learning
//! that a broadcast was lost; the log line keeps that visible.
//!
//! A node without the `data` role keeps no log: its publisher
//! ([`Publisher::stateless`]) sends the rows in batches onto the custody
//! stream instead (`custody.rs`), and one data node keeps each batch.
//!
//! A few event types are live-only ([`Publisher::publish_live`]): per-round
//! progress and counter snapshots, whose rows would fill the log with
//! intermediate states of things it already holds finished.

mod ack;
mod custody;
mod meter;
pub mod scrape;
mod traces;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::{HeaderMap, jetstream};
use crewlet_bus::{EVENTS_SUBJECTS, event_subject};
use crewlet_store::{EventRecord, Store};
use futures::StreamExt;
use tokio::sync::{broadcast, oneshot, watch};
use tracing::{Instrument, debug, warn};

/// Live events a slow reader may fall behind by before it is told it lagged.
pub const LIVE_BUFFER: usize = 1024;
pub use ack::{ACK_TIMEOUT, AckError, await_ack, publish_acked};
pub use custody::{MAX_BATCH, MAX_BATCH_BYTES};
pub use meter::{Meter, OPENMETRICS_CONTENT_TYPE, UNSERVED};
pub use traces::{Traces, TracesError, span_of};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(
        "event type {0:?} is not a subject token (letters, digits, `_` and `-`; dots only between a module topic's tokens)"
    )]
    BadType(String),
    #[error("the event log refused event {event_id}: {source}")]
    Store {
        event_id: String,
        #[source]
        source: Box<crewlet_store::StoreError>,
    },
    #[error(
        "event {event_id} was not stored on the custody stream ({detail}); this node keeps no event log (no `data` role), so check the broker"
    )]
    Custody { event_id: String, detail: String },
    #[error("event {event_id} is in the log but its broadcast failed: {detail}")]
    Broadcast { event_id: String, detail: String },
}

/// Publishes this node's events.
#[derive(Clone)]
pub struct Publisher {
    node_id: Arc<str>,
    js: jetstream::Context,
    /// Where this node's rows go: its one event-log writer (see
    /// [`start_writer`]), or the custody batcher of a node without `data`.
    writer: Sink,
    /// Whether the last detached broadcast failed (one log line per outage).
    detached_failing: Arc<AtomicBool>,
    /// This node's metrics: every event published here is counted.
    meter: Meter,
    /// Where this node's spans go, when `[telemetry]` names a collector.
    traces: Option<Traces>,
    /// Who gets a copy of each row of some kinds, once it is kept.
    tap: Option<Tap>,
}

/// A copy of every row of the kinds named, handed over once the row is
/// kept (in this node's log, or stored on the custody stream): the one
/// place both kinds of node see the events they make, in the order made
/// (the usage tally reads it). Unbounded: the kinds tapped are a turn's
/// few, and the reader drains it every pass.
#[derive(Clone)]
pub struct Tap {
    kinds: &'static [&'static str],
    to: tokio::sync::mpsc::UnboundedSender<EventRecord>,
}

impl Tap {
    /// A tap of `kinds`, and where its copies arrive.
    pub fn new(
        kinds: &'static [&'static str],
    ) -> (Tap, tokio::sync::mpsc::UnboundedReceiver<EventRecord>) {
        let (to, from) = tokio::sync::mpsc::unbounded_channel();
        (Tap { kinds, to }, from)
    }

    fn copy(&self, event: &EventRecord) {
        if self.kinds.contains(&event.kind.as_str()) {
            // A reader that stopped (the node stopping) needs no copy.
            let _ = self.to.send(event.clone());
        }
    }
}

impl Publisher {
    pub fn new(node_id: &str, store: Arc<Store>, js: jetstream::Context) -> Publisher {
        Publisher {
            node_id: node_id.into(),
            writer: Sink::Log(start_writer(store)),
            js,
            detached_failing: Arc::default(),
            meter: Meter::new(),
            traces: None,
            tap: None,
        }
    }

    /// The publisher of a node without `data`: no log of its own, its rows
    /// go in batches onto the custody stream (the module docs). A row's
    /// `seq` stays 0: its position is in the log of the node that keeps it.
    pub fn stateless(node_id: &str, js: jetstream::Context) -> Publisher {
        Publisher {
            node_id: node_id.into(),
            writer: Sink::Custody(custody::start_batcher(node_id, js.clone())),
            js,
            detached_failing: Arc::default(),
            meter: Meter::new(),
            traces: None,
            tap: None,
        }
    }

    /// This publisher with every event it publishes also made a span (of
    /// the kinds that have one) and exported through `traces`.
    pub fn with_traces(mut self, traces: Traces) -> Publisher {
        self.traces = Some(traces);
        self
    }

    /// This publisher with a copy of each kept row of the tap's kinds
    /// handed to it.
    pub fn with_tap(mut self, tap: Tap) -> Publisher {
        self.tap = Some(tap);
        self
    }

    /// What an event costs beside its row and broadcast: counted, and a
    /// span when traces are exported.
    fn observe(&self, event: &EventRecord) {
        self.meter.observe(&event.kind, &event.payload);
        if let Some(t) = &self.traces {
            t.observe(event);
        }
    }

    /// This node's metrics (the events published here, and what the
    /// callers count themselves).
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// A new event of `kind` from this node, with a fresh id. Ids are
    /// time-ordered (UUIDv7) so the log's unique index on them grows at its
    /// right edge: a random id dirties a random page of that index per row,
    /// and every dirty page is a 4 KiB frame in the WAL and again in the
    /// checkpoint.
    pub fn event(&self, kind: &str, payload: serde_json::Value) -> EventRecord {
        EventRecord::new(
            uuid::Uuid::now_v7().to_string(),
            kind,
            self.node_id.as_ref(),
            payload,
        )
    }

    /// Writes `event` to this node's log, then broadcasts it. Answers the
    /// row's position. A failed broadcast leaves the row (the log is the
    /// record) and is reported, so the caller can decide what it costs.
    pub async fn publish(&self, event: EventRecord) -> Result<EventRecord, PublishError> {
        let event = self.write_row(event).await?;
        self.broadcast(&event).await?;
        Ok(event)
    }

    /// Writes `event` to this node's log, then hands its broadcast to the
    /// client without waiting for the stream's acknowledgement (see the
    /// module docs for when that is enough). Answers once the row is written.
    pub async fn record(&self, event: EventRecord) -> Result<EventRecord, PublishError> {
        let event = self.write_row(event).await?;
        self.broadcast_detached(&event).await?;
        Ok(event)
    }

    async fn write_row(&self, event: EventRecord) -> Result<EventRecord, PublishError> {
        check_type(&event.kind)?;
        let (reply, written) = oneshot::channel();
        match &self.writer {
            Sink::Log(writer) => writer
                .send((event, reply))
                .expect("the event log writer outlives every publisher"),
            Sink::Custody(batcher) => batcher
                .send((event, reply))
                .unwrap_or_else(|_| panic!("the custody batcher outlives every publisher")),
        }
        let event = written.await.expect("event log writer panicked")?;
        self.observe(&event);
        if let Some(tap) = &self.tap {
            tap.copy(&event);
        }
        Ok(event)
    }

    /// Sends the broadcast; its acknowledgement is awaited by a task of its
    /// own, which logs the first failure of a run of them and the recovery.
    async fn broadcast_detached(&self, event: &EventRecord) -> Result<(), PublishError> {
        let body = serde_json::to_vec(event).expect("event serialises");
        let subject = event_subject(&event.kind);
        let ack =
            self.js
                .publish(subject, body.into())
                .await
                .map_err(|e| PublishError::Broadcast {
                    event_id: event.event_id.clone(),
                    detail: e.to_string(),
                })?;
        let failing = self.detached_failing.clone();
        let event_id = event.event_id.clone();
        tokio::spawn(
            async move {
                match await_ack(ack, ACK_TIMEOUT).await {
                    Ok(_) => {
                        if failing.swap(false, Ordering::Relaxed) {
                            debug!(subsystem = "observe", "event broadcasts acknowledged again");
                        }
                    }
                    Err(detail) => {
                        if !failing.swap(true, Ordering::Relaxed) {
                            warn!(subsystem = "observe", %event_id, %detail,
                                "an event's broadcast was not acknowledged (its row is in the log); further failures are not logged until one succeeds");
                        }
                    }
                }
            }
            .in_current_span(),
        );
        Ok(())
    }

    /// Broadcasts `event` without a row: for live-only types.
    pub async fn publish_live(&self, event: EventRecord) -> Result<(), PublishError> {
        check_type(&event.kind)?;
        self.observe(&event);
        self.broadcast(&event).await
    }

    async fn broadcast(&self, event: &EventRecord) -> Result<(), PublishError> {
        let body = serde_json::to_vec(event).expect("event serialises");
        let subject = event_subject(&event.kind);
        publish_acked(&self.js, subject, HeaderMap::new(), body, ACK_TIMEOUT)
            .await
            .map(drop)
            .map_err(|e| PublishError::Broadcast {
                event_id: event.event_id.clone(),
                detail: e.to_string(),
            })
    }
}

/// Where a publisher's rows go.
#[derive(Clone)]
enum Sink {
    Log(std::sync::mpsc::Sender<RowJob>),
    Custody(tokio::sync::mpsc::UnboundedSender<custody::Job>),
}

/// A row to write, and where to hand it back with its `seq`.
type RowJob = (
    EventRecord,
    oneshot::Sender<Result<EventRecord, PublishError>>,
);

/// Rows one group commit takes at most.
const MAX_GROUP: usize = 256;

/// Starts the thread that writes this publisher's rows, one after another.
/// One thread rather than a blocking task per row: every row takes the
/// store's one connection anyway, and 64 concurrent publishers each parked
/// on its lock in a pool thread of their own cost a 2-core node more in
/// thread hand-offs than the inserts themselves. The thread ends when the
/// last clone of the publisher is dropped (its channel closes).
fn start_writer(store: Arc<Store>) -> std::sync::mpsc::Sender<RowJob> {
    let (tx, rx) = std::sync::mpsc::channel::<RowJob>();
    std::thread::Builder::new()
        .name("crewlet-event-log".into())
        .spawn(move || {
            // Group commit: every row already waiting goes into one
            // transaction (one WAL sync), and each caller is answered only
            // after the transaction holding its row committed. A failed
            // batch is retried row by row, so one bad row fails alone.
            while let Ok(first) = rx.recv() {
                let (mut rows, mut replies) = (Vec::new(), Vec::new());
                let mut next = Some(first);
                while let Some((row, reply)) = next {
                    rows.push(row);
                    replies.push(reply);
                    next = if rows.len() < MAX_GROUP {
                        rx.try_recv().ok()
                    } else {
                        None
                    };
                }
                let seqs: Vec<Result<i64, crewlet_store::StoreError>> =
                    match store.append_events(&rows) {
                        Ok(seqs) => seqs.into_iter().map(Ok).collect(),
                        Err(_) => rows.iter().map(|row| store.append_event(row)).collect(),
                    };
                for ((mut row, reply), seq) in rows.into_iter().zip(replies).zip(seqs) {
                    let answer = match seq {
                        Ok(seq) => {
                            row.seq = seq;
                            Ok(row)
                        }
                        Err(source) => Err(PublishError::Store {
                            event_id: row.event_id,
                            source: Box::new(source),
                        }),
                    };
                    // The publisher may have stopped waiting.
                    let _ = reply.send(answer);
                }
            }
        })
        .expect("cannot start the event log writer thread");
    tx
}

/// A kind is one subject token (`turn_ended`), or a module topic's dotted
/// tokens (`module.notebook.changed`): never empty tokens, wildcards or
/// spaces, so `crewlet.events.KIND` is always one literal subject.
fn check_type(kind: &str) -> Result<(), PublishError> {
    let ok = kind.split('.').all(|token| {
        !token.is_empty()
            && token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    });
    if ok {
        Ok(())
    } else {
        Err(PublishError::BadType(kind.to_owned()))
    }
}

/// The live feed could not subscribe to the broadcast.
#[derive(Debug, thiserror::Error)]
#[error("cannot subscribe to the event broadcast: {0}")]
pub struct LiveFeedError(String);

/// The live projection: the fleet's broadcast, fanned out to local readers.
#[derive(Clone)]
pub struct LiveFeed {
    tx: broadcast::Sender<Arc<str>>,
}

impl LiveFeed {
    /// Subscribes to `crewlet.events.>` (an ephemeral, core subscription:
    /// every node sees every event) and fans each one out until `stop`.
    /// The subscription is registered with the server when this returns
    /// (the client is flushed), so nothing published after it is missed.
    pub async fn start(
        client: async_nats::Client,
        mut stop: watch::Receiver<bool>,
    ) -> Result<LiveFeed, LiveFeedError> {
        let mut sub = client
            .subscribe(EVENTS_SUBJECTS)
            .await
            .map_err(|e| LiveFeedError(e.to_string()))?;
        client
            .flush()
            .await
            .map_err(|e| LiveFeedError(e.to_string()))?;
        let (tx, _) = broadcast::channel(LIVE_BUFFER);
        let fan = tx.clone();
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        msg = sub.next() => match msg {
                            Some(msg) => match std::str::from_utf8(&msg.payload) {
                                // No reader is not an error: nobody is watching.
                                Ok(text) => { let _ = fan.send(Arc::from(text)); }
                                Err(_) => warn!(subsystem = "observe", subject = %msg.subject,
                                    "dropped a non-UTF-8 event from the broadcast"),
                            },
                            None => break,
                        },
                        _ = stop.wait_for(|s| *s) => break,
                    }
                }
                let _ = sub.unsubscribe().await;
                debug!(subsystem = "observe", "live feed stopped");
            }
            .in_current_span(),
        );
        Ok(LiveFeed { tx })
    }

    /// A new reader; it sees events broadcast from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<str>> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crewlet_store::EventQuery;
    use crewlet_testkit::NatsServer;

    async fn js_with_events_stream(url: &str) -> (async_nats::Client, jetstream::Context) {
        let client = async_nats::connect(url).await.unwrap();
        let js = jetstream::new(client.clone());
        js.create_stream(jetstream::stream::Config {
            name: crewlet_bus::EVENTS_STREAM.into(),
            subjects: vec![EVENTS_SUBJECTS.into()],
            ..Default::default()
        })
        .await
        .unwrap();
        (client, js)
    }

    #[tokio::test]
    async fn a_published_event_is_one_row_here_and_live_everywhere() {
        let server = NatsServer::start();
        let (client_a, js_a) = js_with_events_stream(&server.url()).await;
        let client_b = async_nats::connect(server.url()).await.unwrap();
        let dir_a = tempfile::tempdir().unwrap();
        let dir_b = tempfile::tempdir().unwrap();
        let store_a = Arc::new(Store::open_in(dir_a.path()).unwrap());
        let store_b = Arc::new(Store::open_in(dir_b.path()).unwrap());
        let (_stop_tx, stop) = watch::channel(false);
        let feed_a = LiveFeed::start(client_a.clone(), stop.clone())
            .await
            .unwrap();
        let feed_b = LiveFeed::start(client_b, stop).await.unwrap();
        let (mut live_a, mut live_b) = (feed_a.subscribe(), feed_b.subscribe());

        let publisher = Publisher::new("node-a", store_a.clone(), js_a);
        let sent = publisher
            .publish(publisher.event("turn_finished", serde_json::json!({"ok": true})))
            .await
            .unwrap();
        assert!(sent.seq > 0);

        for live in [&mut live_a, &mut live_b] {
            let text = tokio::time::timeout(Duration::from_secs(5), live.recv())
                .await
                .unwrap()
                .unwrap();
            let got: EventRecord = serde_json::from_str(&text).unwrap();
            assert_eq!(got.event_id, sent.event_id);
            assert_eq!(got.node_id, "node-a");
        }
        assert_eq!(store_a.events(&EventQuery::default()).unwrap().len(), 1);
        assert!(
            store_b.events(&EventQuery::default()).unwrap().is_empty(),
            "only the publisher writes the row"
        );

        publisher
            .publish_live(publisher.event("turn_progress", serde_json::json!({"round": 2})))
            .await
            .unwrap();
        let text = tokio::time::timeout(Duration::from_secs(5), live_b.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(text.contains("turn_progress"));
        assert_eq!(
            store_a.events(&EventQuery::default()).unwrap().len(),
            1,
            "live-only: no row"
        );

        for kind in ["a..b", "a.*", "a b", ".a", ""] {
            let bad = publisher
                .publish(publisher.event(kind, serde_json::json!({})))
                .await;
            assert!(matches!(bad, Err(PublishError::BadType(_))), "{kind:?}");
        }
    }

    #[tokio::test]
    async fn a_recorded_event_is_one_row_and_live_without_awaiting_the_ack() {
        let mut server = NatsServer::start();
        let (client, js) = js_with_events_stream(&server.url()).await;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in(dir.path()).unwrap());
        let (_stop_tx, stop) = watch::channel(false);
        let feed = LiveFeed::start(client, stop).await.unwrap();
        let mut live = feed.subscribe();
        let publisher = Publisher::new("n", store.clone(), js.clone());
        let sent = publisher
            .record(publisher.event("webhook_received", serde_json::json!({"n": 1})))
            .await
            .unwrap();
        assert!(sent.seq > 0);
        let text = tokio::time::timeout(Duration::from_secs(5), live.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(text.contains(&sent.event_id));
        // The broadcast also lands on the events stream (acknowledged off the
        // caller's path).
        let mut stream = js.get_stream(crewlet_bus::EVENTS_STREAM).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while stream.info().await.unwrap().state.messages < 1 {
            assert!(tokio::time::Instant::now() < deadline, "never stored");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // With the broker gone `record` still answers Ok, whether or not the
        // client has noticed yet: the only await on its path is handing the
        // message to the client's command channel (2048 deep, and never
        // closed, as the client reconnects forever) under an ack permit
        // (5000, the first one returned by its ack). A `Broadcast` error
        // here would mean the call waited on the broker after all.
        server.kill();
        let kept = tokio::time::timeout(
            Duration::from_secs(2),
            publisher.record(publisher.event("webhook_received", serde_json::json!({"n": 2}))),
        )
        .await
        .expect("record does not wait for the broker");
        let kept = kept.expect("record answers once the row is written");
        assert!(kept.seq > sent.seq);
        assert_eq!(store.events(&EventQuery::default()).unwrap().len(), 2);
        // The lost broadcast is not silent: the detached wait gives up within
        // its bound and marks the run of failures (the one log line).
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT + Duration::from_secs(5);
        while !publisher.detached_failing.load(Ordering::Relaxed) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lost broadcast was never noticed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_broadcast_that_cannot_land_keeps_the_row_and_says_so() {
        let mut server = NatsServer::start();
        let (_client, js) = js_with_events_stream(&server.url()).await;
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in(dir.path()).unwrap());
        let publisher = Publisher::new("n", store.clone(), js);
        server.kill();
        let err = publisher
            .publish(publisher.event("node_started", serde_json::json!({})))
            .await
            .unwrap_err();
        assert!(matches!(err, PublishError::Broadcast { .. }), "{err}");
        assert_eq!(store.events(&EventQuery::default()).unwrap().len(), 1);
    }
}
