//! The HTTP surface's traits (`crewlet-api`), wired to the feature crates
//! that answer them. Rule: this file only translates — a feature's logic
//! lives in its crate, an HTTP answer's shape in `crewlet-api`; a route
//! bound before the engine is up answers "starting" until [`Late`] is set.

use std::sync::Arc;

use crewlet_api::fleet::ViewFuture;
use crewlet_api::module_state::StateFuture;
use crewlet_api::pauses::PauseFuture;
use crewlet_api::secrets::{SecretFuture, SecretRefusal, SecretsAdmin};
use crewlet_api::tokens::TokenFuture;
use crewlet_api::{
    Activated, Authority, ConfigPlane, ConfigRefusal, EventFilter, EventSource, FleetView,
    ModuleStates, PauseRefusal, Refused, Scope, SeatPausing, StateRefusal, TokenAdmin,
    TokenFailure, Unavailable, Verdict, config::ConfigFuture,
};
use crewlet_configplane::ConfigError;
use crewlet_seats::PauseError;
use crewlet_tokens::{Standing, Tokens, TokensError};

use crate::engine::Late;
use crate::state::NodeState;

/// Every route the node serves beside the probes (under the same drain
/// gate and guard): each feature's routes from `crewlet-api` over its
/// adapter below, and those not moved there yet.
pub(crate) fn routes(late: &Late, operators: &Arc<Operators>) -> axum::Router {
    crewlet_api::webhooks::routes(Arc::new(crate::ingress::NodeWebhooks(late.clone())))
        .merge(crewlet_api::config::routes(Arc::new(Config(late.clone()))))
        .merge(crewlet_api::secrets::routes(
            Arc::new(SecretsRoutes(late.clone())),
            crewlet_secrets::MAX_SECRET_BYTES,
        ))
        .merge(crewlet_api::pauses::routes(Arc::new(Pausing(late.clone()))))
        .merge(crewlet_api::memory::routes(Arc::new(SeatMemoryRoutes(
            late.clone(),
        ))))
        .merge(crewlet_api::fleet::routes(Arc::new(Fleet(late.clone()))))
        .merge(crewlet_api::tokens::routes(operators.clone()))
        .merge(crewlet_api::operator::routes(crewlet_operator::service(
            Arc::new(OperatorDesk(late.clone())),
        )))
        .merge(crewlet_api::backup::routes(Arc::new(Backups(late.clone()))))
        .merge(crewlet_api::module_state::routes(Arc::new(States(
            late.clone(),
        ))))
        .merge(crewlet_api::usage::routes(Arc::new(UsageRoutes(
            late.clone(),
        ))))
        .merge(crewlet_api::chat::routes(Arc::new(
            crewlet_chat::ChatRoutes {
                node: Arc::new(late.clone()),
                tokens: operators.0.clone(),
            },
        )))
}

/// The chat's reach into the engine (`crewlet-chat`).
impl crewlet_chat::ChatNode for Late {
    fn engine(&self) -> Option<crewlet_chat::Engine<'_>> {
        let ctx = self.get()?;
        Some(crewlet_chat::Engine {
            secrets: &ctx.secrets,
            active: &ctx.active,
            module: ctx
                .plugins
                .as_ref()
                .and_then(|p| p.installed.module(crewlet_chat::CHAT)),
        })
    }

    fn edge(&self) -> Option<&Arc<crewlet_ingress::Edge>> {
        Late::edge(self)
    }
}

/// The operator catalogue's reach into the engine (`crewlet-operator`).
struct OperatorDesk(Late);

impl crewlet_operator::Engine for OperatorDesk {
    fn parts(&self) -> Option<crewlet_operator::Parts> {
        let (ctx, edge) = (self.0.get()?, self.0.edge()?);
        Some(crewlet_operator::Parts {
            node_id: ctx.node_id.clone(),
            client: ctx.client.clone(),
            survey: ctx.coord.survey(),
            positions: ctx.coord.records(crewlet_coord::Bucket::Positions),
            store: ctx.store.clone(),
            edge: edge.clone(),
            active: ctx.active.clone(),
            fleet: ctx.fleet(),
            history: ctx.history(),
            seat_pauses: ctx.seat_pauses(),
        })
    }

    fn draining(&self) -> bool {
        self.0
            .get()
            .is_some_and(|ctx| ctx.state.phase() >= crate::state::Phase::Draining)
    }
}

/// `GET /metrics`, served on every node whatever its roles, behind the
/// operator guard with `read` scope; 503 until the engine is up.
pub(crate) fn metrics_routes(late: Late) -> axum::Router {
    crewlet_api::metrics::routes(Arc::new(Metrics(late)))
}

/// This node's meter, and what the scrape reads beside it
/// (`crewlet_observe::scrape`).
struct Metrics(Late);

impl crewlet_api::MetricsSource for Metrics {
    fn scrape(&self) -> Result<crewlet_api::Scraped, Unavailable> {
        let Some(ctx) = self.0.get() else {
            return Err(Unavailable {
                error: "starting",
                detail: "the node's engine is still starting; metrics are served once it is up"
                    .into(),
            });
        };
        let body = ctx.publisher.meter().render(vec![Box::new(scrape_of(ctx))]);
        Ok(crewlet_api::Scraped {
            content_type: crewlet_observe::OPENMETRICS_CONTENT_TYPE,
            body,
        })
    }
}

fn scrape_of(ctx: &crate::engine::EngineContext) -> crewlet_observe::scrape::Scrape {
    use crewlet_observe::scrape::{Latency, PluginRow, Renewals, Scrape};
    let row = |p: &crewlet_plugins::Plugin| {
        let (m, h) = (p.manifest(), p.health());
        PluginRow {
            name: m.name.clone(),
            kind: m.kind.world(),
            calls: h.total_calls,
            faults: h.total_faults,
            refused_calls: h.refused_calls,
            degraded: h.degraded,
            latency: Latency {
                buckets: h.latency.buckets,
                overflow: h.latency.overflow,
                sum: h.latency.sum,
            },
        }
    };
    let r = ctx.coord.renewals();
    Scrape {
        plugins: ctx
            .plugins
            .as_ref()
            .map(|loaded| loaded.installed.all().iter().map(row).collect())
            .unwrap_or_default(),
        renewals: Renewals {
            yes: r.yes,
            no: r.no,
            unknown: r.unknown,
        },
        broker_connected: ctx.client.connection_state() == async_nats::connection::State::Connected,
        seats_held: ctx.state.seats_held(),
        turns_in_flight: ctx.state.turns_in_flight(),
    }
}

/// `GET /usage` (this node's estate), `POST /estate/evict` and
/// `POST /estate/readmit`, once the
/// engine is up.
pub(crate) struct UsageRoutes(pub(crate) Late);

impl UsageRoutes {
    fn ctx(&self) -> Result<&crate::engine::EngineContext, crewlet_api::usage::UsageRefusal> {
        self.0.get().ok_or_else(|| {
            crewlet_api::usage::UsageRefusal::Unavailable(
                "the node's engine is not up yet; retry in a few seconds".into(),
            )
        })
    }
}

impl crewlet_api::usage::UsageSource for UsageRoutes {
    fn usage(&self, ask: crewlet_api::usage::UsageAsk) -> crewlet_api::usage::UsageFuture<'_> {
        Box::pin(async move {
            let state = self.ctx()?.state.clone();
            let ask = crewlet_estate::UsageAsk {
                period: ask.period,
                by: ask.by,
                from: ask.from,
                to: ask.to,
            };
            tokio::task::spawn_blocking(move || crewlet_estate::usage(&state.estate, ask))
                .await
                .unwrap_or_else(|e| Err(crewlet_estate::UsageRefusal::Unavailable(e.to_string())))
                .map_err(usage_refusal)
        })
    }

    fn evict(&self, ask: crewlet_api::usage::EvictAsk) -> crewlet_api::usage::UsageFuture<'_> {
        Box::pin(async move {
            let ctx = self.ctx()?;
            crewlet_estate::evict(&ctx.coord, &ctx.publisher, audited(ask))
                .await
                .map_err(usage_refusal)
        })
    }

    fn readmit(&self, ask: crewlet_api::usage::EvictAsk) -> crewlet_api::usage::UsageFuture<'_> {
        Box::pin(async move {
            let ctx = self.ctx()?;
            crewlet_estate::readmit(&ctx.coord, &ctx.publisher, audited(ask))
                .await
                .map_err(usage_refusal)
        })
    }
}

fn audited(ask: crewlet_api::usage::EvictAsk) -> crewlet_estate::Audited {
    crewlet_estate::Audited {
        node: ask.node,
        reason: ask.reason,
    }
}

fn usage_refusal(r: crewlet_estate::UsageRefusal) -> crewlet_api::usage::UsageRefusal {
    use crewlet_api::usage::UsageRefusal as Api;
    use crewlet_estate::UsageRefusal as Estate;
    match r {
        Estate::BadQuery(s) => Api::BadQuery(s),
        Estate::NotHeld(s) => Api::NotHeld(s),
        Estate::Unavailable(s) => Api::Unavailable(s),
        Estate::UnknownNode(s) => Api::UnknownNode(s),
    }
}

/// The estate's backup handles, from the engine's context.
pub(crate) fn backup_parts(
    ctx: &crate::engine::EngineContext,
) -> crewlet_estate::backup::Parts<'_> {
    crewlet_estate::backup::Parts {
        node_id: &ctx.node_id,
        client: &ctx.client,
        coord: &ctx.coord,
        store: &ctx.store,
        config: &ctx.config,
        estate: &ctx.state.estate,
    }
}

/// `POST /backup`, once the engine is up (`crewlet-estate` writes it).
struct Backups(Late);

impl crewlet_api::BackupSource for Backups {
    fn back_up(&self, dir: std::path::PathBuf) -> crewlet_api::backup::BackupFuture<'_> {
        use crewlet_api::BackupRefusal;
        use crewlet_stream::backup::BackupError;
        Box::pin(async move {
            let ctx = self.0.get().ok_or(BackupRefusal::Starting)?;
            match crewlet_estate::backup::back_up(&backup_parts(ctx), &dir).await {
                Ok(manifest) => Ok(serde_json::json!(manifest)),
                Err(e @ BackupError::Write { .. }) => Err(BackupRefusal::Write(e.to_string())),
                Err(e) => Err(BackupRefusal::Unavailable(e.to_string())),
            }
        })
    }
}

/// `GET /events` and the socket's queries: the live broadcast from the
/// node's feed, queries from the whole fleet once the engine is up (before
/// that, this node's log, with the coverage saying the fleet was not asked).
pub(crate) struct History {
    pub(crate) state: Arc<NodeState>,
    pub(crate) late: Late,
}

impl EventSource for History {
    fn live(&self) -> Option<tokio::sync::broadcast::Receiver<Arc<str>>> {
        self.state.live_feed()
    }

    fn query(&self, filter: EventFilter) -> crewlet_api::stream::QueryFuture {
        let late = self.late.clone();
        let state = self.state.clone();
        Box::pin(async move {
            if let Some(ctx) = late.get() {
                return Ok(ctx.history().events(filter).await);
            }
            crewlet_history::own_log(
                state.store.clone(),
                state.node_id.clone(),
                state.started_at_ms(),
                filter,
            )
            .await
            .map_err(|e| crewlet_api::stream::QueryError::Unreadable(e.to_string()))
        })
    }
}

/// `PUT /config` and `GET /config`: accepted as `--company` is (this node's
/// allow-list and catalogue), then the config plane's.
pub(crate) struct Config(pub(crate) Late);

impl ConfigPlane for Config {
    fn put(&self, document: String) -> ConfigFuture<'_, Result<Activated, ConfigRefusal>> {
        Box::pin(async move {
            let ctx = self.0.get().ok_or(ConfigRefusal::Starting)?;
            let catalogue = ctx.plugins.as_ref().map(|l| l.catalogue());
            let company = crate::company::accept(&document, &crate::company::policy(&ctx.config))
                .and_then(|c| crate::company::runnable(c, catalogue.as_ref()))
                .map_err(|invalid| {
                    ConfigRefusal::Invalid(
                        serde_json::to_value(&invalid.errors).unwrap_or_default(),
                    )
                })?;
            let a = ctx
                .config_plane()
                .put(&company, &document)
                .await
                .map_err(config_refusal)?;
            Ok(Activated {
                epoch: a.epoch.get(),
                digest: a.digest,
                moved: a.moved,
            })
        })
    }

    fn active(&self) -> ConfigFuture<'_, Result<serde_json::Value, ConfigRefusal>> {
        Box::pin(async move {
            let ctx = self.0.get().ok_or(ConfigRefusal::Starting)?;
            ctx.config_plane()
                .active()
                .await
                .map_err(config_refusal)?
                .ok_or(ConfigRefusal::NoActiveRevision)
        })
    }
}

fn config_refusal(e: ConfigError) -> ConfigRefusal {
    match e {
        ConfigError::Unavailable(_) => ConfigRefusal::PointerUnavailable(e.to_string()),
        ConfigError::Contended(_) => ConfigRefusal::PointerContended(e.to_string()),
        other => ConfigRefusal::Failed(other.to_string()),
    }
}

/// `GET /fleet`, `GET /agents`, `GET /turns/{id}`: `crewlet-fleet`'s views.
pub(crate) struct Fleet(pub(crate) Late);

impl Fleet {
    fn view(&self) -> Result<crewlet_fleet::View, Unavailable> {
        self.0
            .get()
            .map(|ctx| ctx.fleet())
            .ok_or_else(Unavailable::starting)
    }
}

fn fleet_refusal(e: crewlet_fleet::FleetError) -> Unavailable {
    Unavailable {
        error: e.kind(),
        detail: e.to_string(),
    }
}

impl FleetView for Fleet {
    fn fleet(&self) -> ViewFuture<'_> {
        Box::pin(async move { self.view()?.fleet().await.map_err(fleet_refusal) })
    }

    fn agents(&self) -> ViewFuture<'_> {
        Box::pin(async move { self.view()?.agents().await.map_err(fleet_refusal) })
    }

    fn follows(&self, handle: String) -> ViewFuture<'_> {
        Box::pin(async move {
            let ctx = self.0.get().ok_or_else(Unavailable::starting)?;
            let follows = ctx.coord.follows().of_seat(&handle).await;
            let follows = follows.map_err(|e| Unavailable {
                error: "follows_unavailable",
                detail: format!("the follows bucket did not answer ({e}); retry shortly"),
            })?;
            let rows = follows.iter().map(|f| {
                serde_json::json!({"backend": f.thread.backend, "channel": f.thread.channel,
                    "thread": f.thread.thread, "last_post_ms": f.last_post_ms})
            });
            Ok(serde_json::json!({"seat": handle, "follows": rows.collect::<Vec<_>>()}))
        })
    }

    fn turn(&self, turn_id: String) -> ViewFuture<'_> {
        Box::pin(async move { Ok(self.view()?.turn(&turn_id).await) })
    }

    fn budgets(&self) -> ViewFuture<'_> {
        Box::pin(async move {
            let unavailable = |error, detail: String| Unavailable { error, detail };
            let Some(ctx) = self.0.get() else {
                return Err(unavailable(
                    "starting",
                    "the node's engine is not up yet".into(),
                ));
            };
            match ctx.fleet().budgets().await {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(unavailable(
                    "no_company",
                    "no company is active on this node".into(),
                )),
                Err(e) => Err(unavailable("budgets_unavailable", e.to_string())),
            }
        })
    }
}

/// The guard's judge and `/tokens`: `crewlet-tokens`' mirror, read from the
/// moment the HTTP surface binds.
pub(crate) struct Operators(pub(crate) Arc<Tokens>);

impl Authority for Operators {
    fn check(&self, token: &str) -> Verdict {
        match self.0.check(token) {
            Standing::Live { id, scope } => match Scope::parse(&scope) {
                Some(scope) => Verdict::Granted { id, scope },
                None => Verdict::Refused(Refused::Unknown),
            },
            Standing::Expired => Verdict::Refused(Refused::Expired),
            Standing::Revoked => Verdict::Refused(Refused::Revoked),
            Standing::NotHeld => Verdict::Refused(Refused::Unknown),
            Standing::Unknown(why) => Verdict::Unknown(why),
        }
    }
}

fn token_failure(e: TokensError) -> TokenFailure {
    match e {
        TokensError::Unavailable(_) => TokenFailure::Unavailable(e.to_string()),
        other => TokenFailure::Failed(other.to_string()),
    }
}

impl TokenAdmin for Operators {
    fn list(&self) -> TokenFuture<'_, Vec<serde_json::Value>> {
        Box::pin(async move { self.0.list().await.map_err(token_failure) })
    }

    fn issue(
        &self,
        scope: Scope,
        name: String,
        ttl_seconds: Option<u64>,
    ) -> TokenFuture<'_, serde_json::Value> {
        Box::pin(async move {
            self.0
                .issue(scope.as_str(), name, ttl_seconds)
                .await
                .map_err(token_failure)
        })
    }

    fn revoke(&self, id: String) -> TokenFuture<'_, Option<serde_json::Value>> {
        Box::pin(async move { self.0.revoke(&id).await.map_err(token_failure) })
    }
}

/// `POST /agents/{handle}/pause|resume`: `crewlet-seats`' pauses, by `api`.
pub(crate) struct Pausing(pub(crate) Late);

impl Pausing {
    fn pauses(&self) -> Result<crewlet_seats::SeatPauses, PauseRefusal> {
        self.0.get().map(|ctx| ctx.seat_pauses()).ok_or_else(|| {
            PauseRefusal::Unavailable(
                "the node's engine is not up yet; retry in a few seconds".into(),
            )
        })
    }
}

fn pause_refusal(e: PauseError) -> PauseRefusal {
    let detail = e.to_string();
    match e {
        PauseError::NoCompany => PauseRefusal::NoCompany(detail),
        PauseError::NoSeat(_) => PauseRefusal::NoSeat(detail),
        PauseError::Unavailable { .. } => PauseRefusal::Unavailable(detail),
    }
}

impl SeatPausing for Pausing {
    fn pause(&self, handle: String, reason: Option<String>) -> PauseFuture<'_> {
        Box::pin(async move {
            self.pauses()?
                .pause(&handle, "api", reason)
                .await
                .map_err(pause_refusal)
        })
    }

    fn resume(&self, handle: String) -> PauseFuture<'_> {
        Box::pin(async move {
            self.pauses()?
                .resume(&handle, "api")
                .await
                .map_err(pause_refusal)
        })
    }
}

/// `GET /plugins/{name}/state/{bucket}`: `crewlet-plugins`' read of a
/// module bucket, on the plugins this node loaded.
pub(crate) struct States(pub(crate) Late);

impl ModuleStates for States {
    fn read(&self, name: String, bucket: String) -> StateFuture<'_> {
        Box::pin(async move {
            use crewlet_plugins::state_view::{StateReadError, read_bucket};
            let ctx = self
                .0
                .get()
                .ok_or_else(|| StateRefusal::Unavailable(Unavailable::starting()))?;
            let Some(loaded) = &ctx.plugins else {
                return Err(StateRefusal::NotFound(
                    "no plugins directory on this node".into(),
                ));
            };
            read_bucket(&loaded.installed, loaded.state.as_ref(), &name, &bucket)
                .await
                .map_err(|e| match e {
                    StateReadError::NotFound(detail) => StateRefusal::NotFound(detail),
                    StateReadError::Unavailable(detail) => StateRefusal::Unavailable(Unavailable {
                        error: "state_unavailable",
                        detail,
                    }),
                })
        })
    }
}

/// The secrets routes: `crewlet-secrets`' mirror, every change logged by name
/// (never by value).
pub(crate) struct SecretsRoutes(pub(crate) Late);

impl SecretsRoutes {
    fn ctx(&self) -> Result<&crate::engine::EngineContext, SecretRefusal> {
        self.0.get().ok_or(SecretRefusal::Starting)
    }
}

fn secret_refusal(e: crewlet_secrets::SecretsError) -> SecretRefusal {
    use crewlet_secrets::SecretsError as E;
    let detail = e.to_string();
    match e {
        E::BadName(_) => SecretRefusal::BadRequest(detail),
        E::TooLarge { .. } => SecretRefusal::TooLarge(detail),
        E::Unavailable(_) | E::NoKeyring(_) => SecretRefusal::Unavailable(detail),
        E::Corrupt { .. } | E::Keyring(_) => SecretRefusal::Failed(detail),
    }
}

impl SecretsAdmin for SecretsRoutes {
    fn check_name(&self, name: &str) -> Result<(), SecretRefusal> {
        crewlet_secrets::check_name(name).map_err(secret_refusal)
    }

    fn set(&self, name: String, value: bytes::Bytes) -> SecretFuture<'_, ()> {
        Box::pin(async move {
            let ctx = self.ctx()?;
            let Ok(value) = std::str::from_utf8(&value) else {
                return Err(SecretRefusal::BadRequest(format!(
                    "the value of {name} is not UTF-8 text; send the secret as text"
                )));
            };
            match ctx.secrets.set(&name, value).await {
                Ok(_) => {
                    tracing::info!(subsystem = "secrets", secret = %name, "secret set");
                    Ok(())
                }
                Err(e) => {
                    tracing::warn!(subsystem = "secrets", secret = %name, error = %e, "secret not set");
                    Err(secret_refusal(e))
                }
            }
        })
    }

    fn remove(&self, name: String) -> SecretFuture<'_, bool> {
        Box::pin(async move {
            let removed = self
                .ctx()?
                .secrets
                .remove(&name)
                .await
                .map_err(secret_refusal)?;
            if removed {
                tracing::info!(subsystem = "secrets", secret = %name, "secret removed");
            }
            Ok(removed)
        })
    }

    fn list(&self) -> SecretFuture<'_, serde_json::Value> {
        Box::pin(async move {
            let ctx = self.ctx()?;
            let active = ctx.active.current();
            crewlet_secrets::admin::listing(&ctx.secrets, active.as_ref().map(|a| &*a.company))
                .await
                .map_err(secret_refusal)
        })
    }

    fn rotate_key(&self) -> SecretFuture<'_, serde_json::Value> {
        Box::pin(async move {
            match self.ctx()?.secrets.rotate_key().await {
                Ok(done) => Ok(serde_json::to_value(done).unwrap_or_default()),
                Err(e) => {
                    tracing::warn!(subsystem = "secrets", error = %e, "keyring rotation failed");
                    Err(secret_refusal(e))
                }
            }
        })
    }
}

/// `GET /agents/{handle}/memory`: a seat of the live company, its memory
/// from `crewlet-memory`'s view; a memory that cannot be read is
/// unavailable (503), never empty.
pub(crate) struct SeatMemoryRoutes(pub(crate) Late);

impl crewlet_api::SeatMemory for SeatMemoryRoutes {
    fn memory(&self, handle: String) -> crewlet_api::memory::MemoryFuture<'_> {
        use crewlet_api::MemoryRefusal;
        Box::pin(async move {
            let ctx = self.0.get().ok_or_else(|| {
                MemoryRefusal::Unavailable(
                    "the node's engine is not up yet; retry in a few seconds".into(),
                )
            })?;
            let known = ctx
                .active
                .current()
                .is_some_and(|a| a.company.seat(&handle).is_some());
            if !known {
                return Err(MemoryRefusal::NoSeat(format!(
                    "the company has no seat {handle:?} (see `crewlet agents`)"
                )));
            }
            let unavailable = |e: String| MemoryRefusal::Unavailable(e);
            let memory =
                crewlet_memory::Memory::open(async_nats::jetstream::new(ctx.client.clone()))
                    .await
                    .map_err(|e| unavailable(e.to_string()))?;
            let memory = crewlet_memory::memory_tables(memory, &ctx.store);
            let half_life = ctx.config.duties.skill_half_life.as_millis() as i64;
            crewlet_memory::view(&memory, &ctx.store, &handle, half_life)
                .await
                .map_err(|e| unavailable(e.to_string()))
        })
    }
}
