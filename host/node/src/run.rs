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
        plugins,
        store.clone(),
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

    // The HTTP surface binds before the engine starts.
    let (http_stop_tx, http_stop_rx) = watch::channel(false);
    let mut bound = None;
    let http = if config.api.port == 0 {
        info!(subsystem = "api", "api.port = 0: serving no HTTP");
        None
    } else {
        let addr = SocketAddr::new(config.api.host, config.api.port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| NodeError::Bind { addr, source })?;
        let router = crewlet_api::router(crewlet_api::Surface {
            probe: state.clone(),
            events: state.clone(),
            catalog: state.clone(),
            closing: http_stop_rx.clone(),
            routes: crate::ingress::routes(late.clone())
                .merge(crate::configplane::routes(late.clone()))
                .merge(crate::secrets::routes(late.clone()))
                .merge(crate::budgets::routes(late.clone()))
                .merge(crate::tokens::routes(tokens.clone()))
                .merge(crate::operator::routes(late.clone())),
            authority: tokens.clone(),
            allowed_hosts: crewlet_api::AllowedHosts::new(
                config.api.host,
                &config.api.allowed_hosts,
            ),
        });
        let limits = crewlet_api::EdgeLimits {
            max_connections: crate::descriptors::connection_cap(
                config.api.max_connections,
                descriptors,
            ),
            header_timeout: config.api.header_timeout,
            body_timeout: config.api.body_timeout,
        };
        let addr = listener.local_addr().unwrap_or(addr);
        bound = Some(addr);
        let mut stop = http_stop_rx.clone();
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
        Some(task)
    };

    // The engine: the stream first, then (in later stages) everything that
    // rides it.
    let broker = match Broker::start(&config.stream, &node_id, shutdown_rx.clone())
        .instrument(info_span!("stream", subsystem = "stream"))
        .await
    {
        Ok(b) => Some(b),
        Err(StreamError::Interrupted) => None,
        Err(e) => {
            stop_http(http, http_stop_tx).await;
            return Err(e.into());
        }
    };
    if let Some(b) = &broker
        && let Err(e) =
            crewlet_stream::streams::ensure_streams(&b.jetstream(), config.stream.replicas)
                .instrument(info_span!("streams", subsystem = "stream"))
                .await
    {
        stop_http(http, http_stop_tx).await;
        if let Some(b) = broker {
            b.stop().await;
        }
        return Err(e.into());
    }
    let mut engine = Started::default();
    let mut publisher = None;
    let mut presence: Option<crate::presence::Presence> = None;
    if let Some(b) = &broker {
        // The observability edge: rows written inline by this node's
        // publisher, the live view fed from the fleet's broadcast.
        let (live_stop_tx, live_stop) = watch::channel(false);
        match crewlet_observe::LiveFeed::start(b.client(), live_stop).await {
            Ok(feed) => {
                state.attach_live(feed);
                engine.push("observe", move || {
                    Box::pin(async move {
                        let _ = live_stop_tx.send(true);
                    })
                });
            }
            Err(e) => {
                warn!(subsystem = "observe", error = %e, "live feed unavailable; /ws/stream will push nothing")
            }
        }
        publisher = Some(crewlet_observe::Publisher::new(
            &node_id,
            store.clone(),
            b.jetstream(),
        ));

        // Coordination rides the stream's connection: never a second dial.
        let owner = crewlet_coord::Owner::incarnation(&node_id);
        let mut opts = crewlet_coord::CoordOptions::new(owner.clone());
        opts.kind = match config.coordination.kind {
            crewlet_config::CoordinationType::Nats => crewlet_coord::CoordKind::Nats,
            crewlet_config::CoordinationType::Local => crewlet_coord::CoordKind::Local,
        };
        opts.replicas = config.stream.replicas;
        opts.lease_ttl = config.coordination.lease_ttl;
        opts.heartbeat = config.coordination.heartbeat;
        let opened = crewlet_coord::Coord::open(b.client(), opts)
            .instrument(info_span!("coordination", subsystem = "coordination"))
            .await
            .map_err(NodeError::Coordination);
        // Plugins: the catalogue, its module buckets, every plugin loaded.
        let plugins = match (&opened, &state.plugins_dir) {
            (Ok(_), Some(dir)) => Some(
                crate::plugins::load(dir, &config.data_dir, b.client())
                    .instrument(info_span!("plugins", subsystem = "plugins"))
                    .await
                    .map_err(NodeError::Plugins),
            ),
            _ => None,
        };
        let started = opened.and_then(|coord| plugins.transpose().map(|loaded| (coord, loaded)));
        let (coord, loaded) = match started {
            Ok(ok) => ok,
            Err(e) => {
                engine.stop_all(config.shutdown.drain_timeout).await;
                stop_http(http, http_stop_tx).await;
                if let Some(b) = broker {
                    b.stop().await;
                }
                return Err(e);
            }
        };
        info!(subsystem = "coordination", lease_ttl = ?coord.lease_ttl(), "coordination open");
        let (tokens_stop_tx, tokens_stop) = watch::channel(false);
        tokens
            .start(coord.clone(), tokens_stop, Duration::from_secs(5))
            .await;
        engine.push("tokens", move || {
            Box::pin(async move {
                let _ = tokens_stop_tx.send(true);
            })
        });
        match tokens.bootstrap(&config.data_dir).await {
            Ok(Some((token, seeded))) => {
                let banner = !seeded && config.logging.format == LogFormat::Text;
                announce_login(bound, &token, &config.data_dir, banner)
            }
            Ok(None) => {}
            Err(e) => warn!(subsystem = "tokens", error = %e, "no first-start admin token made"),
        }
        if let Some(loaded) = loaded {
            info!(
                subsystem = "plugins",
                loaded = loaded.webhooks.len() + loaded.providers.len() + loaded.modules.len(),
                failed = loaded.failed.len(),
                "plugins loaded"
            );
            state.attach_plugins(Arc::new(loaded));
        }
        let status_of = state.clone();
        let p =
            crate::presence::Presence::start(coord.clone(), node_id.clone(), owner, move || {
                status_of.node_status()
            });
        state.attach_presence(p.view_handle());
        presence = Some(p);

        // The company's secrets: the bucket mirrored by a watch, stopped
        // with the engine; what was set while this node was stopped joins
        // the fleet before anything reads it.
        info!(subsystem = "secrets", keyring = %config.secrets.keyring.display(),
            keys = keyring.ids().len(), sealing = keyring.current(), "keyring open");
        let secrets = match crate::secrets::Secrets::open(b.client(), &coord, keyring).await {
            Ok(s) => {
                crate::secrets::adopt_pending(&store, &s).await;
                Arc::new(s)
            }
            Err(e) => {
                warn!(subsystem = "secrets", error = %e, "secrets bucket not opened; secrets come from this node's environment");
                Arc::new(crate::secrets::Secrets::environment_only())
            }
        };
        let stopping = secrets.clone();
        engine.push("secrets", move || {
            Box::pin(async move { stopping.stop().await })
        });
        let ctx = EngineContext {
            node_id: node_id.clone(),
            config: Arc::new(config.clone()),
            client: b.client(),
            coord,
            store: store.clone(),
            publisher: publisher.clone().expect("publisher is set above"),
            state: state.clone(),
            active: active.clone(),
            secrets,
        };
        let hooked = async {
            crate::configplane::start(&ctx, &mut engine).await?;
            crate::ingress::start(&ctx, &mut engine).await?;
            crate::seats::start(&ctx, &mut engine).await
        }
        .await;
        if let Err(e) = hooked {
            engine.stop_all(config.shutdown.drain_timeout).await;
            stop_http(http, http_stop_tx).await;
            if let Some(b) = broker {
                b.stop().await;
            }
            return Err(NodeError::Engine(e));
        }
        late.set(ctx);
        state.attach_stream(b.monitor());
        state.advance(Phase::Running);
        info!(subsystem = "node", stream = %b.health().urls.join(","), "node running");
    }

    if let Some(p) = &publisher {
        announce(p, "node_started", &state).await;
    }

    // Serve until a signal.
    let mut wait = shutdown_rx.clone();
    let _ = wait.wait_for(|s| *s).await;
    info!(
        subsystem = "node",
        "draining: /ready is 503 and new work is refused"
    );
    // Leaving the fleet's membership is the first thing a drain does.
    if let Some(p) = presence.take() {
        p.stop().await;
    }
    let notice = config.shutdown.drain_notice;
    if !notice.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(notice) => {}
            _ = force_rx.wait_for(|f| *f) => info!(subsystem = "node", "second signal: skipping the drain notice"),
        }
    }
    state.advance(Phase::Stopping);
    engine.stop_all(config.shutdown.drain_timeout).await;
    stop_http(http, http_stop_tx).await;
    if let Some(b) = broker {
        b.stop().await;
    }
    info!(subsystem = "node", "node stopped");
    Ok(())
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

async fn stop_http(task: Option<tokio::task::JoinHandle<()>>, stop: watch::Sender<bool>) {
    let _ = stop.send(true);
    if let Some(task) = task {
        if tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .is_err()
        {
            warn!(subsystem = "api", "HTTP surface did not close within 10 s");
        } else {
            info!(subsystem = "api", "HTTP surface closed");
        }
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
