//! Seats glue: the node's [`SeatHost`] — what acquire → equip → attach and
//! a turn mean on this node — built from the engine context. Placement,
//! leases and mailboxes are `crewlet-seats`; the turn is `crewlet-turns`;
//! this file plugs the real model layer and MCP children into them, and
//! the node's event log, store and clock into the turn engine's ports.
//!
//! Rules: equip loads the seat's budget (an unreadable counter refuses to
//! equip: a seat must not take work it cannot charge) and starts its own
//! MCP children; `shared = true` servers are one set per node, bound to
//! the config epoch, brought to the epoch of the company a seat is
//! equipped under. A `${NAME}` in a server's template resolves against the
//! seat's own `credentials` first, then the company's secrets;
//! `${CREWLET_SEAT}` is the seat's handle, `${CREWLET_CHAT_TOKEN}` its chat
//! credential and `${CREWLET_CHAT_URL}` this node's API (`crate::chat`),
//! `${CREWLET_DATA_DIR}` the node's data dir (absolute), so a child's files follow `--data-dir`, not the
//! folder the node was started from. A credential not known yet (the
//! secrets bucket has not answered) starts nothing: equip waits for it up
//! to `CREDENTIAL_WAIT`, then fails, and the seat is equipped again the
//! moment the node's secrets change (`Secrets::changes`), else after the
//! backoff; a model key not known yet ends the turn as an outage (retried,
//! its wakes nak'd with a delay), never `llm_unavailable`.
//! `command = "crewlet"` runs this very binary (its `crewlet mcp chat`).
//! Every session row a turn writes is offered to the memory changelog
//! (`crewlet-memory`) once it is in the store; hydrate replays the seat's
//! memory into the store before its mailbox is attached, and a seat whose
//! memory cannot be read is named in the node's status (`memory_unread`,
//! shown by `/agents`) until it is.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crewlet_company::{Active, McpServer, McpTransport, Seat};
use crewlet_coord::{Admits, Budgets, Scope};
use crewlet_mcp::{McpOptions, SeatTools, ServerState, SharedChildren};
use crewlet_models::Models;
use crewlet_seats::{Batch, Room, SeatHost, SeatSpec, TurnVerdict};
use crewlet_turns::{Act, EventSink, Turn, TurnEnd, TurnEngine, TurnEvent, Unpublished};
use futures::future::BoxFuture;

pub use crate::seat_tools::Equipped;
use tracing::{info, warn};

/// `${CREWLET_SEAT}` in a server's template is the seat's handle.
pub const SEAT_VARIABLE: &str = "CREWLET_SEAT";
/// `${CREWLET_DATA_DIR}` in a server's template is the node's data dir.
pub const DATA_DIR_VARIABLE: &str = "CREWLET_DATA_DIR";

/// `resolve`, with `${CREWLET_DATA_DIR}` answered by `data_dir` (made
/// absolute: a child may change its working directory) and
/// `${CREWLET_CHAT_URL}` by this node's API (`docs/chat.md`).
fn with_data_dir(
    resolve: crewlet_mcp::Resolver,
    data_dir: &std::path::Path,
    chat_url: String,
) -> crewlet_mcp::Resolver {
    let dir = std::path::absolute(data_dir)
        .unwrap_or_else(|_| data_dir.to_path_buf())
        .display()
        .to_string();
    crewlet_mcp::Resolver::new(move |name: &str| match name {
        DATA_DIR_VARIABLE => crewlet_secrets::Lookup::Found(dir.clone()),
        crewlet_chat::URL_VARIABLE => crewlet_secrets::Lookup::Found(chat_url.clone()),
        _ => resolve.lookup(name),
    })
}

/// How long equip waits for an MCP credential not known yet before it
/// gives the seat back (bounded well inside the seats' equip timeout), and
/// how often it asks again meanwhile.
const CREDENTIAL_WAIT: Duration = Duration::from_secs(30);
const CREDENTIAL_POLL: Duration = Duration::from_millis(250);

/// How long a stopping node waits for its queued memory rows to reach the
/// stream.
const MEMORY_FLUSH: Duration = Duration::from_secs(5);

/// How long an outage-failed turn waits before it runs again.
const OUTAGE_RETRY: Duration = Duration::from_secs(5);

/// The node's event log as the turn engine's event sink: the row, then the
/// broadcast; the seat named as `seat:HANDLE` in the party index, like the
/// wake.
pub struct NodeEvents(pub crewlet_observe::Publisher);

impl EventSink for NodeEvents {
    fn publish(&self, event: TurnEvent) -> BoxFuture<'_, Result<(), Unpublished>> {
        Box::pin(async move {
            let mut ev = self.0.event(event.kind, event.payload);
            ev.at_ms = event.at_ms;
            ev.parties.push(crewlet_store::Party {
                party: format!("seat:{}", event.seat),
                role: "seat".into(),
            });
            ev.seat = Some(event.seat);
            ev.trace_id = event.trace_id;
            ev.conversation = event.conversation;
            self.0
                .publish(ev)
                .await
                .map(drop)
                .map_err(|e| Unpublished(e.to_string()))
        })
    }
}

/// The node's seat host.
pub struct NodeSeats {
    pub engine: TurnEngine<Models>,
    pub budgets: Budgets,
    pub shared: SharedChildren,
    pub shared_lock: tokio::sync::Mutex<()>,
    pub resolve: crewlet_mcp::Resolver,
    pub mcp: McpOptions,
    pub exe: Option<PathBuf>,
    /// Every equipped seat's registry status, for the node's presence row.
    pub registries: std::sync::Mutex<BTreeMap<String, Vec<crewlet_mcp::McpStatusRow>>>,
    /// The fleet's paused seats: a paused seat's turn stops before its
    /// next model call.
    pub pauses: tokio::sync::watch::Receiver<Option<crewlet_seats::Pauses>>,
    /// The plugins this node serves; a seat gets the modules its role lists.
    pub installed: Arc<crewlet_plugins::Installed>,
    /// The memory stream, with the tables a seat's memory is replayed into.
    pub memory: crewlet_memory::Memory,
    /// Seats held whose memory could not be read yet, with why.
    pub memory_unread: std::sync::Mutex<BTreeMap<String, String>>,
    /// Rows other nodes write to the seats held, applied as they come.
    pub tail: crewlet_memory::Tail,
    /// The company's embedding model (`[memory] embedding`), through the
    /// same key pool, cooldowns and budgets as the turns' model calls: the
    /// `Embedder` recall is handed (a concrete type, as the port's
    /// `impl Future` rules out `dyn`).
    pub embedder: crewlet_models::Embeddings,
}

impl NodeSeats {
    /// The MCP rows of this node: shared servers and every seat's own.
    pub fn mcp_status(&self) -> Vec<crewlet_mcp::McpStatusRow> {
        let seats = self.registries.lock().unwrap_or_else(|p| p.into_inner());
        crewlet_mcp::merge_status(
            self.shared
                .status()
                .into_iter()
                .chain(seats.values().flatten().cloned()),
        )
    }

    /// `command = "crewlet"` is this binary.
    fn localized(&self, servers: &BTreeMap<String, McpServer>) -> BTreeMap<String, McpServer> {
        let mut out = servers.clone();
        if let Some(exe) = &self.exe {
            for s in out.values_mut() {
                if let McpTransport::Stdio { command, .. } = &mut s.transport
                    && command == "crewlet"
                {
                    *command = exe.display().to_string();
                }
            }
        }
        out
    }

    /// Brings the node's shared servers to `active`'s epoch.
    async fn shared_at(&self, active: &Active) {
        let _one = self.shared_lock.lock().await;
        // Applied again at the same epoch while a server waits for a
        // credential not known yet.
        if self.shared.epoch() == Some(active.epoch) && !self.shared.waiting() {
            return;
        }
        let mut servers = BTreeMap::new();
        for role in active.company.roles.values() {
            for (name, s) in &role.mcp {
                if s.shared {
                    servers.entry(name.clone()).or_insert_with(|| s.clone());
                }
            }
        }
        let servers = self.localized(&servers);
        self.shared
            .apply(active.epoch, servers, self.resolve.clone())
            .await;
    }

    fn seat_resolver(&self, seat: &Seat) -> crewlet_mcp::Resolver {
        let own: BTreeMap<String, String> = seat
            .credentials
            .iter()
            .map(|(k, v)| (k.clone(), v.name_str().to_owned()))
            .collect();
        let company = self.resolve.clone();
        let handle = seat.handle.to_string();
        crewlet_mcp::Resolver::new(move |name: &str| match own.get(name) {
            Some(secret) => company.lookup(secret),
            None if name == SEAT_VARIABLE => crewlet_secrets::Lookup::Found(handle.clone()),
            None if name == crewlet_chat::TOKEN_VARIABLE => {
                crewlet_chat::seat_token(&company, &handle)
            }
            None => company.lookup(name),
        })
    }
}

impl SeatHost for NodeSeats {
    type Equipped = Equipped;

    async fn equip(&self, spec: &SeatSpec, active: &Active) -> Result<Equipped, String> {
        let company = &active.company;
        let seat = company
            .seats
            .get(&spec.handle)
            .ok_or_else(|| format!("seat {} is not in the company", spec.handle))?;
        let windows = crewlet_turns::windows_at(company, crewlet_os::wall_now());
        self.budgets
            .budget(&Scope::Seat(spec.handle.to_string()), &windows)
            .await
            .map_err(|e| format!("cannot load the seat's budget: {e}"))?;
        let role = company.role_of(seat);
        let servers = self.localized(&role.mcp);
        // A credential not known yet: asked again until it is, for a while
        // (nothing is spawned meanwhile, the mailbox is not attached); then
        // not equipped — the lease goes back and the seat is equipped
        // again after the backoff, never run without the credential.
        let waiting_since = tokio::time::Instant::now();
        let mut told = false;
        let tools = loop {
            self.shared_at(active).await;
            match SeatTools::start(
                spec.handle.as_str(),
                &servers,
                &self.shared,
                self.seat_resolver(seat),
                &self.mcp,
            )
            .await
            {
                Ok(tools) => break tools,
                Err(e) if waiting_since.elapsed() < CREDENTIAL_WAIT => {
                    if !std::mem::replace(&mut told, true) {
                        info!(subsystem = "seats", seat = %spec.handle, reason = %e, "seat not equipped yet: a credential is not known");
                    }
                    tokio::time::sleep(CREDENTIAL_POLL).await;
                }
                Err(e) => return Err(e.to_string()),
            }
        };
        for s in tools.servers() {
            if let ServerState::Failed { reason } = &s.state {
                warn!(subsystem = "seats", seat = %spec.handle, server = %s.name, %reason, "MCP server did not start; the seat runs without it");
            }
        }
        self.registries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(spec.handle.to_string(), tools.status());
        info!(subsystem = "seats", seat = %spec.handle, servers = servers.len(), "seat equipped");
        let mut modules = Vec::new();
        for name in &role.modules {
            match self.installed.module(name) {
                Some(_) => modules.push(name.clone()),
                None => {
                    warn!(subsystem = "seats", seat = %spec.handle, module = %name, "the role lists a module this node does not run; the seat runs without its tools")
                }
            }
        }
        Ok(Equipped {
            tools,
            modules,
            installed: self.installed.clone(),
            seat: spec.handle.to_string(),
        })
    }

    async fn hydrate(&self, spec: &SeatSpec) -> Result<(), String> {
        let handle = spec.handle.as_str();
        // Rows written meanwhile are held by the tail, applied past the pass.
        self.tail.watch(handle).await;
        let answer = self.memory.hydrate(handle).await;
        let caught_up = match &answer {
            Ok(h) => self.tail.live(handle, h.reached).await,
            Err(_) => {
                self.tail.forget(handle);
                0
            }
        };
        let mut unread = self.memory_unread.lock().unwrap_or_else(|p| p.into_inner());
        match answer {
            Ok(h) => {
                unread.remove(handle);
                info!(subsystem = "memory", seat = %handle, rows = h.rows, written = h.written,
                    kept_local = h.kept_local, skipped = h.skipped, took_ms = h.took.as_millis() as u64,
                    reached = h.reached, caught_up, "seat memory hydrated; later rows applied as they come");
                Ok(())
            }
            Err(e) => {
                unread.insert(handle.to_owned(), e.to_string());
                Err(e.to_string())
            }
        }
    }

    async fn unequip(&self, spec: &SeatSpec, equipped: Equipped) {
        self.tail.forget(spec.handle.as_str());
        self.memory_unread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(spec.handle.as_str());
        self.registries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(spec.handle.as_str());
        equipped.tools.shutdown().await;
    }

    async fn run(&self, spec: &SeatSpec, equipped: &Equipped, batch: Batch) -> TurnVerdict {
        let Some(seat) = batch.active.company.seats.get(&spec.handle) else {
            return TurnVerdict::Retry {
                after: OUTAGE_RETRY,
                reason: format!(
                    "seat {} is not in the company this turn runs under",
                    spec.handle
                ),
            };
        };
        let fence = batch.fence.clone();
        let pauses = self.pauses.clone();
        let handle = spec.handle.as_str().to_owned();
        let may_act = move || {
            if fence.admits() == Admits::No {
                Act::FenceLost
            } else if !crewlet_seats::admits(&pauses.borrow(), &handle) {
                Act::Paused
            } else {
                Act::Go
            }
        };
        let end = self
            .engine
            .run(Turn {
                seat,
                active: &batch.active,
                wakes: &batch.wakes,
                tools: equipped,
                may_act: &may_act,
            })
            .await;
        match end {
            TurnEnd::AlreadyDone | TurnEnd::Ended { .. } => TurnVerdict::Done,
            TurnEnd::Outage { reason, .. } => TurnVerdict::Retry {
                after: OUTAGE_RETRY,
                reason,
            },
            TurnEnd::FenceLost { turn_id } => TurnVerdict::Retry {
                after: Duration::ZERO,
                reason: format!("turn {turn_id}: this node no longer holds the seat"),
            },
            // Handed back at once: the paused mailbox takes nothing, so
            // the wakes wait in it until the seat is resumed.
            TurnEnd::Paused { turn_id } => TurnVerdict::Retry {
                after: Duration::ZERO,
                reason: format!("turn {turn_id}: the seat was paused"),
            },
            TurnEnd::Parked { turn_id, park } => TurnVerdict::Park {
                after: until(park.until),
                need: park.need,
                reason: format!("turn {turn_id}: {}", park.reason(&batch.active.company)),
            },
        }
    }

    async fn room(&self, spec: &SeatSpec, active: &Active, need: u64) -> Room {
        let company = &active.company;
        let Some(seat) = company.seats.get(&spec.handle) else {
            return Room::Unknown(format!("seat {} is not in the company", spec.handle));
        };
        let now = crewlet_os::wall_now();
        match crewlet_turns::budget_room(&self.budgets.reads(), company, seat, now, need).await {
            Ok(crewlet_turns::BudgetRoom::Free) => Room::Free,
            Ok(crewlet_turns::BudgetRoom::Full(park)) => Room::Full {
                after: until(park.until),
                reason: park.reason(company),
            },
            Err(e) => Room::Unknown(format!("the budget counters are unreachable: {e}")),
        }
    }
}

/// How long until `instant` on this node's clock (zero once it passed).
fn until(instant: std::time::SystemTime) -> Duration {
    instant
        .duration_since(crewlet_os::wall_now())
        .unwrap_or_default()
}

/// This node's wall clock (shifted in tests by
/// `CREWLET_TEST_CLOCK_OFFSET_MS`, like every other clock of the node), on
/// which the turn engine cuts budget windows.
pub struct NodeClock;

impl crewlet_turns::Clock for NodeClock {
    fn now(&self) -> std::time::SystemTime {
        crewlet_os::wall_now()
    }
}

/// The running seats subsystem, and what the node shows of it.
struct Running {
    /// Taken out when the node stops.
    seats: std::sync::Mutex<Option<crewlet_seats::Seats<NodeSeats>>>,
    host: Arc<NodeSeats>,
}

impl Running {
    fn with<R: Default>(&self, f: impl FnOnce(&crewlet_seats::Seats<NodeSeats>) -> R) -> R {
        let seats = self.seats.lock().unwrap_or_else(|p| p.into_inner());
        seats.as_ref().map(f).unwrap_or_default()
    }
}

impl crate::state::SeatsView for Running {
    fn held(&self) -> usize {
        self.with(|s| s.held().len())
    }

    fn in_flight(&self) -> usize {
        self.with(|s| s.in_flight())
    }

    fn mcp(&self) -> Vec<crewlet_mcp::McpStatusRow> {
        self.host.mcp_status()
    }

    fn memory_unread(&self) -> BTreeMap<String, String> {
        self.host
            .memory_unread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Starts the model layer, the turn engine and seat ownership on a node
/// with the `seats` role; stopped on the engine's stack (seats released
/// in reverse, then the shared children, then the cooldown puller).
pub async fn start(
    ctx: &crate::engine::EngineContext,
    engine: &mut crate::engine::Started,
) -> Result<(), String> {
    if !ctx.config.roles.contains(&crewlet_config::Role::Seats) {
        info!(
            subsystem = "seats",
            "this node has no `seats` role: it holds no seats"
        );
        return Ok(());
    }
    let models = models(ctx).await;
    let resolve = ctx.secrets.resolver();
    let memory = crewlet_memory::Memory::open(async_nats::jetstream::new(ctx.client.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let memory = crewlet_memory::memory_tables(memory, &ctx.store);
    let (changelog, carrier) = crewlet_memory::Changelog::start(memory.clone());
    let (tail, tailing) = crewlet_memory::Tail::start(memory.clone())
        .await
        .map_err(|e| e.to_string())?;
    let engine_turns = TurnEngine::new(
        models.clone(),
        ctx.coord.budgets(),
        ctx.coord.ledger(),
        ctx.coord.follows(),
        crewlet_turns::Ports {
            events: Arc::new(NodeEvents(ctx.publisher.clone())),
            sessions: Arc::new(crewlet_recall::NodeSessions {
                store: ctx.store.clone(),
                changelog: changelog.clone(),
            }),
            clock: Arc::new(NodeClock),
        },
        crewlet_turns::Limits {
            crash_at: test_crash_point(),
            ..crewlet_turns::Limits::default()
        },
    )
    .with_recall(crewlet_turns::Recall {
        memory: Arc::new(crewlet_recall::NodeMemory {
            store: ctx.store.clone(),
            changelog: changelog.clone(),
        }),
        // The company's `[memory] embedding` (none: recall by recency).
        embedder: Arc::new(models.embedder(ctx.coord.budgets(), ctx.active.clone())),
        skills: Arc::new(crewlet_recall::NodeSkills {
            store: ctx.store.clone(),
            changelog: changelog.clone(),
        }),
    });
    let mcp = McpOptions {
        policy: Arc::new(crate::company::policy(&ctx.config)),
        ..McpOptions::default()
    };
    let host = Arc::new(NodeSeats {
        engine: engine_turns,
        budgets: ctx.coord.budgets(),
        shared: SharedChildren::new(mcp.clone()),
        shared_lock: tokio::sync::Mutex::new(()),
        resolve: with_data_dir(
            resolve,
            &ctx.config.data_dir,
            crewlet_chat::api_url(&ctx.config),
        ),
        mcp,
        exe: std::env::current_exe().ok(),
        registries: std::sync::Mutex::default(),
        pauses: ctx.pauses.clone(),
        installed: ctx
            .plugins
            .as_ref()
            .map(|p| p.installed.clone())
            .unwrap_or_default(),
        memory,
        memory_unread: std::sync::Mutex::default(),
        tail,
        embedder: models.embedder(ctx.coord.budgets(), ctx.active.clone()),
    });
    let mut cfg = crewlet_seats::SeatsConfig::new(
        ctx.node_id.clone(),
        ctx.coord.options().owner.clone(),
        crewlet_seats::SeatLeases::of(&ctx.coord),
        async_nats::jetstream::new(ctx.client.clone()),
        ctx.active.clone(),
        host.clone(),
    );
    cfg.max_concurrent_turns = ctx.state.max_concurrent.max(1);
    cfg.labels = ctx.state.labels.clone();
    // A shedding node takes nothing off its seats' mailboxes either.
    let (admission, follower) = ctx.state.watch_admission();
    cfg.admission = admission;
    cfg.pauses = ctx.pauses.clone();
    // A seat whose credential was not known is equipped the moment the
    // secrets change, not after its equip backoff.
    cfg.retry_equip = ctx.secrets.changes();
    let seats = match crewlet_seats::Seats::start(cfg) {
        Ok(s) => s,
        Err(e) => {
            follower.abort();
            return Err(e.to_string());
        }
    };
    let running = Arc::new(Running {
        seats: std::sync::Mutex::new(Some(seats)),
        host: host.clone(),
    });
    ctx.state.attach_seats(running.clone());
    match crewlet_turns::Embedder::model(&host.embedder) {
        Some(model) => info!(subsystem = "memory", %model, "seats embed with the company's model"),
        None => info!(
            subsystem = "memory",
            "the company names no embedding model: recall is by recency"
        ),
    }
    engine.push("seats", move || {
        Box::pin(async move {
            let seats = running
                .seats
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(seats) = seats {
                seats.stop().await;
            }
            running.host.engine.close().await;
            // The last turns' rows reach the stream before the connection goes.
            changelog.close(MEMORY_FLUSH).await;
            carrier.abort();
            tailing.abort();
            running.host.shared.shutdown().await;
            models.shutdown().await;
            follower.abort();
        })
    });
    Ok(())
}

/// The model layer of this node (the turn engine's brain, and the
/// learning duty's): the plugins' providers, the fleet's cooldowns.
pub(crate) async fn models(ctx: &crate::engine::EngineContext) -> Arc<Models> {
    let providers = ctx
        .plugins
        .as_ref()
        .map(|p| p.installed.clone())
        .unwrap_or_default();
    Arc::new(
        Models::new(
            providers,
            ctx.coord.model_cooldowns(),
            Some(ctx.publisher.clone()),
            ctx.secrets.resolver(),
            crewlet_models::ModelsOptions {
                // The pull interval the floor was validated against.
                pull_every: Duration::from_secs(crewlet_config::COOLDOWN_PULL_SECONDS),
                cooldowns: crewlet_models::CooldownPolicy::with_floor(
                    ctx.config.models.cooldown_floor,
                ),
                ..crewlet_models::ModelsOptions::default()
            },
        )
        .await,
    )
}

/// The variable a crash test names its point in (`reply.after_intent`,
/// `reply.after_post`, `reply.after_reply`): the node dies there, as if
/// killed. Never set outside tests.
const CRASH_ENV: &str = "CREWLET_TEST_CRASH_AT";

fn test_crash_point() -> Option<crewlet_turns::CrashPoint> {
    let v = std::env::var(CRASH_ENV).ok()?;
    let point = crewlet_turns::CrashPoint::parse(&v);
    match point {
        Some(p) => {
            tracing::warn!(subsystem = "seats", point = ?p, "{CRASH_ENV} is set: this node dies at that point of its next reply (tests only)")
        }
        None => {
            tracing::warn!(subsystem = "seats", value = %v, "{CRASH_ENV} names no crash point; ignored")
        }
    }
    point
}
