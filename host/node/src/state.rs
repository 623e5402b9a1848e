//! What a node knows about itself, shared by the lifecycle and the probes.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use crewlet_api::{EventFilter, EventSource, NotReady, Probe};
use crewlet_config::Role;
use crewlet_observe::LiveFeed;
use crewlet_stream::BrokerMonitor;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Where a node is in its life. Moves forward only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Phase {
    /// The HTTP surface is up; the engine is starting.
    Starting = 0,
    /// Connected and serving.
    Running = 1,
    /// A signal arrived: no new work, finishing what is in flight.
    Draining = 2,
    /// Subsystems are being stopped.
    Stopping = 3,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Starting,
            1 => Phase::Running,
            2 => Phase::Draining,
            _ => Phase::Stopping,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Draining => "draining",
            Phase::Stopping => "stopping",
        }
    }
}

pub struct NodeState {
    pub node_id: String,
    pub roles: Vec<Role>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub max_concurrent: usize,
    pub data_dir: PathBuf,
    pub company: Option<crate::company::CompanyFile>,
    pub plugins_dir: Option<PathBuf>,
    pub store: std::sync::Arc<crewlet_store::Store>,
    started_at: OffsetDateTime,
    started: Instant,
    phase: AtomicU8,
    stream: OnceLock<BrokerMonitor>,
    live: OnceLock<LiveFeed>,
    presence: OnceLock<std::sync::Arc<std::sync::Mutex<crate::presence::PresenceView>>>,
    plugins: OnceLock<std::sync::Arc<crate::plugins::Loaded>>,
    /// The company revision applied through the config pointer, and its epoch.
    applied: std::sync::Mutex<Option<(u64, std::sync::Arc<crewlet_company::Company>)>>,
}

impl NodeState {
    pub fn new(
        node_id: String,
        config: &crewlet_config::NodeConfig,
        company: Option<crate::company::CompanyFile>,
        plugins_dir: Option<PathBuf>,
        store: std::sync::Arc<crewlet_store::Store>,
    ) -> NodeState {
        NodeState {
            node_id,
            roles: config.roles.clone(),
            labels: config.labels.clone(),
            max_concurrent: config.max_concurrent,
            data_dir: config.data_dir.clone(),
            company,
            plugins_dir,
            store,
            started_at: OffsetDateTime::now_utc(),
            started: Instant::now(),
            phase: AtomicU8::new(Phase::Starting as u8),
            stream: OnceLock::new(),
            live: OnceLock::new(),
            presence: OnceLock::new(),
            plugins: OnceLock::new(),
            applied: std::sync::Mutex::new(None),
        }
    }

    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::SeqCst))
    }

    /// Moves to `next` unless the node is already past it.
    pub fn advance(&self, next: Phase) {
        self.phase.fetch_max(next as u8, Ordering::SeqCst);
    }

    pub fn attach_stream(&self, monitor: BrokerMonitor) {
        let _ = self.stream.set(monitor);
    }

    pub fn attach_live(&self, feed: LiveFeed) {
        let _ = self.live.set(feed);
    }

    pub fn attach_presence(
        &self,
        view: std::sync::Arc<std::sync::Mutex<crate::presence::PresenceView>>,
    ) {
        let _ = self.presence.set(view);
    }

    pub fn attach_plugins(&self, loaded: std::sync::Arc<crate::plugins::Loaded>) {
        let _ = self.plugins.set(loaded);
    }

    /// The plugins this node loaded, once they are.
    pub fn loaded_plugins(&self) -> Option<std::sync::Arc<crate::plugins::Loaded>> {
        self.plugins.get().cloned()
    }

    /// Records the revision the config reconciler applied.
    pub fn set_applied(&self, epoch: u64, company: std::sync::Arc<crewlet_company::Company>) {
        *self.applied.lock().unwrap_or_else(|p| p.into_inner()) = Some((epoch, company));
    }

    /// The epoch of the revision applied through the pointer, if any.
    pub fn applied_epoch(&self) -> Option<u64> {
        self.applied_company().map(|(epoch, _)| epoch)
    }

    fn applied_company(&self) -> Option<(u64, std::sync::Arc<crewlet_company::Company>)> {
        self.applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What this node says about itself on its presence lease.
    pub fn node_status(&self) -> crewlet_coord::NodeStatus {
        let phase = self.phase();
        crewlet_coord::NodeStatus {
            roles: self.roles.iter().map(|r| r.as_str().to_owned()).collect(),
            labels: self.labels.clone(),
            turns_in_flight: 0,
            draining: phase >= Phase::Draining,
            posture: self.posture().to_owned(),
            started_at_ms: (self.started_at.unix_timestamp_nanos() / 1_000_000) as i64,
        }
    }

    fn posture(&self) -> &'static str {
        match self.phase() {
            Phase::Starting => "wait",
            _ => "serve",
        }
    }
}

impl Probe for NodeState {
    fn health(&self) -> serde_json::Value {
        let phase = self.phase();
        let stream = self.stream.get().map(BrokerMonitor::health);
        json!({
            "status": "ok",
            "node_id": self.node_id,
            "version": crate::VERSION,
            "phase": phase.as_str(),
            "draining": phase >= Phase::Draining,
            "ready": self.ready().is_ok(),
            // The config plane (a later stage) moves this between serve, wait,
            // shed, isolated and stuck; until a company is activated through
            // it, a running node serves.
            "posture": self.posture(),
            "applied_epoch": self.applied_epoch(),
            "roles": self.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            "labels": self.labels,
            "started_at": self.started_at.format(&Rfc3339).unwrap_or_default(),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "turns_in_flight": 0,
            "max_concurrent": self.max_concurrent,
            "seats_held": 0,
            "stream": stream,
            "presence": self.presence.get().map(|v| v.lock().expect("presence view").clone()),
            "plugins": self.plugins.get().map(|p| json!({
                "loaded": p.webhooks.len() + p.providers.len() + p.modules.len(),
                "failed": p.failed.len(),
            })),
            "store": {
                "path": self.store.path().display().to_string(),
                "schema_version": self.store.schema_version(),
            },
            "company": self.company.as_ref().map(|c| json!({
                "file": c.path.display().to_string(),
                "org": c.company.org,
                "seats": c.company.seats.len(),
                "digest": c.company.digest,
            })),
            "plugins_dir": self.plugins_dir.as_ref().map(|p| p.display().to_string()),
        })
    }

    fn ready(&self) -> Result<(), NotReady> {
        match self.phase() {
            Phase::Starting => Err(NotReady::Starting),
            Phase::Draining | Phase::Stopping => Err(NotReady::Draining),
            Phase::Running => match self.stream.get() {
                Some(s) if s.is_connected() => Ok(()),
                Some(_) => Err(NotReady::StreamDisconnected),
                None => Err(NotReady::Starting),
            },
        }
    }

    fn draining(&self) -> bool {
        self.phase() >= Phase::Draining
    }
}

impl crewlet_api::Catalog for NodeState {
    fn org(&self) -> Option<serde_json::Value> {
        // The revision applied through the config pointer wins over the
        // `--company` document the node was started with.
        if let Some((_, company)) = self.applied_company() {
            return Some(crate::company::org_view(&company));
        }
        self.company
            .as_ref()
            .map(|file| crate::company::org_view(&file.company))
    }

    fn plugins(&self) -> Option<serde_json::Value> {
        self.plugins.get().map(|p| p.view())
    }
}

impl EventSource for NodeState {
    fn live(&self) -> Option<tokio::sync::broadcast::Receiver<std::sync::Arc<str>>> {
        self.live.get().map(LiveFeed::subscribe)
    }

    fn query(&self, filter: EventFilter) -> crewlet_api::stream::QueryFuture {
        let store = self.store.clone();
        Box::pin(async move {
            let query = crewlet_store::EventQuery {
                seat: filter.seat,
                kind: filter.kind,
                party: filter.party,
                trace_id: filter.trace_id,
                before_seq: filter.before_seq,
                limit: filter.limit.unwrap_or(0),
            };
            let rows = tokio::task::spawn_blocking(move || store.events(&query))
                .await
                .map_err(|e| format!("event log reader failed: {e}"))?
                .map_err(|e| e.to_string())?;
            serde_json::to_value(rows).map_err(|e| e.to_string())
        })
    }
}
