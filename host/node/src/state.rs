//! What a node knows about itself, shared by the lifecycle and the probes.
//!
//! `/ready` steers traffic; `/health` stays 200 in every state below and
//! shows the phase, the posture and the stream. The rule (design §6):
//! readiness fails only where this node should not get work *and* a peer
//! may — never on what the whole fleet shares at once, since every node
//! failing together turns a blip into an outage. First match wins:
//!
//! | state | `/ready` | why |
//! |---|---|---|
//! | starting (engine or stream not up) | 503 `starting` | it holds no seats yet and its webhook routes answer 503 until the engine is up |
//! | draining (a signal; also while stopping) | 503 `draining` | the door to new work is closed from the drain's first moment; peers take it |
//! | shed | 503 `shed` | peers serve the epoch it cannot apply; its work is theirs |
//! | stuck | 503 `stuck` | it has failed to apply the active revision past the bound |
//! | disconnected, for less than the heartbeat | 200 `disconnected` | a broker blip is usually the fleet's: failing it would take every node out at once; webhooks meanwhile get 503 + Retry-After from the edge, so nothing is lost |
//! | disconnected, for the heartbeat or longer | 503 `stream_disconnected` | the bound at which its seats stop admitting work: a node alone in the outage hands new work to its peers; when all are out, no rotation is lost |
//! | isolated | 200 `isolated` | the pointer cannot be read; it serves what it applied (stepping out would be stopping) |
//! | wait | 200 `wait` | rollout lag; failing it makes the fastest node the cause of an outage |
//! | serving | 200 `serving` | |

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use crewlet_api::{NotReady, Probe, Ready};
use crewlet_config::Role;
use crewlet_observe::LiveFeed;
use crewlet_stream::BrokerMonitor;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crewlet_configplane::{Posture, PostureReport};

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

/// What the seats subsystem shows of itself on `/health` and the presence
/// lease (implemented by `crate::seats`, attached once it runs).
pub trait SeatsView: Send + Sync {
    fn held(&self) -> usize;
    fn in_flight(&self) -> usize;
    fn mcp(&self) -> Vec<crewlet_mcp::McpStatusRow>;
    /// Seats held whose memory could not be read yet, with why.
    fn memory_unread(&self) -> std::collections::BTreeMap<String, String>;
}

/// What the probes, `/health`, `/org` and the presence lease read of the
/// node. Subsystems get their parts from [`crate::engine::EngineContext`];
/// this is the node's view of itself, written by the lifecycle.
pub struct NodeState {
    pub node_id: String,
    pub roles: Vec<Role>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub max_concurrent: usize,
    /// How long the stream may be down before `/ready` fails: the
    /// heartbeat, after which a seat stops admitting work too.
    pub steps_out_after: std::time::Duration,
    pub data_dir: PathBuf,
    pub company: Option<crate::company::CompanyFile>,
    /// Where the plugins were read from, in order (none: no plugins).
    pub plugins_dirs: Vec<PathBuf>,
    pub store: std::sync::Arc<crewlet_store::Store>,
    /// Who holds the duties, here and in the fleet.
    pub duties: crewlet_duties::DutiesView,
    /// The replicated estate, on a node with `data`.
    pub estate: crewlet_estate::EstateSlot,
    started_at: OffsetDateTime,
    started: Instant,
    phase: AtomicU8,
    stream: OnceLock<BrokerMonitor>,
    /// The embedded server, known before the stream answers.
    broker_server: OnceLock<crewlet_stream::ServerWatch>,
    live: OnceLock<LiveFeed>,
    presence: OnceLock<std::sync::Arc<std::sync::Mutex<crewlet_fleet::presence::PresenceView>>>,
    plugins: OnceLock<std::sync::Arc<crewlet_catalog::Loaded>>,
    seats: OnceLock<std::sync::Arc<dyn SeatsView>>,
    pauses: OnceLock<tokio::sync::watch::Receiver<Option<crewlet_seats::Pauses>>>,
    /// Where events are kept, and the fleet's live data nodes (`/health`
    /// `custody`).
    custody: OnceLock<crewlet_history::custody_view::CustodyView>,
    /// Whether this node knows the fleet's secrets (`/health` `secrets`).
    secrets: OnceLock<std::sync::Arc<crewlet_secrets::Secrets>>,
    /// The company served now; its epoch is the applied one.
    active: crewlet_company::ActiveCompany,
    /// Set by the config reconciler; `wait` until its first poll.
    posture: tokio::sync::watch::Sender<PostureReport>,
}

impl NodeState {
    pub fn new(
        node_id: String,
        config: &crewlet_config::NodeConfig,
        company: Option<crate::company::CompanyFile>,
        plugins_dirs: Vec<PathBuf>,
        store: std::sync::Arc<crewlet_store::Store>,
        active: crewlet_company::ActiveCompany,
    ) -> NodeState {
        NodeState {
            node_id,
            roles: config.roles.clone(),
            labels: config.labels.clone(),
            max_concurrent: config.max_concurrent,
            steps_out_after: config.coordination.heartbeat,
            data_dir: config.data_dir.clone(),
            company,
            plugins_dirs,
            store,
            duties: crewlet_duties::DutiesView {
                workers: config.roles.contains(&Role::Workers),
                ..crewlet_duties::DutiesView::default()
            },
            estate: crewlet_estate::EstateSlot::default(),
            started_at: OffsetDateTime::now_utc(),
            started: Instant::now(),
            phase: AtomicU8::new(Phase::Starting as u8),
            stream: OnceLock::new(),
            broker_server: OnceLock::new(),
            live: OnceLock::new(),
            presence: OnceLock::new(),
            plugins: OnceLock::new(),
            seats: OnceLock::new(),
            pauses: OnceLock::new(),
            secrets: OnceLock::new(),
            custody: OnceLock::new(),
            active,
            posture: tokio::sync::watch::Sender::new(PostureReport {
                posture: Posture::Wait,
                reason: "the config reconciler has not polled yet".into(),
                pointer_epoch: None,
            }),
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

    /// The embedded server's status while the node waits for its stream
    /// (a cluster forming): `/health` shows it until the stream attaches.
    pub fn attach_broker_server(&self, server: crewlet_stream::ServerWatch) {
        let _ = self.broker_server.set(server);
    }

    pub fn attach_live(&self, feed: LiveFeed) {
        let _ = self.live.set(feed);
    }

    /// A reader of the fleet's live broadcast; `None` until the stream is up.
    pub fn live_feed(&self) -> Option<tokio::sync::broadcast::Receiver<std::sync::Arc<str>>> {
        self.live.get().map(LiveFeed::subscribe)
    }

    /// When this process started, in Unix milliseconds.
    pub fn started_at_ms(&self) -> i64 {
        (self.started_at.unix_timestamp_nanos() / 1_000_000) as i64
    }

    pub fn attach_presence(
        &self,
        view: std::sync::Arc<std::sync::Mutex<crewlet_fleet::presence::PresenceView>>,
    ) {
        let _ = self.presence.set(view);
    }

    pub fn attach_pauses(
        &self,
        pauses: tokio::sync::watch::Receiver<Option<crewlet_seats::Pauses>>,
    ) {
        let _ = self.pauses.set(pauses);
    }

    /// The paused seats this node follows: a list, or "unknown" before the
    /// first listing.
    fn pauses_view(&self) -> Option<serde_json::Value> {
        let pauses = self.pauses.get()?.borrow().clone();
        Some(match pauses {
            Some(p) => json!(p.iter().collect::<Vec<_>>()),
            None => json!("unknown"),
        })
    }

    pub fn attach_secrets(&self, secrets: std::sync::Arc<crewlet_secrets::Secrets>) {
        let _ = self.secrets.set(secrets);
    }

    pub fn attach_custody(&self, custody: crewlet_history::custody_view::CustodyView) {
        let _ = self.custody.set(custody);
    }

    pub fn attach_seats(&self, seats: std::sync::Arc<dyn SeatsView>) {
        let _ = self.seats.set(seats);
    }

    pub(crate) fn seats_held(&self) -> u32 {
        self.seats.get().map_or(0, |s| s.held() as u32)
    }

    pub(crate) fn turns_in_flight(&self) -> u32 {
        self.seats.get().map_or(0, |s| s.in_flight() as u32)
    }

    /// One row per MCP server this node runs children of.
    pub fn mcp_rows(&self) -> Vec<crewlet_coord::ServerRow> {
        self.seats
            .get()
            .map(|s| s.mcp())
            .unwrap_or_default()
            .into_iter()
            .map(|r| crewlet_coord::ServerRow {
                server: r.server,
                shared: r.shared,
                started: r.started,
                failed: r.failed,
                tools: r.tools,
                last_failure: r.last_failure,
            })
            .collect()
    }

    pub fn attach_plugins(&self, loaded: std::sync::Arc<crewlet_catalog::Loaded>) {
        let _ = self.plugins.set(loaded);
    }

    /// The epoch of the revision applied through the pointer, if any.
    pub fn applied_epoch(&self) -> Option<crewlet_os::ConfigEpoch> {
        self.active.applied_epoch()
    }

    /// What `/health` shows of the company: the revision this node serves
    /// (applied through the pointer, else the `--company` document), and
    /// the `--company` file beside it, so a file that is not what runs
    /// cannot pass for it.
    fn company_view(&self) -> Option<serde_json::Value> {
        let file = self.company.as_ref();
        let (epoch, serving) = match self.applied_company() {
            Some((epoch, c)) => (Some(epoch), c),
            None => (None, std::sync::Arc::new(file?.company.clone())),
        };
        Some(json!({
            "org": serving.org,
            "seats": serving.seats.len(),
            "digest": serving.digest,
            "epoch": epoch,
            "file": file.map(|f| f.path.display().to_string()),
            "file_digest": file.map(|f| f.company.digest.clone()),
            "file_active": file.map(|f| f.company.digest == serving.digest),
            // The way to make a file that is not what runs the fleet's.
            "activate_file": file
                .filter(|f| f.company.digest != serving.digest)
                .map(|f| format!("crewlet config import {}", f.path.display())),
        }))
    }

    fn applied_company(
        &self,
    ) -> Option<(
        crewlet_os::ConfigEpoch,
        std::sync::Arc<crewlet_company::Company>,
    )> {
        let active = self.active.current()?;
        Some((active.applied_epoch()?, active.company))
    }

    /// What this node says about itself on its presence lease.
    pub fn node_status(&self) -> crewlet_coord::NodeStatus {
        let phase = self.phase();
        crewlet_coord::NodeStatus {
            roles: self.roles.iter().map(|r| r.as_str().to_owned()).collect(),
            labels: self.labels.clone(),
            turns_in_flight: Some(self.turns_in_flight()),
            draining: Some(phase >= Phase::Draining),
            posture: Some(self.posture().as_str().to_owned()),
            started_at_ms: Some(self.started_at_ms()),
            seats_held: Some(self.seats_held()),
            mcp: Some(self.mcp_rows()),
            duties: Some(self.duties.held.rows()),
            memory_unread: Some(
                self.seats
                    .get()
                    .map(|s| s.memory_unread())
                    .unwrap_or_default(),
            ),
            broker: self.stream.get().filter(|m| m.is_connected()).map(|m| {
                let info = m.server_info();
                crewlet_coord::BrokerRow {
                    server_name: info.server_name,
                    server_id: info.server_id,
                    cluster: info.cluster,
                    version: info.version,
                    advertised: format!("{}:{}", info.host, info.port),
                    urls: m.urls_without_credentials(),
                }
            }),
        }
    }

    /// The config posture now.
    pub fn posture(&self) -> Posture {
        self.posture.borrow().posture
    }

    /// Sets the posture; answers whether it changed.
    pub fn set_posture(&self, report: PostureReport) -> bool {
        self.posture.send_if_modified(|now| {
            let changed = now.posture != report.posture;
            *now = report;
            changed
        })
    }

    /// Follows posture changes (the notification service stops consuming
    /// while the node sheds).
    pub fn watch_posture(&self) -> tokio::sync::watch::Receiver<PostureReport> {
        self.posture.subscribe()
    }

    /// Whether this node takes work off the stream now (false while it
    /// sheds), as a watch; the follower task ends when the state is dropped
    /// or the returned handle is aborted.
    pub fn watch_admission(
        &self,
    ) -> (
        tokio::sync::watch::Receiver<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let mut posture = self.watch_posture();
        let (tx, rx) = tokio::sync::watch::channel(posture.borrow_and_update().posture.admits());
        let follower = tokio::spawn(async move {
            while posture.changed().await.is_ok() {
                let admits = posture.borrow_and_update().posture.admits();
                tx.send_if_modified(|a| std::mem::replace(a, admits) != admits);
            }
        });
        (rx, follower)
    }
}

impl Probe for NodeState {
    fn health(&self) -> serde_json::Value {
        let phase = self.phase();
        let stream = match (self.stream.get(), self.broker_server.get()) {
            (Some(m), _) => Some(json!(m.health())),
            (None, Some(server)) => Some(json!({
                "mode": "embedded",
                "connected": false,
                "server": server.status(),
            })),
            (None, None) => None,
        };
        let posture = self.posture.borrow().clone();
        json!({
            "status": "ok",
            "node_id": self.node_id,
            "version": crate::VERSION,
            "phase": phase.as_str(),
            "draining": phase >= Phase::Draining,
            "ready": self.ready().is_ok(),
            // Picked by the config reconciler: serve, wait, shed, isolated
            // or stuck. /ready fails on shed and stuck, never wait or
            // isolated (the table in the module docs).
            "posture": posture.posture.as_str(),
            "posture_reason": posture.reason,
            "pointer_epoch": posture.pointer_epoch,
            "applied_epoch": self.applied_epoch(),
            "roles": self.roles.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            "labels": self.labels,
            "started_at": self.started_at.format(&Rfc3339).unwrap_or_default(),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "turns_in_flight": self.turns_in_flight(),
            "max_concurrent": self.max_concurrent,
            "seats_held": self.seats_held(),
            "paused_seats": self.pauses_view(),
            // known / unknown, since when, and what answers rest on
            // (`crewlet_secrets::Standing`); null until the mirror starts.
            "secrets": self.secrets.get().map(|s| s.standing()),
            "mcp": self.mcp_rows(),
            "duties": self.duties.health(),
            "custody": self.custody.get().map(|c| c.health()),
            "estate": self.estate.health(),
            "stream": stream,
            "presence": self.presence.get().map(|v| v.lock().expect("presence view").clone()),
            "plugins": self.plugins.get().map(|p| json!({
                "loaded": p.installed.len(),
                "failed": p.failed().len(),
                "watches_reopening": p.watches_reopening(),
            })),
            // Where this node's first-start token is, for a CLI refused.
            "data_dir": std::path::absolute(&self.data_dir).unwrap_or_else(|_| self.data_dir.clone()).display().to_string(),
            "store": {
                "path": self.store.path().display().to_string(),
                "schema_version": self.store.schema_version(),
            },
            "company": self.company_view(),
            "plugins_dirs": self.plugins_dirs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        })
    }

    /// The table in the module docs, row by row.
    fn ready(&self) -> Result<Ready, NotReady> {
        let stream = match self.phase() {
            Phase::Starting => return Err(NotReady::Starting),
            Phase::Draining | Phase::Stopping => return Err(NotReady::Draining),
            Phase::Running => self.stream.get().ok_or(NotReady::Starting)?,
        };
        let serving = match self.posture() {
            Posture::Shed => return Err(NotReady::Shed),
            Posture::Stuck => return Err(NotReady::Stuck),
            Posture::Isolated => Ready::Isolated,
            Posture::Wait => Ready::Wait,
            Posture::Serve => Ready::Serving,
        };
        if let Some(down) = stream.down_for() {
            let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            let (down_ms, steps_out_after_ms) = (ms(down), ms(self.steps_out_after));
            return if down < self.steps_out_after {
                Ok(Ready::Disconnected {
                    down_ms,
                    steps_out_after_ms,
                })
            } else {
                Err(NotReady::StreamDisconnected {
                    down_ms,
                    steps_out_after_ms,
                })
            };
        }
        Ok(serving)
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

    fn plugins(&self) -> crewlet_api::PluginsFuture<'_> {
        Box::pin(async move {
            match self.plugins.get() {
                Some(p) => Some(p.view_with_usage().await),
                None => None,
            }
        })
    }
}

/// The config reconciler shows its posture here.
impl crewlet_configplane::Postures for NodeState {
    fn set_posture(&self, report: PostureReport) -> bool {
        NodeState::set_posture(self, report)
    }

    fn posture(&self) -> Posture {
        NodeState::posture(self)
    }
}
