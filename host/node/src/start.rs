//! The node's start, part by part, each pushed on the one teardown stack
//! ([`Started`]) as it comes up: the HTTP surface, the stream, then the
//! engine — coordination, plugins, tokens, presence, secrets, pauses, the config
//! plane, ingress, the seats and the duties. A failure stops the start; the caller
//! unwinds what was started.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crewlet_config::{LogFormat, NodeConfig};
use crewlet_stream::{Broker, StreamError};
use tokio::sync::watch;
use tracing::{Instrument, error, info, info_span, warn};

use crate::company::CompanyFile;
use crate::engine::{EngineContext, Late, Started};
use crate::state::{NodeState, Phase};

/// A failure that stops the node, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot create the data dir {dir}: {source}")]
    DataDir {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Locked(#[from] crewlet_stream::LockError),
    #[error("cannot establish the node id: {0}")]
    Identity(std::io::Error),
    #[error(
        "cannot listen on {addr}: {source}; set api.port to a free port (or 0 to serve no HTTP)"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error(transparent)]
    Store(#[from] crewlet_store::StoreError),
    #[error(transparent)]
    Streams(#[from] crewlet_stream::streams::StreamsError),
    #[error("{0}")]
    Engine(String),
    #[error("coordination: {0}")]
    Coordination(crewlet_coord::OpenError),
    #[error("plugins: {0}")]
    Plugins(crewlet_catalog::StartError),
    #[error(transparent)]
    Keyring(#[from] crewlet_secrets::KeyringError),
    #[error(transparent)]
    LocalShared(#[from] crate::local_guard::Shared),
}

impl NodeError {
    /// A configuration the operator must change: exit 2, like a bad file.
    pub fn is_configuration(&self) -> bool {
        matches!(self, NodeError::LocalShared(_))
    }
}

/// What the start borrows from the lifecycle.
#[derive(Clone, Copy)]
pub struct Parts<'a> {
    pub config: &'a NodeConfig,
    pub state: &'a Arc<NodeState>,
    pub late: &'a Late,
    pub tokens: &'a Arc<crewlet_tokens::Tokens>,
    pub active: &'a crewlet_company::ActiveCompany,
    pub company: &'a Option<CompanyFile>,
    pub plugins: &'a [std::path::PathBuf],
    pub store: &'a Arc<crewlet_store::Store>,
    pub node_id: &'a str,
}

/// Starts every part in order, each pushed on `started` as it comes up:
/// the HTTP surface, the stream, then the engine. Answers the publisher
/// (none when a signal interrupted the stream's start). On an error the
/// caller unwinds `started`.
pub async fn start(
    p: Parts<'_>,
    descriptors: u64,
    keyring: crewlet_secrets::Keyring,
    shutdown: watch::Receiver<bool>,
    started: &mut Started,
) -> Result<Option<crewlet_observe::Publisher>, NodeError> {
    let bound = serve_http(p, descriptors, started).await?;
    let broker = match Broker::start_reporting(&p.config.stream, p.node_id, shutdown, |server| {
        p.state.attach_broker_server(server)
    })
    .instrument(info_span!("stream", subsystem = "stream"))
    .await
    {
        Ok(b) => b,
        Err(StreamError::Interrupted) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let (client, monitor) = (broker.client(), broker.monitor());
    let urls = broker.health().urls.join(",");
    started.push_base("stream", move || Box::pin(broker.stop()));
    let jetstream = async_nats::jetstream::new(client.clone());
    // Embedded servers clustering side by side: a peer may not have started.
    let joining = matches!(&p.config.stream.mode,
        crewlet_config::StreamMode::Embedded(b) if b.cluster.is_some());
    crewlet_stream::streams::ensure_streams_joining(&jetstream, p.config.stream.replicas, joining)
        .instrument(info_span!("streams", subsystem = "stream"))
        .await?;
    // Before any event is published: the custody stream keeps a stateless
    // node's batches only while the durable covers them.
    crewlet_history::custody::ensure_durable(&jetstream)
        .await
        .map_err(|e| NodeError::Engine(e.to_string()))?;
    let data = p.config.roles.contains(&crewlet_config::Role::Data);

    // The observability edge: rows written inline by this node's
    // publisher, the live view fed from the fleet's broadcast.
    let (live_stop_tx, live_stop) = watch::channel(false);
    match crewlet_observe::LiveFeed::start(client.clone(), live_stop).await {
        Ok(feed) => {
            p.state.attach_live(feed);
            started.push("observe", move || {
                Box::pin(async move {
                    let _ = live_stop_tx.send(true);
                })
            });
        }
        Err(e) => {
            warn!(subsystem = "observe", error = %e, "live feed unavailable; /ws/stream will push nothing")
        }
    }
    // Without `data` the node keeps no event log: custody batches instead.
    // Either way the usage tally gets each usage event as it is kept.
    let (tap, usage_events) = crewlet_estate::tap();
    let mut publisher = if data {
        crewlet_observe::Publisher::new(p.node_id, p.store.clone(), jetstream)
    } else {
        crewlet_observe::Publisher::stateless(p.node_id, jetstream)
    }
    .with_tap(tap);
    if let Some(endpoint) = &p.config.telemetry.otlp_endpoint {
        match crewlet_observe::Traces::start(endpoint, p.node_id) {
            Ok(traces) => {
                info!(subsystem = "traces", %endpoint, "exporting spans over OTLP/HTTP");
                publisher = publisher.with_traces(traces);
            }
            Err(e) => warn!(subsystem = "traces", error = %e, "spans are not exported"),
        }
    }

    // Coordination rides the stream's connection: never a second dial.
    let owner = crewlet_coord::Owner::incarnation(p.node_id);
    let coord = open_coordination(p.config, client.clone(), owner.clone()).await?;
    if p.config.coordination.kind == crewlet_config::CoordinationType::Local {
        crate::local_guard::claim(client.clone(), p.node_id, started).await?;
    }
    info!(subsystem = "coordination", lease_ttl = ?coord.lease_ttl(), "coordination open");
    // Plugins: the catalogue, its module buckets, every plugin loaded.
    let loaded = match p.plugins {
        [] => None,
        dirs => Some(Arc::new(
            crewlet_catalog::load(dirs, p.config, client.clone(), publisher.clone())
                .instrument(info_span!("plugins", subsystem = "plugins"))
                .await
                .map_err(NodeError::Plugins)?,
        )),
    };
    start_tokens(p, &coord, bound, started).await;
    if let Some(loaded) = &loaded {
        info!(
            subsystem = "plugins",
            loaded = loaded.installed.len(),
            failed = loaded.failed().len(),
            "plugins loaded"
        );
        p.state.attach_plugins(loaded.clone());
    }
    // Peers can ask this node for its history before they can see it.
    let since = p.state.started_at_ms();
    match crewlet_history::Responder::start(
        client.clone(),
        p.node_id.into(),
        p.store.clone(),
        since,
    )
    .await
    {
        Ok(responder) => started.push("history", move || Box::pin(responder.stop())),
        Err(e) => warn!(subsystem = "history", error = %e, "history reads not answered"),
    }
    let status_of = p.state.clone();
    let presence = crewlet_fleet::presence::Presence::start(
        coord.leases("node"),
        p.node_id.to_owned(),
        owner,
        move || status_of.node_status(),
    );
    p.state.attach_presence(presence.view_handle());
    started.push("presence", move || Box::pin(presence.stop()));
    let secrets = open_secrets(p, &client, &coord, keyring, started).await;
    let (mirror, pauses) = crewlet_seats::PauseMirror::start(coord.pauses());
    started.push("pauses", move || Box::pin(mirror.stop()));
    p.state.attach_pauses(pauses.clone());

    let ctx = EngineContext {
        node_id: p.node_id.to_owned(),
        config: Arc::new(p.config.clone()),
        client,
        coord,
        store: p.store.clone(),
        publisher: publisher.clone(),
        state: p.state.clone(),
        active: p.active.clone(),
        company_file: p.company.clone(),
        plugins: loaded,
        secrets,
        pauses,
    };
    let (custody, keeping) =
        crewlet_history::custody_view::start(crewlet_history::custody_view::Parts {
            node_id: ctx.node_id.clone(),
            data,
            store: ctx.store.clone(),
            coord: ctx.coord.clone(),
            client: ctx.client.clone(),
        });
    p.state.attach_custody(custody);
    started.push("custody", move || Box::pin(keeping.stop()));
    // A prepared restore: the company's buckets and streams back before
    // the config plane and the seats read them.
    crewlet_estate::backup::adopt_pending(&crate::surface::backup_parts(&ctx))
        .await
        .map_err(|e| NodeError::Engine(e.to_string()))?;
    start_config_plane(&ctx, started).await;
    let edge = crate::ingress::start(&ctx, started)
        .await
        .map_err(NodeError::Engine)?;
    // Modules consume before the seats start, so a drain stops them after.
    start_modules(&ctx, started).await;
    crate::seats::start(&ctx, started)
        .await
        .map_err(NodeError::Engine)?;
    start_duties(&ctx, started).await;
    start_estate(&ctx, started, usage_events).await;
    p.late.set(ctx, edge);
    p.state.attach_stream(monitor);
    p.state.advance(Phase::Running);
    info!(subsystem = "node", stream = %urls, "node running");
    Ok(Some(publisher))
}

/// The usage publisher, and with `data` the replicated estate.
async fn start_estate(
    ctx: &EngineContext,
    started: &mut Started,
    usage_events: crewlet_estate::UsageEvents,
) {
    let parts = crewlet_estate::Parts {
        usage_events,
        node_id: &ctx.node_id,
        client: &ctx.client,
        coord: &ctx.coord,
        store: &ctx.store,
        active: &ctx.active,
        config: &ctx.config,
    };
    let running = crewlet_estate::start(parts, &ctx.state.estate).await;
    started.push("estate", move || Box::pin(running.stop()));
}

/// The config reconciler: it accepts a document as `--company` is, and
/// shows its posture on the node's state.
async fn start_config_plane(ctx: &EngineContext, started: &mut Started) {
    let policy = crate::company::policy(&ctx.config);
    let running = crewlet_configplane::start(crewlet_configplane::Parts {
        node_id: ctx.node_id.clone(),
        pointer: ctx.coord.config_pointer(),
        store: ctx.store.clone(),
        publisher: ctx.publisher.clone(),
        active: ctx.active.clone(),
        postures: ctx.state.clone(),
        accept: Arc::new(move |document: &str| crate::company::accept(document, &policy)),
        seed: ctx
            .company_file
            .as_ref()
            .map(|f| crewlet_configplane::Seed {
                path: f.path.clone(),
                company: f.company.clone(),
                activate: f.activate,
            }),
        client: Some(ctx.client.clone()),
    })
    .await;
    started.push("configplane", move || Box::pin(running.stop()));
}

/// Every loaded module's subscriptions, consumed on this node, then the
/// plugin reload loop (`[plugins] reload`), which is stopped first.
async fn start_modules(ctx: &EngineContext, started: &mut Started) {
    let Some(loaded) = &ctx.plugins else { return };
    let running = crewlet_catalog::start(crewlet_catalog::Parts {
        loaded: loaded.clone(),
        js: async_nats::jetstream::new(ctx.client.clone()),
        reload: ctx.config.plugin_reload,
    })
    .await;
    started.push("modules", move || Box::pin(running.stop()));
}

/// The company's duties (with `workers`), this node's retention and the
/// fleet's duty view.
async fn start_duties(ctx: &EngineContext, started: &mut Started) {
    let (eligible, follower) = ctx.state.watch_admission();
    let workers = ctx.config.roles.contains(&crewlet_config::Role::Workers);
    let models = match workers {
        true => Some(crate::seats::models(ctx).await),
        false => None,
    };
    let learning = models
        .clone()
        .map(|models| crewlet_duties::learning::Inputs {
            client: ctx.client.clone(),
            store: ctx.store.clone(),
            publisher: ctx.publisher.clone(),
            active: ctx.active.clone(),
            config: ctx.config.duties.clone(),
            budgets: ctx.coord.budgets(),
            embedder: models.embedder(ctx.coord.budgets(), ctx.active.clone()),
            models,
        });
    let running = crewlet_duties::start(
        crewlet_duties::Parts {
            node_id: ctx.node_id.clone(),
            owner: ctx.coord.options().owner.clone(),
            leases: ctx.coord.leases("worker"),
            nodes: ctx.coord.roster("node"),
            fires: ctx.coord.fires(),
            upkeep: ctx.coord.upkeep(),
            mailboxes: ctx.coord.records(crewlet_coord::Bucket::Mailboxes),
            positions: crewlet_statelog::PositionBook::new(ctx.coord.clone()),
            js: async_nats::jetstream::new(ctx.client.clone()),
            store: ctx.store.clone(),
            publisher: ctx.publisher.clone(),
            active: ctx.active.clone(),
            config: ctx.config.duties.clone(),
            workers,
            eligible,
            learning,
        },
        &ctx.state.duties,
    );
    let running = match running {
        Ok(running) => running,
        Err(e) => {
            warn!(subsystem = "duties", error = %e, "the duties did not start");
            return;
        }
    };
    started.push("duties", move || {
        Box::pin(async move {
            running.stop().await;
            // The learning duty's own model layer, after its last call.
            if let Some(models) = models {
                models.shutdown().await;
            }
            follower.abort();
        })
    });
}

/// Binds the HTTP surface (before the engine starts, so probes answer
/// from the first instant) and pushes its stop; answers where it listens.
async fn serve_http(
    p: Parts<'_>,
    descriptors: u64,
    started: &mut Started,
) -> Result<Option<SocketAddr>, NodeError> {
    let api = &p.config.api;
    if api.port == 0 {
        info!(subsystem = "api", "api.port = 0: serving no HTTP");
        return Ok(None);
    }
    let addr = SocketAddr::new(api.host, api.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| NodeError::Bind { addr, source })?;
    let (stop_tx, stop_rx) = watch::channel(false);
    // Without `ingress` the node answers its probes and nothing else.
    let serve = if p.config.roles.contains(&crewlet_config::Role::Ingress) {
        crewlet_api::router
    } else {
        crewlet_api::probes_router
    };
    let operators = Arc::new(crate::surface::Operators(p.tokens.clone()));
    let router = serve(crewlet_api::Surface {
        probe: p.state.clone(),
        events: Arc::new(crate::surface::History {
            state: p.state.clone(),
            late: p.late.clone(),
        }),
        catalog: p.state.clone(),
        closing: stop_rx.clone(),
        routes: crate::surface::routes(p.late, &operators),
        every_node: crate::surface::metrics_routes(p.late.clone()),
        authority: Arc::new(crewlet_chat::Callers {
            operators,
            node: Arc::new(p.late.clone()),
        }),
        allowed_hosts: crewlet_api::AllowedHosts::new(api.host, &api.allowed_hosts),
    });
    let limits = crewlet_api::EdgeLimits {
        max_connections: crate::descriptors::connection_cap(api.max_connections, descriptors),
        header_timeout: api.header_timeout,
        body_timeout: api.body_timeout,
        refusals: crewlet_api::RefusalPace::default(),
    };
    let addr = listener.local_addr().unwrap_or(addr);
    let mut stop = stop_rx;
    let task = tokio::spawn(
        async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = crewlet_api::serve(listener, router, limits, shutdown).await {
                error!(subsystem = "api", error = %e, "HTTP surface failed");
            }
        }
        .in_current_span(),
    );
    info!(subsystem = "api", %addr, max_connections = limits.max_connections, "HTTP surface listening");
    started.push("api", move || Box::pin(stop_http(task, stop_tx)));
    Ok(Some(addr))
}

async fn open_coordination(
    config: &NodeConfig,
    client: async_nats::Client,
    owner: crewlet_coord::Owner,
) -> Result<crewlet_coord::Coord, NodeError> {
    let mut opts = crewlet_coord::CoordOptions::new(owner);
    opts.kind = match config.coordination.kind {
        crewlet_config::CoordinationType::Nats => crewlet_coord::CoordKind::Nats,
        crewlet_config::CoordinationType::Local => crewlet_coord::CoordKind::Local,
    };
    opts.replicas = config.stream.replicas;
    opts.lease_ttl = config.coordination.lease_ttl;
    opts.heartbeat = config.coordination.heartbeat;
    crewlet_coord::Coord::open(client, opts)
        .instrument(info_span!("coordination", subsystem = "coordination"))
        .await
        .map_err(NodeError::Coordination)
}

/// The token mirror, and on a fleet's first start its admin token.
async fn start_tokens(
    p: Parts<'_>,
    coord: &crewlet_coord::Coord,
    bound: Option<SocketAddr>,
    started: &mut Started,
) {
    let (stop_tx, stop) = watch::channel(false);
    p.tokens
        .start(coord.token_records(), stop, Duration::from_secs(5))
        .await;
    started.push("tokens", move || {
        Box::pin(async move {
            let _ = stop_tx.send(true);
        })
    });
    match p.tokens.bootstrap(&p.config.data_dir).await {
        Ok(Some((token, seeded))) => {
            let banner = !seeded && p.config.logging.format == LogFormat::Text;
            announce_login(bound, &token, &p.config.data_dir, banner)
        }
        Ok(None) => {}
        Err(e) => warn!(subsystem = "tokens", error = %e, "no first-start admin token made"),
    }
}

/// The company's secrets: the bucket mirrored by a watch (opened again with
/// a backoff when it cannot be opened now; names are unknown meanwhile),
/// stopped with the engine; what was set while this node was stopped joins
/// the fleet once the bucket answers.
async fn open_secrets(
    p: Parts<'_>,
    client: &async_nats::Client,
    coord: &crewlet_coord::Coord,
    keyring: crewlet_secrets::Keyring,
    started: &mut Started,
) -> Arc<crewlet_secrets::Secrets> {
    info!(subsystem = "secrets", keyring = %p.config.secrets.keyring.display(),
        keys = keyring.ids().len(), sealing = keyring.current(), "keyring open");
    let secrets =
        Arc::new(crewlet_secrets::Secrets::open(client.clone(), coord.options(), keyring).await);
    p.state.attach_secrets(secrets.clone());
    let adopting = if secrets.is_listed() {
        crewlet_secrets::admin::adopt_pending(&crate::secrets_cli::PendingRows(p.store), &secrets)
            .await;
        None
    } else {
        let (secrets, store) = (secrets.clone(), p.store.clone());
        Some(tokio::spawn(async move {
            if secrets.until_listed().await {
                crewlet_secrets::admin::adopt_pending(
                    &crate::secrets_cli::PendingRows(&store),
                    &secrets,
                )
                .await;
            }
        }))
    };
    let stopping = secrets.clone();
    started.push("secrets", move || {
        Box::pin(async move {
            if let Some(adopting) = adopting {
                adopting.abort();
            }
            stopping.stop().await
        })
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let making = tokio::spawn(
        crewlet_chat::ensure_secret(secrets.clone(), stop_rx)
            .instrument(info_span!("chat", subsystem = "chat")),
    );
    started.push("chat-secret", move || {
        Box::pin(async move {
            let _ = stop_tx.send(true);
            let _ = making.await;
        })
    });
    secrets
}

/// Prints, once, the dashboard login URL for a generated first-start admin
/// token: straight to stderr, never through the log events (a JSON log
/// stream gets only the token file's path), the token in the URL fragment
/// (a browser never sends it, so no server log ever holds it).
fn announce_login(
    bound: Option<SocketAddr>,
    token: &str,
    data_dir: &std::path::Path,
    banner: bool,
) {
    let file = data_dir.join(crewlet_tokens::TOKEN_FILE);
    info!(subsystem = "tokens", file = %file.display(), "first start: an admin operator token was made");
    if !banner {
        return;
    }
    let Some(addr) = bound else {
        eprintln!(
            "crewlet: first start: an admin token is in {}",
            file.display()
        );
        return;
    };
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_owned()
    } else {
        addr.ip().to_string()
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    eprintln!(
        "\ncrewlet: first start — log in to the dashboard (shown once):\n\n    http://{host}:{}/#token={token}\n\n  The same admin token is in {} (0600); the CLI reads it from there.\n",
        addr.port(),
        file.display()
    );
}

async fn stop_http(task: tokio::task::JoinHandle<()>, stop: watch::Sender<bool>) {
    let _ = stop.send(true);
    if tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .is_err()
    {
        warn!(subsystem = "api", "HTTP surface did not close within 10 s");
    } else {
        info!(subsystem = "api", "HTTP surface closed");
    }
}
