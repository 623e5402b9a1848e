//! The node's side of the replicated estate (`crewlet-statelog`).
//!
//! Every node publishes its own usage (the usage domain's objects, tallied
//! from its event log) whatever its roles: a node that keeps no estate
//! still counts in history. A node with `data` also holds the estate: it
//! runs the usage domain's applier, answers peers' snapshot requests, and
//! answers `GET /usage` from its own file. `/health` `estate` shows where
//! each domain's applier stands, and a stopped (diverged) one with its fix.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crewlet_statelog::snapshot::{self, Adopter};
use crewlet_statelog::usage::{
    Tally, USAGE_EVENT_KINDS, Usage, UsageEvent, UsagePublisher, UsageQuery,
};
use crewlet_statelog::{Applier, ApplierParts, Estate, Local, PositionBook};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use crate::engine::{EngineContext, Started};

/// How often a node publishes the usage objects that moved.
const PUBLISH_EVERY: Duration = Duration::from_secs(2);
/// Events read per page while tallying.
const PAGE: usize = 2_000;

/// This node's estate, when it holds one.
pub struct NodeEstate {
    pub estate: Arc<Estate>,
    pub applier: Applier,
}

/// Where `/health` and `GET /usage` find the estate (set once, at start).
#[derive(Default)]
pub struct EstateSlot(OnceLock<Arc<NodeEstate>>);

impl EstateSlot {
    pub fn get(&self) -> Option<&Arc<NodeEstate>> {
        self.0.get()
    }

    /// `/health` `estate`: null on a node without `data`.
    pub fn health(&self) -> Value {
        match self.0.get() {
            None => Value::Null,
            Some(e) => json!({
                "path": e.estate.path().display().to_string(),
                "domains": [e.applier.status()],
            }),
        }
    }
}

/// Starts the usage publisher, and with `data` the estate, its applier and
/// the snapshot responder; each pushed on the teardown stack.
pub async fn start(ctx: &EngineContext, started: &mut Started) {
    let js = async_nats::jetstream::new(ctx.client.clone());
    let replicas = ctx.config.stream.replicas;
    if let Err(e) = crewlet_statelog::ensure_stream(&js, &Usage, replicas).await {
        warn!(subsystem = "statelog", error = %e, "usage log not opened; the publisher and applier retry");
    }
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(
        publish_usage(
            ctx.node_id.clone(),
            js.clone(),
            ctx.store.clone(),
            ctx.active.clone(),
            stop,
        )
        .instrument(info_span!("usage", subsystem = "statelog")),
    );
    started.push("usage-publisher", move || {
        Box::pin(async move {
            let _ = stop_tx.send(true);
            let _ = task.await;
        })
    });
    if !ctx.config.roles.contains(&crewlet_config::Role::Data) {
        info!(
            subsystem = "statelog",
            "this node has no `data` role: it holds no replicated estate"
        );
        return;
    }
    let dir = ctx.config.data_dir.clone();
    let opened = Estate::open_in(&dir).and_then(|e| Ok((e, Local::open_in(&dir)?)));
    let (estate, local) = match opened {
        Ok((e, l)) => (Arc::new(e), Arc::new(l)),
        Err(e) => {
            warn!(subsystem = "statelog", error = %e, "the replicated estate cannot be opened; this node answers no usage");
            return;
        }
    };
    let book = PositionBook::new(ctx.coord.clone());
    match snapshot::serve(
        ctx.client.clone(),
        js.clone(),
        estate.clone(),
        ctx.node_id.clone(),
        dir.clone(),
    )
    .await
    {
        Ok(serving) => started.push("snapshot-donor", move || {
            Box::pin(async move { serving.abort() })
        }),
        Err(e) => {
            warn!(subsystem = "statelog", error = %e, "peers cannot adopt this node's estate")
        }
    }
    let applier = Applier::start(ApplierParts {
        js: js.clone(),
        estate: estate.clone(),
        local,
        domain: Arc::new(Usage),
        book: Some(book.clone()),
        adopter: Some(Adopter {
            client: ctx.client.clone(),
            js,
            book,
            node: ctx.node_id.clone(),
            staging: dir,
        }),
        node: ctx.node_id.clone(),
        replicas,
    });
    let held = Arc::new(NodeEstate { estate, applier });
    let _ = ctx.state.estate.0.set(held.clone());
    info!(
        subsystem = "statelog",
        "replicated estate open; applying the usage log"
    );
    started.push("estate", move || {
        Box::pin(async move {
            // The slot keeps a handle for /health; the applier stops here.
            held.applier.stop().await;
        })
    });
}

/// Tallies this node's own usage events and publishes what moved, until
/// `stop`. Starts from the start of yesterday (company days a zone away
/// included), so a restarted node publishes its open days whole again.
async fn publish_usage(
    node: String,
    js: async_nats::jetstream::Context,
    store: Arc<crewlet_store::Store>,
    active: crewlet_company::ActiveCompany,
    mut stop: watch::Receiver<bool>,
) {
    let mut publisher = UsagePublisher::new(js);
    let mut tally = Tally::default();
    let mut after = 0i64;
    let since = crewlet_os::now_ms() - 2 * 24 * 3600 * 1000;
    loop {
        if let Some(company) = active.current().map(|a| a.company) {
            let zone =
                jiff::tz::TimeZone::get(&company.timezone).unwrap_or(jiff::tz::TimeZone::UTC);
            loop {
                let s = store.clone();
                let page = tokio::task::spawn_blocking(move || {
                    s.usage_events(&USAGE_EVENT_KINDS, after, since, PAGE)
                })
                .await;
                let page = match page {
                    Ok(Ok(p)) => p,
                    Ok(Err(e)) => {
                        warn!(error = %e, "usage not tallied this pass; the event log could not be read");
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, "usage not tallied this pass");
                        break;
                    }
                };
                let full = page.len() == PAGE;
                for e in page {
                    after = e.seq;
                    tally.add(
                        &UsageEvent {
                            kind: e.kind,
                            at_ms: e.at_ms,
                            seat: e.seat,
                            payload: e.payload,
                        },
                        &zone,
                    );
                }
                if !full {
                    break;
                }
            }
            let role_of = |seat: &str| {
                company
                    .seat(seat)
                    .map(|s| s.role.clone())
                    .unwrap_or_default()
            };
            if let Err(e) = publisher.publish(tally.objects(&node, role_of)).await {
                warn!(error = %e, "usage not published this pass; published next pass");
            }
            let yesterday = crewlet_statelog::usage::company_day(
                crewlet_os::now_ms() - 24 * 3600 * 1000,
                &zone,
            );
            tally.forget_before(&yesterday);
        }
        tokio::select! {
            _ = tokio::time::sleep(PUBLISH_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Answers `GET /usage` from this node's estate.
pub fn usage(
    slot: &EstateSlot,
    ask: crewlet_api::usage::UsageAsk,
) -> Result<Value, crewlet_api::usage::UsageRefusal> {
    use crewlet_api::usage::UsageRefusal;
    let query = UsageQuery::parse(
        ask.period.as_deref(),
        ask.by.as_deref(),
        ask.from.as_deref(),
        ask.to.as_deref(),
    )
    .map_err(|e| UsageRefusal::BadQuery(e.to_string()))?;
    let Some(held) = slot.get() else {
        return Err(UsageRefusal::NotHeld(
            "this node has no `data` role, so it holds no usage history: ask a node whose node.roles include `data`".into(),
        ));
    };
    let conn = held
        .estate
        .reader()
        .map_err(|e| UsageRefusal::Unavailable(e.to_string()))?;
    let rows = query
        .run(&conn)
        .map_err(|e| UsageRefusal::Unavailable(e.to_string()))?;
    Ok(json!({
        "rows": rows,
        "estate": held.applier.status(),
    }))
}
