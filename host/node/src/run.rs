//! `crewlet run`: the node's lifecycle.
//!
//! Start: validate everything that can be validated without side effects
//! (config, company file, plugins dir) and exit 2 on any error before the
//! disk is touched; then lock the data dir, bind the HTTP surface, start the
//! stream (the embedded nats-server or a connection to an external one),
//! then every engine subsystem in order.
//!
//! Stop, on SIGINT or SIGTERM: `/ready` answers 503 and new work is refused
//! from the first instant; after the configured drain notice, engine
//! subsystems stop in the reverse order of their start, then the HTTP
//! listener closes, and the stream — with the nats-server child — stops
//! last, since everything before it may still be flushing to it. A second
//! signal skips the notice. Exit status 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crewlet_config::{LogFormat, NodeConfig, Overrides};
use crewlet_stream::{Broker, DirLock, StreamError};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{Instrument, error, info, info_span, warn};

use crate::company::CompanyFile;
use crate::engine::{EngineContext, Late, Started};
use crate::state::{NodeState, Phase};

/// Exit status for a configuration the node refused.
pub const EXIT_CONFIG: i32 = 2;
/// Exit status for a node that could not start or failed while running.
pub const EXIT_FAILURE: i32 = 1;

/// The flags of `crewlet run`.
#[derive(Debug, Clone, Default)]
pub struct RunArgs {
    pub config: Option<PathBuf>,
    pub company: Option<PathBuf>,
    pub plugins: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub log_format: Option<LogFormat>,
}

/// Runs a node to completion and answers the process exit status.
pub fn run(args: RunArgs) -> i32 {
    let overrides = Overrides {
        data_dir: args.data_dir.clone(),
        log_format: args.log_format,
    };
    let env = |name: &str| std::env::var(name).ok();
    let config = match NodeConfig::load(args.config.as_deref(), &overrides, &env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return EXIT_CONFIG;
        }
    };
    let policy = crate::company::policy(&config);
    let company = match args
        .company
        .as_deref()
        .map(|f| CompanyFile::load(f, &policy))
        .transpose()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Err(e) = crate::tokens::seed() {
        eprintln!("crewlet: {e}");
        return EXIT_CONFIG;
    }
    if let Some(dir) = &args.plugins
        && !dir.is_dir()
    {
        eprintln!(
            "crewlet: --plugins {}: not a directory; pass the folder that holds the plugins' plugin.toml files",
            dir.display()
        );
        return EXIT_CONFIG;
    }
    // The keyring and the broker's seed are the node's keys: one that others
    // may read is refused before anything starts.
    if let Err(e) = check_key_files(&config) {
        eprintln!("crewlet: {e}");
        return EXIT_CONFIG;
    }
    if let Err(e) = crate::logging::init(&config.logging) {
        eprintln!("crewlet: {e}");
        return EXIT_CONFIG;
    }
    let descriptors = crate::descriptors::reserve();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("crewlet")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crewlet: cannot start the async runtime: {e}");
            return EXIT_FAILURE;
        }
    };
    runtime.block_on(node_main(config, company, args.plugins, descriptors))
}

/// Refuses a keyring (or embedded broker seed) that exists and is unsafe:
/// loose permissions, unreadable, not a keyring. A missing one is made at
/// start, in the data dir, mode 0600.
fn check_key_files(config: &NodeConfig) -> Result<(), String> {
    match crewlet_secrets::Keyring::open(&config.secrets.keyring) {
        Ok(_) | Err(crewlet_secrets::KeyringError::Missing { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    if let crewlet_config::StreamMode::Embedded(spec) = &config.stream.mode
        && spec.credential.exists()
    {
        crewlet_stream::BrokerCredential::load_or_create(&spec.credential)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn node_main(
    config: NodeConfig,
    company: Option<CompanyFile>,
    plugins: Option<PathBuf>,
    descriptors: u64,
) -> i32 {
    match start_and_serve(config, company, plugins, descriptors).await {
        Ok(()) => 0,
        Err(e) => {
            error!(subsystem = "node", "{e}");
            EXIT_FAILURE
        }
    }
}

/// A failure that stops the node, with what to do about it.
#[derive(Debug, thiserror::Error)]
enum NodeError {
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
    Plugins(crate::plugins::StartError),
    #[error(transparent)]
    Keyring(#[from] crewlet_secrets::KeyringError),
}

async fn start_and_serve(
    config: NodeConfig,
    company: Option<CompanyFile>,
    plugins: Option<PathBuf>,
    descriptors: u64,
) -> Result<(), NodeError> {
    let data_dir = config.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|source| NodeError::DataDir {
        dir: data_dir.display().to_string(),
        source,
    })?;
    let owner = format!("crewlet node starting from {}", data_dir.display());
    let _data_lock = DirLock::acquire(&data_dir, ".crewlet-node.lock", "data dir", &owner)?;
    let node_id = match &config.node_id {
        Some(id) => id.clone(),
        None => crate::identity::stable_node_id(&data_dir).map_err(NodeError::Identity)?,
    };
    // The node store opens (and migrates) before anything is served: a store
    // this build cannot use stops the node here.
    let store = crewlet_store::Store::open_in(&data_dir)?;
    let keyring = crewlet_secrets::Keyring::open_or_create(&config.secrets.keyring)?;
    let span = info_span!("node", node_id = %node_id);
    lifecycle(
        config,
        company,
        plugins,
        node_id,
        Arc::new(store),
        descriptors,
        keyring,
    )
    .instrument(span)
    .await
}

async fn lifecycle(
    config: NodeConfig,
    company: Option<CompanyFile>,
    plugins: Option<PathBuf>,
    node_id: String,
    store: Arc<crewlet_store::Store>,
    descriptors: u64,
    keyring: crewlet_secrets::Keyring,
) -> Result<(), NodeError> {
    // The company this node serves. The config plane moves it; until a
    // revision is activated through the pointer, the `--company` document.
    let active = crewlet_company::ActiveCompany::new(
        company
            .as_ref()
            .map(|c| crewlet_company::Active::local(c.company.clone())),
    );
    let state = Arc::new(NodeState::new(
        node_id.clone(),
        &config,
        company.clone(),
        plugins.clone(),
        store.clone(),
        active.clone(),
    ));
    info!(
        subsystem = "node",
        version = crate::VERSION,
        roles = %config.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(","),
        data_dir = %config.data_dir.display(),
        config = ?config.source,
        "node starting"
    );
    if let Some(c) = &company {
        info!(subsystem = "node", org = %c.company.org, seats = c.company.seats.len(),
            file = %c.path.display(), "company document loaded");
    }

    // Signals first, so a signal during start-up is a clean stop.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (force_tx, mut force_rx) = watch::channel(false);
    spawn_signal_listener(state.clone(), shutdown_tx, force_tx)?;

    // Routes that need the engine reach it through `late`, filled once the
    // engine is up; until then they answer 503 with Retry-After.
    let late: Late = Late::default();
    // The guard reads the token mirror from the first request; it answers
    // unknown (503) until coordination has listed the fleet's tokens.
    let tokens = Arc::new(crate::tokens::Tokens::default());
    let within = config.shutdown.drain_timeout;
    let mut started = Started::default();

    let parts = Parts {
        config: &config,
        state: &state,
        late: &late,
        tokens: &tokens,
        active: &active,
        company: &company,
        plugins: plugins.as_deref(),
        store: &store,
        node_id: &node_id,
    };
    let publisher = match start(
        parts,
        descriptors,
        keyring,
        shutdown_rx.clone(),
        &mut started,
    )
    .await
    {
        Ok(publisher) => publisher,
        Err(e) => {
            started.stop_all(within).await;
            return Err(e);
        }
    };
    if let Some(p) = &publisher {
        announce(p, "node_started", &state).await;
    }

    // Serve until a signal.
    let mut wait = shutdown_rx;
    let _ = wait.wait_for(|s| *s).await;
    info!(
        subsystem = "node",
        "draining: /ready is 503 and new work is refused"
    );
    // Leaving the fleet's membership is the first thing a drain does.
    started.stop_now("presence", within).await;
    let notice = config.shutdown.drain_notice;
    if !notice.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(notice) => {}
            _ = force_rx.wait_for(|f| *f) => info!(subsystem = "node", "second signal: skipping the drain notice"),
        }
    }
    state.advance(Phase::Stopping);
    started.stop_all(within).await;
    info!(subsystem = "node", "node stopped");
    Ok(())
}

/// What the start borrows from the lifecycle.
#[derive(Clone, Copy)]
struct Parts<'a> {
    config: &'a NodeConfig,
    state: &'a Arc<NodeState>,
    late: &'a Late,
    tokens: &'a Arc<crate::tokens::Tokens>,
    active: &'a crewlet_company::ActiveCompany,
    company: &'a Option<CompanyFile>,
    plugins: Option<&'a std::path::Path>,
    store: &'a Arc<crewlet_store::Store>,
    node_id: &'a str,
}

/// Starts every part in order, each pushed on `started` as it comes up:
/// the HTTP surface, the stream, then the engine. Answers the publisher
/// (none when a signal interrupted the stream's start). On an error the
/// caller unwinds `started`.
async fn start(
    p: Parts<'_>,
    descriptors: u64,
    keyring: crewlet_secrets::Keyring,
    shutdown: watch::Receiver<bool>,
    started: &mut Started,
) -> Result<Option<crewlet_observe::Publisher>, NodeError> {
    let bound = serve_http(p, descriptors, started).await?;
    let broker = match Broker::start(&p.config.stream, p.node_id, shutdown)
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
    crewlet_stream::streams::ensure_streams(&jetstream, p.config.stream.replicas)
        .instrument(info_span!("streams", subsystem = "stream"))
        .await?;

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
    let publisher = crewlet_observe::Publisher::new(p.node_id, p.store.clone(), jetstream);

    // Coordination rides the stream's connection: never a second dial.
    let owner = crewlet_coord::Owner::incarnation(p.node_id);
    let coord = open_coordination(p.config, client.clone(), owner.clone()).await?;
    info!(subsystem = "coordination", lease_ttl = ?coord.lease_ttl(), "coordination open");
    // Plugins: the catalogue, its module buckets, every plugin loaded.
    let loaded = match p.plugins {
        Some(dir) => Some(Arc::new(
            crate::plugins::load(dir, &p.config.data_dir, client.clone())
                .instrument(info_span!("plugins", subsystem = "plugins"))
                .await
                .map_err(NodeError::Plugins)?,
        )),
        None => None,
    };
    start_tokens(p, &coord, bound, started).await;
    if let Some(loaded) = &loaded {
        info!(
            subsystem = "plugins",
            loaded = loaded.webhooks.len() + loaded.providers.len() + loaded.modules.len(),
            failed = loaded.failed.len(),
            "plugins loaded"
        );
        p.state.attach_plugins(loaded.clone());
    }
    let status_of = p.state.clone();
    let presence =
        crate::presence::Presence::start(coord.clone(), p.node_id.to_owned(), owner, move || {
            status_of.node_status()
        });
    p.state.attach_presence(presence.view_handle());
    started.push("presence", move || Box::pin(presence.stop()));
    let secrets = open_secrets(p, &client, &coord, keyring, started).await;

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
    };
    crate::configplane::start(&ctx, started)
        .await
        .map_err(NodeError::Engine)?;
    let edge = crate::ingress::start(&ctx, started)
        .await
        .map_err(NodeError::Engine)?;
    crate::seats::start(&ctx, started)
        .await
        .map_err(NodeError::Engine)?;
    p.late.set(ctx, edge);
    p.state.attach_stream(monitor);
    p.state.advance(Phase::Running);
    info!(subsystem = "node", stream = %urls, "node running");
    Ok(Some(publisher))
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
    let router = crewlet_api::router(crewlet_api::Surface {
        probe: p.state.clone(),
        events: p.state.clone(),
        catalog: p.state.clone(),
        closing: stop_rx.clone(),
        routes: crate::ingress::routes(p.late.clone())
            .merge(crate::configplane::routes(p.late.clone()))
            .merge(crate::secrets::routes(p.late.clone()))
            .merge(crate::budgets::routes(p.late.clone()))
            .merge(crate::tokens::routes(p.tokens.clone()))
            .merge(crate::operator::routes(p.late.clone())),
        authority: p.tokens.clone(),
        allowed_hosts: crewlet_api::AllowedHosts::new(api.host, &api.allowed_hosts),
    });
    let limits = crewlet_api::EdgeLimits {
        max_connections: crate::descriptors::connection_cap(api.max_connections, descriptors),
        header_timeout: api.header_timeout,
        body_timeout: api.body_timeout,
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
        .start(coord.clone(), stop, Duration::from_secs(5))
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

/// The company's secrets: the bucket mirrored by a watch, stopped with the
/// engine; what was set while this node was stopped joins the fleet before
/// anything reads it.
async fn open_secrets(
    p: Parts<'_>,
    client: &async_nats::Client,
    coord: &crewlet_coord::Coord,
    keyring: crewlet_secrets::Keyring,
    started: &mut Started,
) -> Arc<crewlet_secrets::Secrets> {
    info!(subsystem = "secrets", keyring = %p.config.secrets.keyring.display(),
        keys = keyring.ids().len(), sealing = keyring.current(), "keyring open");
    let secrets = match crewlet_secrets::Secrets::open(client.clone(), coord, keyring).await {
        Ok(s) => {
            crate::secrets::adopt_pending(p.store, &s).await;
            Arc::new(s)
        }
        Err(e) => {
            warn!(subsystem = "secrets", error = %e, "secrets bucket not opened; secrets come from this node's environment");
            Arc::new(crewlet_secrets::Secrets::environment_only())
        }
    };
    let stopping = secrets.clone();
    started.push("secrets", move || {
        Box::pin(async move { stopping.stop().await })
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
    let file = data_dir.join(crate::tokens::TOKEN_FILE);
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

/// Publishes a node lifecycle event; a failure is logged, never fatal.
async fn announce(publisher: &crewlet_observe::Publisher, kind: &str, state: &NodeState) {
    use crewlet_api::Probe;
    let mut event = publisher.event(
        kind,
        serde_json::json!({ "version": crate::VERSION, "roles": state.health()["roles"] }),
    );
    event.parties = vec![crewlet_store::Party {
        party: format!("node:{}", state.node_id),
        role: "node".into(),
    }];
    if let Err(e) = publisher.publish(event).await {
        warn!(subsystem = "observe", error = %e, event = kind, "could not publish a node event");
    }
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

/// First SIGINT/SIGTERM: drain. Second: skip the drain notice.
fn spawn_signal_listener(
    state: Arc<NodeState>,
    shutdown: watch::Sender<bool>,
    force: watch::Sender<bool>,
) -> Result<(), NodeError> {
    let mut term = signal(SignalKind::terminate()).map_err(NodeError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(NodeError::Signals)?;
    tokio::spawn(
        async move {
            let mut seen = 0u32;
            loop {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                seen += 1;
                if seen == 1 {
                    // Readiness flips before anything else happens.
                    state.advance(Phase::Draining);
                    info!(subsystem = "node", signal = name, "shutdown requested");
                    let _ = shutdown.send(true);
                } else {
                    info!(
                        subsystem = "node",
                        signal = name,
                        "second signal: stopping without waiting"
                    );
                    let _ = force.send(true);
                }
            }
        }
        .in_current_span(),
    );
    Ok(())
}
