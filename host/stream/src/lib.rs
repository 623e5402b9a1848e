//! The event stream's broker and the node's one connection to it.
//!
//! By default a node embeds its broker: Rust has no in-process NATS server,
//! so the node starts, supervises and finally stops its own `nats-server`
//! child ([`embedded`]). With `stream.url` set it dials an external server or
//! cluster instead and starts no child. Either way the rest of the node gets
//! exactly one [`async_nats::Client`]: the streams and the coordination
//! buckets ride that connection, never a second dial that could fail alone.

pub mod backup;
pub mod consumers;
pub mod credential;
pub mod embedded;
pub mod locate;
pub mod lock;
pub mod mailboxes;
pub mod streams;

use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use crewlet_config::{StreamConfig, StreamMode};
use tokio::sync::watch;
use tracing::{info, warn};

pub use credential::BrokerCredential;
pub use embedded::{BrokerStatus, ClusterStatus, Supervisor};
pub use locate::{NatsServerNotFound, locate_nats_server};
pub use lock::{DirLock, LockError};
pub use mailboxes::{
    MAILBOX_CLASS, MailboxDepth, MailboxError, MailboxRecord, RetireError, RetireReport,
    ensure_mailboxes, mailbox_depths, retire_mailbox, retire_mailboxes,
};

/// Why the broker could not be started or reached.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(transparent)]
    NotFound(#[from] NatsServerNotFound),
    #[error(transparent)]
    Locked(#[from] LockError),
    #[error("cannot prepare the embedded broker's files under {path}: {source}")]
    Files {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start nats-server {binary}: {source}")]
    Spawn {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "nats-server exited during start-up ({status}); its last words: {last_lines}\nCheck that the port is free and the store dir is writable."
    )]
    EarlyExit { status: String, last_lines: String },
    #[error(
        "nats-server did not accept connections on 127.0.0.1:{port} within {waited:?}; see the broker log lines above"
    )]
    StartTimeout { port: u16, waited: Duration },
    #[error("cannot connect to NATS at {urls}: {detail}")]
    Connect { urls: String, detail: String },
    #[error(
        "NATS at {urls} answers but JetStream is not available ({detail}); enable JetStream on the server (`-js` / `jetstream {{}}`)"
    )]
    NoJetStream { urls: String, detail: String },
    #[error(
        "the embedded servers did not form a JetStream cluster within {waited:?} (last answer: {detail}); start the other members named in `stream.cluster.routes`, check that every member has the same `stream.cluster.name` and `secret` and that each `listen` address is reachable from the others (`/health` shows `stream.server.cluster`)"
    )]
    ClusterNotFormed { waited: Duration, detail: String },
    #[error("start-up was interrupted by a shutdown signal")]
    Interrupted,
    #[error(
        "NATS at {urls} refused this node's credentials (authorization violation); check `stream.user`/`password`, `token`, `nkey_seed_file` or `creds_file` in the node's config"
    )]
    Refused { urls: String },
    #[error("the NATS credential {path} cannot be used: {why}")]
    Credential { path: String, why: String },
}

/// The node's connection to its stream, and the child behind it if embedded.
pub struct Broker {
    client: async_nats::Client,
    urls: Vec<String>,
    auth: &'static str,
    supervisor: Option<Supervisor>,
    outage: Outage,
}

/// Since when the node's connection has been down, stamped by the client's
/// own events (`Disconnected` stamps it, `Connected` clears it); the
/// connection state itself decides whether it is down now. A reconnection
/// lost again before its event was delivered counts as one outage.
#[derive(Clone, Default)]
struct Outage(Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl Outage {
    fn stamp(&self, down: bool) {
        let mut since = self.0.lock().expect("outage stamp");
        if !down {
            *since = None;
        } else if since.is_none() {
            *since = Some(std::time::Instant::now());
        }
    }

    /// How long the connection has been down, `None` while it is up; down
    /// before its event was delivered counts from now.
    fn down_for(&self, client: &async_nats::Client) -> Option<Duration> {
        if client.connection_state() == State::Connected {
            return None;
        }
        let since = *self.0.lock().expect("outage stamp");
        Some(since.map_or(Duration::ZERO, |t| t.elapsed()))
    }
}

/// What `/health` reports about the stream.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamHealth {
    pub mode: &'static str,
    /// Where the broker listens. None of them admits a client without the
    /// credential `auth` names (`nkey` for the embedded broker).
    pub urls: Vec<String>,
    pub auth: &'static str,
    pub connected: bool,
    /// How long the connection has been down (absent while connected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_ms: Option<u64>,
    /// The embedded child, when there is one.
    pub server: Option<BrokerStatus>,
}

impl Broker {
    /// Starts (embedded) or dials (external) the broker and waits until
    /// JetStream answers. `cancel` flipping to `true` abandons the wait.
    pub async fn start(
        config: &StreamConfig,
        node_id: &str,
        cancel: watch::Receiver<bool>,
    ) -> Result<Broker, StreamError> {
        Self::start_reporting(config, node_id, cancel, |_| {}).await
    }

    /// [`Broker::start`], handing `early` the embedded server's status as
    /// soon as the child accepts connections — before JetStream answers,
    /// which for a cluster still forming may be minutes — so `/health` can
    /// show what the server sees while the node waits.
    pub async fn start_reporting(
        config: &StreamConfig,
        node_id: &str,
        mut cancel: watch::Receiver<bool>,
        early: impl FnOnce(ServerWatch),
    ) -> Result<Broker, StreamError> {
        // A clustered embedded server answers JetStream only once its meta
        // group has a leader, which needs a quorum of members started.
        let form_within = match &config.mode {
            StreamMode::Embedded(spec) if spec.cluster.is_some() => Some(streams::START_WITHIN),
            _ => None,
        };
        let (urls, supervisor, options, auth) = match &config.mode {
            StreamMode::Embedded(spec) => {
                let sup = Supervisor::start(spec, node_id, cancel.clone()).await?;
                early(ServerWatch(sup.status_handle()));
                let options = sup.credential().options();
                (vec![sup.client_url()], Some(sup), options, "nkey")
            }
            StreamMode::External { urls, auth } => (
                urls.clone(),
                None,
                credential::external_options(auth).await?,
                credential::describe(auth),
            ),
        };
        let outage = Outage::default();
        let connect = connect(&urls, node_id, options, form_within, outage.clone());
        let client = tokio::select! {
            c = connect => c,
            _ = cancel.wait_for(|c| *c) => Err(StreamError::Interrupted),
        };
        let client = match client {
            Ok(c) => c,
            Err(e) => {
                if let Some(sup) = supervisor {
                    sup.stop().await;
                }
                return Err(e);
            }
        };
        Ok(Broker {
            client,
            urls,
            auth,
            supervisor,
            outage,
        })
    }

    /// The node's one connection. Clones share it.
    pub fn client(&self) -> async_nats::Client {
        self.client.clone()
    }

    pub fn jetstream(&self) -> async_nats::jetstream::Context {
        async_nats::jetstream::new(self.client.clone())
    }

    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    pub fn health(&self) -> StreamHealth {
        StreamHealth {
            mode: if self.supervisor.is_some() {
                "embedded"
            } else {
                "external"
            },
            urls: self.urls.clone(),
            auth: self.auth,
            connected: self.is_connected(),
            down_ms: millis(self.outage.down_for(&self.client)),
            server: self.supervisor.as_ref().map(Supervisor::status),
        }
    }

    /// A cheap handle that answers connection state and health later.
    pub fn monitor(&self) -> BrokerMonitor {
        BrokerMonitor {
            client: self.client.clone(),
            urls: self.urls.clone(),
            auth: self.auth,
            status: self.supervisor.as_ref().map(Supervisor::status_handle),
            outage: self.outage.clone(),
        }
    }

    /// Flushes and closes the connection, then stops the child (if any).
    /// The broker is the last thing a node stops.
    pub async fn stop(self) {
        // Drain: flush what is buffered and close the connection every clone
        // shares, so the broker stopping next is not mistaken for an outage.
        match tokio::time::timeout(Duration::from_secs(5), self.client.drain()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(subsystem = "stream", error = %e, "drain on shutdown failed"),
            Err(_) => warn!(subsystem = "stream", "drain on shutdown timed out"),
        }
        drop(self.client);
        if let Some(sup) = self.supervisor {
            sup.stop().await;
        }
        info!(subsystem = "stream", "stream stopped");
    }
}

/// The embedded server's status, readable while the node still waits for
/// JetStream (see [`Broker::start_reporting`]).
#[derive(Clone)]
pub struct ServerWatch(Arc<std::sync::Mutex<BrokerStatus>>);

impl ServerWatch {
    pub fn status(&self) -> BrokerStatus {
        self.0.lock().expect("broker status lock").clone()
    }
}

/// Answers the stream's health without holding the broker itself.
#[derive(Clone)]
pub struct BrokerMonitor {
    client: async_nats::Client,
    urls: Vec<String>,
    auth: &'static str,
    status: Option<Arc<std::sync::Mutex<BrokerStatus>>>,
    outage: Outage,
}

impl BrokerMonitor {
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// How long the connection has been down; `None` while it is up.
    pub fn down_for(&self) -> Option<Duration> {
        self.outage.down_for(&self.client)
    }

    /// The server the connection is on now, as its INFO said.
    pub fn server_info(&self) -> async_nats::ServerInfo {
        self.client.server_info()
    }

    /// The URLs the node was given, any `user:password@` left out.
    pub fn urls_without_credentials(&self) -> Vec<String> {
        self.urls
            .iter()
            .map(|u| match (u.find("://"), u.rfind('@')) {
                (Some(scheme), Some(at)) if at > scheme => {
                    format!("{}{}", &u[..scheme + 3], &u[at + 1..])
                }
                (None, Some(at)) => u[at + 1..].to_owned(),
                _ => u.clone(),
            })
            .collect()
    }

    pub fn health(&self) -> StreamHealth {
        StreamHealth {
            mode: if self.status.is_some() {
                "embedded"
            } else {
                "external"
            },
            urls: self.urls.clone(),
            auth: self.auth,
            connected: self.is_connected(),
            down_ms: millis(self.down_for()),
            server: self
                .status
                .as_ref()
                .map(|s| s.lock().expect("broker status lock").clone()),
        }
    }
}

fn millis(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Dials `urls`, waiting (with the client's own reconnect backoff) until the
/// first connection is up and JetStream answers — for at most
/// `form_within` after the connection is up, when given (a cluster
/// forming), else until cancelled.
async fn connect(
    urls: &[String],
    node_id: &str,
    options: async_nats::ConnectOptions,
    form_within: Option<Duration>,
    outage: Outage,
) -> Result<async_nats::Client, StreamError> {
    let joined = urls.join(",");
    let addrs: Vec<async_nats::ServerAddr> = urls
        .iter()
        .map(|u| {
            u.parse().map_err(|e| StreamError::Connect {
                urls: joined.clone(),
                detail: format!("`{u}` is not a NATS URL: {e}"),
            })
        })
        .collect::<Result<_, _>>()?;
    let url_list = joined.clone();
    // Wrong credentials never start working: stop waiting when the server
    // says so (the client itself would retry forever).
    let (refused_tx, refused_rx) = watch::channel(false);
    // The client calls back from its own task, outside the node's span.
    let node = node_id.to_owned();
    let options = options
        .name(format!("crewlet:{node_id}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(2))
        .reconnect_delay_callback(|attempt| {
            Duration::from_millis((25u64 << attempt.min(6)).min(1_000))
        })
        .event_callback(move |event| {
            let urls = url_list.clone();
            let node_id = node.clone();
            let refused = refused_tx.clone();
            let outage = outage.clone();
            async move {
                match event {
                    async_nats::Event::ServerError(async_nats::ServerError::AuthorizationViolation) => {
                        refused.send_replace(true);
                        warn!(subsystem = "stream", %node_id, %urls, "NATS refused this node's credentials")
                    }
                    // A connect attempt the server refused comes back as the
                    // error kind's text ("authorization violation").
                    async_nats::Event::ClientError(async_nats::ClientError::Other(why))
                        if why.contains("authorization violation") =>
                    {
                        refused.send_replace(true);
                        warn!(subsystem = "stream", %node_id, %urls, "NATS refused this node's credentials")
                    }
                    async_nats::Event::Connected => {
                        outage.stamp(false);
                        info!(subsystem = "stream", %node_id, %urls, "connected to NATS")
                    }
                    async_nats::Event::Disconnected => {
                        outage.stamp(true);
                        warn!(subsystem = "stream", %node_id, %urls, "disconnected from NATS; reconnecting")
                    }
                    other => {
                        info!(subsystem = "stream", %node_id, event = %other, "NATS client event")
                    }
                }
            }
        });
    let client = options
        .connect(addrs.as_slice())
        .await
        .map_err(|e| StreamError::Connect {
            urls: joined.clone(),
            detail: e.to_string(),
        })?;
    let started = std::time::Instant::now();
    let mut next_warning = Duration::from_secs(5);
    while client.connection_state() != State::Connected {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if *refused_rx.borrow() {
            return Err(StreamError::Refused { urls: joined });
        }
        if started.elapsed() >= next_warning {
            warn!(subsystem = "stream", urls = %joined, waited = ?started.elapsed(), "still waiting for NATS");
            next_warning += Duration::from_secs(5);
        }
    }
    let js = async_nats::jetstream::new(client.clone());
    let asked_from = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        let detail = match tokio::time::timeout(Duration::from_secs(5), js.query_account()).await {
            Ok(Ok(_)) => return Ok(client),
            Ok(Err(e)) => {
                let detail = e.to_string();
                // "JetStream not enabled" is final; anything else is the
                // server (or its cluster) still coming up, so ask again.
                if detail.contains("not enabled") {
                    return Err(StreamError::NoJetStream {
                        urls: joined,
                        detail,
                    });
                }
                detail
            }
            Err(_) => "the account query timed out".to_owned(),
        };
        if let Some(within) = form_within
            && asked_from.elapsed() >= within
        {
            return Err(StreamError::ClusterNotFormed {
                waited: within,
                detail,
            });
        }
        warn!(subsystem = "stream", urls = %joined, %detail, retry_in = ?wait, "JetStream not answering yet (a cluster still electing its meta leader?)");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}
