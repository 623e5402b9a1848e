//! The event streams, created at start or adopted as they are. Their names
//! and subjects are `crewlet-bus`'s.
//!
//! | stream | subjects | retention | why |
//! | --- | --- | --- | --- |
//! | `CREWLET_AGENT` | `crewlet.agent.>` | interest | a seat's inbox is a mailbox: a message lives until its durable consumer acks it |
//! | `CREWLET_NOTIFICATIONS` | `crewlet.notifications.>` | interest | inbound deliveries wait for the `notify-inbound` group |
//! | `CREWLET_EVENTS` | `crewlet.events.>` | limits, 7 days | the broadcast every dashboard streams |
//! | `CREWLET_DLQ` | `dlq.>` | limits, 30 days | dead letters, deliberately outside `crewlet.*` |
//! | `CREWLET_CUSTODY` | `crewlet.custody.>` | interest, 30 days | the event batches of nodes without `data`, until one data node took each (its durable made by every node at start) |
//! | `CREWLET_MEMORY` | `crewlet.memory.>` | limits, no age, one message per subject, rows ≤ [`MEMORY_MAX_ROW`] | every seat's memory rows, a keyed table the seat's next holder replays (`crewlet-memory`) |
//!
//! Interest retention has a sharp edge: a publish to a subject no durable
//! consumer covers is dropped in silence. That is why every node creates a
//! mailbox for every seat of the company, not only for the seats it runs.
//!
//! A stream counts as ensured only once a write through the node's own
//! connection reaches it (`crewlet_coord::until_writable`): on a cluster
//! the stream exists a moment before its leader's subject interest reaches
//! every member, and a publish through a member that has not heard is
//! answered "no stream found".
//!
//! An existing stream is adopted, never rewritten: changing a retention is
//! an operator's gesture. One difference refuses the start: fewer replicas
//! than configured, which would hold the company's work on fewer disks than
//! every node reports. One is raised: a consumer limit below this build's.
//! nats-server 2.15 caps every stream that names no limit at 1,000
//! consumers, and a company's mailboxes are one durable consumer per seat:
//! the 1,001st seat's mailbox was refused ("maximum consumers limit
//! reached") on a stream an older build made.

use std::time::Duration;

use async_nats::jetstream::stream::{Config, DiscardPolicy, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, context::GetStreamErrorKind};
use crewlet_bus::{
    AGENT_STREAM, AGENT_SUBJECTS, CUSTODY_STREAM, CUSTODY_SUBJECTS, DLQ_STREAM, DLQ_SUBJECTS,
    EVENTS_STREAM, EVENTS_SUBJECTS, MEMORY_STREAM, MEMORY_SUBJECTS, NOTIFICATIONS_STREAM,
    NOTIFICATIONS_SUBJECTS,
};
use crewlet_coord::REACH_WITHIN;
use tracing::{info, warn};

/// One stream the node needs.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    pub name: &'static str,
    pub subjects: &'static [&'static str],
    pub retention: RetentionPolicy,
    pub max_age: Duration,
    /// The consumers it may have (the server's default is 1,000).
    pub max_consumers: i32,
    /// Messages kept per subject (`-1`: no limit; `1`: a keyed table).
    pub max_msgs_per_subject: i64,
    /// The largest message it stores (`-1`: the server's payload limit).
    pub max_msg_size: i32,
    pub description: &'static str,
}

impl StreamSpec {
    /// A subject of the stream no message of the node's is ever sent on,
    /// for the probe that proves a write reaches it.
    fn probe_subject(&self) -> String {
        let first = self.subjects[0];
        format!("{}._reach", first.trim_end_matches(".>"))
    }
}

const DAY: Duration = Duration::from_secs(24 * 3600);

/// How long every stream remembers a message id (`Nats-Msg-Id`): a second
/// publish of one within it is stored nowhere and acked as a duplicate.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The seats a fleet may have: one mailbox consumer each.
pub const MAX_MAILBOXES: i32 = 100_000;

/// The largest memory row `CREWLET_MEMORY` stores: half nats-server's
/// default payload limit (1 MiB), so a row too large is refused by the
/// stream, never by the server closing the node's connection.
pub const MEMORY_MAX_ROW: i32 = 512 * 1024;

/// Every stream a node creates or adopts at start.
pub fn specs() -> [StreamSpec; 6] {
    [
        StreamSpec {
            name: AGENT_STREAM,
            subjects: &[AGENT_SUBJECTS],
            retention: RetentionPolicy::Interest,
            max_age: Duration::ZERO,
            max_consumers: MAX_MAILBOXES,
            max_msgs_per_subject: -1,
            max_msg_size: -1,
            description: "seat mailboxes: crewlet.agent.HANDLE.inbox",
        },
        StreamSpec {
            name: NOTIFICATIONS_STREAM,
            subjects: &[NOTIFICATIONS_SUBJECTS],
            retention: RetentionPolicy::Interest,
            max_age: Duration::ZERO,
            max_consumers: 1_000,
            max_msgs_per_subject: -1,
            max_msg_size: -1,
            description: "inbound deliveries awaiting the notify-inbound group",
        },
        StreamSpec {
            name: EVENTS_STREAM,
            subjects: &[EVENTS_SUBJECTS],
            retention: RetentionPolicy::Limits,
            max_age: 7 * DAY,
            // Modules' subscriptions and every live reader's consumer.
            max_consumers: 10_000,
            max_msgs_per_subject: -1,
            max_msg_size: -1,
            description: "the live event broadcast",
        },
        StreamSpec {
            name: DLQ_STREAM,
            subjects: &[DLQ_SUBJECTS],
            retention: RetentionPolicy::Limits,
            max_age: 30 * DAY,
            max_consumers: 1_000,
            max_msgs_per_subject: -1,
            max_msg_size: -1,
            description: "dead letters, with the reason",
        },
        StreamSpec {
            name: MEMORY_STREAM,
            subjects: &[MEMORY_SUBJECTS],
            retention: RetentionPolicy::Limits,
            // What a seat should still remember is the learning
            // subsystem's decision, not the broker's.
            max_age: Duration::ZERO,
            // One hydration pass per seat acquire, at a time.
            max_consumers: 10_000,
            max_msgs_per_subject: 1,
            max_msg_size: MEMORY_MAX_ROW,
            description: "seat memory rows: crewlet.memory.HANDLE.TABLE.DIGEST, one per subject",
        },
        StreamSpec {
            name: CUSTODY_STREAM,
            subjects: &[CUSTODY_SUBJECTS],
            retention: RetentionPolicy::Interest,
            // The event log's own horizon: a batch nobody took by then has
            // no row left it could join.
            max_age: 30 * DAY,
            max_consumers: 1_000,
            max_msgs_per_subject: -1,
            max_msg_size: -1,
            description: "event batches of nodes without data, until one data node keeps each",
        },
    ]
}

#[derive(Debug, thiserror::Error)]
pub enum StreamsError {
    #[error(
        "stream {name} has {found} replica(s) but this node is configured for {configured} (stream.replicas); raise it with `nats stream update {name} --replicas={configured}` or lower stream.replicas"
    )]
    TooFewReplicas {
        name: String,
        found: usize,
        configured: usize,
    },
    #[error(
        "cannot read or create stream {name}: {detail}; is JetStream up and does this account have room for it?"
    )]
    Unavailable { name: String, detail: String },
    #[error(transparent)]
    Unreachable(Box<crewlet_coord::Unreachable>),
}

/// Creates each stream that is missing and adopts each that exists; returns
/// once a write through `js` reaches every one of them. A stream the server
/// cannot read, create or reach yet is asked for again with backoff for up
/// to [`START_WITHIN`]; too few replicas is final at once.
pub async fn ensure_streams(js: &jetstream::Context, replicas: usize) -> Result<(), StreamsError> {
    ensure_streams_joining(js, replicas, false).await
}

/// [`ensure_streams`] on a cluster whose members may still be joining
/// (embedded servers started side by side, `[stream.cluster]`): a server
/// that has too few peers for `replicas` yet ("insufficient resources") is
/// asked again too, within the same [`START_WITHIN`], since the peer it
/// lacks may be a member that has not started. On a cluster of fixed size
/// (`joining` false) that answer is final at once.
pub async fn ensure_streams_joining(
    js: &jetstream::Context,
    replicas: usize,
    joining: bool,
) -> Result<(), StreamsError> {
    let started = std::time::Instant::now();
    let mut wait = Duration::from_millis(250);
    loop {
        match ensure_once(js, replicas).await {
            Err(e)
                if (e.transient() || (joining && e.too_few_peers()))
                    && started.elapsed() < START_WITHIN =>
            {
                warn!(subsystem = "stream", error = %e, retry_in = ?wait, "streams not ready yet (a cluster still electing its leaders?); retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

impl StreamsError {
    /// The server knows too few JetStream peers for the replicas asked.
    fn too_few_peers(&self) -> bool {
        matches!(self, StreamsError::Unavailable { detail, .. }
            if detail.to_ascii_lowercase().contains("insufficient resources"))
    }

    /// Whether asking again may succeed: a server that timed out, had no
    /// leader or did not answer, not one that refused the stream (too few
    /// servers for its replicas, an account without room).
    fn transient(&self) -> bool {
        match self {
            StreamsError::TooFewReplicas { .. } => false,
            StreamsError::Unreachable(_) => true,
            StreamsError::Unavailable { detail, .. } => {
                let d = detail.to_ascii_lowercase();
                !(d.contains("insufficient resources")
                    || d.contains("non-clustered")
                    || d.contains("replicas"))
            }
        }
    }
}

/// How long a start keeps asking for streams the server cannot yet read or
/// create (a cluster electing its stream leaders answers "timed out" for a
/// few seconds) before it gives up; `/ready` answers 503 meanwhile.
pub const START_WITHIN: Duration = Duration::from_secs(120);

async fn ensure_once(js: &jetstream::Context, replicas: usize) -> Result<(), StreamsError> {
    // Side by side: each creation is a stream the server creates and syncs.
    let specs = specs();
    futures::future::try_join_all(specs.iter().map(|spec| async move {
        ensure(js, spec, replicas).await?;
        crewlet_coord::until_writable(js, spec.name, &spec.probe_subject(), REACH_WITHIN)
            .await
            .map_err(|e| StreamsError::Unreachable(Box::new(e)))
    }))
    .await?;
    Ok(())
}

async fn ensure(
    js: &jetstream::Context,
    spec: &StreamSpec,
    replicas: usize,
) -> Result<(), StreamsError> {
    let unavailable = |detail: String| StreamsError::Unavailable {
        name: spec.name.to_owned(),
        detail,
    };
    match js.get_stream(spec.name).await {
        Ok(stream) => {
            let cfg = &stream.cached_info().config;
            if cfg.num_replicas < replicas {
                return Err(StreamsError::TooFewReplicas {
                    name: spec.name.to_owned(),
                    found: cfg.num_replicas,
                    configured: replicas,
                });
            }
            if cfg.retention != spec.retention || cfg.max_age != spec.max_age {
                warn!(subsystem = "stream", stream = spec.name,
                    retention_in_force = ?cfg.retention, max_age_in_force = ?cfg.max_age,
                    "stream adopted with a retention that differs from this build's; honouring it");
            }
            if cfg.max_consumers <= 0 || cfg.max_consumers < spec.max_consumers {
                raise_consumer_limit(js, spec, cfg.clone()).await;
            }
            info!(
                subsystem = "stream",
                stream = spec.name,
                replicas = cfg.num_replicas,
                "stream adopted"
            );
            Ok(())
        }
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(inner)
                if inner.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                let config = Config {
                    name: spec.name.to_owned(),
                    description: Some(spec.description.to_owned()),
                    subjects: spec.subjects.iter().map(|s| (*s).to_owned()).collect(),
                    retention: spec.retention,
                    max_age: spec.max_age,
                    storage: StorageType::File,
                    num_replicas: replicas,
                    discard: DiscardPolicy::Old,
                    duplicate_window: DUPLICATE_WINDOW,
                    max_consumers: spec.max_consumers,
                    max_messages_per_subject: spec.max_msgs_per_subject,
                    max_message_size: spec.max_msg_size,
                    ..Config::default()
                };
                match js.create_stream(config).await {
                    Ok(_) => {
                        info!(
                            subsystem = "stream",
                            stream = spec.name,
                            replicas,
                            "stream created"
                        );
                        Ok(())
                    }
                    // Another node created it between our read and create:
                    // adopt what it made.
                    Err(create) => match js.get_stream(spec.name).await {
                        Ok(_) => Ok(()),
                        Err(_) => Err(unavailable(create.to_string())),
                    },
                }
            }
            _ => Err(unavailable(e.to_string())),
        },
    }
}

/// Raises an adopted stream's consumer limit to the spec's. A server that
/// cannot change it (before 2.12) keeps the stream as it is, with a warning
/// that says what it bounds.
async fn raise_consumer_limit(js: &jetstream::Context, spec: &StreamSpec, mut cfg: Config) {
    let found = cfg.max_consumers;
    cfg.max_consumers = spec.max_consumers;
    match js.update_stream(cfg).await {
        Ok(_) => info!(
            subsystem = "stream",
            stream = spec.name,
            found,
            raised_to = spec.max_consumers,
            "stream consumer limit raised"
        ),
        Err(e) => {
            warn!(subsystem = "stream", stream = spec.name, found, wanted = spec.max_consumers, error = %e,
            "cannot raise the stream's consumer limit; the server's own (1,000 on 2.15) bounds it, and the seats a company may have with it")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crewlet_testkit::NatsServer;

    #[tokio::test]
    async fn streams_are_created_once_and_adopted_after() {
        let server = NatsServer::start();
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = jetstream::new(client);
        ensure_streams(&js, 1).await.unwrap();
        for spec in specs() {
            let info = js
                .get_stream(spec.name)
                .await
                .unwrap()
                .cached_info()
                .clone();
            assert_eq!(info.config.retention, spec.retention, "{}", spec.name);
            assert_eq!(info.config.max_age, spec.max_age, "{}", spec.name);
            assert_eq!(
                info.config.max_consumers, spec.max_consumers,
                "{}",
                spec.name
            );
            assert_eq!(
                (
                    info.config.max_messages_per_subject,
                    info.config.max_message_size
                ),
                (spec.max_msgs_per_subject, spec.max_msg_size),
                "{}",
                spec.name
            );
        }
        let memory = js.get_stream(MEMORY_STREAM).await.unwrap();
        let memory = &memory.cached_info().config;
        assert_eq!(
            (memory.max_messages_per_subject, memory.max_age),
            (1, Duration::ZERO),
            "the memory stream is a keyed table with no age"
        );
        // A stream an older build made names no consumer limit, which a
        // 2.15 server reads as 1,000: raised on adoption.
        let mut agent = js
            .get_stream(AGENT_STREAM)
            .await
            .unwrap()
            .cached_info()
            .config
            .clone();
        agent.max_consumers = 1_000;
        js.update_stream(agent).await.unwrap();
        // Someone changed a retention by hand: adopted, not rewritten.
        let mut events = js
            .get_stream(EVENTS_STREAM)
            .await
            .unwrap()
            .cached_info()
            .config
            .clone();
        events.max_age = Duration::from_secs(3600);
        js.update_stream(events).await.unwrap();
        ensure_streams(&js, 1).await.unwrap();
        let info = js
            .get_stream(EVENTS_STREAM)
            .await
            .unwrap()
            .cached_info()
            .clone();
        assert_eq!(info.config.max_age, Duration::from_secs(3600));
        let agent = js
            .get_stream(AGENT_STREAM)
            .await
            .unwrap()
            .cached_info()
            .clone();
        assert_eq!(agent.config.max_consumers, MAX_MAILBOXES);
    }

    #[tokio::test]
    async fn fewer_replicas_than_configured_refuses_naming_both_counts() {
        let server = NatsServer::start();
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = jetstream::new(client);
        ensure_streams(&js, 1).await.unwrap();
        let err = ensure_streams(&js, 3).await.unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                StreamsError::TooFewReplicas {
                    found: 1,
                    configured: 3,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("1 replica") && msg.contains("configured for 3"),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_stream_the_server_refuses_fails_the_start_at_once() {
        let server = NatsServer::start();
        let client = async_nats::connect(server.url()).await.unwrap();
        let js = jetstream::new(client);
        // Three replicas on one server: refused by the server, not retried
        // for START_WITHIN as a leader election would be.
        let t0 = std::time::Instant::now();
        let err = ensure_streams(&js, 3).await.unwrap_err();
        assert!(!err.transient(), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }
}
