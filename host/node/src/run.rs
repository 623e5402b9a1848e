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

use std::path::PathBuf;
use std::sync::Arc;

use crewlet_config::{LogFormat, NodeConfig, Overrides};
use crewlet_stream::DirLock;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;
use tracing::{Instrument, error, info, info_span, warn};

use crate::company::CompanyFile;
use crate::engine::{Late, Started};
use crate::start::{NodeError, Parts, start};
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
    /// `--activate-company`: the file is activated whatever the fleet runs.
    pub activate_company: bool,
    /// `--plugins`, in order, after the config file's `[plugins] dirs`.
    pub plugins: Vec<PathBuf>,
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
        .map(|f| CompanyFile::load(f, &policy, args.activate_company))
        .transpose()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Err(e) = crewlet_tokens::seed() {
        eprintln!("crewlet: {e}");
        return EXIT_CONFIG;
    }
    let plugins: Vec<PathBuf> = config
        .plugin_dirs
        .iter()
        .chain(&args.plugins)
        .cloned()
        .collect();
    if let Some(dir) = plugins.iter().find(|d| !d.is_dir()) {
        eprintln!(
            "crewlet: plugins directory {}: not a directory; pass the folder that holds the plugins' plugin.toml files (--plugins or [plugins] dirs)",
            dir.display()
        );
        return EXIT_CONFIG;
    }
    // A wrong folder (entries, no manifest) or a broken link is the
    // operator's to fix before anything starts.
    let catalogue = match crewlet_catalog::catalogue(&plugins, &config) {
        Ok((catalogue, _invalid)) => catalogue,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return EXIT_CONFIG;
        }
    };
    // A `--company` naming what these plugins cannot run is refused here,
    // as `PUT /config` refuses it (no plugins: nothing to check against).
    if let Some(file) = &company {
        let against = (!plugins.is_empty()).then_some(&catalogue);
        if let Err(invalid) = crate::company::runnable(file.company.clone(), against) {
            eprintln!("crewlet: {}: {invalid}", file.path.display());
            return EXIT_CONFIG;
        }
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
    runtime.block_on(node_main(config, company, plugins, descriptors))
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
    plugins: Vec<PathBuf>,
    descriptors: u64,
) -> i32 {
    match start_and_serve(config, company, plugins, descriptors).await {
        Ok(()) => 0,
        Err(e) => {
            error!(subsystem = "node", "{e}");
            if e.is_configuration() {
                2
            } else {
                EXIT_FAILURE
            }
        }
    }
}

async fn start_and_serve(
    config: NodeConfig,
    company: Option<CompanyFile>,
    plugins: Vec<PathBuf>,
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
    plugins: Vec<PathBuf>,
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
    let tokens = Arc::new(crewlet_tokens::Tokens::default());
    let within = config.shutdown.drain_timeout;
    let mut started = Started::default();

    let parts = Parts {
        config: &config,
        state: &state,
        late: &late,
        tokens: &tokens,
        active: &active,
        company: &company,
        plugins: &plugins,
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
