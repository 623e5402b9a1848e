//! A real nats-server with the streams ingress publishes to, coordination
//! on it behind a [`Faulty`] wrapper, a node store and an event publisher:
//! what the edge and the notification service run on in a node, without
//! the node.
//!
//! The streams are created here, one at a time, rather than all at once by
//! the node's stream crate (a test opens the mailboxes stream only when it
//! wants wakes to land), with the names, subjects and retentions that crate
//! gives them: interest for mailboxes and inbound deliveries, limits for
//! events and dead letters; the duplicate window is the server's default
//! (2 minutes), as in a node.

#![allow(dead_code)] // each test file uses a different part of this module

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use crewlet_bus::{
    AGENT_STREAM, AGENT_SUBJECTS, DLQ_STREAM, DLQ_SUBJECTS, EVENTS_STREAM, EVENTS_SUBJECTS,
    INBOUND_SUBJECT, Inbound, MSG_ID_HEADER, NOTIFICATIONS_STREAM, NOTIFICATIONS_SUBJECTS,
    NOTIFY_DLQ_SUBJECT, NOTIFY_DURABLE, TRACE_HEADER, Wake, mailbox_durable,
};
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Bucket, Coord, CoordOptions, Faulty, Kv, NatsKv, Owner};
use crewlet_ingress::notify::{NotifyConfig, NotifyService};
use crewlet_observe::Publisher;
use crewlet_store::{EventQuery, EventRecord, Store};
use crewlet_testkit::NatsServer;
use futures::StreamExt;
use tokio::sync::watch;

pub struct World {
    /// Kept for the test's length: dropping it stops the server.
    pub server: NatsServer,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub faulty: Arc<Faulty>,
    pub coord: Coord,
    pub store: Arc<Store>,
    pub publisher: Publisher,
    pub active: ActiveCompany,
    pub company: Company,
    admitting: watch::Sender<bool>,
    _data: tempfile::TempDir,
}

/// `examples/company.toml`: seats ada, linus (engineers) and grace.
pub fn example_company() -> Company {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Company::parse(&std::fs::read_to_string(root.join("examples/company.toml")).unwrap()).unwrap()
}

impl World {
    /// Must run on the test's own thread: a server spawned from a
    /// blocking-pool thread gets its parent-death signal when that thread
    /// retires.
    pub async fn start() -> World {
        let server = NatsServer::start();
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = jetstream::new(client.clone());
        for (name, subject, retention) in [
            (
                NOTIFICATIONS_STREAM,
                NOTIFICATIONS_SUBJECTS,
                stream::RetentionPolicy::Interest,
            ),
            (
                EVENTS_STREAM,
                EVENTS_SUBJECTS,
                stream::RetentionPolicy::Limits,
            ),
            (DLQ_STREAM, DLQ_SUBJECTS, stream::RetentionPolicy::Limits),
        ] {
            js.create_stream(stream::Config {
                name: name.into(),
                subjects: vec![subject.into()],
                retention,
                ..Default::default()
            })
            .await
            .unwrap();
        }
        let opts = CoordOptions::new(Owner::incarnation("ingress-test"));
        let nats = NatsKv::open(
            client.clone(),
            &opts.namespace,
            &Bucket::ALL,
            &Retentions {
                lease_ttl: opts.lease_ttl,
                status: opts.status_age,
                rate: opts.rate_age,
            },
            opts.replicas,
            opts.request_timeout,
        )
        .await
        .unwrap();
        let faulty = Faulty::new(Arc::new(nats));
        let kv: Arc<dyn Kv> = faulty.clone();
        let coord = Coord::with_backends(kv.clone(), kv, opts);
        let data = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in(data.path()).unwrap());
        let publisher = Publisher::new("ingress-test", store.clone(), js.clone());
        let company = example_company();
        World {
            server,
            client,
            js,
            faulty,
            coord,
            store,
            publisher,
            active: ActiveCompany::new(Some(Active::local(company.clone()))),
            company,
            admitting: watch::channel(true).0,
            _data: data,
        }
    }

    /// The mailboxes stream and every seat's mailbox: until then a wake
    /// publish has no stream to land in and fails.
    pub async fn open_mailboxes(&self) {
        self.js
            .create_stream(stream::Config {
                name: AGENT_STREAM.into(),
                subjects: vec![AGENT_SUBJECTS.into()],
                retention: stream::RetentionPolicy::Interest,
                ..Default::default()
            })
            .await
            .unwrap();
        crewlet_stream::ensure_mailboxes(
            &self.js,
            &self.coord.records(Bucket::Mailboxes),
            self.company.handles().map(|h| h.as_str()),
        )
        .await
        .unwrap();
    }

    pub async fn notify(&self) -> NotifyService {
        NotifyService::start(NotifyConfig {
            client: self.client.clone(),
            valve: self.coord.valve(),
            follows: self.coord.follows(),
            publisher: self.publisher.clone(),
            active: self.active.clone(),
            admitting: self.admitting.subscribe(),
        })
        .await
        .unwrap()
    }

    /// Publishes `inbound` as the edge does (its key as the message id).
    pub async fn publish_inbound(&self, inbound: &Inbound) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(MSG_ID_HEADER, inbound.key.as_str());
        headers.insert(TRACE_HEADER, inbound.trace_id.as_str());
        self.js
            .publish_with_headers(
                INBOUND_SUBJECT,
                headers,
                serde_json::to_vec(inbound).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// The `notify-inbound` consumer as the server sees it.
    pub async fn notify_consumer(&self) -> consumer::Info {
        self.js
            .get_stream(NOTIFICATIONS_STREAM)
            .await
            .unwrap()
            .consumer_info(NOTIFY_DURABLE)
            .await
            .unwrap()
    }

    /// The last message the inbound stream took (its sequence; 0 if none).
    /// Waits up to 10 s until the service holds no delivery and none waits.
    pub async fn until_settled(&self) {
        until(Duration::from_secs(10), "the delivery settled", || async {
            let c = self.notify_consumer().await;
            c.num_pending == 0 && c.num_ack_pending == 0
        })
        .await;
    }

    pub async fn inbound_last_seq(&self) -> u64 {
        let mut s = self.js.get_stream(NOTIFICATIONS_STREAM).await.unwrap();
        s.info().await.unwrap().state.last_sequence
    }

    /// Every dead letter, oldest first.
    pub async fn dead_letters(&self) -> Vec<serde_json::Value> {
        let mut s = self.js.get_stream(DLQ_STREAM).await.unwrap();
        let last = s.info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            if let Ok(m) = s.get_raw_message(seq).await
                && m.subject.as_str() == NOTIFY_DLQ_SUBJECT
            {
                out.push(serde_json::from_slice(&m.payload).unwrap());
            }
        }
        out
    }

    /// Wakes waiting in `handle`'s mailbox, not acknowledged by anyone.
    pub async fn pending_wakes(&self, handle: &str) -> u64 {
        let s = self.js.get_stream(AGENT_STREAM).await.unwrap();
        let info = s.consumer_info(mailbox_durable(handle)).await.unwrap();
        info.num_pending + info.num_ack_pending as u64
    }

    /// Takes (and acks) every wake in `handle`'s mailbox.
    pub async fn take_wakes(&self, handle: &str) -> Vec<Wake> {
        let s = self.js.get_stream(AGENT_STREAM).await.unwrap();
        let c: consumer::PullConsumer = s.get_consumer(&mailbox_durable(handle)).await.unwrap();
        let mut batch = c
            .fetch()
            .max_messages(100)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(m) = batch.next().await {
            let m = m.unwrap();
            m.double_ack().await.unwrap();
            out.push(serde_json::from_slice(&m.payload).unwrap());
        }
        out
    }

    /// How many times `scope`'s valve was charged, over every window the
    /// rate bucket still holds.
    pub async fn valve_charges(&self, scope: &str) -> u64 {
        let kv = self.js.get_key_value("crewlet_rate").await.unwrap();
        let prefix = format!("{}.", crewlet_coord::names::encode_token(scope));
        let mut keys = kv.keys().await.unwrap();
        let mut total = 0;
        while let Some(key) = keys.next().await {
            let key = key.unwrap();
            if key.starts_with(&prefix)
                && let Some(v) = kv.get(&key).await.unwrap()
            {
                total += serde_json::from_slice::<u64>(&v).unwrap();
            }
        }
        total
    }

    /// Events of `kind` in the store, newest first.
    pub fn events(&self, kind: &str) -> Vec<EventRecord> {
        self.store
            .events(&EventQuery {
                kind: Some(kind.into()),
                limit: 1000,
                ..Default::default()
            })
            .unwrap()
    }
}

/// A GitHub comment delivery mentioning `mentions`, as the edge builds it.
pub fn inbound(delivery: &str, mentions: &[&str]) -> Inbound {
    Inbound {
        trace_id: uuid::Uuid::now_v7().to_string(),
        key: format!("github:{delivery}"),
        delivery_id: delivery.into(),
        source: "github".into(),
        event_type: "issue_comment".into(),
        route_handle: None,
        mentions: mentions.iter().map(|m| (*m).to_owned()).collect(),
        assignees: Vec::new(),
        reviewers: Vec::new(),
        channel: Some("acme/robot#42".into()),
        thread: None,
        text: Some("could you take a look?".into()),
        owed: None,
        sender: Vec::new(),
        wakes: Default::default(),
        message: None,
        received_by: "ingress-test".into(),
        received_at_ms: 0,
    }
}

/// Polls `cond` every 50 ms until it holds; panics naming `what` after
/// `within`.
pub async fn until<F, Fut>(within: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {within:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
